//! The effective creation timeout of a deployment on a slow cloud (upstream issue #1155, PR
//! #1156): the deployment's annotation `node.machine.sapcloud.io/effective-creation-timeout`,
//! which its new MachineSet and new Machines carry ([`super::sets`]), follows the machines'
//! joins between the declared timeout and an upper bound.
//!
//! - [`observe`] reads the facts from the deployment and its machines: the declared timeout,
//!   the annotation and the controller's state keys on it, the recent joins (a Machine's
//!   creation to its Running transition) and the recent creation-timeout failures.
//! - [`decide`] (pure, `now` a parameter) is the rule: a *replace cycle* is counted at most
//!   once per effective-timeout window in which a machine failed to join; after
//!   `--machine-replace-cycle-count-threshold` cycles the timeout grows by
//!   `--machine-creation-timeout-growth-percent` up to the bound. Once at least
//!   [`MIN_RECENT_JOINS`] machines joined in the last window without a failure, and a window
//!   has passed since the last change, it is lowered to `max(declared, slowest recent join
//!   grown once)`, never raised by that step; back at the declared value the keys go.
//! - The write is one merge patch of the annotations with an Event
//!   ([`super::act::Actor::adjust_creation_timeout`]).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use mcm_api::constants::{annotations, operations};
use mcm_api::duration::{format_go_duration, parse_go_duration};
use mcm_api::{Machine, MachineDeployment, MachineOperationType, MachinePhase, MachineState};

/// The growth steps above the declared timeout the default bound allows (upstream's
/// `DefaultMaxCreationTimeoutGrowthCount`): with the default 50 % a declared 20m is bounded
/// by 1h41m15s.
pub(crate) const MAX_GROWTH_STEPS: i32 = 4;

/// Joins within the last window (and no failure) it takes to lower the timeout (upstream's
/// `DefaultSuccessJoinCountThreshold`).
pub(crate) const MIN_RECENT_JOINS: usize = 2;

/// Event reason: the effective creation timeout went up.
pub(crate) const RAISED: &str = "EffectiveCreationTimeoutRaised";
/// Event reason: the effective creation timeout went down.
pub(crate) const LOWERED: &str = "EffectiveCreationTimeoutLowered";

/// The adaptation's settings (the manager's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutAdaptation {
    /// `--machine-creation-timeout`: the declared timeout of a deployment whose template sets
    /// no `creationTimeout`.
    pub default_timeout: Duration,
    /// `--machine-creation-timeout-growth-percent`: growth per step; 0 turns the adaptation
    /// off (nothing is counted or written).
    pub growth_percent: u32,
    /// `--machine-replace-cycle-count-threshold`: cycles per raise (0 counts as 1).
    pub cycle_threshold: u32,
    /// `--machine-creation-timeout-max`: the upper bound; `None`: the declared timeout grown
    /// `MAX_GROWTH_STEPS` (4) times.
    pub max: Option<Duration>,
}

impl Default for TimeoutAdaptation {
    fn default() -> Self {
        TimeoutAdaptation {
            default_timeout: Duration::from_secs(20 * 60),
            growth_percent: 50,
            cycle_threshold: 2,
            max: None,
        }
    }
}

impl TimeoutAdaptation {
    /// `d` grown by one step, to whole seconds.
    pub fn grow(&self, d: Duration) -> Duration {
        let millis = d.as_millis() * (100 + u128::from(self.growth_percent)) / 100;
        Duration::from_secs(u64::try_from(millis.div_ceil(1000)).unwrap_or(u64::MAX))
    }

    /// The upper bound for a deployment that declares `declared` (never below it).
    pub fn bound(&self, declared: Duration) -> Duration {
        let grown = || {
            let factor = 1.0 + f64::from(self.growth_percent) / 100.0;
            Duration::from_secs_f64(
                (declared.as_secs_f64() * factor.powi(MAX_GROWTH_STEPS)).round(),
            )
        };
        self.max.unwrap_or_else(grown).max(declared)
    }
}

/// A machine of the deployment that joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Join {
    /// When it became Running.
    pub at: Timestamp,
    /// From its creation to then.
    pub took: Duration,
}

/// A machine of the deployment that failed because it did not join within its creation
/// timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JoinFailure {
    /// When it was marked Failed.
    pub at: Timestamp,
    /// The creation timeout it had: its annotation, else its `spec.creationTimeout`, else
    /// `--machine-creation-timeout` (the machine controller's flag is taken to be the same).
    pub timeout: Duration,
}

