//! One reconcile's part of an in-place rollout: asks [`super::decide`] step by step what to
//! do, from the facts [`super::observe`] reads, and does it ([`super::act`]).

use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use mcm_api::constants::labels;

use super::super::act::Actor;
use super::super::context::{Context, Error};
use super::super::model::Snapshot;
use super::super::observe::Observed;
use super::act::{clean_node, label_node, scale, uncordon};
use super::decide;
use super::model::{NewSetPlan, OldSetsPlan};
use super::observe::{find_machine, in_place_snapshot};
use super::patch::transfer_patch;

/// Advances the in-place rollout of the deployment one reconcile (upstream's
/// `rolloutInPlace` after the new set exists). Returns whether anything was written.
///
/// Stops after the step that scaled a set for moved or fresh machines, or selected nodes
/// (the next reconcile sees the result), as upstream.
pub(crate) async fn rollout(
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

    for set in decide::sets_to_disable_scale_up(&s) {
        act.disable_scale_up(&set).await?;
        changed = true;
    }
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    for name in decide::nodes_to_mark_candidate(&s) {
        changed |= label_node(ctx, &nodes, &name, labels::CANDIDATE_FOR_UPDATE).await?;
    }

    let sync = decide::sync_machine_sets(&s);
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

    match decide::reconcile_new_machine_set(&s) {
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

    match decide::reconcile_old_machine_sets(&s) {
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
