//! The shared state of the MachineSet controller and its error type.

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::reflector::Store;
use mcm_api::constants::finalizers;
use mcm_api::{Machine, MachineDeployment};

use super::expectations::Expectations;
use crate::disruptionbudget::BudgetGate;
use crate::events::EventPublisher;
use crate::kube_api::ReconcileFailure;

/// The finalizer of the manager's controllers.
pub(crate) const FINALIZER: &str = finalizers::MACHINE_CONTROLLER_MANAGER;

/// Problems of a MachineSet that are no API failures.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetProblem {
    /// The template of the set has no labels: machines created from it could never be
    /// selected.
    #[error("MachineSet {0} has a template without labels")]
    TemplateWithoutLabels(String),
}

/// Errors of the MachineSet reconciler. Each keeps the underlying error.
pub(crate) type Error = ReconcileFailure<SetProblem>;

/// Shared state of the MachineSet reconciler.
pub(crate) struct Context {
    /// Client of the control cluster.
    pub client: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// Store of the target cluster's Nodes (read only: a Node's preserve annotation decides
    /// whether its Failed machine is kept).
    pub nodes: Store<Node>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Pending creations/deletions per set.
    pub expectations: Expectations,
    /// The selector-overlap warning announced per set (uid) by this process, so that it is
    /// published once per change, not on every reconcile.
    pub overlaps: crate::announce::Announced,
    /// Paces status writes that change only counters.
    pub status_pacer: crate::pacer::StatusPacer,
    /// Store of the MachineDeployments (is a set an old set of a rolling deployment?).
    pub deployments: Store<MachineDeployment>,
    /// The MachineDisruptionBudget gate voluntary deletions ask first.
    pub budget_gate: BudgetGate,
    /// The budget refusals announced per set (uid) by this process, so that the Warning is
    /// published when they change, not on every reconcile.
    pub announced_blocks: crate::announce::Announced,
    /// Where the controller takes time from.
    pub clock: crate::clock::SharedClock,
}
