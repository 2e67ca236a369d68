//! The second part of a reconcile of a deployment, pure: from what [`super::gather`] read,
//! every write and Event of the reconcile in order ([`Step`]) and how it ends ([`End`]). It
//! composes the pure rules: [`super::trigger`], [`super::decide`] (rollback, revisions,
//! rollout, pruning, markers, requeue), [`super::creation_timeout`], [`super::status`] and
//! the in-place rollout's [`super::inplace::decide`].
//!
//! Early ends are decided here, not by the outcome of a write: a deletion, a deployment
//! selecting everything, trigger-deletion marks, a rollback, an adjusted creation timeout
//! and an invalid strategy each end the reconcile after their steps, as before. The one
//! outcome execute follows is the set gone while its finalizer is added (it ends at once).
//! An in-place rollout's later steps are decided from the snapshot as its earlier steps
//! leave it ([`InPlaceSnapshot::scale`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use mcm_api::constants::{annotations, labels};
use mcm_api::{Machine, MachineDeploymentStatus, MachineSet, MachineTemplateSpec};

use super::creation_timeout;
use super::decide;
use super::gather::Gathered;
use super::inplace::decide as in_place;
use super::inplace::model::{InPlaceSnapshot, NewSetPlan, OldSetsPlan};
use super::model::{
    Action as RolloutAction, LABEL_TRUE, RevisionPlan, RollbackPlan, SetState, Strategy,
};
use super::status::{self, Counters, StatusInput};
use super::trigger::{self, TriggerPlan};

/// How often a deployment is reconciled without any event (MCM: 10 minutes).
pub(crate) const RESYNC_PERIOD: Duration = Duration::from_secs(600);
/// Longest wait between reconciles of an unfinished in-place rollout.
pub(crate) const IN_PLACE_RECHECK: Duration = Duration::from_secs(30);
/// Old sets kept when `revisionHistoryLimit` is unset (the apps/v1 Deployment default).
pub(crate) const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;
/// How soon a deployment whose sets are being deleted looks again.
pub(crate) const DELETION_RECHECK: Duration = Duration::from_secs(10);
/// How soon a reconcile that ended after its own write to the deployment or its machines
/// looks again (the write's watch event normally comes first).
pub(crate) const AFTER_OWN_WRITE: Duration = Duration::from_secs(1);

