//! The MachineDeployment reconciler: observes the deployment, its sets and their machines
//! ([`super::observe`]), asks [`super::decide`] what to do (pure) and applies it
//! ([`super::act`], one small action per decision); the in-place rollout
//! ([`super::inplace`]) and the trigger-deletion annotation ([`super::trigger`]) have their
//! own steps.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use mcm_api::constants::annotations;
use mcm_api::{Machine, MachineDeployment, MachineSet};

use super::act::{self, Actor};
use super::context::{Context, Error};
use super::decide;
use super::model::{Action as RolloutAction, RollbackPlan, Snapshot, Strategy};
use super::observe::{self, Observed, annotation_i64};
use super::status::{self, Counters, compute_status, invalid_strategy_status};
use super::{creation_timeout, inplace, trigger};
use crate::kube_api::{self, ApiResultExt, RetryPolicy};

/// How often a deployment is reconciled without any event (MCM: 10 minutes).
pub const RESYNC_PERIOD: Duration = Duration::from_secs(600);
/// Longest wait between reconciles of an unfinished in-place rollout.
pub const IN_PLACE_RECHECK: Duration = Duration::from_secs(30);
/// Old sets kept when `revisionHistoryLimit` is unset (the apps/v1 Deployment default).
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machinedeployment";

/// Reconciles one MachineDeployment.
pub async fn reconcile(d: Arc<MachineDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let act = Actor::new(&ctx, &d);
    let now = ctx.clock.now();
    let has_finalizer = d.finalizers().iter().any(|f| f == act::FINALIZER);
    let observed = observe::observe(&d, &ctx.sets.state(), &ctx.machines.state());
    if d.metadata.deletion_timestamp.is_some() {
        return finish_deletion(&act, &observed, has_finalizer).await;
    }
    if !has_finalizer && act.set_finalizer(true).await?.is_gone() {
        return Ok(Action::await_change());
    }
    if observe::selects_all(&d) {
        act.warn_selecting_all().await;
        return Ok(Action::await_change());
    }
    if handle_trigger_deletion(&d, &act, &observed, now).await? {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // As upstream: a paused deployment rolls back once it is resumed, and nothing else is
    // done in the reconcile that rolls back (the next one sees the new template).
    if let Some(to) = d
        .spec
        .rollback_to
        .as_ref()
        .filter(|_| d.spec.paused != Some(true))
    {
        rollback(&ctx, &d, &act, &observed, to.revision.unwrap_or(0)).await?;
        return Ok(Action::await_change());
    }

    let (adjusted, timeout_recheck) =
        adapt_creation_timeout(&ctx, &d, &act, &observed, now).await?;
    if adjusted {
        // The deployment's change brings the next reconcile, which copies the value to the
        // new set (as upstream, which ends the reconcile that adjusted it).
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let facts = observe::facts(&observed, now);
    let strategy = match observe::strategy_of(&d, ctx.target_cluster) {
        Ok(s) => s,
        Err(invalid) => {
            let counters = Counters::of(facts.new_set.as_ref(), &facts.old_sets);
            let input = observe::status_input(&d, facts.failed, false, now);
            let message = invalid.to_string();
            let status = invalid_strategy_status(d.spec.replicas(), counters, &input, &message);
            act.report_invalid_strategy(status).await?;
            // Nothing is rolled out or scaled until the strategy changes (an event).
            return Ok(Action::await_change());
        }
    };
    // A usable strategy: a later invalid one is announced again.
    if let Some(uid) = d.metadata.uid.as_deref() {
        ctx.announced.forget(uid);
    }
    let failed = facts.failed.clone();
    let snapshot = observe::snapshot(&d, strategy, facts);

    sync_revision(&d, &act, &observed).await?;
    let actions = decide::decide(&snapshot);
    for action in &actions {
        apply_action(&act, &observed, &snapshot, action).await?;
    }
    let in_place = matches!(snapshot.rollout.strategy, Strategy::InPlaceUpdate { .. });
    let mut progressed = !actions.is_empty();
    if in_place && actions.is_empty() && !snapshot.rollout.paused {
        progressed |= inplace::reconcile::rollout(&ctx, &act, &observed, &snapshot).await?;
    }
    if !progressed && !snapshot.rollout.paused && snapshot.is_complete() {
        let limit = d
            .spec
            .revision_history_limit
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT);
        act.prune_sets(&decide::sets_to_prune(&snapshot.old_sets, limit))
            .await?;
    }

    // Rollout markers on the target cluster's nodes; none are added or removed while
    // paused (as in the Go MCM, which only scales a paused deployment).
    if let Some(rolling_out) = decide::markers_wanted(&snapshot) {
        act::apply_markers(
            &ctx.target,
            &ctx.nodes,
            &observed.old_machines(),
            &observed.all_machines(),
            rolling_out,
            ctx.autoscaler_annotations,
        )
        .await;
    }

    let input = observe::status_input(&d, failed, progressed, now);
    let (mut status, recheck) = compute_status(&snapshot, &input);
    let members = observe::remediation_members(&observed, &ctx.nodes);
    let remediation = status::remediation_condition(
        &d.name_any(),
        d.metadata.annotations.as_ref(),
        &members,
        now,
    );
    let message = remediation
        .as_ref()
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    match status::apply_remediation_condition(&mut status, remediation, d.status.as_ref()) {
        Some(true) => act.remediation_stopped(message).await,
        Some(false) => act.remediation_resumed(message).await,
        None => {}
    }
    let (zone_members, zones) = observe::zone_census(&observed, &ctx.machines, &ctx.nodes);
    let mut rule = ctx.zone_partition;
    if let Some(hold) = d
        .annotations()
        .get(crate::machine::partition::MAX_HOLD_ANNOTATION)
        .and_then(|v| mcm_api::duration::parse_go_duration(v).ok())
    {
        rule.max_hold = hold;
    }
    let partition =
        status::partition_condition(&zones, &zone_members, &rule, d.status.as_ref(), now);
    if status::apply_partition_condition(&mut status, partition, d.status.as_ref()) {
        act.zone_partition_lifted().await;
    }
    let held_back = act.update_status_paced(&status, &ctx.status_pacer).await?;
    let min_ready = d.spec.min_ready_seconds.unwrap_or(0);
    let complete = snapshot.is_complete();
    let mut after = decide::requeue_after(recheck, RESYNC_PERIOD, min_ready, complete);
    if in_place && !complete {
        // Node and machine events move an in-place rollout on; this is the safety net.
        after = after.min(IN_PLACE_RECHECK);
    }
    if let Some(recheck) = timeout_recheck {
        after = after.min(recheck);
    }
    Ok(Action::requeue(held_back.map_or(after, |w| w.min(after))))
}

/// Handles `spec.rollbackTo`: plans it from the sets' revisions, removes the old-set taint
/// from the Nodes of the chosen set's machines, and updates the deployment.
async fn rollback(
    ctx: &Context,
    d: &MachineDeployment,
    act: &Actor<'_>,
    observed: &Observed,
    requested: i64,
) -> Result<(), Error> {
    let candidates = observe::rollback_candidates(d, observed);
    let plan = decide::plan_rollback(requested, &candidates);
    tracing::info!(?plan, requested, "rollback requested");
    if let RollbackPlan::To { set, .. } = &plan
        && let Some(s) = observed.sets.iter().find(|s| s.name_any() == *set)
    {
        let machines: Vec<&Machine> = observed.machines_of(s).iter().map(AsRef::as_ref).collect();
        act::remove_old_set_taint(&ctx.target, &ctx.nodes, &machines)
            .await
            .context(
                "remove the old-set taint from the nodes of",
                MachineSet::KIND,
                set,
            )?;
    }
    act.rollback(&plan, &observed.sets).await
}

/// A deployment being deleted: deletes its sets, then (none left) removes the finalizer.
async fn finish_deletion(
    act: &Actor<'_>,
    observed: &Observed,
    has_finalizer: bool,
) -> Result<Action, Error> {
    if !has_finalizer {
        return Ok(Action::await_change());
    }
    if observed.sets.is_empty() {
        // Gone already is as good as released.
        let _ = act.set_finalizer(false).await?;
        // Nothing more is announced for a deployment that goes.
        act.forget_announcements();
        return Ok(Action::await_change());
    }
    let live: Vec<&MachineSet> = observed
        .sets
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .map(AsRef::as_ref)
        .collect();
    act.delete_sets(&live).await?;
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Adapts the effective creation timeout to the machines' joins ([`creation_timeout`]):
/// returns whether the deployment's annotations were written, and when the rule wants to
/// look again.
async fn adapt_creation_timeout(
    ctx: &Context,
    d: &MachineDeployment,
    act: &Actor<'_>,
    observed: &Observed,
    now: Timestamp,
) -> Result<(bool, Option<Duration>), Error> {
    let settings = &ctx.creation_timeouts;
    let machines = observed.all_machines();
    let facts = creation_timeout::observe(d, &machines, settings.default_timeout);
    let plan = creation_timeout::decide(&facts, settings, now);
    let changes = creation_timeout::changes(d, &plan);
    if changes.is_empty() {
        return Ok((false, plan.recheck));
    }
    act.adjust_creation_timeout(&changes, plan.event.as_ref())
        .await?;
    Ok((true, plan.recheck))
}

/// What to do after a failed reconcile: conflicts are retried quickly, the rest after a
/// few seconds ([`kube_api::error_policy`]).
pub fn error_policy(d: Arc<MachineDeployment>, error: &Error, _ctx: Arc<Context>) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineDeployment::KIND,
        &d.name_any(),
        error,
    )
}

