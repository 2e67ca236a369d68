//! The Secrets of MachineClasses: read from the shared store (a Machine change neither
//! reconciles its class nor reads its Secret), labelled and finalized while a class
//! references them, released when none does.

mod common;

use common::*;
use mcm_testenv::kit::{eventually, metric_with};
use serde_json::json;

/// The tests of this file count the API server's requests, so they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Requests the API server served per resource and verb so far.
async fn served(client: &kube::Client, resource: &str, verb: &str) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(request)
        .await
        .expect("apiserver metrics");
    let (resource, verb) = (
        format!("resource=\"{resource}\""),
        format!("verb=\"{verb}\""),
    );
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains(&resource) && l.contains(&verb))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn machine_changes_do_not_reconcile_their_class_nor_read_its_secret() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let h = Harness::new("class-quiet", json!({})).await;
    let mc = h.spawn_controller("mc", &["--controllers=machine,manager".to_string()]);
    h.create_machine("m", "local").await;
    h.await_phase("m", mcm_api::MachinePhase::Running, WAIT)
        .await;
    let reconciles = |text: &str, controller: &str| {
        metric_with(
            text,
            "mcm_controller_reconcile_duration_seconds_count",
            &format!("controller=\"{controller}\""),
        )
    };
    let before = mc.metrics().await;
    let secret_reads = served(&h.client, "secrets", "GET").await;

    // Ten changes of the Machine: each one is reconciled by the machine controller.
    for i in 0..10 {
        h.machines()
            .patch(
                "m",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({ "metadata": { "labels": { "change": i.to_string() } } }),
                ),
            )
            .await
            .unwrap();
    }
    let machine_before = reconciles(&before, "machine");
    eventually(
        WAIT,
        "the machine controller to see the changes",
        || async { reconciles(&mc.metrics().await, "machine") >= machine_before + 10.0 },
    )
    .await;

    let after = mc.metrics().await;
    assert_eq!(
        reconciles(&after, "machineclass"),
        reconciles(&before, "machineclass"),
        "a Machine change reconciled its class"
    );
    assert_eq!(
        served(&h.client, "secrets", "GET").await,
        secret_reads,
        "a Machine change read a Secret"
    );
}

/// Whether a Secret carries the class-credentials label and the machine controller's
/// finalizer.
fn marked(s: Option<&k8s_openapi::api::core::v1::Secret>) -> Option<bool> {
    let s = s?;
    let label = s
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(mcm_reconcilers::informers::CLASS_CREDENTIALS_LABEL))
        .is_some_and(|v| v == "true");
    let finalizer = s
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == mcm_api::constants::finalizers::MACHINE_CONTROLLER);
    Some(label && finalizer)
}

#[tokio::test]
async fn a_secret_no_class_references_any_more_is_released_and_can_be_deleted() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let h = Harness::new("secret-release", json!({})).await;
    let _mc = h.spawn_controller("mc", &[]);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(h.client.clone(), &h.ns);
    let await_marked = |name: &'static str, want: bool| {
        let secrets = secrets.clone();
        async move {
            mcm_testenv::kit::await_object(secrets, name, WAIT, name, move |s: Option<&_>| {
                marked(s) == Some(want)
            })
            .await;
        }
    };
    await_marked("local-secret", true).await;

    // The class moves to another Secret: the new one is taken, the old one released.
    h.create_secret("other-secret").await;
    h.classes()
        .patch(
            "local",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "secretRef": { "name": "other-secret" } })),
        )
        .await
        .unwrap();
    await_marked("other-secret", true).await;
    await_marked("local-secret", false).await;
    secrets
        .delete("local-secret", &Default::default())
        .await
        .unwrap();
    mcm_testenv::kit::await_gone(secrets.clone(), "local-secret", WAIT).await;
    // The Secret in use keeps its finalizer: deleting it leaves it Terminating.
    secrets
        .delete("other-secret", &Default::default())
        .await
        .unwrap();
    let kept = secrets.get("other-secret").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_some());
    assert_eq!(marked(Some(&kept)), Some(true));
}
