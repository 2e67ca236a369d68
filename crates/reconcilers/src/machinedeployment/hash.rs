//! A stable hash of a machine template, used to name new MachineSets and as the value of
//! the `machine-template-hash` label.
//!
//! The Go controllers hash the Go struct dump of the template, which cannot be reproduced.
//! New sets are therefore **found** by template equality (ignoring the hash label), like
//! Kubernetes' `FindNewReplicaSet`, so sets created by the Go MCM are adopted as they are; the
//! hash only has to be stable across our own restarts. It is FNV-1a (32 bit) over the
//! template's canonical JSON (object keys sorted) and the collision count, encoded with
//! Kubernetes' "safe" alphabet (no vowels, no confusable characters).

use mcm_api::MachineTemplateSpec;
use mcm_api::constants::labels;
use serde_json::Value;

const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn fnv1a(bytes: &[u8], mut hash: u32) -> u32 {
    for b in bytes {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(*k) {
                    canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The template as JSON without the `machine-template-hash` label, with empty label and
/// annotation maps removed, for equality checks.
pub fn template_without_hash(template: &MachineTemplateSpec) -> Value {
    let mut t = template.clone();
    if let Some(meta) = t.metadata.as_mut() {
        if let Some(l) = meta.labels.as_mut() {
            l.remove(labels::MACHINE_TEMPLATE_HASH);
            if l.is_empty() {
                meta.labels = None;
            }
        }
        if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
            meta.annotations = None;
        }
    }
    serde_json::to_value(&t).unwrap_or(Value::Null)
}

/// Whether two templates are equal when the hash label is ignored.
pub fn templates_equal(a: &MachineTemplateSpec, b: &MachineTemplateSpec) -> bool {
    template_without_hash(a) == template_without_hash(b)
}

/// The template hash for `collision_count`.
pub fn template_hash(template: &MachineTemplateSpec, collision_count: Option<i32>) -> String {
    let mut text = String::new();
    canonical(&template_without_hash(template), &mut text);
    let mut hash = fnv1a(text.as_bytes(), 0x811c_9dc5);
    if let Some(c) = collision_count {
        hash = fnv1a(&c.to_le_bytes(), hash);
    }
    let mut n = hash;
    let mut s = String::new();
    loop {
        let idx = (n % 27) as usize;
        s.push(char::from(SAFE_ALPHABET[idx]));
        n /= 27;
        if n == 0 {
            break;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn template(class: &str, extra_label: Option<(&str, &str)>) -> MachineTemplateSpec {
        let mut labels = std::collections::BTreeMap::from([("name".to_owned(), "md".to_owned())]);
        if let Some((k, v)) = extra_label {
            labels.insert(k.to_owned(), v.to_owned());
        }
        MachineTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..ObjectMeta::default()
            }),
            spec: Some(mcm_api::MachineSpec {
                class: Some(mcm_api::ClassSpec {
                    name: Some(class.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn stable_and_ignores_hash_label() {
        let a = template("c1", None);
        let b = template("c1", Some((labels::MACHINE_TEMPLATE_HASH, "xyz")));
        assert_eq!(template_hash(&a, None), template_hash(&b, None));
        assert!(templates_equal(&a, &b));
        assert_ne!(
            template_hash(&a, None),
            template_hash(&template("c2", None), None)
        );
        assert_ne!(template_hash(&a, None), template_hash(&a, Some(1)));
        assert!(
            template_hash(&a, None)
                .chars()
                .all(|c| SAFE_ALPHABET.contains(&(c as u8)))
        );
    }
}
