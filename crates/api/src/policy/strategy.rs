//! The rollout strategy of a MachineDeployment (`spec.strategy`), checked and resolved for its
//! replicas as the MachineDeployment controller uses it and the admission webhook checks it.
//! Pure.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::intstr::{IntOrPercentError, RollingUpdateError, scaled_value};
use crate::{MachineDeployment, MachineDeploymentStrategyType, OrchestrationType};

/// Who selects the machines of an in-place update
/// (`spec.strategy.inPlaceUpdate.orchestrationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orchestration {
    /// The controller selects machines within `maxUnavailable`.
    Auto,
    /// A user selects machines (node label `node.machine.sapcloud.io/selected-for-update`);
    /// the controller never does.
    Manual,
}

/// How machines are replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Surge new machines and remove old ones within limits (already resolved for the
    /// deployment's replicas, see `mcm_api::intstr::resolve_fenceposts`).
    RollingUpdate {
        /// Machines allowed above the desired replicas.
        max_surge: i32,
        /// Machines allowed to be unavailable below the desired replicas.
        max_unavailable: i32,
    },
    /// Remove all old machines, then create the new ones.
    Recreate,
    /// Update the machines where they are and move them to the new set
    /// (the MachineDeployment controller's in-place rollout); limits resolved for the deployment's replicas (`max_surge` 0 for
    /// [`Orchestration::Manual`], `max_unavailable` at least 1 when both resolve to 0, at most
    /// the replicas).
    InPlaceUpdate {
        /// Fresh machines of the new template allowed above the desired replicas (only
        /// when the new set is created).
        max_surge: i32,
        /// Machines allowed to be unavailable (selected for update) below the desired
        /// replicas.
        max_unavailable: i32,
        /// Who selects the machines to update.
        orchestration: Orchestration,
    },
}

impl Strategy {
    /// The surge that proportional scaling and the sets' max-replicas annotation use
    /// (upstream's `MaxSurge`): 0 for Recreate and InPlaceUpdate.
    pub fn max_surge(&self) -> i32 {
        match self {
            Strategy::RollingUpdate { max_surge, .. } => *max_surge,
            Strategy::Recreate | Strategy::InPlaceUpdate { .. } => 0,
        }
    }

    /// The allowed unavailability of the strategy (0 for Recreate).
    pub fn max_unavailable(&self) -> i32 {
        match self {
            Strategy::RollingUpdate {
                max_unavailable, ..
            }
            | Strategy::InPlaceUpdate {
                max_unavailable, ..
            } => *max_unavailable,
            Strategy::Recreate => 0,
        }
    }
}

/// One of the two limits of an in-place update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlaceLimit {
    /// `spec.strategy.inPlaceUpdate.maxSurge`.
    MaxSurge,
    /// `spec.strategy.inPlaceUpdate.maxUnavailable`.
    MaxUnavailable,
}

impl InPlaceLimit {
    /// The field path of the limit in a MachineDeployment.
    pub fn path(self) -> &'static str {
        match self {
            InPlaceLimit::MaxSurge => "spec.strategy.inPlaceUpdate.maxSurge",
            InPlaceLimit::MaxUnavailable => "spec.strategy.inPlaceUpdate.maxUnavailable",
        }
    }
}

impl std::fmt::Display for InPlaceLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// Why an `InPlaceUpdate` strategy cannot be used (upstream's validation of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InPlaceStrategyError {
    /// `spec.strategy.inPlaceUpdate` is missing.
    #[error(
        "spec.strategy.inPlaceUpdate: InPlaceUpdate parameter cannot be nil for in-place update strategy"
    )]
    Missing,
    /// `orchestrationType` is neither `Auto` nor `Manual` (`None`: unset).
    #[error(
        "spec.strategy.inPlaceUpdate.orchestrationType: {}orchestrationType must be either Auto or Manual",
        written(.0.as_deref())
    )]
    Orchestration(Option<String>),
    /// A limit is unset: an in-place update has no defaults (upstream requires both).
    #[error("{0}: required for the InPlaceUpdate strategy")]
    LimitMissing(InPlaceLimit),
    /// A limit is no non-negative integer or percentage.
    #[error("{field}: {source}")]
    Limit {
        /// The limit.
        field: InPlaceLimit,
        /// Why its value cannot be used.
        #[source]
        source: IntOrPercentError,
    },
}

