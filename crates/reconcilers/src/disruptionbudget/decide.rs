//! Pure decisions about MachineDisruptionBudgets: is a spec valid, which machines a budget
//! selects, how many of them are available, how many voluntary disruptions it allows now,
//! whether it applies to a reason at a time, and whether one machine may be disrupted
//! ([`may_disrupt`]), and what a budget's status says ([`verdict`], [`desired_status`]).
//!
//! Counting (as a Kubernetes PodDisruptionBudget, with Machines):
//! - a selected Machine is **available** when its phase is `Running` and it is not being
//!   deleted;
//! - it is **deleting** when it has a deletion timestamp, is `Terminating`, or its deletion
//!   was just issued by this process and not seen in the store yet (`in_flight`);
//! - every other selected Machine (Failed, Unknown, Pending, CrashLoopBackOff, no phase yet,
//!   ...) is **involuntarily unavailable**: it consumes the budget but nothing involuntary is
//!   ever blocked;
//! - `expectedMachines` is every selected Machine, those being deleted included (so a
//!   machine in deletion keeps using the budget until it is gone);
//! - `desiredAvailable` is `minAvailable` (a percentage of `expectedMachines`, rounded up) or
//!   `expectedMachines - maxUnavailable` (a percentage rounded up), at least 0; and
//!   `disruptionsAllowed = max(0, currentAvailable - desiredAvailable)`.
//!
//! A machine that is itself unavailable may be disrupted as long as the budget is healthy
//! (`currentAvailable >= desiredAvailable`), like Kubernetes' default
//! `unhealthyPodEvictionPolicy: IfHealthyBudget`: deleting it takes nothing more away, and a
//! preserved Failed machine that consumes the budget could otherwise never be released.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::constants::{annotations, node_conditions};
use mcm_api::cron::Schedule;
use mcm_api::disruption_budget::{
    BudgetCondition, CONDITION_DISRUPTION_ALLOWED, MachineDisruptionBudgetStatus, condition_reasons,
};
use mcm_api::duration::parse_go_duration;
use mcm_api::intstr::scaled_value;
use mcm_api::preservation;
use mcm_api::{ConditionStatus, DisruptionReason, Machine, MachineDisruptionBudget, MachinePhase};

use super::model::{Blocked, Counts, InvalidSpec, Limit, Policy, Standing, Verdict, Waiting};
use crate::selector::selector_matches;

/// The longest window a budget may have: the window check looks back minute by minute.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(31 * 24 * 3600);

/// Checks a budget's spec: exactly one of `minAvailable`/`maxUnavailable`, each a
/// non-negative number or a percentage (`maxUnavailable` at most `100%`), known reasons,
/// window schedules that parse and durations that are positive Go durations of at most
/// [`MAX_WINDOW`].
pub(crate) fn validate(budget: &MachineDisruptionBudget) -> Result<Policy, InvalidSpec> {
    let spec = &budget.spec;
    let mut problems = Vec::new();
    let check = |field: &str, v: &IntOrString, problems: &mut Vec<String>| {
        if let Err(e) = scaled_value(v, 100, true) {
            problems.push(format!("spec.{field}: {e}"));
        }
    };
    let limit = match (&spec.min_available, &spec.max_unavailable) {
        (Some(_), Some(_)) => {
            problems.push("spec: set only one of minAvailable and maxUnavailable".into());
            None
        }
        (None, None) => {
            problems.push("spec: set one of minAvailable and maxUnavailable".into());
            None
        }
        (Some(v), None) => {
            check("minAvailable", v, &mut problems);
            Some(Limit::MinAvailable(v.clone()))
        }
        (None, Some(v)) => {
            check("maxUnavailable", v, &mut problems);
            if matches!(scaled_value(v, 100, true), Ok(p) if p > 100 && matches!(v, IntOrString::String(_)))
            {
                problems.push("spec.maxUnavailable: a percentage must be at most 100%".into());
            }
            Some(Limit::MaxUnavailable(v.clone()))
        }
    };
    let reasons = spec.reasons.as_ref().map(|rs| {
        for r in rs.iter().filter(|r| !r.is_known()) {
            problems.push(format!(
                "spec.reasons: unknown reason {:?} (allowed: RollingUpdate, ScaleDown, PreservationRelease)",
                r.as_str()
            ));
        }
        rs.iter().cloned().collect::<BTreeSet<_>>()
    });
    let mut windows = Vec::new();
    for (i, w) in spec.windows.iter().flatten().enumerate() {
        let schedule = Schedule::parse(&w.schedule)
            .map_err(|e| problems.push(format!("spec.windows[{i}].schedule: {e}")))
            .ok();
        let duration = match parse_go_duration(&w.duration) {
            Ok(d) if d.is_zero() => {
                problems.push(format!("spec.windows[{i}].duration: must be positive"));
                None
            }
            Ok(d) if d > MAX_WINDOW => {
                problems.push(format!(
                    "spec.windows[{i}].duration: at most 744h (31 days)"
                ));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("spec.windows[{i}].duration: {e}"));
                None
            }
        };
        if let (Some(s), Some(d)) = (schedule, duration) {
            windows.push((s, d));
        }
    }
    match limit {
        Some(limit) if problems.is_empty() => Ok(Policy {
            limit,
            reasons,
            windows,
        }),
        _ => Err(InvalidSpec { problems }),
    }
}

