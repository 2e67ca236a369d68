//! Golden classes: the providerSpecs the Gardener extension renders for representative worker
//! pools (`tests/golden/*.json`, from the extension's worker code at the commit named in
//! `tests/golden/SOURCE.md`), decoded as the Go driver decodes them and validated: each pool is
//! either served (no problem, no ignored key) or refused with the fields it cannot serve yet,
//! never served as something else.

use mcm_api::MachineClass;
use mcm_provider_azure::spec;

fn class(pool: &str) -> MachineClass {
    let path = format!("{}/tests/golden/{pool}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("golden file");
    MachineClass {
        provider: Some("Azure".into()),
        provider_spec: serde_json::from_str(&text).expect("golden JSON"),
        ..MachineClass::default()
    }
}

/// (pool, the fields refused; empty: served).
const POOLS: &[(&str, &[&str])] = &[
    ("marketplace-urn-with-plan", &[]),
    ("marketplace-urn-skip-agreement", &[]),
    ("community-gallery-image", &[]),
    ("shared-gallery-image", &[]),
    ("zoned", &[]),
    ("vmss-flex", &[]),
    ("azure-china", &[]),
    ("azure-government", &[]),
    // Data disks made from an image are not served yet (issue 34): refused with the field.
    (
        "imageref-data-disks",
        &["providerSpec.properties.storageProfile.dataDisks[0].imageRef"],
    ),
];

#[test]
fn each_pool_is_served_or_refused_with_its_fields() {
    for (pool, refused) in POOLS {
        let c = class(pool);
        assert_eq!(
            spec::class_warnings(&c),
            Vec::<String>::new(),
            "{pool}: ignored keys"
        );
        let fields: Vec<String> = spec::class_problems(&c)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(fields, *refused, "{pool}");
    }
}
