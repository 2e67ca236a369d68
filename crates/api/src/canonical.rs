//! The canonical form of a value as Go clients see it.
//!
//! Go writers (the cluster-autoscaler, Gardener's worker controller, anything built on the
//! MCM Go types) decode an object into Go structs and encode it back. In a Go struct an
//! absent field, `null`, an empty object or list and the zero value of a non-pointer field are
//! one and the same value, so such a round trip changes the representation of an object
//! without changing what it means: a template we wrote without `nodeTemplate` comes back
//! with `"nodeTemplate": {"metadata": {"creationTimestamp": null}, "spec": {}}`. Every "did
//! this change" comparison (the template hash, finding a deployment's new MachineSet) runs on
//! the canonical form, in which those representations are equal:
//!
//! - `null`, `{}`, `[]` and `""` are removed, after their own members were (so an object
//!   holding only empty members is empty too);
//! - `false` and `0` are removed at the paths of Go's non-pointer scalar fields
//!   ([`TEMPLATE_ZERO_PATHS`]); at other paths they are meaningful (`maxEvictRetries: 0` is a
//!   `*int32` in Go: zero differs from absent);
//! - object keys are sorted (JSON objects are unordered).

use serde_json::{Map, Value};

use crate::MachineTemplateSpec;
use crate::constants::labels;

/// The paths (keys from the template's root) of the non-pointer boolean and integer fields of
/// MCM's `MachineTemplateSpec` whose zero value is the same as absence: `ObjectMeta.Generation`
/// (of the template and of its node template) and `NodeSpec.Unschedulable`.
pub const TEMPLATE_ZERO_PATHS: &[&[&str]] = &[
    &["metadata", "generation"],
    &["spec", "nodeTemplate", "metadata", "generation"],
    &["spec", "nodeTemplate", "spec", "unschedulable"],
];

/// `value` in canonical form: empty values removed (recursively), zero scalars removed at
/// `zero_paths`. Returns `None` when nothing is left.
pub fn canonical(value: &Value, zero_paths: &[&[&str]]) -> Option<Value> {
    canonical_at(value, &mut Vec::new(), zero_paths)
}

fn canonical_at<'v>(
    value: &'v Value,
    path: &mut Vec<&'v str>,
    zero_paths: &[&[&str]],
) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Bool(false) if at_zero_path(path, zero_paths) => None,
        Value::Number(n) if n.as_f64() == Some(0.0) && at_zero_path(path, zero_paths) => None,
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                path.push(k.as_str());
                if let Some(v) = canonical_at(&map[k], path, zero_paths) {
                    out.insert(k.clone(), v);
                }
                path.pop();
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Value::Array(items) => {
            // Members of a list keep their places: an empty member stays as `null`.
            let out: Vec<Value> = items
                .iter()
                .map(|v| canonical_at(v, path, zero_paths).unwrap_or(Value::Null))
                .collect();
            (!out.is_empty()).then_some(Value::Array(out))
        }
        other => Some(other.clone()),
    }
}

fn at_zero_path(path: &[&str], zero_paths: &[&[&str]]) -> bool {
    zero_paths.contains(&path)
}

/// The canonical form of a machine template ([`canonical`] with [`TEMPLATE_ZERO_PATHS`]),
/// without the `machine-template-hash` label: what the template hash is computed on and what
/// two templates are compared by. An empty template is `{}`.
pub fn canonical_template(template: &MachineTemplateSpec) -> Value {
    let mut value = serde_json::to_value(template).unwrap_or(Value::Null);
    if let Some(labels) = value
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(labels::MACHINE_TEMPLATE_HASH);
    }
    canonical(&value, TEMPLATE_ZERO_PATHS).unwrap_or_else(|| Value::Object(Map::new()))
}

/// Whether two templates are the same to a Go client: equal canonical forms
/// ([`canonical_template`]), the `machine-template-hash` label ignored.
pub fn templates_equal(a: &MachineTemplateSpec, b: &MachineTemplateSpec) -> bool {
    canonical_template(a) == canonical_template(b)
}

/// The keys of MCM's inlined `MachineConfiguration` in a machine spec.
pub const MACHINE_CONFIGURATION_KEYS: &[&str] = &[
    "drainTimeout",
    "healthTimeout",
    "creationTimeout",
    "inPlaceUpdateTimeout",
    "machinePreserveTimeout",
    "disableHealthTimeout",
    "maxEvictRetries",
    "nodeConditions",
];

/// The canonical form of a template as upstream's `EqualIgnoreHash` compares MachineSet
/// templates: [`canonical_template`] without the node template, the machine configuration
/// and the class kind. Those three are not part of a set's identity: a change of them is
/// written into the existing new set (and from there into its machines), not rolled out.
pub fn set_identity(template: &MachineTemplateSpec) -> Value {
    let mut value = canonical_template(template);
    if let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("nodeTemplate");
        for k in MACHINE_CONFIGURATION_KEYS {
            spec.remove(*k);
        }
        if let Some(class) = spec.get_mut("class").and_then(Value::as_object_mut) {
            class.remove("kind");
            if class.is_empty() {
                spec.remove("class");
            }
        }
        if spec.is_empty() {
            value.as_object_mut().map(|v| v.remove("spec"));
        }
    }
    value
}

/// Whether two templates belong to the same MachineSet (upstream's `EqualIgnoreHash`, on
/// canonical forms): [`set_identity`] equal.
pub fn same_set_template(a: &MachineTemplateSpec, b: &MachineTemplateSpec) -> bool {
    set_identity(a) == set_identity(b)
}

