//! Golden classes: the providerSpecs the Gardener extension renders for representative worker
//! pools (`tests/golden/*.json`, from the extension's worker code at the commit named in
//! `tests/golden/SOURCE.md`), decoded as the Go driver decodes them and validated: each pool is
//! either served (no problem, no ignored key) or refused with the fields it cannot serve yet,
//! never served as something else.

use std::sync::{Arc, Mutex};

use aws_config::BehaviorVersion;
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_ec2::config::{ConfigBag, Credentials, Intercept, Region, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;
use mcm_api::MachineClass;
use mcm_provider_aws::{launch, spec};
use mcm_testenv::kit::assert_golden;

fn class(pool: &str) -> MachineClass {
    let path = format!("{}/tests/golden/{pool}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("golden file");
    MachineClass {
        provider: Some("AWS".into()),
        provider_spec: serde_json::from_str(&text).expect("golden JSON"),
        ..MachineClass::default()
    }
}

/// (pool, the fields refused; empty: served).
const POOLS: &[(&str, &[&str])] = &[
    ("ipv4", &[]),
    ("dual-stack", &[]),
    ("multi-nic", &[]),
    ("efa", &[]),
    ("workload-identity", &[]),
    ("cpu-options-amd-sev-snp", &[]),
    ("spot", &[]),
    ("capacity-block", &[]),
    // Gardener's provider refuses a preference together with a reservation id, and so do we
    // (EC2 takes one or the other); the extension renders `capacity-reservations-only` with
    // the id (see SOURCE.md).
    (
        "capacity-reservation",
        &["providerSpec.capacityReservation"],
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

// ---------------------------------------------------------------------------------------------
// The RunInstances request of each served pool, as the SDK puts it on the wire.
// ---------------------------------------------------------------------------------------------

/// The machine every golden request is for.
const MACHINE: &str = "shoot--dev--my-shoot-pool-z1-5b7c4-abcde";
/// The root device name of the Garden Linux AMI (what `DescribeImages` answers).
const ROOT_DEVICE: &str = "/dev/xvda";
/// The user data of the machine class Secret.
const USER_DATA: &[u8] = b"#!/bin/bash\necho golden\n";
/// The client token of the creation attempt (what `launch::client_token` makes of the
/// attempt's idempotency key; a fixed value here).
const CLIENT_TOKEN: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

/// Keeps the serialized body of the first request and stops it before it is signed or sent.
#[derive(Debug, Clone, Default)]
struct CaptureBody(Arc<Mutex<Option<String>>>);

/// The error [`CaptureBody`] stops every request with.
#[derive(Debug, thiserror::Error)]
#[error("request captured, not sent")]
struct Captured;

impl Intercept for CaptureBody {
    fn name(&self) -> &'static str {
        "CaptureBody"
    }

    fn read_after_serialization(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let body = context.request().body().bytes().unwrap_or_default();
        *self.0.lock().unwrap() = Some(String::from_utf8_lossy(body).into_owned());
        Err(Box::new(Captured))
    }
}

/// Decodes one `application/x-www-form-urlencoded` component.
fn form_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ascii");
                out.push(u8::from_str_radix(hex, 16).expect("percent escape"));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).expect("UTF-8 parameter")
}

/// The `RunInstances` parameters of `pool`, one `Name=value` per line, sorted by name.
async fn run_instances_parameters(pool: &str) -> String {
    let c = class(pool);
    let spec = spec::parse_provider_spec(&c).expect("decodes");
    parameters_of(&spec, None).await
}

/// The `RunInstances` parameters of `spec` for a Machine with `placement_annotation`.
async fn parameters_of(spec: &spec::ProviderSpec, placement_annotation: Option<&str>) -> String {
    let capture = CaptureBody::default();
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(spec.region.clone()))
        .credentials_provider(Credentials::new(
            "AKIDGOLDEN",
            "golden",
            None,
            None,
            "golden",
        ))
        .interceptor(capture.clone())
        .build();
    let client = aws_sdk_ec2::Client::from_conf(conf);
    let request = launch::run_instances_request(
        client.run_instances(),
        spec,
        MACHINE,
        placement_annotation,
        USER_DATA,
        Some(ROOT_DEVICE),
        CLIENT_TOKEN,
    )
    .expect("request");
    let err = request
        .send()
        .await
        .expect_err("the capture stops the request");
    assert!(
        format!("{:?}", err).contains("Captured"),
        "stopped by something else: {err:?}"
    );
    let body = capture.0.lock().unwrap().take().expect("body captured");
    let mut params: Vec<(String, String)> = body
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_decode(k), form_decode(v))
        })
        .collect();
    params.sort_by_key(|p| natural_key(&p.0));
    params
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

