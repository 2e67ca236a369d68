//! The test control plane itself, exercised against the real binaries: CRDs, CRUD and watch of
//! every kind, subresources, CEL validation, garbage collection, scheduling, and the promise
//! that no process outlives its owner.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::wait::await_condition;
use mcm_testenv::kit::{TestNamespace, eventually};
use mcm_testenv::{Components, ControlPlane, Options, process, shared};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("machine.sapcloud.io", "v1alpha1", kind),
        plural,
    )
}

fn dynamic(client: &kube::Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource(kind, plural))
}

fn object(kind: &str, name: &str, body: serde_json::Value) -> DynamicObject {
    let mut value = body;
    value["apiVersion"] = json!("machine.sapcloud.io/v1alpha1");
    value["kind"] = json!(kind);
    value["metadata"] = json!({ "name": name });
    serde_json::from_value(value).expect("a valid object")
}

fn machine_class() -> serde_json::Value {
    json!({
        "providerSpec": { "ami": "ami-123", "futureField": { "nested": [1, 2, 3] } },
        "secretRef": { "name": "cloud-secret" },
        "provider": "local",
    })
}

fn set_spec(replicas: i64) -> serde_json::Value {
    json!({
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": "worker" } },
            "template": {
                "metadata": { "labels": { "app": "worker" } },
                "spec": { "class": { "kind": "MachineClass", "name": "cls" } }
            }
        }
    })
}

#[tokio::test]
async fn version_is_the_tested_release() {
    let env = shared(Components::API_SERVER).await.unwrap();
    eprintln!(
        "control plane (etcd + kube-apiserver + CRDs) started in {:?}",
        env.startup_duration()
    );
    let client = env.client().await.unwrap();
    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.git_version, mcm_testenv::binaries::KUBERNETES_VERSION);
}

#[tokio::test]
async fn the_four_crds_are_established() {
    let env = shared(Components::API_SERVER).await.unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(env.client().await.unwrap());
    for plural in [
        "machines",
        "machineclasses",
        "machinesets",
        "machinedeployments",
    ] {
        let crd = api
            .get(&format!("{plural}.machine.sapcloud.io"))
            .await
            .unwrap();
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "{plural} not Established");
    }
}

