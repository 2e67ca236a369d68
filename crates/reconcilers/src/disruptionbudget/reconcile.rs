//! The budget reconciler: observes a budget's machines and the gate's ledger, decides its
//! verdict and status, announces and writes them.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use mcm_api::MachineDisruptionBudget;

use super::context::{Context, Error};
use super::gate::WAIT_TIMEOUT;
use super::{act, decide, observe};
use crate::kube_api::{self, RetryPolicy};

/// The `controller` label of this controller's reconcile metrics.
pub(crate) const CONTROLLER: &str = "machinedisruptionbudget";
/// How often a budget is reconciled without any event.
pub(crate) const RESYNC_PERIOD: Duration = Duration::from_secs(300);
/// How often a budget with windows is looked at (a window opens or closes on a minute).
pub(crate) const WINDOW_PERIOD: Duration = Duration::from_secs(30);

/// Reconciles one budget.
pub(crate) async fn reconcile(
    budget: Arc<MachineDisruptionBudget>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let now = ctx.clock.now();
    let observed = observe::observe(&ctx, &budget);
    let selected = observed.selected(&budget);
    let verdict = decide::verdict(
        &budget,
        &selected,
        &observed.in_flight,
        &observed.waiting,
        now,
    );
    act::announce(&ctx, &budget, verdict.warning.as_ref()).await;
    let status = decide::desired_status(&budget, &verdict, now);
    act::update_status(&ctx, &budget, &status).await?;
    let mut next = if budget.spec.windows.as_ref().is_some_and(|w| !w.is_empty()) {
        WINDOW_PERIOD
    } else {
        RESYNC_PERIOD
    };
    if !observed.waiting.is_empty() {
        // Waits expire: look again so that the condition stops naming them.
        next = next.min(WAIT_TIMEOUT);
    }
    Ok(Action::requeue(next))
}

/// What to do after a failed reconcile ([`kube_api::error_policy`]).
pub(crate) fn error_policy(
    budget: Arc<MachineDisruptionBudget>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineDisruptionBudget::KIND,
        &budget.name_any(),
        error,
    )
}
