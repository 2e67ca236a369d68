//! One reconcile of a MachineDeployment: [`gather`](super::gather::gather) every read once,
//! [`plan`](super::plan::plan) purely, [`execute`](super::execute::execute) the plan.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use mcm_api::MachineDeployment;

use super::context::{Context, Error};
use super::{execute, gather, plan};
use crate::kube_api::{self, RetryPolicy};

/// The `controller` label of this controller's reconcile metrics.
pub(crate) const CONTROLLER: &str = "machinedeployment";

/// Reconciles one MachineDeployment.
pub(crate) async fn reconcile(
    d: Arc<MachineDeployment>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let gathered = gather::gather(&ctx, &d);
    let decision = plan::plan(&gathered);
    tracing::debug!(steps = decision.steps.len(), end = ?decision.end, "plan");
    execute::execute(&ctx, &gathered, decision).await
}

/// What to do after a failed reconcile: conflicts are retried quickly, the rest after a
/// few seconds ([`kube_api::error_policy`]).
pub(crate) fn error_policy(d: Arc<MachineDeployment>, error: &Error, _ctx: Arc<Context>) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineDeployment::KIND,
        &d.name_any(),
        error,
    )
}
