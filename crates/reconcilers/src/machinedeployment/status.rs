//! Pure computation of a MachineDeployment's status counters and conditions.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{
    ConditionStatus, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachineDeploymentStatus, MachineSummary,
};

use super::model::{SetState, Snapshot};

/// Condition reasons (the strings of the Go controller).
pub(crate) mod reasons {
    /// The new MachineSet is fully available.
    pub(crate) const NEW_MACHINE_SET_AVAILABLE: &str = "NewMachineSetAvailable";
    /// A MachineSet was scaled or created: the rollout progresses.
    pub(crate) const MACHINE_SET_UPDATED: &str = "MachineSetUpdated";
    /// The rollout made no progress within `progressDeadlineSeconds`.
    pub(crate) const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// The deployment is paused.
    pub(crate) const PAUSED: &str = "DeploymentPaused";
    /// The deployment was resumed.
    pub(crate) const RESUMED: &str = "DeploymentResumed";
    /// At least `replicas - maxUnavailable` machines are available.
    pub(crate) const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
    /// Fewer than `replicas - maxUnavailable` machines are available.
    pub(crate) const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
    /// `spec.strategy` cannot be resolved: nothing is rolled out or scaled until it is fixed
    /// (`Progressing=False`; the condition is replaced once the strategy is valid again).
    pub(crate) const INVALID_STRATEGY: &str = "InvalidStrategy";
}

/// Inputs besides the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusInput<'a> {
    /// `metadata.generation` of the deployment.
    pub generation: Option<i64>,
    /// `spec.progressDeadlineSeconds`.
    pub progress_deadline_seconds: Option<i32>,
    /// The previous status.
    pub previous: Option<&'a MachineDeploymentStatus>,
    /// Failed machines of all sets.
    pub failed_machines: Vec<MachineSummary>,
    /// Whether this reconcile changed a set (created or scaled).
    pub progressed: bool,
    /// Current time.
    pub now: Timestamp,
    /// The machines that may be unavailable for `Available=True`
    /// ([`super::observe::availability_max_unavailable`]).
    pub max_unavailable: i32,
}

/// Finds a condition by type.
pub(crate) fn condition<'a>(
    conditions: Option<&'a Vec<MachineDeploymentCondition>>,
    type_: &MachineDeploymentConditionType,
) -> Option<&'a MachineDeploymentCondition> {
    conditions.and_then(|c| c.iter().find(|x| &x.type_ == type_))
}

/// Sets a condition, keeping the transition time when the status does not change.
pub(crate) fn set_condition(
    conditions: &mut Vec<MachineDeploymentCondition>,
    mut new: MachineDeploymentCondition,
) {
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) {
        if existing.status == new.status && existing.reason == new.reason {
            // Keep the transition time; update the update time only if the message changed.
            if existing.message != new.message {
                existing.message = new.message;
                existing.last_update_time = new.last_update_time;
            }
            return;
        }
        if existing.status == new.status {
            new.last_transition_time = existing.last_transition_time.clone();
        }
        *existing = new;
    } else {
        conditions.push(new);
    }
}

fn make(
    type_: MachineDeploymentConditionType,
    status: ConditionStatus,
    reason: &str,
    message: String,
    now: Timestamp,
) -> MachineDeploymentCondition {
    MachineDeploymentCondition {
        type_,
        status,
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
        reason: Some(reason.to_owned()),
        message: Some(message),
    }
}

/// Reasons of the `RemediationAllowed` condition.
pub(crate) mod remediation_reasons {
    /// Fewer machines are unhealthy than the short-circuit allows.
    pub(crate) const ALLOWED: &str = "RemediationAllowed";
    /// More machines are unhealthy than the short-circuit allows: none is replaced.
    pub(crate) const TOO_MANY_UNHEALTHY: &str = "TooManyUnhealthy";
    /// A remediation annotation does not resolve: remediation is held.
    pub(crate) const INVALID_POLICY: &str = "InvalidRemediationPolicy";
}

