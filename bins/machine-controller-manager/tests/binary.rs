//! The manager binary: Gardener's flags, endpoints, and a MachineDeployment reconciled by the
//! process against the real control plane.

use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use mcm_api::{MachineDeployment, MachineSet};
use mcm_testenv::Components;
use mcm_testenv::kit::{
    MachineDeploymentBuilder, TestNamespace, eventually, free_port, http_get, within,
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_machine-controller-manager");

#[test]
fn help_lists_every_gardener_flag() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "port",
        "address",
        "cloud-provider",
        "concurrent-syncs",
        "min-resync-period",
        "profiling",
        "contention-profiling",
        "target-kubeconfig",
        "control-kubeconfig",
        "namespace",
        "kube-api-content-type",
        "kube-api-qps",
        "kube-api-burst",
        "controller-start-interval",
        "safety-up",
        "safety-down",
        "machine-safety-overshooting-period",
        "autoscaler-scaledown-annotation-during-rollout",
        "v",
        "leader-elect",
        "leader-elect-lease-duration",
        "leader-elect-renew-deadline",
        "leader-elect-retry-period",
        "leader-elect-resource-lock",
    ] {
        assert!(
            help.contains(&format!("--{flag}")),
            "--{flag} missing from --help:\n{help}"
        );
    }
}

#[test]
fn a_bad_kubeconfig_is_a_readable_error() {
    let out = std::process::Command::new(BIN)
        .args([
            "--target-kubeconfig=/nonexistent/kubeconfig",
            "--leader-elect=false",
            "--port=0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}

#[tokio::test]
async fn the_process_reconciles_a_deployment_and_serves_its_endpoints() {
    reconciles_a_deployment("mcm-bin", false).await;
}

/// `--target-kubeconfig=none`: the manager runs on the control cluster alone and never asks
/// a target cluster.
#[tokio::test]
async fn the_process_runs_without_a_target_cluster() {
    let metrics = reconciles_a_deployment("mcm-bin-none", true).await;
    assert!(!metrics.contains("cluster=\"target\""), "{metrics}");
}

/// Runs the binary, creates a deployment, waits for its set and 2 machines, checks the
/// endpoints; returns the metrics text.
async fn reconciles_a_deployment(prefix: &str, no_target: bool) -> String {
    let TestNamespace { env, client, ns } = TestNamespace::new(
        Components {
            controller_manager: true,
            scheduler: false,
        },
        prefix,
    )
    .await;
    let kc = env.kubeconfig_path().display().to_string();
    let port = free_port();
    let target = if no_target {
        "none".to_string()
    } else {
        kc.clone()
    };
    let _child = tokio::process::Command::new(BIN)
        .args([
            format!("--control-kubeconfig={kc}"),
            format!("--target-kubeconfig={target}"),
            format!("--namespace={ns}"),
            format!("--port={port}"),
            "--address=127.0.0.1".into(),
            "--leader-elect=false".into(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let md = MachineDeploymentBuilder::new("workers")
        .replicas(2)
        .class("any")
        .match_label("pool", "workers")
        .build();
    Api::<MachineDeployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &md)
        .await
        .unwrap();
    // The process creates the MachineSet and its Machines (no machine controller here, so
    // they stay without a phase).
    let sets: Api<MachineSet> = Api::namespaced(client.clone(), &ns);
    let bound = Duration::from_secs(60);
    within(
        bound,
        "the manager process to create a MachineSet with 2 machines",
        async {
            let name = eventually(bound, "a MachineSet", || async {
                let list = sets.list(&Default::default()).await.unwrap();
                list.items.first().map(|s| s.metadata.name.clone().unwrap())
            })
            .await;
            await_condition(sets.clone(), &name, |s: Option<&MachineSet>| {
                s.and_then(|s| s.status.as_ref()).and_then(|s| s.replicas) == Some(2)
            })
            .await
            .unwrap();
        },
    )
    .await;

    let healthz = http_get(port, "/healthz").await.unwrap_or_default();
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    let readyz = http_get(port, "/readyz").await.unwrap_or_default();
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
    let metrics = http_get(port, "/metrics").await.unwrap_or_default();
    assert!(metrics.contains("mcm_machine_deployment_"), "{metrics}");
    assert!(metrics.contains("mcm_machine_set_"), "{metrics}");
    for controller in ["machineset", "machinedeployment"] {
        let line = format!(
            "mcm_controller_reconcile_duration_seconds_count{{controller=\"{controller}\"}}"
        );
        assert!(metrics.contains(&line), "no {line} in {metrics}");
    }
    metrics
}

/// The manifests in deploy/ are accepted by a real API server (server-side dry run).
#[tokio::test]
async fn deploy_manifests_are_valid() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::{ApiResource, Discovery, Scope};
    let env = mcm_testenv::shared(Components::API_SERVER).await.unwrap();
    let client = env.client().await.unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({ "metadata": { "name": "machines" } })).unwrap();
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut applied = 0;
    for file in ["rbac.yaml", "machine-controller-manager.yaml"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let obj: DynamicObject = serde_json::from_value(doc).unwrap();
            let types = obj.types.clone().expect("apiVersion and kind");
            let gvk = kube::api::GroupVersionKind::try_from(&types).unwrap();
            let (ar, caps): (ApiResource, _) = discovery.resolve_gvk(&gvk).expect("a known kind");
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => Api::namespaced_with(
                    client.clone(),
                    obj.metadata.namespace.as_deref().unwrap_or("default"),
                    &ar,
                ),
                Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            let name = obj.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("deploy-test").dry_run(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("{file}: {} {name} rejected: {e}", gvk.kind));
            applied += 1;
        }
    }
    assert_eq!(applied, 6, "every manifest was checked");
}
