//! The `providerSpec` of a local MachineClass: what kind of "VM" to run.
//!
//! ```yaml
//! providerSpec:
//!   capacity: { cpu: "2", memory: 4Gi, pods: "110", ephemeralStorage: 20Gi }
//!   labels: { topology.kubernetes.io/zone: local-a }
//!   taints: [ { key: dedicated, value: batch, effect: NoSchedule } ]
//!   bootDelay: 2s          # wait before registering the Node
//!   failToBoot: false      # true: the process exits with 1 before registering
//!   crashAfter: 10m        # the process dies abruptly (exit 137) after that long
//!   heartbeatInterval: 2s  # Lease renewal and Ready heartbeat period (default 2s)
//!   stateDirectory: /var/lib/mcm-local   # default: see below
//!   node: process          # process (default) or kwok
//! ```
//!
//! `node: kwok` makes VMs without a process, for scale: the VM is its record, and the driver
//! creates its Node annotated `kwok.x-k8s.io/node: fake`, which the kwok controller keeps
//! Ready. `bootDelay`, `failToBoot`, `crashAfter` and `heartbeatInterval` describe a
//! process and are refused with it.
//!
//! Unknown keys are rejected (so typos are caught), and validation reports every problem
//! at once, each naming its field (`providerSpec.capacity.cpu: "abc" is not a quantity ...`).
//!
//! The state directory defaults to `$XDG_STATE_HOME/mcm-local`, or
//! `$HOME/.local/state/mcm-local` when `XDG_STATE_HOME` is unset or empty (see
//! [`default_state_directory`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use mcm_api::GoDuration;
use mcm_api::quantity::ParsedQuantity;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Default heartbeat interval of a VM's agent.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// The largest accepted heartbeat interval: the Node Lease lasts 40s, and the node lifecycle
/// controller's grace period is usually shorter than that.
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// Default capacity (and allocatable) of a local VM's Node.
pub const DEFAULT_CAPACITY: [(&str, &str); 4] = [
    ("cpu", "2"),
    ("memory", "4Gi"),
    ("pods", "110"),
    ("ephemeral-storage", "20Gi"),
];

/// The providerSpec of a local MachineClass. JSON names are camelCase; unknown keys are an
/// error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderSpec {
    /// Capacity (= allocatable) of the Node; missing entries take [`DEFAULT_CAPACITY`].
    #[serde(default)]
    pub capacity: Capacity,
    /// Labels put on the Node (in addition to the well-known ones the agent sets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Taints put on the Node at registration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// How long the VM "boots" before it registers its Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_delay: Option<GoDuration>,
    /// When true, the VM process exits with status 1 before registering (boot failure).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_to_boot: bool,
    /// When true, the VM's node agent reports every in-place update as failed (label
    /// `node.machine.sapcloud.io/update-result=failed`), to exercise that path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_in_place_update: bool,
    /// When set, the VM process exits abruptly (status 137, no clean-up) after that long,
    /// counted from its start, like a kernel panic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_after: Option<GoDuration>,
    /// Period of Lease renewals and Ready heartbeats (default [`DEFAULT_HEARTBEAT_INTERVAL`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval: Option<GoDuration>,
    /// Where VM records and working directories live (default
    /// [`default_state_directory`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_directory: Option<PathBuf>,
    /// What runs the VM's Node: a `local-node` process (default) or kwok.
    #[serde(default, skip_serializing_if = "NodeKind::is_process")]
    pub node: NodeKind,
}

/// What runs the Node of a local VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeKind {
    /// A `local-node` process: a hollow kubelet that registers and heartbeats the Node.
    #[default]
    Process,
    /// No process: the driver creates the Node for the kwok controller to keep Ready.
    Kwok,
}

impl NodeKind {
    /// True for [`NodeKind::Process`].
    pub fn is_process(&self) -> bool {
        *self == NodeKind::Process
    }
}

/// The providerSpec fields that describe a process and so cannot go with `node: kwok`.
const PROCESS_ONLY_KEYS: [&str; 5] = [
    "bootDelay",
    "failToBoot",
    "failInPlaceUpdate",
    "crashAfter",
    "heartbeatInterval",
];

