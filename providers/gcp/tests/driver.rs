//! The GCP driver through the official Compute client against the fake Compute API
//! (`mcm-fake-compute`, providers/gcp/fake, one server per test).

use mcm_fake_compute as fake_compute;

use std::time::Duration;

use fake_compute::{FakeCompute, Fault, service_account_json};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    Code, CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, Driver, DriverError,
    GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest, IdempotencyKey,
    ListMachinesRequest, RequestId, ResourceKind, ResourceState, SecretData,
};
use mcm_provider_gcp::{GcpDriver, GcpDriverConfig};
use serde_json::{Value, json};

const PROJECT: &str = "mcm-test-project";
const EMAIL: &str = "mcm@mcm-test-project.iam.gserviceaccount.com";
const ZONE: &str = "europe-west1-b";
const USER_DATA: &str = "#cloud-config\nbootstrap: token\n";
const CLUSTER_TAG: &str = "kubernetes-io-cluster-shoot--test";
const ROLE_TAG: &str = "kubernetes-io-role-node";

fn config(fake: &FakeCompute) -> GcpDriverConfig {
    GcpDriverConfig {
        endpoint: Some(fake.url()),
        poll_interval: Duration::from_millis(50),
        max_poll_interval: Duration::from_millis(200),
        operation_timeout: Duration::from_secs(20),
        max_attempts: 1,
        ..Default::default()
    }
}

fn driver(fake: &FakeCompute) -> GcpDriver {
    GcpDriver::new(config(fake))
}

fn spec() -> Value {
    json!({
        "machineType": "n1-standard-2",
        "region": "europe-west1",
        "zone": ZONE,
        "disks": [{"boot": true, "sizeGb": 20, "type": "pd-balanced",
                   "image": "projects/debian-cloud/global/images/family/debian-12"}],
        "networkInterfaces": [{"network": "shoot--test", "subnetwork": "shoot--test-nodes"}],
        "scheduling": {"automaticRestart": true, "onHostMaintenance": "MIGRATE"},
        "serviceAccounts": [{"email": "node@mcm-test-project.iam.gserviceaccount.com",
                             "scopes": ["https://www.googleapis.com/auth/compute"]}],
        "labels": {"name": "shoot--test"},
        "tags": [CLUSTER_TAG, ROLE_TAG, "shoot--test"],
    })
}

fn class(spec: Value) -> MachineClass {
    serde_json::from_value(json!({
        "metadata": { "name": "gcp" },
        "provider": "GCP",
        "providerSpec": spec,
    }))
    .unwrap()
}

fn secret_with(email: &str) -> SecretData {
    let key = service_account_json(PROJECT, email).to_string();
    SecretData::from_pairs([
        ("serviceAccountJSON", key.as_str()),
        ("userData", USER_DATA),
    ])
}

fn secret() -> SecretData {
    secret_with(EMAIL)
}

fn machine(name: &str, provider_id: Option<&str>) -> Machine {
    let mut m = Machine::new(name, Default::default());
    m.spec.provider_id = provider_id.map(String::from);
    m
}

async fn create_with(
    d: &GcpDriver,
    c: &MachineClass,
    name: &str,
    idempotency_key: IdempotencyKey,
) -> Result<CreateMachineResponse, DriverError> {
    d.create_machine(CreateMachineRequest {
        machine: machine(name, None),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
        idempotency_key,
    })
    .await
}

async fn create(
    d: &GcpDriver,
    c: &MachineClass,
    name: &str,
) -> Result<CreateMachineResponse, DriverError> {
    create_with(d, c, name, IdempotencyKey::random()).await
}

