//! The Node finalizer `node.machine.sapcloud.io/machine-controller`, as the Go machine
//! controller keeps it (since MCM 0.61): held on the Node of every machine that is not being
//! deleted, so that `kubectl delete node` first deletes the machine (drain, VM deletion) and
//! the Node object goes last; released just before the machine's deletion deletes the Node,
//! and from Nodes that no machine claims any longer.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use mcm_api::Machine;
use serde_json::{Value, json};

use super::{Ctx, Error, observe};
use crate::kube_api::{self, ApiErrorExt};

/// The finalizer's name.
pub(crate) const NODE_FINALIZER: &str = mcm_api::constants::finalizers::NODE;

/// Whether `node` carries the finalizer. Pure.
pub(crate) fn held(node: &Node) -> bool {
    node.finalizers().iter().any(|f| f == NODE_FINALIZER)
}

/// Whether the finalizer is to be added to `node`, the Node of `m`: neither is being
/// deleted, the Node is managed by MCM, and it does not carry the finalizer yet. Pure.
pub(crate) fn to_add(m: &Machine, node: &Node) -> bool {
    m.metadata.deletion_timestamp.is_none()
        && node.metadata.deletion_timestamp.is_none()
        && !observe::node_not_managed(node)
        && !held(node)
}

/// `patch` (a merge patch of `node`, or none) with the finalizer added to the Node's list,
/// guarded by the Node's resourceVersion; `patch` unchanged when the finalizer is held. One
/// write carries both the node template and the finalizer. Pure.
pub(crate) fn add_to_patch(patch: Option<Value>, node: &Node) -> Option<Value> {
    let Some(list) = kube_api::finalizers_with(node.finalizers(), NODE_FINALIZER, true) else {
        return patch;
    };
    let mut patch = patch.unwrap_or_else(|| json!({ "metadata": {} }));
    patch["metadata"]["finalizers"] = json!(list);
    patch["metadata"]["resourceVersion"] = json!(node.resource_version());
    Some(patch)
}

/// The Nodes that hold the finalizer while no machine claims them, to be released: a Node
/// that is being deleted at once (nothing else would ever let it go), one annotated
/// not-managed-by-MCM, and any other once it is older than `creation_timeout` (a machine
/// being created may not have recorded its node yet). A Node is claimed by a Machine whose
/// `node` label names it, or that its `node.gardener.cloud/machine-name` label names. Pure.
pub(crate) fn unclaimed<'a>(
    nodes: &'a [std::sync::Arc<Node>],
    machines: &[std::sync::Arc<Machine>],
    creation_timeout: Duration,
    now: Timestamp,
) -> Vec<&'a Node> {
    // One pass over the machines, not one per Node: every Node of a fleet holds the
    // finalizer, and the orphan collector asks after each deletion.
    let claimed_nodes: HashSet<&str> = machines
        .iter()
        .filter_map(|m| observe::node_name(m))
        .collect();
    let machine_names: HashSet<&str> = machines
        .iter()
        .filter_map(|m| m.metadata.name.as_deref())
        .collect();
    nodes
        .iter()
        .map(|n| n.as_ref())
        .filter(|n| held(n))
        .filter(|n| {
            let by_name = n
                .metadata
                .name
                .as_deref()
                .is_some_and(|name| claimed_nodes.contains(name));
            let by_label = n
                .labels()
                .get(mcm_api::constants::labels::NODE_MACHINE_NAME)
                .is_some_and(|machine| machine_names.contains(machine.as_str()));
            !(by_name || by_label)
        })
        .filter(|n| {
            if n.metadata.deletion_timestamp.is_some() || observe::node_not_managed(n) {
                return true;
            }
            let created = n.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created.is_some_and(|c| {
                now.duration_since(c)
                    .try_into()
                    .is_ok_and(|age: Duration| age >= creation_timeout)
            })
        })
        .collect()
}

/// Removes the finalizer from the Node `name`: one strategic merge patch that deletes our
/// name from the list (`metadata.finalizers` merges by value), so other finalizers stay and no
/// resourceVersion is needed (a guarded write of the whole list conflicted with the drain's
/// own Node writes and cost a read and a second patch). A vanished Node needs nothing.
pub(crate) async fn release(ctx: &Ctx, name: &str) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    match nodes
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(release_patch()),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube("remove the node finalizer", e)),
    }
}

