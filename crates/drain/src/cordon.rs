//! Cordon (`spec.unschedulable` + the `node.kubernetes.io/unschedulable:NoSchedule` taint) and
//! uncordon, which removes exactly what cordon added. What cordon added is recorded in the
//! [`CORDON_RECORD_ANNOTATION`] annotation, written in the same request as the change itself,
//! so a crash between the two cannot happen and a re-run sees its own earlier work.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use mcm_api::constants::taints::UNSCHEDULABLE;
use serde_json::json;

use crate::error::DrainError;

/// Node annotation listing what the drain's cordon added (`unschedulable`, `taint`, comma
/// separated), so [`uncordon`] removes only that.
pub const CORDON_RECORD_ANNOTATION: &str = "node.machine.sapcloud.io/cordoned-by-mcm";

const NO_SCHEDULE: &str = "NoSchedule";
const CONFLICT_RETRIES: usize = 5;

/// The parts of a cordon: which were changed by one call (or are recorded as ours).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CordonChange {
    /// `spec.unschedulable` was set (or unset, for uncordon).
    pub unschedulable: bool,
    /// The `node.kubernetes.io/unschedulable:NoSchedule` taint was added (or removed).
    pub taint: bool,
}

impl CordonChange {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.unschedulable && !self.taint
    }

    fn union(self, other: CordonChange) -> CordonChange {
        CordonChange {
            unschedulable: self.unschedulable || other.unschedulable,
            taint: self.taint || other.taint,
        }
    }
}

/// Parses the value of [`CORDON_RECORD_ANNOTATION`]; unknown words are ignored.
pub fn parse_record(value: &str) -> CordonChange {
    let mut record = CordonChange::default();
    for word in value.split(',').map(str::trim) {
        match word {
            "unschedulable" => record.unschedulable = true,
            "taint" => record.taint = true,
            _ => {}
        }
    }
    record
}

/// Formats a record for [`CORDON_RECORD_ANNOTATION`].
pub fn format_record(record: CordonChange) -> String {
    let mut words = Vec::new();
    if record.unschedulable {
        words.push("unschedulable");
    }
    if record.taint {
        words.push("taint");
    }
    words.join(",")
}

fn is_cordon_taint(t: &Taint) -> bool {
    t.key == UNSCHEDULABLE && t.effect == NO_SCHEDULE
}

fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn record_of(node: &Node) -> Option<CordonChange> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDON_RECORD_ANNOTATION))
        .map(|v| parse_record(v))
}

/// A change to write to a node: a JSON merge patch carrying the node's `resourceVersion`
/// (so a concurrent change makes it fail with a conflict instead of being overwritten).
#[derive(Debug, Clone, PartialEq)]
pub struct NodePatch {
    /// The merge patch.
    pub patch: serde_json::Value,
    /// What it changes.
    pub change: CordonChange,
}

/// Plans the cordon of a node: `None` when it is cordoned already.
pub fn plan_cordon(node: &Node) -> Option<NodePatch> {
    let mut node_taints = taints(node);
    let change = CordonChange {
        unschedulable: !is_unschedulable(node),
        taint: !node_taints.iter().any(is_cordon_taint),
    };
    if change.is_empty() {
        return None;
    }
    let record = record_of(node).unwrap_or_default().union(change);
    let mut spec = serde_json::Map::new();
    if change.unschedulable {
        spec.insert("unschedulable".into(), json!(true));
    }
    if change.taint {
        node_taints.push(Taint {
            key: UNSCHEDULABLE.into(),
            effect: NO_SCHEDULE.into(),
            value: None,
            time_added: None,
        });
        spec.insert("taints".into(), json!(node_taints));
    }
    Some(NodePatch {
        patch: json!({
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": { CORDON_RECORD_ANNOTATION: format_record(record) },
            },
            "spec": spec,
        }),
        change,
    })
}

