//! The `MachineDisruptionBudget` kind (`policy.mcm-rs.io/v1alpha1`, short name `mdb`): how
//! many of the Machines a selector picks may be voluntarily disrupted at once.
//!
//! This kind is an mcm-rs addition and lives in its own API group, so that it never collides
//! with Gardener's `machine.sapcloud.io`. Voluntary disruptions (a rolling update replacing a
//! machine, a scale-down including the cluster-autoscaler's, the release of a preserved Failed
//! machine) wait while a budget that selects the machine allows none; involuntary
//! unavailability (a Failed, Unknown or Pending machine) is counted against the budget but is
//! never blocked. A `kubectl delete machine` bypasses every budget, as a direct pod delete
//! bypasses a PodDisruptionBudget.
//!
//! Decisions recorded here:
//! - an absent or empty `spec.selector` selects **no** Machine (unlike a PodDisruptionBudget
//!   of `policy/v1`, where it selects every pod): a budget that silently covered every
//!   machine of the namespace would be a surprising way to stop all rollouts;
//! - exactly one of `maxUnavailable` and `minAvailable` must be given; `reasons`, window
//!   schedules and durations are checked by the controller, which reports a bad spec in the
//!   `DisruptionAllowed` condition (reason `InvalidSpec`) and an Event instead of rejecting
//!   the object, and an invalid budget blocks nothing;
//! - window durations are Go durations kept as strings here, so that a bad one does not make
//!   the whole object undecodable (it would vanish from the controllers' view).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConditionStatus;
use crate::enums::DisruptionReason;

/// The API group of the policy kinds of mcm-rs.
pub const POLICY_GROUP: &str = "policy.mcm-rs.io";
/// The version of [`POLICY_GROUP`].
pub const POLICY_VERSION: &str = "v1alpha1";
/// `apiVersion` of a MachineDisruptionBudget: `policy.mcm-rs.io/v1alpha1`.
pub const POLICY_API_VERSION: &str = "policy.mcm-rs.io/v1alpha1";

/// The condition type a budget reports.
pub const CONDITION_DISRUPTION_ALLOWED: &str = "DisruptionAllowed";

/// Reasons of the `DisruptionAllowed` condition (and of the budget's Events).
pub mod condition_reasons {
    /// Disruptions are allowed now.
    pub const SUFFICIENT_MACHINES: &str = "SufficientMachines";
    /// No disruption is allowed: the budget is exhausted.
    pub const BUDGET_EXHAUSTED: &str = "BudgetExhausted";
    /// The budget has windows and none is open: it blocks nothing now.
    pub const OUTSIDE_WINDOWS: &str = "OutsideWindows";
    /// The spec cannot be acted on; the budget blocks nothing.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Event reason: a voluntary disruption waits for the budget.
    pub const DISRUPTION_BLOCKED: &str = "DisruptionBlocked";
}

/// Limits voluntary disruptions of the Machines its selector picks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineDisruptionBudget {
    /// Always `policy.mcm-rs.io/v1alpha1`.
    #[serde(
        rename = "apiVersion",
        default = "MachineDisruptionBudget::default_api_version"
    )]
    pub api_version: String,
    /// Always `MachineDisruptionBudget`.
    #[serde(default = "MachineDisruptionBudget::default_kind")]
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired behaviour.
    #[serde(default)]
    pub spec: MachineDisruptionBudgetSpec,
    /// Observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MachineDisruptionBudgetStatus>,
}

impl MachineDisruptionBudget {
    /// The `kind` of this resource.
    pub const KIND: &'static str = "MachineDisruptionBudget";
    /// The plural resource name.
    pub const PLURAL: &'static str = "machinedisruptionbudgets";

    fn default_api_version() -> String {
        POLICY_API_VERSION.to_owned()
    }

    fn default_kind() -> String {
        Self::KIND.to_owned()
    }