/// What the rule decides from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimeoutFacts {
    /// The declared timeout: the template's `creationTimeout`, else `--machine-creation-timeout`.
    pub declared: Duration,
    /// The annotation: `None` without one, `Err` when it is not a duration (then nothing is
    /// adapted; the MachineSet warns about it).
    pub current: Option<Result<Duration, String>>,
    /// `...-effective-creation-timeout-last-applied-at`: the controller set the current value
    /// then (a value that does not parse counts as long ago). `None`: a user's value, or none.
    pub applied_at: Option<Timestamp>,
    /// `replace-cycle-count` (a value that does not parse counts as 0).
    pub cycles: u32,
    /// `replace-cycle-count-last-applied-at`: the failure time of the last counted cycle.
    pub cycles_at: Option<Timestamp>,
    /// The joins of the deployment's machines still readable from them.
    pub joins: Vec<Join>,
    /// The creation-timeout failures of the deployment's machines still in the store.
    pub failures: Vec<JoinFailure>,
}

/// What the rule asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TimeoutPlan {
    /// The annotations to set (`Some`) or remove (`None`), as one merge patch; empty: no write.
    pub annotations: BTreeMap<&'static str, Option<String>>,
    /// The Event announcing a change of the timeout: reason and message.
    pub event: Option<(&'static str, String)>,
    /// When the rule wants to look again although nothing may change meanwhile (a cooldown
    /// or a failure leaving the window).
    pub recheck: Option<Duration>,
}

/// The keys the adaptation owns on a deployment.
pub(crate) const STATE_KEYS: [&str; 3] = [
    annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT,
    annotations::REPLACE_CYCLE_COUNT,
    annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT,
];

