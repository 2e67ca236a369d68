//! The MachineSet reconciler: the glue of one pass. It claims the set's machines
//! ([`super::decide::claim`]), keeps their specs and auto-preservation in line, plans the
//! replicas from what [`super::observe`] reads ([`super::decide::plan_replicas`]), asks the
//! budget gate about voluntary deletions ([`super::budget`]), carries the plan out
//! ([`super::act`]) and writes the status.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use mcm_api::owner::controller_reference;
use mcm_api::{Machine, MachineSet};

use super::budget::gate_deletions;
use super::context::{Context, Error, FINALIZER};
use super::decide::{self, Claim};
use super::model::ReplicaPlan;
use super::{act, observe};
use crate::kube_api::{self, RetryPolicy};

/// How often a set is reconciled without any event (MCM: 10 minutes).
pub const RESYNC_PERIOD: Duration = Duration::from_secs(600);
/// How soon a set whose deletions a budget holds back looks again at the latest (a change
/// of the budget's status wakes it sooner).
pub const BUDGET_RECHECK: Duration = Duration::from_secs(10);

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machineset";

/// Reconciles one MachineSet.
pub async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ns);
    let machines_api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = set.metadata.deletion_timestamp.is_some();
    let has_finalizer = set.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer && act::set_finalizer(&sets, &set, true).await?.is_gone() {
        return Ok(Action::await_change());
    }
    let key = format!("{ns}/{name}");
    let all = observe::machines_in(&ctx.machines, &ns);
    if !ctx.expectations.satisfied(&key, &all, ctx.clock.instant()) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }

    let uid = set.metadata.uid.clone().unwrap_or_default();
    if !deleting {
        act::warn_overlap(&ctx, &set, &all).await;
    }
    let mut claimed: Vec<Arc<Machine>> = Vec::new();
    for m in all {
        match decide::claim(&uid, deleting, set.spec.selector.as_ref(), &m) {
            Claim::Owned => claimed.push(m),
            Claim::Adopt => {
                let owner = Some(controller_reference(set.as_ref()));
                if act::set_controller(&machines_api, &m, owner).await? {
                    claimed.push(m);
                }
            }
            Claim::Release => {
                act::set_controller(&machines_api, &m, None).await?;
            }
            Claim::Ignore => {}
        }
    }
    if !deleting {
        act::sync_machine_specs(&machines_api, &set, &claimed).await?;
    }

    if deleting && claimed.is_empty() {
        // Gone already is as good as released.
        let _ = act::set_finalizer(&sets, &set, false).await?;
        // Nothing more is announced for a set that goes.
        if let Some(uid) = set.metadata.uid.as_deref() {
            ctx.overlaps.forget(uid);
            ctx.announced_blocks.forget(uid);
        }
        return Ok(Action::await_change());
    }

    if !deleting {
        // Before the replicas: a Failed machine annotated now is kept in this very pass.
        let max = set.spec.auto_preserve_failed_machine_max.unwrap_or(0);
        let plan = decide::plan_auto_preservation(max, claimed.iter().map(AsRef::as_ref));
        act::manage_auto_preservation(&machines_api, &plan, &mut claimed).await?;
    }

    let now = ctx.clock.now();
    let views = observe::views(&ctx.nodes, &set, &claimed, now);
    let plan = decide::plan_replicas(&observe::set_input(&set), &views);
    let manage = manage_replicas(&ctx, &machines_api, &set, &plan, &key, &claimed).await;
    let held_by_budget = matches!(manage, Ok(true));
    let manage = manage.map(|_| ());

    let counts = decide::count_machines(&views, set.spec.min_ready_seconds.unwrap_or(0), now);
    let held_back = act::update_status(&ctx, &sets, &set, &counts, manage.as_ref().err()).await?;
    manage?;
    // A Machine that disappears (also the last one of a deleting set) triggers this set
    // through the manager's deletion tap; no polling is needed for it.
    let recheck = counts
        .recheck_after
        .map_or(RESYNC_PERIOD, |after| after + Duration::from_secs(1));
    let recheck = if held_by_budget {
        recheck.min(BUDGET_RECHECK)
    } else {
        recheck
    };
    Ok(Action::requeue(
        held_back.map_or(recheck, |w| w.min(recheck)),
    ))
}

/// Creates and deletes machines as `plan` says; voluntary deletions ask the budget gate
/// first. `Ok(true)`: a budget (or budgets not listed yet) held back some deletion.
async fn manage_replicas(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    plan: &ReplicaPlan,
    key: &str,
    claimed: &[Arc<Machine>],
) -> Result<bool, Error> {
    if let Some(reason) = plan.scale_up_blocked {
        tracing::debug!(reason, "not creating machines");
    }
    let mut created = Vec::new();
    let mut result = Ok(());
    if plan.create > 0 {
        result = act::create_machines(ctx, api, set, plan.create, &mut created).await;
    }
    let mut deleted = Vec::new();
    let mut held = false;
    if !plan.delete.is_empty() && result.is_ok() {
        let (issue, admitted, refused) = gate_deletions(ctx, set, &plan.delete, claimed);
        held = !refused.is_empty();
        act::announce_refusals(ctx, set, &refused).await;
        if !issue.is_empty() {
            result = act::delete_machines(ctx, api, set, &issue, &mut deleted).await;
        }
        let ns = set.namespace().unwrap_or_default();
        for name in admitted.iter().filter(|n| !deleted.contains(n)) {
            ctx.budget_gate.forget(&ns, name);
        }
    }
    // The Events are the Go MCM's, one per batch: `SuccessfulCreate` and `SuccessfulDelete`
    // (no summary besides them).
    if !created.is_empty() || !deleted.is_empty() {
        ctx.expectations
            .record(key, created.clone(), deleted.clone(), ctx.clock.instant());
    }
    result.map(|()| held)
}

/// What to do after a failed reconcile: conflicts are retried quickly, the rest after a
/// few seconds ([`kube_api::error_policy`]).
pub fn error_policy(set: Arc<MachineSet>, error: &Error, _ctx: Arc<Context>) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineSet::KIND,
        &set.name_any(),
        error,
    )
}
