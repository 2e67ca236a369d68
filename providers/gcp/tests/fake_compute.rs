//! Drives the fake Compute Engine API (`mcm-fake-compute`, providers/gcp/fake) with the official client: the
//! wire format, asynchronous operations, `requestId` replays, pagination, filters, faults and
//! authentication, and how the client surfaces each error.

use mcm_fake_compute as fake_compute;

use std::time::Duration;

use fake_compute::{FakeCompute, Fault, service_account_json, test_bearer_token};
use google_cloud_compute_v1::client::Instances;
use google_cloud_compute_v1::model::instances_scoped_list::warning::Code as WarningCode;
use google_cloud_compute_v1::model::{
    AccessConfig, AttachedDisk, AttachedDiskInitializeParams, Instance, Metadata, NetworkInterface,
    Operation, Tags, access_config, instance, metadata, operation,
};
use google_cloud_gax::error::Error;
use google_cloud_gax::error::rpc::{Code, StatusDetails};
use google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder;
use google_cloud_gax::paginator::ItemPaginator as _;
use google_cloud_gax::retry_policy::NeverRetry;
use serde_json::{Value, json};

const PROJECT: &str = "mcm-fake-project";
const SA: &str = "mcm-driver@mcm-fake-project.iam.gserviceaccount.com";
const ZONE: &str = "europe-west1-b";
const ZONE2: &str = "us-central1-a";
const DEADLINE: Duration = Duration::from_secs(10);
const BASE: &str = "https://www.googleapis.com/compute/v1";

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The client as the driver builds it; `retry: false` adds `NeverRetry` to see single errors.
/// Backoffs are shortened so that retries do not slow the tests down.
async fn client_as(fake: &FakeCompute, email: &str, retry: bool) -> Instances {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let creds = google_cloud_auth::credentials::service_account::Builder::new(
        service_account_json(PROJECT, email),
    )
    .build()
    .expect("service-account credentials");
    let fast = || {
        ExponentialBackoffBuilder::new()
            .with_initial_delay(Duration::from_millis(10))
            .with_maximum_delay(Duration::from_millis(50))
            .build()
            .expect("backoff")
    };
    let builder = Instances::builder()
        .with_endpoint(fake.url())
        .with_credentials(creds)
        .with_backoff_policy(fast())
        .with_polling_backoff_policy(fast());
    let builder = if retry {
        builder
    } else {
        builder.with_retry_policy(NeverRetry)
    };
    builder.build().await.expect("Instances client")
}

async fn client(fake: &FakeCompute) -> Instances {
    client_as(fake, SA, false).await
}

fn uuid(n: u64) -> String {
    format!("6a1f0000-0000-4000-8000-{n:012x}")
}

/// An instance as the driver would send it.
fn vm(name: &str, zone: &str, pool: &str) -> Instance {
    Instance::new()
        .set_name(name)
        .set_machine_type(format!("zones/{zone}/machineTypes/n1-standard-2"))
        .set_labels([
            ("mcm-pool", pool),
            ("kubernetes-io-cluster-shoot--dev--a", "1"),
        ])
        .set_tags(Tags::new().set_items(["shoot--dev--a", "kubernetes-io-role-node"]))
        .set_metadata(
            Metadata::new().set_items([metadata::Items::new()
                .set_key("user-data")
                .set_value("#cloud-config\n")]),
        )
        .set_disks([AttachedDisk::new()
            .set_boot(true)
            .set_auto_delete(true)
            .set_initialize_params(
                AttachedDiskInitializeParams::new()
                    .set_source_image("projects/debian-cloud/global/images/family/debian-12")
                    .set_disk_size_gb(50),
            )])
        .set_network_interfaces([NetworkInterface::new()
            .set_network("global/networks/default")
            .set_access_configs([AccessConfig::new()
                .set_name("External NAT")
                .set_type(access_config::Type::OneToOneNat)])])
}

/// A planted instance (JSON as the API takes it).
fn planted(name: &str, pool: Option<&str>) -> Value {
    let mut v = json!({
        "name": name,
        "machineType": "zones/z/machineTypes/e2-small",
        "networkInterfaces": [{}],
        "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"sourceImage": "img"}}],
    });
    if let Some(pool) = pool {
        v["labels"] = json!({"mcm-pool": pool});
    }
    v
}

