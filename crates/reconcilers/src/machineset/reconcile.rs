//! One reconcile of a MachineSet: [`gather`](super::gather::gather) every read once,
//! [`plan`](super::plan::plan) purely, [`execute`](super::execute::execute) the plan.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use mcm_api::MachineSet;

use super::context::{Context, Error};
use super::{execute, gather, plan};
use crate::kube_api::{self, RetryPolicy};

/// The `controller` label of this controller's reconcile metrics.
pub(crate) const CONTROLLER: &str = "machineset";

/// Reconciles one MachineSet.
pub(crate) async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let snapshot = gather::gather(&ctx, &set);
    let decision = plan::plan(&snapshot);
    tracing::debug!(?decision, "plan");
    execute::execute(&ctx, &snapshot, decision).await
}

/// What to do after a failed reconcile: conflicts are retried quickly, the rest after a
/// few seconds ([`kube_api::error_policy`]).
pub(crate) fn error_policy(set: Arc<MachineSet>, error: &Error, _ctx: Arc<Context>) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineSet::KIND,
        &set.name_any(),
        error,
    )
}
