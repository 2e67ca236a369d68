//! CustomResourceDefinitions of the four kinds, generated from the Rust types.
//!
//! The schemas are structural (every node typed, no `$ref`, no `nullable`, no defaults),
//! int-or-string fields carry `x-kubernetes-int-or-string`, `providerSpec` keeps unknown
//! fields, and a few CEL rules (`x-kubernetes-validations`) reject specs the controllers could
//! not act on:
//! - `spec.replicas`, `spec.minReadySeconds` of MachineSets/MachineDeployments and
//!   `spec.revisionHistoryLimit`, `spec.progressDeadlineSeconds` of MachineDeployments must
//!   not be negative (`minimum: 0`);
//! - a rolling update must not have both `maxSurge` and `maxUnavailable` zero, and each must
//!   be a non-negative number or a percentage (`maxUnavailable` at most `100%`);
//! - `spec.selector.matchLabels` must match `spec.template.metadata.labels`, and a given
//!   `spec.selector` must not be empty (it would select every Machine of the namespace);
//! - quantities in a class's `nodeTemplate` must be quantities;
//! - a Machine's name must fit a label value (63 characters).
//!
//! To keep the estimated CEL cost of the selector rule bounded, label values in
//! `spec.selector.matchLabels` and `spec.template.metadata.labels` are limited to 63
//! characters (the Kubernetes limit for label values, which the API server enforces on the
//! created Machines anyway) and `matchLabels` to 64 entries.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value, json};

use crate::{
    GROUP, Machine, MachineClass, MachineDeployment, MachineSet, VERSION,
    disruption_budget::{
        MachineDisruptionBudget, MachineDisruptionBudgetSpec, MachineDisruptionBudgetStatus,
        POLICY_GROUP,
    },
    machine::{MachineSpec, MachineStatus},
    machine_deployment::{MachineDeploymentSpec, MachineDeploymentStatus},
    machine_set::{MachineSetSpec, MachineSetStatus},
    schema::structural_schema_for,
};

/// Error rendering a CRD.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD could not be serialized to YAML.
    #[error("cannot serialize CRD {name} to YAML")]
    Yaml {
        /// Name of the CRD.
        name: String,
        /// The serializer's error.
        #[source]
        source: serde_saphyr::ser::Error,
    },
}

/// CEL rule: a rolling update with both limits zero can never make progress.
pub const RULE_ROLLING_UPDATE_NOT_BOTH_ZERO: &str = "!(has(self.maxSurge) && has(self.maxUnavailable) && (type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge == '0%') && (type(self.maxUnavailable) == int ? self.maxUnavailable == 0 : self.maxUnavailable == '0%'))";
/// Message of [`RULE_ROLLING_UPDATE_NOT_BOTH_ZERO`].
pub const MESSAGE_ROLLING_UPDATE_NOT_BOTH_ZERO: &str =
    "spec.strategy.rollingUpdate: maxSurge and maxUnavailable must not both be 0";
/// CEL rule: every `matchLabels` entry must be a label of the template.
pub const RULE_SELECTOR_MATCHES_TEMPLATE: &str = "!has(self.selector) || !has(self.selector.matchLabels) || size(self.selector.matchLabels) == 0 || (has(self.template) && has(self.template.metadata) && has(self.template.metadata.labels) && self.selector.matchLabels.all(k, k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k]))";
/// Message of [`RULE_SELECTOR_MATCHES_TEMPLATE`].
pub const MESSAGE_SELECTOR_MATCHES_TEMPLATE: &str =
    "spec.selector.matchLabels must match spec.template.metadata.labels";

/// CEL rule: `maxUnavailable` is a non-negative number or a percentage of at most 100%.
pub const RULE_MAX_UNAVAILABLE: &str = "!has(self.maxUnavailable) || (type(self.maxUnavailable) == int ? self.maxUnavailable >= 0 : self.maxUnavailable.matches('^(100|[1-9]?[0-9])%$'))";
/// Message of [`RULE_MAX_UNAVAILABLE`].
pub const MESSAGE_MAX_UNAVAILABLE: &str =
    "must be a non-negative integer or a percentage from 0% to 100% (e.g. 25%)";
