//! Applying a Machine's `spec.nodeTemplate` (labels, annotations, taints) to its Node.
//!
//! What was applied last time is kept in the Node annotation
//! `node.machine.sapcloud.io/last-applied-anno-labels-taints`, so keys removed from the
//! template are removed from the Node while keys set by others are kept.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::api::Api;
use mcm_api::Machine;
use mcm_api::constants::annotations::LAST_APPLIED_ANNO_LABELS_TAINTS;
use mcm_api::constants::labels::NODE_MACHINE_NAME;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Ctx, Error};
use crate::kube_api::{self, ApiErrorExt};

/// What the template asks for (and what the annotation records as applied).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Applied {
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
}

#[derive(Serialize, Deserialize, Default)]
struct Recorded {
    #[serde(default)]
    metadata: RecordedMeta,
    #[serde(default)]
    spec: RecordedSpec,
}

#[derive(Serialize, Deserialize, Default)]
struct RecordedMeta {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Default)]
struct RecordedSpec {
    #[serde(default)]
    taints: Vec<Taint>,
}

/// The template of a Machine.
pub(crate) fn desired(machine: &Machine) -> Applied {
    let t = machine.spec.node_template.as_ref();
    let meta = t.and_then(|t| t.metadata.as_ref());
    Applied {
        labels: meta.and_then(|m| m.labels.clone()).unwrap_or_default(),
        annotations: meta.and_then(|m| m.annotations.clone()).unwrap_or_default(),
        taints: t
            .and_then(|t| t.spec.as_ref())
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
    }
}

/// What the annotation on the Node says was applied last.
pub(crate) fn last_applied(node: &Node) -> Applied {
    let recorded: Recorded = node
        .annotations()
        .get(LAST_APPLIED_ANNO_LABELS_TAINTS)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    Applied {
        labels: recorded.metadata.labels,
        annotations: recorded.metadata.annotations,
        taints: recorded.spec.taints,
    }
}