    /// A budget named `name` with `spec`.
    pub fn new(name: &str, spec: MachineDisruptionBudgetSpec) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            ..Self::default()
        }
    }
}

impl Default for MachineDisruptionBudget {
    fn default() -> Self {
        Self {
            api_version: Self::default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta::default(),
            spec: MachineDisruptionBudgetSpec::default(),
            status: None,
        }
    }
}

impl kube::Resource for MachineDisruptionBudget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        Self::KIND.into()
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        POLICY_GROUP.into()
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        POLICY_VERSION.into()
    }

    fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
        POLICY_API_VERSION.into()
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        Self::PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// List of MachineDisruptionBudgets.
pub type MachineDisruptionBudgetList = kube::core::ObjectList<MachineDisruptionBudget>;

/// Desired behaviour of a MachineDisruptionBudget.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDisruptionBudgetSpec {
    /// Label selector over the Machines of the namespace. An absent or empty selector selects
    /// no Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// How many selected Machines may be unavailable at once: a number or a percentage of
    /// the selected Machines (rounded up). Exactly one of `maxUnavailable` and `minAvailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// How many selected Machines must stay available: a number or a percentage of the
    /// selected Machines (rounded up). Exactly one of `maxUnavailable` and `minAvailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    /// The voluntary disruptions the budget limits: `RollingUpdate`, `ScaleDown`,
    /// `PreservationRelease`. Absent: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<DisruptionReason>>,
    /// When present, the budget applies only while one of these windows is open (Karpenter's
    /// `schedule` + `duration`); outside every window it blocks nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Vec<DisruptionWindow>>,
}

/// A time window in which a budget applies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionWindow {
    /// When the window opens: a five-field cron schedule in UTC (`minute hour day-of-month
    /// month day-of-week`, or `@daily`, `@weekly`, ...).
    pub schedule: String,
    /// How long the window stays open: a Go duration such as `8h` or `30m`.
    pub duration: String,
}

/// A condition of a MachineDisruptionBudget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetCondition {
    /// Type of the condition (`DisruptionAllowed`).
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether the condition holds.
    pub status: ConditionStatus,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Machine-readable reason (`SufficientMachines`, `BudgetExhausted`, `OutsideWindows`,
    /// `InvalidSpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generation of the spec the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Observed state of a MachineDisruptionBudget.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDisruptionBudgetStatus {
    /// The generation of the spec this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Number of Machines the selector picks (Machines being deleted included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_machines: Option<i32>,
    /// Selected Machines that are available: phase `Running` and not being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_available: Option<i32>,
    /// Selected Machines that must stay available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_available: Option<i32>,
    /// Voluntary disruptions allowed now (`currentAvailable - desiredAvailable`, at least 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruptions_allowed: Option<i32>,
    /// Selected Machines unavailable for a reason other than a deletion (Failed, Unknown,
    /// Pending, CrashLoopBackOff, ...): counted, never blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_involuntary: Option<i32>,
    /// Conditions (`DisruptionAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<BudgetCondition>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_round_trips_with_its_wire_names() {
        let json = serde_json::json!({
            "apiVersion": "policy.mcm-rs.io/v1alpha1",
            "kind": "MachineDisruptionBudget",
            "metadata": {"name": "b"},
            "spec": {
                "selector": {"matchLabels": {"pool": "a"}},
                "maxUnavailable": "20%",
                "reasons": ["RollingUpdate", "Sometimes"],
                "windows": [{"schedule": "0 9 * * *", "duration": "8h"}],
            },
            "status": {"disruptionsAllowed": 0, "unavailableInvoluntary": 1},
        });
        let b: MachineDisruptionBudget = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(
            b.spec.reasons.as_deref(),
            Some(
                &[
                    DisruptionReason::RollingUpdate,
                    DisruptionReason::Other("Sometimes".into())
                ][..]
            )
        );
        assert_eq!(serde_json::to_value(&b).unwrap(), json);
    }
}