/// The `RemediationAllowed` condition (mcm-rs) of a deployment from its remediation
/// annotations and its machines, counted as the machine controller counts them
/// ([`crate::machine::remediation::Member`]: unhealthy is Unknown, Failed or a Node that is
/// not Ready; machines being deleted are not counted). `None` when the deployment has no
/// remediation annotation. Pure.
pub(crate) fn remediation_condition(
    name: &str,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    machines: &[crate::machine::remediation::Member],
    now: Timestamp,
) -> Option<MachineDeploymentCondition> {
    use crate::machine::remediation::{census, policy_of, short_circuit};
    let policy = match policy_of(annotations) {
        Ok(p) if p == Default::default() => return None,
        Ok(p) => p,
        Err(e) => {
            return Some(make(
                MachineDeploymentConditionType::RemediationAllowed,
                ConditionStatus::False,
                remediation_reasons::INVALID_POLICY,
                format!("remediation is held until the annotation is fixed: {e}"),
                now,
            ));
        }
    };
    let counted = census(0, machines.iter().copied());
    let (live, unhealthy) = (counted.machines, counted.unhealthy);
    Some(match short_circuit(&policy, live, unhealthy) {
        Some(t) => make(
            MachineDeploymentConditionType::RemediationAllowed,
            ConditionStatus::False,
            remediation_reasons::TOO_MANY_UNHEALTHY,
            t.describe(name),
            now,
        ),
        None => make(
            MachineDeploymentConditionType::RemediationAllowed,
            ConditionStatus::True,
            remediation_reasons::ALLOWED,
            format!("{unhealthy} of {live} machines are unhealthy"),
            now,
        ),
    })
}

/// Reasons of the `ZonePartition` condition.
pub(crate) mod partition_reasons {
    /// A zone of the deployment's machines is partitioned.
    pub(crate) const PARTITIONED: &str = "ZonePartitioned";
    /// No zone of its machines is partitioned (any more).
    pub(crate) const NONE: &str = "NoZonePartition";
}

/// The `ZonePartition` condition (mcm-rs) of a deployment whose machines are in `zones`,
/// counted over the namespace's `members` with `rule` as the machine controller counts them
/// ([`crate::machine::partition`]): `True` naming the partitioned zones, `False` once a
/// deployment that had one has none, absent before. The manager does not ask the driver: the
/// machine controller holds only the machines whose VMs it finds running. Pure.
pub(crate) fn partition_condition(
    zones: &std::collections::BTreeSet<String>,
    members: &[crate::machine::partition::ZoneMember],
    rule: &crate::machine::partition::PartitionRule,
    previous: Option<&MachineDeploymentStatus>,
    now: Timestamp,
) -> Option<MachineDeploymentCondition> {
    let found: Vec<String> = zones
        .iter()
        .filter_map(|z| crate::machine::partition::zone_partition(z, members, rule))
        .map(|p| p.describe())
        .collect();
    if !found.is_empty() {
        return Some(make(
            MachineDeploymentConditionType::ZonePartition,
            ConditionStatus::True,
            partition_reasons::PARTITIONED,
            format!(
                "{}; the machine controller holds the remediation of their machines whose VMs \
                 run, for at most {} past the health timeout",
                found.join("; "),
                mcm_api::duration::format_go_duration(rule.max_hold)
            ),
            now,
        ));
    }
    condition_of(previous, &MachineDeploymentConditionType::ZonePartition).map(|_| {
        make(
            MachineDeploymentConditionType::ZonePartition,
            ConditionStatus::False,
            partition_reasons::NONE,
            "no zone of its machines is partitioned".into(),
            now,
        )
    })
}

/// Puts the `ZonePartition` condition into `status` (or leaves it out), and tells whether a
/// partition was lifted (`True` before, `False` now) for an Event.
pub(crate) fn apply_partition_condition(
    status: &mut MachineDeploymentStatus,
    condition: Option<MachineDeploymentCondition>,
    previous: Option<&MachineDeploymentStatus>,
) -> bool {
    let Some(new) = condition else {
        return false;
    };
    let was = condition_of(previous, &MachineDeploymentConditionType::ZonePartition)
        .map(|c| c.status.clone());
    let lifted = was == Some(ConditionStatus::True) && new.status == ConditionStatus::False;
    set_condition(status.conditions.get_or_insert_with(Vec::new), new);
    lifted
}

/// Puts the `RemediationAllowed` condition into `status` (or takes it out), and tells
/// whether its status changed from what `previous` had: `Some(true)` it became False
/// (remediation stopped), `Some(false)` it became True again.
pub(crate) fn apply_remediation_condition(
    status: &mut MachineDeploymentStatus,
    condition: Option<MachineDeploymentCondition>,
    previous: Option<&MachineDeploymentStatus>,
) -> Option<bool> {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let Some(new) = condition else {
        conditions.retain(|c| c.type_ != MachineDeploymentConditionType::RemediationAllowed);
        return None;
    };
    let before = condition_of(
        previous,
        &MachineDeploymentConditionType::RemediationAllowed,
    )
    .map(|c| c.status.clone());
    let stopped = new.status == ConditionStatus::False;
    let changed = before.as_ref() != Some(&new.status);
    set_condition(conditions, new);
    // A first True is not news; a first False is.
    (changed && (stopped || before.is_some())).then_some(stopped)
}