/// An annotation time as written (RFC 3339, whole seconds, UTC, like Go's `time.RFC3339`).
pub(crate) fn rfc3339(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

fn since(earlier: Timestamp, later: Timestamp) -> Duration {
    later
        .duration_since(earlier)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

fn minus(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_sub(d).ok())
        .unwrap_or(Timestamp::MIN)
}

/// The adaptation rule. Pure: the same facts, settings and `now` give the same plan.
///
/// With `cur` the current value (the annotation, else the declared timeout) and the window
/// the last `cur` before `now`:
/// 1. growth 0, or an annotation that is not a duration: nothing.
/// 2. A value the controller set that is not above the declared timeout (the declared one
///    was raised past it): the keys go, the declared value applies.
/// 3. A failure in the window, of a machine whose timeout was not shorter than `cur`, at
///    least `cur` after the last counted one (so one cycle per window, on the machines' own
///    timeline), below the bound: one more cycle; at the threshold the value grows one step
///    (capped), the count restarts.
/// 4. No failure in the window and at least [`MIN_RECENT_JOINS`] joins in it: a value the
///    controller set is lowered, once a window has passed since it was set, to
///    `max(declared, slowest join grown one step)` if that is lower; at the declared value
///    the keys go. A cycle count left over is cleared.
pub(crate) fn decide(facts: &TimeoutFacts, s: &TimeoutAdaptation, now: Timestamp) -> TimeoutPlan {
    let mut plan = TimeoutPlan::default();
    let cur = match &facts.current {
        _ if s.growth_percent == 0 => return plan,
        None => facts.declared,
        Some(Ok(d)) => *d,
        Some(Err(_)) => return plan,
    };
    let declared = facts.declared;
    let remove_all = |plan: &mut TimeoutPlan| {
        plan.annotations
            .insert(annotations::EFFECTIVE_CREATION_TIMEOUT, None);
        for key in STATE_KEYS {
            plan.annotations.insert(key, None);
        }
    };
    let Some(applied_at) = facts.applied_at.filter(|_| cur > declared) else {
        if facts.applied_at.is_some() {
            // Rule 2: the controller's value is not above the declared one.
            remove_all(&mut plan);
            if cur < declared {
                plan.event = Some((
                    RAISED,
                    format!(
                        "{} -> {} (declared): the declared creation timeout is above the adapted value",
                        format_go_duration(cur),
                        format_go_duration(declared)
                    ),
                ));
            }
            return plan;
        }
        return unmanaged(facts, s, cur, now);
    };
    if let Some(raise) = count_cycle(facts, s, cur, now) {
        return raise;
    }
    let window_start = minus(now, cur);
    let failed = facts.failures.iter().filter(|f| f.at > window_start);
    let last_failure = failed.map(|f| f.at).max();
    let joins: Vec<&Join> = facts.joins.iter().filter(|j| j.at > window_start).collect();
    if joins.len() < MIN_RECENT_JOINS {
        return plan;
    }
    if let Some(at) = last_failure {
        // Looked at again when the failure has left the window.
        plan.recheck = Some(cur.saturating_sub(since(at, now)) + Duration::from_secs(1));
        return plan;
    }
    let cooldown = since(applied_at, now);
    if cooldown < cur {
        plan.recheck = Some(cur - cooldown);
        return plan;
    }
    let slowest = joins.iter().map(|j| j.took).max().unwrap_or_default();
    let new = s.grow(slowest).max(declared).min(cur);
    if new < cur {
        let why = format!(
            "the slowest of {} machines that joined within the last {} took {}",
            joins.len(),
            format_go_duration(cur),
            format_go_duration(slowest)
        );
        if new == declared {
            remove_all(&mut plan);
            plan.event = Some((
                LOWERED,
                format!(
                    "{} -> {} (declared): {why}",
                    format_go_duration(cur),
                    format_go_duration(new)
                ),
            ));
        } else {
            set_value(&mut plan, new, now);
            plan.annotations
                .insert(annotations::REPLACE_CYCLE_COUNT, None);
            plan.annotations
                .insert(annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT, None);
            plan.event = Some((
                LOWERED,
                format!(
                    "{} -> {}: {why}",
                    format_go_duration(cur),
                    format_go_duration(new)
                ),
            ));
        }
    } else if facts.cycles > 0 {
        clear_cycles(&mut plan);
    }
    plan
}

/// Rules 3 and 4 for a value the controller did not set (a user's, or the declared one):
/// it may be raised, never lowered.
fn unmanaged(
    facts: &TimeoutFacts,
    s: &TimeoutAdaptation,
    cur: Duration,
    now: Timestamp,
) -> TimeoutPlan {
    if let Some(raise) = count_cycle(facts, s, cur, now) {
        return raise;
    }
    let mut plan = TimeoutPlan::default();
    let window_start = minus(now, cur);
    let healthy = !facts.failures.iter().any(|f| f.at > window_start)
        && facts.joins.iter().filter(|j| j.at > window_start).count() >= MIN_RECENT_JOINS;
    if healthy && facts.cycles > 0 {
        clear_cycles(&mut plan);
    }
    plan
}

fn clear_cycles(plan: &mut TimeoutPlan) {
    plan.annotations
        .insert(annotations::REPLACE_CYCLE_COUNT, None);
    plan.annotations
        .insert(annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT, None);
}

fn set_value(plan: &mut TimeoutPlan, value: Duration, now: Timestamp) {
    plan.annotations.insert(
        annotations::EFFECTIVE_CREATION_TIMEOUT,
        Some(format_go_duration(value)),
    );
    plan.annotations.insert(
        annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT,
        Some(rfc3339(now)),
    );
}

/// Rule 3: the plan that counts a replace cycle (and raises the timeout at the threshold),
/// `None` when no cycle is to be counted.
fn count_cycle(
    facts: &TimeoutFacts,
    s: &TimeoutAdaptation,
    cur: Duration,
    now: Timestamp,
) -> Option<TimeoutPlan> {
    let bound = s.bound(facts.declared);
    if cur >= bound {
        return None;
    }
    let window_start = minus(now, cur);
    let at = facts
        .failures
        .iter()
        .filter(|f| f.at > window_start)
        .filter(|f| f.timeout >= cur)
        .filter(|f| {
            facts
                .cycles_at
                .is_none_or(|c| f.at >= c && since(c, f.at) >= cur)
        })
        .map(|f| f.at)
        .max()?;
    let mut plan = TimeoutPlan::default();
    let count = facts.cycles.saturating_add(1);
    let threshold = s.cycle_threshold.max(1);
    plan.annotations.insert(
        annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT,
        Some(rfc3339(at)),
    );
    let new = s.grow(cur).min(bound);
    if count < threshold || new <= cur {
        plan.annotations
            .insert(annotations::REPLACE_CYCLE_COUNT, Some(count.to_string()));
        return Some(plan);
    }
    plan.annotations
        .insert(annotations::REPLACE_CYCLE_COUNT, Some("0".to_owned()));
    set_value(&mut plan, new, now);
    let capped = if new == bound {
        " (the upper bound)"
    } else {
        ""
    };
    plan.event = Some((
        RAISED,
        format!(
            "{} -> {}{capped}: {count} replace cycles (threshold {threshold}) of machines that did not join within {}",
            format_go_duration(cur),
            format_go_duration(new),
            format_go_duration(cur)
        ),
    ));
    Some(plan)
}

/// The declared creation timeout of `d`: its template's `creationTimeout`, else `default`.
pub(crate) fn declared_timeout(d: &MachineDeployment, default: Duration) -> Duration {
    d.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.configuration.creation_timeout)
        .map_or(default, |g| g.0)
}

/// The effective creation timeout of `d` as its new machines get it: the annotation when it
/// is a duration, else the declared timeout (for the gauge).
pub(crate) fn effective_timeout(d: &MachineDeployment, default: Duration) -> Duration {
    d.annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
        .and_then(|v| parse_go_duration(v).ok())
        .unwrap_or_else(|| declared_timeout(d, default))
}

