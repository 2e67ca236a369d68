//! The `MachineSet` kind: keeps a number of identical Machines running.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ClassSpec, ConditionStatus, LastOperation, MachineSetConditionType, MachineSummary,
    MachineTemplateSpec, resource::impl_root_resource,
};

/// Keeps `spec.replicas` Machines built from `spec.template` running (like a ReplicaSet).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineSet {
    /// Always `machine.sapcloud.io/v1alpha1`.
    #[serde(rename = "apiVersion", default = "MachineSet::default_api_version")]
    pub api_version: String,
    /// Always `MachineSet`.
    #[serde(default = "MachineSet::default_kind")]
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state.
    #[serde(default)]
    pub spec: MachineSetSpec,
    /// Observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MachineSetStatus>,
}

impl_root_resource!(MachineSet, "MachineSet", "machinesets");

impl Default for MachineSet {
    fn default() -> Self {
        Self {
            api_version: Self::default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta::default(),
            spec: MachineSetSpec::default(),
            status: None,
        }
    }
}

/// List of MachineSets.
pub type MachineSetList = kube::core::ObjectList<MachineSet>;

/// Desired state of a MachineSet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// Number of desired machines (absent means 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of the machines this set owns; must match the template's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Legacy reference to the MachineClass (the template's `spec.class` is authoritative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_class: Option<ClassSpec>,
    /// Template of the machines to create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<MachineTemplateSpec>,
    /// Seconds a new machine must be ready before it counts as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    /// How many failed machines of this set may be preserved automatically at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_max: Option<i32>,
}

impl MachineSetSpec {
    /// Desired replicas, with Go's zero default.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(0)
    }
}

impl MachineSet {
    /// The labels of the set's template (given to its Machines).
    pub fn template_labels(&self) -> Option<&BTreeMap<String, String>> {
        self.spec
            .template
            .as_ref()
            .and_then(MachineTemplateSpec::labels)
    }

    /// The class reference of the set's template.
    pub fn template_class(&self) -> Option<&ClassSpec> {
        self.spec
            .template
            .as_ref()
            .and_then(MachineTemplateSpec::class)
    }

    /// The name of the MachineClass of the set's template (see
    /// [`ClassSpec::machine_class_name`]).
    pub fn class_name(&self) -> Option<&str> {
        self.template_class()
            .and_then(ClassSpec::machine_class_name)
    }
}

/// A condition of a MachineSet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetCondition {
    /// Type of the condition.
    #[serde(rename = "type")]
    pub type_: MachineSetConditionType,
    /// Whether the condition holds.
    pub status: ConditionStatus,
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

/// Observed state of a MachineSet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    /// Number of machines owned by the set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Number of machines whose labels match the template's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fully_labeled_replicas: Option<i32>,
    /// Number of machines that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Number of machines ready for at least `minReadySeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    /// The generation of the spec this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions of the set (note the Go field name `machineSetCondition`).
    #[serde(
        rename = "machineSetCondition",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub conditions: Option<Vec<MachineSetCondition>>,
    /// The last operation performed by the set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// Summaries of the set's machines whose last operation failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_machines: Option<Vec<MachineSummary>>,
    /// Number of failed machines of the set that are currently auto-preserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_count: Option<i32>,
    /// Number of machines of the set that are Failed and preserved (kept, not replaced, until
    /// their `preserveExpiryTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserved_failed_replicas: Option<i32>,
}