/// The JSON merge patch (RFC 7386) that turns `have` into `want`, `None` when they are
/// equal: changed members are set, members missing from `want` are set to `null`, objects
/// are diffed member by member, anything else is replaced whole.
pub fn merge_patch_to(have: &Value, want: &Value) -> Option<Value> {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => {
            let mut patch = Map::new();
            for (k, wv) in w {
                let diff = match h.get(k) {
                    Some(hv) => merge_patch_to(hv, wv),
                    None => Some(wv.clone()),
                };
                if let Some(d) = diff {
                    patch.insert(k.clone(), d);
                }
            }
            for k in h.keys().filter(|k| !w.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if have == want => None,
        _ => Some(want.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(value: Value) -> MachineTemplateSpec {
        serde_json::from_value(value).expect("a template")
    }

    #[test]
    fn empty_values_and_nulls_are_absent() {
        let ours = template(json!({
            "metadata": {"labels": {"pool": "w"}},
            "spec": {"class": {"kind": "MachineClass", "name": "c1"}}
        }));
        let go = template(json!({
            "metadata": {"creationTimestamp": null, "labels": {"pool": "w"}, "annotations": {}},
            "spec": {
                "class": {"apiGroup": "", "kind": "MachineClass", "name": "c1"},
                "providerID": "",
                "nodeTemplate": {"metadata": {"creationTimestamp": null}, "spec": {}}
            }
        }));
        assert!(templates_equal(&ours, &go));
        assert_eq!(canonical_template(&ours), canonical_template(&go));
    }

    #[test]
    fn zero_values_only_at_non_pointer_paths() {
        let absent = template(json!({"spec": {"class": {"name": "c1"}}}));
        let unschedulable_false = template(json!({"spec": {
            "class": {"name": "c1"},
            "nodeTemplate": {"spec": {"unschedulable": false}}
        }}));
        assert!(templates_equal(&absent, &unschedulable_false));
        // `maxEvictRetries` is a pointer in Go: 0 is not absent.
        let zero_retries =
            template(json!({"spec": {"class": {"name": "c1"}, "maxEvictRetries": 0}}));
        assert!(!templates_equal(&absent, &zero_retries));
        let disable_false =
            template(json!({"spec": {"class": {"name": "c1"}, "disableHealthTimeout": false}}));
        assert!(!templates_equal(&absent, &disable_false));
    }

    #[test]
    fn key_order_and_hash_label_do_not_count() {
        let a = template(json!({"metadata": {"labels": {"a": "1", "b": "2"}}}));
        let b = template(json!({"metadata": {"labels": {
            "b": "2", "a": "1", labels::MACHINE_TEMPLATE_HASH: "123"
        }}}));
        assert!(templates_equal(&a, &b));
    }

    #[test]
    fn real_changes_count() {
        let a = template(json!({"spec": {"class": {"name": "c1"}}}));
        let b = template(json!({"spec": {"class": {"name": "c2"}}}));
        assert!(!templates_equal(&a, &b));
        let taint = template(
            json!({"spec": {"class": {"name": "c1"}, "nodeTemplate": {"spec": {
                "taints": [{"key": "k", "effect": "NoSchedule"}]
            }}}}),
        );
        assert!(!templates_equal(&a, &taint));
        let drain = template(json!({"spec": {"class": {"name": "c1"}, "drainTimeout": "2h"}}));
        let drain_go =
            template(json!({"spec": {"class": {"name": "c1"}, "drainTimeout": "2h0m0s"}}));
        assert!(!templates_equal(&a, &drain));
        assert!(templates_equal(&drain, &drain_go));
    }

    #[test]
    fn node_template_configuration_and_class_kind_are_not_a_sets_identity() {
        let a = template(json!({"metadata": {"labels": {"pool": "w"}}, "spec": {
            "class": {"kind": "MachineClass", "name": "c1"},
            "nodeTemplate": {"metadata": {"labels": {"x": "1"}}},
            "drainTimeout": "2h", "disableHealthTimeout": false
        }}));
        let b = template(json!({"metadata": {"labels": {"pool": "w"}}, "spec": {
            "class": {"name": "c1"},
            "nodeTemplate": {"metadata": {"labels": {"x": "2"}}},
            "maxEvictRetries": 3
        }}));
        assert!(same_set_template(&a, &b));
        assert!(!templates_equal(&a, &b));
        let other_class = template(json!({"metadata": {"labels": {"pool": "w"}}, "spec": {
            "class": {"name": "c2"}
        }}));
        assert!(!same_set_template(&a, &other_class));
        let other_labels = template(json!({"metadata": {"labels": {"pool": "v"}}, "spec": {
            "class": {"name": "c1"}
        }}));
        assert!(!same_set_template(&a, &other_labels));
    }

    #[test]
    fn merge_patches_set_changes_and_remove_what_is_gone() {
        let have = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"taints": [1]}});
        let want = json!({"metadata": {"labels": {"a": "1", "c": "3"}}});
        assert_eq!(
            merge_patch_to(&have, &want),
            Some(json!({"metadata": {"labels": {"b": null, "c": "3"}}, "spec": null}))
        );
        assert_eq!(merge_patch_to(&want, &want), None);
        assert_eq!(merge_patch_to(&json!(1), &json!([1])), Some(json!([1])));
    }

    #[test]
    fn list_members_keep_their_places() {
        let v = json!({"a": [{"x": ""}, {"y": 1}]});
        assert_eq!(canonical(&v, &[]), Some(json!({"a": [null, {"y": 1}]})));
        assert_eq!(canonical(&json!({"a": [], "b": {"c": null}}), &[]), None);
    }
}