/// One write or Event of a reconcile.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Add the finalizer (the deployment gone: the reconcile ends).
    AddFinalizer,
    /// Remove the finalizer (gone already is as good as released).
    RemoveFinalizer,
    /// Forget what was announced for the deployment (it goes, or its strategy is usable
    /// again: a later invalid one is announced again).
    ForgetAnnouncements,
    /// Delete these sets (the deployment is being deleted).
    DeleteSets(Vec<String>),
    /// Warn that the deployment selects every machine.
    WarnSelectingAll,
    /// Mark a machine for deletion (trigger-deletion annotation).
    MarkForDeletion {
        /// The machine.
        machine: String,
        /// Its marked-for-deletion time (`None`: it keeps its own).
        time: Option<String>,
    },
    /// Rewrite the trigger-deletion annotation.
    UpdateTriggerDeletion(TriggerPlan),
    /// Remove the old-set taint from these Nodes (of the machines of the set a rollback
    /// returns to).
    UntaintNodes {
        /// The set.
        set: String,
        /// Its machines' Nodes.
        nodes: Vec<Arc<Node>>,
    },
    /// Carry out a rollback.
    Rollback {
        /// The plan.
        plan: RollbackPlan,
        /// The template of the set rolled back to (`None` with a `To` plan: the set has none,
        /// the reconcile fails).
        template: Option<Box<MachineTemplateSpec>>,
    },
    /// Write the effective creation timeout's annotations, then publish the Event.
    AdjustCreationTimeout {
        /// The annotations (a value, or `None` to remove).
        changes: std::collections::BTreeMap<&'static str, Option<String>>,
        /// The Normal Event: reason and note.
        event: Option<(&'static str, String)>,
    },
    /// Write the status of an invalid strategy and announce it.
    ReportInvalidStrategy {
        /// The status (with its `InvalidStrategy` condition).
        status: Box<MachineDeploymentStatus>,
        /// The condition's message (the announcement).
        message: String,
        /// The message of the `InvalidStrategy` condition the deployment has stored.
        before: Option<String>,
    },
    /// Record the revision on the new set and the deployment.
    SyncRevision {
        /// The new set.
        new_set: Arc<MachineSet>,
        /// The revision plan.
        plan: RevisionPlan,
    },
    /// Create the new set.
    CreateNewSet {
        /// Its replicas.
        replicas: i32,
        /// Its revision.
        revision: i64,
        /// The strategy's max surge (its replica annotations).
        max_surge: i32,
    },
    /// Scale a set.
    ScaleSet {
        /// The set.
        set: String,
        /// The set as decided from (its replicas before: the Event).
        current: Option<SetState>,
        /// The replicas.
        replicas: i32,
        /// The strategy's max surge (its replica annotations).
        max_surge: i32,
        /// It is the new set.
        new_set: bool,
    },
    /// Label an old set scale-up-disabled.
    DisableScaleUp(String),
    /// Label a Node `key: "true"` (as the store had it).
    LabelNode {
        /// The Node.
        node: Arc<Node>,
        /// The label.
        key: &'static str,
    },
    /// Remove the `update-result` label of a machine.
    UnlabelUpdateResult(String),
    /// Clean a Node up after its in-place update (uncordon, labels, taints).
    CleanNode(String),
    /// Move an in-place updated machine to the new set.
    MoveMachine {
        /// The machine as observed.
        machine: Arc<Machine>,
        /// The selector of its old set.
        old_selector: std::collections::BTreeMap<String, String>,
        /// The old set's name.
        from: String,
        /// The new set.
        new_set: Arc<MachineSet>,
    },
    /// Uncordon a Node.
    Uncordon(String),
    /// Log the Nodes selected for an in-place update.
    Selected(Vec<String>),
    /// Delete old sets beyond the revision history limit.
    PruneSets(Vec<String>),
    /// Put or remove the rollout markers on the machines' Nodes.
    ApplyMarkers {
        /// A rollout is under way.
        rolling_out: bool,
    },
    /// Announce that remediation stopped (Warning).
    RemediationStopped(String),
    /// Announce that remediation is allowed again.
    RemediationResumed(String),
    /// Announce that no zone is partitioned any more.
    ZonePartitionLifted,
    /// Write the status, paced.
    WriteStatus(Box<MachineDeploymentStatus>),
}

/// How a reconcile ends after its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Wait for a change.
    AwaitChange,
    /// Look again after this long.
    Requeue(Duration),
    /// Look again after this long, or sooner when the status pacer held the status back.
    RequeueOrPacer(Duration),
}

/// What one reconcile of a deployment does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// The writes and Events, in order.
    pub(crate) steps: Vec<Step>,
    /// How it ends.
    pub(crate) end: End,
}

