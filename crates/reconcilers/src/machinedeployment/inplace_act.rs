//! The async half of an in-place rollout: reads the deployment's machines with their Nodes
//! from the stores, asks [`super::inplace`] step by step what to do and does it (one small
//! action per decision, each idempotent).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use mcm_api::constants::labels;
use mcm_api::{Machine, MachineSet};

use super::act::Actor;
use super::controller::{Context, DeploymentProblem, Error};
use super::decide::{SetState, Snapshot, Strategy};
use super::inplace::{
    self, InPlaceSet, InPlaceSnapshot, MachineFacts, NewSetPlan, OldSetsPlan, cleanup_patch,
    label_patch, transfer_patch,
};
use super::observe::Observed;
use crate::kube_api::{ApiCallError, ApiErrorExt, ApiResultExt};

/// Attempts of a Node update planned from a fresh read that meets conflicts.
const CONFLICT_RETRIES: usize = 5;

/// Advances the in-place rollout of the deployment one reconcile (upstream's
/// `rolloutInPlace` after the new set exists). Returns whether anything was written.
///
/// Stops after the step that scaled a set for moved or fresh machines, or selected nodes
/// (the next reconcile sees the result), as upstream.
pub async fn rollout(
    ctx: &Context,
    act: &Actor<'_>,
    observed: &Observed,
    snapshot: &Snapshot,
) -> Result<bool, Error> {
    let Some(mut s) = in_place_snapshot(ctx, observed, snapshot) else {
        return Ok(false);
    };
    let new_name = s.new_set.state.name.clone();
    let mut changed = false;

    for set in inplace::sets_to_disable_scale_up(&s) {
        act.disable_scale_up(&set).await?;
        changed = true;
    }
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    for name in inplace::nodes_to_mark_candidate(&s) {
        changed |= label_node(ctx, &nodes, &name, labels::CANDIDATE_FOR_UPDATE).await?;
    }

    let sync = inplace::sync_machine_sets(&s);
    if let Some(replicas) = sync.new_replicas {
        scale(act, &mut s, &new_name, replicas).await?;
    }
    for machine in &sync.unlabel {
        act.unlabel_update_result(machine).await?;
    }
    for node in &sync.clean {
        clean_node(ctx, &nodes, node).await?;
    }
    for (set, replicas) in &sync.old_replicas {
        scale(act, &mut s, set, *replicas).await?;
    }
    changed |= !sync.is_empty();

    match inplace::reconcile_new_machine_set(&s) {
        NewSetPlan::Nothing => {}
        NewSetPlan::Scale(replicas) => {
            scale(act, &mut s, &new_name, replicas).await?;
            return Ok(true);
        }
        NewSetPlan::Moves {
            moves,
            old_replicas,
            new_replicas,
        } => {
            let Some(new_set) = observed.new_set.as_deref() else {
                return Ok(changed);
            };
            for m in &moves {
                // The plan comes from `observed`: always there. Were it not, the sets are
                // scaled for the machines moved so far by the next sync.
                let Some((machine, old_set)) = find_machine(observed, &m.from, &m.machine) else {
                    return Ok(true);
                };
                let selector = old_set
                    .spec
                    .selector
                    .as_ref()
                    .and_then(|s| s.match_labels.clone())
                    .unwrap_or_default();
                let patch = transfer_patch(machine, &selector, new_set);
                act.move_machine(&m.machine, &patch).await?;
                tracing::info!(
                    machine = %m.machine,
                    from = %m.from,
                    to = %new_set.name_any(),
                    "moved an in-place updated machine to the new MachineSet"
                );
                uncordon(ctx, &m.node).await?;
            }
            for (set, replicas) in &old_replicas {
                scale(act, &mut s, set, *replicas).await?;
            }
            scale(act, &mut s, &new_name, new_replicas).await?;
            return Ok(true);
        }
    }

    match inplace::reconcile_old_machine_sets(&s) {
        OldSetsPlan::Nothing => Ok(changed),
        OldSetsPlan::ScaleToZero(sets) => {
            for set in &sets {
                scale(act, &mut s, set, 0).await?;
            }
            Ok(true)
        }
        OldSetsPlan::Select(selected) => {
            for node in &selected {
                label_node(ctx, &nodes, node, labels::SELECTED_FOR_UPDATE).await?;
            }
            tracing::info!(nodes = ?selected, "selected nodes for an in-place update");
            Ok(true)
        }
    }
}

