//! The local provider against a real control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler): VMs are `local-node` processes.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, PostParams};
use kube::runtime::wait::conditions;
use mcm_driver::{Code, Driver, GetVolumeIdsRequest, RequestId, ResourceState};
use mcm_provider_local::{LocalDriver, LocalDriverConfig, parse_provider_spec};
use mcm_testenv::Components;
use mcm_testenv::kit::{TestNamespace, await_object, is_ready, kubeconfig_text, ready_status};
use serde_json::json;

#[tokio::test]
async fn a_vm_registers_a_ready_node_from_its_spec() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "reg").await;
    let cloud = Cloud::on(
        &env,
        json!({
            "capacity": {"cpu": "3", "memory": "6Gi", "pods": "42", "ephemeralStorage": "7Gi"},
            "labels": {"pool": "blue", "test-ns": ns},
            "taints": [{"key": "dedicated", "value": "blue", "effect": "NoSchedule"}],
            "heartbeatInterval": "1s",
        }),
    );
    let name = format!("{ns}-vm");
    let created = cloud.create(&name).await.expect("create");
    assert_eq!(created.provider_id, format!("local:///{name}"));
    assert_eq!(created.node_name, name);
    let addresses: Vec<_> = created
        .addresses
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    assert_eq!(
        addresses,
        [("InternalIP", "127.0.0.1"), ("Hostname", name.as_str())]
    );

    let node = await_node_ready(&client, &name, &cloud).await;
    let spec = node.spec.clone().expect("spec");
    assert_eq!(
        spec.provider_id.as_deref(),
        Some(created.provider_id.as_str())
    );
    let taints = spec.taints.expect("taints");
    assert!(
        taints.iter().any(|t| t.key == "dedicated"
            && t.value.as_deref() == Some("blue")
            && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    let labels = node.metadata.labels.clone().expect("labels");
    assert_eq!(labels["pool"], "blue");
    assert_eq!(labels["kubernetes.io/hostname"], name);
    assert_eq!(labels["node.kubernetes.io/instance-type"], "local");
    let status = node.status.clone().expect("status");
    let capacity = status.capacity.clone().expect("capacity");
    assert_eq!(capacity["cpu"], Quantity("3".into()));
    assert_eq!(capacity["memory"], Quantity("6Gi".into()));
    assert_eq!(capacity["pods"], Quantity("42".into()));
    assert_eq!(capacity["ephemeral-storage"], Quantity("7Gi".into()));
    assert_eq!(status.allocatable, status.capacity);
    let info = status.node_info.expect("nodeInfo");
    assert_eq!(info.kubelet_version, "v1.36.3-local");

    // The Lease is held by the node and owned by it.
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = await_object(
        lease_api,
        &name,
        WAIT,
        "the Node Lease",
        conditions::is_created(),
    )
    .await
    .expect("lease");
    let lease_spec = lease.spec.expect("lease spec");
    assert_eq!(lease_spec.holder_identity.as_deref(), Some(name.as_str()));
    assert_eq!(lease_spec.lease_duration_seconds, Some(40));

    // The heartbeat keeps moving.
    let first = heartbeat(&node);
    await_node(&client, &name, "a newer heartbeat", |n| {
        n.is_some_and(|n| heartbeat(n) > first)
    })
    .await;

    // The request id reached the agent's log.
    let record = cloud.state().read(&name).expect("read").expect("record");
    let request_id = record.request_id.clone().expect("request id");
    assert!(
        cloud.log(&name).contains(&request_id),
        "{}",
        cloud.log(&name)
    );

    let status = cloud.status(&name).await.expect("status");
    assert_eq!(status.resources[0].state, ResourceState::Running);
    assert_eq!(status.provider_id, created.provider_id);

    cloud.delete(&name).await.expect("delete");
    delete_nodes(&client, &[name]).await;
}

fn heartbeat(node: &Node) -> Option<jiff::Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
}

