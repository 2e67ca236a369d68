//! Per-pod drain rules (`drain.machine.sapcloud.io/behavior`) against a real control plane;
//! the tests play the kubelet with [`support::FakeKubelet`].

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use mcm_drain::{
    DRAIN_BEHAVIOR_KEY, InvalidDrainRule, PassInput, PassState, RuleSource, SkipReason, drain,
    drain_pass, start_volume_attachment_reflector,
};
use mcm_testenv::kit::try_eventually;
use serde_json::json;
use support::*;

/// A pod bound to `node` with the given annotations.
async fn create_annotated_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    annotations: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some(ns.into());
    pod.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    pod.spec = Some(pod_spec(Some(node), None));
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// A node with a normal pod `web`, a pod `cache` labelled `skip`, a pod `job` annotated
/// `wait-completed` and a pod `odd` with an unknown value; returns the node and its kubelet.
async fn node_with_rule_pods(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<(String, FakeKubelet)> {
    let node = node_name("n", ns);
    let kubelet = FakeKubelet::start(client.clone(), &node, kubelet_options(ns)).await?;
    create_pod(client, ns, "web", &node, &[], None).await?;
    create_pod(
        client,
        ns,
        "cache",
        &node,
        &[(DRAIN_BEHAVIOR_KEY, "skip")],
        None,
    )
    .await?;
    create_annotated_pod(
        client,
        ns,
        "job",
        &node,
        &[(DRAIN_BEHAVIOR_KEY, "wait-completed")],
    )
    .await?;
    create_annotated_pod(client, ns, "odd", &node, &[(DRAIN_BEHAVIOR_KEY, "bogus")]).await?;
    wait_ready(client, ns, 4).await?;
    Ok((node, kubelet))
}

/// Marks the pod finished, as its kubelet would once its containers exited.
async fn mark_succeeded(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": { "phase": "Succeeded" } })),
        )
        .await?;
    Ok(())
}

/// The pod is still there, bound to `node` and not terminating.
async fn untouched(client: &kube::Client, ns: &str, name: &str, node: &str) -> anyhow::Result<()> {
    let pod = Api::<Pod>::namespaced(client.clone(), ns).get(name).await?;
    anyhow::ensure!(
        pod.metadata.deletion_timestamp.is_none(),
        "pod {name} is terminating"
    );
    anyhow::ensure!(
        pod.spec.and_then(|s| s.node_name).as_deref() == Some(node),
        "pod {name} is not bound to {node}"
    );
    Ok(())
}

#[tokio::test]
async fn passes_skip_skip_pods_and_wait_for_wait_completed_pods() -> anyhow::Result<()> {
    let (client, ns) = setup("rules-pass").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let (node, _kubelet) = node_with_rule_pods(&client, &ns).await?;
    let stores = reflector.stores();
    let input = PassInput::default();
    let key = |name: &str| format!("{ns}/{name}");

    let first = drain_pass(client.clone(), &node, &pass_options(), &input, &stores).await?;
    println!("{}", first.summary());
    assert_eq!(first.state(), PassState::Pods);
    assert_eq!(first.evicted, vec![key("odd"), key("web")], "{first:?}");
    assert_eq!(first.waiting_for_completion, vec![key("job")]);
    assert_eq!(first.skipped.len(), 1, "{first:?}");
    assert_eq!(first.skipped[0].pod, key("cache"));
    assert_eq!(
        first.skipped[0].reason,
        SkipReason::DrainRule(RuleSource::Label)
    );
    assert_eq!(
        first.invalid_rules,
        vec![InvalidDrainRule {
            pod: key("odd"),
            source: RuleSource::Annotation,
            value: "bogus".into(),
        }]
    );

    // The evicted pods go; the wait-completed pod keeps the drain from finishing.
    let waiting = try_eventually(Duration::from_secs(30), "evicted pods gone", || {
        let (client, node, stores) = (client.clone(), node.clone(), stores.clone());
        async move {
            let r = drain_pass(client, &node, &pass_options(), &input, &stores).await?;
            anyhow::Ok(r.terminating.is_empty().then_some(r))
        }
    })
    .await?;
    assert_eq!(waiting.state(), PassState::Pods, "{waiting:?}");
    assert!(waiting.evicted.is_empty(), "{waiting:?}");
    assert_eq!(waiting.waiting_for_completion, vec![key("job")]);
    assert!(
        waiting.summary().contains(&format!(
            "waiting for 1 pod(s) to complete (drain rule wait-completed): {}",
            key("job")
        )),
        "{}",
        waiting.summary()
    );
    untouched(&client, &ns, "job", &node).await?;
    untouched(&client, &ns, "cache", &node).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(pods.get_opt("web").await?.is_none());

    // Force mode (before the drain timeout) still waits for it.
    let mut force = pass_options();
    force.force = true;
    let forced = drain_pass(client.clone(), &node, &force, &input, &stores).await?;
    assert_eq!(forced.state(), PassState::Pods, "{forced:?}");
    assert_eq!(forced.waiting_for_completion, vec![key("job")]);
    untouched(&client, &ns, "job", &node).await?;

    // It finishes: the drain is done, and the skip pod is still there.
    mark_succeeded(&client, &ns, "job").await?;
    let done = try_eventually(Duration::from_secs(30), "drain done", || {
        let (client, node, stores) = (client.clone(), node.clone(), stores.clone());
        async move {
            let r = drain_pass(client, &node, &pass_options(), &input, &stores).await?;
            anyhow::Ok((r.state() == PassState::Done).then_some(r))
        }
    })
    .await?;
    println!("{}", done.summary());
    assert!(done.waiting_for_completion.is_empty());
    untouched(&client, &ns, "cache", &node).await?;
    untouched(&client, &ns, "job", &node).await?;
    Ok(())
}

#[tokio::test]
async fn a_whole_drain_waits_for_wait_completed_pods() -> anyhow::Result<()> {
    let (client, ns) = setup("rules-drain").await?;
    let reflector = start_volume_attachment_reflector(client.clone());
    let (node, _kubelet) = node_with_rule_pods(&client, &ns).await?;
    let stores = reflector.stores();
    let key = |name: &str| format!("{ns}/{name}");

    let task = tokio::spawn({
        let (client, node) = (client.clone(), node.clone());
        async move { drain(client, &node, &pass_options(), &stores).await }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    try_eventually(Duration::from_secs(30), "evicted pods gone", || {
        let pods = pods.clone();
        async move {
            anyhow::Ok(pods.get_opt("web").await?.is_none() && pods.get_opt("odd").await?.is_none())
        }
    })
    .await?;
    assert!(!task.is_finished(), "the drain waits for the job");
    untouched(&client, &ns, "job", &node).await?;

    mark_succeeded(&client, &ns, "job").await?;
    let outcome = tokio::time::timeout(Duration::from_secs(30), task).await???;
    println!("{}", outcome.summary());
    let mut evicted = outcome.evicted.clone();
    evicted.sort();
    assert_eq!(evicted, vec![key("odd"), key("web")]);
    assert_eq!(outcome.waited_for_completion, vec![key("job")]);
    assert_eq!(outcome.invalid_rules.len(), 1);
    assert!(
        outcome
            .skipped
            .iter()
            .any(|s| s.pod == key("cache") && s.reason == SkipReason::DrainRule(RuleSource::Label))
    );
    untouched(&client, &ns, "cache", &node).await?;
    Ok(())
}
