//! The shared state of the MachineDeployment controller and its error type.

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::reflector::Store;
use mcm_api::{Machine, MachineSet};

use crate::events::EventPublisher;
use crate::kube_api::ReconcileFailure;

/// Problems of a MachineDeployment that are no API failures.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeploymentProblem {
    /// A MachineSet with the new set's name exists with another template.
    #[error("hash collision for MachineSet {0}")]
    HashCollision(String),
    /// The MachineSet a rollback chose has no template to roll back to.
    #[error("MachineSet {0} of the rollback revision has no template")]
    RollbackSetWithoutTemplate(String),
    /// A Node could not be uncordoned after the in-place update of its machine.
    #[error("failed to uncordon Node {node}")]
    Uncordon {
        /// The Node.
        node: String,
        /// Why.
        #[source]
        source: mcm_drain::DrainError,
    },
}

/// Errors of the MachineDeployment reconciler. Each keeps the underlying error.
pub(crate) type Error = ReconcileFailure<DeploymentProblem>;

/// Shared state of the MachineDeployment reconciler.
pub(crate) struct Context {
    /// Client of the control cluster (machine objects).
    pub client: Client,
    /// Client of the target cluster (Nodes).
    pub target: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// Store of the MachineSets.
    pub sets: Store<MachineSet>,
    /// Store of the target cluster's Nodes.
    pub nodes: Store<Node>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Annotate nodes against cluster-autoscaler scale-down during rollouts.
    pub autoscaler_annotations: bool,
    /// There is a target cluster (`--target-kubeconfig` is not `none`); without one an
    /// in-place update is refused.
    pub target_cluster: bool,
    /// The invalid-strategy message announced per deployment (uid) by this process: a
    /// reconcile that reads the deployment before its own status write reached the store
    /// does not announce it again.
    pub announced: crate::announce::Announced,
    /// Paces status writes that change only counters.
    pub status_pacer: crate::pacer::StatusPacer,
    /// The adaptation of the effective creation timeout (and the declared default).
    pub creation_timeouts: super::creation_timeout::TimeoutAdaptation,
    /// When a zone counts as partitioned (the `ZonePartition` condition).
    pub zone_partition: crate::machine::partition::PartitionRule,
    /// Where the controller takes time from.
    pub clock: crate::clock::SharedClock,
}