/// The GCE reason: the first `ErrorInfo` detail (built from `errors[0]` for GCE's own errors).
fn reason(err: &Error) -> Option<String> {
    err.status()?.details.iter().find_map(|d| match d {
        StatusDetails::ErrorInfo(info) => Some(info.reason.clone()),
        _ => None,
    })
}

fn retry_after(err: &Error) -> Option<u64> {
    err.http_headers()?
        .get("retry-after")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Polls the operation with `get_operation` until `DONE` (bounded by [`DEADLINE`]).
async fn wait_done(client: &Instances, zone: &str, op: &Operation) -> Operation {
    let name = op.name.clone().expect("operation name");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let op = client
            .get_operation()
            .set_project(PROJECT)
            .set_zone(zone)
            .set_operation(&name)
            .send()
            .await
            .expect("get operation");
        if op.status == Some(operation::Status::Done) {
            return op;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "operation {name} not DONE in time: {op:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get(client: &Instances, zone: &str, name: &str) -> Result<Instance, Error> {
    client
        .get()
        .set_project(PROJECT)
        .set_zone(zone)
        .set_instance(name)
        .send()
        .await
}

async fn list_names(client: &Instances, filter: &str) -> Result<Vec<String>, Error> {
    let list = client
        .list()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_filter(filter)
        .send()
        .await?;
    Ok(list.items.into_iter().filter_map(|i| i.name).collect())
}

/// A raw HTTP/1.1 request (for what the client cannot send): status and JSON body.
async fn raw(fake: &FakeCompute, method: &str, path: &str, auth: Option<&str>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = fake.url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&host)
        .await
        .expect("connect");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    if let Some(auth) = auth {
        request.push_str(&format!("Authorization: {auth}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut response))
        .await
        .expect("response in time")
        .expect("read response");
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn insert_reaches_running_through_its_operation() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    fake.pause_operations();
    let op = client
        .insert()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_request_id(uuid(1))
        .set_body(vm("m-0", ZONE, "a"))
        .send()
        .await?;
    let instance_url = format!("{BASE}/projects/{PROJECT}/zones/{ZONE}/instances/m-0");
    assert_eq!(op.kind.as_deref(), Some("compute#operation"));
    assert_eq!(op.status, Some(operation::Status::Pending));
    assert_eq!(op.operation_type.as_deref(), Some("insert"));
    assert!(
        op.name
            .as_deref()
            .is_some_and(|n| n.starts_with("operation-"))
    );
    assert!(op.id.is_some());
    assert_eq!(
        op.zone.as_deref(),
        Some(format!("{BASE}/projects/{PROJECT}/zones/{ZONE}").as_str())
    );
    assert_eq!(op.target_link.as_deref(), Some(instance_url.as_str()));
    assert_eq!(op.client_operation_id, Some(uuid(1)));
    assert_eq!(op.user.as_deref(), Some(SA));

    // The instance exists at once, still provisioning while the operation runs.
    let provisioning = get(&client, ZONE, "m-0").await?;
    assert_eq!(provisioning.status, Some(instance::Status::Provisioning));
    assert_eq!(provisioning.id, op.target_id);

    fake.resume_operations();
    let done = wait_done(&client, ZONE, &op).await;
    assert!(done.error.is_none(), "{done:?}");
    assert_eq!(done.progress, Some(100));
    assert!(done.end_time.is_some() && done.insert_time.is_some());

    let running = get(&client, ZONE, "m-0").await?;
    assert_eq!(running.status, Some(instance::Status::Running));
    assert_eq!(running.self_link.as_deref(), Some(instance_url.as_str()));
    assert_eq!(
        running.machine_type.as_deref(),
        Some(format!("{BASE}/projects/{PROJECT}/zones/{ZONE}/machineTypes/n1-standard-2").as_str())
    );
    let nic = &running.network_interfaces[0];
    assert_eq!(nic.name.as_deref(), Some("nic0"));
    assert!(
        nic.network_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10."))
    );
    assert!(nic.access_configs[0].nat_ip.is_some());
    let disk = &running.disks[0];
    assert_eq!(disk.boot, Some(true));
    assert_eq!(disk.auto_delete, Some(true));
    assert_eq!(disk.device_name.as_deref(), Some("persistent-disk-0"));
    assert_eq!(
        disk.source.as_deref(),
        Some(format!("{BASE}/projects/{PROJECT}/zones/{ZONE}/disks/m-0").as_str())
    );
    assert!(
        running
            .metadata
            .as_ref()
            .is_some_and(|m| m.fingerprint.is_some())
    );
    assert_eq!(
        running.labels.get("mcm-pool").map(String::as_str),
        Some("a")
    );
    assert!(running.creation_timestamp.is_some());
    assert_eq!(fake.disks().len(), 1);

    // A second instance gets another address.
    let op = client
        .insert()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_body(vm_named("m-1"))
        .send()
        .await?;
    wait_done(&client, ZONE, &op).await;
    let other = get(&client, ZONE, "m-1").await?;
    assert_ne!(
        other.network_interfaces[0].network_ip, nic.network_ip,
        "network IPs are unique"
    );

    // What went over the wire.
    let log = fake.request_log();
    let insert = log
        .iter()
        .find(|r| r.method == "POST")
        .expect("insert request");
    assert_eq!(
        insert.path,
        format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances")
    );
    assert_eq!(insert.query_param("requestId"), Some(uuid(1).as_str()));
    assert_eq!(insert.query_param("$alt"), Some("json"));
    assert_eq!(insert.principal.as_deref(), Some(SA));
    assert_eq!(
        insert.body.as_ref().map(|b| &b["name"]),
        Some(&json!("m-0"))
    );
    Ok(())
}

fn vm_named(name: &str) -> Instance {
    vm(name, ZONE, "a")
}

#[tokio::test]
async fn a_gardener_shaped_body_is_accepted() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    let body: Instance = serde_json::from_value(json!({
        "name": "shoot--dev--a-worker-z1-abcde",
        "machineType": format!("zones/{ZONE}/machineTypes/n2-standard-4"),
        "canIpForward": true,
        "deletionProtection": false,
        "labels": {"name": "shoot--dev--a", "k8s-cluster-name": "shoot--dev--a"},
        "tags": {"items": ["kubernetes-io-cluster-shoot--dev--a", "kubernetes-io-role-node"]},
        "scheduling": {
            "automaticRestart": true,
            "onHostMaintenance": "MIGRATE",
            "preemptible": false,
        },
        "shieldedInstanceConfig": {"enableSecureBoot": true},
        "disks": [
            {"autoDelete": true, "type": "PERSISTENT", "boot": true, "initializeParams": {
                "diskSizeGb": "50",
                "diskType": format!("zones/{ZONE}/diskTypes/pd-balanced"),
                "sourceImage": "projects/gardenlinux/global/images/gardenlinux-1592",
                "labels": {"name": "shoot--dev--a"},
            }},
            {"autoDelete": true, "type": "SCRATCH", "boot": false, "interface": "NVME",
             "initializeParams": {"diskType": format!("zones/{ZONE}/diskTypes/local-ssd")}},
        ],
        "metadata": {"items": [{"key": "startup-script", "value": "#!/bin/bash"}]},
        "networkInterfaces": [{
            "network": format!("projects/{PROJECT}/global/networks/shoot--dev--a"),
            "subnetwork": format!("projects/{PROJECT}/regions/europe-west1/subnetworks/nodes"),
            "accessConfigs": [],
        }],
        "serviceAccounts": [{"email": SA, "scopes": ["https://www.googleapis.com/auth/compute"]}],
    }))?;
    let op = client
        .insert()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_request_id(uuid(42))
        .set_body(body)
        .send()
        .await?;
    assert!(wait_done(&client, ZONE, &op).await.error.is_none());
    let vm = get(&client, ZONE, "shoot--dev--a-worker-z1-abcde").await?;
    assert_eq!(vm.status, Some(instance::Status::Running));
    assert_eq!(vm.can_ip_forward, Some(true));
    let nic = &vm.network_interfaces[0];
    assert_eq!(
        nic.subnetwork.as_deref(),
        Some(format!("{BASE}/projects/{PROJECT}/regions/europe-west1/subnetworks/nodes").as_str())
    );
    assert!(
        nic.access_configs.is_empty(),
        "no external IP was asked for"
    );
    assert_eq!(vm.disks[1].source, None, "a local SSD is no disk resource");
    assert_eq!(vm.disks[1].device_name.as_deref(), Some("local-ssd-1"));
    assert_eq!(fake.disks().len(), 1);
    assert_eq!(fake.disks()[0]["sizeGb"], "50");
    Ok(())
}

#[tokio::test]
async fn request_id_replays_the_operation_and_names_conflict() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    let insert = |rid: String, body: Instance| {
        client
            .insert()
            .set_project(PROJECT)
            .set_zone(ZONE)
            .set_request_id(rid)
            .set_body(body)
            .send()
    };
    let first = insert(uuid(7), vm_named("m-1")).await?;
    let replay = insert(uuid(7), vm_named("m-1")).await?;
    assert_eq!(first.name, replay.name);
    assert_eq!(first.id, replay.id);
    assert_eq!(fake.insert_count("m-1"), 1);
    assert_eq!(fake.instances().len(), 1);
    wait_done(&client, ZONE, &first).await;
    // Replaying after completion returns the same, now finished, operation.
    let late = insert(uuid(7), vm_named("m-1")).await?;
    assert_eq!(late.name, first.name);
    assert_eq!(late.status, Some(operation::Status::Done));

    // The same name with another requestId: 409 alreadyExists, a GCE error without `status`.
    let err = insert(uuid(8), vm_named("m-1")).await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(409));
    assert_eq!(reason(&err).as_deref(), Some("alreadyExists"));
    let status = err.status().expect("service error");
    assert_eq!(status.code, Code::Unknown);
    // A JSON error body becomes a service error: `http_payload()` is only kept for bodies that
    // are not Google errors, so the reason must be read from `status().details`.
    assert!(err.http_payload().is_none());
    assert_eq!(
        status.message,
        format!("The resource 'projects/{PROJECT}/zones/{ZONE}/instances/m-1' already exists")
    );
    assert_eq!(fake.insert_count("m-1"), 1);

    // Validation.
    let bad_name = insert(uuid(9), vm_named("Bad_Name")).await.unwrap_err();
    assert_eq!(bad_name.http_status_code(), Some(400));
    assert_eq!(reason(&bad_name).as_deref(), Some("invalid"));
    let bad_label = vm_named("m-2").set_labels([("Env", "prod")]);
    let err = insert(uuid(10), bad_label).await.unwrap_err();
    assert_eq!(
        (err.http_status_code(), reason(&err).as_deref()),
        (Some(400), Some("invalid"))
    );
    let no_boot = vm_named("m-2").set_disks([AttachedDisk::new()
        .set_initialize_params(AttachedDiskInitializeParams::new().set_disk_size_gb(10))]);
    let err = insert(uuid(11), no_boot).await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(400));
    let no_type = vm_named("m-2").set_or_clear_machine_type(None::<String>);
    let err = insert(uuid(12), no_type).await.unwrap_err();
    assert_eq!(
        (err.http_status_code(), reason(&err).as_deref()),
        (Some(400), Some("required"))
    );
    let other_zone = vm("m-2", ZONE2, "a");
    let err = insert(uuid(13), other_zone).await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(400));
    let err = insert("not-a-uuid".into(), vm_named("m-2"))
        .await
        .unwrap_err();
    assert_eq!(err.http_status_code(), Some(400));
    assert_eq!(fake.instances().len(), 1);
    Ok(())
}

