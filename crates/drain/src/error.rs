//! The errors of a drain. Every message is meant for a human: it ends up in
//! `Machine.status.lastOperation.description`.

use std::fmt;
use std::time::Duration;

use mcm_driver::DriverError;

use crate::outcome::{Phase, human_duration};

/// Why a drain did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The drain timeout ran out while pods were still on the node.
    #[error(
        "drain of node {node} timed out after {} while {phase}; {} pod(s) still on the node: {}",
        human_duration(*elapsed),
        remaining_pods.len(),
        list(remaining_pods)
    )]
    Timeout {
        /// The node being drained.
        node: String,
        /// The phase that was running out of time.
        phase: Phase,
        /// How long the drain had been running.
        elapsed: Duration,
        /// The pods (`namespace/name`) that had not disappeared yet.
        remaining_pods: Vec<String>,
    },

    /// The drain timeout ran out while a PodDisruptionBudget kept refusing the eviction of a pod.
    /// The pod was deleted instead, but had no time left to disappear.
    #[error(
        "drain of node {node} timed out: eviction of pod {pod} was blocked by \
         PodDisruptionBudget {} for {}; the pod was deleted instead{}",
        pdb.as_deref().unwrap_or("(unknown: the API server answered 429 but no budget selects the pod)"),
        human_duration(*since),
        others_suffix(*other_blocked_pods)
    )]
    BlockedByPdb {
        /// The node being drained.
        node: String,
        /// `namespace/name` of the blocking budget, when one selecting the pod was found.
        pdb: Option<String>,
        /// `namespace/name` of the pod whose eviction was refused.
        pod: String,
        /// How long the budget refused the eviction.
        since: Duration,
        /// How many other pods were blocked by budgets at the same time.
        other_blocked_pods: usize,
    },

    /// A PodDisruptionBudget can never allow the eviction (MCM's "misconfigured PDB" rule, or a
    /// pod selected by more than one budget, which the eviction API refuses).
    #[error(
        "cannot evict pod {pod} from node {node}: PodDisruptionBudget {pdb} is misconfigured: {reason}"
    )]
    MisconfiguredPdb {
        /// The node being drained.
        node: String,
        /// `namespace/name` of the budget (or budgets, comma separated).
        pdb: String,
        /// `namespace/name` of the pod.
        pod: String,
        /// What is wrong with the budget.
        reason: MisconfiguredReason,
    },

    /// Volumes of evicted pods stayed attached to the node longer than the PV detach timeout.
    #[error(
        "volume(s) still attached to node {node} after waiting {}: {}",
        human_duration(*waited),
        list(volumes)
    )]
    VolumeDetachTimeout {
        /// The node being drained.
        node: String,
        /// The volumes, as `volume-id (PersistentVolume pv-name)`.
        volumes: Vec<String>,
        /// How long the drain waited.
        waited: Duration,
    },

    /// A cache the drain needs did not become ready in time.
    #[error("the {what} cache did not become ready within the drain timeout")]
    CacheNotReady {
        /// Which cache (e.g. "VolumeAttachment").
        what: &'static str,
    },

    /// A Kubernetes API call failed.
    #[error("failed to {action}")]
    Kube {
        /// What the drain was doing, e.g. "evict pod ns/name".
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },

    /// The driver failed to map PersistentVolumes to volume ids.
    #[error("failed to get the volume ids of the pods' PersistentVolumes from the driver")]
    Driver(#[source] DriverError),
}

impl DrainError {
    /// Wraps a client error with what the drain was doing.
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        DrainError::Kube {
            action: action.into(),
            source,
        }
    }

    /// Whether the error is about the drain (or one of its waits) running out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            DrainError::Timeout { .. }
                | DrainError::BlockedByPdb { .. }
                | DrainError::VolumeDetachTimeout { .. }
        )
    }
}

/// Why a PodDisruptionBudget is considered misconfigured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MisconfiguredReason {
    /// All expected pods are healthy, none is being disrupted, yet the budget allows zero
    /// disruptions: no eviction will ever pass.
    ZeroDisruptionsAllowed {
        /// `status.expectedPods`.
        expected_pods: i32,
        /// `status.currentHealthy`.
        current_healthy: i32,
    },
    /// The pod is selected by more than one budget; the eviction API refuses such pods.
    MultipleBudgets,
}

impl fmt::Display for MisconfiguredReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MisconfiguredReason::ZeroDisruptionsAllowed {
                expected_pods,
                current_healthy,
            } => write!(
                f,
                "it allows zero voluntary disruptions although {current_healthy} of its \
                 {expected_pods} expected pod(s) are healthy, so no eviction can ever succeed"
            ),
            MisconfiguredReason::MultipleBudgets => write!(
                f,
                "the pod is selected by more than one PodDisruptionBudget, which the eviction \
                 API does not support"
            ),
        }
    }
}

const LISTED: usize = 10;

fn list(items: &[String]) -> String {
    if items.len() <= LISTED {
        items.join(", ")
    } else {
        format!(
            "{} and {} more",
            items[..LISTED].join(", "),
            items.len() - LISTED
        )
    }
}

fn others_suffix(n: usize) -> String {
    match n {
        0 => String::new(),
        1 => " (1 other pod was blocked by a budget too)".into(),
        n => format!(" ({n} other pods were blocked by budgets too)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_readable() {
        let e = DrainError::Timeout {
            node: "n1".into(),
            phase: Phase::WaitForDeletion,
            elapsed: Duration::from_secs(65),
            remaining_pods: vec!["ns/a".into(), "ns/b".into()],
        };
        assert_eq!(
            e.to_string(),
            "drain of node n1 timed out after 1m5s while waiting for pods to disappear; \
             2 pod(s) still on the node: ns/a, ns/b"
        );
        let e = DrainError::MisconfiguredPdb {
            node: "n1".into(),
            pdb: "ns/budget".into(),
            pod: "ns/a".into(),
            reason: MisconfiguredReason::ZeroDisruptionsAllowed {
                expected_pods: 2,
                current_healthy: 2,
            },
        };
        assert!(
            e.to_string()
                .contains("PodDisruptionBudget ns/budget is misconfigured")
        );
        let e = DrainError::BlockedByPdb {
            node: "n1".into(),
            pdb: Some("ns/budget".into()),
            pod: "ns/a".into(),
            since: Duration::from_millis(2500),
            other_blocked_pods: 0,
        };
        assert_eq!(
            e.to_string(),
            "drain of node n1 timed out: eviction of pod ns/a was blocked by \
             PodDisruptionBudget ns/budget for 2.5s; the pod was deleted instead"
        );
    }

    #[test]
    fn long_lists_are_shortened() {
        let items: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
        assert!(list(&items).ends_with("p9 and 2 more"));
    }
}
