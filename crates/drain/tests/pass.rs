//! One-pass drains ([`mcm_drain::drain_pass`]) against a real control plane; the tests play
//! the kubelet with [`support::FakeKubelet`] and call passes the way the machine controller
//! does: one call, a report, come back later.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PostParams};
use mcm_drain::{
    DeleteReason, Options, PassInput, PassReport, PassState, Stores, drain_pass,
    start_volume_attachment_reflector,
};
use mcm_testenv::kit::try_eventually;
use serde_json::json;
use support::*;

fn at(secs: u64) -> PassInput {
    PassInput {
        elapsed: Duration::from_secs(secs),
        ..Default::default()
    }
}

/// Runs passes (as a controller would, one after the other) until one reports `want`.
async fn pass_until(
    client: &kube::Client,
    node: &str,
    options: &Options,
    input: &PassInput,
    stores: &Stores,
    want: PassState,
) -> anyhow::Result<PassReport> {
    let mut last = None;
    for _ in 0..150 {
        let report = drain_pass(client.clone(), node, options, input, stores).await?;
        if report.state() == want {
            return Ok(report);
        }
        last = Some(report.summary());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("no pass reached {want:?} within 30s; last: {last:?}")
}

/// A pod the fake kubelet leaves alone: once deleted, it stays Terminating (a dead kubelet).
async fn create_manual_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
) -> anyhow::Result<()> {
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": ns, "annotations": { MANUAL: "true" } },
    }))?;
    pod.spec = Some(pod_spec(Some(node), None));
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

#[tokio::test]
async fn passes_cordon_evict_wait_and_finish() -> anyhow::Result<()> {
    let (client, ns) = setup("pass-basic").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(
        client.clone(),
        &node,
        KubeletOptions {
            termination_delay: Duration::from_secs(2),
            ..kubelet_options(&ns)
        },
    )
    .await?;
    create_pod(&client, &ns, "a", &node, &[], None).await?;
    create_pod(&client, &ns, "b", &node, &[], None).await?;
    wait_ready(&client, &ns, 2).await?;

    let stores = reflector.stores();
    let first = drain_pass(client.clone(), &node, &pass_options(), &at(0), &stores).await?;
    println!("{}", first.summary());
    assert_eq!(first.state(), PassState::Pods);
    assert_eq!(first.evicted, vec![format!("{ns}/a"), format!("{ns}/b")]);
    assert_eq!(first.terminating.len(), 2, "evicted pods are waited for");
    let n = Api::<Node>::all(client.clone()).get(&node).await?;
    assert_eq!(n.spec.and_then(|s| s.unschedulable), Some(true), "cordoned");

    // The next pass evicts nothing again: it waits for the terminating pods.
    let second = drain_pass(client.clone(), &node, &pass_options(), &at(1), &stores).await?;
    assert!(second.evicted.is_empty(), "{second:?}");
    assert_eq!(
        second.summary(),
        format!("draining node {node}: waiting for 2 pod(s) to terminate")
    );

    let done = pass_until(
        &client,
        &node,
        &pass_options(),
        &at(2),
        &stores,
        PassState::Done,
    )
    .await?;
    assert_eq!(done.summary(), format!("node {node} drained"));
    Ok(())
}