#[tokio::test]
async fn list_filters_and_paginates() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    for name in ["m-3", "m-0", "m-4", "m-2", "m-1"] {
        fake.insert_instance_directly(ZONE, planted(name, Some("a")));
    }
    fake.insert_instance_directly(ZONE, planted("n-0", Some("b")));
    fake.insert_instance_directly(ZONE, planted("n-1", Some("b")));
    fake.insert_instance_directly(ZONE, planted("orphan", None));
    assert!(fake.set_instance_status(ZONE, "n-1", "TERMINATED"));

    // Pages of two, in name order, with opaque page tokens.
    let mut pages = Vec::new();
    let mut token = None::<String>;
    loop {
        let page = client
            .list()
            .set_project(PROJECT)
            .set_zone(ZONE)
            .set_filter(r#"labels.mcm-pool = "a""#)
            .set_max_results(2_u32)
            .set_or_clear_page_token(token.clone())
            .send()
            .await?;
        pages.push(
            page.items
                .into_iter()
                .filter_map(|i| i.name)
                .collect::<Vec<_>>(),
        );
        token = page.next_page_token.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
        assert!(pages.len() < 10, "pagination does not end");
    }
    assert_eq!(
        pages,
        vec![vec!["m-0", "m-1"], vec!["m-2", "m-3"], vec!["m-4"]]
    );
    let requests = fake.request_log();
    assert_eq!(requests[1].query_param("maxResults"), Some("2"));
    assert!(requests[1].query_param("pageToken").is_some());

    // The client's item paginator follows the tokens too.
    let mut items = client
        .list()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_filter("labels.mcm-pool:*")
        .set_max_results(3_u32)
        .by_item();
    let mut names = Vec::new();
    while let Some(item) = items.next().await {
        names.extend(item?.name);
    }
    assert_eq!(names, ["m-0", "m-1", "m-2", "m-3", "m-4", "n-0", "n-1"]);

    assert_eq!(
        list_names(&client, r#"(labels.mcm-pool = "a") (name eq "m-[0-2]")"#).await?,
        ["m-0", "m-1", "m-2"]
    );
    assert_eq!(
        list_names(&client, r#"labels.mcm-pool = "b" AND status = RUNNING"#).await?,
        ["n-0"]
    );
    assert_eq!(
        list_names(&client, "status = TERMINATED OR name = orphan").await?,
        ["n-1", "orphan"]
    );
    assert_eq!(
        list_names(&client, "NOT labels.mcm-pool:*").await?,
        ["orphan"]
    );
    assert_eq!(
        list_names(&client, "name ne m-.*").await?,
        ["n-0", "n-1", "orphan"]
    );
    assert_eq!(
        list_names(&client, r#"name = "n-*""#).await?,
        ["n-0", "n-1"]
    );
    assert!(
        list_names(&client, r#"labels.mcm-pool = "c""#)
            .await?
            .is_empty()
    );

    for bad in [
        "bogus = 1",
        "labels.mcm-pool ~ a",
        "name =",
        "(name = a",
        "name eq (a",
    ] {
        let err = list_names(&client, bad).await.unwrap_err();
        assert_eq!(err.http_status_code(), Some(400), "{bad}");
        assert_eq!(reason(&err).as_deref(), Some("invalid"), "{bad}");
    }
    Ok(())
}

#[tokio::test]
async fn aggregated_list_spans_zones() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    fake.insert_instance_directly(ZONE, planted("a-0", Some("a")));
    fake.insert_instance_directly(ZONE, planted("a-1", Some("a")));
    fake.insert_instance_directly(ZONE2, planted("b-0", Some("a")));
    fake.insert_instance_directly(ZONE2, planted("b-1", Some("a")));
    fake.insert_instance_directly(ZONE2, planted("c-0", Some("b")));

    let aggregated = |token: Option<String>| {
        client
            .aggregated_list()
            .set_project(PROJECT)
            .set_filter(r#"labels.mcm-pool = "a""#)
            .set_max_results(3_u32)
            .set_or_clear_page_token(token)
            .send()
    };
    let names = |list: &google_cloud_compute_v1::model::InstanceAggregatedList, zone: &str| {
        list.items[&format!("zones/{zone}")]
            .instances
            .iter()
            .filter_map(|i| i.name.clone())
            .collect::<Vec<_>>()
    };
    let first = aggregated(None).await?;
    assert_eq!(names(&first, ZONE), ["a-0", "a-1"]);
    assert_eq!(names(&first, ZONE2), ["b-0"]);
    let empty = &first.items["zones/us-central1-b"];
    assert!(empty.instances.is_empty());
    assert_eq!(
        empty.warning.as_ref().and_then(|w| w.code.clone()),
        Some(WarningCode::NoResultsOnPage)
    );
    assert_eq!(first.items.len(), fake.zones().len());
    let token = first.next_page_token.clone().expect("a second page");

    let second = aggregated(Some(token)).await?;
    assert!(names(&second, ZONE).is_empty());
    assert_eq!(names(&second, ZONE2), ["b-1"]);
    assert!(second.next_page_token.is_none_or(|t| t.is_empty()));
    Ok(())
}

#[tokio::test]
async fn delete_stops_then_removes_the_instance() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    let mut spec = planted("d-0", Some("a"));
    spec["disks"]
        .as_array_mut()
        .expect("disks")
        .push(json!({"autoDelete": false, "initializeParams": {"diskSizeGb": "20"}}));
    fake.insert_instance_directly(ZONE, spec);
    assert_eq!(fake.disks().len(), 2);

    fake.pause_operations();
    let delete = |rid: u64| {
        client
            .delete()
            .set_project(PROJECT)
            .set_zone(ZONE)
            .set_instance("d-0")
            .set_request_id(uuid(rid))
            .send()
    };
    let op = delete(1).await?;
    assert_eq!(op.operation_type.as_deref(), Some("delete"));
    assert_eq!(
        get(&client, ZONE, "d-0").await?.status,
        Some(instance::Status::Stopping)
    );
    // Deleting again while the first delete runs: 400 resourceNotReady.
    let err = delete(2).await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(400));
    assert_eq!(reason(&err).as_deref(), Some("resourceNotReady"));
    // Retrying with the first requestId returns the first operation.
    assert_eq!(delete(1).await?.name, op.name);

    fake.resume_operations();
    let done = wait_done(&client, ZONE, &op).await;
    assert!(done.error.is_none());
    let err = get(&client, ZONE, "d-0").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(404));
    assert_eq!(reason(&err).as_deref(), Some("notFound"));
    assert_eq!(
        err.status().map(|s| s.message.as_str()),
        Some(
            format!("The resource 'projects/{PROJECT}/zones/{ZONE}/instances/d-0' was not found")
                .as_str()
        )
    );
    // The boot disk (autoDelete) went with the instance; the data disk leaked.
    let disks: Vec<Value> = fake.disks();
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0]["name"], "d-0-1");
    assert_eq!(disks[0]["users"], json!([]));

    let err = delete(3).await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(404));

    // Re-creating d-0 with a data disk whose default name is taken by the leaked disk: the
    // operation fails with RESOURCE_ALREADY_EXISTS and leaves no instance.
    let with_data_disk = vm_named("d-0").set_disks([
        AttachedDisk::new().set_boot(true).set_initialize_params(
            AttachedDiskInitializeParams::new().set_source_image("projects/p/global/images/i"),
        ),
        AttachedDisk::new()
            .set_initialize_params(AttachedDiskInitializeParams::new().set_disk_size_gb(20)),
    ]);
    let op = client
        .insert()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_body(with_data_disk)
        .send()
        .await?;
    let done = wait_done(&client, ZONE, &op).await;
    let error = &done.error.as_ref().expect("operation error").errors[0];
    assert_eq!(error.code.as_deref(), Some("RESOURCE_ALREADY_EXISTS"));
    assert_eq!(done.http_error_status_code, Some(409));
    assert!(fake.instance(ZONE, "d-0").is_none());
    assert_eq!(fake.disks().len(), 1);
    Ok(())
}

