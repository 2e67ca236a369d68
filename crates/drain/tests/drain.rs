//! Drain against a real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler); the tests play the kubelet with [`support::FakeKubelet`].

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use mcm_drain::{
    CORDON_RECORD_ANNOTATION, DeleteReason, DrainError, Options, Phase, SkipReason, drain,
    start_volume_attachment_reflector, uncordon,
};
use mcm_driver::FakeDriver;
use mcm_testenv::kit::try_eventually;
use serde_json::json;
use support::*;

fn options(timeout: Duration) -> Options {
    let mut o = Options::new(Arc::new(FakeDriver::new()));
    o.timeout = timeout;
    o.eviction_retry_interval = Duration::from_millis(500);
    o.max_evict_retries = 1000;
    o.pv_detach_timeout = Duration::from_secs(30);
    o.pv_reattach_timeout = Duration::from_secs(10);
    o
}

async fn create_pdb(
    client: &kube::Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": ns }, "spec": spec,
    }))?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pdb)
        .await?;
    Ok(())
}

async fn wait_pdb(
    client: &kube::Client,
    ns: &str,
    name: &str,
    check: impl Fn(&k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus) -> bool + Clone,
) -> anyhow::Result<()> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    try_eventually(Duration::from_secs(60), "PDB status", || {
        let (api, check) = (api.clone(), check.clone());
        async move {
            let pdb = api.get(name).await?;
            anyhow::Ok(
                pdb.status
                    .as_ref()
                    .is_some_and(|s| s.observed_generation == pdb.metadata.generation && check(s)),
            )
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn pdb_blocks_eviction_until_the_replacement_is_ready() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-pdb").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node_a = node_name("a", &ns);
    let _kubelet_a = FakeKubelet::start(client.clone(), &node_a, kubelet_options(&ns)).await?;

    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web", "namespace": ns },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": {
                    "nodeSelector": { "drain-test": ns },
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{ "name": "app", "image": "registry.invalid/web:1" }],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    wait_ready(&client, &ns, 2).await?;
    // minAvailable 1 of 2: the second eviction must wait until the first pod's replacement
    // is Ready. (minAvailable 2 of 2 would never allow an eviction: MCM's misconfigured rule.)
    create_pdb(
        &client,
        &ns,
        "web",
        json!({ "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } }),
    )
    .await?;
    wait_pdb(&client, &ns, "web", |s| s.disruptions_allowed == Some(1)).await?;

    // The replacement can only go to node B, whose kubelet takes 3s to report it Ready.
    let node_b = node_name("b", &ns);
    let _kubelet_b = FakeKubelet::start(
        client.clone(),
        &node_b,
        KubeletOptions {
            ready_delay: Duration::from_secs(3),
            ..kubelet_options(&ns)
        },
    )
    .await?;

    // Both pods are evicted in parallel: the second eviction is refused (429; kube's client
    // retries those itself, so the drain sees a request that does not finish) until the
    // replacement is Ready.
    let mut opts = options(Duration::from_secs(90));
    let reported: Arc<std::sync::Mutex<Vec<mcm_drain::PdbBlock>>> = Default::default();
    let sink = reported.clone();
    opts.on_pdb_block = Some(Arc::new(move |b: &mcm_drain::PdbBlock| {
        sink.lock().unwrap().push(b.clone())
    }));
    let started = std::time::Instant::now();
    let outcome = drain(client.clone(), &node_a, &opts, &reflector.stores()).await?;
    println!("{}", outcome.summary());
    assert!(started.elapsed() < Duration::from_secs(90));
    assert_eq!(outcome.evicted.len(), 2, "{outcome:?}");
    assert!(outcome.deleted.is_empty());
    let block = outcome.pdb_blocks.first().expect("a PDB block");
    assert_eq!(block.pdb.as_deref(), Some(format!("{ns}/web").as_str()));
    assert!(block.blocked_for > Duration::ZERO);
    assert!(block.refusals >= 1);
    assert!(!block.misconfigured);
    assert!(outcome.phases.evict >= block.blocked_for);
    assert!(outcome.cordon.unschedulable && outcome.cordon.taint);
    // The hook saw the block while it lasted, one report per refusal.
    let reported = reported.lock().unwrap().clone();
    assert_eq!(reported.len() as u32, block.refusals, "{reported:?}");
    assert!(
        reported
            .iter()
            .all(|b| b.pdb.as_deref() == Some(format!("{ns}/web").as_str()))
    );

    // Both replicas now run on node B.
    let pods = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await?;
    assert!(
        pods.items.iter().filter(|p| is_ready(p)).all(|p| p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            == Some(node_b.as_str()))
    );
    Ok(())
}

/// A node whose kubelet died: an evicted pod stays Terminating. Force mode deletes it (grace
/// period 0) instead of leaving it bound to a node that is about to go.
#[tokio::test]
async fn force_mode_removes_pods_stuck_terminating() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-stuck").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    create_pod(&client, &ns, "web-0", &node, &[("app", "web")], None).await?;
    wait_ready(&client, &ns, 1).await?;
    // The kubelet dies; an eviction leaves the pod Terminating.
    drop(kubelet);
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    api.delete("web-0", &kube::api::DeleteParams::default())
        .await?;
    let pod = api.get("web-0").await?;
    assert!(pod.metadata.deletion_timestamp.is_some(), "terminating");

    let mut force = options(Duration::from_secs(30));
    force.force = true;
    let outcome = drain(client.clone(), &node, &force, &reflector.stores()).await?;
    assert_eq!(outcome.deleted.len(), 1, "{outcome:?}");
    assert_eq!(outcome.deleted[0].reason, DeleteReason::Force);
    try_eventually(Duration::from_secs(10), "the stuck pod gone", || {
        let api = api.clone();
        async move { anyhow::Ok(api.get_opt("web-0").await?.is_none()) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn misconfigured_pdb_is_reported_by_name() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-misconf").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    create_pod(&client, &ns, "db-0", &node, &[("app", "db")], None).await?;
    create_pod(&client, &ns, "db-1", &node, &[("app", "db")], None).await?;
    wait_ready(&client, &ns, 2).await?;
    create_pdb(
        &client,
        &ns,
        "db-strict",
        json!({ "minAvailable": 2, "selector": { "matchLabels": { "app": "db" } } }),
    )
    .await?;
    wait_pdb(&client, &ns, "db-strict", |s| {
        s.expected_pods == Some(2) && s.current_healthy == Some(2)
    })
    .await?;

    let started = std::time::Instant::now();
    let err = drain(
        client.clone(),
        &node,
        &options(Duration::from_secs(60)),
        &reflector.stores(),
    )
    .await
    .expect_err("a misconfigured PDB fails the drain");
    println!("{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "fails fast, not at the timeout"
    );
    match &err {
        DrainError::MisconfiguredPdb { pdb, pod, .. } => {
            assert_eq!(pdb, &format!("{ns}/db-strict"));
            assert!(pod.starts_with(&format!("{ns}/db-")));
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains(&format!(
        "PodDisruptionBudget {ns}/db-strict is misconfigured"
    )));

    // Force mode deletes the pods instead.
    let mut force = options(Duration::from_secs(60));
    force.force = true;
    let outcome = drain(client.clone(), &node, &force, &reflector.stores()).await?;
    assert_eq!(outcome.deleted.len(), 2, "{outcome:?}");
    assert!(
        outcome
            .deleted
            .iter()
            .all(|d| d.reason == DeleteReason::Force)
    );
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    try_eventually(Duration::from_secs(10), "pods gone", || {
        let api = api.clone();
        async move { anyhow::Ok(api.list(&Default::default()).await?.items.is_empty()) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn pods_selected_by_two_pdbs_are_reported() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-twopdb").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    create_pod(
        &client,
        &ns,
        "api-0",
        &node,
        &[("app", "api"), ("tier", "front")],
        None,
    )
    .await?;
    wait_ready(&client, &ns, 1).await?;
    create_pdb(
        &client,
        &ns,
        "by-app",
        json!({ "minAvailable": 0, "selector": { "matchLabels": { "app": "api" } } }),
    )
    .await?;
    create_pdb(
        &client,
        &ns,
        "by-tier",
        json!({ "minAvailable": 0, "selector": { "matchLabels": { "tier": "front" } } }),
    )
    .await?;
    wait_pdb(&client, &ns, "by-tier", |s| s.expected_pods == Some(1)).await?;

    let err = drain(
        client.clone(),
        &node,
        &options(Duration::from_secs(30)),
        &reflector.stores(),
    )
    .await
    .expect_err("two PDBs refuse the eviction");
    println!("{err}");
    match &err {
        DrainError::MisconfiguredPdb { pdb, .. } => {
            assert_eq!(pdb, &format!("{ns}/by-app, {ns}/by-tier"))
        }
        other => panic!("unexpected error {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn daemonset_mirror_and_finished_pods_are_untouched() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-skip").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;

    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": { "name": "agent", "namespace": ns },
        "spec": {
            "selector": { "matchLabels": { "app": "agent" } },
            "template": {
                "metadata": { "labels": { "app": "agent" } },
                "spec": {
                    "nodeSelector": { "drain-test": ns },
                    "containers": [{ "name": "agent", "image": "registry.invalid/agent:1" }],
                },
            },
        },
    }))?;
    Api::<DaemonSet>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ds)
        .await?;
    let mut mirror = Pod::default();
    mirror.metadata.name = Some(format!("static-{node}"));
    mirror.metadata.annotations = Some(
        [(
            "kubernetes.io/config.mirror".to_string(),
            "hash".to_string(),
        )]
        .into(),
    );
    mirror.spec = Some(pod_spec(Some(&node), None));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &mirror).await?;
    create_pod(&client, &ns, "plain", &node, &[], None).await?;
    let mut done = Pod::default();
    done.metadata.name = Some("done".into());
    done.metadata.annotations = Some([(MANUAL.to_string(), "true".to_string())].into());
    done.spec = Some(pod_spec(Some(&node), None));
    pods.create(&PostParams::default(), &done).await?;
    pods.patch_status(
        "done",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": { "phase": "Succeeded" } })),
    )
    .await?;
    wait_ready(&client, &ns, 3).await?; // agent, mirror, plain

    let outcome = drain(
        client.clone(),
        &node,
        &options(Duration::from_secs(60)),
        &reflector.stores(),
    )
    .await?;
    println!("{}", outcome.summary());
    assert_eq!(outcome.evicted, vec![format!("{ns}/plain")]);
    let mut skipped: Vec<(String, SkipReason)> = outcome
        .skipped
        .iter()
        .map(|s| (s.pod.clone(), s.reason))
        .collect();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(
        skipped
            .iter()
            .any(|(p, r)| p.starts_with(&format!("{ns}/agent-")) && *r == SkipReason::DaemonSet)
    );
    assert!(skipped.contains(&(format!("{ns}/static-{node}"), SkipReason::MirrorPod)));
    assert!(skipped.contains(&(format!("{ns}/done"), SkipReason::Finished)));

    let left: Vec<String> = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(!left.contains(&"plain".to_string()));
    Ok(())
}

#[tokio::test]
async fn the_timeout_holds() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-timeout").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    // A finalizer keeps the evicted pod around: it never disappears.
    let mut pod = Pod::default();
    pod.metadata.name = Some("stuck".into());
    pod.metadata.finalizers = Some(vec!["mcm-rs.io/test-hold".into()]);
    pod.spec = Some(pod_spec(Some(&node), None));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &pod).await?;
    wait_ready(&client, &ns, 1).await?;

    let timeout = Duration::from_secs(4);
    let started = std::time::Instant::now();
    let err = drain(
        client.clone(),
        &node,
        &options(timeout),
        &reflector.stores(),
    )
    .await
    .expect_err("the pod never disappears");
    let took = started.elapsed();
    println!("{err} (after {took:?})");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "took {took:?}"
    );
    match &err {
        DrainError::Timeout {
            phase,
            remaining_pods,
            ..
        } => {
            assert_eq!(*phase, Phase::WaitForDeletion);
            assert_eq!(remaining_pods, &vec![format!("{ns}/stuck")]);
        }
        other => panic!("unexpected error {other:?}"),
    }
    // The drain never uncordons on its own.
    let n = Api::<Node>::all(client.clone()).get(&node).await?;
    assert_eq!(n.spec.and_then(|s| s.unschedulable), Some(true));

    pods.patch(
        "stuck",
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn volume_wait_completes_when_the_attachment_clears() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-vol").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let (node, kubelet, pv) = pod_with_volume(&client, &ns).await?;
    await_attached(&client, &node, &pv).await?;

    // The "attach/detach controller": once the pod is gone, detach after 1s, then attach the
    // volume to another node.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let detacher = {
        let (pods, client, pv) = (pods.clone(), client.clone(), pv.clone());
        async move {
            try_eventually(Duration::from_secs(30), "pod gone", || {
                let pods = pods.clone();
                async move { anyhow::Ok(pods.get_opt("db").await?.is_none()) }
            })
            .await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            kubelet.detach(&pv).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            create_attachment(&client, "elsewhere", &pv).await?;
            anyhow::Ok(kubelet)
        }
    };
    let mut opts = options(Duration::from_secs(60));
    opts.wait_for_reattach = true;
    let stores = reflector.stores();
    let (outcome, detached) = tokio::join!(drain(client.clone(), &node, &opts, &stores), detacher);
    let _kubelet = detached?;
    let outcome = outcome?;
    println!("{} {:?}", outcome.summary(), outcome.phases);
    let volume = format!("{} (PersistentVolume {pv})", handle_of(&pv));
    assert_eq!(outcome.evicted, vec![format!("{ns}/db")]);
    assert_eq!(outcome.detached_volumes, vec![volume.clone()]);
    assert_eq!(outcome.reattached_volumes, vec![volume]);
    assert!(outcome.reattach_timeouts.is_empty());
    assert!(
        outcome.phases.volume_detach >= Duration::from_millis(800),
        "{:?}",
        outcome.phases
    );
    assert!(outcome.phases.volume_reattach > Duration::ZERO);
    Ok(())
}

#[tokio::test]
async fn volume_that_stays_attached_fails_with_its_name() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-volstuck").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let (node, _kubelet, pv) = pod_with_volume(&client, &ns).await?;
    let vas: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = Api::all(client.clone());
    try_eventually(Duration::from_secs(10), "VolumeAttachment", || {
        let vas = vas.clone();
        let pv = pv.clone();
        async move {
            anyhow::Ok(
                vas.list(&Default::default())
                    .await?
                    .items
                    .iter()
                    .any(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str())),
            )
        }
    })
    .await?;

    let mut opts = options(Duration::from_secs(60));
    opts.pv_detach_timeout = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let err = drain(client.clone(), &node, &opts, &reflector.stores())
        .await
        .expect_err("the volume never detaches");
    println!("{err}");
    // Grace period 5s + detach timeout 2s.
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(matches!(err, DrainError::VolumeDetachTimeout { .. }));
    assert!(err.to_string().contains(&handle_of(&pv)), "{err}");
    assert!(err.to_string().contains(&node));
    Ok(())
}

