//! Deletion in the unhappy cases a new user hits: a class that never worked, a class that does
//! not exist, a class broken while a VM exists, and a node whose kubelet died.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::PostParams;
use mcm_api::constants::annotations::progress;
use mcm_api::{Machine, MachinePhase};
use mcm_testenv::kit::{await_event, eventually, metric_with, node_events_for};
use serde_json::json;

fn annotation<'a>(m: &'a Machine, key: &str) -> Option<&'a str> {
    m.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn description(m: &Machine) -> String {
    m.status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_machine_of_an_invalid_class_never_got_a_vm_and_is_deleted() {
    let h = Harness::new("del-invalid", json!({})).await;
    h.create_class(
        "bad",
        json!({ "capacity": { "cpu": "abc" } }),
        "local-secret",
    )
    .await;
    let _mc = h.spawn_controller("mc", &[]);
    h.create_machine("b1", "bad").await;
    let m = h
        .await_description("b1", WAIT, "the invalid class to be reported", |d| {
            d.contains("providerSpec.capacity.cpu")
        })
        .await;
    assert_eq!(m.phase(), Some(&MachinePhase::CrashLoopBackOff));
    // The driver refused the request: no VM was requested, and the record says so.
    assert_eq!(annotation(&m, progress::VM_REQUESTED), None);
    assert!(h.vm_records().is_empty());

    h.delete_machine("b1").await;
    h.await_gone("b1", WAIT).await;
    assert!(h.vm_records().is_empty());
    let text = "no VM was ever requested";
    await_event(&h.client, &h.ns, "b1", "Deleted", text, WAIT).await;
}

#[tokio::test]
async fn a_machine_whose_class_does_not_exist_is_deleted() {
    let h = Harness::new("del-noclass", json!({})).await;
    // Both halves in one process: one set of reconcile metrics for all controllers.
    let mc = h.spawn_controller("mc", &["--controllers=machine,manager".to_string()]);
    h.create_machine("n1", "does-not-exist").await;
    h.await_description("n1", WAIT, "the missing class to be reported", |d| {
        d.contains("cannot use the machine class") && d.contains("does-not-exist")
    })
    .await;

    h.delete_machine("n1").await;
    h.await_gone("n1", WAIT).await;
    assert!(h.vm_records().is_empty());
    let metrics = mc.metrics().await;
    let help = "# HELP mcm_controller_reconcile_duration_seconds ";
    assert_eq!(metrics.matches(help).count(), 1, "{metrics}");
    assert!(
        metric_with(
            &metrics,
            "mcm_controller_reconcile_duration_seconds_count",
            "controller=\"machine\""
        ) > 0.0
    );
}

#[tokio::test]
async fn a_vm_that_may_exist_blocks_deletion_until_the_class_is_fixed() {
    let h = Harness::new("del-blocked", json!({})).await;
    let _mc = h.spawn_controller("mc", &[]);
    h.create_machine("v1", "local").await;
    let running = h.await_phase("v1", MachinePhase::Running, WAIT).await;
    let provider_id = running.spec.provider_id.clone().unwrap();
    assert!(annotation(&running, progress::VM_REQUESTED).is_some());

    // The class breaks while the VM runs; then the Machine is deleted.
    let good = h.classes().get("local").await.unwrap();
    let mut broken = good.clone();
    broken.provider_spec["capacity"] = json!({ "cpu": "abc" });
    h.classes()
        .replace("local", &PostParams::default(), &broken)
        .await
        .unwrap();
    h.delete_machine("v1").await;
    let m = h
        .await_description("v1", WAIT, "the blocked deletion to be reported", |d| {
            d.contains("may still exist and cannot be deleted")
        })
        .await;
    let d = description(&m);
    assert!(d.contains(&provider_id), "{d}");
    assert!(d.contains("providerSpec.capacity.cpu"), "{d}");
    assert!(d.contains("until the class is fixed"), "{d}");
    assert!(
        m.finalizers()
            .iter()
            .any(|f| f == mcm_api::constants::finalizers::MACHINE_CONTROLLER_MANAGER),
        "the finalizer stays while the VM may exist"
    );
    assert!(h.vm_alive("v1"), "the VM is neither leaked nor deleted");
    let events = await_event(&h.client, &h.ns, "v1", "DeletionBlocked", "", WAIT).await;
    assert_eq!(events.len(), 1, "one Event, not one per retry: {events:?}");

    // Fixed: the deletion finishes.
    let mut fixed = h.classes().get("local").await.unwrap();
    fixed.provider_spec = good.provider_spec.clone();
    h.classes()
        .replace("local", &PostParams::default(), &fixed)
        .await
        .unwrap();
    h.await_gone("v1", WAIT).await;
    assert!(h.vm_records().is_empty());
    assert!(h.nodes().get_opt("v1").await.unwrap().is_none());
}

/// Kills the VM of machine `m` (or partitions it, `stop`) with a pod on its Node, waits for the Node to be
/// unreachable and deletes the machine; returns the harness and the pods' API once the
/// machine is gone. Node names are cluster-wide: each test names its machine apart.
async fn delete_unreachable(
    prefix: &str,
    m: &str,
    stop: bool,
) -> (Harness, kube::Api<k8s_openapi::api::core::v1::Pod>) {
    let h = Harness::new(prefix, json!({})).await;
    // Neither the drain timeout nor MCM's 5-minute NotReady rule can end this drain within
    // the test's wait: only the unreachable-node rule can.
    let _mc = h.spawn_controller(
        "mc",
        &[
            "--machine-drain-timeout=10m".to_string(),
            "--machine-health-timeout=10m".to_string(),
        ],
    );
    h.create_machine(m, "local").await;
    h.await_phase(m, MachinePhase::Running, WAIT).await;
    let pods = h.run_pod("web", m, 30).await;

    // The VM crashes, or is cut off; the node lifecycle controller marks the node Unknown.
    if stop {
        h.stop_vm(m);
    } else {
        h.kill_vm(m);
    }
    h.await_node(
        m,
        WAIT,
        "the node to become unreachable",
        |n: Option<&Node>| {
            n.and_then(|n| n.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Ready" && c.status == "Unknown")
                })
        },
    )
    .await;

    h.delete_machine(m).await;
    h.await_gone(m, WAIT).await;
    assert!(h.vm_records().is_empty());
    assert!(h.nodes().get_opt(m).await.unwrap().is_none());
    (h, pods)
}

