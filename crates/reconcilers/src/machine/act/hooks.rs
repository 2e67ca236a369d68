//! The deletion's lifecycle hooks: waiting for their owners, and giving up on them after the
//! hook timeout.

use std::time::Duration;

use kube::runtime::controller::Action;
use mcm_api::Machine;

use super::announce::announce;
use super::records::{name, set_progress};
use crate::machine::announcement::{Announcement, Note};
use crate::machine::decide::MachineConfig;
use crate::machine::drainplan::deletion_step;
use crate::machine::hooks::HookStage;
use crate::machine::{Ctx, Error};

/// Deletion waits for the lifecycle hooks of `stage`: said once in the status and an Event,
/// then looked at again when the Machine changes (the owner removes its annotation) or the
/// hook timeout passes.
pub(crate) async fn await_hooks(
    ctx: &Ctx,
    m: &Machine,
    stage: HookStage,
    hooks: &[String],
    remaining: Option<Duration>,
) -> Result<Action, Error> {
    let description = format!(
        "Deletion of machine {} waits for {stage} hook(s) {} to be removed by their owners",
        name(m),
        hooks.join(", ")
    );
    let note = Note::normal("WaitingForHook", "Delete", description.clone());
    if announce(ctx, m, deletion_step(description, vec![note])).await? {
        ctx.metrics.hook_wait();
    }
    Ok(remaining.map_or_else(Action::await_change, |r| {
        Action::requeue(r + Duration::from_secs(1))
    }))
}

/// The hook timeout passed: the stage's hooks are given up on (recorded durably, so the
/// deletion goes on past them after a restart too), with a Warning.
pub(crate) async fn expire_hooks(
    ctx: &Ctx,
    m: &Machine,
    stage: HookStage,
    hooks: &[String],
    cfg: &MachineConfig,
) -> Result<Action, Error> {
    set_progress(ctx, m, stage.expired_annotation()).await?;
    let description = format!(
        "Deletion of machine {} goes on past its {stage} hook(s) {}: they were not removed within --machine-lifecycle-hook-timeout ({})",
        name(m),
        hooks.join(", "),
        mcm_api::duration::format_go_duration(cfg.hook_timeout.unwrap_or_default())
    );
    let note = Note::warning("HookTimedOut", "Delete", description);
    announce(ctx, m, Announcement::events(vec![note])).await?;
    Ok(Action::await_change())
}
