//! The `InPlaceUpdate` strategy: its validation as upstream validates it, its limits
//! resolved for the deployment's replicas ([`fenceposts`], [`resolve_strategy`]) and the
//! replicas of a new set created for it ([`initial_new_replicas`]).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::intstr::{IntOrPercentError, scaled_value};
use mcm_api::{MachineDeployment, OrchestrationType};

use super::super::model::{Orchestration, SetState, Strategy};

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

/// Replicas of a new set created for an in-place update (upstream's `NewISNewReplicas`):
/// none under `Manual` (machines only arrive by moving); under `Auto` as many fresh machines
/// as `replicas + max_surge` leaves room for beside the old sets' machines, at most
/// `replicas`.
pub fn initial_new_replicas(
    replicas: i32,
    max_surge: i32,
    orchestration: Orchestration,
    old_sets: &[SetState],
) -> i32 {
    match orchestration {
        Orchestration::Manual => 0,
        Orchestration::Auto => {
            let current: i32 = old_sets.iter().map(SetState::footprint).sum();
            (replicas + max_surge - current).clamp(0, replicas.max(0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcm_api::machine_deployment::{InPlaceUpdateMachineDeployment, MachineDeploymentStrategy};
    use mcm_api::{MachineDeploymentStrategyType, UpdateConfiguration};

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

    #[test]
    fn a_new_set_starts_empty_under_manual_and_within_surge_under_auto() {
        let old = [SetState {
            machines: 3,
            ..SetState::new("old", 3)
        }];
        assert_eq!(initial_new_replicas(3, 1, Orchestration::Auto, &old), 1);
        assert_eq!(initial_new_replicas(3, 0, Orchestration::Auto, &old), 0);
        assert_eq!(initial_new_replicas(3, 5, Orchestration::Auto, &old), 3);
        assert_eq!(initial_new_replicas(3, 1, Orchestration::Manual, &old), 0);
        // The first set of a deployment.
        assert_eq!(initial_new_replicas(3, 0, Orchestration::Auto, &[]), 3);
    }
}