#[tokio::test]
async fn quota_and_stockout_fail_the_operation() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    fake.fail_next_inserts(1, Fault::Quota);
    fake.fail_next_inserts(1, Fault::ZoneExhausted);
    let insert = |name: &str| {
        client
            .insert()
            .set_project(PROJECT)
            .set_zone(ZONE)
            .set_body(vm_named(name))
            .send()
    };

    let op = insert("q-0").await?;
    assert_eq!(op.status, Some(operation::Status::Pending));
    let done = wait_done(&client, ZONE, &op).await;
    let error = &done.error.as_ref().expect("operation error").errors[0];
    assert_eq!(error.code.as_deref(), Some("QUOTA_EXCEEDED"));
    assert_eq!(
        error.message.as_deref(),
        Some("Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1.")
    );
    let quota = error.error_details[0]
        .quota_info
        .as_ref()
        .expect("quotaInfo");
    assert_eq!(
        quota.metric_name.as_deref(),
        Some("compute.googleapis.com/cpus")
    );
    assert_eq!(done.http_error_status_code, Some(403));
    assert_eq!(done.http_error_message.as_deref(), Some("FORBIDDEN"));
    assert_eq!(
        get(&client, ZONE, "q-0")
            .await
            .unwrap_err()
            .http_status_code(),
        Some(404)
    );
    assert!(fake.disks().is_empty());

    let op = insert("q-1").await?;
    let done = wait_done(&client, ZONE, &op).await;
    let error = &done.error.as_ref().expect("operation error").errors[0];
    assert_eq!(error.code.as_deref(), Some("ZONE_RESOURCE_POOL_EXHAUSTED"));
    assert_eq!(
        error.message.as_deref(),
        Some(
            format!(
                "The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources \
                 available to fulfill the request.  Try a different zone, or try again later."
            )
            .as_str()
        )
    );
    assert_eq!(done.http_error_status_code, Some(503));
    assert!(fake.instances().is_empty());
    assert_eq!(fake.insert_count("q-0"), 1);

    // Faults are consumed: the next insert succeeds.
    let op = insert("q-2").await?;
    assert!(wait_done(&client, ZONE, &op).await.error.is_none());

    // A quota GCE checks before accepting: a synchronous 403 quotaExceeded.
    fake.fail_next_inserts(1, Fault::QuotaRejected);
    let err = insert("q-3").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(403));
    assert_eq!(reason(&err).as_deref(), Some("quotaExceeded"));
    assert!(fake.instance(ZONE, "q-3").is_none());
    Ok(())
}