#[tokio::test]
async fn create_is_idempotent_survives_restarts_and_delete_cleans_up() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "life").await;
    let cloud = Cloud::on(&env, json!({}));
    let name = format!("{ns}-vm");

    let first = cloud.create(&name).await.expect("create");
    let second = cloud.create(&name).await.expect("create again");
    assert_eq!(first, second);
    let pid = cloud.pid(&name);
    assert_eq!(agent_processes(&name), [pid], "exactly one process");
    await_node_ready(&client, &name, &cloud).await;

    // A driver started afresh on the same state directory (controller restart) sees it.
    let restarted = LocalDriver::new(LocalDriverConfig {
        node_binary: node_binary(),
    });
    let listed = cloud.list_with(&restarted).await;
    assert_eq!(
        listed.machines,
        BTreeMap::from([(first.provider_id.clone(), name.clone())])
    );
    assert_eq!(
        listed.resources[&first.provider_id][0].state,
        ResourceState::Running
    );
    // Another class on the same state directory sees nothing.
    let mut other = cloud.class.clone();
    other.metadata.name = Some("other-class".into());
    let others = restarted
        .list_machines(mcm_driver::ListMachinesRequest {
            machine_class: other,
            secret: cloud.secret.clone(),
            request_id: RequestId::generate(),
        })
        .await
        .expect("list");
    assert!(others.machines.is_empty());

    // Delete through the restarted driver: process, record and working dir go.
    let work_dir = cloud.state().work_dir(&name);
    restarted
        .delete_machine(mcm_driver::DeleteMachineRequest {
            machine: machine(&name),
            machine_class: cloud.class.clone(),
            secret: cloud.secret.clone(),
            request_id: RequestId::generate(),
        })
        .await
        .expect("delete");
    assert!(agent_processes(&name).is_empty(), "the process is gone");
    assert_eq!(cloud.state().read(&name).expect("read"), None);
    assert!(!work_dir.exists());
    assert!(cloud.list().await.machines.is_empty());
    let err = cloud.status(&name).await.expect_err("no VM");
    assert_eq!(err.code, Code::NotFound);
    // Delete again: success.
    cloud.delete(&name).await.expect("delete again");
    // SIGTERM does not delete the Node: that is the controller's job.
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(nodes.get_opt(&name).await.expect("get").is_some());
    delete_nodes(&client, &[name]).await;
}

#[tokio::test]
async fn deployment_pods_run_on_the_vm_and_evictions_complete() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "pods").await;
    let cloud = Cloud::on(
        &env,
        json!({"taints": [{"key": "dedicated", "value": "pods-test", "effect": "NoSchedule"}]}),
    );
    let name = format!("{ns}-vm");
    cloud.create(&name).await.expect("create");
    await_node_ready(&client, &name, &cloud).await;

    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": name},
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "pods-test", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 1,
                    "initContainers": [{"name": "init", "image": "busybox"}],
                    "containers": [{"name": "web", "image": "nginx"}, {"name": "sidecar", "image": "busybox"}]
                }
            }
        }
    }))
    .expect("a deployment");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");
    await_object(
        deployments.clone(),
        "web",
        WAIT,
        "the Deployment to be available",
        conditions::is_deployment_completed(),
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let list = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list pods");
    assert_eq!(list.items.len(), 2);
    for pod in &list.items {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some(name.as_str()));
        let status = pod.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        assert!(ready, "{status:?}");
    }

    // Evict one: the agent deletes it after its 1s grace period.
    let victim = &list.items[0];
    let victim_name = victim.metadata.name.clone().expect("name");
    let uid = victim.metadata.uid.clone().expect("uid");
    pods.evict(&victim_name, &EvictParams::default())
        .await
        .expect("evict");
    await_object(
        pods.clone(),
        &victim_name,
        WAIT,
        "the evicted Pod to disappear",
        conditions::is_deleted(&uid),
    )
    .await;

    deployments
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete deployment");
    cloud.delete(&name).await.expect("delete");
    delete_nodes(&client, &[name]).await;
}

