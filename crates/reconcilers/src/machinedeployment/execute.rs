//! The third part of a reconcile of a deployment: carries a [`Decision`] out, step by step,
//! through [`super::act`] and [`super::inplace::act`]. It decides nothing: the one outcome it
//! follows is the deployment gone while its finalizer is added.

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::controller::Action;
use mcm_api::MachineSet;

use super::act::{self, Actor};
use super::context::{Context, Error};
use super::gather::Gathered;
use super::inplace::act as in_place;
use super::plan::{Decision, End, Step};
use crate::kube_api::ApiResultExt;

/// Carries out `decision` for the deployment of `g`.
pub(crate) async fn execute(
    ctx: &Context,
    g: &Gathered,
    decision: Decision,
) -> Result<Action, Error> {
    let act = Actor::new(ctx, &g.d);
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    let mut held_back = None;
    for step in decision.steps {
        match step {
            Step::AddFinalizer => {
                if act.set_finalizer(true).await?.is_gone() {
                    return Ok(Action::await_change());
                }
            }
            Step::RemoveFinalizer => {
                // Gone already is as good as released.
                let _ = act.set_finalizer(false).await?;
            }
            Step::ForgetAnnouncements => act.forget_announcements(),
            Step::DeleteSets(names) => act.delete_sets(&names).await?,
            Step::WarnSelectingAll => act.warn_selecting_all().await,
            Step::MarkForDeletion { machine, time } => {
                act.mark_for_deletion(&machine, time.as_deref()).await?;
            }
            Step::UpdateTriggerDeletion(plan) => act.update_trigger_deletion(&plan).await?,
            Step::UntaintNodes { set, nodes } => {
                act::remove_old_set_taint(&ctx.target, &nodes)
                    .await
                    .context(
                        "remove the old-set taint from the nodes of",
                        MachineSet::KIND,
                        &set,
                    )?;
            }
            Step::Rollback { plan, template } => {
                tracing::info!(?plan, "rollback requested");
                act.rollback(&plan, template.as_deref()).await?;
            }
            Step::AdjustCreationTimeout { changes, event } => {
                act.adjust_creation_timeout(&changes, event.as_ref())
                    .await?;
            }
            Step::ReportInvalidStrategy {
                status,
                message,
                before,
            } => {
                act.report_invalid_strategy(*status, message, before.as_deref())
                    .await?;
            }
            Step::SyncRevision { new_set, plan } => act.sync_revision(&new_set, &plan).await?,
            Step::CreateNewSet {
                replicas,
                revision,
                max_surge,
            } => act.create_new_set(replicas, revision, max_surge).await?,
            Step::ScaleSet {
                set,
                current,
                replicas,
                max_surge,
                new_set,
            } => {
                act.scale_set(&set, current.as_ref(), replicas, max_surge, new_set)
                    .await?;
            }
            Step::DisableScaleUp(set) => act.disable_scale_up(&set).await?,
            Step::LabelNode { node, key } => in_place::label_node(&nodes, &node, key).await?,
            Step::UnlabelUpdateResult(machine) => act.unlabel_update_result(&machine).await?,
            Step::CleanNode(node) => in_place::clean_node(ctx, &nodes, &node).await?,
            Step::MoveMachine {
                machine,
                old_selector,
                from,
                new_set,
            } => in_place::move_machine(&act, &machine, &old_selector, &from, &new_set).await?,
            Step::Uncordon(node) => in_place::uncordon(ctx, &node).await?,
            Step::Selected(nodes) => {
                tracing::info!(?nodes, "selected nodes for an in-place update");
            }
            Step::PruneSets(names) => act.prune_sets(&names).await?,
            Step::ApplyMarkers { rolling_out } => {
                act::apply_markers(
                    &ctx.target,
                    &g.nodes,
                    &g.old_machines,
                    &g.all_machines,
                    rolling_out,
                    g.autoscaler_annotations,
                )
                .await;
            }
            Step::RemediationStopped(note) => act.remediation_stopped(note).await,
            Step::RemediationResumed(note) => act.remediation_resumed(note).await,
            Step::ZonePartitionLifted => act.zone_partition_lifted().await,
            Step::WriteStatus(status) => {
                held_back = act.update_status_paced(&status, &ctx.status_pacer).await?;
            }
        }
    }
    Ok(match decision.end {
        End::AwaitChange => Action::await_change(),
        End::Requeue(after) => Action::requeue(after),
        End::RequeueOrPacer(after) => {
            Action::requeue(held_back.map_or(after, |w: std::time::Duration| w.min(after)))
        }
    })
}
