//! The machine controller: the lifecycle of each Machine, its VM and its Node.
//!
//! Each reconcile ([`reconcile()`]) goes one way through three parts:
//! [`gather`] reads once what it decides from (the stores, "now" from the context's clock,
//! and the driver only where [`plan::probe`] says its answer can change the plan);
//! [`plan`] decides, purely, which decider acts (the deletion of the Node, [`preserve`],
//! [`inplace`], the lifecycle of [`decide::next_step`]) and with which step; [`execute`]
//! carries the plan out through [`act`] (one idempotent action per step).
//!
//! Around them: [`ctx`] is what a reconcile reads and uses, [`observe`] turns the Machine into
//! the lifecycle's facts, [`policy`] holds the pure rules around the decision (rollout
//! protection, replacement budget, backoff), [`health`], [`remediation`] and [`hooks`] the
//! additive health and disruption policies, [`nodetemplate`] and [`nodefinalizer`] what a
//! machine keeps on its Node.

pub(crate) mod act;
pub(crate) mod announcement;
pub(crate) mod ctx;
pub(crate) mod decide;
pub(crate) mod drainplan;
pub(crate) mod error;
pub(crate) mod execute;
pub(crate) mod fleet;
pub(crate) mod freeze;
pub(crate) mod gather;
pub(crate) mod health;
pub(crate) mod hooks;
pub(crate) mod inplace;
pub(crate) mod memory;
pub(crate) mod metrics;
pub(crate) mod model;
pub(crate) mod nodefinalizer;
pub(crate) mod nodetemplate;
pub(crate) mod observe;
pub(crate) mod outcome;
pub(crate) mod partition;
pub(crate) mod plan;
pub(crate) mod policy;
pub(crate) mod preserve;
pub(crate) mod reconcile;
pub(crate) mod remediation;
pub(crate) mod settings;
pub(crate) mod status;
pub mod token;

pub(crate) use ctx::Ctx;
pub(crate) use error::Error;
pub(crate) use freeze::Freeze;
pub use metrics::MachineMetrics;
pub(crate) use reconcile::{CONTROLLER, error_policy, reconcile};
pub use settings::Settings;

/// The finalizer Machines are held with: the Go MCM's name, so that after a swap either
/// implementation finishes the other's machines.
pub(crate) const FINALIZER: &str = mcm_api::constants::finalizers::MACHINE_CONTROLLER_MANAGER;
/// The name earlier mcm-rs releases held Machines and MachineClasses with: replaced by
/// [`FINALIZER`] on a live object, removed with it when the object is finished (the Go MCM
/// would never remove it).
pub(crate) const LEGACY_FINALIZERS: &[&str] = &[mcm_api::constants::finalizers::MACHINE_CONTROLLER];

/// How a Machine carries the machine controller's finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finalizer {
    /// [`FINALIZER`], and no legacy name.
    Held,
    /// A legacy name (with or without [`FINALIZER`]): ours, to be renamed while the machine
    /// lives.
    Legacy,
    /// Neither: not (or no longer) ours.
    Missing,
}

impl Finalizer {
    /// How `finalizers` carry ours. Pure.
    pub(crate) fn of(finalizers: &[String]) -> Self {
        if finalizers
            .iter()
            .any(|f| LEGACY_FINALIZERS.contains(&f.as_str()))
        {
            Finalizer::Legacy
        } else if finalizers.iter().any(|f| f == FINALIZER) {
            Finalizer::Held
        } else {
            Finalizer::Missing
        }
    }
}