/// CEL rule: `maxSurge` is a non-negative number or a percentage.
pub const RULE_MAX_SURGE: &str = "!has(self.maxSurge) || (type(self.maxSurge) == int ? self.maxSurge >= 0 : self.maxSurge.matches('^[0-9]+%$'))";
/// Message of [`RULE_MAX_SURGE`].
pub const MESSAGE_MAX_SURGE: &str = "must be a non-negative integer or a percentage (e.g. 25%)";
/// CEL rule: a given selector selects something.
pub const RULE_SELECTOR_NOT_EMPTY: &str = "!has(self.selector) || (has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)";
/// Message of [`RULE_SELECTOR_NOT_EMPTY`].
pub const MESSAGE_SELECTOR_NOT_EMPTY: &str =
    "must not be empty: an empty selector selects every Machine of the namespace";

/// CEL rule: a Machine's name fits a label value (it labels its bootstrap token, and the
/// MachineSet-generated names are never longer).
pub const RULE_MACHINE_NAME_LENGTH: &str = "size(self.metadata.name) <= 63";
/// Message of [`RULE_MACHINE_NAME_LENGTH`].
pub const MESSAGE_MACHINE_NAME_LENGTH: &str = "metadata.name must be no more than 63 characters: a Machine's name is a label value of its bootstrap token and Node";

/// Maximum length of a Kubernetes label value.
const LABEL_VALUE_MAX_LENGTH: u64 = 63;
/// Maximum number of `matchLabels` entries accepted by the CRDs.
const MATCH_LABELS_MAX_PROPERTIES: u64 = 64;

/// The CRDs of all kinds: Machine, MachineClass, MachineSet, MachineDeployment (group
/// `machine.sapcloud.io`) and MachineDisruptionBudget (group `policy.mcm-rs.io`).
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        machine(),
        machine_class(),
        machine_set(),
        machine_deployment(),
        machine_disruption_budget(),
    ]
}

/// The file name under which a CRD is stored: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// Renders a CRD as YAML.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    serde_saphyr::to_string(crd).map_err(|source| CrdError::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// The CRD of `Machine`.
pub fn machine() -> CustomResourceDefinition {
    let mut schema = root_schema(
        "A physical or virtual machine backing one Kubernetes Node.",
        vec![
            ("spec", structural_schema_for::<MachineSpec>()),
            ("status", structural_schema_for::<MachineStatus>()),
        ],
    );
    set(
        &mut schema,
        &["x-kubernetes-validations"],
        json!([{
            "rule": RULE_MACHINE_NAME_LENGTH,
            "message": MESSAGE_MACHINE_NAME_LENGTH,
        }]),
    );
    build(Spec {
        group: GROUP,
        kind: Machine::KIND,
        plural: Machine::PLURAL,
        short_name: "mc",
        schema,
        status: true,
        scale: false,
        columns: vec![
            column(
                "Status",
                "string",
                ".status.currentStatus.phase",
                "Current phase of the machine.",
                0,
            ),
            column(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                "Time since the machine was created.",
                0,
            ),
            column(
                "Node",
                "string",
                ".metadata.labels.node",
                "Node backing the machine.",
                0,
            ),
            column(
                "ProviderID",
                "string",
                ".spec.providerID",
                "ID of the VM at the provider.",
                1,
            ),
        ],
    })
}

/// The CRD of `MachineClass`.
pub fn machine_class() -> CustomResourceDefinition {
    let mut schema = structural_schema_for::<MachineClass>();
    set(
        &mut schema,
        &["properties", "metadata"],
        json!({"type": "object"}),
    );
    set(&mut schema, &["required"], json!(["providerSpec"]));
    set(
        &mut schema,
        &[
            "properties",
            "nodeTemplate",
            "x-kubernetes-preserve-unknown-fields",
        ],
        json!(true),
    );
    set(
        &mut schema,
        &["properties", "nodeTemplate", "required"],
        json!(["capacity", "instanceType", "region", "zone"]),
    );
    build(Spec {
        group: GROUP,
        kind: MachineClass::KIND,
        plural: MachineClass::PLURAL,
        short_name: "mcc",
        schema,
        status: false,
        scale: false,
        columns: vec![],
    })
}