/// Plans the uncordon of a node: undo what the record says cordon added, drop the record.
/// `None` when there is no record (the drain did not cordon this node).
pub fn plan_uncordon(node: &Node) -> Option<NodePatch> {
    let record = record_of(node)?;
    let node_taints = taints(node);
    let change = CordonChange {
        unschedulable: record.unschedulable && is_unschedulable(node),
        taint: record.taint && node_taints.iter().any(is_cordon_taint),
    };
    let mut spec = serde_json::Map::new();
    if change.unschedulable {
        spec.insert("unschedulable".into(), serde_json::Value::Null);
    }
    if change.taint {
        let kept: Vec<Taint> = node_taints
            .into_iter()
            .filter(|t| !is_cordon_taint(t))
            .collect();
        spec.insert("taints".into(), json!(kept));
    }
    Some(NodePatch {
        patch: json!({
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": { CORDON_RECORD_ANNOTATION: null },
            },
            "spec": spec,
        }),
        change,
    })
}

/// Cordons a node. Returns `None` when the node does not exist, otherwise what was added
/// (empty when it was cordoned already).
pub(crate) async fn cordon(
    api: &Api<Node>,
    node_name: &str,
) -> Result<Option<CordonChange>, DrainError> {
    apply(api, node_name, "cordon", plan_cordon).await
}

/// Cordons a node planned from `known`, a copy of it the caller holds (e.g. from a store):
/// no request when that copy is cordoned already, one patch otherwise. The patch carries the
/// copy's resourceVersion, so a stale copy meets a conflict, and then the node is read and
/// the cordon planned again ([`cordon`]).
pub(crate) async fn cordon_known(
    api: &Api<Node>,
    known: &Node,
) -> Result<Option<CordonChange>, DrainError> {
    let node_name = known.metadata.name.clone().unwrap_or_default();
    let Some(NodePatch { patch, change }) = plan_cordon(known) else {
        return Ok(Some(CordonChange::default()));
    };
    match api
        .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Some(change)),
        Err(kube::Error::Api(s)) if s.code == 409 => cordon(api, &node_name).await,
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(DrainError::kube(format!("cordon node {node_name}"), e)),
    }
}

/// Uncordons a node, removing only what [`crate::drain`]'s cordon added (recorded in
/// [`CORDON_RECORD_ANNOTATION`]): a taint or `unschedulable` set by someone else stays.
/// Returns what was removed; a missing node or a node the drain did not cordon is not an
/// error. The drain itself never uncordons, not even when it fails: call this when the
/// machine is kept after all.
pub async fn uncordon(client: kube::Client, node_name: &str) -> Result<CordonChange, DrainError> {
    let api: Api<Node> = Api::all(client);
    Ok(apply(&api, node_name, "uncordon", plan_uncordon)
        .await?
        .unwrap_or_default())
}