/// Whether `m` failed because it did not join within its creation timeout: `Failed`, its
/// last operation a failed `Create` whose description is the machine controller's (ours or
/// the Go MCM's) for that failure.
pub(crate) fn failed_to_join(m: &Machine) -> bool {
    let Some(op) = m.status.as_ref().and_then(|s| s.last_operation.as_ref()) else {
        return false;
    };
    let description = op.description.as_deref().unwrap_or_default();
    m.phase() == Some(&MachinePhase::Failed)
        && op.state == Some(MachineState::Failed)
        && op.type_ == Some(MachineOperationType::Create)
        && (description.contains(operations::NOT_JOINED_WITHIN_CREATION_TIMEOUT)
            || description.contains(operations::GO_FAILED_TO_JOIN))
}

/// The join of `m` when its last operation records it: `Running` after a successful `Create`
/// (the operation's time is the Running transition), to whole seconds. A machine that was
/// Unknown since, or is being deleted, no longer tells.
pub(crate) fn join_of(m: &Machine) -> Option<Join> {
    let status = m.status.as_ref()?;
    let op = status.last_operation.as_ref()?;
    let joined = m.phase() == Some(&MachinePhase::Running)
        && op.state == Some(MachineState::Successful)
        && op.type_ == Some(MachineOperationType::Create);
    if !joined {
        return None;
    }
    let at = op.last_update_time.as_ref()?.0;
    let created = m.metadata.creation_timestamp.as_ref()?.0;
    // Whole seconds, as upstream rounds it (the creation time has no fraction anyway).
    let took = Duration::from_secs_f64(since(created, at).as_secs_f64().round());
    Some(Join { at, took })
}

/// The failure of `m` when it did not join within its creation timeout ([`failed_to_join`]);
/// `default` is the timeout of a machine that sets none.
pub(crate) fn failure_of(m: &Machine, default: Duration) -> Option<JoinFailure> {
    if !failed_to_join(m) {
        return None;
    }
    let status = m.status.as_ref()?;
    let at = status
        .last_operation
        .as_ref()
        .and_then(|o| o.last_update_time.as_ref())
        .or_else(|| {
            status
                .current_status
                .as_ref()
                .and_then(|c| c.last_update_time.as_ref())
        })?
        .0;
    let timeout = crate::machine::observe::effective_creation_timeout(m)
        .or(m.spec.configuration.creation_timeout.map(|g| g.0))
        .unwrap_or(default);
    Some(JoinFailure { at, timeout })
}

