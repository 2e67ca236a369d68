//! JSON-schema generation tuned for structural CRD schemas.

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings, json_schema};
use serde_json::Value;

/// Schema of an arbitrary JSON object whose unknown fields the API server keeps.
pub(crate) fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The pattern Kubernetes CRDs give a quantity string (as controller-gen emits it for
/// `resource.Quantity`), so that `cpu: lots` is refused at admission.
pub(crate) const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Schema of a map of resource names to quantities (an integer or a quantity string).
pub(crate) fn quantity_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true,
        },
    })
}

/// Schema of the `metadata` of a template (a Machine's in a set's or deployment's template, a
/// Node's in a node template): an object that keeps unknown fields, as the Go CRDs type it,
/// so that what Go's `json.Marshal` writes there (`creationTimestamp: null`, `{}`) is
/// accepted by a server-side apply as well as a POST. The two fields a template's metadata
/// is for stay typed, maps of strings: a label value of another type is refused at
/// admission, and the CEL rule that the selector matches the template's labels can read
/// them.
pub(crate) fn template_metadata(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "labels": {
                "description": "Labels to set (a map of strings).",
                "type": "object",
                "additionalProperties": { "type": "string" },
            },
            "annotations": {
                "description": "Annotations to set (a map of strings).",
                "type": "object",
                "additionalProperties": { "type": "string" },
            },
        },
    })
}

/// The structural (CRD-ready) schema of `T`: subschemas inlined, no `$ref`, no `nullable`, no
/// `default`, `Option` wrappers removed.
pub(crate) fn structural_schema_for<T: JsonSchema>() -> Value {
    let settings = SchemaSettings::openapi3().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    });
    let mut value = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    normalize(&mut value);
    value
}

/// Whether `v` is a schema that only admits `null`.
fn is_null_schema(v: &Value) -> bool {
    let Some(obj) = v.as_object() else {
        return false;
    };
    obj.get("type").and_then(Value::as_str) == Some("null")
        || obj.get("enum") == Some(&Value::Array(vec![Value::Null]))
        || obj.get("const") == Some(&Value::Null)
}

/// Rewrites a schemars schema into the structural subset accepted by `apiextensions.k8s.io/v1`.
pub(crate) fn normalize(value: &mut Value) {
    match value {
        Value::Object(obj) => {
            for key in ["anyOf", "oneOf"] {
                let collapsed = match obj.get(key).and_then(Value::as_array) {
                    Some(variants)
                        if variants.len() == 2 && variants.iter().any(is_null_schema) =>
                    {
                        variants.iter().find(|v| !is_null_schema(v)).cloned()
                    }
                    _ => None,
                };
                if let Some(Value::Object(inner)) = collapsed {
                    obj.remove(key);
                    for (k, v) in inner {
                        obj.entry(k).or_insert(v);
                    }
                }
            }
            if let Some(Value::Array(types)) = obj.get("type") {
                let non_null: Vec<Value> = types
                    .iter()
                    .filter(|t| t.as_str() != Some("null"))
                    .cloned()
                    .collect();
                if non_null.len() == 1 {
                    obj.insert("type".into(), non_null[0].clone());
                }
            }
            for key in [
                "nullable",
                "default",
                "$schema",
                "title",
                "examples",
                "example",
                "$defs",
                "definitions",
                "readOnly",
                "writeOnly",
            ] {
                obj.remove(key);
            }
            if obj.get("additionalProperties") == Some(&Value::Bool(false)) {
                obj.remove("additionalProperties");
            }
            if obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                obj.remove("type");
                obj.remove("anyOf");
            }
            // Recurse only into subschema positions, never into a `properties` map's keys.
            if let Some(Value::Object(props)) = obj.get_mut("properties") {
                props.values_mut().for_each(normalize);
            }
            for key in ["items", "additionalProperties", "not"] {
                if let Some(v) = obj.get_mut(key) {
                    normalize(v);
                }
            }
            for key in ["anyOf", "oneOf", "allOf"] {
                if let Some(Value::Array(vs)) = obj.get_mut(key) {
                    vs.iter_mut().for_each(normalize);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}
