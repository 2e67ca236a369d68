//! One reconcile of a Machine: [`gather`](super::gather::gather) every read once,
//! [`plan`](super::plan::plan) purely, [`execute`](super::execute::execute) the plan.

use std::sync::Arc;

use kube::runtime::controller::Action;
use mcm_api::Machine;

use super::{Ctx, Error, execute, gather, plan};

/// How long a reconcile whose store copy predates our own write waits before looking again
/// (the watch event of the write normally wakes it sooner).
const STORE_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

/// The `controller` label of this controller's reconcile metrics.
pub(crate) const CONTROLLER: &str = "machine";

/// One reconcile of a Machine.
pub(crate) async fn reconcile(machine: Arc<Machine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // Decisions read the stores: wait for them to have synced (once, at start-up).
    if ctx
        .synced
        .subscribe()
        .wait_for(|synced| *synced)
        .await
        .is_err()
    {
        return Err(Error::Invariant(
            "the store readiness signal was dropped".into(),
        ));
    }
    // A copy older than our own last write would repeat what that write recorded; the
    // watch event of the write wakes the machine again (the requeue only bounds the wait).
    let Some(snapshot) = gather::gather(&ctx, &machine).await else {
        tracing::debug!("the store has not caught up with our last write yet");
        return Ok(Action::requeue(STORE_CATCH_UP));
    };
    let decision = plan::plan(&snapshot, &ctx.settings);
    tracing::debug!(plan = ?decision.plan, "plan");
    execute::execute(&ctx, &snapshot, decision).await
}

/// Retry policy of failed reconciles: exponential backoff per machine.
pub(crate) fn error_policy(machine: Arc<Machine>, err: &Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(error = %crate::error_chain(err), "reconcile failed");
    let driver_err = match err {
        Error::Driver { source, .. } => Some(source),
        _ => None,
    };
    Action::requeue(ctx.backoff(&machine, driver_err))
}
