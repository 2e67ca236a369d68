//! Machine preservation (`node.machine.sapcloud.io/preserve`) with the real control plane,
//! the `machine-controller-local` binary and local VMs.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use mcm_api::{Machine, MachinePhase};
use mcm_testenv::kit::{MachineBuilder, await_object, create};
use serde_json::json;

const PRESERVE: &str = "node.machine.sapcloud.io/preserve";
const TAINT: &str = "node.machine.sapcloud.io/preserved";
const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

fn expiry(m: &Machine) -> Option<jiff::Timestamp> {
    mcm_api::preservation::expiry(m)
}

fn preserved_condition(n: &Node) -> Option<(String, String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Preserved")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

fn tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT && t.effect == "NoSchedule"))
}

async fn await_node(
    h: &Harness,
    name: &str,
    what: &str,
    pred: impl Fn(&Node) -> bool + Send + 'static,
) -> Node {
    await_object(h.nodes(), name, WAIT, what, move |n: Option<&Node>| {
        n.is_some_and(&pred)
    })
    .await
    .expect("node")
}

async fn await_machine(
    h: &Harness,
    name: &str,
    what: &str,
    pred: impl Fn(&Machine) -> bool + Send + 'static,
) -> Machine {
    await_object(
        h.machines(),
        name,
        WAIT,
        what,
        move |m: Option<&Machine>| m.is_some_and(&pred),
    )
    .await
    .expect("machine")
}

async fn patch_node(h: &Harness, name: &str, patch: serde_json::Value) {
    h.nodes()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch node");
}

/// A DaemonSet whose node selector matches only `node` (labelled for it); returns the
/// name of the pod the DaemonSet controller places there, once it runs.
async fn daemon_set_pod(h: &Harness, node: &str) -> (Api<Pod>, String) {
    let label = format!("ds-{}", h.ns);
    patch_node(
        h,
        node,
        json!({"metadata": {"labels": {"preserve-test": label}}}),
    )
    .await;
    let sets: Api<DaemonSet> = Api::namespaced(h.client.clone(), &h.ns);
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {"preserve-test": label},
                    "containers": [{"name": "c", "image": "example.invalid/agent"}]
                }
            }
        }
    }))
    .unwrap();
    create(&sets, &ds).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), &h.ns);
    let name = mcm_testenv::kit::eventually(WAIT, "the DaemonSet pod to run on its node", || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&kube::api::ListParams::default().labels("app=agent"))
                .await
                .ok()?;
            list.items
                .into_iter()
                .find(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .map(|p| p.name_any())
        }
    })
    .await;
    (pods, name)
}

/// `when-failed`: nothing while the machine runs; once it fails (its VM crashed) it is
/// preserved: expiry, the autoscaler annotation, the NoSchedule taint, a drain that leaves
/// the DaemonSet pod, the `Preserved` condition. At the expiry everything goes again,
/// the annotation included.
#[tokio::test]
async fn a_failed_machine_is_preserved_drained_and_released_at_expiry() {
    let h = Harness::new("preserve-failed", json!({})).await;
    let _mc = h.spawn_controller(
        "mc",
        &[
            "--machine-health-timeout=3s".into(),
            "--machine-preserve-timeout=1h".into(),
        ],
    );
    let m1 = MachineBuilder::new("pf1")
        .class("local")
        .annotation(PRESERVE, "when-failed");
    create(&h.machines(), &m1.build()).await;
    let running = h.await_phase("pf1", MachinePhase::Running, WAIT).await;
    assert_eq!(expiry(&running), None, "when-failed waits for a failure");
    let pods = h.run_pod("work", "pf1", 30).await;
    let (agents, agent) = daemon_set_pod(&h, "pf1").await;

    h.kill_vm("pf1");
    let failed = h.await_phase("pf1", MachinePhase::Failed, WAIT).await;
    let m = await_machine(&h, "pf1", "an expiry", |m| expiry(m).is_some()).await;
    let until = expiry(&m).unwrap();
    let hours = until.duration_since(jiff::Timestamp::now()).as_secs_f64() / 3600.0;
    assert!((0.9..=1.0).contains(&hours), "expiry in ~1h: {until}");
    let node = await_node(&h, "pf1", "the preserved node drained", |n| {
        preserved_condition(n).is_some_and(|(s, _, m)| {
            s == "True" && m.starts_with("Preserved node drained successfully.")
        })
    })
    .await;
    let (_, reason, message) = preserved_condition(&node).unwrap();
    assert_eq!(reason, "Preserved by user.");
    assert!(message.contains("Machine preserved until"), "{message}");
    assert!(tainted(&node), "tainted: {:?}", node.spec);
    assert_eq!(node.annotations()[SCALE_DOWN_DISABLED], "true");
    assert_ne!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "preservation does not cordon"
    );
    // The workload was evicted (the node is unreachable: not waited for); the DaemonSet pod
    // stays.
    let work = pods.get_opt("work").await.unwrap();
    assert!(
        work.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the workload pod is evicted"
    );
    let agent = agents.get(&agent).await.unwrap();
    assert!(
        agent.metadata.deletion_timestamp.is_none(),
        "DaemonSet pod stays"
    );
    assert_eq!(failed.phase(), Some(&MachinePhase::Failed));

    // The expiry passes (an operator may also edit it): preservation ends completely.
    h.machines()
        .patch_status(
            "pf1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"currentStatus": {
                "preserveExpiryTime": "2020-01-01T00:00:00Z"
            }}})),
        )
        .await
        .unwrap();
    let m = await_machine(&h, "pf1", "preservation released", |m| {
        expiry(m).is_none() && !m.annotations().contains_key(PRESERVE)
    })
    .await;
    assert_eq!(m.phase(), Some(&MachinePhase::Failed));
    let node = await_node(&h, "pf1", "the node released", |n| {
        !tainted(n)
            && preserved_condition(n)
                .is_some_and(|(s, r, _)| s == "False" && r == "Preservation stopped.")
    })
    .await;
    assert!(!node.annotations().contains_key(SCALE_DOWN_DISABLED));
    let stopped =
        mcm_testenv::kit::events_for(&h.client, &h.ns, "pf1", "PreservationStopped").await;
    assert!(stopped.iter().any(|n| n.contains("expired")), "{stopped:?}");
}

