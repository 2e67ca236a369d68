//! The facts of an in-place rollout from the stores: the deployment's sets with their
//! machines and those machines' Nodes (`in_place_snapshot`).

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use mcm_api::constants::labels;
use mcm_api::{Machine, MachineSet};

use super::super::context::Context;
use super::super::model::{SetState, Snapshot, Strategy};
use super::super::observe::Observed;
use super::model::{InPlaceSet, InPlaceSnapshot, MachineFacts};

/// The in-place view of the deployment: its sets with their machines and those machines'
/// Nodes from the Node store. `None` unless the strategy is `InPlaceUpdate` and the new set
/// exists.
pub(crate) fn in_place_snapshot(
    ctx: &Context,
    observed: &Observed,
    snapshot: &Snapshot,
) -> Option<InPlaceSnapshot> {
    let Strategy::InPlaceUpdate {
        max_unavailable,
        orchestration,
        ..
    } = snapshot.rollout.strategy
    else {
        return None;
    };
    let new_set = observed.new_set.as_deref()?;
    let new_state = snapshot.new_set.clone()?;
    let in_place_set = |set: &MachineSet, state: SetState| InPlaceSet {
        state,
        scale_up_disabled: set
            .labels()
            .contains_key(labels::MACHINE_SET_SCALE_UP_DISABLED),
        machines: machine_facts(ctx, observed.machines_of(set)),
    };
    let old_states: BTreeMap<&str, &SetState> = snapshot
        .old_sets
        .iter()
        .map(|o| (o.name.as_str(), o))
        .collect();
    let old_sets = observed
        .old_sets()
        .filter_map(|set| {
            let state = old_states.get(set.name_any().as_str())?;
            Some(in_place_set(set, (*state).clone()))
        })
        .collect();
    Some(InPlaceSnapshot {
        replicas: snapshot.rollout.replicas,
        max_unavailable,
        orchestration,
        frozen: snapshot.rollout.frozen,
        new_set: in_place_set(new_set, new_state),
        old_sets,
    })
}

/// The facts of `machines` (by name) with their Nodes from the store.
pub(crate) fn machine_facts(ctx: &Context, machines: &[Arc<Machine>]) -> Vec<MachineFacts> {
    let mut facts: Vec<MachineFacts> = machines
        .iter()
        .map(|m| {
            let node = m
                .node_name()
                .and_then(|n| ctx.nodes.get(&ObjectRef::new(n)));
            MachineFacts::of(m, node.as_deref())
        })
        .collect();
    facts.sort_by(|a, b| a.name.cmp(&b.name));
    facts
}