#[tokio::test]
async fn every_kind_supports_create_get_list_watch_delete() {
    let TestNamespace { client, ns, .. } = TestNamespace::new(Components::API_SERVER, "crud").await;
    let kinds = [
        (
            "Machine",
            "machines",
            json!({ "spec": { "class": { "kind": "MachineClass", "name": "cls" } } }),
        ),
        ("MachineClass", "machineclasses", machine_class()),
        ("MachineSet", "machinesets", set_spec(1)),
        ("MachineDeployment", "machinedeployments", set_spec(1)),
    ];
    for (kind, plural, body) in kinds {
        let api = dynamic(&client, &ns, kind, plural);
        let list = api.list(&ListParams::default()).await.unwrap();
        let mut watch = api
            .watch(
                &WatchParams::default(),
                &list.metadata.resource_version.unwrap(),
            )
            .await
            .unwrap()
            .boxed();

        let created = api
            .create(&PostParams::default(), &object(kind, "one", body))
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));
        let got = api.get("one").await.unwrap();
        assert_eq!(got.metadata.uid, created.metadata.uid);
        let names: Vec<_> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect();
        assert_eq!(names, vec!["one".to_string()], "{kind}");

        match tokio::time::timeout(WAIT, watch.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(o)))) => {
                assert_eq!(o.metadata.name.as_deref(), Some("one"))
            }
            other => panic!("{kind}: expected an Added event, got {other:?}"),
        }

        api.delete("one", &DeleteParams::default()).await.unwrap();
        match tokio::time::timeout(WAIT, watch.try_next()).await {
            Ok(Ok(Some(WatchEvent::Deleted(o)))) => {
                assert_eq!(o.metadata.name.as_deref(), Some("one"))
            }
            other => panic!("{kind}: expected a Deleted event, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn unknown_provider_spec_fields_are_preserved_by_the_server() {
    let TestNamespace { client, ns, .. } =
        TestNamespace::new(Components::API_SERVER, "preserve").await;
    let api = dynamic(&client, &ns, "MachineClass", "machineclasses");
    api.create(
        &PostParams::default(),
        &object("MachineClass", "cls", machine_class()),
    )
    .await
    .unwrap();
    let got = api.get("cls").await.unwrap();
    assert_eq!(
        got.data["providerSpec"]["futureField"],
        json!({ "nested": [1, 2, 3] })
    );
}

#[tokio::test]
async fn status_and_scale_subresources_work() {
    let TestNamespace { client, ns, .. } =
        TestNamespace::new(Components::API_SERVER, "subresources").await;
    for (kind, plural) in [
        ("MachineSet", "machinesets"),
        ("MachineDeployment", "machinedeployments"),
    ] {
        let api = dynamic(&client, &ns, kind, plural);
        api.create(&PostParams::default(), &object(kind, "s", set_spec(2)))
            .await
            .unwrap();

        // The status subresource: a status patch lands; a main-resource write ignores status.
        let pp = PatchParams::default();
        api.patch_status(
            "s",
            &pp,
            &Patch::Merge(json!({ "status": { "replicas": 2, "readyReplicas": 1 } })),
        )
        .await
        .unwrap();
        api.patch(
            "s",
            &pp,
            &Patch::Merge(json!({ "status": { "replicas": 99 } })),
        )
        .await
        .unwrap();
        let got = api.get("s").await.unwrap();
        assert_eq!(got.data["status"]["replicas"], json!(2), "{kind}");

        // The scale subresource reads spec.replicas/status.replicas and writes spec.replicas.
        let scale = api.get_scale("s").await.unwrap();
        assert_eq!(scale.spec.and_then(|s| s.replicas), Some(2), "{kind}");
        assert_eq!(scale.status.map(|s| s.replicas), Some(2), "{kind}");
        api.patch_scale(
            "s",
            &pp,
            &Patch::Merge(json!({ "spec": { "replicas": 5 } })),
        )
        .await
        .unwrap();
        let got = api.get("s").await.unwrap();
        assert_eq!(got.data["spec"]["replicas"], json!(5), "{kind}");
    }

    // Machines have a status subresource too.
    let api = dynamic(&client, &ns, "Machine", "machines");
    api.create(
        &PostParams::default(),
        &object(
            "Machine",
            "m",
            json!({ "spec": { "class": { "kind": "MachineClass", "name": "c" } } }),
        ),
    )
    .await
    .unwrap();
    api.patch_status(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "currentStatus": { "phase": "Pending" } } })),
    )
    .await
    .unwrap();
    let got = api.get("m").await.unwrap();
    assert_eq!(
        got.data["status"]["currentStatus"]["phase"],
        json!("Pending")
    );
}

#[tokio::test]
async fn cel_rules_reject_what_users_get_wrong_with_readable_messages() {
    let TestNamespace { client, ns, .. } = TestNamespace::new(Components::API_SERVER, "cel").await;
    let mds = dynamic(&client, &ns, "MachineDeployment", "machinedeployments");

    let mut mismatched = set_spec(1);
    mismatched["spec"]["template"]["metadata"]["labels"] = json!({ "app": "other" });
    let mut negative = set_spec(1);
    negative["spec"]["replicas"] = json!(-1);
    let mut both_zero = set_spec(1);
    both_zero["spec"]["strategy"] = json!({
        "type": "RollingUpdate",
        "rollingUpdate": { "maxSurge": 0, "maxUnavailable": "0%" }
    });

    for (case, body, expected) in [
        ("selector mismatch", mismatched.clone(), "selector"),
        ("negative replicas", negative.clone(), "replicas"),
        (
            "maxSurge and maxUnavailable both zero",
            both_zero,
            "maxSurge",
        ),
    ] {
        let err = mds
            .create(
                &PostParams::default(),
                &object("MachineDeployment", "bad", body),
            )
            .await
            .expect_err(case);
        match err {
            kube::Error::Api(status) => {
                assert_eq!(status.code, 422, "{case}: {status:?}");
                assert!(
                    status.message.contains(expected),
                    "{case}: message does not explain the problem: {}",
                    status.message
                );
            }
            other => panic!("{case}: expected a validation error, got {other:?}"),
        }
    }

    // The same rules hold for MachineSets.
    let sets = dynamic(&client, &ns, "MachineSet", "machinesets");
    for (case, body) in [
        ("selector mismatch", mismatched),
        ("negative replicas", negative),
    ] {
        let err = sets
            .create(&PostParams::default(), &object("MachineSet", "bad", body))
            .await
            .expect_err(case);
        assert!(
            matches!(err, kube::Error::Api(ref s) if s.code == 422),
            "{case}: {err:?}"
        );
    }
}