async fn status(
    d: &GcpDriver,
    c: &MachineClass,
    name: &str,
    provider_id: Option<&str>,
) -> Result<GetMachineStatusResponse, DriverError> {
    d.get_machine_status(GetMachineStatusRequest {
        machine: machine(name, provider_id),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
}

async fn delete(
    d: &GcpDriver,
    c: &MachineClass,
    name: &str,
    provider_id: Option<&str>,
) -> Result<(), DriverError> {
    d.delete_machine(DeleteMachineRequest {
        machine: machine(name, provider_id),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .map(drop)
}

async fn list(d: &GcpDriver, c: &MachineClass) -> std::collections::BTreeMap<String, String> {
    d.list_machines(ListMachinesRequest {
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap()
    .machines
}

fn provider_id(zone: &str, name: &str) -> String {
    format!("gce:///{PROJECT}/{zone}/{name}")
}

/// An instance of the cluster planted without the driver (e.g. an orphan).
fn plant(fake: &FakeCompute, zone: &str, name: &str, tags: &[&str]) {
    plant_labelled(fake, zone, name, tags, json!({}));
}

/// [`plant`] with instance labels.
fn plant_labelled(fake: &FakeCompute, zone: &str, name: &str, tags: &[&str], labels: Value) {
    fake.insert_instance_directly(
        zone,
        json!({
            "labels": labels,
            "name": name,
            "machineType": format!("zones/{zone}/machineTypes/n1-standard-2"),
            "disks": [{"boot": true, "autoDelete": true,
                       "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/shoot--test"}],
            "tags": {"items": tags},
        }),
    );
}

#[tokio::test]
async fn create_status_list_delete() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let c = class(spec());

    let created = create(&d, &c, "m-0").await.unwrap();
    assert_eq!(created.provider_id, provider_id(ZONE, "m-0"));
    assert_eq!(created.node_name, "m-0");
    assert!(
        created.addresses.iter().any(|a| a.type_ == "InternalIP"),
        "{:?}",
        created.addresses
    );
    // The create waited for its operation: the instance is RUNNING, with the body Gardener's
    // provider sends (user data first in the metadata, tags, labels, the subnetwork's URL).
    let i = fake.instance(ZONE, "m-0").unwrap();
    assert_eq!(i["status"], "RUNNING");
    assert_eq!(
        i["metadata"]["items"][0],
        json!({"key": "user-data", "value": USER_DATA})
    );
    assert_eq!(
        i["tags"]["items"],
        json!([CLUSTER_TAG, ROLE_TAG, "shoot--test"])
    );
    assert_eq!(i["labels"], json!({"name": "shoot--test"}));
    assert!(
        i["networkInterfaces"][0]["subnetwork"]
            .as_str()
            .unwrap()
            .ends_with("regions/europe-west1/subnetworks/shoot--test-nodes")
    );
    // Every request named the request id in its user agent; the insert carried a UUID requestId.
    let log = fake.request_log();
    let insert = log.iter().find(|r| r.method == "POST").unwrap();
    assert_eq!(insert.query_param("requestId").map(str::len), Some(36));
    assert!(log.iter().all(|r| {
        r.headers
            .get("user-agent")
            .is_some_and(|ua| ua.contains("mcm-request-id/"))
    }));

    let s = status(&d, &c, "m-0", Some(&created.provider_id))
        .await
        .unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    let vm = s
        .resources
        .iter()
        .find(|r| r.kind == ResourceKind::Vm)
        .unwrap();
    assert_eq!(
        (vm.state, vm.message.as_deref()),
        (ResourceState::Running, Some("RUNNING"))
    );
    assert!(
        s.resources.iter().any(|r| r.kind == ResourceKind::Disk),
        "{:?}",
        s.resources
    );

    assert_eq!(
        list(&d, &c).await.into_iter().collect::<Vec<_>>(),
        vec![(provider_id(ZONE, "m-0"), "m-0".to_string())]
    );

    delete(&d, &c, "m-0", Some(&created.provider_id))
        .await
        .unwrap();
    assert_eq!(
        fake.instance(ZONE, "m-0"),
        None,
        "delete waited for its operation"
    );
    assert!(
        fake.disks().is_empty(),
        "the boot disk went with the instance: {:?}",
        fake.disks()
    );
    let gone = status(&d, &c, "m-0", Some(&created.provider_id))
        .await
        .unwrap_err();
    assert_eq!(gone.code, Code::NotFound, "{gone}");
    // Deleting again is a success: nothing is left.
    delete(&d, &c, "m-0", Some(&created.provider_id))
        .await
        .unwrap();
    delete(&d, &c, "m-0", None).await.unwrap();
}

#[tokio::test]
async fn create_is_idempotent() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let c = class(spec());
    // A retry of the same creation attempt (also after a controller restart): the name is
    // taken, the instance is the cluster's, so it is the machine's VM. The attempt's key is
    // not the requestId (Compute would replay a failed insert's failure for it).
    let key = IdempotencyKey::for_creation("uid-1", "2026-11-26T18:00:00Z");
    let first = create_with(&d, &c, "m-1", key.clone()).await.unwrap();
    let again = create_with(&d, &c, "m-1", key.clone()).await.unwrap();
    assert_eq!(again.provider_id, first.provider_id);
    let inserts: Vec<_> = fake
        .request_log()
        .into_iter()
        .filter(|r| r.method == "POST")
        .filter_map(|r| r.query_param("requestId").map(String::from))
        .collect();
    assert_eq!(inserts.len(), 2, "{inserts:?}");
    assert!(!inserts.contains(&key.to_string()), "{inserts:?}");
    // A new attempt: the same.
    let after_crash = create(&d, &c, "m-1").await.unwrap();
    assert_eq!(after_crash.provider_id, first.provider_id);
    assert_eq!(fake.insert_count("m-1"), 1, "{:?}", fake.insert_counts());
    assert_eq!(fake.instances().len(), 1);

    // An instance of that name that is not the cluster's is not taken over.
    plant(
        &fake,
        ZONE,
        "m-2",
        &["kubernetes-io-cluster-other", ROLE_TAG],
    );
    let e = create(&d, &c, "m-2").await.unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists, "{e}");
    assert!(e.message.contains("not this cluster's"), "{e}");
}

#[tokio::test]
async fn capacity_and_quota_failures_are_resource_exhausted_and_leave_nothing() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let c = class(spec());
    for (fault, expected) in [
        (Fault::ZoneExhausted, "ZONE_RESOURCE_POOL_EXHAUSTED"),
        (Fault::Quota, "QUOTA_EXCEEDED"),
        (Fault::QuotaRejected, "quotaExceeded"),
    ] {
        fake.fail_next_inserts(1, fault.clone());
        let e = create(&d, &c, "m-q").await.unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted, "{fault:?}: {e}");
        assert!(e.message.contains(expected), "{fault:?}: {e}");
        assert!(e.message.contains("request id"), "{e}");
        if !fault.is_synchronous() {
            assert!(
                e.message.contains("operation operation-"),
                "names the operation: {e}"
            );
        }
        assert!(e.source.is_some(), "the GCE error stays the source");
        assert_eq!(
            fake.instance(ZONE, "m-q"),
            None,
            "{fault:?} left no instance"
        );
    }
    // Capacity is back: the same machine is created.
    create(&d, &c, "m-q").await.unwrap();
}

#[tokio::test]
async fn throttling_is_unavailable_with_the_retry_after_gce_gives() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let c = class(spec());
    fake.fail_next_inserts(
        1,
        Fault::RateLimited {
            retry_after_secs: 7,
        },
    );
    let e = create(&d, &c, "m-t").await.unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)), "{e}");
    assert_eq!(fake.instance(ZONE, "m-t"), None);

    // Compute's per-project rate limit comes as a 403: still throttling, not a permission.
    fake.fail_next_inserts(
        1,
        Fault::RateLimitedForbidden {
            retry_after_secs: 4,
        },
    );
    let e = create(&d, &c, "m-t").await.unwrap_err();
    assert_eq!(
        (e.code, e.retry_after),
        (Code::Unavailable, Some(Duration::from_secs(4))),
        "{e}"
    );
    assert_eq!(fake.instance(ZONE, "m-t"), None);

    fake.fail_next_inserts(1, Fault::Unavailable);
    let e = create(&d, &c, "m-t").await.unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    assert!(e.retry_after.is_some());

    // Any call may be throttled: a status read too.
    create(&d, &c, "m-t").await.unwrap();
    fake.throttle_next_with(1, 3);
    let e = status(&d, &c, "m-t", None).await.unwrap_err();
    assert_eq!(
        (e.code, e.retry_after),
        (Code::Unavailable, Some(Duration::from_secs(3))),
        "{e}"
    );
}

