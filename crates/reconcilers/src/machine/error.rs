//! The errors of a machine reconcile.

use mcm_driver::DriverError;

use super::decide::ClassProblem;

/// Errors of a machine reconcile. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A Kubernetes API call failed.
    #[error("failed to {action}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A driver call failed.
    #[error("driver call {op} failed")]
    Driver {
        /// The driver operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: DriverError,
    },
    /// A drain pass failed.
    #[error("drain pass failed")]
    Drain(#[source] mcm_drain::DrainError),
    /// The class or its secrets cannot be used.
    #[error("{0}")]
    Class(ClassProblem),
    /// Something that should not happen did.
    #[error("internal error: {0}")]
    Invariant(String),
}

impl Error {
    pub(crate) fn kube(action: &'static str, source: kube::Error) -> Self {
        Error::Kube { action, source }
    }

    pub(crate) fn driver(op: &'static str, source: DriverError) -> Self {
        Error::Driver { op, source }
    }
}