fn condition_of<'a>(
    status: Option<&'a MachineDeploymentStatus>,
    type_: &MachineDeploymentConditionType,
) -> Option<&'a MachineDeploymentCondition> {
    condition(status.and_then(|s| s.conditions.as_ref()), type_)
}

/// The machine counters of a deployment's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Non-terminating machines of all sets.
    pub replicas: i32,
    /// Non-terminating machines of the new set.
    pub updated: i32,
    /// Ready machines.
    pub ready: i32,
    /// Available machines.
    pub available: i32,
    /// Failed machines kept for their preservation (`status.preservedFailedReplicas`).
    pub preserved_failed: i32,
}

impl Counters {
    /// Counts the machines of the new set and the old sets.
    pub(crate) fn of(new_set: Option<&SetState>, old_sets: &[SetState]) -> Self {
        let all: Vec<&SetState> = new_set.into_iter().chain(old_sets.iter()).collect();
        Counters {
            replicas: all.iter().map(|x| x.machines).sum(),
            updated: new_set.map_or(0, |n| n.machines),
            ready: all.iter().map(|x| x.ready).sum(),
            available: all.iter().map(|x| x.available).sum(),
            preserved_failed: all.iter().map(|x| x.preserved_failed).sum(),
        }
    }
}

/// Whether a condition is the `Progressing=False, InvalidStrategy` condition.
pub(crate) fn is_invalid_strategy(c: &MachineDeploymentCondition) -> bool {
    c.type_ == MachineDeploymentConditionType::Progressing
        && c.status == ConditionStatus::False
        && c.reason.as_deref() == Some(reasons::INVALID_STRATEGY)
}

/// The status of a deployment whose strategy cannot be resolved: counters from the machines,
/// `observedGeneration` current, `Progressing=False` with reason
/// [`reasons::INVALID_STRATEGY`] and `message`; the other conditions are kept as they are
/// (availability cannot be judged without `maxUnavailable`).
pub(crate) fn invalid_strategy_status(
    replicas: i32,
    counters: Counters,
    input: &StatusInput<'_>,
    message: &str,
) -> MachineDeploymentStatus {
    let prev = input.previous;
    let mut conditions = prev.and_then(|p| p.conditions.clone()).unwrap_or_default();
    set_condition(
        &mut conditions,
        make(
            MachineDeploymentConditionType::Progressing,
            ConditionStatus::False,
            reasons::INVALID_STRATEGY,
            message.to_owned(),
            input.now,
        ),
    );
    status_with(replicas, counters, conditions, input)
}

fn status_with(
    desired: i32,
    counters: Counters,
    conditions: Vec<MachineDeploymentCondition>,
    input: &StatusInput<'_>,
) -> MachineDeploymentStatus {
    let prev = input.previous;
    MachineDeploymentStatus {
        observed_generation: input.generation,
        replicas: Some(counters.replicas),
        updated_replicas: Some(counters.updated),
        ready_replicas: Some(counters.ready),
        available_replicas: Some(counters.available),
        unavailable_replicas: Some((desired - counters.available).max(0)),
        conditions: if conditions.is_empty() {
            None
        } else {
            Some(conditions)
        },
        collision_count: prev.and_then(|p| p.collision_count),
        failed_machines: if input.failed_machines.is_empty() {
            None
        } else {
            Some(input.failed_machines.clone())
        },
        // `omitempty` upstream.
        preserved_failed_replicas: (counters.preserved_failed > 0)
            .then_some(counters.preserved_failed),
    }
}

/// The fewest available machines for `Available=True` (upstream's `minRequired`):
/// `replicas - maxUnavailable`, less the preserved Failed machines (kept on purpose, they
/// must not make the deployment unavailable), never below 0.
pub(crate) fn min_available(replicas: i32, max_unavailable: i32, preserved_failed: i32) -> i32 {
    (replicas - max_unavailable - preserved_failed).max(0)
}