/// How `machine` counts; `in_flight` holds the names whose deletion this process issued and
/// has not seen in the store yet.
pub(crate) fn standing(machine: &Machine, in_flight: &HashSet<String>) -> Standing {
    let name = machine.metadata.name.as_deref().unwrap_or_default();
    if machine.is_terminating() || in_flight.contains(name) {
        Standing::Deleting
    } else if machine.phase() == Some(&MachinePhase::Running) {
        Standing::Available
    } else {
        Standing::Involuntary
    }
}

/// Whether `budget` selects `machine`: same namespace and a non-empty selector matching its
/// labels.
pub(crate) fn selects(budget: &MachineDisruptionBudget, machine: &Machine) -> bool {
    budget.metadata.namespace == machine.metadata.namespace
        && selector_matches(
            budget.spec.selector.as_ref(),
            machine.metadata.labels.as_ref(),
        )
}

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Counts the machines `selected` by a budget with `limit`.
pub(crate) fn count<'m>(
    limit: &Limit,
    selected: impl IntoIterator<Item = &'m Machine>,
    in_flight: &HashSet<String>,
) -> Counts {
    let mut counts = Counts::default();
    let mut n = 0usize;
    for m in selected {
        n += 1;
        match standing(m, in_flight) {
            Standing::Available => counts.current_available += 1,
            Standing::Deleting => counts.deleting += 1,
            Standing::Involuntary => counts.unavailable_involuntary += 1,
        }
    }
    counts.expected = to_i32(n);
    // `validate` has checked the values; a bad one here counts as "nothing may go".
    counts.desired_available = match limit {
        Limit::MinAvailable(v) => scaled_value(v, counts.expected, true).unwrap_or(i32::MAX),
        Limit::MaxUnavailable(v) => {
            counts.expected - scaled_value(v, counts.expected, true).unwrap_or(0)
        }
    }
    .max(0);
    counts.disruptions_allowed = (counts.current_available - counts.desired_available).max(0);
    counts
}