fn merge_map(
    current: &BTreeMap<String, String>,
    last: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = current
        .iter()
        .filter(|(k, _)| want.contains_key(*k) || !last.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.extend(want.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// The Node labels, annotations and taints after applying `want` over what was `last`
/// applied, with the label `node.gardener.cloud/machine-name: <machine>` that the Go MCM
/// puts on every Node of a machine; `None` when the Node already matches.
pub(crate) fn plan(node: &Node, want: &Applied, machine: &str) -> Option<serde_json::Value> {
    let last = last_applied(node);
    let mut labels = merge_map(node.labels(), &last.labels, &want.labels);
    labels.insert(NODE_MACHINE_NAME.to_owned(), machine.to_owned());
    let mut annotations = merge_map(node.annotations(), &last.annotations, &want.annotations);
    let current_taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut taints: Vec<Taint> = current_taints
        .iter()
        .filter(|t| {
            want.taints.iter().any(|w| same_taint(w, t))
                || !last.taints.iter().any(|l| same_taint(l, t))
        })
        .filter(|t| !want.taints.iter().any(|w| same_taint(w, t)))
        .cloned()
        .collect();
    taints.extend(want.taints.iter().cloned());
    let record = serde_json::to_string(&Recorded {
        metadata: RecordedMeta {
            labels: want.labels.clone(),
            annotations: want.annotations.clone(),
        },
        spec: RecordedSpec {
            taints: want.taints.clone(),
        },
    })
    .unwrap_or_default();
    annotations.insert(LAST_APPLIED_ANNO_LABELS_TAINTS.to_string(), record);

    let without_record = |m: &BTreeMap<String, String>| {
        let mut m = m.clone();
        m.remove(LAST_APPLIED_ANNO_LABELS_TAINTS);
        m
    };
    // The record is compared by meaning, not by its JSON text. A missing record means
    // nothing was applied, which an empty template leaves as it is: like the Go MCM, the
    // record is written only with a change (a Node of an empty template costs no write).
    let record_unchanged =
        without_record(&annotations) == without_record(node.annotations()) && last == *want;
    let unchanged = &labels == node.labels() && record_unchanged && taints == current_taints;
    if unchanged {
        return None;
    }
    // A merge patch replaces maps key by key: removed keys must be sent as null.
    let nulls = |now: &BTreeMap<String, String>, new: &BTreeMap<String, String>| {
        let mut m: serde_json::Map<String, serde_json::Value> = now
            .keys()
            .filter(|k| !new.contains_key(*k))
            .map(|k| (k.clone(), serde_json::Value::Null))
            .collect();
        m.extend(new.iter().map(|(k, v)| (k.clone(), json!(v))));
        serde_json::Value::Object(m)
    };
    let mut patch = json!({
        "metadata": {
            "labels": nulls(node.labels(), &labels),
            "resourceVersion": node.resource_version(),
        },
        "spec": { "taints": taints },
    });
    // Only the machine-name label is new: the record stays as it is (none for an empty
    // template).
    if !record_unchanged {
        patch["metadata"]["annotations"] = nulls(node.annotations(), &annotations);
    }
    Some(patch)
}

/// Writes the node template (and the Node finalizer) as the plan chose ([`planned_write`],
/// from the store's copy): an unguarded strategic merge patch when the taints stay as they
/// are, else a patch that replaces the taint list, guarded by the copy's version and planned
/// again from a read after a conflict.
pub(crate) async fn write(
    ctx: &Ctx,
    machine: &Machine,
    node: &Node,
    planned: &NodeWrite,
) -> Result<(), Error> {
    let patch = match planned {
        NodeWrite::Unguarded(patch) => {
            return ctx
                .patch_node_unguarded(&node.name_any(), patch, "apply the node template")
                .await;
        }
        NodeWrite::Guarded(patch) => patch,
    };
    // Planned again from a fresh read after a conflict (the store's copy may be behind):
    // the outcome of the write decides the next, with the same pure rule. A vanished node
    // (Gone) and a lasting conflict are retried by the next reconcile.
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    let replan = |copy: &Node| {
        if copy.resource_version() == node.resource_version() {
            Some(patch.clone())
        } else {
            patch_for(machine, copy)
        }
    };
    match kube_api::patch_from_copy(&nodes, node, replan).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_conflict() => Ok(()),
        Err(e) => Err(Error::kube("apply the node template", e)),
    }
}

/// A node write as the plan chose it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeWrite {
    /// Labels, annotations and the finalizer only: a strategic merge patch without a
    /// resourceVersion guard ([`unguarded`]), which cannot conflict.
    Unguarded(serde_json::Value),
    /// The taints change too: a merge patch guarded by the copy's version.
    Guarded(serde_json::Value),
}

/// The patch that brings `node` in line with the node template of `machine`, with the Node
/// finalizer when the Node misses it; `None` when nothing is to change. Pure.
pub(crate) fn patch_for(machine: &Machine, node: &Node) -> Option<serde_json::Value> {
    let patch = plan(node, &desired(machine), &machine.name_any());
    if super::nodefinalizer::to_add(machine, node) {
        super::nodefinalizer::add_to_patch(patch, node)
    } else {
        patch
    }
}

/// The write that brings `node` in line ([`patch_for`]): unguarded when it leaves the taints
/// as they are. Pure.
pub(crate) fn planned_write(machine: &Machine, node: &Node) -> Option<NodeWrite> {
    let planned = patch_for(machine, node)?;
    Some(match unguarded(&planned, node) {
        Some(patch) => NodeWrite::Unguarded(patch),
        None => NodeWrite::Guarded(planned),
    })
}

/// `planned` (a guarded merge patch of [`plan`] and the Node finalizer) as a strategic merge
/// patch without the guard, when it leaves the taints as `node` has them: labels and
/// annotations merge key by key (a null removes one) and the finalizer is merged into the
/// list, so nobody's change can be lost. `None` when the taints change (a Node's taints
/// have no merge key: the whole list must be written, guarded). Pure.
pub(crate) fn unguarded(planned: &serde_json::Value, node: &Node) -> Option<serde_json::Value> {
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if let Some(taints) = planned.get("spec").and_then(|s| s.get("taints")) {
        let taints: Vec<Taint> = serde_json::from_value(taints.clone()).ok()?;
        if taints != current {
            return None;
        }
    }
    let mut metadata = planned.get("metadata")?.as_object()?.clone();
    metadata.remove("resourceVersion");
    if metadata.remove("finalizers").is_some() {
        metadata.insert(
            "finalizers".into(),
            json!([super::nodefinalizer::NODE_FINALIZER]),
        );
    }
    Some(json!({ "metadata": metadata }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_that_keeps_the_taints_is_an_unguarded_strategic_patch() {
        let node = node_with(&[("a", "1")], vec![taint("other")], None);
        let m = |template: serde_json::Value| -> Machine {
            serde_json::from_value(json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": { "name": "m1" },
                "spec": { "nodeTemplate": template },
            }))
            .unwrap()
        };
        // The machine-name label and the finalizer: labels merged, the finalizer merged
        // into the list, no version, no taints.
        let planned = super::super::nodefinalizer::add_to_patch(
            plan(&node, &desired(&m(json!({}))), "m1"),
            &node,
        )
        .expect("a change");
        assert!(planned["metadata"].get("resourceVersion").is_some());
        let p = unguarded(&planned, &node).expect("taints unchanged");
        assert_eq!(p["metadata"]["labels"][NODE_MACHINE_NAME], "m1");
        assert_eq!(
            p["metadata"]["finalizers"],
            json!([super::super::nodefinalizer::NODE_FINALIZER])
        );
        assert!(p["metadata"].get("resourceVersion").is_none());
        assert!(p.get("spec").is_none());
        // A template with a taint changes the list: guarded as planned.
        let tainted = m(json!({ "spec": { "taints": [
            { "key": "dedicated", "effect": "NoSchedule" } ] } }));
        let planned = plan(&node, &desired(&tainted), "m1").expect("a change");
        assert_eq!(unguarded(&planned, &node), None);
    }

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node_with(labels: &[(&str, &str)], taints: Vec<Taint>, last: Option<&Applied>) -> Node {
        let mut annotations = BTreeMap::new();
        if let Some(l) = last {
            annotations.insert(
                LAST_APPLIED_ANNO_LABELS_TAINTS.to_string(),
                serde_json::to_string(&json!({
                    "metadata": { "labels": l.labels, "annotations": l.annotations },
                    "spec": { "taints": l.taints },
                }))
                .unwrap(),
            );
        }
        let mut labels = map(labels);
        labels.insert(NODE_MACHINE_NAME.into(), "m".into());
        let node = json!({
            "metadata": { "labels": labels, "annotations": annotations },
            "spec": { "taints": taints },
        });
        serde_json::from_value(node).unwrap()
    }

    #[test]
    fn template_keys_are_added_and_third_party_keys_kept() {
        let want = Applied {
            labels: map(&[("pool", "a")]),
            annotations: BTreeMap::new(),
            taints: vec![taint("dedicated")],
        };
        let node = node_with(
            &[("kubernetes.io/hostname", "n")],
            vec![taint("other")],
            None,
        );
        let p = plan(&node, &want, "m").unwrap();
        assert_eq!(p["metadata"]["labels"]["pool"], "a");
        assert_eq!(p["metadata"]["labels"]["kubernetes.io/hostname"], "n");
        let taints: Vec<Taint> = serde_json::from_value(p["spec"]["taints"].clone()).unwrap();
        assert_eq!(taints, vec![taint("other"), taint("dedicated")]);
    }

    #[test]
    fn keys_removed_from_the_template_are_removed_from_the_node() {
        let last = Applied {
            labels: map(&[("pool", "a"), ("gone", "x")]),
            annotations: BTreeMap::new(),
            taints: vec![taint("old")],
        };
        let want = Applied {
            labels: map(&[("pool", "a")]),
            ..Default::default()
        };
        let node = node_with(
            &[("pool", "a"), ("gone", "x"), ("third", "party")],
            vec![taint("old"), taint("foreign")],
            Some(&last),
        );
        let p = plan(&node, &want, "m").unwrap();
        assert_eq!(p["metadata"]["labels"]["gone"], serde_json::Value::Null);
        assert_eq!(p["metadata"]["labels"]["third"], "party");
        let taints: Vec<Taint> = serde_json::from_value(p["spec"]["taints"].clone()).unwrap();
        assert_eq!(taints, vec![taint("foreign")]);
    }

    #[test]
    fn an_empty_template_needs_no_patch_and_no_record() {
        let node = node_with(
            &[("kubernetes.io/hostname", "n")],
            vec![taint("other")],
            None,
        );
        assert_eq!(plan(&node, &Applied::default(), "m"), None);
    }

    #[test]
    fn a_template_emptied_since_the_last_record_removes_its_keys_and_updates_the_record() {
        let last = Applied {
            labels: map(&[("pool", "a")]),
            ..Default::default()
        };
        let node = node_with(&[("pool", "a")], vec![], Some(&last));
        let p = plan(&node, &Applied::default(), "m").unwrap();
        assert_eq!(p["metadata"]["labels"]["pool"], serde_json::Value::Null);
        let record = p["metadata"]["annotations"][LAST_APPLIED_ANNO_LABELS_TAINTS]
            .as_str()
            .unwrap();
        let recorded: serde_json::Value = serde_json::from_str(record).unwrap();
        assert_eq!(recorded["metadata"]["labels"], json!({}));
    }

    #[test]
    fn an_up_to_date_node_needs_no_patch() {
        let want = Applied {
            labels: map(&[("pool", "a")]),
            ..Default::default()
        };
        let node = node_with(&[("pool", "a")], vec![], Some(&want));
        assert_eq!(plan(&node, &want, "m"), None);
    }

    #[test]
    fn every_node_gets_its_machines_name_and_nothing_else_with_it() {
        let mut node = node_with(&[("kubernetes.io/hostname", "n")], vec![], None);
        node.metadata
            .labels
            .as_mut()
            .map(|l| l.remove(NODE_MACHINE_NAME));
        let p = plan(&node, &Applied::default(), "m").unwrap();
        assert_eq!(p["metadata"]["labels"][NODE_MACHINE_NAME], "m");
        assert!(
            p["metadata"].get("annotations").is_none(),
            "no record for an empty template: {p}"
        );
        // Another machine's name is corrected.
        let node = node_with(&[], vec![], None);
        let p = plan(&node, &Applied::default(), "other").unwrap();
        assert_eq!(p["metadata"]["labels"][NODE_MACHINE_NAME], "other");
    }
}