/// `now` on the Node (the Node's value wins and is recorded on the Machine): preserved while
/// Running; a failure taints and drains the node; when the node is healthy again the machine
/// is Running, the taint goes, a user's cordon stays, the preservation goes on. `false` on the
/// Node stops it.
#[tokio::test]
async fn a_preserved_machine_recovers_and_a_users_cordon_stays() {
    let h = Harness::new("preserve-now", json!({})).await;
    let _mc = h.spawn_controller("mc", &[]);
    h.create_machine("pn1", "local").await;
    h.await_phase("pn1", MachinePhase::Running, WAIT).await;
    patch_node(
        &h,
        "pn1",
        json!({"metadata": {"annotations": {PRESERVE: "now"}}, "spec": {"unschedulable": true}}),
    )
    .await;
    let m = await_machine(&h, "pn1", "preserved with the node's value", |m| {
        expiry(m).is_some()
            && m.annotations()
                .get("node.machine.sapcloud.io/last-applied-node-preserve-value")
                .is_some_and(|v| v == "now")
    })
    .await;
    let until = expiry(&m).unwrap();
    let hours = until.duration_since(jiff::Timestamp::now()).as_secs_f64() / 3600.0;
    assert!(hours > 95.0, "the default preserve timeout is 96h: {until}");
    await_node(&h, "pn1", "the Preserved condition", |n| {
        preserved_condition(n)
            .is_some_and(|(s, _, m)| s == "True" && m.starts_with("Machine preserved until"))
            && n.annotations().contains_key(SCALE_DOWN_DISABLED)
    })
    .await;
    h.run_pod("work", "pn1", 0).await;

    // A failure (as the health check would record it) while the node is in fact healthy.
    h.machines()
        .patch_status(
            "pn1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"currentStatus": {"phase": "Failed"}}})),
        )
        .await
        .unwrap();
    // Tainted and drained, then Running again with the taint gone.
    await_node(&h, "pn1", "the failed machine's node drained", |n| {
        preserved_condition(n)
            .is_some_and(|(_, _, m)| m.starts_with("Preserved node drained successfully."))
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), &h.ns);
    await_object(
        pods,
        "work",
        WAIT,
        "the workload evicted",
        |p: Option<&Pod>| p.is_none(),
    )
    .await;
    let m = h.await_phase("pn1", MachinePhase::Running, WAIT).await;
    assert_eq!(expiry(&m), Some(until), "preservation goes on");
    let node = await_node(&h, "pn1", "the taint removed", |n| !tainted(n)).await;
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the user's cordon stays"
    );

    // `false` on the Node: preservation stops, the annotation stays (it is the user's).
    patch_node(
        &h,
        "pn1",
        json!({"metadata": {"annotations": {PRESERVE: "false"}}}),
    )
    .await;
    await_machine(&h, "pn1", "preservation stopped", |m| expiry(m).is_none()).await;
    let node = await_node(&h, "pn1", "the node released", |n| {
        preserved_condition(n).is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    assert_eq!(node.annotations()[PRESERVE], "false");
    assert!(!node.annotations().contains_key(SCALE_DOWN_DISABLED));

    // A value upstream does not allow, on the Node: nothing changes, a Warning says why.
    patch_node(
        &h,
        "pn1",
        json!({"metadata": {"annotations": {PRESERVE: "forever"}}}),
    )
    .await;
    let warned = mcm_testenv::kit::eventually(WAIT, "an InvalidPreserveValue Event", || async {
        let notes =
            mcm_testenv::kit::events_for(&h.client, &h.ns, "pn1", "InvalidPreserveValue").await;
        notes.into_iter().find(|n| n.contains("\"forever\""))
    })
    .await;
    assert!(warned.contains("node pn1"), "{warned}");
    let m = h.machines().get("pn1").await.unwrap();
    assert_eq!(expiry(&m), None, "not preserved by an invalid value");
}
