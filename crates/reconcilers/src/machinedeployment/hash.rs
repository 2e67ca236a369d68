//! A stable hash of a machine template, used to name new MachineSets and as the value of
//! the `machine-template-hash` label.
//!
//! The Go controllers hash the Go struct dump of the template, which cannot be reproduced.
//! New sets are therefore **found** by template equality as upstream's `EqualIgnoreHash`
//! compares ([`templates_equal`]), so sets created by the Go MCM are adopted as they are; the
//! hash only has to be stable across our own restarts and across Go clients' round trips of
//! the template. It is FNV-1a (32 bit) over the template's canonical JSON
//! ([`mcm_api::canonical`]: keys sorted, `null`/empty values and Go's non-pointer zero values
//! removed, as a Go struct makes them equal) and the collision count, encoded with Kubernetes'
//! "safe" alphabet (no vowels, no confusable characters).

use mcm_api::MachineTemplateSpec;
use mcm_api::canonical::canonical_template;
#[cfg(test)]
use mcm_api::constants::labels;

const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn fnv1a(bytes: &[u8], mut hash: u32) -> u32 {
    for b in bytes {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The template in canonical form, as one line of JSON with sorted keys
/// ([`mcm_api::canonical::canonical_template`]).
fn canonical_text(template: &MachineTemplateSpec) -> String {
    // serde_json keeps the (sorted) key order of the canonical map.
    canonical_template(template).to_string()
}

/// Whether a set with template `a` is the set of a deployment with template `b`: upstream's
/// `EqualIgnoreHash` on canonical forms ([`mcm_api::canonical::same_set_template`]): the
/// hash label, the node template, the machine configuration and the class kind do not count
/// (they are written into the existing set instead), nor does how a Go client represents
/// empty and zero values.
pub(crate) fn templates_equal(a: &MachineTemplateSpec, b: &MachineTemplateSpec) -> bool {
    mcm_api::canonical::same_set_template(a, b)
}

/// The template hash for `collision_count`.
pub(crate) fn template_hash(
    template: &MachineTemplateSpec,
    collision_count: Option<i32>,
) -> String {
    let text = canonical_text(template);
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

    /// The template of a MachineDeployment fixture.
    fn fixture_template(json: &str) -> MachineTemplateSpec {
        let d: mcm_api::MachineDeployment = serde_json::from_str(json).expect("a deployment");
        d.spec.template
    }

    /// Each case as we wrote it and as a Go client (the cluster-autoscaler's MCM types,
    /// v0.53.0) sends it back on its `Update`: `tests/fixtures/go-roundtrip`.
    const ROUND_TRIPS: &[(&str, &str, &str)] = &[
        (
            "minimal",
            include_str!("../../tests/fixtures/go-roundtrip/minimal.in.json"),
            include_str!("../../tests/fixtures/go-roundtrip/minimal.go.json"),
        ),
        (
            "node-template",
            include_str!("../../tests/fixtures/go-roundtrip/node-template.in.json"),
            include_str!("../../tests/fixtures/go-roundtrip/node-template.go.json"),
        ),
        (
            "machine-config",
            include_str!("../../tests/fixtures/go-roundtrip/machine-config.in.json"),
            include_str!("../../tests/fixtures/go-roundtrip/machine-config.go.json"),
        ),
        (
            "gardener-like",
            include_str!("../../tests/fixtures/go-roundtrip/gardener-like.in.json"),
            include_str!("../../tests/fixtures/go-roundtrip/gardener-like.go.json"),
        ),
        (
            "explicit-empties",
            include_str!("../../tests/fixtures/go-roundtrip/explicit-empties.in.json"),
            include_str!("../../tests/fixtures/go-roundtrip/explicit-empties.go.json"),
        ),
        (
            "zero-counters",
            include_str!("../../tests/fixtures/go-roundtrip/zero-counters.in.json"),
            include_str!("../../tests/fixtures/go-roundtrip/zero-counters.go.json"),
        ),
    ];

    #[test]
    fn a_go_clients_round_trip_keeps_the_set_and_the_hash() {
        for (case, ours, go) in ROUND_TRIPS {
            let ours = fixture_template(ours);
            let go = fixture_template(go);
            assert!(templates_equal(&ours, &go), "{case}: another set");
            if *case == "machine-config" {
                // The v0.53 types do not know `disableHealthTimeout`: Go drops it. The set
                // stays (the configuration is written into it); the full template differs.
                assert!(!mcm_api::canonical::templates_equal(&ours, &go), "{case}");
                let mut without = ours.clone();
                if let Some(spec) = without.spec.as_mut() {
                    spec.configuration.disable_health_timeout = None;
                }
                assert_eq!(
                    template_hash(&without, None),
                    template_hash(&go, None),
                    "{case}"
                );
            } else {
                assert_eq!(
                    template_hash(&ours, None),
                    template_hash(&go, None),
                    "{case}"
                );
            }
        }
    }

    #[test]
    fn a_real_change_after_a_round_trip_is_another_template() {
        let (_, _, go) = ROUND_TRIPS[0];
        let go = fixture_template(go);
        let mut other_class = go.clone();
        if let Some(class) = other_class.spec.as_mut().and_then(|s| s.class.as_mut()) {
            class.name = Some("c2".into());
        }
        assert!(!templates_equal(&go, &other_class));
        assert_ne!(template_hash(&go, None), template_hash(&other_class, None));
        let mut labelled = go.clone();
        labelled
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(Default::default)
            .insert("extra".into(), "1".into());
        assert!(!templates_equal(&go, &labelled));
        assert_ne!(template_hash(&go, None), template_hash(&labelled, None));
    }
}