#[tokio::test]
async fn rate_limits_carry_retry_after() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let once = client(&fake).await;
    fake.insert_instance_directly(ZONE, planted("r-0", None));

    fake.fail_next_inserts(
        1,
        Fault::RateLimited {
            retry_after_secs: 7,
        },
    );
    let insert = || {
        once.insert()
            .set_project(PROJECT)
            .set_zone(ZONE)
            .set_body(vm_named("r-1"))
            .send()
    };
    let err = insert().await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(429));
    assert_eq!(retry_after(&err), Some(7));
    // The front end's errors carry `status` and an ErrorInfo detail, which the client prefers
    // over `errors[]` (whose reason is `rateLimitExceeded`).
    assert_eq!(err.status().map(|s| s.code), Some(Code::ResourceExhausted));
    assert_eq!(reason(&err).as_deref(), Some("RATE_LIMIT_EXCEEDED"));
    assert_eq!(fake.insert_count("r-1"), 0);
    assert!(fake.instance(ZONE, "r-1").is_none());
    insert().await?;
    assert_eq!(fake.insert_count("r-1"), 1);

    // Any request can be throttled.
    fake.throttle_next_with(1, 3);
    let err = get(&once, ZONE, "r-0").await.unwrap_err();
    assert_eq!(
        (err.http_status_code(), retry_after(&err)),
        (Some(429), Some(3))
    );

    // The client's default policy does not retry 429 ...
    let retrying = client_as(&fake, SA, true).await;
    fake.clear_request_log();
    fake.throttle_next(1);
    let err = get(&retrying, ZONE, "r-0").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(429));
    assert_eq!(fake.request_log().len(), 1);

    // ... but retries 503 for GET (GCE's 503 has no `status`: Code::Unknown).
    fake.unavailable_next(1);
    let err = get(&once, ZONE, "r-0").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(503));
    assert_eq!(err.status().map(|s| s.code), Some(Code::Unknown));
    assert_eq!(reason(&err).as_deref(), Some("backendError"));
    fake.clear_request_log();
    fake.unavailable_next(1);
    assert_eq!(
        get(&retrying, ZONE, "r-0").await?.name.as_deref(),
        Some("r-0")
    );
    let statuses: Vec<u16> = fake.request_log().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200]);
    Ok(())
}