#[tokio::test]
async fn a_bad_class_is_refused_with_every_problem_before_any_call() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let mut bad = spec();
    bad["zone"] = json!("");
    bad["disks"][0]["image"] = json!("");
    bad["tags"] = json!(["shoot--test"]);
    let e = create(&d, &class(bad), "m-0").await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    for field in [
        "providerSpec.zone",
        "providerSpec.disks[0].image",
        "providerSpec.tags",
    ] {
        assert!(e.message.contains(field), "{field} in {e}");
    }
    let e = create(&d, &class(spec()), "Bad_Name").await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    let no_user_data = SecretData::from_pairs([(
        "serviceAccountJSON",
        service_account_json(PROJECT, EMAIL).to_string().as_str(),
    )]);
    let e = d
        .create_machine(CreateMachineRequest {
            machine: machine("m-0", None),
            machine_class: class(spec()),
            secret: no_user_data,
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
        .await
        .unwrap_err();
    assert!(e.message.contains("secretRef.userData"), "{e}");
    assert!(
        fake.request_log().is_empty(),
        "nothing was sent: {:?}",
        fake.request_log()
    );
}

#[tokio::test]
async fn wrong_credentials_are_unauthenticated() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let e = d
        .get_machine_status(GetMachineStatusRequest {
            machine: machine("m-0", None),
            machine_class: class(spec()),
            secret: secret_with("someone@else.iam.gserviceaccount.com"),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
}

#[tokio::test]
async fn listing_asks_compute_for_the_clusters_label_only() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let mut labelled = spec();
    labelled["labels"]["k8s-cluster-name"] = json!("shoot--test");
    for i in 0..3 {
        plant_labelled(
            &fake,
            ZONE,
            &format!("ours-{i}"),
            &[CLUSTER_TAG, ROLE_TAG],
            json!({"k8s-cluster-name": "shoot--test"}),
        );
    }
    for i in 0..5 {
        plant_labelled(
            &fake,
            ZONE,
            &format!("theirs-{i}"),
            &["kubernetes-io-cluster-shoot--other", ROLE_TAG],
            json!({"k8s-cluster-name": "shoot--other"}),
        );
    }
    let ours: Vec<String> = (0..3).map(|i| format!("ours-{i}")).collect();
    let names = |m: std::collections::BTreeMap<String, String>| m.into_values().collect::<Vec<_>>();

    // A Gardener class carries the label: Compute sends this cluster's instances only.
    fake.clear_request_log();
    let before = fake.instances_listed();
    assert_eq!(names(list(&d, &class(labelled)).await), ours);
    assert_eq!(fake.instances_listed() - before, 3, "instances read");
    let filters: Vec<Option<String>> = fake
        .request_log()
        .iter()
        .filter(|r| r.path.contains("/aggregated/"))
        .map(|r| r.query_param("filter").map(String::from))
        .collect();
    assert_eq!(
        filters,
        vec![Some(
            r#"labels.k8s-cluster-name = "shoot--test""#.to_string()
        )]
    );

    // A class without it: every instance of the project is read, the tags pick ours.
    let before = fake.instances_listed();
    assert_eq!(names(list(&d, &class(spec())).await), ours);
    assert_eq!(fake.instances_listed() - before, 8, "instances read");
}

#[tokio::test]
async fn list_pages_through_the_regions_zones_and_keeps_the_clusters_instances() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = GcpDriver::new(GcpDriverConfig {
        page_size: 2,
        ..config(&fake)
    });
    let c = class(spec());
    for i in 0..3 {
        plant(&fake, ZONE, &format!("b-{i}"), &[CLUSTER_TAG, ROLE_TAG]);
        plant(
            &fake,
            "europe-west1-c",
            &format!("c-{i}"),
            &[CLUSTER_TAG, ROLE_TAG],
        );
    }
    plant(&fake, "europe-west1-d", "stopped", &[CLUSTER_TAG, ROLE_TAG]);
    assert!(fake.set_instance_status("europe-west1-d", "stopped", "TERMINATED"));
    plant(
        &fake,
        "us-central1-a",
        "other-region",
        &[CLUSTER_TAG, ROLE_TAG],
    );
    plant(
        &fake,
        ZONE,
        "other-cluster",
        &["kubernetes-io-cluster-other", ROLE_TAG],
    );
    plant(
        &fake,
        ZONE,
        "other-role",
        &[CLUSTER_TAG, "kubernetes-io-role-bastion"],
    );
    fake.clear_request_log();

    let got = list(&d, &c).await;
    let mut want: Vec<(String, String)> = (0..3)
        .flat_map(|i| {
            [
                (provider_id(ZONE, &format!("b-{i}")), format!("b-{i}")),
                (
                    provider_id("europe-west1-c", &format!("c-{i}")),
                    format!("c-{i}"),
                ),
            ]
        })
        .collect();
    want.push((provider_id("europe-west1-d", "stopped"), "stopped".into()));
    want.sort();
    assert_eq!(got.into_iter().collect::<Vec<_>>(), want);
    let pages = fake
        .request_log()
        .iter()
        .filter(|r| r.path.ends_with("/aggregated/instances"))
        .count();
    assert!(pages >= 5, "10 instances at 2 per page: {pages} pages");

    // A stopped VM is listed and its status says so.
    let s = status(
        &d,
        &c,
        "stopped",
        Some(&provider_id("europe-west1-d", "stopped")),
    )
    .await
    .unwrap();
    assert_eq!(s.resources[0].state, ResourceState::Stopped);
}