/// Reads the node, plans, patches; retries on conflicts. `None` when the node is missing.
async fn apply(
    api: &Api<Node>,
    node_name: &str,
    verb: &str,
    plan: fn(&Node) -> Option<NodePatch>,
) -> Result<Option<CordonChange>, DrainError> {
    let mut attempt = 0;
    loop {
        let Some(node) = api
            .get_opt(node_name)
            .await
            .map_err(|e| DrainError::kube(format!("get node {node_name} to {verb} it"), e))?
        else {
            return Ok(None);
        };
        let Some(NodePatch { patch, change }) = plan(&node) else {
            return Ok(Some(CordonChange::default()));
        };
        match api
            .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(Some(change)),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_RETRIES => {
                attempt += 1;
                tracing::debug!(node = node_name, verb, attempt, "conflict, retrying");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(DrainError::kube(format!("{verb} node {node_name}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(unschedulable: Option<bool>, taints: Vec<Taint>, record: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.resource_version = Some("42".into());
        if let Some(r) = record {
            n.metadata.annotations =
                Some([(CORDON_RECORD_ANNOTATION.to_string(), r.to_string())].into());
        }
        n.spec = Some(NodeSpec {
            unschedulable,
            taints: Some(taints),
            ..Default::default()
        });
        n
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    #[test]
    fn records_round_trip() {
        for r in [
            CordonChange::default(),
            CordonChange {
                unschedulable: true,
                taint: false,
            },
            CordonChange {
                unschedulable: false,
                taint: true,
            },
            CordonChange {
                unschedulable: true,
                taint: true,
            },
        ] {
            assert_eq!(parse_record(&format_record(r)), r);
        }
        assert_eq!(
            parse_record("taint, future-thing"),
            CordonChange {
                unschedulable: false,
                taint: true
            }
        );
    }

    #[test]
    fn cordon_adds_both_and_records_them() {
        let plan = plan_cordon(&node(None, vec![taint("example.com/x", "NoExecute")], None))
            .expect("a change");
        assert_eq!(
            plan.change,
            CordonChange {
                unschedulable: true,
                taint: true
            }
        );
        assert_eq!(plan.patch["metadata"]["resourceVersion"], "42");
        assert_eq!(
            plan.patch["metadata"]["annotations"][CORDON_RECORD_ANNOTATION],
            "unschedulable,taint"
        );
        assert_eq!(plan.patch["spec"]["unschedulable"], true);
        let taints = plan.patch["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0]["key"], "example.com/x");
        assert_eq!(taints[1]["key"], UNSCHEDULABLE);
        assert_eq!(taints[1]["effect"], "NoSchedule");
    }

    #[test]
    fn cordon_of_a_cordoned_node_is_a_no_op() {
        assert!(
            plan_cordon(&node(
                Some(true),
                vec![taint(UNSCHEDULABLE, "NoSchedule")],
                None
            ))
            .is_none()
        );
    }

    #[test]
    fn cordon_records_only_what_it_adds() {
        // Someone else set unschedulable: only the taint is ours.
        let plan = plan_cordon(&node(Some(true), vec![], None)).expect("a change");
        assert_eq!(
            plan.change,
            CordonChange {
                unschedulable: false,
                taint: true
            }
        );
        assert_eq!(
            plan.patch["metadata"]["annotations"][CORDON_RECORD_ANNOTATION],
            "taint"
        );
        assert!(plan.patch["spec"].get("unschedulable").is_none());
        // An earlier record is kept.
        let plan = plan_cordon(&node(
            None,
            vec![taint(UNSCHEDULABLE, "NoSchedule")],
            Some("taint"),
        ))
        .expect("a change");
        assert_eq!(
            plan.patch["metadata"]["annotations"][CORDON_RECORD_ANNOTATION],
            "unschedulable,taint"
        );
    }

    #[test]
    fn uncordon_removes_only_what_was_recorded() {
        let cordoned = node(
            Some(true),
            vec![
                taint("example.com/x", "NoSchedule"),
                taint(UNSCHEDULABLE, "NoSchedule"),
            ],
            Some("unschedulable,taint"),
        );
        let plan = plan_uncordon(&cordoned).expect("a change");
        assert_eq!(
            plan.change,
            CordonChange {
                unschedulable: true,
                taint: true
            }
        );
        assert!(plan.patch["spec"]["unschedulable"].is_null());
        assert_eq!(
            plan.patch["spec"]["taints"],
            json!([{"key": "example.com/x", "effect": "NoSchedule"}])
        );
        assert!(plan.patch["metadata"]["annotations"][CORDON_RECORD_ANNOTATION].is_null());

        // Only the taint was ours: unschedulable stays.
        let plan = plan_uncordon(&node(
            Some(true),
            vec![taint(UNSCHEDULABLE, "NoSchedule")],
            Some("taint"),
        ))
        .expect("a change");
        assert_eq!(
            plan.change,
            CordonChange {
                unschedulable: false,
                taint: true
            }
        );
        assert!(plan.patch["spec"].get("unschedulable").is_none());

        // Not cordoned by the drain: nothing to do.
        assert!(
            plan_uncordon(&node(
                Some(true),
                vec![taint(UNSCHEDULABLE, "NoSchedule")],
                None
            ))
            .is_none()
        );
    }
}