/// Orders `Tag.10` after `Tag.9`.
fn natural_key(name: &str) -> Vec<(String, u32)> {
    name.split('.')
        .map(|part| match part.parse::<u32>() {
            Ok(n) => (String::new(), n),
            Err(_) => (part.to_string(), 0),
        })
        .collect()
}

#[tokio::test]
async fn each_served_pool_becomes_exactly_its_run_instances_request() {
    for (pool, refused) in POOLS {
        if !refused.is_empty() {
            continue;
        }
        let got = run_instances_parameters(pool).await;
        let path = format!(
            "{}/tests/golden/{pool}.run-instances.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        assert_golden(
            std::path::Path::new(&path),
            &got,
            &format!("{pool}: RunInstances parameters"),
        );
    }
}

/// The `cloudprovider` Secret of `file` as the driver reads it (its decoded example), with the
/// user data of the class's own Secret.
fn credentials(file: &str) -> mcm_driver::SecretData {
    let path = format!("{}/tests/golden/{file}.json", env!("CARGO_MANIFEST_DIR"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("golden secret")).unwrap();
    let decoded = doc["credentialsSecret"]["exampleDecoded"]
        .as_object()
        .expect("exampleDecoded");
    let mut pairs: Vec<(&str, &str)> = decoded
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().expect("string")))
        .collect();
    pairs.push(("userData", "#!/bin/bash\n"));
    mcm_driver::SecretData::from_pairs(pairs)
}

#[test]
fn the_static_key_and_the_workload_identity_secrets_are_served() {
    let fields = |file: &str| -> Vec<(String, String)> {
        spec::validate_secret(&credentials(file), true)
            .into_iter()
            .map(|p| (p.field, p.detail))
            .collect()
    };
    assert_eq!(fields("secret"), Vec::<(String, String)>::new());
    match spec::auth(&credentials("secret")) {
        Some(spec::Auth::AccessKey(key)) => assert_eq!(key.id, "AKIAIOSFODNN7EXAMPLE"),
        other => panic!("an access key, not {other:?}"),
    }
    // Workload identity: the role and the token file the extension writes.
    assert_eq!(
        fields("secret-workload-identity"),
        Vec::<(String, String)>::new()
    );
    match spec::auth(&credentials("secret-workload-identity")) {
        Some(spec::Auth::WebIdentity {
            role_arn,
            token_file,
        }) => {
            assert_eq!(role_arn, "arn:aws:iam::123456789012:role/gardener-shoot");
            assert_eq!(
                token_file,
                std::path::PathBuf::from("/var/run/secrets/gardener.cloud/workload-identity/token")
            );
        }
        other => panic!("workload identity, not {other:?}"),
    }
}

/// A Machine's placement annotation with every field EC2's `Placement` has.
const PLACEMENT_ANNOTATION: &str = r#"{"AvailabilityZone": "eu-west-1b", "Affinity": "default", "GroupName": "g", "PartitionNumber": 2, "HostId": "h-2", "Tenancy": "host", "SpreadDomain": "s", "HostResourceGroupArn": "arn:aws:resource-groups:eu-west-1:123456789012:group/h", "GroupId": "pg-2"}"#;

/// Specs that set every field the driver sends (`tests/wire/*.json`), and their
/// `RunInstances` parameters as the AWS SDK for Rust serialized them
/// (`tests/wire/*.run-instances.txt`): the wire format the driver's own encoding must keep.
const WIRE_SPECS: &[(&str, Option<&str>)] = &[
    ("every-field", None),
    ("preference", Some(PLACEMENT_ANNOTATION)),
    ("reservation-id", None),
];

#[tokio::test]
async fn every_field_the_driver_sends_has_its_wire_name() {
    for (name, annotation) in WIRE_SPECS {
        let dir = format!("{}/tests/wire", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(format!("{dir}/{name}.json")).expect("wire spec");
        let spec: spec::ProviderSpec = serde_json::from_str(&text).expect("wire spec JSON");
        let got = parameters_of(&spec, *annotation).await;
        assert_golden(
            std::path::Path::new(&format!("{dir}/{name}.run-instances.txt")),
            &got,
            &format!("{name}: RunInstances parameters"),
        );
    }
}
