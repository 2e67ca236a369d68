//! Every JSON key of Gardener's Go providerSpec struct (`tests/golden/go-keys.txt`, read from
//! the provider repository at the commit named in its header) is taken by our decoder: a key
//! Go accepts and we would ignore is a class that silently does something else.

use mcm_driver::gojson::coverage;

const GO_KEYS: &str = include_str!("golden/go-keys.txt");

#[test]
fn every_key_of_the_go_spec_is_taken() {
    let overrides: &[(&str, serde_json::Value)] = &OVERRIDES;
    let missing = coverage::missing_keys::<mcm_provider_gcp::ProviderSpec>(GO_KEYS, overrides)
        .expect("the document of every key decodes");
    assert_eq!(missing, Vec::<String>::new(), "keys Go takes and we ignore");
}

/// Values for keys whose Go type allows what ours refuses (an enum's variants).
const OVERRIDES: [(&str, serde_json::Value); 0] = [];
