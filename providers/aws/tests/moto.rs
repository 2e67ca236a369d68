//! The AWS driver against `moto_server` (one server per test process, unique tags and VPCs
//! per test), plus a scripted fake endpoint for what moto cannot produce (throttling) and for
//! the request id header.

#[path = "common/moto.rs"]
mod common;
#[path = "common/inputs.rs"]
mod inputs;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};
use base64::Engine as _;
use common::{Moto, REGION, World, lagging_moto, moto};
use inputs::{USER_DATA, class, scripted_spec, secret};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    Code, CreateMachineRequest, DeleteMachineRequest, Driver, DriverError, GetMachineStatusRequest,
    GetVolumeIdsRequest, IdempotencyKey, InitializeMachineRequest, ListMachinesRequest, RequestId,
    ResourceKind, SecretData,
};
use mcm_provider_aws::{AwsDriver, AwsDriverConfig, REQUEST_ID_HEADER, decode_provider_id};
use serde_json::json;

async fn driver(page_size: i32) -> AwsDriver {
    AwsDriver::new(AwsDriverConfig {
        endpoint_url: Some(moto().url.clone()),
        page_size,
        max_attempts: Some(1),
        ..Default::default()
    })
    .await
}

fn machine(name: &str, provider_id: Option<&str>) -> Machine {
    let mut m = Machine::new(name, Default::default());
    m.spec.provider_id = provider_id.map(String::from);
    m
}

/// A driver for moto server `m` that waits `visibility` for launched instances to be listed.
async fn driver_in(m: &Moto, visibility: Duration) -> AwsDriver {
    AwsDriver::new(AwsDriverConfig {
        endpoint_url: Some(m.url.clone()),
        max_attempts: Some(1),
        visibility_timeout: visibility,
        ..Default::default()
    })
    .await
}

/// One creation attempt's call (a retry passes the same `key`).
async fn create_keyed(
    d: &AwsDriver,
    c: &MachineClass,
    name: &str,
    key: &IdempotencyKey,
) -> Result<mcm_driver::CreateMachineResponse, DriverError> {
    d.create_machine(CreateMachineRequest {
        machine: machine(name, None),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
        idempotency_key: key.clone(),
    })
    .await
}

