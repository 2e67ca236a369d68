//! Golden classes: the providerSpecs gardener-extension-provider-gcp renders for representative
//! worker pools (`tests/golden/*.json`, written from the extension's chart and worker code at
//! the commit named in `tests/golden/SOURCE.md`), each decoded as the Go driver decodes it,
//! validated, and turned into the `instances.insert` body, asserted field by field.

use mcm_api::MachineClass;
use mcm_provider_gcp::{instance, spec};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const PROJECT: &str = "my-project";

fn class(pool: &str) -> MachineClass {
    let text = match pool {
        "basic" => include_str!("golden/basic.json"),
        "alias-ips" => include_str!("golden/alias-ips.json"),
        "gpu" => include_str!("golden/gpu.json"),
        "multi-disk" => include_str!("golden/multi-disk.json"),
        "workload-identity" => include_str!("golden/workload-identity.json"),
        other => panic!("no golden pool {other}"),
    };
    MachineClass {
        provider: Some("GCP".into()),
        provider_spec: serde_json::from_str(text).expect("golden JSON"),
        ..MachineClass::default()
    }
}

/// Decodes, validates and builds the insert body of `pool`: no problem, no ignored key.
fn body(pool: &str) -> Value {
    let class = class(pool);
    assert_eq!(spec::class_warnings(&class), Vec::<String>::new(), "{pool}");
    assert_eq!(spec::class_problems(&class), Vec::new(), "{pool}");
    let spec = spec::parse_provider_spec(&class).expect("decodes");
    instance::insert_body(&spec, PROJECT, "m-0", "#cloud-config\n")
}

#[test]
fn every_pool_is_valid_and_no_key_is_ignored() {
    for pool in [
        "basic",
        "alias-ips",
        "gpu",
        "multi-disk",
        "workload-identity",
    ] {
        body(pool);
    }
}

/// `disableExternalIP: true` (Gardener's spelling, on every class): no external IP.
#[test]
fn no_pool_gets_an_external_ip() {
    for pool in [
        "basic",
        "alias-ips",
        "gpu",
        "multi-disk",
        "workload-identity",
    ] {
        let b = body(pool);
        for nic in b["networkInterfaces"].as_array().expect("interfaces") {
            assert!(nic.get("accessConfigs").is_none(), "{pool}: {nic}");
        }
    }
}

#[test]
fn basic() {
    let b = body("basic");
    assert_eq!(
        b["networkInterfaces"],
        json!([{ "subnetwork": "regions/europe-west1/subnetworks/shoot--dev--my-shoot-nodes" }])
    );
    assert_eq!(b["canIpForward"], json!(true));
    assert_eq!(
        b["machineType"],
        json!("zones/europe-west1-b/machineTypes/n2-standard-4")
    );
    assert_eq!(
        b["scheduling"],
        json!({ "automaticRestart": true, "onHostMaintenance": "MIGRATE", "preemptible": false })
    );
    assert_eq!(
        b["tags"],
        json!({ "items": [
            "shoot--dev--my-shoot",
            "kubernetes-io-cluster-shoot--dev--my-shoot",
            "kubernetes-io-role-node",
        ] })
    );
    let items = b["metadata"]["items"].as_array().expect("metadata");
    assert!(items.contains(&json!({ "key": "block-project-ssh-keys", "value": "TRUE" })));
    assert!(items.contains(&json!({ "key": "user-data", "value": "#cloud-config\n" })));
    let disk = &b["disks"][0];
    assert_eq!(disk["boot"], json!(true));
    assert_eq!(disk["autoDelete"], json!(true));
    assert_eq!(disk["initializeParams"]["diskSizeGb"], json!("50"));
    assert_eq!(
        disk["initializeParams"]["diskType"],
        json!("zones/europe-west1-b/diskTypes/pd-balanced")
    );
}

/// Dual-stack pools: the alias range for pods, as the extension asks for it.
#[test]
fn alias_ips() {
    let b = body("alias-ips");
    assert_eq!(
        b["networkInterfaces"],
        json!([{
            "subnetwork": "regions/europe-west1/subnetworks/shoot--dev--my-shoot-nodes",
            "stackType": "IPV4_IPV6",
            "ipv6AccessType": "EXTERNAL",
            "aliasIpRanges": [{ "ipCidrRange": "/24", "subnetworkRangeName": "ipv4-pod-cidr" }],
        }])
    );
}

#[test]
fn gpu() {
    let b = body("gpu");
    assert_eq!(
        b["guestAccelerators"],
        json!([{
            "acceleratorType": "projects/my-project/zones/europe-west1-b/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 1,
        }])
    );
    assert_eq!(b["scheduling"]["onHostMaintenance"], json!("TERMINATE"));
}

#[test]
fn multi_disk() {
    let class = class("multi-disk");
    let disks = class.provider_spec["disks"]
        .as_array()
        .expect("disks")
        .len();
    let b = body("multi-disk");
    let sent = b["disks"].as_array().expect("disks");
    assert_eq!(sent.len(), disks);
    assert_eq!(sent.iter().filter(|d| d["boot"] == json!(true)).count(), 1);
}