/// Keeps the new set's revision above all old revisions and copies it to the deployment.
async fn sync_revision(
    d: &MachineDeployment,
    act: &Actor<'_>,
    observed: &Observed,
) -> Result<(), Error> {
    let Some(new) = &observed.new_set else {
        return Ok(());
    };
    let plan = decide::plan_revision(
        annotation_i64(new.as_ref(), annotations::REVISION),
        new.annotations()
            .get(annotations::REVISION_HISTORY)
            .map(String::as_str),
        observed.max_old_revision(),
        annotation_i64(d, annotations::REVISION),
    );
    act.sync_revision(new, &plan).await
}

async fn apply_action(
    act: &Actor<'_>,
    observed: &Observed,
    snapshot: &Snapshot,
    action: &RolloutAction,
) -> Result<(), Error> {
    let surge = snapshot.rollout.strategy.max_surge();
    match action {
        RolloutAction::CreateNewSet { replicas } => {
            let revision = observed.max_old_revision() + 1;
            act.create_new_set(*replicas, revision, surge).await
        }
        RolloutAction::Scale { set, replicas } => {
            let current = snapshot
                .new_set
                .iter()
                .chain(snapshot.old_sets.iter())
                .find(|s| &s.name == set);
            let new_set = snapshot.new_set.as_ref().is_some_and(|n| &n.name == set);
            act.scale_set(set, current, *replicas, surge, new_set).await
        }
    }
}