#[tokio::test]
async fn volumes_of_pvc_pods_are_reported_attached_until_the_pod_goes() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "vols").await;
    let cloud = Cloud::on(&env, json!({}));
    let name = format!("{ns}-vm");
    cloud.create(&name).await.expect("create");
    await_node_ready(&client, &name, &cloud).await;

    // A CSI volume and a hostPath volume, pre-bound to their claims.
    let pv_csi = format!("{ns}-csi");
    let pv_host = format!("{ns}-host");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for (pv, source) in [
        (
            &pv_csi,
            json!({"csi": {"driver": "fake.csi.local", "volumeHandle": format!("vol-{ns}")}}),
        ),
        (
            &pv_host,
            json!({"hostPath": {"path": format!("/tmp/{ns}")}}),
        ),
    ] {
        let claim = format!("claim-{pv}");
        let mut spec = json!({
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": ns, "name": claim},
        });
        spec.as_object_mut()
            .expect("object")
            .extend(source.as_object().expect("object").clone());
        let pv_obj: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": pv}, "spec": spec})).expect("pv");
        pvs.create(&PostParams::default(), &pv_obj)
            .await
            .expect("create pv");
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": claim},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "",
                "volumeName": pv,
            }
        }))
        .expect("pvc");
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &pvc)
            .await
            .expect("create pvc");
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "nodeName": name,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "db", "image": "postgres"}],
            "volumes": [
                {"name": "a", "persistentVolumeClaim": {"claimName": format!("claim-{pv_csi}")}},
                {"name": "b", "persistentVolumeClaim": {"claimName": format!("claim-{pv_host}")}},
            ]
        }
    }))
    .expect("pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");

    let want = vec![
        format!("kubernetes.io/csi/fake.csi.local^vol-{ns}"),
        format!("local/{pv_host}"),
    ];
    let attached = |n: &Node| -> (Vec<String>, Vec<String>) {
        let s = n.status.clone().unwrap_or_default();
        let mut a: Vec<String> = s
            .volumes_attached
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect();
        let mut u = s.volumes_in_use.unwrap_or_default();
        a.sort();
        u.sort();
        (a, u)
    };
    await_node(
        &client,
        &name,
        "volumesAttached to list both volumes",
        |n| n.is_some_and(|n| attached(n) == (want.clone(), want.clone())),
    )
    .await;

    // get_volume_ids maps the PV specs to the cloud's ids.
    let specs = [
        pvs.get(&pv_csi).await.expect("pv"),
        pvs.get(&pv_host).await.expect("pv"),
    ]
    .into_iter()
    .filter_map(|pv| pv.spec)
    .collect();
    let ids = cloud
        .driver
        .get_volume_ids(GetVolumeIdsRequest {
            pv_specs: specs,
            request_id: RequestId::generate(),
        })
        .await
        .expect("volume ids");
    assert_eq!(ids.volume_ids, [format!("vol-{ns}"), format!("/tmp/{ns}")]);

    // The last pod using them goes: so do the entries.
    pods.delete("db", &DeleteParams::default())
        .await
        .expect("delete pod");
    await_object(
        pods.clone(),
        "db",
        WAIT,
        "the Pod to go",
        conditions::is_deleted(created.metadata.uid.as_deref().unwrap_or_default()),
    )
    .await;
    await_node(&client, &name, "volumesAttached to be empty", |n| {
        n.is_some_and(|n| attached(n) == (vec![], vec![]))
    })
    .await;

    cloud.delete(&name).await.expect("delete");
    for pv in [pv_csi, pv_host] {
        let _ = pvs.delete(&pv, &DeleteParams::default()).await;
    }
    delete_nodes(&client, &[name]).await;
}

#[tokio::test]
async fn a_killed_vm_makes_its_node_not_ready_and_reports_stopped() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "kill").await;
    let cloud = Cloud::on(&env, json!({}));
    let name = format!("{ns}-vm");
    let created = cloud.create(&name).await.expect("create");
    await_node_ready(&client, &name, &cloud).await;

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cloud.pid(&name)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9");
    cloud.await_stopped(&name, Duration::from_secs(10)).await;
    let status = cloud
        .status(&name)
        .await
        .expect("a crashed VM still exists");
    assert_eq!(status.resources[0].state, ResourceState::Stopped);
    let listed = cloud.list().await;
    assert_eq!(
        listed.resources[&created.provider_id][0].state,
        ResourceState::Stopped,
        "list includes the crashed VM"
    );

    // The node lifecycle controller (grace period 10s) notices the missing heartbeats.
    let node = await_node(&client, &name, "the Node to become NotReady/Unknown", |n| {
        n.is_some_and(|n| !is_ready(n))
    })
    .await
    .expect("node");
    let ready = ready_status(&node);
    assert!(
        matches!(ready.as_deref(), Some("Unknown" | "False")),
        "{ready:?}"
    );

    cloud.delete(&name).await.expect("delete a crashed VM");
    assert!(cloud.list().await.machines.is_empty());
    delete_nodes(&client, &[name]).await;
}