#[tokio::test]
async fn requests_need_the_service_accounts_bearer_jwt() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    fake.insert_instance_directly(ZONE, planted("x-0", None));

    let stranger = client_as(&fake, "someone@other.iam.gserviceaccount.com", false).await;
    let err = get(&stranger, ZONE, "x-0").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(401));
    assert_eq!(err.status().map(|s| s.code), Some(Code::Unauthenticated));
    assert_eq!(
        reason(&err).as_deref(),
        Some("ACCESS_TOKEN_TYPE_UNSUPPORTED")
    );
    assert!(
        err.http_headers()
            .is_some_and(|h| h.contains_key("www-authenticate"))
    );

    let anonymous = Instances::builder()
        .with_endpoint(fake.url())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .with_retry_policy(NeverRetry)
        .build()
        .await?;
    let err = get(&anonymous, ZONE, "x-0").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(401));
    assert_eq!(reason(&err).as_deref(), Some("CREDENTIALS_MISSING"));

    let path = format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/x-0");
    let (status, body) = raw(&fake, "GET", &path, None).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["errors"][0]["reason"], "required");
    let (status, _) = raw(&fake, "GET", &path, Some("Basic dXNlcjpwdw==")).await;
    assert_eq!(status, 401);
    let (status, _) = raw(&fake, "GET", &path, Some("Bearer not.a.jwt")).await;
    assert_eq!(status, 401);
    let bearer = format!("Bearer {}", test_bearer_token(SA));
    let (status, body) = raw(&fake, "GET", &path, Some(&bearer)).await;
    assert_eq!((status, body["name"].as_str()), (200, Some("x-0")));

    // Another project: 403 forbidden.
    let other = format!("/compute/v1/projects/other/zones/{ZONE}/instances/x-0");
    let (status, body) = raw(&fake, "GET", &other, Some(&bearer)).await;
    assert_eq!(
        (status, &body["error"]["errors"][0]["reason"]),
        (403, &json!("forbidden"))
    );

    let log = fake.request_log();
    assert_eq!(log.len(), 7);
    assert!(
        log[..5]
            .iter()
            .all(|r| r.status == 401 && r.principal.is_none())
    );
    assert_eq!(log[5].principal.as_deref(), Some(SA));
    Ok(())
}

