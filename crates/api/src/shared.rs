//! Types shared by several kinds: class references, templates, machine configuration,
//! last operation and machine summaries.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{GoDuration, MachineOperationType, MachineState, machine::MachineSpec};

/// Reference to the MachineClass a Machine is created from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassSpec {
    /// API group of the class (normally `machine.sapcloud.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Kind of the class (normally `MachineClass`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the class, in the namespace of the referencing object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ClassSpec {
    /// The name of the referenced MachineClass: `name` when it is not empty and `kind` is
    /// unset or [`MACHINE_CLASS_KIND`](crate::constants::MACHINE_CLASS_KIND).
    pub fn machine_class_name(&self) -> Option<&str> {
        let kind_ok = self
            .kind
            .as_deref()
            .is_none_or(|k| k == crate::constants::MACHINE_CLASS_KIND);
        self.name.as_deref().filter(|n| kind_ok && !n.is_empty())
    }
}

/// The template from which a MachineSet or MachineDeployment creates Machines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineTemplateSpec {
    /// Labels and annotations given to the created Machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::template_metadata")]
    pub metadata: Option<ObjectMeta>,
    /// Spec of the created Machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<MachineSpec>,
}

impl MachineTemplateSpec {
    /// The labels given to the created Machines.
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref().and_then(|m| m.labels.as_ref())
    }

    /// The class reference of the created Machines.
    pub fn class(&self) -> Option<&ClassSpec> {
        self.spec.as_ref().and_then(|s| s.class.as_ref())
    }
}

/// Per-machine overrides of the machine controller's settings, inlined into the Machine spec.
///
/// Every field is optional; an absent field means "use the controller's command-line default".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfiguration {
    /// How long a drain may take before the controller switches to force deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<GoDuration>,
    /// How long a machine may stay unhealthy (`Unknown`) before it is declared `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_timeout: Option<GoDuration>,
    /// How long creation (until the Node is ready) may take before the machine is `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timeout: Option<GoDuration>,
    /// How long an in-place update may take before it is declared failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update_timeout: Option<GoDuration>,
    /// How long a preserved machine is kept before its preservation ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_preserve_timeout: Option<GoDuration>,
    /// When true, the health timeout is ignored: an unhealthy machine is never declared failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_health_timeout: Option<bool>,
    /// How many times an eviction is retried during a drain before pods are deleted instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_evict_retries: Option<i32>,
    /// Comma-separated Node condition types that make the machine unhealthy when `True`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_conditions: Option<String>,
}

impl MachineConfiguration {
    /// The configured Node condition types, split at commas, trimmed, empty entries removed.
    pub fn node_condition_types(&self) -> Vec<&str> {
        self.node_conditions
            .as_deref()
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What was last done to a Machine (or MachineSet) and how it went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// Human-readable description of the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Machine error code of the operation's failure, if any (e.g. `ResourceExhausted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// When the operation was last updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// State of the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<MachineState>,
    /// Kind of operation.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<MachineOperationType>,
}

/// Summary of a (failed) Machine, reported in MachineSet/MachineDeployment status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSummary {
    /// Name of the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Provider ID of the Machine's VM.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// The Machine's last operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// Name of the Machine's owner (its MachineSet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_ref: Option<String>,
}
