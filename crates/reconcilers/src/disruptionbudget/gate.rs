//! The gate voluntary disruptions ask first ([`BudgetGate`]), shared by every reconcile of
//! the process. A reconcile reads a [`GateView`] (enforcement, deletions in flight), decides
//! each deletion purely with [`super::decide::may_disrupt`] and commits its verdicts
//! ([`BudgetGate::commit`]): the admitted deletions stay in flight for [`IN_FLIGHT_TIMEOUT`],
//! the refused ones wait on their budget for [`WAIT_TIMEOUT`]. A commit made from a view that
//! another reconcile's admissions outdated is refused, so budgets are never overshot.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use kube::runtime::reflector::{ObjectRef, Store};
use mcm_api::{Machine, MachineDisruptionBudget};

use super::model::{Blocked, Waiting};

/// How long an admitted deletion counts as in flight when the store never shows it.
pub(crate) const IN_FLIGHT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a recorded wait is reported on the budget without being renewed.
pub(crate) const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

const PENDING: u8 = 0;
const ENFORCED: u8 = 1;
const ABSENT: u8 = 2;

/// Why the gate refused a voluntary deletion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// A budget is exhausted.
    #[error(transparent)]
    Blocked(#[from] Blocked),
    /// The budgets have not been listed yet.
    #[error("the MachineDisruptionBudgets have not been listed yet")]
    NotSynced,
}

#[derive(Debug, Default)]
struct Ledger {
    /// `namespace/name` of admitted deletions not yet seen, with when they were admitted.
    in_flight: HashMap<String, Instant>,
    /// `namespace/budget` to the disruptions waiting for it.
    waiting: HashMap<String, Vec<Waiting>>,
    /// Per namespace, how many commits admitted deletions there.
    versions: HashMap<String, u64>,
}

/// Whether the gate enforces budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enforcement {
    /// The budgets have not been listed yet: voluntary deletions wait.
    Pending,
    /// The budgets are listed and enforced.
    Enforced,
    /// The cluster does not serve budgets: everything is admitted.
    Absent,
}

/// What a reconcile reads of the gate ([`BudgetGate::view`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GateView {
    /// Whether budgets are enforced.
    pub(crate) enforcement: Enforcement,
    /// The deletions in flight in the namespace (names).
    pub(crate) in_flight: HashSet<String>,
    /// The version of the namespace's ledger this view was read at.
    pub(crate) version: u64,
}

/// What a reconcile records in the gate ([`BudgetGate::commit`]): its verdicts on the
/// voluntary deletions of one namespace, decided from the view of `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The namespace.
    pub(crate) namespace: String,
    /// The version of the view the verdicts come from.
    pub(crate) version: u64,
    /// The admitted deletions (machine names).
    pub(crate) admitted: Vec<String>,
    /// The deletions a budget refused.
    pub(crate) refused: Vec<Blocked>,
}

/// The gate of voluntary disruptions, shared by the MachineSet and budget controllers.
#[derive(Clone)]
pub(crate) struct BudgetGate {
    /// Store of the MachineDisruptionBudgets.
    pub budgets: Store<MachineDisruptionBudget>,
    state: Arc<AtomicU8>,
    ledger: Arc<Mutex<Ledger>>,
    wake: mpsc::UnboundedSender<ObjectRef<MachineDisruptionBudget>>,
}

impl std::fmt::Debug for BudgetGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetGate").finish_non_exhaustive()
    }
}

impl BudgetGate {
    /// A gate over `budgets`, pending until [`BudgetGate::set_enforced`] or
    /// [`BudgetGate::set_absent`]; the receiver yields the budgets whose waits changed (for
    /// the budget controller's `reconcile_on`).
    pub(crate) fn new(
        budgets: Store<MachineDisruptionBudget>,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<ObjectRef<MachineDisruptionBudget>>,
    ) {
        let (wake, rx) = mpsc::unbounded();
        (
            BudgetGate {
                budgets,
                state: Arc::new(AtomicU8::new(PENDING)),
                ledger: Arc::default(),
                wake,
            },
            rx,
        )
    }

    /// The budgets are listed: enforce them.
    pub(crate) fn set_enforced(&self) {
        self.state.store(ENFORCED, Ordering::SeqCst);
    }

    /// The cluster does not serve the kind: admit everything.
    pub(crate) fn set_absent(&self) {
        self.state.store(ABSENT, Ordering::SeqCst);
    }

    /// What a reconcile deciding voluntary deletions in `namespace` reads of the gate at
    /// `now`: whether budgets are enforced, the deletions in flight there and the version of
    /// the namespace's ledger (for [`BudgetGate::commit`]).
    pub(crate) fn view(
        &self,
        namespace: &str,
        machines: &[Arc<Machine>],
        now: Instant,
    ) -> GateView {
        let enforcement = match self.state.load(Ordering::SeqCst) {
            ABSENT => Enforcement::Absent,
            PENDING => Enforcement::Pending,
            _ => Enforcement::Enforced,
        };
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        prune(&mut ledger.in_flight, machines, now);
        GateView {
            enforcement,
            in_flight: in_flight_of(&ledger.in_flight, namespace),
            version: ledger.versions.get(namespace).copied().unwrap_or(0),
        }
    }