#[tokio::test]
async fn owner_reference_garbage_collection_deletes_the_child() {
    let TestNamespace { client, ns, .. } = TestNamespace::new(
        Components {
            controller_manager: true,
            scheduler: false,
        },
        "gc",
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    let owner = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "owner" } })).unwrap(),
        )
        .await
        .unwrap();
    let child: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "child",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner.metadata.uid.unwrap()
            }]
        }
    }))
    .unwrap();
    cms.create(&PostParams::default(), &child).await.unwrap();
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(cms.clone(), "child", |o: Option<&ConfigMap>| o.is_none()),
    )
    .await
    .expect("the garbage collector did not delete the child")
    .unwrap();
}

#[tokio::test]
async fn a_pod_gets_scheduled_to_a_ready_node() {
    let TestNamespace { client, ns, .. } = TestNamespace::new(Components::ALL, "sched").await;
    let node_name = format!("node-{ns}");
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": node_name, "labels": { "kubernetes.io/hostname": node_name } },
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let now = jiff::Timestamp::now().to_string();
    nodes
        .patch_status(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "capacity": { "cpu": "4", "memory": "8Gi", "pods": "110" },
                "allocatable": { "cpu": "4", "memory": "8Gi", "pods": "110" },
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": now, "lastTransitionTime": now
                }]
            }})),
        )
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "p" },
        "spec": {
            "nodeSelector": { "kubernetes.io/hostname": node_name },
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{ "name": "c", "image": "example.invalid/none" }]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let scheduled = tokio::time::timeout(
        WAIT,
        await_condition(pods.clone(), "p", |p: Option<&Pod>| {
            p.and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.as_ref())
                .is_some()
        }),
    )
    .await
    .expect("the scheduler did not bind the pod")
    .unwrap()
    .unwrap();
    assert_eq!(
        scheduled.spec.unwrap().node_name.as_deref(),
        Some(node_name.as_str())
    );
    nodes
        .delete(&node_name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn dropping_a_control_plane_kills_its_processes_and_removes_its_files() {
    let cp = ControlPlane::start(Options {
        components: Components::API_SERVER,
        install_crds: false,
        ..Options::default()
    })
    .await
    .unwrap();
    let run_dir = cp.run_dir().to_path_buf();
    let groups = std::fs::read_to_string(run_dir.join("process-groups")).unwrap();
    let pids: Vec<u32> = groups.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver");
    assert!(pids.iter().all(|p| process::process_alive(*p)));
    drop(cp);
    wait_until_gone(&pids).await;
    assert!(!run_dir.exists());
}

/// Not run on its own: started as a child process by the next test, it starts a control
/// plane, prints the pids and aborts, as a crashing test would.
#[tokio::test]
#[ignore = "helper process for control_plane_dies_with_the_test_process"]
async fn helper_start_then_abort() {
    if std::env::var_os("MCM_TESTENV_ABORT_HELPER").is_none() {
        return;
    }
    let cp = ControlPlane::start(Options {
        install_crds: false,
        ..Options::default()
    })
    .await
    .unwrap();
    let groups = std::fs::read_to_string(cp.run_dir().join("process-groups")).unwrap();
    println!(
        "PIDS {}",
        groups.split_whitespace().collect::<Vec<_>>().join(",")
    );
    std::process::abort();
}

#[tokio::test]
async fn control_plane_dies_with_the_test_process() {
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_start_then_abort",
            "--ignored",
            "--nocapture",
        ])
        .env("MCM_TESTENV_ABORT_HELPER", "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pids: Vec<u32> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PIDS "))
        .unwrap_or_else(|| {
            panic!(
                "the helper printed no pids: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(!out.status.success(), "the helper was meant to abort");
    wait_until_gone(&pids).await;
}

async fn wait_until_gone(pids: &[u32]) {
    eventually(
        Duration::from_secs(10),
        &format!("processes {pids:?} to die with their control plane"),
        || async {
            let alive: Vec<&u32> = pids
                .iter()
                .filter(|p| process::process_alive(**p))
                .collect();
            if alive.is_empty() { Ok(()) } else { Err(alive) }
        },
    )
    .await;
}