#[tokio::test]
async fn pods_on_an_unreachable_node_whose_vm_runs_are_evicted_not_waited_for() {
    // A partition: the VM runs (stopped, not killed), its Node is unreachable. Its pods may
    // run behind the partition, so they are evicted (under their budgets), but not waited
    // for: they can never finish terminating while the kubelet cannot report.
    let (h, pods) = delete_unreachable("del-unreachable", "u1", true).await;
    // The pod was evicted (it can never finish terminating on a dead kubelet; the pod
    // garbage collector removes it once the node is gone).
    if let Some(p) = pods.get_opt("web").await.unwrap() {
        assert!(
            p.metadata.deletion_timestamp.is_some(),
            "the pod was evicted"
        );
    }
    let text = "not waited for (node unreachable)";
    await_event(&h.client, &h.ns, "u1", "Drained", text, WAIT).await;
    // The node's own events tell an operator why it went away (the Machine's `Deleted` says
    // that its VM and Node are gone).
    for reason in ["DrainStarted", "Drained"] {
        eventually(WAIT, &format!("a {reason} Event on the node"), || async {
            !node_events_for(&h.client, "u1", reason).await.is_empty()
        })
        .await;
    }
}

#[tokio::test]
async fn the_pods_of_a_crashed_vm_are_deleted_not_evicted() {
    // The VM crashed: the driver reports it stopped and its Node is unreachable. Its pods run
    // nowhere: deleted (grace period 0) without an eviction, and the Machine says why.
    let (h, pods) = delete_unreachable("del-crashed", "c1", false).await;
    assert!(
        pods.get_opt("web").await.unwrap().is_none(),
        "the pod is deleted, not left terminating"
    );
    let text = "pods deleted, not evicted: the driver reports the VM stopped";
    await_event(&h.client, &h.ns, "c1", "Drained", text, WAIT).await;
}