/// Whether `machine` may be disrupted for `reason` at `now`: every valid budget that
/// selects it, covers `reason` and is inside a window must allow it (the first one that does
/// not is returned). `machines` are the machines of the namespace (the budgets' selections
/// are taken from them); `in_flight` are deletions issued but not yet seen.
///
/// An invalid budget blocks nothing (its status says why). An available machine needs
/// `disruptionsAllowed >= 1`; an unavailable one a healthy budget.
pub(crate) fn may_disrupt<'b>(
    budgets: impl IntoIterator<Item = &'b MachineDisruptionBudget>,
    machines: &[&Machine],
    machine: &Machine,
    reason: &DisruptionReason,
    now: Timestamp,
    in_flight: &HashSet<String>,
) -> Result<(), Blocked> {
    for budget in budgets {
        if !selects(budget, machine) {
            continue;
        }
        let Ok(policy) = validate(budget) else {
            continue;
        };
        if !policy.covers(reason) || !policy.in_window(now) {
            continue;
        }
        let counts = count(
            &policy.limit,
            machines.iter().copied().filter(|m| selects(budget, m)),
            in_flight,
        );
        let available = standing(machine, in_flight) == Standing::Available;
        let allowed = if available {
            counts.disruptions_allowed >= 1
        } else {
            counts.healthy()
        };
        if !allowed {
            return Err(Blocked {
                budget: budget.metadata.name.clone().unwrap_or_default(),
                machine: machine.metadata.name.clone().unwrap_or_default(),
                reason: reason.clone(),
                message: exhausted_message(&counts),
            });
        }
    }
    Ok(())
}

/// The message of an exhausted budget.
pub(crate) fn exhausted_message(c: &Counts) -> String {
    format!(
        "{} of {} selected machines available, {} must stay available ({} being deleted, {} unavailable involuntarily); no disruption allowed",
        c.current_available, c.expected, c.desired_available, c.deleting, c.unavailable_involuntary
    )
}

/// Whether a Failed machine was preserved at some point: it has a preservation expiry, its
/// own preserve annotation is `false` (set when an auto-preservation ended), it recorded a
/// Node value, or its Node carries the `Preserved` condition (`node_preserved_condition`).
pub(crate) fn was_preserved(machine: &Machine, node_preserved_condition: bool) -> bool {
    let anns = machine.metadata.annotations.as_ref();
    preservation::expiry(machine).is_some()
        || anns
            .and_then(|a| a.get(annotations::PRESERVE))
            .is_some_and(|v| v == annotations::preserve_values::FALSE)
        || anns.is_some_and(|a| a.contains_key(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE))
        || node_preserved_condition
}

/// The name of the Node condition that marks a preserved (or formerly preserved) node.
pub(crate) const NODE_PRESERVED_CONDITION: &str = node_conditions::NODE_PRESERVED;

/// Why a MachineSet deletes a machine, as far as budgets are concerned: `None` for an
/// involuntary deletion (a Failed machine that was never preserved is replaced), else the
/// voluntary reason. `failed_to_replace`: the set deletes it because it is Failed and not kept;
/// `rolling_update`: the set is an old set of a MachineDeployment whose template differs.
pub(crate) fn deletion_reason(
    failed_to_replace: bool,
    was_preserved: bool,
    rolling_update: bool,
) -> Option<DisruptionReason> {
    match (failed_to_replace, was_preserved, rolling_update) {
        (true, true, _) => Some(DisruptionReason::PreservationRelease),
        (true, false, _) => None,
        (false, _, true) => Some(DisruptionReason::RollingUpdate),
        (false, _, false) => Some(DisruptionReason::ScaleDown),
    }
}

