//! The controllers of mcm-rs, behind a small facade.
//!
//! - [`machine_controller`]: the machine-controller side (one binary per provider): the
//!   lifecycle of each Machine, its VM and its Node, the MachineClasses and the Secrets they
//!   reference, orphan VMs and the API-server freeze.
//! - [`manager`]: the provider-independent side: MachineSets and MachineDeployments with
//!   Kubernetes Deployment semantics, the overshooting guard and the MachineDisruptionBudgets.
//! - [`informers`]: the process's shared stores (one watch per kind, whichever halves run).
//! - [`clock`]: where the controllers take time from (a [`clock::ManualClock`] steps it in
//!   tests).
//! - [`settings`]: what the command line configures; [`ReconcileMetrics`] and
//!   [`MachineMetrics`] what the controllers record.
//! - [`class_problems`], [`bootstrap_token`] and [`in_place`]: the few rules other crates
//!   apply as the controllers do (the admission webhook, tests and node agents).
//!
//! Inside, every controller is a `kube_runtime::Controller` over the shared stores, with the
//! same modules: `model` (plain data), `context` (its state and error), `decide`/`plan`
//! (pure), `observe`/`gather` (reads into plain data), `act`/`execute` (API writes and
//! Events) and `reconcile` (the glue); dependencies go one way, and the controllers depend
//! on each other only downwards (MachineDeployment on MachineSet on MachineDisruptionBudget).
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub(crate) mod announce;
pub mod clock;
pub(crate) mod decode;
pub(crate) mod disruptionbudget;
pub(crate) mod events;
pub mod informers;
pub(crate) mod kube_api;
pub(crate) mod machine;
pub mod machine_controller;
pub(crate) mod machineclass;
pub(crate) mod machinedeployment;
pub(crate) mod machineset;
pub mod manager;
pub(crate) mod metrics;
pub(crate) mod pacer;
pub(crate) mod runtime;
pub(crate) mod safety;
pub(crate) mod selector;

pub use machine::MachineMetrics;
pub use machineclass::class_problems;
pub use metrics::ReconcileMetrics;

/// What the command line configures: the machine controller's
/// [`Settings`](settings::Settings), the [`Defaults`](settings::Defaults) a MachineClass may
/// override, and the [`SafetySettings`](settings::SafetySettings) of the orphan collector and
/// the API-server freeze, and the [`PartitionRule`](settings::PartitionRule) of zone
/// partitions.
pub mod settings {
    pub use crate::machine::Settings;
    pub use crate::machine::observe::{Defaults, split_list};
    pub use crate::machine::partition::PartitionRule;
    pub use crate::safety::SafetySettings;
}

pub use machine::token as bootstrap_token;

/// The machine controller's half of an in-place update, as a pure function: the step it
/// takes for a machine and its Node ([`next`](in_place::next)). For node agents and test
/// doubles of the machine controller that play the protocol with a MachineDeployment.
pub mod in_place {
    pub use crate::machine::inplace::{Facts, InPlaceStep, next};
    pub use crate::machine::observe::phase_since;
}

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
