//! The `MachineDeployment` kind: declarative rollouts of MachineSets.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ConditionStatus, MachineDeploymentConditionType, MachineDeploymentStrategyType, MachineSummary,
    MachineTemplateSpec, OrchestrationType, resource::impl_root_resource,
};

/// Declarative updates of Machines through MachineSets (like a Deployment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineDeployment {
    /// Always `machine.sapcloud.io/v1alpha1`.
    #[serde(
        rename = "apiVersion",
        default = "MachineDeployment::default_api_version"
    )]
    pub api_version: String,
    /// Always `MachineDeployment`.
    #[serde(default = "MachineDeployment::default_kind")]
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state.
    #[serde(default)]
    pub spec: MachineDeploymentSpec,
    /// Observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MachineDeploymentStatus>,
}

impl_root_resource!(MachineDeployment, "MachineDeployment", "machinedeployments");

impl Default for MachineDeployment {
    fn default() -> Self {
        Self {
            api_version: Self::default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta::default(),
            spec: MachineDeploymentSpec::default(),
            status: None,
        }
    }
}

/// List of MachineDeployments.
pub type MachineDeploymentList = kube::core::ObjectList<MachineDeployment>;

/// Desired state of a MachineDeployment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// Number of desired machines (absent means 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of the machines (and MachineSets) of this deployment; must match the
    /// template's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Template of the machines to create.
    #[serde(default)]
    pub template: MachineTemplateSpec,
    /// How old machines are replaced by new ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MachineDeploymentStrategy>,
    /// Seconds a new machine must be ready before it counts as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    /// Number of old MachineSets kept for rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    /// When true, the deployment is not reconciled (no rollout progress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Deprecated: the revision to roll back to; cleared once the rollback is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<RollbackConfig>,
    /// Seconds a rollout may go without progress before it is reported as failed
    /// (condition `Progressing` with reason `ProgressDeadlineExceeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<i32>,
    /// How many failed machines of this deployment may be preserved automatically at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_max: Option<i32>,
}

impl MachineDeploymentSpec {
    /// Desired replicas, with Go's zero default.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(0)
    }
}

impl MachineDeployment {
    /// Whether the strategy is `Recreate` (otherwise a rolling update).
    pub fn is_recreate(&self) -> bool {
        self.spec.strategy.as_ref().and_then(|s| s.type_.as_ref())
            == Some(&MachineDeploymentStrategyType::Recreate)
    }

    /// `(maxSurge, maxUnavailable)` of the rolling update as written (`None` when unset).
    pub fn rolling_update_limits(&self) -> (Option<&IntOrString>, Option<&IntOrString>) {
        let limits = self
            .spec
            .strategy
            .as_ref()
            .and_then(|s| s.rolling_update.as_ref())
            .map(|r| &r.update_configuration);
        (
            limits.and_then(|l| l.max_surge.as_ref()),
            limits.and_then(|l| l.max_unavailable.as_ref()),
        )
    }

    /// `(maxSurge, maxUnavailable)` resolved for `spec.replicas` by
    /// [`resolve_rolling_update`](crate::intstr::resolve_rolling_update): unset values are
    /// 1, percentages of surge round up and of unavailability down, both 0 becomes (0, 1);
    /// an unusable value is an error naming the field.
    pub fn resolved_rolling_update(&self) -> Result<(i32, i32), crate::intstr::RollingUpdateError> {
        let (max_surge, max_unavailable) = self.rolling_update_limits();
        crate::intstr::resolve_rolling_update(max_surge, max_unavailable, self.spec.replicas())
    }
}

/// How a MachineDeployment replaces existing machines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStrategy {
    /// `Recreate`, `RollingUpdate` (default) or `InPlaceUpdate`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<MachineDeploymentStrategyType>,
    /// Parameters of a rolling update; only meaningful with type `RollingUpdate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateMachineDeployment>,
    /// Parameters of an in-place update; only meaningful with type `InPlaceUpdate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update: Option<InPlaceUpdateMachineDeployment>,
}

/// Surge and unavailability limits of an update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateConfiguration {
    /// Machines that may be unavailable during the update: a number or a percentage of the
    /// desired replicas (rounded down). Default 1. Cannot be 0 when `maxSurge` is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Machines that may be created above the desired replicas: a number or a percentage
    /// (rounded up). Default 1. Cannot be 0 when `maxUnavailable` is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
}

/// Parameters of a rolling update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RollingUpdateMachineDeployment {
    /// `maxSurge` and `maxUnavailable`, inlined.
    #[serde(flatten)]
    pub update_configuration: UpdateConfiguration,
}

/// Parameters of an in-place update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceUpdateMachineDeployment {
    /// `maxSurge` and `maxUnavailable`, inlined.
    #[serde(flatten)]
    pub update_configuration: UpdateConfiguration,
    /// Whether the controller (`Auto`) or a user (`Manual`) selects the machines to update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestration_type: Option<OrchestrationType>,
}

/// Deprecated rollback request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RollbackConfig {
    /// Revision to roll back to; 0 means the previous revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// Observed state of a MachineDeployment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStatus {
    /// The generation of the spec this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Non-terminated machines selected by the deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Non-terminated machines that have the current template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// Ready machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Machines ready for at least `minReadySeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    /// Machines still missing for 100% available capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_replicas: Option<i32>,
    /// Conditions of the deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<MachineDeploymentCondition>>,
    /// Hash collision counter used to name new MachineSets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    /// Summaries of machines whose last operation failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_machines: Option<Vec<MachineSummary>>,
    /// Number of failed machines that are currently preserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserved_failed_replicas: Option<i32>,
}

/// A condition of a MachineDeployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentCondition {
    /// Type of the condition.
    #[serde(rename = "type")]
    pub type_: MachineDeploymentConditionType,
    /// Whether the condition holds.
    pub status: ConditionStatus,
    /// When the condition was last updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Machine-readable reason of the last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable details of the last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intstr::RollingUpdateError;

    fn deployment(
        replicas: i32,
        surge: Option<IntOrString>,
        unavailable: Option<IntOrString>,
    ) -> MachineDeployment {
        let mut d = MachineDeployment::default();
        d.spec.replicas = Some(replicas);
        d.spec.strategy = Some(MachineDeploymentStrategy {
            rolling_update: Some(RollingUpdateMachineDeployment {
                update_configuration: UpdateConfiguration {
                    max_surge: surge,
                    max_unavailable: unavailable,
                },
            }),
            ..MachineDeploymentStrategy::default()
        });
        d
    }

    #[test]
    fn resolves_the_rolling_update_for_its_replicas() {
        assert_eq!(
            MachineDeployment::default().resolved_rolling_update(),
            Ok((1, 1))
        );
        let pct = |s: &str| Some(IntOrString::String(s.to_owned()));
        assert_eq!(
            deployment(10, pct("25%"), pct("25%")).resolved_rolling_update(),
            Ok((3, 2))
        );
        assert_eq!(
            deployment(3, Some(IntOrString::Int(0)), None).resolved_rolling_update(),
            Ok((0, 1))
        );
        assert!(matches!(
            deployment(3, pct("x"), None).resolved_rolling_update(),
            Err(RollingUpdateError::NotIntOrPercent { .. })
        ));
    }

    #[test]
    fn recreate_is_explicit() {
        let mut d = MachineDeployment::default();
        assert!(!d.is_recreate());
        d.spec.strategy = Some(MachineDeploymentStrategy {
            type_: Some(MachineDeploymentStrategyType::Recreate),
            ..MachineDeploymentStrategy::default()
        });
        assert!(d.is_recreate());
    }
}