/// Decides a budget's condition and Warning from its spec, its selected machines, the
/// deletions in flight, the waiting disruptions and `now`. Pure.
pub(crate) fn verdict(
    budget: &MachineDisruptionBudget,
    selected: &[&Machine],
    in_flight: &std::collections::HashSet<String>,
    waiting: &[Waiting],
    now: Timestamp,
) -> Verdict {
    match validate(budget) {
        Err(e) => {
            let mut counts = Counts::default();
            for m in selected {
                counts.expected += 1;
                match standing(m, in_flight) {
                    Standing::Available => counts.current_available += 1,
                    Standing::Deleting => counts.deleting += 1,
                    Standing::Involuntary => counts.unavailable_involuntary += 1,
                }
            }
            let message = format!("the budget blocks nothing until its spec is fixed: {e}");
            Verdict {
                counts,
                valid: false,
                condition: (
                    ConditionStatus::False,
                    condition_reasons::INVALID_SPEC,
                    message.clone(),
                ),
                warning: Some((condition_reasons::INVALID_SPEC, message)),
            }
        }
        Ok(policy) => {
            let counts = count(&policy.limit, selected.iter().copied(), in_flight);
            let condition = if !policy.in_window(now) {
                (
                    ConditionStatus::True,
                    condition_reasons::OUTSIDE_WINDOWS,
                    "no window of the budget is open: it blocks nothing now".to_owned(),
                )
            } else if counts.disruptions_allowed > 0 {
                (
                    ConditionStatus::True,
                    condition_reasons::SUFFICIENT_MACHINES,
                    format!(
                        "{} voluntary disruption(s) allowed: {} of {} selected machines available, {} must stay available",
                        counts.disruptions_allowed,
                        counts.current_available,
                        counts.expected,
                        counts.desired_available
                    ),
                )
            } else {
                let mut message = exhausted_message(&counts);
                if !waiting.is_empty() {
                    message.push_str("; waiting: ");
                    message.push_str(&waiting_note(waiting));
                }
                (
                    ConditionStatus::False,
                    condition_reasons::BUDGET_EXHAUSTED,
                    message,
                )
            };
            let warning = (condition.1 == condition_reasons::BUDGET_EXHAUSTED
                && !waiting.is_empty())
            .then(|| {
                (
                    condition_reasons::BUDGET_EXHAUSTED,
                    format!(
                        "No voluntary disruption allowed; waiting: {}",
                        waiting_note(waiting)
                    ),
                )
            });
            Verdict {
                counts,
                valid: true,
                condition,
                warning,
            }
        }
    }
}

fn waiting_note(waiting: &[Waiting]) -> String {
    let mut items: Vec<String> = waiting
        .iter()
        .map(|w| format!("{} of machine {}", w.reason, w.machine))
        .collect();
    items.sort();
    items.join(", ")
}

