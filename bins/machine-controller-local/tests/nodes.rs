//! The machine controller and Nodes: a deleted Node deletes its Machine (unless the Node is
//! not managed by MCM), and the Machine's node template is kept applied to its Node.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use mcm_api::constants::annotations;
use mcm_api::{Machine, MachinePhase, NodeTemplateSpec};
use mcm_testenv::kit::{MachineBuilder, create, metric_with};
use serde_json::json;

fn labels(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

fn taints(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn deleting_a_node_deletes_its_machine_unless_the_node_is_not_managed() {
    let h = Harness::new("nodes-del", json!({})).await;
    let _mc = h.spawn_controller("mc", &[]);
    for n in ["managed", "unmanaged"] {
        h.create_machine(n, "local").await;
    }
    for n in ["managed", "unmanaged"] {
        h.await_phase(n, MachinePhase::Running, WAIT).await;
    }

    // A managed Node is deleted: its Machine goes, and with it the VM.
    h.nodes()
        .delete("managed", &DeleteParams::default())
        .await
        .unwrap();
    h.await_gone("managed", WAIT).await;
    assert!(
        !h.vm_records().contains(&"managed".to_string()),
        "the VM of the machine is deleted"
    );
    assert!(h.vm_pids("managed").is_empty());
    h.await_node("managed", WAIT, "the node to stay deleted", |n| n.is_none())
        .await;

    // A Node excluded from MCM's management is deleted: its Machine stays.
    h.nodes()
        .patch(
            "unmanaged",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                annotations::NOT_MANAGED_BY_MCM: "true" } } })),
        )
        .await
        .unwrap();
    h.nodes()
        .delete("unmanaged", &DeleteParams::default())
        .await
        .unwrap();
    // Measurement window: for 4 s after the deletion the Machine must not be deleted (the
    // controller's watch sees a Node deletion within milliseconds).
    let deleted = tokio::time::timeout(
        Duration::from_secs(4),
        await_condition(h.machines(), "unmanaged", |m: Option<&Machine>| {
            m.is_none_or(|m| m.metadata.deletion_timestamp.is_some())
        }),
    )
    .await;
    assert!(
        deleted.is_err(),
        "the machine of an unmanaged node was deleted"
    );
    assert!(h.vm_records().contains(&"unmanaged".to_string()));

    h.delete_machine("unmanaged").await;
    h.await_gone("unmanaged", WAIT).await;
    assert!(h.vm_pids("unmanaged").is_empty());
}

#[tokio::test]
async fn the_node_template_is_applied_and_removed_keys_go_while_foreign_ones_stay() {
    let h = Harness::new("nodes-tmpl", json!({})).await;
    let mc = h.spawn_controller("mc", &[]);
    let template: NodeTemplateSpec = serde_json::from_value(json!({
        "metadata": {
            "labels": { "pool": "a", "temporary": "yes" },
            "annotations": { "example.com/owner": "team-a" }
        },
        "spec": { "taints": [{ "key": "dedicated", "value": "a", "effect": "NoSchedule" }] }
    }))
    .unwrap();
    let machine = MachineBuilder::new("t1")
        .class("local")
        .node_template(template)
        .build();
    create(&h.machines(), &machine).await;
    h.await_phase("t1", MachinePhase::Running, WAIT).await;
    let node = h
        .await_node("t1", WAIT, "the template to be applied", |n| {
            n.is_some_and(|n| {
                labels(n).get("pool").map(String::as_str) == Some("a")
                    && labels(n).contains_key("temporary")
                    && n.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("example.com/owner"))
                        .map(String::as_str)
                        == Some("team-a")
                    && taints(n).iter().any(|t| t.key == "dedicated")
            })
        })
        .await
        .unwrap();
    assert!(
        node.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::LAST_APPLIED_ANNO_LABELS_TAINTS)),
        "what was applied is recorded"
    );

    // A third party labels the Node; then the template drops a label, changes one, and drops
    // the taint.
    h.nodes()
        .patch(
            "t1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "third": "party" } } })),
        )
        .await
        .unwrap();
    h.patch_machine(
        "t1",
        json!({ "spec": { "nodeTemplate": {
            "metadata": { "labels": { "temporary": null, "pool": "b" } },
            "spec": { "taints": [] }
        } } }),
    )
    .await;
    let node = h
        .await_node("t1", WAIT, "the changed template to be applied", |n| {
            n.is_some_and(|n| {
                labels(n).get("pool").map(String::as_str) == Some("b")
                    && !labels(n).contains_key("temporary")
                    && !taints(n).iter().any(|t| t.key == "dedicated")
            })
        })
        .await
        .unwrap();
    assert_eq!(
        labels(&node).get("third").map(String::as_str),
        Some("party"),
        "a label set by a third party stays"
    );
    assert_eq!(
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("example.com/owner"))
            .map(String::as_str),
        Some("team-a"),
        "an annotation still in the template stays"
    );
    assert_eq!(
        labels(&node)
            .get("kubernetes.io/hostname")
            .map(String::as_str),
        Some("t1"),
        "the kubelet's labels stay"
    );

    // One deletion pass: the VM is deleted once (a conflict when removing the finalizer used
    // to make every deletion run twice).
    h.delete_machine("t1").await;
    h.await_gone("t1", WAIT).await;
    let deletes = metric_with(
        &mc.metrics().await,
        "mcm_cloud_api_driver_request_duration_seconds_count",
        "operation=\"delete_machine\"",
    );
    assert_eq!(deletes, 1.0, "delete_machine calls for one deletion");
}