/// Node capacity of a local VM. Every entry is a Kubernetes quantity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capacity {
    /// `cpu`, e.g. `"2"` or `"500m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// `memory`, e.g. `"4Gi"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// `pods`, e.g. `"110"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Quantity>,
    /// `ephemeral-storage` (JSON key `ephemeralStorage`), e.g. `"20Gi"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<Quantity>,
}

/// One problem found in a providerSpec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The JSON path of the field, e.g. `providerSpec.capacity.cpu`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// An invalid providerSpec: every problem found, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid providerSpec: {}", join_problems(.problems))]
pub struct SpecError {
    /// The problems, in field order.
    pub problems: Vec<SpecProblem>,
}

fn join_problems(problems: &[SpecProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The state directory used when the providerSpec sets none: `$XDG_STATE_HOME/mcm-local`,
/// else `$HOME/.local/state/mcm-local`; `None` when neither variable is set (non-empty).
pub fn default_state_directory() -> Option<PathBuf> {
    state_directory_from(
        std::env::var_os("XDG_STATE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

/// [`default_state_directory`] from explicit variable values (pure, for tests).
fn state_directory_from(xdg_state_home: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    let non_empty = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    non_empty(xdg_state_home)
        .map(|d| d.join("mcm-local"))
        .or_else(|| non_empty(home).map(|h| h.join(".local/state/mcm-local")))
}

impl ProviderSpec {
    /// Parses and validates a providerSpec JSON value. `null` means "all defaults".
    pub fn from_value(value: &Value) -> Result<ProviderSpec, SpecError> {
        if value.is_null() {
            return Ok(ProviderSpec::default());
        }
        let problems = validate(value);
        if !problems.is_empty() {
            return Err(SpecError { problems });
        }
        // Validation accepted every field, so the typed parse succeeds; report it anyway.
        serde_json::from_value(value.clone()).map_err(|e| SpecError {
            problems: vec![SpecProblem {
                field: ROOT.to_string(),
                message: e.to_string(),
            }],
        })
    }

    /// The heartbeat interval (default [`DEFAULT_HEARTBEAT_INTERVAL`]).
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
            .map_or(DEFAULT_HEARTBEAT_INTERVAL, |d| d.as_duration())
    }

    /// The boot delay (default zero).
    pub fn boot_delay(&self) -> Duration {
        self.boot_delay.map_or(Duration::ZERO, |d| d.as_duration())
    }

    /// The crash delay, when a crash is asked for.
    pub fn crash_after(&self) -> Option<Duration> {
        self.crash_after.map(|d| d.as_duration())
    }

    /// The state directory: the spec's, else [`default_state_directory`].
    pub fn state_directory(&self) -> Option<PathBuf> {
        self.state_directory
            .clone()
            .or_else(default_state_directory)
    }

    /// The Node capacity with defaults filled in, keyed by resource name
    /// (`cpu`, `memory`, `pods`, `ephemeral-storage`).
    pub fn capacity_map(&self) -> BTreeMap<String, Quantity> {
        let mut out: BTreeMap<String, Quantity> = DEFAULT_CAPACITY
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect();
        let c = &self.capacity;
        for (key, value) in [
            ("cpu", &c.cpu),
            ("memory", &c.memory),
            ("pods", &c.pods),
            ("ephemeral-storage", &c.ephemeral_storage),
        ] {
            if let Some(q) = value {
                out.insert(key.to_string(), q.clone());
            }
        }
        out
    }
}

const ROOT: &str = "providerSpec";
const TOP_LEVEL_KEYS: [&str; 10] = [
    "capacity",
    "labels",
    "taints",
    "bootDelay",
    "failToBoot",
    "failInPlaceUpdate",
    "crashAfter",
    "heartbeatInterval",
    "stateDirectory",
    "node",
];
const CAPACITY_KEYS: [&str; 4] = ["cpu", "memory", "pods", "ephemeralStorage"];
const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Collects every problem of a providerSpec JSON value.
fn validate(value: &Value) -> Vec<SpecProblem> {
    let mut p = Problems::default();
    let Some(obj) = value.as_object() else {
        p.add(
            ROOT,
            format!("must be a JSON object, got {}", json_type(value)),
        );
        return p.0;
    };
    for (key, v) in obj {
        let field = format!("{ROOT}.{key}");
        match key.as_str() {
            "capacity" => validate_capacity(&field, v, &mut p),
            "labels" => validate_labels(&field, v, &mut p),
            "taints" => validate_taints(&field, v, &mut p),
            "bootDelay" | "crashAfter" => {
                validate_duration(&field, v, &mut p);
            }
            "heartbeatInterval" => {
                if let Some(d) = validate_duration(&field, v, &mut p)
                    && (d.is_zero() || d > MAX_HEARTBEAT_INTERVAL)
                {
                    p.add(
                        &field,
                        format!(
                            "must be more than 0s and at most {}s",
                            MAX_HEARTBEAT_INTERVAL.as_secs()
                        ),
                    );
                }
            }
            "failToBoot" | "failInPlaceUpdate" => {
                if !v.is_boolean() {
                    p.add(
                        &field,
                        format!("must be true or false, got {}", json_type(v)),
                    );
                }
            }
            "stateDirectory" => match v.as_str() {
                Some(s) if s.starts_with('/') => {}
                Some(s) => p.add(&field, format!("{s:?} must be an absolute path")),
                None => p.add(&field, format!("must be a string, got {}", json_type(v))),
            },
            "node" => match v.as_str() {
                Some("process" | "kwok") => {}
                Some(s) => p.add(&field, format!("{s:?} must be \"process\" or \"kwok\"")),
                None => p.add(&field, format!("must be a string, got {}", json_type(v))),
            },
            _ => p.add(&field, unknown_key_message(&TOP_LEVEL_KEYS)),
        }
    }
    if obj.get("node").and_then(Value::as_str) == Some("kwok") {
        for key in PROCESS_ONLY_KEYS.iter().filter(|k| obj.contains_key(**k)) {
            p.add(
                &format!("{ROOT}.{key}"),
                "describes a local-node process and cannot be used with node: kwok".into(),
            );
        }
    }
    p.0
}

fn validate_capacity(field: &str, v: &Value, p: &mut Problems) {
    let Some(obj) = v.as_object() else {
        p.add(field, format!("must be an object, got {}", json_type(v)));
        return;
    };
    for (key, q) in obj {
        let field = format!("{field}.{key}");
        if !CAPACITY_KEYS.contains(&key.as_str()) {
            p.add(&field, unknown_key_message(&CAPACITY_KEYS));
            continue;
        }
        let Some(s) = q.as_str() else {
            p.add(
                &field,
                format!("must be a quantity string, got {}", json_type(q)),
            );
            continue;
        };
        match ParsedQuantity::parse(s) {
            Ok(parsed) if parsed < ParsedQuantity::default() => {
                p.add(&field, format!("{s:?} must not be negative"));
            }
            Ok(_) => {}
            Err(e) => p.add(&field, format!("{s:?} is not a quantity ({e})")),
        }
    }
}

fn validate_labels(field: &str, v: &Value, p: &mut Problems) {
    let Some(obj) = v.as_object() else {
        p.add(field, format!("must be an object, got {}", json_type(v)));
        return;
    };
    for (key, value) in obj {
        let field = format!("{field}[{key:?}]");
        if let Err(e) = check_label_key(key) {
            p.add(&field, format!("invalid label key: {e}"));
        }
        match value.as_str() {
            Some(s) => {
                if let Err(e) = check_label_value(s) {
                    p.add(&field, format!("invalid label value {s:?}: {e}"));
                }
            }
            None => p.add(
                &field,
                format!("must be a string, got {}", json_type(value)),
            ),
        }
    }
}

fn validate_taints(field: &str, v: &Value, p: &mut Problems) {
    let Some(list) = v.as_array() else {
        p.add(field, format!("must be a list, got {}", json_type(v)));
        return;
    };
    for (i, t) in list.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let Some(obj) = t.as_object() else {
            p.add(&field, format!("must be an object, got {}", json_type(t)));
            continue;
        };
        for key in obj.keys() {
            if !["key", "value", "effect", "timeAdded"].contains(&key.as_str()) {
                p.add(
                    &format!("{field}.{key}"),
                    unknown_key_message(&["key", "value", "effect", "timeAdded"]),
                );
            }
        }
        match obj.get("key").and_then(Value::as_str) {
            Some(k) => {
                if let Err(e) = check_label_key(k) {
                    p.add(&format!("{field}.key"), format!("invalid taint key: {e}"));
                }
            }
            None => p.add(
                &format!("{field}.key"),
                "is required (a string)".to_string(),
            ),
        }
        match obj.get("value") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                if let Err(e) = check_label_value(s) {
                    p.add(
                        &format!("{field}.value"),
                        format!("invalid taint value {s:?}: {e}"),
                    );
                }
            }
            Some(other) => p.add(
                &format!("{field}.value"),
                format!("must be a string, got {}", json_type(other)),
            ),
        }
        match obj.get("effect").and_then(Value::as_str) {
            Some(e) if TAINT_EFFECTS.contains(&e) => {}
            Some(e) => p.add(
                &format!("{field}.effect"),
                format!("{e:?} is not one of {}", TAINT_EFFECTS.join(", ")),
            ),
            None => p.add(
                &format!("{field}.effect"),
                format!("is required (one of {})", TAINT_EFFECTS.join(", ")),
            ),
        }
        if let Some(ta) = obj.get("timeAdded")
            && serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>(
                ta.clone(),
            )
            .is_err()
        {
            p.add(
                &format!("{field}.timeAdded"),
                "must be an RFC 3339 time".to_string(),
            );
        }
    }
}

fn validate_duration(field: &str, v: &Value, p: &mut Problems) -> Option<Duration> {
    let Some(s) = v.as_str() else {
        p.add(
            field,
            format!(
                "must be a Go duration string such as \"5s\", got {}",
                json_type(v)
            ),
        );
        return None;
    };
    match mcm_api::duration::parse_go_duration(s) {
        Ok(d) => Some(d),
        Err(e) => {
            p.add(field, format!("{s:?} is not a Go duration ({e})"));
            None
        }
    }
}

fn check_label_key(key: &str) -> Result<(), String> {
    mcm_api::syntax::label_key(key).map_err(|e| e.to_string())
}

fn check_label_value(value: &str) -> Result<(), String> {
    mcm_api::syntax::label_value(value).map_err(|e| e.to_string())
}

fn unknown_key_message(known: &[&str]) -> String {
    format!("unknown field (known fields: {})", known.join(", "))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[derive(Default)]
struct Problems(Vec<SpecProblem>);

impl Problems {
    fn add(&mut self, field: &str, message: String) {
        self.0.push(SpecProblem {
            field: field.to_string(),
            message,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_spec_parses() {
        let spec = ProviderSpec::from_value(&json!({
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "50", "ephemeralStorage": "1Ti"},
            "labels": {"topology.kubernetes.io/zone": "local-a", "role": "worker"},
            "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
            "bootDelay": "2s",
            "failToBoot": false,
            "failInPlaceUpdate": true,
            "crashAfter": "1m30s",
            "heartbeatInterval": "500ms",
            "stateDirectory": "/tmp/x",
        }))
        .expect("valid");
        assert_eq!(spec.boot_delay(), Duration::from_secs(2));
        assert!(spec.fail_in_place_update);
        assert_eq!(spec.crash_after(), Some(Duration::from_secs(90)));
        assert_eq!(spec.heartbeat_interval(), Duration::from_millis(500));
        assert_eq!(spec.state_directory(), Some(PathBuf::from("/tmp/x")));
        let cap = spec.capacity_map();
        assert_eq!(cap["cpu"], Quantity("4".into()));
        assert_eq!(cap["ephemeral-storage"], Quantity("1Ti".into()));
        assert_eq!(spec.taints[0].effect, "NoSchedule");
        // The normalized form parses back to the same spec.
        let round = ProviderSpec::from_value(&serde_json::to_value(&spec).expect("serializes"))
            .expect("valid");
        assert_eq!(round, spec);
    }

    #[test]
    fn defaults() {
        let spec = ProviderSpec::from_value(&json!({})).expect("valid");
        assert_eq!(spec, ProviderSpec::from_value(&Value::Null).expect("valid"));
        assert_eq!(spec.heartbeat_interval(), DEFAULT_HEARTBEAT_INTERVAL);
        assert_eq!(spec.boot_delay(), Duration::ZERO);
        assert_eq!(spec.crash_after(), None);
        let cap = spec.capacity_map();
        assert_eq!(cap["cpu"], Quantity("2".into()));
        assert_eq!(cap["memory"], Quantity("4Gi".into()));
        assert_eq!(cap["pods"], Quantity("110".into()));
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let err = ProviderSpec::from_value(&json!({
            "capacity": {"cpu": "abc", "gpu": "1", "memory": -1},
            "labels": {"bad key!": "v", "ok": "bad value!"},
            "taints": [{"key": "k", "effect": "Sometimes"}, {"value": "v", "effect": "NoSchedule"}],
            "bootDelay": "5 minutes",
            "failToBoot": "yes",
            "heartbeatInterval": "0s",
            "stateDirectory": "relative/dir",
            "bootDelya": "1s",
        }))
        .expect_err("invalid");
        let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
        for want in [
            "providerSpec.capacity.cpu",
            "providerSpec.capacity.gpu",
            "providerSpec.capacity.memory",
            "providerSpec.labels[\"bad key!\"]",
            "providerSpec.labels[\"ok\"]",
            "providerSpec.taints[0].effect",
            "providerSpec.taints[1].key",
            "providerSpec.bootDelay",
            "providerSpec.failToBoot",
            "providerSpec.heartbeatInterval",
            "providerSpec.stateDirectory",
            "providerSpec.bootDelya",
        ] {
            assert!(fields.contains(&want), "{want} missing in {fields:?}");
        }
        let msg = err.to_string();
        assert!(
            msg.contains(r#"providerSpec.capacity.cpu: "abc" is not a quantity"#),
            "{msg}"
        );
        assert!(
            msg.contains("providerSpec.bootDelya: unknown field"),
            "{msg}"
        );
    }

    #[test]
    fn non_objects_are_rejected() {
        let err = ProviderSpec::from_value(&json!([1])).expect_err("invalid");
        assert_eq!(err.problems[0].field, "providerSpec");
    }

    #[test]
    fn typed_deserialization_also_denies_unknown_fields() {
        assert!(serde_json::from_value::<ProviderSpec>(json!({"capacty": {}})).is_err());
        assert!(serde_json::from_value::<Capacity>(json!({"gpu": "1"})).is_err());
    }

    #[test]
    fn kwok_nodes_refuse_process_settings() {
        let spec = ProviderSpec::from_value(&serde_json::json!({"node": "kwok"})).unwrap();
        assert_eq!(spec.node, NodeKind::Kwok);
        assert_eq!(
            ProviderSpec::from_value(&Value::Null).unwrap().node,
            NodeKind::Process
        );
        let err = ProviderSpec::from_value(&serde_json::json!({
            "node": "kwok", "bootDelay": "1s", "crashAfter": "1m", "labels": {"a": "b"}
        }))
        .unwrap_err();
        let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["providerSpec.bootDelay", "providerSpec.crashAfter"]
        );
        assert!(err.to_string().contains("node: kwok"), "{err}");
        let err = ProviderSpec::from_value(&serde_json::json!({"node": "vm"})).unwrap_err();
        assert_eq!(err.problems[0].field, "providerSpec.node");
        assert!(err.problems[0].message.contains("\"kwok\""), "{err}");
        // A process spec serializes without the field (records stay as they were).
        let json = serde_json::to_value(ProviderSpec::default()).unwrap();
        assert!(json.get("node").is_none(), "{json}");
    }

    #[test]
    fn label_syntax() {
        assert!(check_label_key("kubernetes.io/hostname").is_ok());
        assert!(check_label_key("a").is_ok());
        assert!(check_label_key("/a").is_err());
        assert!(check_label_key("Upper.io/a").is_err());
        assert!(check_label_key("x/").is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("a-b_c.d").is_ok());
        assert!(check_label_value("-a").is_err());
        assert!(check_label_value(&"a".repeat(64)).is_err());
    }

    #[test]
    fn default_state_directory_follows_xdg() {
        assert_eq!(
            state_directory_from(Some("/x".into()), Some("/home/u".into())),
            Some(PathBuf::from("/x/mcm-local"))
        );
        assert_eq!(
            state_directory_from(Some("".into()), Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.local/state/mcm-local"))
        );
        assert_eq!(state_directory_from(None, None), None);
    }
}