fn written(value: Option<&str>) -> String {
    value.map_or_else(|| "unset: ".to_owned(), |v| format!("{v:?}: "))
}

/// The resolved limits of an in-place update for `replicas` (upstream's `MaxUnavailable`):
/// `Manual` allows no surge; when both limits are 0, one machine may be unavailable; never
/// more unavailable than `replicas`.
pub fn fenceposts(
    max_surge: i32,
    max_unavailable: i32,
    orchestration: Orchestration,
    replicas: i32,
) -> (i32, i32) {
    let surge = match orchestration {
        Orchestration::Auto => max_surge,
        Orchestration::Manual => 0,
    };
    let unavailable = if surge == 0 && max_unavailable == 0 {
        1
    } else {
        max_unavailable
    };
    (surge, unavailable.min(replicas.max(0)))
}

/// The deployment's `InPlaceUpdate` strategy, checked as upstream validates it and resolved
/// for its replicas ([`fenceposts`]; surge rounds up, unavailability down).
pub fn resolve_strategy(d: &MachineDeployment) -> Result<Strategy, InPlaceStrategyError> {
    let spec = d
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.in_place_update.as_ref())
        .ok_or(InPlaceStrategyError::Missing)?;
    let orchestration = match &spec.orchestration_type {
        Some(OrchestrationType::Auto) => Orchestration::Auto,
        Some(OrchestrationType::Manual) => Orchestration::Manual,
        other => {
            let value = other.as_ref().map(|o| o.as_str().to_owned());
            return Err(InPlaceStrategyError::Orchestration(value));
        }
    };
    let replicas = d.spec.replicas();
    let limit = |field: InPlaceLimit, value: Option<&IntOrString>| {
        let value = value.ok_or(InPlaceStrategyError::LimitMissing(field))?;
        let round_up = field == InPlaceLimit::MaxSurge;
        scaled_value(value, replicas, round_up)
            .map_err(|source| InPlaceStrategyError::Limit { field, source })
    };
    let limits = &spec.update_configuration;
    let surge = limit(InPlaceLimit::MaxSurge, limits.max_surge.as_ref())?;
    let unavailable = limit(
        InPlaceLimit::MaxUnavailable,
        limits.max_unavailable.as_ref(),
    )?;
    let (max_surge, max_unavailable) = fenceposts(surge, unavailable, orchestration, replicas);
    Ok(Strategy::InPlaceUpdate {
        max_surge,
        max_unavailable,
        orchestration,
    })
}

