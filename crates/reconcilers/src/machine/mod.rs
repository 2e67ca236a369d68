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

pub mod act;
pub mod announcement;
pub mod ctx;
pub mod decide;
pub mod drainplan;
pub mod error;
pub mod execute;
pub mod fleet;
pub mod freeze;
pub mod gather;
pub mod health;
pub mod hooks;
pub mod inplace;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod nodefinalizer;
pub mod nodetemplate;
pub mod observe;
pub mod outcome;
pub mod partition;
pub mod plan;
pub mod policy;
pub mod preserve;
pub mod reconcile;
pub mod remediation;
pub mod settings;
pub mod status;
pub mod token;

pub use ctx::Ctx;
pub use error::Error;
pub use freeze::Freeze;
pub use metrics::MachineMetrics;
pub use reconcile::{CONTROLLER, error_policy, reconcile};
pub use settings::Settings;

/// The finalizer Machines are held with: the Go MCM's name, so that after a swap either
/// implementation finishes the other's machines.
pub const FINALIZER: &str = mcm_api::constants::finalizers::MACHINE_CONTROLLER_MANAGER;
/// The name earlier mcm-rs releases held Machines and MachineClasses with: replaced by
/// [`FINALIZER`] on a live object, removed with it when the object is finished (the Go MCM
/// would never remove it).
pub const LEGACY_FINALIZERS: &[&str] = &[mcm_api::constants::finalizers::MACHINE_CONTROLLER];

/// How a Machine carries the machine controller's finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalizer {
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
    pub fn of(finalizers: &[String]) -> Self {
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
