//! The `MachineClass` kind: provider template and credentials shared by many Machines.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::SecretReference;
use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource::impl_root_resource;

/// Provider configuration and credentials from which Machines are created.
///
/// Unlike the other kinds, a MachineClass has no `spec`/`status`: its fields are top-level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineClass {
    /// Always `machine.sapcloud.io/v1alpha1`.
    #[serde(rename = "apiVersion", default = "MachineClass::default_api_version")]
    pub api_version: String,
    /// Always `MachineClass`.
    #[serde(default = "MachineClass::default_kind")]
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Resources and placement of the Nodes created from this class, used by the
    /// cluster-autoscaler to scale a node group from zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplate>,
    /// Secret holding the cloud credentials, when they are not in `secretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretReference>,
    /// Provider-specific configuration, kept verbatim (arbitrary JSON object).
    #[serde(default)]
    #[schemars(schema_with = "crate::schema::preserved_object")]
    pub provider_spec: serde_json::Value,
    /// Name of the provider (e.g. `AWS`, `local`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Secret holding the user data (and, historically, the credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
}

impl_root_resource!(MachineClass, "MachineClass", "machineclasses");

impl Default for MachineClass {
    fn default() -> Self {
        Self {
            api_version: Self::default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta::default(),
            node_template: None,
            credentials_secret_ref: None,
            provider_spec: serde_json::Value::Object(serde_json::Map::new()),
            provider: None,
            secret_ref: None,
        }
    }
}

/// List of MachineClasses.
pub type MachineClassList = kube::core::ObjectList<MachineClass>;

/// Resources and placement of the Nodes of a MachineClass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTemplate {
    /// Allocatable resources of a Node (`cpu`, `memory`, `gpu`, ...).
    #[serde(default)]
    #[schemars(schema_with = "crate::schema::quantity_map")]
    pub capacity: BTreeMap<String, Quantity>,
    /// Provider instance type (e.g. `m5.large`).
    #[serde(default)]
    pub instance_type: String,
    /// Region of the Nodes.
    #[serde(default)]
    pub region: String,
    /// Zone of the Nodes.
    #[serde(default)]
    pub zone: String,
    /// Extended resources advertised on the Node in addition to its real capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity_map")]
    pub virtual_capacity: Option<BTreeMap<String, Quantity>>,
    /// CPU architecture of the Nodes (e.g. `amd64`, `arm64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}