/// Handles the trigger-deletion annotation ([`trigger::plan_trigger_deletion`]): marks the
/// named machines of this deployment for deletion and rewrites the annotation. Returns
/// whether anything was written: the reconcile then ends, so that no set is scaled before
/// the machine store has seen the marks (the set controller reads the same store).
async fn handle_trigger_deletion(
    d: &MachineDeployment,
    act: &Actor<'_>,
    observed: &Observed,
    now: Timestamp,
) -> Result<bool, Error> {
    let anns = d.annotations();
    let Some(value) = anns.get(annotations::TRIGGER_DELETION_BY_MCM) else {
        return Ok(false);
    };
    let set_time = observed
        .new_set
        .as_ref()
        .and_then(|s| {
            s.annotations()
                .get(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
        })
        .and_then(|t| t.parse().ok());
    let now = trigger::replica_change_time(now, set_time);
    let input = trigger::TriggerInput {
        value,
        replica_change_time: anns
            .get(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
            .map(String::as_str),
        now: &now,
    };
    let plan = trigger::plan_trigger_deletion(&input, &observed.trigger_machines());
    for (machine, time) in &plan.mark {
        act.mark_for_deletion(machine, time.as_deref()).await?;
    }
    if plan.update_deployment {
        act.update_trigger_deletion(&plan).await?;
    }
    Ok(plan.update_deployment || !plan.mark.is_empty())
}
