//! The effects of the budget controller: its Warning Events, published once per
//! transition, and its status writes.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Api, Resource, ResourceExt};
use mcm_api::MachineDisruptionBudget;
use mcm_api::disruption_budget::MachineDisruptionBudgetStatus;

use super::context::{Context, Error};
use crate::kube_api::{ApiResultExt, Part, merge_patch, status_patch};

/// The object reference of a budget for Events.
pub(crate) fn budget_reference(budget: &MachineDisruptionBudget) -> ObjectReference {
    budget.object_ref(&())
}

/// Publishes `warning` (reason, note) on the budget when it differs from the one announced
/// last for the budget by this process (no warning counts as an empty one).
pub(crate) async fn announce(
    ctx: &Context,
    budget: &MachineDisruptionBudget,
    warning: Option<&(&'static str, String)>,
) {
    let note = warning.map(|(r, n)| format!("{r}: {n}"));
    let uid = budget.metadata.uid.clone().unwrap_or_default();
    let changed = ctx
        .announced
        .is_new(&uid, note.as_deref().unwrap_or_default());
    if changed && let Some((reason, note)) = warning.cloned() {
        ctx.events
            .warning(&budget_reference(budget), reason, "Evaluate", note)
            .await;
    }
}

/// Writes `status` unless the budget has it already (a budget gone meanwhile needs no
/// status).
pub(crate) async fn update_status(
    ctx: &Context,
    budget: &MachineDisruptionBudget,
    status: &MachineDisruptionBudgetStatus,
) -> Result<(), Error> {
    if budget.status.as_ref() == Some(status) {
        return Ok(());
    }
    let ns = budget.namespace().unwrap_or_default();
    let name = budget.name_any();
    let api: Api<MachineDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = status_patch(status, &["desiredAvailable"]);
    let _ = merge_patch(&api, Part::Status, &name, &patch)
        .await
        .context("update status of", MachineDisruptionBudget::KIND, &name)?;
    Ok(())
}