/// The status of machine `m` (with its providerID, if it has one).
async fn status_of(
    d: &AwsDriver,
    c: &MachineClass,
    m: Machine,
) -> Result<mcm_driver::GetMachineStatusResponse, DriverError> {
    d.get_machine_status(GetMachineStatusRequest {
        machine: m,
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
}

async fn create(
    d: &AwsDriver,
    c: &MachineClass,
    name: &str,
) -> Result<mcm_driver::CreateMachineResponse, DriverError> {
    d.create_machine(CreateMachineRequest {
        machine: machine(name, None),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
        idempotency_key: IdempotencyKey::random(),
    })
    .await
}

async fn status(
    d: &AwsDriver,
    c: &MachineClass,
    name: &str,
) -> Result<mcm_driver::GetMachineStatusResponse, DriverError> {
    d.get_machine_status(GetMachineStatusRequest {
        machine: machine(name, None),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
}

async fn delete(
    d: &AwsDriver,
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

async fn list(d: &AwsDriver, c: &MachineClass) -> std::collections::BTreeMap<String, String> {
    d.list_machines(ListMachinesRequest {
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap()
    .machines
}

fn tag_value<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

#[tokio::test]
async fn create_is_idempotent_tags_everything_and_delete_terminates() {
    let w = World::new("lifecycle").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    let ec2 = moto().ec2();

    let created = create(&d, &c, "m-1").await.unwrap();
    let id = decode_provider_id(&created.provider_id)
        .unwrap()
        .to_string();
    assert_eq!(created.provider_id, format!("aws:///{REGION}/{id}"));
    assert!(
        created.node_name.starts_with("ip-10-") && created.node_name.ends_with(".internal"),
        "node name is the private DNS name: {}",
        created.node_name
    );
    assert!(created.addresses.iter().any(|a| a.type_ == "InternalIP"));

    // Idempotent: a second create returns the same instance.
    let again = create(&d, &c, "m-1").await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(w.live_instances().await.len(), 1);

    // The instance: tags, AMI, type, subnet, security group, profile, user data, volumes.
    let described = ec2
        .describe_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    let i = &described.reservations()[0].instances()[0];
    assert_eq!(tag_value(i.tags(), "Name"), Some("m-1"));
    assert_eq!(tag_value(i.tags(), &w.cluster_tag), Some("1"));
    assert_eq!(tag_value(i.tags(), &w.role_tag), Some("1"));
    assert_eq!(tag_value(i.tags(), "team"), Some("mcm"));
    assert_eq!(i.image_id(), Some(w.ami.as_str()));
    assert_eq!(i.instance_type().map(|t| t.as_str()), Some("m5.large"));
    assert_eq!(i.subnet_id(), Some(w.subnet.as_str()));
    let nic = &i.network_interfaces()[0];
    assert_eq!(nic.subnet_id(), Some(w.subnet.as_str()));
    assert!(
        nic.groups()
            .iter()
            .any(|g| g.group_id() == Some(w.security_group.as_str())),
        "{:?}",
        nic.groups()
    );
    assert!(
        i.iam_instance_profile()
            .and_then(|p| p.arn())
            .is_some_and(|a| a.ends_with(&w.profile)),
        "{:?}",
        i.iam_instance_profile()
    );
    let user_data = ec2
        .describe_instance_attribute()
        .instance_id(&id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .unwrap();
    let encoded = user_data.user_data().and_then(|u| u.value()).unwrap();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), USER_DATA);
    let devices: BTreeSet<_> = i
        .block_device_mappings()
        .iter()
        .filter_map(|b| b.device_name())
        .collect();
    assert!(devices.contains("/dev/sdb"), "{devices:?}");
    let volumes = ec2
        .describe_volumes()
        .filters(
            Filter::builder()
                .name("attachment.instance-id")
                .values(&id)
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(!volumes.volumes().is_empty());
    assert!(
        volumes
            .volumes()
            .iter()
            .all(|v| tag_value(v.tags(), "Name") == Some("m-1")),
        "volumes are tagged: {:?}",
        volumes.volumes()
    );

    // Status reports the instance, its NIC and disks.
    let s = status(&d, &c, "m-1").await.unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    assert_eq!(s.node_name, created.node_name);
    assert!(
        s.resources
            .iter()
            .any(|r| r.kind == ResourceKind::Vm && r.id == id)
    );
    assert!(s.resources.iter().any(|r| r.kind == ResourceKind::Disk));

    // Delete by providerID terminates; afterwards the machine is NotFound and deleting again
    // (by providerID or by tags) is a success.
    delete(&d, &c, "m-1", Some(&created.provider_id))
        .await
        .unwrap();
    assert!(w.live_instances().await.is_empty());
    assert_eq!(
        status(&d, &c, "m-1").await.unwrap_err().code,
        Code::NotFound
    );
    delete(&d, &c, "m-1", Some(&created.provider_id))
        .await
        .unwrap();
    delete(&d, &c, "m-1", None).await.unwrap();
}

#[tokio::test]
async fn not_found_paths() {
    let w = World::new("notfound").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    let err = status(&d, &c, "ghost").await.unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    assert!(err.message.contains("ghost"), "{}", err.message);
    // Deleting what does not exist: by tags, and by a providerID of an unknown instance
    // (moto answers InvalidInstanceID.NotFound).
    delete(&d, &c, "ghost", None).await.unwrap();
    delete(
        &d,
        &c,
        "ghost",
        Some(&format!("aws:///{REGION}/i-0123456789abcdef0")),
    )
    .await
    .unwrap();
    let err = d
        .initialize_machine(InitializeMachineRequest {
            machine: machine("ghost", None),
            machine_class: c.clone(),
            secret: secret(),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    // A malformed providerID is the caller's problem.
    let err = delete(&d, &c, "ghost", Some("gce:///p/z/n"))
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
}

#[tokio::test]
async fn delete_without_provider_id_finds_the_instance_by_tags() {
    let w = World::new("deltags").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    create(&d, &c, "m-tags").await.unwrap();
    delete(&d, &c, "m-tags", None).await.unwrap();
    assert!(w.live_instances().await.is_empty());
}

#[tokio::test]
async fn initialize_disables_the_source_destination_check() {
    let w = World::new("srcdst").await;
    let d = driver(1000).await;
    let mut spec = w.provider_spec();
    spec["srcAndDstChecksEnabled"] = json!(false);
    let c = class(spec);
    let created = create(&d, &c, "nat-1").await.unwrap();
    // Until initialized, status says Uninitialized (the controller then initializes).
    assert_eq!(
        status(&d, &c, "nat-1").await.unwrap_err().code,
        Code::Uninitialized
    );
    let init = d
        .initialize_machine(InitializeMachineRequest {
            machine: machine("nat-1", None),
            machine_class: c.clone(),
            secret: secret(),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap();
    assert_eq!(init.provider_id, created.provider_id);
    let s = status(&d, &c, "nat-1").await.unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    let id = decode_provider_id(&created.provider_id).unwrap();
    assert_eq!(interface_checks(id).await, vec![Some(false)]);
    delete(&d, &c, "nat-1", Some(&created.provider_id))
        .await
        .unwrap();
}

/// The source/destination check of each network interface of instance `id`.
async fn interface_checks(id: &str) -> Vec<Option<bool>> {
    moto()
        .ec2()
        .describe_network_interfaces()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("attachment.instance-id")
                .values(id)
                .build(),
        )
        .send()
        .await
        .unwrap()
        .network_interfaces()
        .iter()
        .map(|n| n.source_dest_check())
        .collect()
}

#[tokio::test]
async fn a_multi_nic_machine_has_the_check_turned_off_on_each_interface() {
    let w = World::new("srcdst-nics").await;
    let d = driver(1000).await;
    let mut spec = w.provider_spec();
    spec["srcAndDstChecksEnabled"] = json!(false);
    spec["networkInterfaces"] = json!([
        {"subnetID": w.subnet, "securityGroupIDs": [w.security_group]},
        {"subnetID": w.subnet, "securityGroupIDs": [w.security_group], "deviceIndex": 1},
    ]);
    let c = class(spec);
    let created = create(&d, &c, "nat-2").await.unwrap();
    let id = decode_provider_id(&created.provider_id)
        .unwrap()
        .to_string();
    // EC2 refuses the instance-wide attribute for an instance with several interfaces (moto
    // does not), so the check is turned off on each interface.
    assert_eq!(
        interface_checks(&id).await.len(),
        2,
        "two interfaces attached"
    );
    d.initialize_machine(InitializeMachineRequest {
        machine: machine("nat-2", None),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap();
    assert_eq!(
        interface_checks(&id).await,
        vec![Some(false), Some(false)],
        "per interface"
    );
    status(&d, &c, "nat-2").await.unwrap();
    delete(&d, &c, "nat-2", Some(&created.provider_id))
        .await
        .unwrap();
}

/// Starts an instance directly in moto with `tags` (playing a VM created by someone else).
async fn run_raw(w: &World, tags: &[(&str, &str)]) -> String {
    let tags: Vec<Tag> = tags
        .iter()
        .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
        .collect();
    let out = moto()
        .ec2()
        .run_instances()
        .image_id(&w.ami)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(&w.subnet)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .set_tags(Some(tags))
                .build(),
        )
        .send()
        .await
        .unwrap();
    out.instances()[0].instance_id().unwrap().to_string()
}

#[tokio::test]
async fn two_instances_of_one_machine_are_out_of_range_and_create_returns_the_oldest() {
    let w = World::new("dupes").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    let first = run_raw(
        &w,
        &[("Name", "twin"), (&w.cluster_tag, "1"), (&w.role_tag, "1")],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct launch times
    let _second = run_raw(
        &w,
        &[("Name", "twin"), (&w.cluster_tag, "1"), (&w.role_tag, "1")],
    )
    .await;
    let err = status(&d, &c, "twin").await.unwrap_err();
    assert_eq!(err.code, Code::OutOfRange);
    assert!(err.message.contains(&first), "{}", err.message);
    let created = create(&d, &c, "twin").await.unwrap();
    assert_eq!(decode_provider_id(&created.provider_id).unwrap(), first);
    // Delete by tags terminates both.
    delete(&d, &c, "twin", None).await.unwrap();
    assert!(w.live_instances().await.is_empty());
}

#[tokio::test]
async fn list_pages_through_the_class_and_checks_the_role_tag_client_side() {
    let w = World::new("list").await;
    // Pages of 5 (EC2's minimum) over 12 machines: three pages.
    let d = driver(5).await;
    let c = class(w.provider_spec());
    let mut want = std::collections::BTreeMap::new();
    for n in 0..12 {
        let name = format!("pool-{n:02}");
        let r = create(&d, &c, &name).await.unwrap();
        want.insert(r.provider_id, name);
    }
    // Same cluster but another role, and a terminated machine: not listed.
    run_raw(
        &w,
        &[
            ("Name", "other-role"),
            (&w.cluster_tag, "1"),
            ("kubernetes.io/role/master", "1"),
        ],
    )
    .await;
    let gone = create(&d, &c, "gone").await.unwrap();
    delete(&d, &c, "gone", Some(&gone.provider_id))
        .await
        .unwrap();
    // moto pages like EC2: the driver had to follow next tokens.
    let first_page = moto()
        .ec2()
        .describe_instances()
        .filters(
            Filter::builder()
                .name("tag-key")
                .values(&w.cluster_tag)
                .build(),
        )
        .max_results(5)
        .send()
        .await
        .unwrap();
    let on_first: usize = first_page
        .reservations()
        .iter()
        .map(|r| r.instances().len())
        .sum();
    assert_eq!(on_first, 5);
    assert!(first_page.next_token().is_some());
    let listed = list(&d, &c).await;
    assert_eq!(listed, want);
    let resources = d
        .list_machines(ListMachinesRequest {
            machine_class: c.clone(),
            secret: secret(),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap()
        .resources;
    assert_eq!(resources.len(), 12);
    // The same list with one big page.
    assert_eq!(list(&driver(1000).await, &c).await, want);
    for (provider_id, name) in &want {
        delete(&d, &c, name, Some(provider_id)).await.unwrap();
    }
    assert!(list(&d, &c).await.is_empty());
}

#[tokio::test]
async fn errors_from_moto_and_from_validation_map_to_codes() {
    let w = World::new("errors").await;
    let d = driver(1000).await;

    // A missing AMI: EC2's InvalidAMIID.NotFound -> InvalidArgument, with the AWS code and the
    // SDK error kept.
    let mut spec = w.provider_spec();
    spec["ami"] = json!("ami-00000000deadbeef0");
    let err = create(&d, &class(spec), "bad-ami").await.unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument, "{}", err.full_message());
    assert!(
        err.message.contains("ami-00000000deadbeef0") || err.message.contains("InvalidAMIID"),
        "{}",
        err.message
    );
    assert!(err.message.contains("request id"), "{}", err.message);

    // A missing subnet: InvalidSubnetID.NotFound from RunInstances.
    let mut spec = w.provider_spec();
    spec["networkInterfaces"][0]["subnetID"] = json!("subnet-0000000000000000f");
    let err = create(&d, &class(spec), "bad-subnet").await.unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument, "{}", err.full_message());
    assert!(err.message.contains("RunInstances"), "{}", err.message);
    assert!(
        err.message.contains("InvalidSubnetID.NotFound"),
        "{}",
        err.message
    );
    let source = std::error::Error::source(&err).expect("EC2's answer is the source");
    let answer = source
        .downcast_ref::<mcm_provider_aws::errors::ServiceError>()
        .unwrap_or_else(|| panic!("{source:?}"));
    assert_eq!(answer.code, "InvalidSubnetID.NotFound");
    assert_eq!(answer.status, 400);
    assert!(
        err.message.contains(&answer.aws_request_id),
        "{}",
        err.message
    );

    // An invalid class and secret: InvalidArgument naming every field, before any EC2 call.
    let err = d
        .create_machine(CreateMachineRequest {
            machine: machine("bad-spec", None),
            machine_class: class(json!({ "region": REGION, "tags": {} })),
            secret: SecretData::default(),
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    for field in [
        "providerSpec.ami",
        "providerSpec.machineType",
        "providerSpec.iam",
        "providerSpec.networkInterfaces",
        "providerSpec.tags",
        "secretRef.providerAccessKeyId",
        "secretRef.userData",
    ] {
        assert!(err.message.contains(field), "{field} in {}", err.message);
    }
    assert!(w.live_instances().await.is_empty());
}

#[tokio::test]
async fn volume_ids_of_ebs_persistent_volumes() {
    let d = AwsDriver::new(AwsDriverConfig::default()).await;
    let specs: Vec<k8s_openapi::api::core::v1::PersistentVolumeSpec> =
        serde_json::from_value(json!([
            { "awsElasticBlockStore": { "volumeID": "aws://eu-west-1a/vol-1" } },
            { "csi": { "driver": "ebs.csi.aws.com", "volumeHandle": "vol-2" } },
            { "csi": { "driver": "other.csi", "volumeHandle": "x" } },
            { "hostPath": { "path": "/tmp" } }
        ]))
        .unwrap();
    let r = d
        .get_volume_ids(GetVolumeIdsRequest {
            pv_specs: specs,
            request_id: RequestId::generate(),
        })
        .await
        .unwrap();
    assert_eq!(r.volume_ids, vec!["vol-1", "vol-2"]);
}

/// A scripted EC2 endpoint: answers every request with `status` and an EC2 error `code`,
/// and records the request heads it saw.
async fn scripted_endpoint(
    status: u16,
    code: &'static str,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = Vec::new();
                // Read the head and the body (Content-Length).
                loop {
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            s.lock().unwrap().push(text.clone());
                            break;
                        }
                    }
                }
                let body = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>scripted {code}</Message></Error></Errors><RequestID>body-req-1</RequestID></Response>"
                );
                let resp = format!(
                    "HTTP/1.1 {status} Scripted\r\nContent-Type: text/xml\r\nx-amzn-requestid: aws-req-42\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn throttling_capacity_and_auth_errors_map_and_every_request_carries_the_request_id() {
    let spec = scripted_spec();
    for (status, code, want) in [
        (503, "RequestLimitExceeded", Code::Unavailable),
        (400, "InsufficientInstanceCapacity", Code::ResourceExhausted),
        (401, "AuthFailure", Code::Unauthenticated),
        (403, "UnauthorizedOperation", Code::PermissionDenied),
        (400, "InvalidInstanceID.NotFound", Code::NotFound),
    ] {
        let (url, seen) = scripted_endpoint(status, code).await;
        let d = AwsDriver::new(AwsDriverConfig {
            endpoint_url: Some(url),
            max_attempts: Some(1),
            ..Default::default()
        })
        .await;
        let request_id = RequestId::from_string(format!("test-{code}"));
        let err = d
            .get_machine_status(GetMachineStatusRequest {
                machine: machine("m", None),
                machine_class: class(spec.clone()),
                secret: secret(),
                request_id: request_id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code, want, "{code}: {}", err.full_message());
        assert!(err.message.contains(code), "{}", err.message);
        assert!(
            err.message.contains("aws-req-42"),
            "AWS request id: {}",
            err.message
        );
        assert!(err.message.contains(request_id.as_str()), "{}", err.message);
        if want == Code::Unavailable {
            assert!(err.retry_after.is_some(), "throttling carries a retry hint");
        }
        let requests = seen.lock().unwrap().clone();
        assert!(!requests.is_empty());
        for head in requests
            .iter()
            .map(|r| r.split("\r\n\r\n").next().unwrap_or_default())
        {
            assert!(
                head.to_ascii_lowercase().contains(
                    &format!("{REQUEST_ID_HEADER}: {}", request_id.as_str()).to_ascii_lowercase()
                ),
                "request id header missing in\n{head}"
            );
        }
    }
}

#[tokio::test]
async fn one_creation_attempt_launches_one_instance_while_describe_lags_behind() {
    let m = lagging_moto();
    let w = World::new_in(m, "lag").await;
    let c = class(w.provider_spec());
    let key = IdempotencyKey::for_creation("uid-lag-1", "2026-11-26T18:00:00Z");
    // EC2 launches the instance but lists it only later: a create that cannot wait that long
    // fails with a retryable code instead of reporting a VM nobody can find.
    let impatient = driver_in(m, Duration::from_millis(300)).await;
    let e = create_keyed(&impatient, &c, "lag-1", &key)
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    assert!(e.message.contains("did not list it"), "{e}");
    // The retry of the same attempt (the controller found nothing by tags, or restarted):
    // the same client token, so EC2 answers with the same instance and launches nothing.
    let patient = driver_in(m, Duration::from_secs(30)).await;
    let created = create_keyed(&patient, &c, "lag-1", &key).await.unwrap();
    assert_eq!(
        w.launched_per_machine(),
        std::collections::BTreeMap::from([("lag-1".to_string(), 1)]),
        "one instance for one attempt"
    );
    // Created means listed: its status is found by the recorded id at once.
    let s = status_of(&patient, &c, machine("lag-1", Some(&created.provider_id)))
        .await
        .unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    delete(&patient, &c, "lag-1", Some(&created.provider_id))
        .await
        .unwrap();
}

/// Removes instance `id`'s `Name` tag (tags are anyone's to change).
async fn remove_name_tag(id: &str) {
    moto()
        .ec2()
        .delete_tags()
        .resources(id)
        .tags(Tag::builder().key("Name").build())
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_recorded_provider_id_finds_the_instance_by_its_id_not_its_tags() {
    let w = World::new("by-id").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    let created = create(&d, &c, "by-id-1").await.unwrap();
    let id = decode_provider_id(&created.provider_id)
        .unwrap()
        .to_string();
    // Tags are anyone's to change; the recorded id is the machine's own.
    remove_name_tag(&id).await;
    let recorded = machine("by-id-1", Some(&created.provider_id));
    let s = status_of(&d, &c, recorded.clone()).await.unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    assert_eq!(
        status(&d, &c, "by-id-1").await.unwrap_err().code,
        Code::NotFound,
        "by tags it cannot be found any more"
    );
    d.initialize_machine(InitializeMachineRequest {
        machine: recorded.clone(),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap();
    // Terminated: gone, also by its id.
    delete(&d, &c, "by-id-1", Some(&created.provider_id))
        .await
        .unwrap();
    let gone = status_of(&d, &c, recorded).await.unwrap_err();
    assert_eq!(gone.code, Code::NotFound, "{gone}");
    assert!(gone.message.contains("terminated"), "{gone}");
}

#[tokio::test]
async fn a_client_token_whose_instance_terminated_at_once_launches_the_next_one() {
    let w = World::new("generations").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    let key = IdempotencyKey::for_creation("uid-gen-1", "2026-11-26T18:00:00Z");
    let first = create_keyed(&d, &c, "gen-1", &key).await.unwrap();
    // The instance terminates at once (e.g. EC2 had no capacity after all); EC2 keeps
    // answering the token with it, so the retry of the attempt takes the next token.
    moto()
        .ec2()
        .terminate_instances()
        .instance_ids(decode_provider_id(&first.provider_id).unwrap())
        .send()
        .await
        .unwrap();
    let second = create_keyed(&d, &c, "gen-1", &key).await.unwrap();
    assert_ne!(second.provider_id, first.provider_id);
    assert_eq!(w.live_per_machine().get("gen-1"), Some(&1));
    // And again where the lookup by tags cannot help (its Name tag is gone, as if EC2 did
    // not list it yet): the same sequence of tokens ends at the same instance.
    remove_name_tag(decode_provider_id(&second.provider_id).unwrap()).await;
    let third = create_keyed(&d, &c, "gen-1", &key).await.unwrap();
    assert_eq!(third.provider_id, second.provider_id);
    assert_eq!(
        w.launched_per_machine().values().sum::<usize>(),
        2,
        "{:?}",
        w.launched_per_machine()
    );
    delete(&d, &c, "gen-1", Some(&second.provider_id))
        .await
        .unwrap();
}

#[tokio::test]
async fn workload_identity_assumes_the_role_with_the_token_in_the_file() {
    let w = World::new("wi").await;
    let d = driver(1000).await;
    let c = class(w.provider_spec());
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let wi_secret = |file: &std::path::Path| {
        SecretData::from_pairs([
            ("roleARN", "arn:aws:iam::123456789012:role/gardener-shoot"),
            ("workloadIdentityTokenFile", file.to_str().unwrap()),
            ("userData", USER_DATA),
        ])
    };
    let status_with = |secret: SecretData| {
        let (d, c) = (d.clone(), c.clone());
        async move {
            d.get_machine_status(GetMachineStatusRequest {
                machine: machine("wi-1", None),
                machine_class: c,
                secret,
                request_id: RequestId::generate(),
            })
            .await
        }
    };
    // Before gardenlet wrote the token: a clear authentication error naming the file.
    let e = status_with(wi_secret(&token_file)).await.unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains(token_file.to_str().unwrap()), "{e}");
    // With the token, the driver works without any access key: STS (moto) gave it
    // temporary credentials of the role.
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n").unwrap();
    let created = d
        .create_machine(CreateMachineRequest {
            machine: machine("wi-1", None),
            machine_class: c.clone(),
            secret: wi_secret(&token_file),
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
        .await
        .unwrap();
    let s = status_with(wi_secret(&token_file)).await.unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    d.delete_machine(DeleteMachineRequest {
        machine: machine("wi-1", Some(&created.provider_id)),
        machine_class: c.clone(),
        secret: wi_secret(&token_file),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap();
    assert!(w.live_instances().await.is_empty());
}

/// What `tests/sigv4_check.py` says of `requests` signed with these credentials: one line
/// per request, `ok` or what differs; and whether all were ok.
fn botocore_verdicts(
    access_key: &str,
    secret_key: &str,
    session_token: Option<&str>,
    requests: &[String],
) -> (Vec<String>, bool) {
    use std::io::Write as _;
    let script = format!("{}/tests/sigv4_check.py", env!("CARGO_MANIFEST_DIR"));
    let mut child = std::process::Command::new(common::python())
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("python runs");
    let input = json!({
        "access_key": access_key, "secret_key": secret_key, "session_token": session_token,
        "region": REGION, "service": "ec2", "requests": requests,
    });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    (lines, out.status.success())
}

#[tokio::test]
async fn every_request_is_signed_as_ec2_verifies_it() {
    // moto does not check signatures unless told to; botocore's SigV4 (what moto checks with
    // when it does) recomputes each captured request's signature.
    let (url, seen) = scripted_endpoint(400, "InvalidInstanceID.NotFound").await;
    let d = AwsDriver::new(AwsDriverConfig {
        endpoint_url: Some(url.clone()),
        max_attempts: Some(1),
        ..Default::default()
    })
    .await;
    let mut spec = scripted_spec();
    spec["tags"]["a b"] = json!("c&d/é=");
    let _ = status(&d, &class(spec.clone()), "m").await.unwrap_err();
    let _ = d
        .delete_machine(DeleteMachineRequest {
            machine: machine("m", Some(&format!("aws:///{REGION}/i-0123456789abcdef0"))),
            machine_class: class(spec.clone()),
            secret: secret(),
            request_id: RequestId::generate(),
        })
        .await;
    let with_key = std::mem::take(&mut *seen.lock().unwrap());
    assert!(!with_key.is_empty());
    let (verdicts, ok) = botocore_verdicts("AKIDTEST", "secret", None, &with_key);
    assert!(ok, "{verdicts:#?}");

    // Temporary credentials (workload identity's) carry their session token, signed too; a
    // RunInstances body with characters that need encoding.
    let config = AwsDriverConfig {
        endpoint_url: Some(url),
        max_attempts: Some(1),
        ..Default::default()
    };
    let sdk = mcm_provider_aws::client::load_sdk_config(&config).await;
    let client = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&sdk)
            .region(aws_sdk_ec2::config::Region::new(REGION))
            .credentials_provider(aws_credential_types::Credentials::new(
                "ASIATEST",
                "secret-2",
                Some("token/+=".into()),
                None,
                "test",
            ))
            .build(),
    );
    let spec: mcm_provider_aws::ProviderSpec = serde_json::from_value(spec).unwrap();
    let run = mcm_provider_aws::launch::run_instances_request(
        client.run_instances(),
        &spec,
        "m-ü",
        None,
        b"#!/bin/sh\n",
        Some("/dev/xvda"),
        "token-1",
    )
    .unwrap();
    let _ = run.send().await.unwrap_err();
    let mut with_token = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(with_token.len(), 1);
    let (verdicts, ok) = botocore_verdicts("ASIATEST", "secret-2", Some("token/+="), &with_token);
    assert!(ok, "{verdicts:#?}");

    // The check can fail: one byte of the body changed after signing.
    with_token[0] = with_token[0].replacen("MinCount=1", "MinCount=2", 1);
    let (verdicts, ok) = botocore_verdicts("ASIATEST", "secret-2", Some("token/+="), &with_token);
    assert!(!ok && verdicts[0].starts_with("signature"), "{verdicts:#?}");
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried_and_refusals_are_not() {
    let spec = scripted_spec();
    for (http_status, code, attempts) in [
        (503, "RequestLimitExceeded", 3),
        (500, "InternalError", 3),
        (400, "InvalidParameterValue", 1),
        (401, "AuthFailure", 1),
    ] {
        let (url, seen) = scripted_endpoint(http_status, code).await;
        let d = AwsDriver::new(AwsDriverConfig {
            endpoint_url: Some(url),
            max_attempts: Some(3),
            ..Default::default()
        })
        .await;
        let err = status(&d, &class(spec.clone()), "m").await.unwrap_err();
        assert!(err.message.contains(code), "{}", err.message);
        assert_eq!(seen.lock().unwrap().len(), attempts, "{code}");
    }
}

#[tokio::test]
async fn an_endpoint_that_never_answers_is_a_deadline_within_the_operation_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepts and holds every connection without answering.
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let d = AwsDriver::new(AwsDriverConfig {
        endpoint_url: Some(url),
        max_attempts: Some(3),
        operation_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let err = status(&d, &class(scripted_spec()), "m").await.unwrap_err();
    held.abort();
    assert_eq!(err.code, Code::DeadlineExceeded, "{}", err.full_message());
    assert!(err.message.contains("timed out"), "{}", err.message);
    assert!(err.retry_after.is_some());
}
