//! Carries out an in-place update step ([`InPlaceStep`]): the Node's `InPlaceUpdate`
//! condition, the drain, the machine's phase.

use crate::machine::decide::MachineConfig;
use crate::machine::drainplan;
use crate::machine::inplace::{InPlaceStep, NEXT_STEP};
use crate::machine::status::{self, Operation};
use crate::machine::{Ctx, Error};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use mcm_api::constants::node_conditions::{self, in_place};
use mcm_api::{Machine, MachineOperationType, MachinePhase};
use serde_json::json;
use std::time::Duration;

/// Carries out an in-place step; `None` for [`InPlaceStep::Nothing`] (the lifecycle step
/// goes on).
pub(crate) async fn inplace_step(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node: &Node,
    step: InPlaceStep,
) -> Option<Result<Action, Error>> {
    Some(match step {
        InPlaceStep::Nothing => return None,
        InPlaceStep::Await { after } => Ok(Action::requeue(after.min(ctx.settings.resync))),
        InPlaceStep::Condition { reason, message } => set_condition(ctx, node, reason, &message)
            .await
            .map(|()| Action::requeue(NEXT_STEP)),
        InPlaceStep::Drain { force, elapsed } => drain(ctx, m, cfg, node, force, elapsed).await,
        InPlaceStep::Phase { phase, op } => {
            let patch = status::status_patch(m, Some(&phase), &op, ctx.clock.now());
            match super::patch_status(ctx, m, patch).await {
                Ok(()) => {
                    let warning = op.state == mcm_api::MachineState::Failed;
                    let (reason, note) = (phase.as_str().to_string(), op.description.clone());
                    let reference = m.object_ref(&());
                    if warning {
                        ctx.events
                            .warning(&reference, &reason, "InPlaceUpdate", note)
                            .await;
                    } else {
                        ctx.events
                            .normal(&reference, &reason, "InPlaceUpdate", note)
                            .await;
                    }
                    Ok(Action::requeue(NEXT_STEP))
                }
                Err(e) => Err(e),
            }
        }
        InPlaceStep::Fail { reason } => super::mark_failed(ctx, m, &reason).await,
    })
}

/// Writes the Node's `InPlaceUpdate` condition (status `True`, as upstream).
async fn set_condition(ctx: &Ctx, node: &Node, reason: &str, message: &str) -> Result<(), Error> {
    let now = ctx.clock.now().to_string();
    let condition = json!({
        "type": node_conditions::IN_PLACE_UPDATE,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    });
    let what = "set the node's InPlaceUpdate condition";
    super::patch_node_condition(ctx, &node.name_any(), condition, what).await
}

/// One pass of the in-place drain: cordon and evict; once nothing is left, the machine is
/// `InPlaceUpdating` and the node `DrainSuccessful` (in that order, so a crash in between
/// drains again, which finds nothing, instead of skipping the phase).
async fn drain(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node: &Node,
    force: bool,
    elapsed: Duration,
) -> Result<Action, Error> {
    let name = node.name_any();
    let options = super::drain_options(ctx, m, cfg, force);
    let input = mcm_drain::PassInput {
        elapsed,
        pods_gone_for: None,
        unreachable: false,
        vm_dead: false,
    };
    let report = super::drain_node_pass(ctx, &name, &options, &input).await?;
    let retry = ctx.settings.eviction_retry_interval;
    match drainplan::pods_drain(&report, NEXT_STEP, retry) {
        drainplan::PodsDrain::Drained => {
            let op = Operation::processing(
                MachineOperationType::InPlaceUpdate,
                format!("Machine {} is undergoing an in-place update", m.name_any()),
            );
            let phase = MachinePhase::InPlaceUpdating;
            if m.phase() != Some(&phase) {
                let patch = status::status_patch(m, Some(&phase), &op, ctx.clock.now());
                super::patch_status(ctx, m, patch).await?;
            }
            set_condition(
                ctx,
                node,
                in_place::DRAIN_SUCCESSFUL,
                "Node draining successful",
            )
            .await?;
            ctx.events
                .normal(
                    &m.object_ref(&()),
                    "InPlaceUpdating",
                    "InPlaceUpdate",
                    op.description,
                )
                .await;
            Ok(Action::requeue(NEXT_STEP))
        }
        drainplan::PodsDrain::Failed(e) => {
            let op = Operation::processing(
                MachineOperationType::DrainNode,
                format!(
                    "Drain failed due to - {}. Will retry in next sync. Initiate node drain",
                    crate::error_chain(e)
                ),
            );
            let patch = status::status_patch(m, None, &op, ctx.clock.now());
            super::patch_status(ctx, m, patch).await?;
            Ok(Action::requeue(retry))
        }
        drainplan::PodsDrain::Draining(again) => Ok(Action::requeue(again)),
    }
}