#[tokio::test]
async fn another_clusters_instance_is_never_read_as_ours_nor_deleted() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let c = class(spec());
    plant(
        &fake,
        ZONE,
        "foreign",
        &["kubernetes-io-cluster-other", ROLE_TAG],
    );
    let e = status(&d, &c, "foreign", None).await.unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
    let e = delete(&d, &c, "foreign", None).await.unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
    assert!(fake.instance(ZONE, "foreign").is_some(), "not deleted");
    assert!(!fake.request_log().iter().any(|r| r.method == "DELETE"));
}

#[tokio::test]
async fn operations_that_outlive_the_wait_are_unavailable_and_the_retry_finds_the_vm() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = GcpDriver::new(GcpDriverConfig {
        operation_timeout: Duration::from_millis(300),
        ..config(&fake)
    });
    let c = class(spec());
    fake.pause_operations();
    let e = create(&d, &c, "m-slow").await.unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    assert!(e.message.contains("did not finish within"), "{e}");
    fake.resume_operations();
    let created = create(&d, &c, "m-slow").await.unwrap();
    assert_eq!(created.provider_id, provider_id(ZONE, "m-slow"));
    assert_eq!(fake.insert_count("m-slow"), 1);
    // Taken over while its insert may still run: the status says it is being created until
    // the operation is done.
    assert!(
        fake.wait_for(Duration::from_secs(10), |f| f
            .instance(ZONE, "m-slow")
            .is_some_and(|i| i["status"] == "RUNNING"))
            .await
    );

    // A delete whose operation is still running is retried; the retry sees GCE's
    // resourceNotReady as Unavailable, and a later one finds the VM gone.
    fake.pause_operations();
    let e = delete(&d, &c, "m-slow", Some(&created.provider_id))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    let e = delete(&d, &c, "m-slow", Some(&created.provider_id))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    fake.resume_operations();
    assert!(
        fake.wait_for(Duration::from_secs(10), |f| f
            .instance(ZONE, "m-slow")
            .is_none())
            .await
    );
    delete(&d, &c, "m-slow", Some(&created.provider_id))
        .await
        .unwrap();
}

#[tokio::test]
async fn initialize_is_unimplemented_as_in_gardeners_provider() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let e = driver(&fake)
        .initialize_machine(mcm_driver::InitializeMachineRequest {
            machine: machine("m-0", None),
            machine_class: class(spec()),
            secret: secret(),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unimplemented);
    assert!(fake.request_log().is_empty());
}

#[tokio::test]
async fn volume_ids_of_gce_disks() {
    let fake = FakeCompute::start(PROJECT, EMAIL).await;
    let d = driver(&fake);
    let pvs: Vec<k8s_openapi::api::core::v1::PersistentVolumeSpec> = serde_json::from_value(json!([
        {"gcePersistentDisk": {"pdName": "disk-a"}},
        {"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/z/disks/disk-b"}},
        {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}},
        {"hostPath": {"path": "/tmp"}}
    ]))
    .unwrap();
    let ids = d
        .get_volume_ids(GetVolumeIdsRequest {
            pv_specs: pvs,
            request_id: RequestId::generate(),
        })
        .await
        .unwrap()
        .volume_ids;
    assert_eq!(ids, vec!["disk-a", "projects/p/zones/z/disks/disk-b"]);
}
