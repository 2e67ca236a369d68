//! Health and disruption policy against a real control plane: lifecycle hooks hold the
//! deletion at their stage, the hook timeout gives up on them, and a zone outage
//! short-circuits remediation until the deployment allows it, after which the driver's fast
//! path fails the crashed machines without waiting for the health timeout.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use mcm_api::constants::annotations::{hooks, policy};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use mcm_testenv::kit::{MachineDeploymentBuilder, await_object, create, events_for, eventually};
use serde_json::json;

fn unschedulable(node: Option<&Node>) -> bool {
    node.and_then(|n| n.spec.as_ref())
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

#[tokio::test]
async fn lifecycle_hooks_hold_the_deletion_at_their_stage() {
    let h = Harness::new("hooks", json!({})).await;
    let _mc = h.spawn_controller("mc", &[]);
    h.create_machine("k1", "local").await;
    h.await_phase("k1", MachinePhase::Running, WAIT).await;
    let pods = h.run_pod("web", "k1", 0).await;
    let pre_drain = format!("{}etcd-member", hooks::PRE_DRAIN_PREFIX);
    let pre_terminate = format!("{}load-balancer", hooks::PRE_TERMINATE_PREFIX);
    h.patch_machine(
        "k1",
        json!({ "metadata": { "annotations": {
            pre_drain.clone(): "etcd-operator",
            pre_terminate.clone(): "",
        } } }),
    )
    .await;

    h.delete_machine("k1").await;
    h.await_description("k1", WAIT, "the pre-drain hook to hold", |d| {
        d.contains("waits for pre-drain hook(s) etcd-member (owner etcd-operator)")
    })
    .await;
    // Held before the drain: not cordoned, the pod still runs, the VM too.
    let node = h.nodes().get("k1").await.unwrap();
    assert!(
        !unschedulable(Some(&node)),
        "cordoned while a pre-drain hook holds"
    );
    assert!(pods.get_opt("web").await.unwrap().is_some());
    assert!(h.vm_alive("k1"));
    let waits = events_for(&h.client, &h.ns, "k1", "WaitingForHook").await;
    assert!(waits.iter().any(|n| n.contains("pre-drain")), "{waits:?}");

    // The owner is done: the drain runs, then the pre-terminate hook holds the VM.
    h.patch_machine(
        "k1",
        json!({ "metadata": { "annotations": { pre_drain.clone(): null } } }),
    )
    .await;
    h.await_description("k1", WAIT, "the pre-terminate hook to hold", |d| {
        d.contains("waits for pre-terminate hook(s) load-balancer")
    })
    .await;
    h.await_node("k1", WAIT, "the node to be cordoned", unschedulable)
        .await;
    await_object(
        pods.clone(),
        "web",
        WAIT,
        "the pod to be drained",
        |p: Option<&Pod>| p.is_none(),
    )
    .await;
    assert!(
        h.vm_alive("k1"),
        "the VM was deleted while a pre-terminate hook holds"
    );
    let m = h.machines().get("k1").await.unwrap();
    assert_eq!(m.phase(), Some(&MachinePhase::Terminating));

    h.patch_machine(
        "k1",
        json!({ "metadata": { "annotations": { pre_terminate.clone(): null } } }),
    )
    .await;
    h.await_gone("k1", WAIT).await;
    assert!(h.vm_records().is_empty(), "{:?}", h.vm_records());
}

#[tokio::test]
async fn the_hook_timeout_gives_up_on_a_hook_with_a_warning() {
    let h = Harness::new("hook-timeout", json!({})).await;
    let _mc = h.spawn_controller("mc", &["--machine-lifecycle-hook-timeout=2s".to_string()]);
    h.create_machine("t1", "local").await;
    h.await_phase("t1", MachinePhase::Running, WAIT).await;
    let hook = format!("{}forgotten", hooks::PRE_TERMINATE_PREFIX);
    h.patch_machine(
        "t1",
        json!({ "metadata": { "annotations": { hook: "gone-operator" } } }),
    )
    .await;
    h.delete_machine("t1").await;
    h.await_gone("t1", WAIT).await;
    assert!(h.vm_records().is_empty());
    let warned = events_for(&h.client, &h.ns, "t1", "HookTimedOut").await;
    assert!(
        warned
            .iter()
            .any(|n| n.contains("forgotten (owner gone-operator)")
                && n.contains("--machine-lifecycle-hook-timeout (2s)")),
        "{warned:?}"
    );
}

/// The machines of the deployment (by its template label), by name.
async fn machines_of(h: &Harness) -> Vec<Machine> {
    h.machines()
        .list(&kube::api::ListParams::default().labels("pool=zone"))
        .await
        .unwrap()
        .items
}

fn remediation_allowed(d: Option<&MachineDeployment>) -> Option<(String, String)> {
    let c = d?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_.as_str() == "RemediationAllowed")?;
    Some((
        c.status.as_str().to_string(),
        c.reason.clone().unwrap_or_default(),
    ))
}

