//! The shared state of the MachineDisruptionBudget controller and its error type.

use kube::Client;
use kube::runtime::reflector::Store;
use mcm_api::Machine;

use super::gate::BudgetGate;
use crate::events::EventPublisher;
use crate::kube_api::ReconcileFailure;

/// Problems of a budget that are no API failures (none yet: a bad spec is reported on the
/// object, not returned).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BudgetProblem {}

/// Errors of the budget reconciler.
pub(crate) type Error = ReconcileFailure<BudgetProblem>;

/// Shared state of the budget controller.
pub(crate) struct Context {
    /// Client of the control cluster.
    pub client: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// The gate (budgets store, in-flight deletions, waits).
    pub gate: BudgetGate,
    /// Event publisher.
    pub events: EventPublisher,
    /// The last Event note announced per budget uid, so an Event is published on a
    /// transition, not on every reconcile.
    pub announced: crate::announce::Announced,
    /// Where the controller takes time from (also the gate's ledger times).
    pub clock: crate::clock::SharedClock,
}