/// The status a budget should have for `verdict` (the condition's transition time kept
/// when its status did not change).
pub(crate) fn desired_status(
    budget: &MachineDisruptionBudget,
    verdict: &Verdict,
    now: Timestamp,
) -> MachineDisruptionBudgetStatus {
    let prev = budget
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_DISRUPTION_ALLOWED));
    let (status, reason, message) = &verdict.condition;
    let last_transition_time = match prev {
        Some(p) if p.status == *status => p.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    let c = &verdict.counts;
    MachineDisruptionBudgetStatus {
        observed_generation: budget.metadata.generation,
        expected_machines: Some(c.expected),
        current_available: Some(c.current_available),
        desired_available: verdict.valid.then_some(c.desired_available),
        disruptions_allowed: Some(if verdict.valid {
            c.disruptions_allowed
        } else {
            0
        }),
        unavailable_involuntary: Some(c.unavailable_involuntary),
        conditions: Some(vec![BudgetCondition {
            type_: CONDITION_DISRUPTION_ALLOWED.to_owned(),
            status: status.clone(),
            last_transition_time,
            reason: Some((*reason).to_owned()),
            message: Some(message.clone()),
            observed_generation: budget.metadata.generation,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
    use mcm_api::{
        CurrentStatus, DisruptionWindow, MachineDisruptionBudgetSpec, MachineSpec, MachineStatus,
    };

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn int(i: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(i))
    }

    fn pct(s: &str) -> Option<IntOrString> {
        Some(IntOrString::String(s.into()))
    }

    fn selector(pool: &str) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some([("pool".to_string(), pool.to_string())].into()),
            ..LabelSelector::default()
        })
    }

    fn budget(
        name: &str,
        pool: &str,
        min: Option<IntOrString>,
        max: Option<IntOrString>,
    ) -> MachineDisruptionBudget {
        let mut b = MachineDisruptionBudget::new(
            name,
            MachineDisruptionBudgetSpec {
                selector: selector(pool),
                min_available: min,
                max_unavailable: max,
                ..MachineDisruptionBudgetSpec::default()
            },
        );
        b.metadata.namespace = Some("ns".into());
        b
    }

    fn machine(name: &str, pools: &[&str], phase: &str, deleting: bool) -> Machine {
        let mut m = Machine::new(name, MachineSpec::default());
        m.metadata.namespace = Some("ns".into());
        m.metadata.labels = Some(
            pools
                .iter()
                .map(|p| (format!("pool-{p}"), "x".to_string()))
                .chain(pools.first().map(|p| ("pool".to_string(), p.to_string())))
                .collect(),
        );
        m.status = Some(MachineStatus {
            current_status: Some(CurrentStatus {
                phase: Some(MachinePhase::from(phase.to_string())),
                ..CurrentStatus::default()
            }),
            ..MachineStatus::default()
        });
        if deleting {
            m.metadata.deletion_timestamp = Some(Time(t("2026-01-01T00:00:00Z")));
        }
        m
    }

    fn running(n: usize) -> Vec<Machine> {
        (0..n)
            .map(|i| machine(&format!("m{i}"), &["a"], "Running", false))
            .collect()
    }

    #[test]
    fn percentages_round_up_like_a_pod_disruption_budget() {
        // (limit, machines, desired, allowed)
        let cases = [
            (Limit::MaxUnavailable(IntOrString::Int(1)), 3, 2, 1),
            (
                Limit::MaxUnavailable(IntOrString::String("10%".into())),
                3,
                2,
                1,
            ),
            (
                Limit::MaxUnavailable(IntOrString::String("50%".into())),
                3,
                1,
                2,
            ),
            (
                Limit::MaxUnavailable(IntOrString::String("0%".into())),
                3,
                3,
                0,
            ),
            (
                Limit::MaxUnavailable(IntOrString::String("100%".into())),
                3,
                0,
                3,
            ),
            (Limit::MaxUnavailable(IntOrString::Int(5)), 3, 0, 3),
            (Limit::MinAvailable(IntOrString::Int(2)), 3, 2, 1),
            (
                Limit::MinAvailable(IntOrString::String("50%".into())),
                3,
                2,
                1,
            ),
            (
                Limit::MinAvailable(IntOrString::String("34%".into())),
                3,
                2,
                1,
            ),
            (
                Limit::MinAvailable(IntOrString::String("33%".into())),
                3,
                1,
                2,
            ),
            (Limit::MinAvailable(IntOrString::Int(5)), 3, 5, 0),
            (Limit::MinAvailable(IntOrString::Int(0)), 0, 0, 0),
        ];
        for (limit, n, desired, allowed) in cases {
            let ms = running(n);
            let c = count(&limit, &ms, &HashSet::new());
            assert_eq!(
                (c.desired_available, c.disruptions_allowed),
                (desired, allowed),
                "{limit:?} over {n}"
            );
        }
    }

    #[test]
    fn deleting_and_involuntary_machines_consume_the_budget() {
        let mut ms = running(3);
        ms.push(machine("f", &["a"], "Failed", false));
        ms.push(machine("d", &["a"], "Running", true));
        ms.push(machine("p", &["a"], "Pending", false));
        let in_flight: HashSet<String> = ["m0".to_string()].into();
        let c = count(&Limit::MaxUnavailable(IntOrString::Int(2)), &ms, &in_flight);
        assert_eq!(
            c,
            Counts {
                expected: 6,
                current_available: 2,
                desired_available: 4,
                disruptions_allowed: 0,
                unavailable_involuntary: 2,
                deleting: 2,
            }
        );
    }

    #[test]
    fn invalid_specs_name_every_problem() {
        let mut b = budget("b", "a", int(1), int(1));
        assert!(validate(&b).unwrap_err().to_string().contains("only one"));
        b.spec.min_available = None;
        b.spec.max_unavailable = None;
        assert!(validate(&b).unwrap_err().to_string().contains("set one of"));
        b.spec.max_unavailable = pct("x%");
        assert!(validate(&b).is_err());
        b.spec.max_unavailable = pct("150%");
        assert!(
            validate(&b)
                .unwrap_err()
                .to_string()
                .contains("at most 100%")
        );
        b.spec.max_unavailable = int(-1);
        assert!(validate(&b).is_err());
        b.spec.max_unavailable = int(1);
        b.spec.reasons = Some(vec!["Drifted".into()]);
        b.spec.windows = Some(vec![
            DisruptionWindow {
                schedule: "0 25 * * *".into(),
                duration: "1h".into(),
            },
            DisruptionWindow {
                schedule: "@daily".into(),
                duration: "an hour".into(),
            },
            DisruptionWindow {
                schedule: "@daily".into(),
                duration: "0s".into(),
            },
        ]);
        let e = validate(&b).unwrap_err();
        assert_eq!(e.problems.len(), 4, "{e}");
        assert!(e.problems[0].contains("Drifted"));
        assert!(e.problems[1].starts_with("spec.windows[0].schedule"));
        assert!(e.problems[2].starts_with("spec.windows[1].duration"));
        assert!(e.problems[3].starts_with("spec.windows[2].duration"));
        b.spec.reasons = Some(vec![DisruptionReason::ScaleDown]);
        b.spec.windows = Some(vec![DisruptionWindow {
            schedule: "0 9 * * mon-fri".into(),
            duration: "8h".into(),
        }]);
        assert!(validate(&b).is_ok());
    }

    #[test]
    fn windows_and_reasons_decide_whether_a_budget_applies() {
        let mut b = budget("b", "a", None, int(0));
        b.spec.windows = Some(vec![DisruptionWindow {
            schedule: "0 9 * * mon-fri".into(),
            duration: "8h".into(),
        }]);
        let p = validate(&b).unwrap();
        // 2026-01-05 is a Monday.
        assert!(p.in_window(t("2026-01-05T09:00:00Z")));
        assert!(p.in_window(t("2026-01-05T16:59:59Z")));
        assert!(!p.in_window(t("2026-01-05T17:00:00Z")));
        assert!(!p.in_window(t("2026-01-05T08:59:59Z")));
        assert!(!p.in_window(t("2026-01-04T12:00:00Z")));
        assert!(p.covers(&DisruptionReason::PreservationRelease));
        b.spec.reasons = Some(vec![DisruptionReason::RollingUpdate]);
        let p = validate(&b).unwrap();
        assert!(p.covers(&DisruptionReason::RollingUpdate));
        assert!(!p.covers(&DisruptionReason::ScaleDown));

        // The gate: blocked in the window for a covered reason only.
        let ms = running(3);
        let refs: Vec<&Machine> = ms.iter().collect();
        let none = HashSet::new();
        let at = |s| t(s);
        let gate = |reason, now| may_disrupt([&b], &refs, &ms[0], &reason, now, &none);
        assert!(gate(DisruptionReason::RollingUpdate, at("2026-01-05T10:00:00Z")).is_err());
        assert!(gate(DisruptionReason::ScaleDown, at("2026-01-05T10:00:00Z")).is_ok());
        assert!(gate(DisruptionReason::RollingUpdate, at("2026-01-05T18:00:00Z")).is_ok());
    }

    #[test]
    fn every_budget_over_a_machine_must_allow() {
        // m0 is in pools a and b; budget A allows one, budget B (pool b: only m0) none.
        let mut ms = running(3);
        ms[0] = machine("m0", &["a", "b"], "Running", false);
        let mut only_b = ms[0].clone();
        only_b
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("pool".into(), "b".into());
        ms[0] = only_b;
        // Relabel: m0 has pool=b, m1/m2 pool=a; A selects pool-a=x (all three), B pool=b.
        let mut a = budget("a", "a", None, int(1));
        a.spec.selector = Some(LabelSelector {
            match_labels: Some([("pool-a".to_string(), "x".to_string())].into()),
            ..LabelSelector::default()
        });
        let b = budget("b", "b", int(1), None);
        let refs: Vec<&Machine> = ms.iter().collect();
        let none = HashSet::new();
        let now = t("2026-01-05T10:00:00Z");
        let r = DisruptionReason::ScaleDown;
        let blocked = may_disrupt([&a, &b], &refs, &ms[0], &r, now, &none).unwrap_err();
        assert_eq!(blocked.budget, "b");
        assert!(may_disrupt([&a], &refs, &ms[0], &r, now, &none).is_ok());
        // m1 is only under A.
        assert!(may_disrupt([&a, &b], &refs, &ms[1], &r, now, &none).is_ok());
        // With m0 in flight, A has no room left for m1.
        let in_flight: HashSet<String> = ["m0".to_string()].into();
        assert_eq!(
            may_disrupt([&a, &b], &refs, &ms[1], &r, now, &in_flight)
                .unwrap_err()
                .budget,
            "a"
        );
    }

    #[test]
    fn invalid_or_foreign_budgets_block_nothing() {
        let ms = running(2);
        let refs: Vec<&Machine> = ms.iter().collect();
        let none = HashSet::new();
        let now = t("2026-01-05T10:00:00Z");
        let r = DisruptionReason::ScaleDown;
        let invalid = budget("i", "a", int(2), int(0));
        assert!(may_disrupt([&invalid], &refs, &ms[0], &r, now, &none).is_ok());
        let mut empty = budget("e", "a", int(2), None);
        empty.spec.selector = Some(LabelSelector::default());
        assert!(may_disrupt([&empty], &refs, &ms[0], &r, now, &none).is_ok());
        let mut elsewhere = budget("o", "a", int(2), None);
        elsewhere.metadata.namespace = Some("other".into());
        assert!(may_disrupt([&elsewhere], &refs, &ms[0], &r, now, &none).is_ok());
        let strict = budget("s", "a", int(2), None);
        assert!(may_disrupt([&strict], &refs, &ms[0], &r, now, &none).is_err());
    }

    #[test]
    fn an_unavailable_machine_may_go_while_the_budget_is_healthy() {
        // 3 running + 1 Failed, maxUnavailable 1: 3 of 4 available, 3 desired, 0 allowed.
        let mut ms = running(3);
        ms.push(machine("f", &["a"], "Failed", false));
        let refs: Vec<&Machine> = ms.iter().collect();
        let none = HashSet::new();
        let now = t("2026-01-05T10:00:00Z");
        let b = budget("b", "a", None, int(1));
        let r = DisruptionReason::PreservationRelease;
        assert!(may_disrupt([&b], &refs, &ms[3], &r, now, &none).is_ok());
        assert!(
            may_disrupt(
                [&b],
                &refs,
                &ms[0],
                &DisruptionReason::ScaleDown,
                now,
                &none
            )
            .is_err()
        );
        // One running machine deleting as well: unhealthy, the release waits too.
        let in_flight: HashSet<String> = ["m0".to_string()].into();
        assert!(may_disrupt([&b], &refs, &ms[3], &r, now, &in_flight).is_err());
    }

    #[test]
    fn the_reason_of_a_deletion() {
        use DisruptionReason::*;
        assert_eq!(deletion_reason(true, false, true), None);
        assert_eq!(
            deletion_reason(true, true, false),
            Some(PreservationRelease)
        );
        assert_eq!(deletion_reason(false, false, true), Some(RollingUpdate));
        assert_eq!(deletion_reason(false, true, false), Some(ScaleDown));
        let mut m = machine("m", &["a"], "Failed", false);
        assert!(!was_preserved(&m, false));
        assert!(was_preserved(&m, true));
        m.metadata.annotations =
            Some([(annotations::PRESERVE.to_string(), "false".to_string())].into());
        assert!(was_preserved(&m, false));
    }
}