/// Decides one reconcile of the deployment of `g`. Pure.
pub(crate) fn plan(g: &Gathered) -> Decision {
    let d = &*g.d;
    let has_finalizer = d.finalizers().iter().any(|f| f == super::act::FINALIZER);
    let done = |steps, end| Decision { steps, end };
    if d.metadata.deletion_timestamp.is_some() {
        return deletion(g, has_finalizer);
    }
    let mut steps = Vec::new();
    if !has_finalizer {
        steps.push(Step::AddFinalizer);
    }
    if g.selects_all {
        steps.push(Step::WarnSelectingAll);
        return done(steps, End::AwaitChange);
    }
    let marks = trigger_deletion(g);
    if !marks.is_empty() {
        // No set is scaled before the machine store has seen the marks (the set controller
        // reads the same store).
        steps.extend(marks);
        return done(steps, End::Requeue(AFTER_OWN_WRITE));
    }
    // As upstream: a paused deployment rolls back once it is resumed, and nothing else is
    // done in the reconcile that rolls back (the next one sees the new template).
    if let Some(to) = d
        .spec
        .rollback_to
        .as_ref()
        .filter(|_| d.spec.paused != Some(true))
    {
        steps.extend(rollback(g, to.revision.unwrap_or(0)));
        return done(steps, End::AwaitChange);
    }
    let (adjust, timeout_recheck) = creation_timeout_step(g);
    if let Some(adjust) = adjust {
        // The deployment's change brings the next reconcile, which copies the value to the
        // new set (as upstream, which ends the reconcile that adjusted it).
        steps.push(adjust);
        return done(steps, End::Requeue(AFTER_OWN_WRITE));
    }
    let snapshot = match &g.rollout {
        Ok(s) => s,
        Err(message) => {
            let counters = Counters::of(g.facts.new_set.as_ref(), &g.facts.old_sets);
            let input = status_input(g, false);
            let status =
                status::invalid_strategy_status(d.spec.replicas(), counters, &input, message);
            steps.push(Step::ReportInvalidStrategy {
                message: invalid_strategy_message(Some(&status)).unwrap_or_default(),
                before: invalid_strategy_message(d.status.as_ref()),
                status: Box::new(status),
            });
            // Nothing is rolled out or scaled until the strategy changes (an event).
            return done(steps, End::AwaitChange);
        }
    };
    steps.push(Step::ForgetAnnouncements);
    steps.extend(sync_revision(g));
    let actions = decide::decide(snapshot);
    let surge = snapshot.rollout.strategy.max_surge();
    for action in &actions {
        steps.push(rollout_step(g, snapshot, action, surge));
    }
    let in_place = matches!(snapshot.rollout.strategy, Strategy::InPlaceUpdate { .. });
    let mut progressed = !actions.is_empty();
    if in_place
        && actions.is_empty()
        && !snapshot.rollout.paused
        && let Some(s) = &g.in_place
    {
        let (in_place_steps, changed) = in_place_rollout(g, s.clone());
        steps.extend(in_place_steps);
        progressed |= changed;
    }
    if !progressed && !snapshot.rollout.paused && snapshot.is_complete() {
        let limit = d
            .spec
            .revision_history_limit
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT);
        let prune = decide::sets_to_prune(&snapshot.old_sets, limit);
        if !prune.is_empty() {
            steps.push(Step::PruneSets(prune));
        }
    }
    // Rollout markers on the target cluster's nodes; none are added or removed while
    // paused (as in the Go MCM, which only scales a paused deployment).
    if let Some(rolling_out) = decide::markers_wanted(snapshot) {
        steps.push(Step::ApplyMarkers { rolling_out });
    }
    let (status_steps, recheck) = status_steps(g, snapshot, progressed);
    steps.extend(status_steps);
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
    done(steps, End::RequeueOrPacer(after))
}

/// The message of the `InvalidStrategy` condition of `status`.
fn invalid_strategy_message(status: Option<&MachineDeploymentStatus>) -> Option<String> {
    status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| status::is_invalid_strategy(c)))
        .and_then(|c| c.message.clone())
}

/// A deployment being deleted: deletes its sets, then (none left) removes the finalizer.
fn deletion(g: &Gathered, has_finalizer: bool) -> Decision {
    if !has_finalizer {
        return Decision {
            steps: Vec::new(),
            end: End::AwaitChange,
        };
    }
    if g.observed.sets.is_empty() {
        // Nothing more is announced for a deployment that goes.
        return Decision {
            steps: vec![Step::RemoveFinalizer, Step::ForgetAnnouncements],
            end: End::AwaitChange,
        };
    }
    let live = g
        .observed
        .sets
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .map(|s| s.name_any())
        .collect();
    Decision {
        steps: vec![Step::DeleteSets(live)],
        end: End::Requeue(DELETION_RECHECK),
    }
}

