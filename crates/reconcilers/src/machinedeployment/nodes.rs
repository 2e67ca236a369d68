//! Node markers applied during a rollout, in the **target** cluster: a `PreferNoSchedule`
//! taint on the Nodes of old MachineSets (new pods prefer new nodes), and the
//! cluster-autoscaler scale-down-disabled annotations on the Nodes of all sets (the
//! autoscaler must not remove nodes under the rollout's feet). The annotations are removed
//! again when the rollout is over, but only where MCM set them (`...-by-mcm`), and not from
//! the Node of a preserved machine (its preservation holds them; upstream's
//! `removeAutoscalerAnnotationsIfRequired`).
//!
//! The patches, pure; [`super::act`] applies them (`apply_markers`, `remove_old_set_taint`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use mcm_api::constants::{annotations, taints};
use serde_json::{Value, json};

/// The taint put on the Nodes of old sets.
pub(crate) fn prefer_no_schedule_taint() -> Taint {
    Taint {
        key: taints::PREFER_NO_SCHEDULE.to_owned(),
        value: Some("True".to_owned()),
        effect: "PreferNoSchedule".to_owned(),
        time_added: None,
    }
}

/// The patch adding the old-set taint to a node, `None` if it already has it.
pub(crate) fn taint_patch(node: &Node) -> Option<Value> {
    let mut list: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if list.iter().any(|t| t.key == taints::PREFER_NO_SCHEDULE) {
        return None;
    }
    list.push(prefer_no_schedule_taint());
    Some(json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": list},
    }))
}

/// The patch removing the old-set taint from a node, `None` if it does not have it.
pub(crate) fn untaint_patch(node: &Node) -> Option<Value> {
    let list: Vec<Taint> = node.spec.as_ref()?.taints.clone()?;
    if !list.iter().any(|t| t.key == taints::PREFER_NO_SCHEDULE) {
        return None;
    }
    let kept: Vec<Taint> = list
        .into_iter()
        .filter(|t| t.key != taints::PREFER_NO_SCHEDULE)
        .collect();
    Some(json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": kept},
    }))
}

/// The patch adding (`rollout`) or removing the cluster-autoscaler annotations, `None` when
/// nothing changes. Annotations set by someone else (no `-by-mcm` marker) are left alone.
pub(crate) fn autoscaler_patch(node: &Node, rollout: bool) -> Option<Value> {
    let empty = BTreeMap::new();
    let anns = node.metadata.annotations.as_ref().unwrap_or(&empty);
    let by_mcm = anns.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM);
    let disabled = anns.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED);
    if rollout && !disabled {
        let v = annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_VALUE;
        return Some(json!({"metadata": {"annotations": {
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED: v,
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM: v,
        }}}));
    }
    if !rollout && by_mcm {
        return Some(json!({"metadata": {"annotations": {
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED: null,
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM: null,
        }}}));
    }
    None
}

/// The one patch of a node's markers: the old-set taint (when `taint`) and the autoscaler
/// annotations added (`annotate`) or removed (unless `preserved`: the node's machine has a
/// preservation expiry, and the machine controller owns the annotations then); `None` when
/// the node has them as wanted.
pub(crate) fn markers_patch(
    node: &Node,
    taint: bool,
    annotate: bool,
    preserved: bool,
) -> Option<Value> {
    let taint = taint.then(|| taint_patch(node)).flatten();
    let annotations = if annotate || !preserved {
        autoscaler_patch(node, annotate)
    } else {
        None
    };
    match (taint, annotations) {
        (None, None) => None,
        (Some(p), None) | (None, Some(p)) => Some(p),
        (Some(mut p), Some(a)) => {
            p["metadata"]["annotations"] = a["metadata"]["annotations"].clone();
            Some(p)
        }
    }
}

/// Whether a marker patch is sent with the node's resourceVersion. One that writes the taint
/// list is: Node taints are an atomic list (a strategic merge replaces it whole), so a patch
/// planned from a stale copy would drop a taint added meanwhile. One that only adds or removes
/// annotations is not: annotations merge key by key, and a Node's version changes with every
/// status write of its kubelet, so a guarded patch from the store's copy of a new node met a
/// conflict and a read of the node.
pub(crate) fn needs_version_guard(patch: &Value) -> bool {
    patch.get("spec").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn markers() {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        assert!(taint_patch(&node).is_some());
        assert!(autoscaler_patch(&node, true).is_some());
        assert!(autoscaler_patch(&node, false).is_none());
        node.metadata.annotations = Some(BTreeMap::from([(
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED.to_owned(),
            "true".to_owned(),
        )]));
        // Set by someone else: neither added nor removed.
        assert!(autoscaler_patch(&node, true).is_none());
        assert!(autoscaler_patch(&node, false).is_none());
    }

    #[test]
    fn an_old_node_gets_its_taint_and_annotations_in_one_patch() {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let p = markers_patch(&node, true, true, false).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(
            p["spec"]["taints"][0]["key"],
            taints::PREFER_NO_SCHEDULE,
            "{p}"
        );
        assert_eq!(
            p["metadata"]["annotations"]
                [annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM],
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_VALUE
        );
        assert!(needs_version_guard(&p), "it replaces the taint list: {p}");
        // A new node: the annotations only, merged without a guard; without the annotations
        // enabled: the taint only, guarded.
        let p = markers_patch(&node, false, true, false).unwrap();
        assert!(p.get("spec").is_none(), "{p}");
        assert!(!needs_version_guard(&p), "{p}");
        let p = markers_patch(&node, true, false, false).unwrap();
        assert!(p["metadata"].get("annotations").is_none(), "{p}");
        assert!(needs_version_guard(&p), "{p}");
        // A node that has everything: no patch.
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![prefer_no_schedule_taint()]),
            ..Default::default()
        });
        let v = annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_VALUE.to_owned();
        node.metadata.annotations = Some(BTreeMap::from([
            (
                annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED.to_owned(),
                v.clone(),
            ),
            (
                annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM.to_owned(),
                v,
            ),
        ]));
        assert_eq!(markers_patch(&node, true, true, false), None);
        // After the rollout MCM's annotations go (merged, no guard), but not from a preserved
        // machine's node.
        let p = markers_patch(&node, false, false, false).unwrap();
        assert!(!needs_version_guard(&p), "{p}");
        assert_eq!(markers_patch(&node, false, false, true), None);
        // A preserved machine's node is still tainted during a rollout.
        let untainted = Node {
            metadata: node.metadata.clone(),
            ..Node::default()
        };
        let p = markers_patch(&untainted, true, false, true).unwrap();
        assert!(p["metadata"].get("annotations").is_none(), "{p}");
        // A rollback removes the taint and keeps the others.
        let other = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        node.spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .push(other);
        let p = untaint_patch(&node).unwrap();
        assert_eq!(p["spec"]["taints"].as_array().unwrap().len(), 1, "{p}");
        assert_eq!(p["spec"]["taints"][0]["key"], "dedicated");
        node.spec.as_mut().unwrap().taints = None;
        assert_eq!(untaint_patch(&node), None);
    }
}
