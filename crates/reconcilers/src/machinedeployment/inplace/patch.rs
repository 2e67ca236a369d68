//! The patches of an in-place rollout, pure: a machine's move to the new set
//! ([`transfer_patch`]), a Node's clean-up after its update ([`cleanup_patch`]) and its
//! in-place labels ([`label_patch`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use mcm_api::constants::{annotations, labels, taints};
use mcm_api::{Machine, MachineSet};
use serde_json::{Value, json};

use super::super::model::LABEL_TRUE;

/// The merge patch that moves `machine` from the set whose selector has `old_selector` to
/// `new_set` (upstream's ownership transfer): its controller reference becomes `new_set`
/// (the only owner reference), its labels become its own without the old selector's keys,
/// plus the new selector's labels (so `machine-template-hash` is the new set's) and
/// `update-result: successful` (until the new set's replicas account for it). Guarded by the
/// machine's uid and resourceVersion: a stale copy (e.g. a machine moved meanwhile) fails
/// with a conflict instead of being moved twice.
pub(crate) fn transfer_patch(
    machine: &Machine,
    old_selector: &BTreeMap<String, String>,
    new_set: &MachineSet,
) -> Value {
    let mut new_labels: BTreeMap<String, String> = machine
        .labels()
        .iter()
        .filter(|(k, _)| !old_selector.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(selector) = new_set
        .spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
    {
        new_labels.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    new_labels.insert(
        labels::UPDATE_RESULT.to_owned(),
        labels::update_result::SUCCESSFUL.to_owned(),
    );
    json!({"metadata": {
        "ownerReferences": [{
            "apiVersion": mcm_api::API_VERSION,
            "kind": MachineSet::KIND,
            "name": new_set.name_any(),
            "uid": new_set.metadata.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
        "labels": new_labels,
        "uid": machine.metadata.uid,
        "resourceVersion": machine.metadata.resource_version,
    }})
}

/// Gardener's taint on a Node whose critical components are not ready (again).
pub(crate) fn critical_components_not_ready_taint() -> Taint {
    Taint {
        key: taints::CRITICAL_COMPONENTS_NOT_READY.to_owned(),
        effect: "NoSchedule".to_owned(),
        value: None,
        time_added: None,
    }
}

fn is_old_set_taint(t: &Taint) -> bool {
    t.key == taints::PREFER_NO_SCHEDULE
        && t.value.as_deref() == Some("True")
        && t.effect == "PreferNoSchedule"
}

/// The patch that cleans up a Node after its machine's successful in-place update (upstream's
/// `syncMachineSets`): the labels `candidate-for-update`, `selected-for-update`,
/// `update-result` and the annotation `update-failed-reason` go, the old-set
/// `PreferNoSchedule` taint goes, `node.gardener.cloud/critical-components-not-ready:
/// NoSchedule` comes (once). Guarded by the Node's resourceVersion (the taints are a list).
/// `None` unless the Node carries `update-result: successful` (cleaned up already). The
/// uncordon is [`mcm_drain::uncordon`]'s.
pub(crate) fn cleanup_patch(node: &Node) -> Option<Value> {
    let result = node.labels().get(labels::UPDATE_RESULT).map(String::as_str);
    if result != Some(labels::update_result::SUCCESSFUL) {
        return None;
    }
    let mut list: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    list.retain(|t| !is_old_set_taint(t));
    if !list
        .iter()
        .any(|t| t.key == taints::CRITICAL_COMPONENTS_NOT_READY && t.effect == "NoSchedule")
    {
        list.push(critical_components_not_ready_taint());
    }
    let mut node_annotations = serde_json::Map::new();
    if node
        .annotations()
        .contains_key(annotations::UPDATE_FAILED_REASON)
    {
        node_annotations.insert(annotations::UPDATE_FAILED_REASON.into(), Value::Null);
    }
    let mut patch = json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "labels": {
                labels::CANDIDATE_FOR_UPDATE: null,
                labels::SELECTED_FOR_UPDATE: null,
                labels::UPDATE_RESULT: null,
            },
        },
        "spec": {"taints": list},
    });
    if !node_annotations.is_empty() {
        patch["metadata"]["annotations"] = Value::Object(node_annotations);
    }
    Some(patch)
}

/// The patch that labels a Node `key: "true"`, `None` when it has that already.
pub(crate) fn label_patch(node: &Node, key: &str) -> Option<Value> {
    (node.labels().get(key).map(String::as_str) != Some(LABEL_TRUE))
        .then(|| json!({"metadata": {"labels": {key: LABEL_TRUE}}}))
}

#[cfg(test)]
mod tests {
    use super::super::model::{MachineFacts, NodeFacts, UpdateResult};
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use mcm_api::constants::node_conditions;

    fn machine_object(labels: &[(&str, &str)]) -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some("m".into());
        m.metadata.uid = Some("m-uid".into());
        m.metadata.resource_version = Some("42".into());
        m.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        m
    }

    #[test]
    fn the_transfer_patch_moves_owner_and_labels_in_one_go() {
        let m = machine_object(&[
            ("name", "md"),
            (labels::MACHINE_TEMPLATE_HASH, "old"),
            (labels::NODE, "n1"),
        ]);
        let old_selector = BTreeMap::from([
            ("name".to_owned(), "md".to_owned()),
            (labels::MACHINE_TEMPLATE_HASH.to_owned(), "old".to_owned()),
        ]);
        let mut new_set = MachineSet {
            metadata: ObjectMeta {
                name: Some("md-new".into()),
                uid: Some("set-uid".into()),
                ..ObjectMeta::default()
            },
            ..MachineSet::default()
        };
        new_set.spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("name".to_owned(), "md".to_owned()),
                (labels::MACHINE_TEMPLATE_HASH.to_owned(), "new".to_owned()),
            ])),
            ..LabelSelector::default()
        });
        let p = transfer_patch(&m, &old_selector, &new_set);
        assert_eq!(
            p,
            json!({"metadata": {
                "ownerReferences": [{
                    "apiVersion": "machine.sapcloud.io/v1alpha1",
                    "kind": "MachineSet",
                    "name": "md-new",
                    "uid": "set-uid",
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
                "labels": {
                    "name": "md",
                    "machine-template-hash": "new",
                    "node": "n1",
                    "node.machine.sapcloud.io/update-result": "successful",
                },
                "uid": "m-uid",
                "resourceVersion": "42",
            }})
        );
    }

    fn node_object(node_labels: &[(&str, &str)], node_taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                resource_version: Some("7".into()),
                labels: Some(
                    node_labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: Some(BTreeMap::from([(
                    annotations::UPDATE_FAILED_REASON.to_owned(),
                    "earlier".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(node_taints),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus::default()),
        }
    }

    #[test]
    fn the_cleanup_removes_the_in_place_marks_and_adds_the_critical_taint_once() {
        let dedicated = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        let old_set = crate::machinedeployment::nodes::prefer_no_schedule_taint();
        let n = node_object(
            &[
                (labels::CANDIDATE_FOR_UPDATE, "true"),
                (labels::SELECTED_FOR_UPDATE, "true"),
                (labels::UPDATE_RESULT, "successful"),
            ],
            vec![dedicated.clone(), old_set],
        );
        let p = cleanup_patch(&n).expect("a patch");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(
            p["metadata"]["labels"][labels::SELECTED_FOR_UPDATE],
            Value::Null
        );
        assert_eq!(
            p["metadata"]["labels"][labels::CANDIDATE_FOR_UPDATE],
            Value::Null
        );
        assert_eq!(p["metadata"]["labels"][labels::UPDATE_RESULT], Value::Null);
        assert_eq!(
            p["metadata"]["annotations"][annotations::UPDATE_FAILED_REASON],
            Value::Null
        );
        let taints: Vec<Taint> = serde_json::from_value(p["spec"]["taints"].clone()).unwrap();
        assert_eq!(
            taints,
            vec![dedicated.clone(), critical_components_not_ready_taint()]
        );
        // The critical taint present already: not added twice.
        let n = node_object(
            &[(labels::UPDATE_RESULT, "successful")],
            vec![critical_components_not_ready_taint()],
        );
        let taints: Vec<Taint> =
            serde_json::from_value(cleanup_patch(&n).unwrap()["spec"]["taints"].clone()).unwrap();
        assert_eq!(taints, vec![critical_components_not_ready_taint()]);
        // Without a successful result nothing is cleaned.
        let n = node_object(&[(labels::UPDATE_RESULT, "failed")], vec![dedicated]);
        assert_eq!(cleanup_patch(&n), None);
    }

    #[test]
    fn node_and_machine_facts() {
        let mut n = node_object(
            &[
                (labels::CANDIDATE_FOR_UPDATE, "true"),
                (labels::UPDATE_RESULT, "successful"),
            ],
            Vec::new(),
        );
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: node_conditions::IN_PLACE_UPDATE.into(),
                status: "True".into(),
                reason: Some(node_conditions::in_place::UPDATE_SUCCESSFUL.into()),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        let facts = NodeFacts::of(&n);
        assert!(facts.candidate && !facts.selected && facts.condition_successful);
        assert_eq!(facts.result, Some(UpdateResult::Successful));
        let m = machine_object(&[(labels::UPDATE_RESULT, "successful")]);
        let with_node = MachineFacts::of(&m, Some(&n));
        assert!(with_node.labeled_successful && with_node.update_successful());
        // Without the Node, the machine's own copy of the condition is read; the update is
        // not known to have succeeded.
        let mut m = m;
        m.status = Some(mcm_api::MachineStatus {
            conditions: n.status.as_ref().and_then(|s| s.conditions.clone()),
            ..Default::default()
        });
        let without = MachineFacts::of(&m, None);
        assert!(without.condition_successful && !without.update_successful());
        assert_eq!(label_patch(&n, labels::CANDIDATE_FOR_UPDATE), None);
        assert!(label_patch(&n, labels::SELECTED_FOR_UPDATE).is_some());
    }
}
