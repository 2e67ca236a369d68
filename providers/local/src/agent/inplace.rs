//! The local VM as the node agent of an in-place update (what gardener-node-agent does on a
//! real node): once MCM has drained the Node and set its `InPlaceUpdate` condition to
//! `ReadyForUpdate`, the agent "updates" the node and reports the result with the label
//! `node.machine.sapcloud.io/update-result` (and, on failure, the annotation
//! `node.machine.sapcloud.io/update-failed-reason`). A local VM has nothing to update: the
//! update succeeds at once, or fails when its providerSpec says `failInPlaceUpdate: true`.
//! The Node's new labels and taints come from the new template, applied by MCM once the
//! machine belongs to the new MachineSet.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tracing::{info, warn};

/// The Node condition type of in-place updates.
pub const CONDITION: &str = "InPlaceUpdate";
/// The condition reason that hands the node to the agent.
pub const READY_FOR_UPDATE: &str = "ReadyForUpdate";
/// The result label.
pub const UPDATE_RESULT: &str = "node.machine.sapcloud.io/update-result";
/// The failure reason annotation.
pub const UPDATE_FAILED_REASON: &str = "node.machine.sapcloud.io/update-failed-reason";
/// The failure reason of a VM configured to fail.
pub const FAILURE: &str =
    "the local VM is configured to fail in-place updates (providerSpec.failInPlaceUpdate)";

/// The patch reporting the update of `node`, `None` when the node is not waiting for its
/// agent (no `ReadyForUpdate` condition, or a result reported already).
pub fn report(node: &Node, fail: bool) -> Option<Value> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == CONDITION && c.reason.as_deref() == Some(READY_FOR_UPDATE));
    let reported = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(UPDATE_RESULT));
    if !ready || reported {
        return None;
    }
    Some(if fail {
        json!({"metadata": {
            "labels": {UPDATE_RESULT: "failed"},
            "annotations": {UPDATE_FAILED_REASON: FAILURE},
        }})
    } else {
        json!({"metadata": {
            "labels": {UPDATE_RESULT: "successful"},
            "annotations": {UPDATE_FAILED_REASON: null},
        }})
    })
}

/// Watches the VM's own Node and reports every in-place update it is handed; runs forever
/// (watch errors are retried with backoff).
pub async fn run(client: kube::Client, node_name: String, fail: bool) {
    let api: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let mut nodes = watcher(api.clone(), config)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(event) = nodes.next().await {
        let node = match event {
            Ok(node) => node,
            Err(e) => {
                warn!(error = %e, "watch of the own Node failed; retrying");
                continue;
            }
        };
        let Some(patch) = report(&node, fail) else {
            continue;
        };
        match api
            .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) if fail => warn!(node = %node_name, "in-place update failed (as configured)"),
            Ok(_) => info!(node = %node_name, "in-place update done"),
            Err(e) => warn!(node = %node_name, error = %e, "could not report the in-place update"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(reason: Option<&str>, result: Option<&str>) -> Node {
        let mut n: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        if let Some(reason) = reason {
            n.status = Some(
                serde_json::from_value(json!({"conditions": [
                    {"type": CONDITION, "status": "True", "reason": reason}
                ]}))
                .unwrap(),
            );
        }
        if let Some(result) = result {
            n.metadata.labels = Some([(UPDATE_RESULT.to_string(), result.to_string())].into());
        }
        n
    }

    #[test]
    fn the_agent_answers_once_the_node_is_ready_for_update() {
        assert_eq!(report(&node(None, None), false), None);
        assert_eq!(report(&node(Some("SelectedForUpdate"), None), false), None);
        let ok = report(&node(Some(READY_FOR_UPDATE), None), false).unwrap();
        assert_eq!(ok["metadata"]["labels"][UPDATE_RESULT], "successful");
        let failed = report(&node(Some(READY_FOR_UPDATE), None), true).unwrap();
        assert_eq!(failed["metadata"]["labels"][UPDATE_RESULT], "failed");
        assert_eq!(
            failed["metadata"]["annotations"][UPDATE_FAILED_REASON],
            FAILURE
        );
        assert_eq!(
            report(&node(Some(READY_FOR_UPDATE), Some("successful")), false),
            None
        );
    }
}