    /// Records what a reconcile decided from a [`GateView`] of version `reservation.version`:
    /// its admitted deletions in flight (so that every later view counts them) and its
    /// refusals as waits on their budgets (a new wait wakes the budget), all at `now`. Only
    /// while no other reconcile committed admissions in the namespace since that view
    /// (then nothing is recorded and `false` is returned: the verdicts are stale, the
    /// deletions must not be issued). Atomic: concurrent reconciles never overshoot a
    /// budget.
    pub(crate) fn commit(&self, reservation: &Reservation, now: Instant) -> bool {
        let ns = &reservation.namespace;
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let version = ledger.versions.get(ns).copied().unwrap_or(0);
        if version != reservation.version {
            return false;
        }
        if !reservation.admitted.is_empty() {
            ledger.versions.insert(ns.clone(), version + 1);
        }
        for machine in &reservation.admitted {
            ledger.in_flight.insert(format!("{ns}/{machine}"), now);
            for waits in ledger.waiting.values_mut() {
                waits.retain(|w| w.machine != *machine);
            }
        }
        for blocked in &reservation.refused {
            let budget_key = format!("{ns}/{}", blocked.budget);
            let waits = ledger.waiting.entry(budget_key).or_default();
            let new = !waits.iter().any(|w| w.machine == blocked.machine);
            waits.retain(|w| w.machine != blocked.machine);
            waits.push(Waiting {
                machine: blocked.machine.clone(),
                reason: blocked.reason.clone(),
                since: now,
            });
            if new {
                let _ = self
                    .wake
                    .unbounded_send(ObjectRef::new(&blocked.budget).within(ns));
            }
        }
        true
    }

    /// Drops the in-flight record of a deletion that was not issued.
    pub(crate) fn forget(&self, namespace: &str, machine: &str) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.in_flight.remove(&format!("{namespace}/{machine}"));
    }

    /// The deletions in flight in `namespace` (names) at `now`, after dropping those that
    /// timed out.
    pub(crate) fn in_flight(
        &self,
        namespace: &str,
        machines: &[Arc<Machine>],
        now: Instant,
    ) -> HashSet<String> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        prune(&mut ledger.in_flight, machines, now);
        in_flight_of(&ledger.in_flight, namespace)
    }

    /// The disruptions waiting for the budget `namespace/name` (refused within
    /// [`WAIT_TIMEOUT`] before `now`).
    pub(crate) fn waiting(&self, namespace: &str, name: &str, now: Instant) -> Vec<Waiting> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let key = format!("{namespace}/{name}");
        let Some(waits) = ledger.waiting.get_mut(&key) else {
            return Vec::new();
        };
        waits.retain(|w| now.saturating_duration_since(w.since) < WAIT_TIMEOUT);
        let out = waits.clone();
        if out.is_empty() {
            ledger.waiting.remove(&key);
        }
        out
    }
}

/// Drops in-flight records older than [`IN_FLIGHT_TIMEOUT`]. A record is not dropped when
/// one snapshot of the store shows the deletion: another reconcile may still decide from an
/// older snapshot, taken before, in which the machine is not deleting yet, and without the
/// record it would count that machine as available. Keeping it is free: a machine counts as
/// deleting when its store copy says so *or* its name is in flight, and a machine that is
/// gone is not counted at all.
fn prune(in_flight: &mut HashMap<String, Instant>, _machines: &[Arc<Machine>], now: Instant) {
    in_flight.retain(|_, since| now.saturating_duration_since(*since) <= IN_FLIGHT_TIMEOUT);
}

fn in_flight_of(in_flight: &HashMap<String, Instant>, namespace: &str) -> HashSet<String> {
    let prefix = format!("{namespace}/");
    in_flight
        .keys()
        .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::reflector;
    use mcm_api::DisruptionReason;

    use super::*;

    fn reservation(version: u64, admitted: &[&str], refused: &[&str]) -> Reservation {
        Reservation {
            namespace: "ns".into(),
            version,
            admitted: admitted.iter().map(|s| (*s).to_owned()).collect(),
            refused: refused
                .iter()
                .map(|m| Blocked {
                    budget: "b".into(),
                    machine: (*m).to_owned(),
                    reason: DisruptionReason::ScaleDown,
                    message: "0 allowed".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_commit_from_an_outdated_view_is_refused() {
        let (budgets, _writer) = reflector::store::<MachineDisruptionBudget>();
        let (gate, _wake) = BudgetGate::new(budgets);
        let now = Instant::now();
        assert_eq!(gate.view("ns", &[], now).enforcement, Enforcement::Pending);
        gate.set_enforced();
        let first = gate.view("ns", &[], now);
        assert_eq!(first.enforcement, Enforcement::Enforced);
        // (reservation, committed, in flight afterwards, version afterwards)
        let cases = [
            (reservation(first.version, &["a"], &[]), true, vec!["a"], 1),
            // Another reconcile decided from the same view: its admissions are stale.
            (reservation(first.version, &["b"], &[]), false, vec!["a"], 1),
            // Refusals alone do not outdate anyone's view.
            (reservation(1, &[], &["c"]), true, vec!["a"], 1),
            (reservation(1, &["b"], &[]), true, vec!["a", "b"], 2),
        ];
        for (r, committed, in_flight, version) in cases {
            assert_eq!(gate.commit(&r, now), committed, "{r:?}");
            let view = gate.view("ns", &[], now);
            let mut names: Vec<String> = view.in_flight.into_iter().collect();
            names.sort();
            assert_eq!(names, in_flight, "{r:?}");
            assert_eq!(view.version, version, "{r:?}");
        }
        // Other namespaces have ledgers of their own.
        assert_eq!(gate.view("other", &[], now).version, 0);
        // The refusal waits on its budget until it times out; an admission of the machine
        // ends its wait.
        assert_eq!(gate.waiting("ns", "b", now).len(), 1);
        assert!(gate.commit(&reservation(2, &["c"], &[]), now));
        assert!(gate.waiting("ns", "b", now).is_empty());
        let later = now + IN_FLIGHT_TIMEOUT + Duration::from_secs(1);
        assert!(gate.view("ns", &[], later).in_flight.is_empty());
    }
}