/// The CRD of `MachineSet`.
pub fn machine_set() -> CustomResourceDefinition {
    let mut spec = structural_schema_for::<MachineSetSpec>();
    replicated_spec_rules(&mut spec);
    let schema = root_schema(
        "Keeps a number of identical Machines running.",
        vec![
            ("spec", spec),
            ("status", structural_schema_for::<MachineSetStatus>()),
        ],
    );
    build(Spec {
        group: GROUP,
        kind: MachineSet::KIND,
        plural: MachineSet::PLURAL,
        short_name: "mcs",
        schema,
        status: true,
        scale: true,
        columns: vec![
            column(
                "Desired",
                "integer",
                ".spec.replicas",
                "Number of desired machines.",
                0,
            ),
            column(
                "Current",
                "integer",
                ".status.replicas",
                "Number of actual machines.",
                0,
            ),
            column(
                "Ready",
                "integer",
                ".status.readyReplicas",
                "Number of ready machines.",
                0,
            ),
            column(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                "Time since the machine set was created.",
                0,
            ),
            column(
                "Available",
                "integer",
                ".status.availableReplicas",
                "Number of available machines.",
                1,
            ),
        ],
    })
}

/// The CRD of `MachineDeployment`.
pub fn machine_deployment() -> CustomResourceDefinition {
    let mut spec = structural_schema_for::<MachineDeploymentSpec>();
    replicated_spec_rules(&mut spec);
    set(&mut spec, &["required"], json!(["template"]));
    set(
        &mut spec,
        &[
            "properties",
            "strategy",
            "properties",
            "rollingUpdate",
            "x-kubernetes-validations",
        ],
        json!([
            {
                "rule": RULE_ROLLING_UPDATE_NOT_BOTH_ZERO,
                "message": MESSAGE_ROLLING_UPDATE_NOT_BOTH_ZERO,
            },
            {
                "rule": RULE_MAX_UNAVAILABLE,
                "message": MESSAGE_MAX_UNAVAILABLE,
                "fieldPath": ".maxUnavailable",
            },
            {
                "rule": RULE_MAX_SURGE,
                "message": MESSAGE_MAX_SURGE,
                "fieldPath": ".maxSurge",
            },
        ]),
    );
    for field in ["revisionHistoryLimit", "progressDeadlineSeconds"] {
        set(&mut spec, &["properties", field, "minimum"], json!(0));
    }
    let schema = root_schema(
        "Declarative updates of Machines through MachineSets.",
        vec![
            ("spec", spec),
            ("status", structural_schema_for::<MachineDeploymentStatus>()),
        ],
    );
    build(Spec {
        group: GROUP,
        kind: MachineDeployment::KIND,
        plural: MachineDeployment::PLURAL,
        short_name: "mcd",
        schema,
        status: true,
        scale: true,
        columns: vec![
            column(
                "Ready",
                "integer",
                ".status.readyReplicas",
                "Number of ready machines.",
                0,
            ),
            column(
                "Desired",
                "integer",
                ".spec.replicas",
                "Number of desired machines.",
                0,
            ),
            column(
                "Up-to-date",
                "integer",
                ".status.updatedReplicas",
                "Number of machines with the current template.",
                0,
            ),
            column(
                "Available",
                "integer",
                ".status.availableReplicas",
                "Number of available machines.",
                0,
            ),
            column(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                "Time since the machine deployment was created.",
                0,
            ),
            column(
                "Current",
                "integer",
                ".status.replicas",
                "Number of non-terminated machines.",
                1,
            ),
        ],
    })
}

/// The CRD of `MachineDisruptionBudget` (group `policy.mcm-rs.io`, short name `mdb`).
///
/// The schema checks types only: which of `maxUnavailable`/`minAvailable` is given, the
/// reasons and the windows are validated by the controller, which reports a bad spec on the
/// object (condition `DisruptionAllowed`, reason `InvalidSpec`) and in an Event.
pub fn machine_disruption_budget() -> CustomResourceDefinition {
    let schema = root_schema(
        "Limits how many of the Machines a selector picks may be voluntarily disrupted at once.",
        vec![
            (
                "spec",
                structural_schema_for::<MachineDisruptionBudgetSpec>(),
            ),
            (
                "status",
                structural_schema_for::<MachineDisruptionBudgetStatus>(),
            ),
        ],
    );
    build(Spec {
        group: POLICY_GROUP,
        kind: MachineDisruptionBudget::KIND,
        plural: MachineDisruptionBudget::PLURAL,
        short_name: "mdb",
        schema,
        status: true,
        scale: false,
        columns: vec![
            column(
                "Min-Available",
                "string",
                ".spec.minAvailable",
                "Selected machines that must stay available.",
                0,
            ),
            column(
                "Max-Unavailable",
                "string",
                ".spec.maxUnavailable",
                "Selected machines that may be unavailable.",
                0,
            ),
            column(
                "Allowed",
                "integer",
                ".status.disruptionsAllowed",
                "Voluntary disruptions allowed now.",
                0,
            ),
            column(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                "Time since the budget was created.",
                0,
            ),
        ],
    })
}