#[tokio::test]
async fn wait_returns_when_done_or_after_its_timeout() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    fake.set_wait_timeout(Duration::from_millis(100));
    fake.set_operation_delay(Duration::from_millis(50));
    fake.pause_operations();
    let op = client
        .insert()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_body(vm_named("w-0"))
        .send()
        .await?;
    let name = op.name.clone().expect("name");
    let path = format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/{name}/wait");
    let bearer = format!("Bearer {}", test_bearer_token(SA));
    let (status, body) = raw(&fake, "POST", &path, Some(&bearer)).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("PENDING")));

    fake.set_wait_timeout(DEADLINE);
    fake.resume_operations();
    let (status, body) = raw(&fake, "POST", &path, Some(&bearer)).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("DONE")));
    assert!(
        fake.wait_for(DEADLINE, |f| f
            .instance(ZONE, "w-0")
            .is_some_and(|i| i["status"] == "RUNNING"))
            .await
    );

    let err = client
        .get_operation()
        .set_project(PROJECT)
        .set_zone(ZONE)
        .set_operation("operation-0-unknown")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.http_status_code(), Some(404));
    // The operation lives in its zone only.
    let err = client
        .get_operation()
        .set_project(PROJECT)
        .set_zone(ZONE2)
        .set_operation(&name)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.http_status_code(), Some(404));
    Ok(())
}

