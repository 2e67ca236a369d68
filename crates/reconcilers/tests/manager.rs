//! `run_manager`: readiness signal, metrics with MCM's names, clean shutdown.

mod common_manager;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common_manager::*;
use kube::api::PostParams;
use mcm_reconcilers::manager::{ManagerConfig, run_manager};
use mcm_testenv::kit::{MachineDeploymentBuilder, TestNamespace, eventually, within};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_after_sync_metrics_and_shutdown() {
    let TestNamespace { client, ns, .. } = TestNamespace::new(
        mcm_testenv::Components {
            controller_manager: true,
            scheduler: false,
        },
        "manager",
    )
    .await;
    let ready = Arc::new(AtomicBool::new(false));
    let config = ManagerConfig {
        namespace: ns.clone(),
        overshooting_period: Duration::from_millis(500),
        ready: ready.clone(),
        ..ManagerConfig::default()
    };
    let mut registry = Registry::default();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let manager = tokio::spawn(run_manager(
        client.clone(),
        client.clone(),
        config,
        &mut registry,
        async move {
            let _ = rx.await;
        },
    ));
    eventually(WAIT, "ready", || async { ready.load(Ordering::SeqCst) }).await;

    let deployments: kube::Api<mcm_api::MachineDeployment> =
        kube::Api::namespaced(client.clone(), &ns);
    deployments
        .create(
            &PostParams::default(),
            &MachineDeploymentBuilder::new("md")
                .replicas(2)
                .class("c1")
                .build(),
        )
        .await
        .expect("create");
    let sets: kube::Api<mcm_api::MachineSet> = kube::Api::namespaced(client.clone(), &ns);
    wait_list(sets, "a set with 2 replicas", |s| {
        s.first().is_some_and(|s| s.spec.replicas == Some(2))
    })
    .await;

    // The manager's own store may lag the test's watch a little (more so on a busy machine):
    // poll the scrape until it shows the set.
    let text = eventually(WAIT, "the set in the metrics", || {
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        async move { text.contains("mcm_machine_set_info{").then_some(text) }
    })
    .await;
    for name in [
        "mcm_machine_set_info{",
        "mcm_machine_set_info_spec_replicas{",
        "mcm_machine_set_status_replicas{",
        "mcm_machine_set_status_ready_replicas{",
        "mcm_machine_set_status_availabla_replicas{",
        "mcm_machine_deployment_info{",
        "mcm_machine_deployment_info_spec_replicas{",
        "mcm_machine_deployment_status_replicas{",
        "mcm_machine_deployment_status_available_replicas{",
        "mcm_machinedeployment_items_total 1",
    ] {
        assert!(text.contains(name), "metric {name} missing in:\n{text}");
    }
    assert!(text.contains(&format!("namespace=\"{ns}\"")));

    tx.send(()).expect("shutdown");
    within(WAIT, "shutdown", manager).await.expect("join");
    assert!(!ready.load(Ordering::SeqCst));
}
