//! What the MachineSet controller reads from the stores: the machines of a namespace, the
//! views of a set's machines with their Nodes' preserve annotations, the set as
//! [`SetInput`], what makes a deletion voluntary (a preserved Node, a rolling deployment),
//! and the sets a machine or budget event concerns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use mcm_api::constants::annotations;
use mcm_api::owner::controller_of;
use mcm_api::{Machine, MachineDeployment, MachineDisruptionBudget, MachinePhase, MachineSet};

use crate::disruptionbudget;
use crate::selector::selector_matches;

/// The machines of the store in namespace `ns`.
pub(crate) fn machines_in(machines: &Store<Machine>, ns: &str) -> Vec<Arc<Machine>> {
    machines
        .state()
        .into_iter()
        .filter(|m| m.metadata.namespace.as_deref() == Some(ns))
        .collect()
}

/// The preserve annotation of the Node of `machine` (named by its `node` label), from the
/// Node store; `None` without a node label, without a Node in the store, or without the
/// annotation (the machine's own annotation then decides, as in the machine controller).
pub(crate) fn node_preserve_annotation(nodes: &Store<Node>, machine: &Machine) -> Option<String> {
    let node = nodes.get(&ObjectRef::new(machine.node_name()?))?;
    node.annotations().get(annotations::PRESERVE).cloned()
}

/// Whether the Node of `machine` carries the `Preserved` condition (it was preserved).
pub(crate) fn node_was_preserved(nodes: &Store<Node>, machine: &Machine) -> bool {
    machine
        .node_name()
        .and_then(|n| nodes.get(&ObjectRef::new(n)))
        .and_then(|n| n.status.as_ref()?.conditions.clone())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == disruptionbudget::decide::NODE_PRESERVED_CONDITION)
        })
}

/// The preserve annotations of the Nodes of the Failed ones of `machines` (by machine name;
/// only those whose Node has one).
pub(crate) fn node_preserve_annotations(
    nodes: &Store<Node>,
    machines: &[Arc<Machine>],
) -> BTreeMap<String, String> {
    machines
        .iter()
        .filter(|m| m.phase() == Some(&MachinePhase::Failed))
        .filter_map(|m| Some((m.name_any(), node_preserve_annotation(nodes, m)?)))
        .collect()
}

/// The names of those of `machines` whose Node carries the `Preserved` condition.
pub(crate) fn nodes_preserved(nodes: &Store<Node>, machines: &[Arc<Machine>]) -> BTreeSet<String> {
    machines
        .iter()
        .filter(|m| node_was_preserved(nodes, m))
        .map(|m| m.name_any())
        .collect()
}

/// Whether `set` is an old set of a MachineDeployment whose template differs from it (its
/// surplus deletions are a rolling update's).
pub(crate) fn is_old_set_of_rollout(
    set: &MachineSet,
    deployments: &Store<MachineDeployment>,
) -> bool {
    let Some(owner) = controller_of(&set.metadata) else {
        return false;
    };
    if owner.kind != MachineDeployment::KIND {
        return false;
    }
    let key = ObjectRef::new(&owner.name).within(&set.namespace().unwrap_or_default());
    let Some(deployment) = deployments.get(&key) else {
        return false;
    };
    // The comparison by which a deployment finds its new set
    // (`machinedeployment::hash::templates_equal`); this controller does not import that one.
    set.spec
        .template
        .as_ref()
        .is_none_or(|t| !mcm_api::canonical::same_set_template(&deployment.spec.template, t))
}

/// The sets a machine event concerns: its controlling set, or every set selecting it when
/// it is an orphan (so that one can adopt it).
pub(crate) fn sets_for_machine(
    machine: &Machine,
    sets: &Store<MachineSet>,
) -> Vec<ObjectRef<MachineSet>> {
    let ns = machine.namespace().unwrap_or_default();
    if let Some(owner) = controller_of(&machine.metadata) {
        if owner.kind == MachineSet::KIND {
            return vec![ObjectRef::new(&owner.name).within(&ns)];
        }
        return Vec::new();
    }
    sets.state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
        .filter(|s| selector_matches(s.spec.selector.as_ref(), machine.metadata.labels.as_ref()))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// The sets a budget event concerns: the sets of the machines it selects.
pub(crate) fn sets_for_budget(
    budget: &MachineDisruptionBudget,
    machines: &Store<Machine>,
    sets: &Store<MachineSet>,
) -> Vec<ObjectRef<MachineSet>> {
    let mut out: Vec<ObjectRef<MachineSet>> = machines
        .state()
        .iter()
        .filter(|m| disruptionbudget::decide::selects(budget, m))
        .flat_map(|m| sets_for_machine(m, sets))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};
    use serde_json::json;

    fn machine(name: &str, phase: &str) -> Arc<Machine> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": { "name": name, "namespace": "ns", "labels": { "node": name } },
                "spec": {},
                "status": {
                    "currentStatus": { "phase": phase },
                    "lastOperation": { "state": "Failed" },
                },
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_failed_machines_view_reads_its_nodes_preserve_annotation() {
        let (nodes, mut writer) = reflector::store::<Node>();
        for name in ["failed", "running"] {
            let node: Node = serde_json::from_value(json!({
                "metadata": { "name": name, "annotations": { annotations::PRESERVE: "when-failed" } },
            }))
            .unwrap();
            writer.apply_watcher_event(&watcher::Event::Apply(node));
        }
        let set: MachineSet = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
            "metadata": { "name": "set", "namespace": "ns" },
            "spec": {},
        }))
        .unwrap();
        let claimed = [machine("failed", "Failed"), machine("running", "Running")];
        // As gather reads the Nodes and plan makes the views.
        let views = |nodes: &Store<Node>, claimed: &[Arc<Machine>]| {
            let preserve = node_preserve_annotations(nodes, claimed);
            super::super::decide::views(&set, claimed, &preserve, jiff::Timestamp::UNIX_EPOCH)
        };
        let seen = views(&nodes, &claimed);
        // The Node's `when-failed` keeps the Failed machine instead of replacing it.
        assert!(seen[0].keep_if_failed);
        assert!(!seen[0].is_failed_to_replace());
        // Without its Node's value the same machine would be replaced.
        let (empty, _writer) = reflector::store::<Node>();
        let alone = views(&empty, &claimed[..1]);
        assert!(alone[0].is_failed_to_replace());
        // A machine that has not failed is neither kept nor replaced for it.
        assert!(!seen[1].is_failed_to_replace());
    }
}
