//! The `Machine` kind: one VM and its Node.

use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ClassSpec, LastOperation, MachineConfiguration, MachinePhase, resource::impl_root_resource,
};

/// A physical or virtual machine backing one Kubernetes Node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Always `machine.sapcloud.io/v1alpha1`.
    #[serde(rename = "apiVersion", default = "Machine::default_api_version")]
    pub api_version: String,
    /// Always `Machine`.
    #[serde(default = "Machine::default_kind")]
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state of the machine.
    #[serde(default)]
    pub spec: MachineSpec,
    /// Observed state of the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<MachineStatus>,
}

impl_root_resource!(Machine, "Machine", "machines");

impl Default for Machine {
    fn default() -> Self {
        Self {
            api_version: Self::default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta::default(),
            spec: MachineSpec::default(),
            status: None,
        }
    }
}

impl Machine {
    /// A Machine with the given name and spec.
    pub fn new(name: &str, spec: MachineSpec) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            ..Self::default()
        }
    }

    /// The machine's phase, if it has one.
    pub fn phase(&self) -> Option<&MachinePhase> {
        self.status
            .as_ref()
            .and_then(|s| s.current_status.as_ref())
            .and_then(|c| c.phase.as_ref())
    }

    /// Deleted or being deleted: a deletion timestamp, or the phase `Terminating` (a machine
    /// whose deletion began keeps that phase until it is gone). Such a machine no longer
    /// counts as capacity anywhere.
    pub fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
            || self.phase() == Some(&MachinePhase::Terminating)
    }

    /// The name of the machine's Node (its `node` label), if recorded and not empty.
    pub fn node_name(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::constants::labels::NODE))
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }

    /// The name of the MachineClass the machine references (see
    /// [`ClassSpec::machine_class_name`]).
    pub fn class_name(&self) -> Option<&str> {
        self.spec
            .class
            .as_ref()
            .and_then(ClassSpec::machine_class_name)
    }
}

/// List of Machines.
pub type MachineList = kube::core::ObjectList<Machine>;

/// Desired state of a Machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The MachineClass this machine is created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ClassSpec>,
    /// Unique ID of the VM at the provider (matches the Node's `spec.providerID`).
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Metadata and spec the machine's Node should have (labels, annotations, taints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplateSpec>,
    /// Per-machine controller settings (timeouts, evict retries, node conditions), inlined.
    #[serde(flatten)]
    pub configuration: MachineConfiguration,
}

/// Data a Node should have when it is created for a Machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeTemplateSpec {
    /// Labels and annotations to put on the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::template_metadata")]
    pub metadata: Option<ObjectMeta>,
    /// Node spec attributes (taints, ...) to put on the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpec>,
}

/// Observed state of a Machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Addresses of the machine; only set when the provider runs without a target cluster, so
    /// that clients can reach the machine without a Node object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<NodeAddress>>,
    /// Conditions of the machine, copied from its Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeCondition>>,
    /// The last operation performed on the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// Current lifecycle phase of the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_status: Option<CurrentStatus>,
    /// Opaque state a provider driver stores about the VM for later calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_known_state: Option<String>,
}

/// Current lifecycle phase of a Machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentStatus {
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    /// Whether a creation or health timeout is running for the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_active: Option<bool>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Until when the machine is preserved (not replaced although failed); unset when it is
    /// not preserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_expiry_time: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constants::labels;

    #[test]
    fn node_name_is_the_non_empty_node_label() {
        let mut m = Machine::default();
        assert_eq!(m.node_name(), None);
        m.metadata.labels = Some([(labels::NODE.to_owned(), String::new())].into());
        assert_eq!(m.node_name(), None);
        m.metadata.labels = Some([(labels::NODE.to_owned(), "n".to_owned())].into());
        assert_eq!(m.node_name(), Some("n"));
    }

    #[test]
    fn class_name_needs_a_machine_class() {
        let mut m = Machine::default();
        assert_eq!(m.class_name(), None);
        let class = |kind: Option<&str>, name: &str| ClassSpec {
            api_group: None,
            kind: kind.map(str::to_owned),
            name: Some(name.to_owned()),
        };
        m.spec.class = Some(class(None, "c"));
        assert_eq!(m.class_name(), Some("c"));
        m.spec.class = Some(class(Some(crate::constants::MACHINE_CLASS_KIND), "c"));
        assert_eq!(m.class_name(), Some("c"));
        m.spec.class = Some(class(Some("AWSMachineClass"), "c"));
        assert_eq!(m.class_name(), None);
        m.spec.class = Some(class(None, ""));
        assert_eq!(m.class_name(), None);
    }
}
