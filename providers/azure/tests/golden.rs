//! Golden classes: the providerSpecs the Gardener extension renders for representative worker
//! pools (`tests/golden/*.json`, from the extension's worker code at the commit named in
//! `tests/golden/SOURCE.md`), decoded as the Go driver decodes them and validated: each pool is
//! either served (no problem, no ignored key) or refused with the fields it cannot serve yet,
//! never served as something else; and each served pool, created against the fake ARM, sends
//! exactly the NIC and VM bodies in `tests/golden/<pool>.requests.json`.

use mcm_fake_arm as fake_arm;

use std::time::Duration;

use fake_arm::FakeArm;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{CreateMachineRequest, Driver, IdempotencyKey, RequestId, SecretData};
use mcm_provider_azure::{AzureDriver, AzureDriverConfig, spec};
use mcm_testenv::kit::assert_golden;
use serde_json::{Value, json};

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
    // SSH access off: the chart renders `keyData: null`; the VM gets a key nobody holds.
    ("ssh-disabled", &[]),
    ("azure-china", &[]),
    ("azure-government", &[]),
    ("imageref-data-disks", &[]),
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

// ---------------------------------------------------------------------------------------------
// The ARM requests of each served pool, as the fake ARM received them.
// ---------------------------------------------------------------------------------------------

const SUB: &str = "00000000-0000-0000-0000-000000000000";
const TENANT: &str = "00000000-0000-0000-0000-00000000000b";
const CLIENT: &str = "00000000-0000-0000-0000-00000000000c";
const CLIENT_SECRET: &str = "s3cret";
/// The machine every golden request is for.
const MACHINE: &str = "shoot--dev--my-shoot-pool-z1-5b7c4-abcde";
/// The user data of the machine class Secret.
const USER_DATA: &str = "#cloud-config\nbootstrap: golden\n";

/// The `PUT`s creating `pool`'s machine sent (NIC, marketplace terms, disks made from images,
/// VM), each as `{"put": path without
/// the subscription, "api-version", "body"}`.
async fn creation_requests(pool: &str) -> Value {
    let c = class(pool);
    let spec = spec::parse_provider_spec(&c).expect("decodes");
    let fake = FakeArm::start(SUB, TENANT, CLIENT, CLIENT_SECRET).await;
    fake.add_subnet(
        spec.vnet_resource_group(),
        &spec.subnet_info.vnet_name,
        &spec.subnet_info.subnet_name,
    );
    // Gardener Linux's marketplace image has a plan, whose terms start unaccepted.
    if let Some(u) = spec
        .properties
        .storage_profile
        .image_reference
        .marketplace_urn()
    {
        let urn = format!("{}:{}:{}:{}", u.publisher, u.offer, u.sku, u.version);
        fake.add_vm_image(&spec.location, &urn, Some((&u.sku, &u.offer, &u.publisher)));
    }
    if spec.resource_group != spec.vnet_resource_group() {
        fake.add_resource_group(&spec.resource_group);
    }
    let driver = AzureDriver::new(AzureDriverConfig {
        arm_endpoint: Some(fake.url()),
        authority_host: Some(fake.url()),
        operation_timeout: Duration::from_secs(20),
        poll_interval: Duration::from_millis(20),
        max_poll_interval: Duration::from_millis(100),
        extra_ca_pem: Some(fake.ca_pem().to_string()),
        ..AzureDriverConfig::default()
    });
    let secret = SecretData::from_pairs([
        ("clientID", CLIENT),
        ("clientSecret", CLIENT_SECRET),
        ("tenantID", TENANT),
        ("subscriptionID", SUB),
        ("userData", USER_DATA),
    ]);
    driver
        .create_machine(CreateMachineRequest {
            machine: Machine::new(MACHINE, Default::default()),
            machine_class: c.clone(),
            secret,
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
        .await
        .unwrap_or_else(|e| panic!("{pool}: create: {e}"));
    let prefix = format!("/subscriptions/{SUB}");
    // A key made for a class without one is fresh each time (and the fake checked its form).
    let generated = |mut body: Value| {
        let path = "/properties/osProfile/linuxConfiguration/ssh/publicKeys/0/keyData";
        if let Some(key) = body
            .pointer_mut(path)
            .filter(|k| k.as_str().is_some_and(|k| k.starts_with("ssh-ed25519 ")))
        {
            *key = json!("<generated ssh-ed25519 key>");
        }
        // The terms are sent back as the GET gave them, with their time and signature.
        for field in ["retrieveDatetime", "signature"] {
            if let Some(v) = body.pointer_mut(&format!("/properties/{field}")) {
                *v = json!(format!("<{field} of the GET>"));
            }
        }
        body
    };
    let puts: Vec<Value> = fake
        .request_log()
        .into_iter()
        .filter(|r| r.method == "PUT" && !r.is_token_request())
        .map(|r| {
            json!({
                "put": r.path.strip_prefix(&prefix).unwrap_or(&r.path),
                "api-version": r.query_param("api-version"),
                "body": r.body.map(generated),
            })
        })
        .collect();
    Value::Array(puts)
}

#[tokio::test]
async fn each_served_pool_sends_exactly_its_arm_requests() {
    for (pool, refused) in POOLS {
        if !refused.is_empty() {
            continue;
        }
        let got = creation_requests(pool).await;
        let path = format!(
            "{}/tests/golden/{pool}.requests.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = serde_json::to_string_pretty(&got).expect("JSON") + "\n";
        assert_golden(
            std::path::Path::new(&path),
            &text,
            &format!("{pool}: ARM requests"),
        );
    }
}

/// The `cloudprovider` Secret of `file` as the driver reads it (its decoded example), with the
/// user data of the class's own Secret.
fn credentials_secret(file: &str) -> SecretData {
    let path = format!("{}/tests/golden/{file}.json", env!("CARGO_MANIFEST_DIR"));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("golden secret")).unwrap();
    let decoded = doc["credentialsSecret"]["exampleDecoded"]
        .as_object()
        .expect("exampleDecoded");
    let mut pairs: Vec<(&str, &str)> = decoded
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().expect("string")))
        .collect();
    pairs.push(("userData", USER_DATA));
    SecretData::from_pairs(pairs)
}

#[test]
fn the_client_secret_and_workload_identity_secrets_are_served() {
    let c = spec::credentials(&credentials_secret("secret"), true).expect("served");
    assert_eq!(c.subscription_id, "00000000-0000-0000-0000-000000000000");
    assert_eq!(c.tenant_id, "22222222-2222-2222-2222-222222222222");
    assert!(matches!(c.auth, spec::Auth::ClientSecret(_)));
    // Workload identity: the token file the extension's webhook mounts.
    let c =
        spec::credentials(&credentials_secret("secret-workload-identity"), true).expect("served");
    assert_eq!(c.client_id, "11111111-1111-1111-1111-111111111111");
    assert_eq!(
        c.auth,
        spec::Auth::WorkloadIdentity {
            token_file: "/var/run/secrets/gardener.cloud/workload-identity/token".into()
        }
    );
}