/// The new status and, when a progress deadline is running, the time after which the
/// deployment must be looked at again.
///
/// A `Progressing=False, InvalidStrategy` condition left from an earlier invalid strategy is
/// dropped (the strategy resolved, or this would not be called); with a progress deadline the
/// usual `Progressing` condition takes its place.
pub(crate) fn compute_status(
    s: &Snapshot,
    input: &StatusInput<'_>,
) -> (MachineDeploymentStatus, Option<Duration>) {
    let d = s.rollout.replicas;
    let counters = Counters::of(s.new_set.as_ref(), &s.old_sets);
    let Counters {
        available,
        preserved_failed,
        ..
    } = counters;
    let prev = input.previous;
    let mut conditions = prev.and_then(|p| p.conditions.clone()).unwrap_or_default();
    conditions.retain(|c| !is_invalid_strategy(c));
    let now = input.now;

    let min_available = min_available(d, input.max_unavailable, preserved_failed);
    if available >= min_available {
        set_condition(
            &mut conditions,
            make(
                MachineDeploymentConditionType::Available,
                ConditionStatus::True,
                reasons::MINIMUM_REPLICAS_AVAILABLE,
                "Deployment has minimum availability.".into(),
                now,
            ),
        );
    } else {
        set_condition(
            &mut conditions,
            make(
                MachineDeploymentConditionType::Available,
                ConditionStatus::False,
                reasons::MINIMUM_REPLICAS_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                now,
            ),
        );
    }

    let recheck = progressing_condition(&mut conditions, s, counters, input);
    (status_with(d, counters, conditions, input), recheck)
}

/// Updates the `Progressing` condition in `conditions` as upstream MCM does
/// (`checkPausedConditions`, then `syncRolloutStatus`), with or without a progress deadline
/// (the cluster-autoscaler reads its reason: it scales a deployment down only when the
/// reason is `NewMachineSetAvailable`):
///
/// - paused: `Unknown/DeploymentPaused`; resumed: `Unknown/DeploymentResumed` (a timed-out
///   condition is kept); nothing else while paused;
/// - a complete deployment whose condition is already `NewMachineSetAvailable` keeps it (a
///   scale-up or scale-down that leaves every machine in the new set is not a rollout);
/// - complete (every desired machine updated and available, no old machine):
///   `True/NewMachineSetAvailable`;
/// - progress (this reconcile created or scaled a set, or more updated, ready or available
///   machines, or fewer machines), or no condition yet: `True/MachineSetUpdated`, with a new
///   update time (the transition time kept while it stays True);
/// - otherwise, only with a progress deadline: `False/ProgressDeadlineExceeded` once the
///   last update is older than the deadline.
///
/// Returns when to look again while a deadline runs. Pure.
pub(crate) fn progressing_condition(
    conditions: &mut Vec<MachineDeploymentCondition>,
    s: &Snapshot,
    counters: Counters,
    input: &StatusInput<'_>,
) -> Option<Duration> {
    let now = input.now;
    let prev = input.previous;
    let deadline = input
        .progress_deadline_seconds
        .filter(|d| *d > 0 && *d != i32::MAX);
    let reason_of = |conditions: &Vec<MachineDeploymentCondition>| {
        condition(
            Some(conditions),
            &MachineDeploymentConditionType::Progressing,
        )
        .and_then(|c| c.reason.clone())
    };
    let reason = reason_of(conditions);
    if reason.as_deref() != Some(reasons::PROGRESS_DEADLINE_EXCEEDED) {
        let paused_before = reason.as_deref() == Some(reasons::PAUSED);
        if s.rollout.paused && !paused_before {
            set_condition(
                conditions,
                make(
                    MachineDeploymentConditionType::Progressing,
                    ConditionStatus::Unknown,
                    reasons::PAUSED,
                    "Deployment is paused".into(),
                    now,
                ),
            );
        } else if !s.rollout.paused && paused_before {
            set_condition(
                conditions,
                make(
                    MachineDeploymentConditionType::Progressing,
                    ConditionStatus::Unknown,
                    reasons::RESUMED,
                    "Deployment is resumed".into(),
                    now,
                ),
            );
        }
    }
    if s.rollout.paused {
        return None;
    }
    let reason = reason_of(conditions);
    if counters.replicas == counters.updated
        && reason.as_deref() == Some(reasons::NEW_MACHINE_SET_AVAILABLE)
    {
        return None;
    }
    let new_set = s.new_set.as_ref().map(|n| n.name.as_str()).unwrap_or("");
    if s.is_complete() {
        set_condition(
            conditions,
            make(
                MachineDeploymentConditionType::Progressing,
                ConditionStatus::True,
                reasons::NEW_MACHINE_SET_AVAILABLE,
                format!("MachineSet {new_set:?} has successfully progressed."),
                now,
            ),
        );
        return None;
    }
    let progressing = condition(
        Some(conditions),
        &MachineDeploymentConditionType::Progressing,
    )
    .cloned();
    let Counters {
        replicas,
        updated,
        ready,
        available,
        ..
    } = counters;
    let moved = input.progressed
        || prev.is_none_or(|p| {
            updated > p.updated_replicas.unwrap_or(0)
                || ready > p.ready_replicas.unwrap_or(0)
                || available > p.available_replicas.unwrap_or(0)
                || replicas < p.replicas.unwrap_or(0)
        });
    let recheck_in = |secs: i64| Some(Duration::from_secs(u64::try_from(secs.max(1)).unwrap_or(1)));
    let Some(progressing) = progressing.filter(|_| !moved) else {
        let mut c = make(
            MachineDeploymentConditionType::Progressing,
            ConditionStatus::True,
            reasons::MACHINE_SET_UPDATED,
            format!("MachineSet {new_set:?} is progressing."),
            now,
        );
        if let Some(p) = condition(
            Some(conditions),
            &MachineDeploymentConditionType::Progressing,
        ) && p.status == ConditionStatus::True
        {
            c.last_transition_time = p.last_transition_time.clone();
        }
        // Replace unconditionally: progress refreshes the update time.
        conditions.retain(|x| x.type_ != MachineDeploymentConditionType::Progressing);
        conditions.push(c);
        return deadline.and_then(|d| recheck_in(i64::from(d)));
    };
    let deadline = deadline?;
    if progressing.reason.as_deref() == Some(reasons::PROGRESS_DEADLINE_EXCEEDED) {
        return None;
    }
    let last = progressing.last_update_time.as_ref().map_or(now, |t| t.0);
    let elapsed = now.as_second() - last.as_second();
    if elapsed < i64::from(deadline) {
        return recheck_in(i64::from(deadline) - elapsed);
    }
    set_condition(
        conditions,
        make(
            MachineDeploymentConditionType::Progressing,
            ConditionStatus::False,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            format!("MachineSet {new_set:?} has timed out progressing."),
            now,
        ),
    );
    None
}