#[tokio::test]
async fn invalid_specs_and_secrets_are_invalid_arguments() {
    let cloud = Cloud::new(
        "apiVersion: v1\nkind: Config\n",
        json!({"capacity": {"cpu": "abc"}, "bootDelya": "1s", "heartbeatInterval": "soon"}),
        None,
    );
    let err = cloud.create("vm-invalid").await.expect_err("invalid spec");
    assert_eq!(err.code, Code::InvalidArgument);
    for field in [
        "providerSpec.capacity.cpu",
        "providerSpec.bootDelya",
        "providerSpec.heartbeatInterval",
    ] {
        assert!(err.message.contains(field), "{field} in {}", err.message);
    }
    assert!(
        err.message
            .contains(r#"providerSpec.capacity.cpu: "abc" is not a quantity"#),
        "{}",
        err.message
    );
    let err = parse_provider_spec(&cloud.class).expect_err("invalid");
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(
        cloud.state().list().expect("list").0.is_empty(),
        "nothing was created"
    );

    // Unknown key alone.
    let mut class = cloud.class.clone();
    class.provider_spec = json!({"capacity": {"gpu": "1"}});
    let err = parse_provider_spec(&class).expect_err("unknown key");
    assert!(
        err.message.contains("providerSpec.capacity.gpu"),
        "{}",
        err.message
    );

    // A secret without the kubeconfig key.
    let mut no_kubeconfig = Cloud::new("x", json!({}), Some("#cloud-config"));
    no_kubeconfig.secret.0.remove("kubeconfig");
    let err = no_kubeconfig
        .create("vm-nokc")
        .await
        .expect_err("no kubeconfig");
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("\"kubeconfig\""), "{}", err.message);

    // A machine name that is no DNS subdomain.
    let ok = Cloud::new("x", json!({}), None);
    let err = ok.create("../escape").await.expect_err("bad name");
    assert_eq!(err.code, Code::InvalidArgument);
}

/// A bootstrap token `(id, secret)` of random characters.
fn new_token() -> (String, String) {
    let hex = RequestId::generate().to_string();
    (hex[..6].to_string(), hex[6..22].to_string())
}

async fn create_token_secret(client: &kube::Client, id: &str, secret: &str, expires_in: i64) {
    let expiration = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(expires_in))
        .expect("a time");
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": secret,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "expiration": expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &s)
        .await
        .expect("create the token secret");
}

#[tokio::test]
async fn bootstrap_tokens_gate_the_boot() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "boot").await;
    let kubeconfig = kubeconfig_text(&env);
    let nodes: Api<Node> = Api::all(client.clone());

    let (id, secret) = new_token();
    create_token_secret(&client, &id, &secret, 3600).await;
    let (old_id, old_secret) = new_token();
    create_token_secret(&client, &old_id, &old_secret, -3600).await;

    let user_data = |token: &str| format!("#cloud-config\nbootstrapToken: {token}\nfoo: bar\n");
    let cases = [
        (
            "valid",
            user_data(&format!("{id}.{secret}")),
            true,
            "bootstrap token accepted",
        ),
        (
            "wrong",
            user_data(&format!("{id}.0000000000000000")),
            false,
            "401",
        ),
        (
            "expired",
            user_data(&format!("{old_id}.{old_secret}")),
            false,
            "401",
        ),
        (
            "placeholder",
            user_data("<<BOOTSTRAP_TOKEN>>"),
            false,
            "<<BOOTSTRAP_TOKEN>>",
        ),
    ];
    let mut clouds = Vec::new();
    for (case, ud, _, _) in &cases {
        let cloud = Cloud::new(&kubeconfig, json!({}), Some(ud));
        let name = format!("{ns}-{case}");
        cloud.create(&name).await.expect("create");
        clouds.push((cloud, name));
    }
    for ((case, _, boots, log_line), (cloud, name)) in cases.iter().zip(&clouds) {
        if *boots {
            await_node_ready(&client, name, cloud).await;
        } else {
            cloud.await_stopped(name, WAIT).await;
            let log = cloud.log(name);
            assert!(log.contains(log_line), "{case}: {log}");
            assert!(log.contains("local-node failed"), "{case}: {log}");
            assert!(
                nodes.get_opt(name).await.expect("get").is_none(),
                "{case}: no Node"
            );
        }
        assert!(
            cloud.log(name).contains(&id) || !boots,
            "the token id is logged"
        );
    }
    for (cloud, name) in &clouds {
        cloud.delete(name).await.expect("delete");
    }
    delete_nodes(&client, &[clouds[0].1.clone()]).await;
}