/// The steps of the trigger-deletion annotation ([`trigger::plan_trigger_deletion`]): marks
/// the named machines of this deployment for deletion and rewrites the annotation.
fn trigger_deletion(g: &Gathered) -> Vec<Step> {
    let anns = g.d.annotations();
    let Some(value) = anns.get(annotations::TRIGGER_DELETION_BY_MCM) else {
        return Vec::new();
    };
    let set_time = g
        .observed
        .new_set
        .as_ref()
        .and_then(|s| {
            s.annotations()
                .get(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
        })
        .and_then(|t| t.parse().ok());
    let now = trigger::replica_change_time(g.now, set_time);
    let input = trigger::TriggerInput {
        value,
        replica_change_time: anns
            .get(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
            .map(String::as_str),
        now: &now,
    };
    let plan = trigger::plan_trigger_deletion(&input, &g.trigger_machines);
    let mut steps: Vec<Step> = plan
        .mark
        .iter()
        .map(|(machine, time)| Step::MarkForDeletion {
            machine: machine.clone(),
            time: time.clone(),
        })
        .collect();
    if plan.update_deployment {
        steps.push(Step::UpdateTriggerDeletion(plan));
    }
    steps
}

/// The steps of `spec.rollbackTo`: planned from the sets' revisions, the old-set taint
/// goes from the Nodes of the chosen set's machines, then the deployment is updated.
fn rollback(g: &Gathered, requested: i64) -> Vec<Step> {
    let plan = decide::plan_rollback(requested, &g.rollback_candidates);
    let mut steps = Vec::new();
    let mut template = None;
    if let RollbackPlan::To { set, .. } = &plan
        && let Some(s) = g.observed.sets.iter().find(|s| s.name_any() == *set)
    {
        let nodes = g
            .observed
            .machines
            .get(set)
            .into_iter()
            .flatten()
            .filter_map(|m| g.nodes.get(m.node_name()?).cloned())
            .collect();
        steps.push(Step::UntaintNodes {
            set: set.clone(),
            nodes,
        });
        template = s.spec.template.clone().map(Box::new);
    }
    steps.push(Step::Rollback { plan, template });
    steps
}

/// The adaptation of the effective creation timeout to the machines' joins
/// ([`creation_timeout`]): the write when the annotations change, and when the rule wants
/// to look again.
fn creation_timeout_step(g: &Gathered) -> (Option<Step>, Option<Duration>) {
    let settings = &g.creation_timeouts;
    let machines: Vec<&Machine> = g.all_machines.iter().map(AsRef::as_ref).collect();
    let facts = creation_timeout::observe(&g.d, &machines, settings.default_timeout);
    let plan = creation_timeout::decide(&facts, settings, g.now);
    let changes = creation_timeout::changes(&g.d, &plan);
    if changes.is_empty() {
        return (None, plan.recheck);
    }
    let step = Step::AdjustCreationTimeout {
        changes,
        event: plan.event.clone(),
    };
    (Some(step), plan.recheck)
}

/// Keeps the new set's revision above all old revisions and copies it to the deployment.
fn sync_revision(g: &Gathered) -> Option<Step> {
    let new_set = g.observed.new_set.clone()?;
    let r = &g.revisions;
    let plan = decide::plan_revision(
        r.new_set,
        r.new_set_history.as_deref(),
        r.max_old,
        r.deployment,
    );
    Some(Step::SyncRevision { new_set, plan })
}

/// The step of a rollout action.
fn rollout_step(
    g: &Gathered,
    snapshot: &super::model::Snapshot,
    action: &RolloutAction,
    max_surge: i32,
) -> Step {
    match action {
        RolloutAction::CreateNewSet { replicas } => Step::CreateNewSet {
            replicas: *replicas,
            revision: g.revisions.max_old + 1,
            max_surge,
        },
        RolloutAction::Scale { set, replicas } => Step::ScaleSet {
            set: set.clone(),
            current: snapshot
                .new_set
                .iter()
                .chain(snapshot.old_sets.iter())
                .find(|s| &s.name == set)
                .cloned(),
            replicas: *replicas,
            max_surge,
            new_set: snapshot.new_set.as_ref().is_some_and(|n| &n.name == set),
        },
    }
}

/// The steps of one reconcile's part of an in-place rollout (upstream's `rolloutInPlace`
/// after the new set exists), and whether it writes anything. Stops after the step that
/// scaled a set for moved or fresh machines, or selected nodes (the next reconcile sees the
/// result), as upstream.
fn in_place_rollout(g: &Gathered, mut s: InPlaceSnapshot) -> (Vec<Step>, bool) {
    let new_name = s.new_set.state.name.clone();
    let mut steps = Vec::new();
    let mut changed = false;
    for set in in_place::sets_to_disable_scale_up(&s) {
        steps.push(Step::DisableScaleUp(set));
        changed = true;
    }
    for name in in_place::nodes_to_mark_candidate(&s) {
        if let Some(step) = label_node(g, &name, labels::CANDIDATE_FOR_UPDATE) {
            steps.push(step);
            changed = true;
        }
    }
    let sync = in_place::sync_machine_sets(&s);
    if let Some(replicas) = sync.new_replicas {
        steps.push(scale(&mut s, &new_name, replicas));
    }
    steps.extend(sync.unlabel.iter().cloned().map(Step::UnlabelUpdateResult));
    steps.extend(sync.clean.iter().cloned().map(Step::CleanNode));
    for (set, replicas) in &sync.old_replicas {
        steps.push(scale(&mut s, set, *replicas));
    }
    changed |= !sync.is_empty();

    match in_place::reconcile_new_machine_set(&s) {
        NewSetPlan::Nothing => {}
        NewSetPlan::Scale(replicas) => {
            steps.push(scale(&mut s, &new_name, replicas));
            return (steps, true);
        }
        NewSetPlan::Moves {
            moves,
            old_replicas,
            new_replicas,
        } => {
            let Some(new_set) = g.observed.new_set.clone() else {
                return (steps, changed);
            };
            for m in &moves {
                // The plan comes from the observed sets: always there. Were it not, the
                // sets are scaled for the machines moved so far by the next sync.
                let Some((machine, old_set)) = find_machine(g, &m.from, &m.machine) else {
                    return (steps, true);
                };
                let old_selector = old_set
                    .spec
                    .selector
                    .as_ref()
                    .and_then(|s| s.match_labels.clone())
                    .unwrap_or_default();
                steps.push(Step::MoveMachine {
                    machine,
                    old_selector,
                    from: m.from.clone(),
                    new_set: new_set.clone(),
                });
                steps.push(Step::Uncordon(m.node.clone()));
            }
            for (set, replicas) in &old_replicas {
                steps.push(scale(&mut s, set, *replicas));
            }
            steps.push(scale(&mut s, &new_name, new_replicas));
            return (steps, true);
        }
    }

    match in_place::reconcile_old_machine_sets(&s) {
        OldSetsPlan::Nothing => (steps, changed),
        OldSetsPlan::ScaleToZero(sets) => {
            for set in &sets {
                steps.push(scale(&mut s, set, 0));
            }
            (steps, true)
        }
        OldSetsPlan::Select(selected) => {
            for node in &selected {
                steps.extend(label_node(g, node, labels::SELECTED_FOR_UPDATE));
            }
            steps.push(Step::Selected(selected));
            (steps, true)
        }
    }
}

/// Scales the set `name` of an in-place rollout (max surge 0: upstream's for in-place
/// updates) and records it in `s`, from which the later steps are decided.
fn scale(s: &mut InPlaceSnapshot, name: &str, replicas: i32) -> Step {
    let current = std::iter::once(&s.new_set)
        .chain(s.old_sets.iter())
        .find(|x| x.state.name == name)
        .map(|x| x.state.clone());
    let new_set = s.new_set.state.name == name;
    s.scale(name, replicas);
    Step::ScaleSet {
        set: name.to_owned(),
        current,
        replicas,
        max_surge: 0,
        new_set,
    }
}

/// The label `key: "true"` on the Node `name`, unless the store has no such Node or it has
/// the label already.
fn label_node(g: &Gathered, name: &str, key: &'static str) -> Option<Step> {
    let node = g.nodes.get(name)?;
    (node.labels().get(key).map(String::as_str) != Some(LABEL_TRUE)).then(|| Step::LabelNode {
        node: node.clone(),
        key,
    })
}

/// The machine `machine` of the set `set` with its set, as observed.
fn find_machine(g: &Gathered, set: &str, machine: &str) -> Option<(Arc<Machine>, Arc<MachineSet>)> {
    let set = g.observed.sets.iter().find(|s| s.name_any() == set)?;
    let machine = g
        .observed
        .machines
        .get(&set.name_any())?
        .iter()
        .find(|m| m.name_any() == machine)?;
    Some((machine.clone(), set.clone()))
}

/// The status inputs besides the snapshot.
fn status_input(g: &Gathered, progressed: bool) -> StatusInput<'_> {
    let d = &*g.d;
    StatusInput {
        generation: d.metadata.generation,
        progress_deadline_seconds: d.spec.progress_deadline_seconds,
        previous: d.status.as_ref(),
        failed_machines: g.facts.failed.clone(),
        progressed,
        now: g.now,
        max_unavailable: g.max_unavailable,
    }
}

/// The status (with the remediation and zone-partition conditions), its Events, and when
/// the status wants to look again.
fn status_steps(
    g: &Gathered,
    snapshot: &super::model::Snapshot,
    progressed: bool,
) -> (Vec<Step>, Option<Duration>) {
    let d = &*g.d;
    let input = status_input(g, progressed);
    let (mut status, recheck) = status::compute_status(snapshot, &input);
    let mut steps = Vec::new();
    let remediation = status::remediation_condition(
        &d.name_any(),
        d.metadata.annotations.as_ref(),
        &g.remediation_members,
        g.now,
    );
    let message = remediation
        .as_ref()
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    match status::apply_remediation_condition(&mut status, remediation, d.status.as_ref()) {
        Some(true) => steps.push(Step::RemediationStopped(message)),
        Some(false) => steps.push(Step::RemediationResumed(message)),
        None => {}
    }
    let mut rule = g.zone_partition;
    if let Some(hold) = d
        .annotations()
        .get(crate::machine::partition::MAX_HOLD_ANNOTATION)
        .and_then(|v| mcm_api::duration::parse_go_duration(v).ok())
    {
        rule.max_hold = hold;
    }
    let partition =
        status::partition_condition(&g.zones, &g.zone_members, &rule, d.status.as_ref(), g.now);
    if status::apply_partition_condition(&mut status, partition, d.status.as_ref()) {
        steps.push(Step::ZonePartitionLifted);
    }
    steps.push(Step::WriteStatus(Box::new(status)));
    (steps, recheck)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use mcm_api::MachineDeployment;
    use serde_json::json;

    use super::*;
    use crate::machinedeployment::gather::Revisions;
    use crate::machinedeployment::observe;

    /// What gather would read for `d` with these sets and machines (no Nodes).
    fn gathered(
        d: serde_json::Value,
        sets: &[Arc<MachineSet>],
        machines: &[Arc<Machine>],
    ) -> Gathered {
        let mut v = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": {
                "name": "d", "namespace": "ns", "uid": "d-uid", "generation": 1,
                "finalizers": [super::super::act::FINALIZER],
            },
            "spec": {
                "replicas": 2,
                "selector": { "matchLabels": { "pool": "a" } },
                "template": {
                    "metadata": { "labels": { "pool": "a" } },
                    "spec": { "class": { "kind": "MachineClass", "name": "c" } },
                },
            },
        });
        merge(&mut v, d);
        let d: Arc<MachineDeployment> = Arc::new(serde_json::from_value(v).unwrap());
        let now = "2026-11-29T10:00:00Z".parse().unwrap();
        let observed = observe::observe(&d, sets, machines);
        let facts = observe::facts(&observed, now);
        Gathered {
            now,
            selects_all: observe::selects_all(&d),
            all_machines: observed.machines.values().flatten().cloned().collect(),
            old_machines: Vec::new(),
            trigger_machines: observed.trigger_machines(),
            rollback_candidates: observe::rollback_candidates(&d, &observed),
            revisions: Revisions {
                max_old: observed.max_old_revision(),
                ..Revisions::default()
            },
            rollout: observe::strategy_of(&d, true)
                .map(|s| observe::snapshot(&d, s, facts.clone()))
                .map_err(|e| e.to_string()),
            facts,
            in_place: None,
            nodes: BTreeMap::new(),
            remediation_members: Vec::new(),
            zone_members: Vec::new(),
            zones: BTreeSet::new(),
            max_unavailable: observe::availability_max_unavailable(&d),
            creation_timeouts: Default::default(),
            zone_partition: Default::default(),
            autoscaler_annotations: true,
            observed,
            d,
        }
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    /// A set of the deployment `d-uid`.
    fn set(name: &str) -> Arc<MachineSet> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
                "metadata": {
                    "name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                    "ownerReferences": [{
                        "apiVersion": "machine.sapcloud.io/v1alpha1",
                        "kind": "MachineDeployment", "name": "d", "uid": "d-uid",
                        "controller": true,
                    }],
                },
                "spec": { "replicas": 1, "selector": { "matchLabels": { "pool": "old" } } },
            }))
            .unwrap(),
        )
    }

    /// The kinds of `steps`, by name.
    fn kinds(steps: &[Step]) -> Vec<&'static str> {
        steps
            .iter()
            .map(|s| match s {
                Step::AddFinalizer => "AddFinalizer",
                Step::RemoveFinalizer => "RemoveFinalizer",
                Step::ForgetAnnouncements => "ForgetAnnouncements",
                Step::DeleteSets(_) => "DeleteSets",
                Step::WarnSelectingAll => "WarnSelectingAll",
                Step::MarkForDeletion { .. } => "MarkForDeletion",
                Step::UpdateTriggerDeletion(_) => "UpdateTriggerDeletion",
                Step::UntaintNodes { .. } => "UntaintNodes",
                Step::Rollback { .. } => "Rollback",
                Step::AdjustCreationTimeout { .. } => "AdjustCreationTimeout",
                Step::ReportInvalidStrategy { .. } => "ReportInvalidStrategy",
                Step::SyncRevision { .. } => "SyncRevision",
                Step::CreateNewSet { .. } => "CreateNewSet",
                Step::ScaleSet { .. } => "ScaleSet",
                Step::DisableScaleUp(_) => "DisableScaleUp",
                Step::LabelNode { .. } => "LabelNode",
                Step::UnlabelUpdateResult(_) => "UnlabelUpdateResult",
                Step::CleanNode(_) => "CleanNode",
                Step::MoveMachine { .. } => "MoveMachine",
                Step::Uncordon(_) => "Uncordon",
                Step::Selected(_) => "Selected",
                Step::PruneSets(_) => "PruneSets",
                Step::ApplyMarkers { .. } => "ApplyMarkers",
                Step::RemediationStopped(_) => "RemediationStopped",
                Step::RemediationResumed(_) => "RemediationResumed",
                Step::ZonePartitionLifted => "ZonePartitionLifted",
                Step::WriteStatus(_) => "WriteStatus",
            })
            .collect()
    }

    #[test]
    fn each_kind_of_reconcile_has_its_steps_and_its_end() {
        let deleting = "2026-11-29T09:00:00Z";
        let old = [set("old")];
        // (deployment, sets, steps, end)
        type Case<'a> = (serde_json::Value, &'a [Arc<MachineSet>], Vec<&'a str>, End);
        let cases: Vec<Case<'_>> = vec![
            (
                json!({"metadata": {"deletionTimestamp": deleting, "finalizers": ["x"]}}),
                &[],
                vec![],
                End::AwaitChange,
            ),
            (
                json!({"metadata": {"deletionTimestamp": deleting}}),
                &[],
                vec!["RemoveFinalizer", "ForgetAnnouncements"],
                End::AwaitChange,
            ),
            (
                json!({"metadata": {"deletionTimestamp": deleting}}),
                &old,
                vec!["DeleteSets"],
                End::Requeue(DELETION_RECHECK),
            ),
            (
                json!({"metadata": {"finalizers": []}, "spec": {"selector": null}}),
                &[],
                vec!["AddFinalizer", "WarnSelectingAll"],
                End::AwaitChange,
            ),
            (
                json!({"spec": {"strategy": {"type": "BlueGreen"}}}),
                &[],
                vec!["ReportInvalidStrategy"],
                End::AwaitChange,
            ),
            (
                json!({"spec": {"rollbackTo": {"revision": 7}}}),
                &[],
                vec!["Rollback"],
                End::AwaitChange,
            ),
            (
                json!({"metadata": {"annotations": {
                    annotations::TRIGGER_DELETION_BY_MCM: "gone-machine",
                }}}),
                &[],
                vec!["UpdateTriggerDeletion"],
                End::Requeue(AFTER_OWN_WRITE),
            ),
        ];
        for (d, sets, steps, end) in cases {
            let what = d.to_string();
            let decision = plan(&gathered(d, sets, &[]));
            assert_eq!(kinds(&decision.steps), steps, "{what}");
            assert_eq!(decision.end, end, "{what}");
        }
    }

    #[test]
    fn a_new_deployment_creates_its_set_and_writes_its_status() {
        let decision = plan(&gathered(json!({}), &[], &[]));
        assert_eq!(
            kinds(&decision.steps),
            [
                "ForgetAnnouncements",
                "CreateNewSet",
                "ApplyMarkers",
                "WriteStatus"
            ]
        );
        assert!(matches!(
            decision.steps[1],
            Step::CreateNewSet {
                replicas: 2,
                revision: 1,
                ..
            }
        ));
        assert!(matches!(decision.end, End::RequeueOrPacer(_)));
        // Its old set (another template) is scaled as the rollout says; the revision of the
        // new set comes after the old sets'.
        let decision = plan(&gathered(json!({}), &[set("old")], &[]));
        let create = decision
            .steps
            .iter()
            .find(|s| matches!(s, Step::CreateNewSet { .. }));
        assert!(matches!(
            create,
            Some(Step::CreateNewSet { revision: 1, .. })
        ));
    }

    #[test]
    fn the_in_place_scaling_is_decided_from_the_snapshot_its_earlier_steps_leave() {
        use crate::machinedeployment::inplace::model::{InPlaceSet, InPlaceSnapshot};
        use crate::machinedeployment::model::Orchestration;
        let g = gathered(json!({}), &[], &[]);
        let state = |name: &str, replicas| SetState::new(name, replicas);
        let s = InPlaceSnapshot {
            replicas: 2,
            max_unavailable: 1,
            orchestration: Orchestration::Auto,
            frozen: false,
            new_set: InPlaceSet {
                state: state("new", 0),
                scale_up_disabled: false,
                machines: Vec::new(),
            },
            old_sets: vec![InPlaceSet {
                state: state("old", 2),
                scale_up_disabled: false,
                machines: Vec::new(),
            }],
        };
        let mut replicas: BTreeMap<String, i32> =
            [("new".to_owned(), 0), ("old".to_owned(), 2)].into();
        let (steps, changed) = in_place_rollout(&g, s);
        assert!(changed);
        // Every scaling names the replicas it changes from as the earlier steps left them.
        let mut scaled = 0;
        for step in &steps {
            if let Step::ScaleSet {
                set,
                current,
                replicas: to,
                max_surge,
                ..
            } = step
            {
                assert_eq!(*max_surge, 0, "no surge for in-place updates");
                assert_eq!(
                    current.as_ref().map(|c| c.replicas),
                    replicas.get(set).copied()
                );
                replicas.insert(set.clone(), *to);
                scaled += 1;
            }
        }
        assert!(scaled > 0, "{steps:?}");
    }
}
