//! `--target-kubeconfig=none`: the machine controller without a target cluster. Machines are
//! `Available` with the driver's addresses, no Node is expected, no bootstrap token is made,
//! deletion deletes the VM without a drain, and the target cluster is never asked.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use mcm_api::MachinePhase;
use mcm_testenv::kit::events_for;
use serde_json::json;

#[tokio::test]
async fn machines_are_available_without_a_target_cluster() {
    let h = Harness::new("no-target", json!({})).await;
    let mc = h.spawn_controller("mc", &["--target-kubeconfig=none".into()]);
    h.create_machine("m1", "local").await;

    let m = h.await_phase("m1", MachinePhase::Available, WAIT).await;
    assert_eq!(m.spec.provider_id.as_deref(), Some("local:///m1"));
    assert!(
        !m.labels().contains_key("node"),
        "no node label: {:?}",
        m.labels()
    );
    let addresses: Vec<(String, String)> = m
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("Hostname".into(), "m1".into()))
            && addresses.contains(&("InternalIP".into(), "127.0.0.1".into())),
        "{addresses:?}"
    );
    let current = m
        .status
        .as_ref()
        .and_then(|s| s.current_status.as_ref())
        .unwrap();
    assert_eq!(current.timeout_active, Some(false));
    let op = m
        .status
        .as_ref()
        .and_then(|s| s.last_operation.clone())
        .unwrap();
    assert_eq!(
        op.description.as_deref(),
        Some("Created machine on cloud provider")
    );
    let notes = events_for(&h.client, &h.ns, "m1", "Available").await;
    assert!(
        notes.iter().any(|n| n.contains("--target-kubeconfig=none")),
        "{notes:?}"
    );
    // No bootstrap token: there is no cluster to join.
    let tokens: Api<Secret> = Api::namespaced(h.client.clone(), "kube-system");
    let token_id = mcm_reconcilers::bootstrap_token::token_id(&h.ns, "m1");
    let name = mcm_reconcilers::bootstrap_token::secret_name(&token_id);
    assert!(
        tokens.get_opt(&name).await.unwrap().is_none(),
        "no token {name}"
    );

    // Deletion: the VM goes, the finalizer goes.
    h.delete_machine("m1").await;
    h.await_gone("m1", WAIT).await;
    assert!(h.vm_records().is_empty(), "VM left: {:?}", h.vm_records());
    // The target cluster was never asked.
    let text = mc.metrics().await;
    assert!(!text.contains("cluster=\"target\""), "{text}");
}