#[tokio::test]
async fn a_zone_outage_short_circuits_remediation_and_the_fast_path_replaces_once_allowed() {
    let h = Harness::new("outage", json!({})).await;
    let deployments: Api<MachineDeployment> = Api::namespaced(h.client.clone(), &h.ns);
    let md = MachineDeploymentBuilder::new("zone")
        .replicas(3)
        .class("local")
        .match_label("pool", "zone")
        .rolling(1, 0)
        .annotation(policy::MAX_UNHEALTHY, "1")
        .annotation(policy::MAX_IN_FLIGHT, "2")
        .build();
    create(&deployments, &md).await;
    // A health timeout no test waits for: only the fast path can fail a machine in time.
    let _mc = h.spawn_controller(
        "mc",
        &[
            "--controllers=machine,manager".to_string(),
            "--machine-health-timeout=1h".to_string(),
        ],
    );
    let names: Vec<String> = eventually(WAIT, "3 Running machines", || async {
        let ms = machines_of(&h).await;
        let running: Vec<String> = ms
            .iter()
            .filter(|m| m.phase() == Some(&MachinePhase::Running))
            .map(|m| m.name_any())
            .collect();
        (running.len() == 3).then_some(running)
    })
    .await;
    await_object(
        deployments.clone(),
        "zone",
        WAIT,
        "remediation to be allowed",
        |d: Option<&MachineDeployment>| remediation_allowed(d).is_some_and(|(s, _)| s == "True"),
    )
    .await;

    // Two of three VMs crash at once: more unhealthy than the one allowed.
    let crashed = [names[0].clone(), names[1].clone()];
    for m in &crashed {
        h.kill_vm(m);
    }
    for m in &crashed {
        h.await_description(m, WAIT, "the short-circuit to hold the machine", |d| {
            d.contains("remediation short-circuited")
                && d.contains("of the 3 machines of MachineDeployment zone are unhealthy")
        })
        .await;
    }
    await_object(
        deployments.clone(),
        "zone",
        WAIT,
        "the RemediationAllowed condition to turn False",
        |d: Option<&MachineDeployment>| {
            remediation_allowed(d).is_some_and(|(s, r)| s == "False" && r == "TooManyUnhealthy")
        },
    )
    .await;
    let warned = events_for(&h.client, &h.ns, "zone", "RemediationShortCircuited").await;
    assert!(!warned.is_empty(), "no RemediationShortCircuited event");
    let ms = machines_of(&h).await;
    assert!(
        ms.iter().all(|m| m.phase() != Some(&MachinePhase::Failed)),
        "a machine failed while short-circuited: {:?}",
        ms.iter()
            .map(|m| (m.name_any(), m.phase().cloned()))
            .collect::<Vec<_>>()
    );
    assert_eq!(ms.len(), 3, "nothing replaced while short-circuited");

    // The operator decides the outage is real: remediation is allowed again. The driver
    // reports the VMs stopped, so both fail at once (the health timeout is an hour) and are
    // replaced.
    deployments
        .patch(
            "zone",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "annotations": { policy::MAX_UNHEALTHY: "100%" } } }),
            ),
        )
        .await
        .unwrap();
    for m in &crashed {
        h.await_gone(m, WAIT).await;
    }
    let failed = events_for(&h.client, &h.ns, &crashed[0], "Failed").await;
    assert!(
        failed
            .iter()
            .any(|n| n.contains("the driver reports the VM stopped")),
        "{failed:?}"
    );
    eventually(WAIT, "3 Running machines again", || async {
        let ms = machines_of(&h).await;
        let running = ms
            .iter()
            .filter(|m| m.phase() == Some(&MachinePhase::Running))
            .count();
        if running == 3 && ms.len() == 3 {
            Ok(())
        } else {
            Err(running)
        }
    })
    .await;
    await_object(
        deployments.clone(),
        "zone",
        WAIT,
        "remediation to be allowed again",
        |d: Option<&MachineDeployment>| remediation_allowed(d).is_some_and(|(s, _)| s == "True"),
    )
    .await;
}