/// The strategic merge patch that removes the finalizer and nothing else. Pure.
pub(crate) fn release_patch() -> Value {
    json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [NODE_FINALIZER]}})
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn node(name: &str, finalizers: &[&str], labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "finalizers": finalizers, "labels": labels,
                "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
            }
        }))
        .unwrap()
    }

    fn machine(name: &str, node: &str) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": name, "labels": { "node": node } }, "spec": {}
        }))
        .unwrap()
    }

    fn deleting<T: kube::Resource>(mut o: T) -> T {
        o.meta_mut().deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        o
    }

    #[test]
    fn the_finalizer_is_added_to_live_managed_nodes_of_live_machines() {
        let m = machine("m", "n");
        assert!(to_add(&m, &node("n", &[], json!({}))));
        assert!(
            !to_add(&m, &node("n", &[NODE_FINALIZER], json!({}))),
            "held"
        );
        assert!(!to_add(&deleting(m.clone()), &node("n", &[], json!({}))));
        assert!(!to_add(&m, &deleting(node("n", &[], json!({})))));
        let mut unmanaged = node("n", &[], json!({}));
        unmanaged.metadata.annotations = Some(
            [(
                mcm_api::constants::annotations::NOT_MANAGED_BY_MCM.to_string(),
                "1".to_string(),
            )]
            .into(),
        );
        assert!(!to_add(&m, &unmanaged), "not managed");
    }

    #[test]
    fn the_finalizer_rides_with_the_node_template_patch() {
        let n = node("n", &["other"], json!({}));
        let patch = add_to_patch(Some(json!({ "metadata": { "labels": { "a": "b" } } })), &n);
        assert_eq!(
            patch,
            Some(json!({ "metadata": {
                "labels": { "a": "b" },
                "finalizers": ["other", NODE_FINALIZER],
                "resourceVersion": "7",
            } }))
        );
        assert_eq!(
            add_to_patch(None, &n),
            Some(json!({ "metadata": {
                "finalizers": ["other", NODE_FINALIZER], "resourceVersion": "7",
            } }))
        );
        let held = node("n", &[NODE_FINALIZER], json!({}));
        assert_eq!(add_to_patch(None, &held), None);
        let p = json!({ "metadata": {} });
        assert_eq!(add_to_patch(Some(p.clone()), &held), Some(p));
    }

    #[test]
    fn unclaimed_nodes_are_released_when_deleting_not_managed_or_old_enough() {
        let timeout = Duration::from_secs(20 * 60);
        let created: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let young = created + jiff::SignedDuration::from_secs(60);
        let old = created + jiff::SignedDuration::from_secs(21 * 60);
        let mut not_managed = node("d", &[NODE_FINALIZER], json!({}));
        not_managed.metadata.annotations = Some(
            [(
                mcm_api::constants::annotations::NOT_MANAGED_BY_MCM.to_string(),
                "1".to_string(),
            )]
            .into(),
        );
        let nodes: Vec<Arc<Node>> = vec![
            Arc::new(node("claimed", &[NODE_FINALIZER], json!({}))),
            Arc::new(node(
                "by-label",
                &[NODE_FINALIZER],
                json!({ "node.gardener.cloud/machine-name": "m2" }),
            )),
            Arc::new(node("orphan", &[NODE_FINALIZER], json!({}))),
            Arc::new(deleting(node("gone", &[NODE_FINALIZER], json!({})))),
            Arc::new(not_managed),
            Arc::new(node("free", &[], json!({}))),
        ];
        let machines = vec![
            Arc::new(machine("m1", "claimed")),
            Arc::new(machine("m2", "")),
        ];
        let names = |at| {
            unclaimed(&nodes, &machines, timeout, at)
                .iter()
                .map(|n| n.name_any())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(young), vec!["gone", "d"]);
        assert_eq!(names(old), vec!["orphan", "gone", "d"]);
    }
}