/// Validation shared by MachineSet and MachineDeployment specs.
fn replicated_spec_rules(spec: &mut Value) {
    set(spec, &["properties", "replicas", "minimum"], json!(0));
    set(
        spec,
        &["properties", "minReadySeconds", "minimum"],
        json!(0),
    );
    set(
        spec,
        &[
            "properties",
            "selector",
            "properties",
            "matchLabels",
            "maxProperties",
        ],
        json!(MATCH_LABELS_MAX_PROPERTIES),
    );
    set(
        spec,
        &[
            "properties",
            "selector",
            "properties",
            "matchLabels",
            "additionalProperties",
            "maxLength",
        ],
        json!(LABEL_VALUE_MAX_LENGTH),
    );
    set(
        spec,
        &[
            "properties",
            "template",
            "properties",
            "metadata",
            "properties",
            "labels",
            "additionalProperties",
            "maxLength",
        ],
        json!(LABEL_VALUE_MAX_LENGTH),
    );
    set(
        spec,
        &["x-kubernetes-validations"],
        json!([
            {
                "rule": RULE_SELECTOR_MATCHES_TEMPLATE,
                "message": MESSAGE_SELECTOR_MATCHES_TEMPLATE,
            },
            {
                "rule": RULE_SELECTOR_NOT_EMPTY,
                "message": MESSAGE_SELECTOR_NOT_EMPTY,
                "fieldPath": ".selector",
            },
        ]),
    );
}

struct Spec {
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    short_name: &'static str,
    schema: Value,
    status: bool,
    scale: bool,
    columns: Vec<Value>,
}

fn column(name: &str, ty: &str, path: &str, description: &str, priority: i32) -> Value {
    let mut c = json!({"name": name, "type": ty, "jsonPath": path, "description": description});
    if priority != 0 {
        set(&mut c, &["priority"], json!(priority));
    }
    c
}

/// The top-level object schema: `apiVersion`, `kind`, `metadata` plus `props`.
fn root_schema(description: &str, props: Vec<(&str, Value)>) -> Value {
    let mut properties = Map::new();
    properties.insert(
        "apiVersion".into(),
        json!({"type": "string", "description": "Versioned schema of this object."}),
    );
    properties.insert(
        "kind".into(),
        json!({"type": "string", "description": "REST resource this object represents."}),
    );
    properties.insert("metadata".into(), json!({"type": "object"}));
    for (name, schema) in props {
        properties.insert(name.into(), schema);
    }
    json!({"type": "object", "description": description, "properties": properties})
}

/// Sets `value` at `path` inside `target`, creating objects on the way.
fn set(target: &mut Value, path: &[&str], value: Value) {
    let mut cur = target;
    for key in path {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        cur = map.entry(*key).or_insert(Value::Null);
    }
    *cur = value;
}

fn build(spec: Spec) -> CustomResourceDefinition {
    let singular = spec.kind.to_lowercase();
    let mut subresources = Map::new();
    if spec.status {
        subresources.insert("status".into(), json!({}));
    }
    if spec.scale {
        subresources.insert(
            "scale".into(),
            json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}),
        );
    }
    let mut version = json!({
        "name": VERSION,
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": spec.schema},
    });
    if !subresources.is_empty() {
        set(&mut version, &["subresources"], Value::Object(subresources));
    }
    if !spec.columns.is_empty() {
        set(
            &mut version,
            &["additionalPrinterColumns"],
            Value::Array(spec.columns),
        );
    }
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", spec.plural, spec.group)},
        "spec": {
            "group": spec.group,
            "names": {
                "kind": spec.kind,
                "listKind": format!("{}List", spec.kind),
                "plural": spec.plural,
                "singular": singular,
                "shortNames": [spec.short_name],
            },
            "scope": "Namespaced",
            "versions": [version],
        },
    });
    // The JSON above is built from constants and generated schemas only; failing to convert it
    // is a programming error caught by this crate's tests, not something input can cause.
    serde_json::from_value(crd).expect("generated CRD JSON matches CustomResourceDefinition")
}