#[cfg(test)]
use super::act::without_counters;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinedeployment::model::{Rollout, SetState, Strategy};
    use mcm_api::MachineDeployment;

    fn snapshot(new_available: i32) -> Snapshot {
        let mut new = SetState::new("new", 2);
        new.machines = 2;
        new.ready = new_available;
        new.available = new_available;
        let mut old = SetState::new("old", 1);
        old.machines = 1;
        old.available = 1;
        Snapshot {
            rollout: Rollout {
                replicas: 2,
                strategy: Strategy::RollingUpdate {
                    max_surge: 1,
                    max_unavailable: 0,
                },
                paused: false,
                frozen: false,
            },
            new_set: Some(new),
            old_sets: vec![old],
        }
    }

    fn input(previous: Option<&MachineDeploymentStatus>, now: i64) -> StatusInput<'_> {
        StatusInput {
            generation: Some(1),
            progress_deadline_seconds: Some(60),
            previous,
            failed_machines: Vec::new(),
            progressed: false,
            now: Timestamp::from_second(now).expect("time"),
            max_unavailable: 0,
        }
    }

    /// As the Go MCM: a deployment without a strategy has no allowance for unavailable
    /// machines, so one whose only machine is not available (its class is missing, say) is
    /// not `Available`; with `maxUnavailable: 1` written it is.
    #[test]
    fn availability_follows_the_go_rule_for_a_deployment_without_strategy() {
        let d: MachineDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": { "name": "md", "generation": 1 },
            "spec": { "replicas": 1, "template": {} }
        }))
        .unwrap();
        let mut new = SetState::new("new", 1);
        new.machines = 1;
        let s = Snapshot {
            rollout: Rollout {
                replicas: 1,
                strategy: crate::machinedeployment::observe::strategy_of(&d, true).unwrap(),
                paused: false,
                frozen: false,
            },
            new_set: Some(new),
            old_sets: vec![],
        };
        let now = Timestamp::from_second(100).unwrap();
        let available = |d: &MachineDeployment| {
            let input = crate::machinedeployment::observe::status_input(d, vec![], false, now);
            let (status, _) = compute_status(&s, &input);
            condition(
                status.conditions.as_ref(),
                &MachineDeploymentConditionType::Available,
            )
            .map(|c| (c.status.clone(), c.reason.clone()))
        };
        assert_eq!(
            available(&d),
            Some((
                ConditionStatus::False,
                Some(reasons::MINIMUM_REPLICAS_UNAVAILABLE.to_string())
            ))
        );
        let mut rolling = d.clone();
        rolling.spec.strategy = serde_json::from_value(serde_json::json!({
            "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 1 }
        }))
        .unwrap();
        assert_eq!(
            available(&rolling).map(|(s, _)| s),
            Some(ConditionStatus::True)
        );
    }

    fn progressing(s: &MachineDeploymentStatus) -> Option<(ConditionStatus, String)> {
        condition(
            s.conditions.as_ref(),
            &MachineDeploymentConditionType::Progressing,
        )
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
    }

    #[test]
    fn a_new_available_machine_changes_counters_only_a_missed_deadline_more() {
        let (first, _) = compute_status(&snapshot(0), &input(None, 1_000));
        // One more machine ready: counters and the condition's times change.
        let mut more = first.clone();
        more.ready_replicas = Some(1);
        for c in more.conditions.iter_mut().flatten() {
            c.last_update_time = Some(Time(Timestamp::from_second(1_010).expect("time")));
            c.message = Some("one more".into());
        }
        assert_ne!(more, first);
        assert_eq!(without_counters(&more), without_counters(&first));
        // The deployment becomes available: significant.
        let (available, _) = compute_status(&snapshot(1), &input(Some(&first), 1_010));
        assert_ne!(without_counters(&available), without_counters(&first));
        // The progress deadline passes: the condition's status and reason change.
        let (late, _) = compute_status(&snapshot(0), &input(Some(&first), 1_061));
        assert_ne!(without_counters(&late), without_counters(&first));
    }

    fn available(s: &MachineDeploymentStatus) -> Option<ConditionStatus> {
        condition(
            s.conditions.as_ref(),
            &MachineDeploymentConditionType::Available,
        )
        .map(|c| c.status.clone())
    }

    #[test]
    fn preserved_failed_machines_are_summed_and_lower_the_minimum_availability() {
        assert_eq!(min_available(3, 1, 1), 1);
        assert_eq!(min_available(3, 0, 5), 0);
        // 3 replicas, maxUnavailable 0: 2 available machines are too few ...
        let mut s = snapshot(2);
        s.rollout.replicas = 3;
        s.old_sets.clear();
        let (status, _) = compute_status(&s, &input(None, 1_000));
        assert_eq!(available(&status), Some(ConditionStatus::False));
        assert_eq!(status.preserved_failed_replicas, None);
        // ... unless preserved Failed machines lower the minimum (one in each set here).
        if let Some(new) = s.new_set.as_mut() {
            new.preserved_failed = 1;
        }
        let mut old = SetState::new("old", 0);
        old.preserved_failed = 1;
        s.old_sets.push(old);
        let (status, _) = compute_status(&s, &input(None, 1_000));
        assert_eq!(available(&status), Some(ConditionStatus::True));
        assert_eq!(status.preserved_failed_replicas, Some(2));
    }

    #[test]
    fn progress_deadline_exceeded_then_recovers() {
        let s = snapshot(0);
        let (first, recheck) = compute_status(&s, &input(None, 1_000));
        assert_eq!(
            progressing(&first),
            Some((ConditionStatus::True, reasons::MACHINE_SET_UPDATED.into()))
        );
        assert_eq!(recheck, Some(Duration::from_secs(60)));
        // No progress for less than the deadline: still progressing, recheck later.
        let (second, recheck) = compute_status(&s, &input(Some(&first), 1_030));
        assert_eq!(progressing(&second), progressing(&first));
        assert_eq!(recheck, Some(Duration::from_secs(30)));
        // Past the deadline.
        let (third, _) = compute_status(&s, &input(Some(&second), 1_061));
        assert_eq!(
            progressing(&third),
            Some((
                ConditionStatus::False,
                reasons::PROGRESS_DEADLINE_EXCEEDED.into()
            ))
        );
        // Progress again (a machine became available).
        let (fourth, _) = compute_status(&snapshot(1), &input(Some(&third), 1_100));
        assert_eq!(
            progressing(&fourth),
            Some((ConditionStatus::True, reasons::MACHINE_SET_UPDATED.into()))
        );
        assert_eq!(fourth.unavailable_replicas, Some(0));
    }

    /// A deployment of `d` replicas whose new set has `machines` machines, `available` of
    /// them available, and `old` machines in an old set.
    fn rollout(d: i32, machines: i32, available: i32, old: i32) -> Snapshot {
        let mut new = SetState::new("new", machines);
        new.machines = machines;
        new.ready = available;
        new.available = available;
        let mut s = snapshot(0);
        s.rollout.replicas = d;
        s.new_set = Some(new);
        s.old_sets = Vec::new();
        if old > 0 {
            let mut o = SetState::new("old", old);
            o.machines = old;
            o.available = old;
            s.old_sets.push(o);
        }
        s
    }

    #[test]
    fn progressing_is_kept_without_a_deadline_with_the_reasons_the_autoscaler_reads() {
        let at = |previous, now| {
            let mut i = input(previous, now);
            i.progress_deadline_seconds = None;
            i
        };
        // Rolling out: MachineSetUpdated, no recheck (no deadline).
        let (rolling, recheck) = compute_status(&rollout(2, 1, 0, 2), &at(None, 1_000));
        assert_eq!(
            progressing(&rolling),
            Some((ConditionStatus::True, reasons::MACHINE_SET_UPDATED.into()))
        );
        assert_eq!(recheck, None);
        // Stuck for an hour: no timeout without a deadline.
        let (stuck, _) = compute_status(&rollout(2, 1, 0, 2), &at(Some(&rolling), 4_600));
        assert_eq!(progressing(&stuck), progressing(&rolling));
        // Complete: NewMachineSetAvailable.
        let (done, _) = compute_status(&rollout(2, 2, 2, 0), &at(Some(&stuck), 4_700));
        assert_eq!(
            progressing(&done),
            Some((
                ConditionStatus::True,
                reasons::NEW_MACHINE_SET_AVAILABLE.into()
            ))
        );
        // The autoscaler scales up: new machines in the new set are not a rollout, the
        // reason stays (even while this reconcile scaled the set).
        let mut scaled = at(Some(&done), 4_800);
        scaled.progressed = true;
        let (up, _) = compute_status(&rollout(4, 4, 2, 0), &scaled);
        assert_eq!(progressing(&up), progressing(&done));
        // Paused: Unknown/DeploymentPaused; resumed: Unknown/DeploymentResumed.
        let mut paused = rollout(2, 1, 0, 2);
        paused.rollout.paused = true;
        let (p, _) = compute_status(&paused, &at(Some(&up), 4_900));
        assert_eq!(
            progressing(&p),
            Some((ConditionStatus::Unknown, reasons::PAUSED.into()))
        );
        let (p2, _) = compute_status(&paused, &at(Some(&p), 4_950));
        assert_eq!(p2.conditions, p.conditions, "nothing changes while paused");
        let (resumed, _) = compute_status(&rollout(2, 1, 0, 2), &at(Some(&p), 5_000));
        assert_eq!(
            progressing(&resumed),
            Some((ConditionStatus::Unknown, reasons::RESUMED.into()))
        );
    }

    #[test]
    fn invalid_strategy_condition_is_set_once_and_replaced_when_fixed() {
        let s = snapshot(0);
        let (valid, _) = compute_status(&s, &input(None, 1_000));
        let counters = Counters::of(s.new_set.as_ref(), &s.old_sets);
        let message = "spec.strategy.rollingUpdate.maxSurge: \"abc\" is neither an integer nor a percentage like \"25%\"";
        let mut later = input(Some(&valid), 1_010);
        later.generation = Some(2);
        let invalid = invalid_strategy_status(2, counters, &later, message);
        let c = condition(
            invalid.conditions.as_ref(),
            &MachineDeploymentConditionType::Progressing,
        )
        .expect("progressing");
        assert!(is_invalid_strategy(c));
        assert_eq!(c.message.as_deref(), Some(message));
        assert_eq!(c.last_transition_time, Some(Time(later.now)));
        assert_eq!(invalid.observed_generation, Some(2));
        assert_eq!(
            (
                invalid.replicas,
                invalid.available_replicas,
                invalid.unavailable_replicas
            ),
            (Some(3), Some(1), Some(1))
        );
        // Unchanged on the next reconcile: nothing to write, so no second event.
        let again = invalid_strategy_status(2, counters, &input(Some(&invalid), 1_020), message);
        assert_eq!(again.conditions, invalid.conditions);

        // Fixed, with a progress deadline: the usual Progressing condition replaces it.
        let (fixed, _) = compute_status(&s, &input(Some(&invalid), 1_030));
        assert_eq!(
            progressing(&fixed),
            Some((ConditionStatus::True, reasons::MACHINE_SET_UPDATED.into()))
        );
        // Fixed, without a deadline: the usual condition too (upstream keeps it always).
        let mut no_deadline = input(Some(&invalid), 1_030);
        no_deadline.progress_deadline_seconds = None;
        let (fixed, _) = compute_status(&s, &no_deadline);
        assert_eq!(
            progressing(&fixed),
            Some((ConditionStatus::True, reasons::MACHINE_SET_UPDATED.into()))
        );
    }

    #[test]
    fn the_zone_partition_condition_names_the_zone_and_is_lifted() {
        use crate::machine::partition::{PartitionRule, ZoneMember};
        let now = jiff::Timestamp::from_second(1_000).unwrap();
        let member = |zone: &str, down: bool| ZoneMember {
            zone: Some(zone.into()),
            unreachable: down,
            serving: !down,
        };
        let cut: Vec<ZoneMember> = (0..3)
            .map(|_| member("a", true))
            .chain((0..3).map(|_| member("b", false)))
            .collect();
        let healed: Vec<ZoneMember> = (0..3)
            .map(|_| member("a", false))
            .chain((0..3).map(|_| member("b", false)))
            .collect();
        let rule = PartitionRule::default();
        let zone_a: std::collections::BTreeSet<String> = ["a".to_string()].into();
        let zone_b: std::collections::BTreeSet<String> = ["b".to_string()].into();
        // Never partitioned: no condition.
        assert_eq!(
            partition_condition(&zone_a, &healed, &rule, None, now),
            None
        );
        // Zone b's deployment is not concerned.
        assert_eq!(partition_condition(&zone_b, &cut, &rule, None, now), None);
        let on = partition_condition(&zone_a, &cut, &rule, None, now).unwrap();
        assert_eq!(on.status, ConditionStatus::True);
        assert_eq!(on.reason.as_deref(), Some(partition_reasons::PARTITIONED));
        assert!(
            on.message
                .as_deref()
                .unwrap()
                .starts_with("zone a is partitioned: the Nodes of 3 of its 3 machines"),
            "{on:?}"
        );
        let mut status = MachineDeploymentStatus::default();
        assert!(!apply_partition_condition(&mut status, Some(on), None));
        let previous = status.clone();
        let off = partition_condition(&zone_a, &healed, &rule, Some(&previous), now).unwrap();
        assert_eq!(off.status, ConditionStatus::False);
        assert!(
            apply_partition_condition(&mut status, Some(off), Some(&previous)),
            "lifted"
        );
        // A max hold of zero: no hold, no partition reported.
        let off_rule = PartitionRule {
            max_hold: Duration::ZERO,
            ..rule
        };
        assert_eq!(
            partition_condition(&zone_a, &cut, &off_rule, None, now),
            None
        );
    }

    #[test]
    fn the_remediation_condition_follows_the_short_circuit_and_announces_changes() {
        use mcm_api::constants::annotations::policy;
        let machine = |phase: &str| -> mcm_api::Machine {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": { "name": "m" }, "spec": {},
                "status": { "currentStatus": { "phase": phase } }
            }))
            .unwrap()
        };
        let member = |phase: &str| crate::machine::remediation::Member::of(&machine(phase), None);
        let (r, u) = (member("Running"), member("Unknown"));
        let now = Timestamp::from_second(1_000).unwrap();
        let a: std::collections::BTreeMap<String, String> =
            [(policy::MAX_UNHEALTHY.to_string(), "40%".to_string())].into();
        assert_eq!(remediation_condition("md", None, &[u, u], now), None);
        let fine = remediation_condition("md", Some(&a), &[r, r, r, u], now).unwrap();
        assert_eq!(fine.status, ConditionStatus::True);
        let out = remediation_condition("md", Some(&a), &[r, u, u, u], now).unwrap();
        assert_eq!(out.status, ConditionStatus::False);
        assert_eq!(
            out.reason.as_deref(),
            Some(remediation_reasons::TOO_MANY_UNHEALTHY)
        );
        assert!(
            out.message
                .as_deref()
                .unwrap()
                .contains("3 of the 4 machines of MachineDeployment md"),
            "{out:?}"
        );
        // First True: no news; then False: stopped; then True again: resumed.
        let mut status = MachineDeploymentStatus::default();
        assert_eq!(
            apply_remediation_condition(&mut status, Some(fine.clone()), None),
            None
        );
        let previous = status.clone();
        assert_eq!(
            apply_remediation_condition(&mut status, Some(out.clone()), Some(&previous)),
            Some(true)
        );
        let previous = status.clone();
        assert_eq!(
            apply_remediation_condition(&mut status, Some(out), Some(&previous)),
            None,
            "no change, no news"
        );
        assert_eq!(
            apply_remediation_condition(&mut status, Some(fine), Some(&previous)),
            Some(false)
        );
        // The annotation removed: the condition goes.
        let previous = status.clone();
        assert_eq!(
            apply_remediation_condition(&mut status, None, Some(&previous)),
            None
        );
        assert!(status.conditions.unwrap().is_empty());
    }
}
