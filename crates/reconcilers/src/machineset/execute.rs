//! The third part of a reconcile of a set: carries a [`Decision`] out, in its order, through
//! [`super::act`]. It decides nothing: it only follows the outcomes of its own writes as the
//! decision prescribes.

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use mcm_api::owner::controller_reference;
use mcm_api::{Machine, MachineSet};

use super::act;
use super::context::{Context, Error, SetProblem};
use super::model::Snapshot;
use super::plan::{AWAIT_EXPECTATIONS, Creation, Decision, GONE_RETRY, Manage, Work};

/// Carries out `decision` for the set of `s`.
pub(crate) async fn execute(
    ctx: &Context,
    s: &Snapshot,
    decision: Decision,
) -> Result<Action, Error> {
    let set = &*s.set;
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &namespace(set));
    if decision.add_finalizer && act::set_finalizer(&sets, set, true).await?.is_gone() {
        return Ok(Action::await_change());
    }
    if decision.clear_expectations {
        ctx.expectations.clear(&s.key);
    }
    match decision.work {
        Work::Idle => Ok(Action::await_change()),
        Work::AwaitExpectations => Ok(Action::requeue(AWAIT_EXPECTATIONS)),
        Work::Finish => {
            // Gone already is as good as released.
            let _ = act::set_finalizer(&sets, set, false).await?;
            act::forget_announcements(ctx, set);
            Ok(Action::await_change())
        }
        Work::Manage(manage) => self::manage(ctx, s, &sets, *manage).await,
    }
}

fn namespace(set: &MachineSet) -> String {
    set.namespace().unwrap_or_default()
}

/// Carries out a [`Manage`].
async fn manage(
    ctx: &Context,
    s: &Snapshot,
    sets: &Api<MachineSet>,
    m: Manage,
) -> Result<Action, Error> {
    let set = &*s.set;
    let ns = namespace(set);
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(note) = &m.overlap {
        act::announce_overlap(ctx, set, note).await;
    }
    for claim in &m.claims {
        let owner = claim.adopt.then(|| controller_reference(set));
        let present = act::set_controller(&machines, &claim.machine, owner).await?;
        if claim.adopt && !present {
            return Ok(Action::requeue(GONE_RETRY));
        }
    }
    act::sync_machine_specs(&machines, &m.spec_syncs).await?;
    if !act::manage_auto_preservation(&machines, &m.auto_preserve).await? {
        return Ok(Action::requeue(GONE_RETRY));
    }
    if let Some(reason) = m.scale_up_blocked {
        tracing::debug!(reason, "not creating machines");
    }
    let mut created = Vec::new();
    let mut status = &m.status.ok;
    let mut result = match &m.create {
        Creation::None => Ok(()),
        Creation::TemplateWithoutLabels => Err(Error::Problem(SetProblem::TemplateWithoutLabels(
            set.name_any(),
        ))),
        Creation::Create {
            batches,
            template,
            invalid_timeout,
        } => {
            act::create_machines(
                ctx,
                &machines,
                set,
                batches,
                template,
                invalid_timeout.as_deref(),
                &mut created,
            )
            .await
        }
    };
    if result.is_err() {
        status = &m.status.create_failed;
    }
    let mut deleted = Vec::new();
    let mut requeue = m.requeue;
    if let Some(d) = m.delete.as_ref().filter(|_| result.is_ok()) {
        let reserved = d
            .reservation
            .as_ref()
            .is_none_or(|r| ctx.budget_gate.commit(r, ctx.clock.instant()));
        let issue: Vec<String> = if reserved {
            act::announce_refusals(ctx, set, &d.refusals).await;
            d.issue.clone()
        } else {
            requeue = m.requeue_on_gate_conflict;
            d.issue
                .iter()
                .filter(|n| !d.admitted.contains(n))
                .cloned()
                .collect()
        };
        if !issue.is_empty() {
            result = act::delete_machines(ctx, &machines, set, &issue, &d.uids, &mut deleted).await;
            if result.is_err() {
                status = &m.status.delete_failed;
            }
        }
        if reserved {
            for name in d.admitted.iter().filter(|n| !deleted.contains(n)) {
                ctx.budget_gate.forget(&ns, name);
            }
        }
    }
    // The Events are the Go MCM's, one per batch: `SuccessfulCreate` and `SuccessfulDelete`
    // (no summary besides them).
    if !created.is_empty() || !deleted.is_empty() {
        ctx.expectations
            .record(&s.key, created, deleted, ctx.clock.instant());
    }
    let status = match &result {
        Ok(()) => status.clone(),
        Err(e) => act::with_failure_message(status, e.to_string()),
    };
    let held_back = act::update_status(ctx, sets, set, &status).await?;
    result?;
    Ok(Action::requeue(
        held_back.map_or(requeue, |w| w.min(requeue)),
    ))
}