/// Why a deployment's strategy cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// `spec.strategy.type` names a strategy this controller does not implement.
    #[error(
        "spec.strategy.type: {0:?} is not supported by this controller (use Recreate, RollingUpdate or InPlaceUpdate)"
    )]
    Unsupported(String),
    /// A rolling-update limit cannot be used.
    #[error(transparent)]
    Limits(#[from] RollingUpdateError),
    /// The in-place update parameters cannot be used.
    #[error(transparent)]
    InPlace(#[from] InPlaceStrategyError),
    /// An in-place update needs the Nodes of a target cluster (`--target-kubeconfig=none`);
    /// upstream's message.
    #[error("in-place updates are not supported if running without a target cluster")]
    InPlaceWithoutTargetCluster,
}

/// The deployment's strategy with resolved limits
/// ([`MachineDeployment::resolved_rolling_update`], [`resolve_strategy`]); an error
/// names the field and the value that cannot be used. An unknown `spec.strategy.type` is an
/// error, never a silent rolling update; so is an in-place update without a target cluster
/// (`target_cluster` false).
pub fn strategy_of(d: &MachineDeployment, target_cluster: bool) -> Result<Strategy, StrategyError> {
    match d.spec.strategy.as_ref().and_then(|s| s.type_.as_ref()) {
        Some(MachineDeploymentStrategyType::Recreate) => return Ok(Strategy::Recreate),
        Some(MachineDeploymentStrategyType::InPlaceUpdate) => {
            if !target_cluster {
                return Err(StrategyError::InPlaceWithoutTargetCluster);
            }
            return Ok(resolve_strategy(d)?);
        }
        None | Some(MachineDeploymentStrategyType::RollingUpdate) => {}
        Some(other) => return Err(StrategyError::Unsupported(other.as_str().to_string())),
    }
    let (max_surge, max_unavailable) = d.resolved_rolling_update()?;
    Ok(Strategy::RollingUpdate {
        max_surge,
        max_unavailable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine_deployment::{InPlaceUpdateMachineDeployment, MachineDeploymentStrategy};
    use crate::{MachineDeploymentStrategyType, UpdateConfiguration};

    #[test]
    fn strategy_limits_and_surge() {
        let deployment =
            |orchestration: Option<&str>, surge: Option<i32>, unavailable: Option<IntOrString>| {
                let mut d = MachineDeployment::default();
                d.spec.replicas = Some(4);
                d.spec.strategy = Some(MachineDeploymentStrategy {
                    type_: Some(MachineDeploymentStrategyType::InPlaceUpdate),
                    in_place_update: Some(InPlaceUpdateMachineDeployment {
                        update_configuration: UpdateConfiguration {
                            max_surge: surge.map(IntOrString::Int),
                            max_unavailable: unavailable,
                        },
                        orchestration_type: orchestration.map(OrchestrationType::from),
                    }),
                    ..MachineDeploymentStrategy::default()
                });
                d
            };
        let int = |i| Some(IntOrString::Int(i));
        assert_eq!(
            resolve_strategy(&deployment(Some("Auto"), Some(1), int(2))),
            Ok(Strategy::InPlaceUpdate {
                max_surge: 1,
                max_unavailable: 2,
                orchestration: Orchestration::Auto
            })
        );
        // Manual: no surge; both 0: one unavailable; percentages round down; capped.
        assert_eq!(
            resolve_strategy(&deployment(Some("Manual"), Some(2), int(0))),
            Ok(Strategy::InPlaceUpdate {
                max_surge: 0,
                max_unavailable: 1,
                orchestration: Orchestration::Manual
            })
        );
        let pct = |p: &str| Some(IntOrString::String(p.into()));
        assert!(matches!(
            resolve_strategy(&deployment(Some("Auto"), Some(0), pct("30%"))),
            Ok(Strategy::InPlaceUpdate {
                max_unavailable: 1,
                ..
            })
        ));
        assert!(matches!(
            resolve_strategy(&deployment(Some("Auto"), Some(0), int(9))),
            Ok(Strategy::InPlaceUpdate {
                max_unavailable: 4,
                ..
            })
        ));
        // Errors name the field.
        let err = resolve_strategy(&deployment(Some("Sometimes"), Some(1), int(1))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.strategy.inPlaceUpdate.orchestrationType: \"Sometimes\": orchestrationType must be either Auto or Manual"
        );
        assert_eq!(
            resolve_strategy(&deployment(None, Some(1), int(1))),
            Err(InPlaceStrategyError::Orchestration(None))
        );
        assert_eq!(
            resolve_strategy(&deployment(Some("Auto"), None, int(1))),
            Err(InPlaceStrategyError::LimitMissing(InPlaceLimit::MaxSurge))
        );
        let err = resolve_strategy(&deployment(Some("Auto"), Some(1), pct("x"))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.strategy.inPlaceUpdate.maxUnavailable: "),
            "{err}"
        );
        let mut d = deployment(Some("Auto"), Some(1), int(1));
        d.spec.strategy.as_mut().unwrap().in_place_update = None;
        assert_eq!(resolve_strategy(&d), Err(InPlaceStrategyError::Missing));
    }
}