/// The facts of deployment `d` with its `machines` (of all its sets, those being deleted
/// included). Pure.
pub(crate) fn observe(
    d: &MachineDeployment,
    machines: &[&Machine],
    default: Duration,
) -> TimeoutFacts {
    let anns = d.annotations();
    let time = |key: &str| {
        anns.get(key)
            .map(|v| v.parse::<Timestamp>().unwrap_or(Timestamp::UNIX_EPOCH))
    };
    TimeoutFacts {
        declared: declared_timeout(d, default),
        current: anns
            .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
            .map(|v| parse_go_duration(v).map_err(|e| e.to_string())),
        applied_at: time(annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT),
        cycles: anns
            .get(annotations::REPLACE_CYCLE_COUNT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        cycles_at: anns
            .get(annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT)
            .and_then(|v| v.parse().ok()),
        joins: machines.iter().filter_map(|m| join_of(m)).collect(),
        failures: machines
            .iter()
            .filter_map(|m| failure_of(m, default))
            .collect(),
    }
}

/// The plan's annotations that change something on `d` (a removal of a key `d` lacks, or a
/// value it has already, is dropped): an empty map needs no write.
pub(crate) fn changes(
    d: &MachineDeployment,
    plan: &TimeoutPlan,
) -> BTreeMap<&'static str, Option<String>> {
    let have = d.annotations();
    plan.annotations
        .iter()
        .filter(|(k, v)| have.get(**k) != v.as_ref())
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const MIN: u64 = 60;
    const ECT: &str = annotations::EFFECTIVE_CREATION_TIMEOUT;
    const ECT_AT: &str = annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT;
    const RC: &str = annotations::REPLACE_CYCLE_COUNT;
    const RC_AT: &str = annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn mins(m: u64) -> Duration {
        Duration::from_secs(m * MIN)
    }

    /// A deployment declaring 20m, without annotations, machines or joins.
    fn fresh() -> TimeoutFacts {
        TimeoutFacts {
            declared: mins(20),
            current: None,
            applied_at: None,
            cycles: 0,
            cycles_at: None,
            joins: vec![],
            failures: vec![],
        }
    }

    /// The controller set `m` minutes at `at`.
    fn managed(m: u64, at: i64) -> TimeoutFacts {
        TimeoutFacts {
            current: Some(Ok(mins(m))),
            applied_at: Some(t(at)),
            ..fresh()
        }
    }

    fn failure(at: i64, timeout_min: u64) -> JoinFailure {
        JoinFailure {
            at: t(at),
            timeout: mins(timeout_min),
        }
    }

    fn join(at: i64, took_secs: u64) -> Join {
        Join {
            at: t(at),
            took: Duration::from_secs(took_secs),
        }
    }

    type Want = (
        Vec<(&'static str, Option<String>)>,
        Option<&'static str>,
        Option<Duration>,
    );

    fn nothing() -> Want {
        (vec![], None, None)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn the_adaptation_rule() {
        let default = TimeoutAdaptation::default();
        let threshold_one = TimeoutAdaptation {
            cycle_threshold: 1,
            ..default
        };
        let off = TimeoutAdaptation {
            growth_percent: 0,
            ..default
        };
        let max_25m = TimeoutAdaptation {
            max: Some(mins(25)),
            cycle_threshold: 1,
            ..default
        };
        let cases: Vec<(&str, TimeoutFacts, TimeoutAdaptation, i64, Want)> = vec![
            (
                "a machine that did not join counts the first cycle, at its failure time",
                TimeoutFacts {
                    failures: vec![failure(1200, 20)],
                    ..fresh()
                },
                default,
                1201,
                (
                    vec![(RC, s("1")), (RC_AT, s(&rfc3339(t(1200))))],
                    None,
                    None,
                ),
            ),
            (
                "the threshold's cycle a window later raises the timeout by 50 %",
                TimeoutFacts {
                    cycles: 1,
                    cycles_at: Some(t(1200)),
                    failures: vec![failure(2401, 20)],
                    ..fresh()
                },
                default,
                2402,
                (
                    vec![
                        (ECT, s("30m0s")),
                        (ECT_AT, s(&rfc3339(t(2402)))),
                        (RC, s("0")),
                        (RC_AT, s(&rfc3339(t(2401)))),
                    ],
                    Some(RAISED),
                    None,
                ),
            ),
            (
                "at most one cycle per window: the other replicas' failures of that window",
                TimeoutFacts {
                    cycles: 1,
                    cycles_at: Some(t(1200)),
                    failures: vec![failure(1200, 20), failure(1203, 20), failure(2390, 20)],
                    ..fresh()
                },
                default,
                2395,
                nothing(),
            ),
            (
                "a machine created under a shorter timeout than the current one tells nothing",
                TimeoutFacts {
                    current: Some(Ok(mins(30))),
                    failures: vec![failure(1200, 20)],
                    ..fresh()
                },
                default,
                1201,
                nothing(),
            ),
            (
                "a failure older than the window is not counted",
                TimeoutFacts {
                    failures: vec![failure(1200, 20)],
                    ..fresh()
                },
                default,
                1200 + 20 * 60 + 1,
                nothing(),
            ),
            (
                "threshold 1: the first cycle raises",
                TimeoutFacts {
                    failures: vec![failure(1200, 20)],
                    ..fresh()
                },
                threshold_one,
                1201,
                (
                    vec![
                        (ECT, s("30m0s")),
                        (ECT_AT, s(&rfc3339(t(1201)))),
                        (RC, s("0")),
                        (RC_AT, s(&rfc3339(t(1200)))),
                    ],
                    Some(RAISED),
                    None,
                ),
            ),
            (
                "the raise is capped by the bound (declared grown 4 steps: 1h41m15s)",
                TimeoutFacts {
                    cycles: 1,
                    cycles_at: Some(t(0)),
                    failures: vec![failure(6000, 90)],
                    ..managed(90, 0)
                },
                default,
                6001,
                (
                    vec![
                        (ECT, s("1h41m15s")),
                        (ECT_AT, s(&rfc3339(t(6001)))),
                        (RC, s("0")),
                        (RC_AT, s(&rfc3339(t(6000)))),
                    ],
                    Some(RAISED),
                    None,
                ),
            ),
            (
                "at the bound nothing is counted",
                TimeoutFacts {
                    current: Some(Ok(Duration::from_secs(6075))),
                    failures: vec![JoinFailure {
                        at: t(7000),
                        timeout: Duration::from_secs(6075),
                    }],
                    ..managed(0, 0)
                },
                default,
                7001,
                nothing(),
            ),
            (
                "--machine-creation-timeout-max bounds the raise",
                TimeoutFacts {
                    failures: vec![failure(1200, 20)],
                    ..fresh()
                },
                max_25m,
                1201,
                (
                    vec![
                        (ECT, s("25m0s")),
                        (ECT_AT, s(&rfc3339(t(1201)))),
                        (RC, s("0")),
                        (RC_AT, s(&rfc3339(t(1200)))),
                    ],
                    Some(RAISED),
                    None,
                ),
            ),
            (
                "a user's value is the starting point of the growth",
                TimeoutFacts {
                    current: Some(Ok(mins(25))),
                    failures: vec![failure(1500, 25)],
                    ..fresh()
                },
                threshold_one,
                1501,
                (
                    vec![
                        (ECT, s("37m30s")),
                        (ECT_AT, s(&rfc3339(t(1501)))),
                        (RC, s("0")),
                        (RC_AT, s(&rfc3339(t(1500)))),
                    ],
                    Some(RAISED),
                    None,
                ),
            ),
            (
                "a user's value is never lowered",
                TimeoutFacts {
                    current: Some(Ok(mins(25))),
                    joins: vec![join(9000, 60), join(9010, 70)],
                    ..fresh()
                },
                default,
                9020,
                nothing(),
            ),
            (
                "growth 0 turns the adaptation off",
                TimeoutFacts {
                    cycles: 1,
                    cycles_at: Some(t(1200)),
                    failures: vec![failure(2401, 20)],
                    ..fresh()
                },
                off,
                2402,
                nothing(),
            ),
            (
                "an annotation that is not a duration stops the adaptation",
                TimeoutFacts {
                    current: Some(Err("a while".into())),
                    failures: vec![failure(1200, 20)],
                    ..fresh()
                },
                threshold_one,
                1201,
                nothing(),
            ),
            (
                "lowering waits a window after the last change (the cooldown)",
                TimeoutFacts {
                    joins: vec![join(900, 120), join(950, 130)],
                    ..managed(30, 400)
                },
                default,
                1000,
                (vec![], None, Some(Duration::from_secs(30 * 60 - 600))),
            ),
            (
                "fast joins after the cooldown: back to the declared value, the keys go",
                TimeoutFacts {
                    cycles: 0,
                    cycles_at: Some(t(0)),
                    joins: vec![join(1900, 120), join(1950, 130)],
                    ..managed(30, 0)
                },
                default,
                2000,
                (
                    vec![(ECT, None), (ECT_AT, None), (RC, None), (RC_AT, None)],
                    Some(LOWERED),
                    None,
                ),
            ),
            (
                "lowered to the slowest recent join grown once, the cycle count cleared",
                TimeoutFacts {
                    joins: vec![join(9000, 25 * 60), join(9100, 30 * 60)],
                    ..managed(60, 0)
                },
                default,
                9200,
                (
                    vec![
                        (ECT, s("45m0s")),
                        (ECT_AT, s(&rfc3339(t(9200)))),
                        (RC, None),
                        (RC_AT, None),
                    ],
                    Some(LOWERED),
                    None,
                ),
            ),
            (
                "lowering never raises: slow joins keep the current value",
                TimeoutFacts {
                    joins: vec![join(9000, 25 * 60), join(9100, 26 * 60)],
                    ..managed(30, 0)
                },
                default,
                9200,
                nothing(),
            ),
            (
                "one join is not enough to lower",
                TimeoutFacts {
                    joins: vec![join(9000, 60)],
                    ..managed(30, 0)
                },
                default,
                9200,
                nothing(),
            ),
            (
                "a failure in the window holds the lowering until it has left the window",
                TimeoutFacts {
                    cycles_at: Some(t(8800)),
                    joins: vec![join(9000, 60), join(9100, 60)],
                    failures: vec![failure(8900, 30)],
                    ..managed(30, 0)
                },
                default,
                9200,
                (vec![], None, Some(Duration::from_secs(30 * 60 - 300 + 1))),
            ),
            (
                "the declared timeout raised above the controller's value: the keys go",
                TimeoutFacts {
                    declared: mins(40),
                    ..managed(30, 0)
                },
                default,
                100,
                (
                    vec![(ECT, None), (ECT_AT, None), (RC, None), (RC_AT, None)],
                    Some(RAISED),
                    None,
                ),
            ),
            (
                "a healthy window clears a stale cycle count",
                TimeoutFacts {
                    cycles: 1,
                    cycles_at: Some(t(0)),
                    joins: vec![join(9000, 60), join(9100, 60)],
                    ..fresh()
                },
                default,
                9200,
                (vec![(RC, None), (RC_AT, None)], None, None),
            ),
        ];
        for (name, facts, settings, now, (annotations, reason, recheck)) in cases {
            let plan = decide(&facts, &settings, t(now));
            let want: BTreeMap<&str, Option<String>> = annotations.into_iter().collect();
            assert_eq!(plan.annotations, want, "{name}");
            assert_eq!(plan.event.as_ref().map(|e| e.0), reason, "{name}");
            assert_eq!(plan.recheck, recheck, "{name}");
        }
    }

    fn machine(phase: &str, op: serde_json::Value, extra: serde_json::Value) -> Machine {
        let mut m = serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m", "creationTimestamp": "2026-11-28T10:00:00Z"},
            "spec": {"creationTimeout": "20m0s"},
            "status": {"currentStatus": {"phase": phase}, "lastOperation": op},
        });
        if let (Some(m), serde_json::Value::Object(extra)) = (m.as_object_mut(), extra) {
            for (k, v) in extra {
                m.insert(k, v);
            }
        }
        serde_json::from_value(m).unwrap()
    }

    fn op(type_: &str, state: &str, description: &str, at: &str) -> serde_json::Value {
        serde_json::json!({"type": type_, "state": state, "description": description,
                           "lastUpdateTime": at})
    }

    #[test]
    fn joins_and_failures_are_read_from_the_machines() {
        use serde_json::json;
        let at = "2026-11-28T10:25:00Z";
        let joined = machine(
            "Running",
            op(
                "Create",
                "Successful",
                "Machine m successfully joined the cluster in 25m0s",
                at,
            ),
            json!({}),
        );
        let ours = machine(
            "Failed",
            op(
                "Create",
                "Failed",
                "Machine m failed: machine did not join the cluster within the creation timeout (20m0s)",
                "2026-11-28T10:20:01Z",
            ),
            json!({"metadata": {"name": "m", "creationTimestamp": "2026-11-28T10:00:00Z",
                   "deletionTimestamp": "2026-11-28T10:20:02Z",
                   "annotations": {annotations::EFFECTIVE_CREATION_TIMEOUT: "30s"}}}),
        );
        let go = machine(
            "Failed",
            op(
                "Create",
                "Failed",
                "Machine m failed to join the cluster in 20m0s minutes.",
                "2026-11-28T10:20:00Z",
            ),
            json!({}),
        );
        let unhealthy = machine(
            "Failed",
            op(
                "HealthCheck",
                "Failed",
                "Machine m failed: machine stayed unhealthy beyond the health timeout (10m0s): x",
                at,
            ),
            json!({}),
        );
        let class_problem = machine(
            "Failed",
            op(
                "Create",
                "Failed",
                "Machine m failed: machine could not be created within the creation timeout (20m0s): no class",
                at,
            ),
            json!({}),
        );
        let healthy_again = machine(
            "Running",
            op(
                "HealthCheck",
                "Successful",
                "Machine m is healthy again",
                at,
            ),
            json!({}),
        );
        assert_eq!(
            join_of(&joined),
            Some(Join {
                at: "2026-11-28T10:25:00Z".parse().unwrap(),
                took: mins(25),
            })
        );
        assert_eq!(
            failure_of(&ours, mins(20)),
            Some(JoinFailure {
                at: "2026-11-28T10:20:01Z".parse().unwrap(),
                timeout: Duration::from_secs(30),
            })
        );
        assert_eq!(failure_of(&go, mins(40)).map(|f| f.timeout), Some(mins(20)));
        // A machine that sets no timeout had the flag's.
        let mut unset = go.clone();
        unset.spec.configuration.creation_timeout = None;
        assert_eq!(
            failure_of(&unset, mins(40)).map(|f| f.timeout),
            Some(mins(40))
        );
        for other in [&unhealthy, &class_problem, &healthy_again] {
            assert_eq!(join_of(other), None);
            assert_eq!(failure_of(other, mins(20)), None);
        }

        let mut d: MachineDeployment = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": {"name": "d", "annotations": {
                annotations::EFFECTIVE_CREATION_TIMEOUT: "30m0s",
                annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT: "garbled",
                annotations::REPLACE_CYCLE_COUNT: "1",
                annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT: "2026-11-28T10:20:01Z",
            }},
            "spec": {"template": {"spec": {"creationTimeout": "25m"}}},
        }))
        .unwrap();
        let all = [
            &joined,
            &ours,
            &go,
            &unhealthy,
            &class_problem,
            &healthy_again,
        ];
        let facts = observe(&d, &all, mins(20));
        assert_eq!(facts.declared, mins(25));
        assert_eq!(facts.current, Some(Ok(mins(30))));
        // A time that does not parse counts as long ago.
        assert_eq!(facts.applied_at, Some(Timestamp::UNIX_EPOCH));
        assert_eq!(facts.cycles, 1);
        assert_eq!((facts.joins.len(), facts.failures.len()), (1, 2));
        assert_eq!(effective_timeout(&d, mins(20)), mins(30));
        d.annotations_mut()
            .remove(annotations::EFFECTIVE_CREATION_TIMEOUT);
        assert_eq!(effective_timeout(&d, mins(20)), mins(25));
        d.spec.template.spec = None;
        assert_eq!(effective_timeout(&d, mins(20)), mins(20));
    }

    #[test]
    fn only_changes_are_written() {
        let mut d = MachineDeployment::default();
        d.annotations_mut()
            .insert(annotations::REPLACE_CYCLE_COUNT.into(), "1".into());
        let plan = TimeoutPlan {
            annotations: BTreeMap::from([
                (annotations::REPLACE_CYCLE_COUNT, Some("1".to_owned())),
                (annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT, None),
                (
                    annotations::EFFECTIVE_CREATION_TIMEOUT,
                    Some("30s".to_owned()),
                ),
            ]),
            ..TimeoutPlan::default()
        };
        assert_eq!(
            changes(&d, &plan),
            BTreeMap::from([(
                annotations::EFFECTIVE_CREATION_TIMEOUT,
                Some("30s".to_owned())
            )])
        );
    }

    #[test]
    fn the_bound_and_the_growth() {
        let s = TimeoutAdaptation::default();
        assert_eq!(s.bound(mins(20)), Duration::from_secs(6075));
        assert_eq!(s.grow(mins(20)), mins(30));
        assert_eq!(s.grow(Duration::from_secs(25)), Duration::from_secs(38));
        let capped = TimeoutAdaptation {
            max: Some(mins(10)),
            ..s
        };
        // Never below the declared timeout.
        assert_eq!(capped.bound(mins(20)), mins(20));
    }

    #[test]
    fn events_say_from_what_to_what_and_why() {
        let raise = decide(
            &TimeoutFacts {
                cycles: 1,
                cycles_at: Some(t(1200)),
                failures: vec![failure(2401, 20)],
                ..fresh()
            },
            &TimeoutAdaptation::default(),
            t(2402),
        );
        assert_eq!(
            raise.event.unwrap().1,
            "20m0s -> 30m0s: 2 replace cycles (threshold 2) of machines that did not join within 20m0s"
        );
        let lower = decide(
            &TimeoutFacts {
                joins: vec![join(1900, 120), join(1950, 130)],
                ..managed(30, 0)
            },
            &TimeoutAdaptation::default(),
            t(2000),
        );
        assert_eq!(
            lower.event.unwrap().1,
            "30m0s -> 20m0s (declared): the slowest of 2 machines that joined within the last 30m0s took 2m10s"
        );
    }

    /// A slow cloud stepped through time: 3 machines that need 25 minutes to join, a
    /// declared 20m. The MachineSet replaces a failed machine at once, and a replacement gets
    /// the deployment's value only a second after it was written. The timeout settles at
    /// 30m after two cycles and every machine joins; attempts per machine stay small.
    #[test]
    fn a_slow_cloud_converges() {
        let s = TimeoutAdaptation::default();
        let boot = mins(25);
        let mut anns: BTreeMap<&str, String> = BTreeMap::new();
        let mut changed_at = i64::MIN;
        // (created, timeout, joined)
        let mut machines: Vec<(i64, Duration, bool)> = vec![(0, mins(20), false); 3];
        let mut failures: Vec<JoinFailure> = vec![];
        let mut joins: Vec<Join> = vec![];
        let mut created = 3;
        for now in 0..(4 * 3600) {
            let effective = anns
                .get(ECT)
                .map_or(mins(20), |v| parse_go_duration(v).unwrap());
            // The set's copy of the value, one second behind the deployment.
            let set_value = if now > changed_at + 1 {
                effective
            } else {
                mins(20)
            };
            for m in machines.iter_mut() {
                let age = Duration::from_secs(u64::try_from(now - m.0).unwrap());
                if !m.2 && age >= boot && age < m.1 {
                    m.2 = true;
                    joins.push(join(now, age.as_secs()));
                } else if !m.2 && age >= m.1 {
                    failures.push(JoinFailure {
                        at: t(now),
                        timeout: m.1,
                    });
                    *m = (now, set_value, false);
                    created += 1;
                }
            }
            let facts = TimeoutFacts {
                declared: mins(20),
                current: anns.get(ECT).map(|v| Ok(parse_go_duration(v).unwrap())),
                applied_at: anns.get(ECT_AT).map(|v| v.parse().unwrap()),
                cycles: anns.get(RC).map_or(0, |v| v.parse().unwrap()),
                cycles_at: anns.get(RC_AT).map(|v| v.parse().unwrap()),
                joins: joins.clone(),
                failures: failures.clone(),
            };
            let plan = decide(&facts, &s, t(now));
            for (k, v) in plan.annotations {
                if k == ECT {
                    changed_at = now;
                }
                match v {
                    Some(v) => anns.insert(k, v),
                    None => anns.remove(k),
                };
            }
        }
        assert!(machines.iter().all(|m| m.2), "{machines:?}");
        assert_eq!(anns.get(ECT).map(String::as_str), Some("30m0s"));
        // Two cycles of 20m, one machine each created under 20m while the new value was on
        // its way, then one that joins: 4 attempts per machine (without the adaptation: one
        // more every 20 minutes, forever).
        assert_eq!(created, 3 * 4);
    }
}