#[tokio::test]
async fn cordon_and_uncordon_keep_third_party_changes() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-cordon").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let node = node_name("n", &ns);
    let _kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(&ns)).await?;
    let third_party =
        json!({ "key": "example.com/dedicated", "value": "db", "effect": "NoSchedule" });
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "taints": [third_party] } })),
        )
        .await?;

    let opts = options(Duration::from_secs(30));
    let outcome = drain(client.clone(), &node, &opts, &reflector.stores()).await?;
    assert!(outcome.cordon.unschedulable && outcome.cordon.taint);
    let n = nodes.get(&node).await?;
    let spec = n.spec.clone().unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true));
    let keys: Vec<String> = spec
        .taints
        .iter()
        .flatten()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    assert!(
        keys.contains(&"node.kubernetes.io/unschedulable:NoSchedule".to_string()),
        "{keys:?}"
    );
    assert!(keys.contains(&"example.com/dedicated:NoSchedule".to_string()));
    assert!(
        n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(CORDON_RECORD_ANNOTATION))
    );

    // Idempotent: a second drain finds the node cordoned already.
    let again = drain(client.clone(), &node, &opts, &reflector.stores()).await?;
    assert!(again.cordon.is_empty());

    let removed = uncordon(client.clone(), &node).await?;
    assert!(removed.unschedulable && removed.taint);
    let n = nodes.get(&node).await?;
    let spec = n.spec.clone().unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true));
    let keys: Vec<String> = spec
        .taints
        .iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect();
    assert_eq!(keys, vec!["example.com/dedicated".to_string()]);
    assert!(
        !n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(CORDON_RECORD_ANNOTATION))
    );

    // Cordoned by someone else: the drain adds only the taint, and uncordon keeps
    // `unschedulable` set.
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "unschedulable": true } })),
        )
        .await?;
    drain(client.clone(), &node, &opts, &reflector.stores()).await?;
    uncordon(client.clone(), &node).await?;
    let n = nodes.get(&node).await?;
    assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert!(
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "example.com/dedicated"))
    );
    Ok(())
}

#[tokio::test]
async fn a_missing_node_is_nothing_to_drain() -> anyhow::Result<()> {
    let (client, ns) = setup("drain-missing").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let outcome = drain(
        client,
        &node_name("ghost", &ns),
        &options(Duration::from_secs(10)),
        &reflector.stores(),
    )
    .await?;
    assert!(!outcome.node_found);
    assert!(outcome.summary().contains("not found"));
    Ok(())
}