/// The in-place view of the deployment: its sets with their machines and those machines'
/// Nodes from the Node store. `None` unless the strategy is `InPlaceUpdate` and the new set
/// exists.
fn in_place_snapshot(
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
fn machine_facts(ctx: &Context, machines: &[Arc<Machine>]) -> Vec<MachineFacts> {
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

fn find_machine<'a>(
    observed: &'a Observed,
    set: &str,
    machine: &str,
) -> Option<(&'a Machine, &'a MachineSet)> {
    let set = observed.sets.iter().find(|s| s.name_any() == set)?;
    let machine = observed
        .machines_of(set)
        .iter()
        .find(|m| m.name_any() == machine)?;
    Some((machine.as_ref(), set.as_ref()))
}

/// Scales the set `name` through the actor and records it in `s`.
async fn scale(
    act: &Actor<'_>,
    s: &mut InPlaceSnapshot,
    name: &str,
    replicas: i32,
) -> Result<(), Error> {
    let current = std::iter::once(&s.new_set)
        .chain(s.old_sets.iter())
        .find(|x| x.state.name == name)
        .map(|x| x.state.clone());
    // Upstream's MaxSurge is 0 for in-place updates: max-replicas is the replicas.
    let new_set = s.new_set.state.name == name;
    act.scale_set(name, current.as_ref(), replicas, 0, new_set)
        .await?;
    s.scale(name, replicas);
    Ok(())
}

/// Labels the Node `name` (as the store has it) `key: "true"`; false when it has the label
/// already or is unknown or gone.
async fn label_node(ctx: &Context, api: &Api<Node>, name: &str, key: &str) -> Result<bool, Error> {
    let Some(node) = ctx.nodes.get(&ObjectRef::new(name)) else {
        return Ok(false);
    };
    let Some(patch) = label_patch(&node, key) else {
        return Ok(false);
    };
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(ApiCallError::new("label", "Node", name, e).into()),
    }
}

/// Uncordons the Node `name`: removes what the drain's cordon added
/// ([`mcm_drain::uncordon`]); a Node gone or not cordoned by the drain is fine.
async fn uncordon(ctx: &Context, name: &str) -> Result<(), Error> {
    mcm_drain::uncordon(ctx.target.clone(), name)
        .await
        .map_err(|source| {
            Error::Problem(DeploymentProblem::Uncordon {
                node: name.to_owned(),
                source,
            })
        })?;
    Ok(())
}

/// Cleans up the Node `name` after the successful in-place update of its machine: uncordons
/// it, then applies [`cleanup_patch`] planned from a fresh read (the store's copy is stale
/// after the uncordon), again after a conflict. Uncordoning first makes a crash in between
/// harmless: the Node keeps `update-result` until both are done.
async fn clean_node(ctx: &Context, api: &Api<Node>, name: &str) -> Result<(), Error> {
    uncordon(ctx, name).await?;
    for attempt in 1..=CONFLICT_RETRIES {
        let Some(node) = api.get_opt(name).await.context("get", "Node", name)? else {
            return Ok(());
        };
        let Some(patch) = cleanup_patch(&node) else {
            return Ok(());
        };
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, "cleaned up a node after its in-place update");
                return Ok(());
            }
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) if e.is_conflict() && attempt < CONFLICT_RETRIES => {}
            Err(e) => {
                let action = "clean up after the in-place update";
                return Err(ApiCallError::new(action, "Node", name, e).into());
            }
        }
    }
    Ok(())
}
