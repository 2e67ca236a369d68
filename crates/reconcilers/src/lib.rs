//! The controllers of mcm-rs.
//!
//! Machine-controller side (one binary per provider, [`machine_controller`]): [`machine`]
//! (lifecycle of each Machine: create, health, delete), [`machineclass`] (class finalizers,
//! validation, the Secrets classes reference), [`safety`] (orphan VMs, API-server freeze).
//! Manager side (provider independent, [`manager`]): [`machineset`] and
//! [`machinedeployment`] with Kubernetes Deployment semantics, and the overshooting guard
//! ([`safety::overshoot`]), and the MachineDisruptionBudget controller and gate
//! ([`disruptionbudget`]); [`selector`] is their label selector matching.
//!
//! Every controller is a `kube_runtime::Controller` over the process's shared stores
//! ([`informers`]: one watch per kind, whichever halves run in the process); the decisions
//! are pure functions (`decide` modules) and the effects are small async actions. The
//! manager-side controllers ([`machineset`], [`machinedeployment`], [`disruptionbudget`]) have
//! the same modules: `model` (plain data), `context` (the controller's state and error),
//! `decide` (pure), `observe` (store reads into plain data), `act` (API writes and Events)
//! and `reconcile` (the glue), plus topic modules; dependencies go one way, and the
//! controllers depend on each other only downwards (MachineDeployment on MachineSet on
//! MachineDisruptionBudget).
//! [`metrics`] records every reconcile, [`events`] publishes Kubernetes Events.
#![warn(missing_docs)]

pub mod announce;
pub mod clock;
pub mod disruptionbudget;
pub mod events;
pub mod informers;
pub mod kube_api;
pub mod machine;
pub mod machine_controller;
pub mod machineclass;
pub mod machinedeployment;
pub mod machineset;
pub mod manager;
pub mod metrics;
pub mod pacer;
pub mod runtime;
pub mod safety;
pub mod selector;

/// An error and its chain of causes on one line (`a: b: c`), for logs and messages on exit.
///
/// Our errors never print their source in their own message. kube's errors do (their
/// message embeds their cause), so the chain ends at the first of those.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut current = e;
    while !embeds_its_source(current) {
        let Some(cause) = current.source() else { break };
        out.push_str(": ");
        out.push_str(&cause.to_string());
        current = cause;
    }
    out
}

/// Error types of kube whose message already contains their cause.
fn embeds_its_source(e: &(dyn std::error::Error + 'static)) -> bool {
    e.is::<kube::Error>()
        || e.is::<kube::config::KubeconfigError>()
        || e.is::<kube::config::InClusterError>()
        || e.is::<kube::config::InferConfigError>()
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("failed to patch")]
    struct Outer(#[source] kube::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("reconcile failed")]
    struct Top(#[source] Outer);

    #[test]
    fn the_chain_names_each_cause_once() {
        let api = kube::Error::Api(
            kube::core::Status::failure("machines \"m\" not found", "NotFound")
                .with_code(404)
                .boxed(),
        );
        let text = super::error_chain(&Top(Outer(api)));
        assert!(
            text.starts_with("reconcile failed: failed to patch: "),
            "{text}"
        );
        // The kube error is printed once (its message embeds its cause).
        assert_eq!(text.matches("ApiError").count(), 1, "{text}");
    }
}
