//! The gate voluntary disruptions ask first ([`BudgetGate`]), shared by every reconcile of
//! the process: it admits or refuses a deletion with [`super::decide::may_disrupt`], keeps
//! the admitted deletions in flight for [`IN_FLIGHT_TIMEOUT`] and the refused ones as waits
//! on their budget for [`WAIT_TIMEOUT`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use mcm_api::{DisruptionReason, Machine, MachineDisruptionBudget};

use super::decide;
use super::model::{Blocked, Waiting};

/// How long an admitted deletion counts as in flight when the store never shows it.
pub const IN_FLIGHT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a recorded wait is reported on the budget without being renewed.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

const PENDING: u8 = 0;
const ENFORCED: u8 = 1;
const ABSENT: u8 = 2;

/// Why the gate refused a voluntary deletion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
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
}

/// The gate of voluntary disruptions, shared by the MachineSet and budget controllers.
#[derive(Clone)]
pub struct BudgetGate {
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
    pub fn new(
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
    pub fn set_enforced(&self) {
        self.state.store(ENFORCED, Ordering::SeqCst);
    }

    /// The cluster does not serve the kind: admit everything.
    pub fn set_absent(&self) {
        self.state.store(ABSENT, Ordering::SeqCst);
    }

    /// Admits or refuses the voluntary deletion of `machine` for `reason`. `machines` are
    /// the current machines of the store. An admitted deletion counts as in flight for
    /// [`IN_FLIGHT_TIMEOUT`]; call [`BudgetGate::forget`] when it was not issued after
    /// all. A refusal by a budget is recorded as a wait on it.
    pub fn admit(
        &self,
        machines: &[Arc<Machine>],
        machine: &Machine,
        reason: &DisruptionReason,
        now: Timestamp,
        instant: Instant,
    ) -> Result<(), Refusal> {
        match self.state.load(Ordering::SeqCst) {
            ABSENT => return Ok(()),
            PENDING => return Err(Refusal::NotSynced),
            _ => {}
        }
        let ns = machine.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", machine.name_any());
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        prune(&mut ledger.in_flight, machines, instant);
        let in_flight = in_flight_of(&ledger.in_flight, &ns);
        let refs: Vec<&Machine> = machines
            .iter()
            .map(AsRef::as_ref)
            .filter(|m| m.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        let budgets = self.budgets.state();
        match decide::may_disrupt(
            budgets.iter().map(AsRef::as_ref),
            &refs,
            machine,
            reason,
            now,
            &in_flight,
        ) {
            Ok(()) => {
                ledger.in_flight.insert(key, instant);
                for waits in ledger.waiting.values_mut() {
                    waits.retain(|w| w.machine != machine.name_any());
                }
                Ok(())
            }
            Err(blocked) => {
                let budget_key = format!("{ns}/{}", blocked.budget);
                let waits = ledger.waiting.entry(budget_key).or_default();
                let new = !waits.iter().any(|w| w.machine == blocked.machine);
                waits.retain(|w| w.machine != blocked.machine);
                waits.push(Waiting {
                    machine: blocked.machine.clone(),
                    reason: reason.clone(),
                    since: instant,
                });
                if new {
                    let _ = self
                        .wake
                        .unbounded_send(ObjectRef::new(&blocked.budget).within(&ns));
                }
                Err(blocked.into())
            }
        }
    }

    /// Drops the in-flight record of a deletion that was not issued.
    pub fn forget(&self, namespace: &str, machine: &str) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.in_flight.remove(&format!("{namespace}/{machine}"));
    }

    /// The deletions in flight in `namespace` (names) at `now`, after dropping those that
    /// timed out.
    pub fn in_flight(
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
    pub fn waiting(&self, namespace: &str, name: &str, now: Instant) -> Vec<Waiting> {
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