#[tokio::test]
async fn direct_state_access_for_tests() -> TestResult {
    let fake = FakeCompute::start(PROJECT, SA).await;
    let client = client(&fake).await;
    let orphan = fake.insert_instance_directly(ZONE2, planted("orphan-0", Some("a")));
    assert_eq!(orphan["status"], "RUNNING");
    let id = orphan["id"].as_str().expect("id").to_owned();

    // By name and by numeric id.
    assert_eq!(get(&client, ZONE2, "orphan-0").await?.id, id.parse().ok());
    assert_eq!(
        get(&client, ZONE2, &id).await?.name.as_deref(),
        Some("orphan-0")
    );

    assert!(fake.set_instance_status(ZONE2, "orphan-0", "TERMINATED"));
    assert_eq!(
        get(&client, ZONE2, "orphan-0").await?.status,
        Some(instance::Status::Terminated)
    );
    assert!(!fake.set_instance_status(ZONE2, "missing", "TERMINATED"));

    assert!(fake.remove_instance_directly(ZONE2, "orphan-0").is_some());
    assert!(fake.disks().is_empty());
    assert_eq!(
        get(&client, ZONE2, "orphan-0")
            .await
            .unwrap_err()
            .http_status_code(),
        Some(404)
    );

    // Unknown zones and bad instance names are 400s.
    let err = get(&client, "mars-north1-a", "x").await.unwrap_err();
    assert_eq!(
        (err.http_status_code(), reason(&err).as_deref()),
        (Some(400), Some("invalid"))
    );
    fake.add_zone("mars-north1-a");
    let err = get(&client, "mars-north1-a", "x").await.unwrap_err();
    assert_eq!(err.http_status_code(), Some(404));
    let err = get(&client, ZONE, "Not_A_Name").await.unwrap_err();
    assert_eq!(reason(&err).as_deref(), Some("invalidParameter"));
    Ok(())
}