/// The API server authenticates bootstrap tokens from its informer cache of Secrets, which
/// can lag behind a token created just before the VM booted: a VM whose token is rejected at
/// first and accepted a moment later boots.
#[tokio::test]
async fn a_token_the_api_server_knows_only_after_the_first_check_still_boots() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "late").await;
    let (id, secret) = new_token();
    let user_data = format!("#cloud-config\nbootstrapToken: {id}.{secret}\n");
    let cloud = Cloud::new(&kubeconfig_text(&env), json!({}), Some(&user_data));
    let name = format!("{ns}-late");
    cloud.create(&name).await.expect("create");
    // The VM has been turned away once (and tries again) before its token exists.
    mcm_testenv::kit::eventually(WAIT, "the first check to be rejected", || async {
        let log = cloud.log(&name);
        assert!(!log.contains("local-node failed"), "the boot failed: {log}");
        log.contains("401") && log.contains("retrying")
    })
    .await;
    create_token_secret(&client, &id, &secret, 3600).await;
    await_node_ready(&client, &name, &cloud).await;
    assert!(cloud.log(&name).contains("bootstrap token accepted"));
    cloud.delete(&name).await.expect("delete");
    delete_nodes(&client, std::slice::from_ref(&name)).await;
}

#[tokio::test]
async fn fail_to_boot_and_crash_after_behave_as_documented() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "fault").await;
    let nodes: Api<Node> = Api::all(client.clone());

    // failToBoot: the VM exists (create succeeds) but its process exits before registering.
    let broken = Cloud::on(&env, json!({"failToBoot": true}));
    let broken_name = format!("{ns}-broken");
    broken.create(&broken_name).await.expect("create");
    broken.await_stopped(&broken_name, WAIT).await;
    assert!(broken.log(&broken_name).contains("failToBoot"));
    assert!(nodes.get_opt(&broken_name).await.expect("get").is_none());
    broken.delete(&broken_name).await.expect("delete");

    // crashAfter: the Node registers, then the process dies abruptly.
    let crashing = Cloud::on(&env, json!({"crashAfter": "4s", "bootDelay": "500ms"}));
    let name = format!("{ns}-crashing");
    crashing.create(&name).await.expect("create");
    await_node_ready(&client, &name, &crashing).await;
    crashing.await_stopped(&name, Duration::from_secs(20)).await;
    assert!(
        crashing.log(&name).contains("crashAfter elapsed"),
        "{}",
        crashing.log(&name)
    );
    let status = crashing.status(&name).await.expect("status");
    assert_eq!(status.resources[0].state, ResourceState::Stopped);
    crashing.delete(&name).await.expect("delete");
    delete_nodes(&client, &[name]).await;
}

/// A create that died between recording the VM and recording its process (the record is
/// written first, with pid 0): status reports no VM, list still shows it, the next create
/// stops the unrecorded process and launches one on record, and a delete of such a record
/// stops the process too. No process is ever left without a record.
#[tokio::test]
async fn an_interrupted_launch_leaves_no_unrecorded_process() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "launch").await;
    let cloud = Cloud::on(&env, json!({}));
    let name = format!("{ns}-vm");
    let interrupt = |cloud: &Cloud| {
        let mut record = cloud.state().read(&name).expect("read").expect("a record");
        record.pid = 0;
        record.start_time = 0;
        cloud.state().write(&record).expect("write");
        assert!(record.launch_pending());
    };

    cloud.create(&name).await.expect("create");
    let first = cloud.pid(&name);
    interrupt(&cloud);
    assert_eq!(
        agent_processes(&name),
        [first],
        "the process runs unrecorded"
    );
    let err = cloud.status(&name).await.expect_err("no finished VM");
    assert_eq!(err.code, Code::NotFound);
    let listed = cloud.list().await;
    assert_eq!(
        listed.resources[&mcm_provider_local::state::provider_id(&name)][0].state,
        ResourceState::Stopped,
        "the orphan collector still sees it"
    );

    cloud
        .create(&name)
        .await
        .expect("create finishes the launch");
    let second = cloud.pid(&name);
    assert_ne!(second, first);
    assert_eq!(
        agent_processes(&name),
        [second],
        "only the recorded process runs"
    );
    cloud.status(&name).await.expect("a VM now");

    interrupt(&cloud);
    cloud.delete(&name).await.expect("delete");
    assert!(
        agent_processes(&name).is_empty(),
        "the unrecorded process is stopped"
    );
    assert_eq!(cloud.state().read(&name).expect("read"), None);
    delete_nodes(&client, &[name]).await;
}
