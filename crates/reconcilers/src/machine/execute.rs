//! The third part of a reconcile: carries out a [`Decision`] (effects only; the actions are in
//! [`act`]).

use kube::ResourceExt;
use kube::runtime::controller::Action;
use mcm_api::Machine;

use super::decide::Step;
use super::gather::Snapshot;
use super::plan::{Decision, PartitionHold, Plan, WhenDrained};
use super::{Ctx, Error, act, nodetemplate, observe};

/// Carries out `decision` for the machine of `s`.
pub(crate) async fn execute(ctx: &Ctx, s: &Snapshot, decision: Decision) -> Result<Action, Error> {
    let m = &*s.machine;
    for announcement in decision.announcements {
        act::announce(ctx, m, announcement).await?;
    }
    match &decision.partition_hold {
        PartitionHold::Unchanged => {}
        PartitionHold::Held(zone) => ctx.note_partition_hold(m, Some(zone)),
        PartitionHold::Released => ctx.note_partition_hold(m, None),
    }
    let node = s.node.as_deref();
    match decision.plan {
        Plan::DeleteMachine => delete_machine_of_deleted_node(ctx, m).await,
        Plan::Preserve(step) => act::preserve_step(ctx, m, &s.cfg, node, step)
            .await
            .unwrap_or_else(|| {
                Err(Error::Invariant(
                    "a preservation plan without a step".into(),
                ))
            }),
        Plan::InPlace(step) => {
            let Some(node) = node else {
                return Err(Error::Invariant("an in-place plan without a node".into()));
            };
            act::inplace_step(ctx, m, &s.cfg, node, step)
                .await
                .unwrap_or_else(|| Err(Error::Invariant("an in-place plan without a step".into())))
        }
        Plan::Lifecycle {
            step,
            node_write,
            when_drained,
        } => {
            // The node template, with the Node finalizer and the machine-name label when the
            // Node misses them, in one write.
            if let (Some(node), Some(write)) = (node, &node_write) {
                nodetemplate::write(ctx, m, node, write).await?;
            }
            lifecycle_step(ctx, s, step, when_drained).await
        }
    }
}

/// Carries out a lifecycle [`Step`].
async fn lifecycle_step(
    ctx: &Ctx,
    s: &Snapshot,
    step: Step,
    when_drained: WhenDrained,
) -> Result<Action, Error> {
    let (m, cfg, node) = (&*s.machine, &s.cfg, s.node.as_deref());
    match step {
        Step::AddFinalizer => act::add_finalizer(ctx, m).await,
        Step::ReportClassProblem(p) => act::report_class_problem(ctx, m, &p).await,
        Step::CreateVm => act::create_vm(ctx, m, cfg).await,
        Step::FinishCreation => act::finish_creation(ctx, m, cfg).await,
        Step::MarkAvailable => act::mark_available(ctx, m).await,
        Step::AwaitNode { remaining } => Ok(Action::requeue(remaining.min(ctx.settings.resync))),
        Step::MarkRunning => act::mark_running(ctx, m, node).await,
        Step::MarkUnknown { reason } => act::mark_unknown(ctx, m, &reason, node).await,
        Step::AwaitRecovery { remaining } => Ok(Action::requeue(
            remaining
                .unwrap_or(ctx.settings.resync)
                .min(ctx.settings.resync),
        )),
        Step::MarkFailed { reason } => act::mark_failed(ctx, m, &reason).await,
        Step::ThrottleReplacement { throttled, reason } => {
            act::throttle_replacement(ctx, m, &throttled, &reason).await
        }
        Step::AwaitReplacementPermit => Ok(Action::requeue(act::PERMIT_BUSY_RECHECK)),
        Step::Frozen => {
            act::hold(
                ctx,
                m,
                "machine controller is frozen by the safety controller",
            )
            .await
        }
        Step::HeldByPartition {
            partition,
            remaining,
        } => {
            let deployment = s.deployment.as_deref();
            let max_hold = cfg.zone_partition_max_hold;
            act::hold_for_partition(ctx, m, deployment, &partition, max_hold, remaining).await
        }
        Step::Protected { reason } => {
            act::hold(ctx, m, &format!("not marked Failed: {reason}")).await
        }
        Step::AwaitHooks {
            stage,
            hooks,
            remaining,
        } => act::await_hooks(ctx, m, stage, &hooks, remaining).await,
        Step::ExpireHooks { stage, hooks } => act::expire_hooks(ctx, m, stage, &hooks, cfg).await,
        Step::KeepRunning => act::keep_running(ctx, m, node).await,
        Step::Nothing => Ok(Action::await_change()),
        Step::MarkTerminating => {
            act::mark_terminating(ctx, m, node, observe::vm_requested(m)).await
        }
        Step::DrainPass {
            first,
            force,
            force_reason,
            unreachable,
            vm_dead,
            elapsed,
            pods_gone_for,
        } => {
            let Some(node_name) = observe::node_name(m) else {
                return Err(Error::Invariant("DrainPass without a node name".into()));
            };
            let mut cordon = true;
            if first {
                let Some(node) = node else {
                    return Err(Error::Invariant(
                        "the first drain pass without a node".into(),
                    ));
                };
                act::set_node_terminating(ctx, node, m).await?;
                act::cordon_for_deletion(ctx, node).await?;
                cordon = false;
            }
            let pass = act::PassPlan {
                first,
                force,
                force_reason: force_reason.as_deref(),
                unreachable,
                vm_dead: vm_dead.as_deref(),
                elapsed,
                pods_gone_for,
                cordon,
            };
            match act::drain_pass(ctx, m, cfg, node_name, pass).await? {
                act::DeletionDrain::Wait(action) => Ok(action),
                // The deletion goes on at once when its next step needs no wait.
                act::DeletionDrain::Drained(drained) => {
                    match when_drained.after(drained.without_eviction) {
                        WhenDrained::DeleteVm => {
                            act::drained_and_going_on(ctx, m, &drained).await?;
                            act::delete_vm(ctx, m).await
                        }
                        WhenDrained::Record => act::record_drained(ctx, m, drained).await,
                    }
                }
            }
        }
        Step::DeleteVolumeAttachments => act::delete_volume_attachments(ctx, m).await,
        Step::DeleteVm => act::delete_vm(ctx, m).await,
        Step::DeletionBlocked(problem) => act::deletion_blocked(ctx, m, &problem).await,
        Step::DeleteNode => act::delete_node(ctx, m).await,
        Step::RemoveFinalizer => act::finish_deletion(ctx, m).await,
    }
}

/// Deletes a Machine whose Node was deleted (MCM's rule: the node's deletion deletes its
/// machine, which then drains the Node if it still exists and deletes the VM).
async fn delete_machine_of_deleted_node(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let node = observe::node_name(m).unwrap_or_default();
    tracing::info!(node, "node deleted: deleting its machine");
    let api: kube::Api<Machine> =
        kube::Api::namespaced(ctx.control.clone(), &ctx.settings.namespace);
    let outcome = crate::kube_api::delete(&api, &m.name_any(), &Default::default())
        .await
        .map_err(|e| Error::kube("delete the machine of a deleted node", e))?;
    if outcome.is_gone() {
        return Ok(Action::await_change());
    }
    ctx.events
        .normal(
            &kube::Resource::object_ref(m, &()),
            "NodeDeleted",
            "Delete",
            format!("node {node} was deleted: deleting the machine"),
        )
        .await;
    Ok(Action::await_change())
}