#[tokio::test]
async fn a_budget_that_never_allows_an_eviction_is_named_until_the_retries_run_out()
-> anyhow::Result<()> {
    let (client, ns) = setup("pass-pdb").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    create_pod(&client, &ns, "db-0", &node, &[("app", "db")], None).await?;
    wait_ready(&client, &ns, 1).await?;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "db-pdb", "namespace": ns },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "db" } } },
    }))?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    pdbs.create(&PostParams::default(), &pdb).await?;
    try_eventually(Duration::from_secs(60), "PDB status", || {
        let pdbs = pdbs.clone();
        async move {
            let p = pdbs.get("db-pdb").await?;
            anyhow::Ok(p.status.as_ref().is_some_and(|s| {
                s.observed_generation == p.metadata.generation && s.current_healthy == Some(1)
            }))
        }
    })
    .await?;

    let stores = reflector.stores();
    let report = drain_pass(client.clone(), &node, &pass_options(), &at(5), &stores).await?;
    println!("{}", report.summary());
    assert_eq!(report.state(), PassState::Pods);
    let named = report
        .misconfigured
        .iter()
        .any(|m| m.pdb == format!("{ns}/db-pdb"))
        || report
            .blocked
            .iter()
            .any(|b| b.pdb.as_deref() == Some(&format!("{ns}/db-pdb")));
    assert!(named, "{report:?}");
    assert!(report.summary().contains(&format!("{ns}/db-pdb")));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.get("db-0")
            .await?
            .metadata
            .deletion_timestamp
            .is_none()
    );

    // 30 retries of 1s have passed since the drain started: the pod is deleted instead.
    let report = drain_pass(client.clone(), &node, &pass_options(), &at(30), &stores).await?;
    assert_eq!(report.deleted.len(), 1, "{report:?}");
    assert_eq!(report.deleted[0].reason, DeleteReason::MaxEvictRetries);
    pass_until(
        &client,
        &node,
        &pass_options(),
        &at(31),
        &stores,
        PassState::Done,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn pods_on_an_unreachable_node_are_not_waited_for_and_force_deletes_them()
-> anyhow::Result<()> {
    let (client, ns) = setup("pass-unreachable").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    create_manual_pod(&client, &ns, "stuck", &node).await?;
    let stores = reflector.stores();

    // Reachable: evicted, then waited for (it never terminates: its kubelet is "dead").
    let report = drain_pass(client.clone(), &node, &pass_options(), &at(0), &stores).await?;
    assert_eq!(report.evicted, vec![format!("{ns}/stuck")]);
    let report = drain_pass(client.clone(), &node, &pass_options(), &at(1), &stores).await?;
    assert_eq!(report.state(), PassState::Pods);
    assert_eq!(report.terminating, vec![format!("{ns}/stuck")]);

    // Unreachable: not waited for, and no volume wait either.
    let unreachable = PassInput {
        unreachable: true,
        ..at(2)
    };
    let report = drain_pass(
        client.clone(),
        &node,
        &pass_options(),
        &unreachable,
        &stores,
    )
    .await?;
    assert_eq!(report.state(), PassState::Done, "{report:?}");
    assert_eq!(report.released, vec![format!("{ns}/stuck")]);
    assert!(
        report
            .summary()
            .contains("1 not waited for (node unreachable)")
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(pods.get_opt("stuck").await?.is_some(), "left to the pod GC");

    // Force mode deletes it (grace period 0), so it is gone at once.
    let mut force = pass_options();
    force.force = true;
    let report = drain_pass(client.clone(), &node, &force, &at(3), &stores).await?;
    assert_eq!(report.state(), PassState::Done);
    assert_eq!(report.deleted.len(), 1);
    assert!(pods.get_opt("stuck").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn volumes_are_waited_for_within_the_detach_timeout() -> anyhow::Result<()> {
    let (client, ns) = setup("pass-vol").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let (node, kubelet, pv) = pod_with_volume(&client, &ns).await?;
    await_attached(&client, &node, &pv).await?;
    let attached = attached_name(&handle_of(&pv));
    let stores = reflector.stores();

    // The pod goes; its volume stays attached (this kubelet never detaches on its own).
    let report = pass_until(
        &client,
        &node,
        &pass_options(),
        &at(1),
        &stores,
        PassState::Volumes,
    )
    .await?;
    println!("{}", report.summary());
    assert!(report.attached_volumes.contains(&attached), "{report:?}");

    // Within the detach timeout the wait goes on; beyond it, the drain is done with a warning.
    let waiting = PassInput {
        pods_gone_for: Some(Duration::from_secs(29)),
        ..at(40)
    };
    let report = drain_pass(client.clone(), &node, &pass_options(), &waiting, &stores).await?;
    assert_eq!(report.state(), PassState::Volumes);
    let expired = PassInput {
        pods_gone_for: Some(Duration::from_secs(30)),
        ..at(41)
    };
    let report = drain_pass(client.clone(), &node, &pass_options(), &expired, &stores).await?;
    assert_eq!(report.state(), PassState::Done);
    assert!(report.detach_timeouts.contains(&attached), "{report:?}");

    // Detached: done without a warning.
    kubelet.detach(&pv).await?;
    let report = pass_until(
        &client,
        &node,
        &pass_options(),
        &waiting,
        &stores,
        PassState::Done,
    )
    .await?;
    assert!(report.detach_timeouts.is_empty(), "{report:?}");
    Ok(())
}

#[tokio::test]
async fn a_missing_node_has_nothing_to_drain() -> anyhow::Result<()> {
    let (client, ns) = setup("pass-missing").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let report = drain_pass(
        client.clone(),
        &node_name("absent", &ns),
        &pass_options(),
        &at(0),
        &reflector.stores(),
    )
    .await?;
    assert_eq!(report.state(), PassState::NodeGone);
    Ok(())
}

/// A budget that allows no eviction: two pods `web-*` on `node`, `minAvailable: 2`, and its
/// status observed.
async fn budget_at_its_limit(client: &kube::Client, ns: &str, node: &str) -> anyhow::Result<()> {
    create_pod(client, ns, "web-0", node, &[("app", "web")], None).await?;
    create_pod(client, ns, "web-1", node, &[("app", "web")], None).await?;
    wait_ready(client, ns, 2).await?;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "web", "namespace": ns },
        "spec": { "minAvailable": 2, "selector": { "matchLabels": { "app": "web" } } },
    }))?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    pdbs.create(&PostParams::default(), &pdb).await?;
    try_eventually(Duration::from_secs(60), "PDB status", || {
        let pdbs = pdbs.clone();
        async move {
            let p = pdbs.get("web").await?;
            anyhow::Ok(p.status.as_ref().is_some_and(|s| {
                s.observed_generation == p.metadata.generation && s.current_healthy == Some(2)
            }))
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_pods_of_a_dead_vm_are_deleted_though_their_budget_allows_no_eviction()
-> anyhow::Result<()> {
    let t =
        mcm_testenv::kit::TestNamespace::new(mcm_testenv::Components::ALL, "pass-dead-vm").await;
    let (client, ns) = (t.client.clone(), t.ns.clone());
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    budget_at_its_limit(&client, &ns, &node).await?;
    // A pod whose deletion its (now dead) kubelet never finished.
    create_manual_pod(&client, &ns, "stuck", &node).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("stuck", &Default::default()).await?;
    // The VM dies: nothing reports for the node any more.
    drop(kubelet);
    let stores = reflector.stores();

    // Evicted as usual (the node may only be partitioned): the budget refuses both. With
    // the production retry interval, a pass sent through a retrying client would hold until
    // the attempt's deadline (20 s); through the eviction client it comes back at once.
    let mut options = pass_options();
    options.eviction_retry_interval = Duration::from_secs(20);
    options.eviction_client = Some(t.env.client_without_retries().await?);
    let started = std::time::Instant::now();
    let report = drain_pass(client.clone(), &node, &options, &at(1), &stores).await?;
    let took = started.elapsed();
    println!("{} ({took:?})", report.summary());
    assert_eq!(report.state(), PassState::Pods);
    // Refused (a budget that allows nothing while both pods are healthy is reported as
    // misconfigured; either way no eviction passes).
    assert_eq!(
        report.blocked.len() + report.misconfigured.len(),
        2,
        "{report:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "a refused eviction held the pass for {took:?}: it was retried by the client"
    );

    // The driver reports the VM gone: its pods are deleted, the budget is not asked, and
    // nothing is waited for.
    let dead = PassInput {
        vm_dead: true,
        ..at(2)
    };
    let report = drain_pass(client.clone(), &node, &options, &dead, &stores).await?;
    println!("{}", report.summary());
    assert_eq!(report.state(), PassState::Done, "{report:?}");
    assert!(report.evicted.is_empty(), "{report:?}");
    let mut deleted: Vec<_> = report
        .deleted
        .iter()
        .map(|d| (d.pod.clone(), d.reason))
        .collect();
    deleted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        deleted,
        vec![
            (format!("{ns}/stuck"), DeleteReason::VmDead),
            (format!("{ns}/web-0"), DeleteReason::VmDead),
            (format!("{ns}/web-1"), DeleteReason::VmDead),
        ]
    );
    assert_eq!(
        report.summary(),
        format!("node {node} drained (3 deleted without eviction: their VM is gone or stopped)")
    );
    for name in ["stuck", "web-0", "web-1"] {
        assert!(pods.get_opt(name).await?.is_none(), "{name} is gone");
    }
    Ok(())
}
