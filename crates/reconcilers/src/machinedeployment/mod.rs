//! The MachineDeployment controller: Kubernetes Deployment semantics over MachineSets.
//!
//! Each reconcile ([`reconcile`](mod@reconcile)) runs three steps and never returns to one it
//! left: [`gather`] (reads only: [`observe`]: the deployment's sets and their machines as
//! facts, the Nodes, the clock) → [`plan`] (pure: composes [`decide`], the rollout
//! arithmetic, revisions and rollbacks, with [`trigger`], [`creation_timeout`], [`status`]
//! and [`inplace::decide`] into the reconcile's steps) → [`execute`] (writes only: [`act`],
//! one small async function per step, and [`inplace::act`]).
//! [`status`] computes the status and conditions, [`hash`] the template hash, [`sets`] what
//! the deployment writes into its sets and [`nodes`] the node taints/annotations applied
//! during a rollout. [`trigger`] plans the trigger-deletion annotation of the
//! cluster-autoscaler. [`inplace`] is an in-place update (strategy `InPlaceUpdate`): its
//! facts from the machines' Nodes, its steps and their writes. [`creation_timeout`] adapts
//! the deployment's effective creation timeout to its machines' joins (facts, pure rule).
//!
//! The modules, each depending only on those before it: [`hash`], [`model`] (plain data),
//! [`creation_timeout`], [`context`] (the controller's state and error), [`inplace::model`],
//! [`inplace::strategy`], [`inplace::decide`], [`inplace::patch`], [`trigger`], [`sets`],
//! [`decide`], [`status`], [`nodes`], [`observe`], [`inplace::observe`], [`gather`],
//! [`plan`], [`act`], [`inplace::act`], [`execute`] and [`reconcile`](mod@reconcile).

pub mod act;
pub mod context;
pub mod creation_timeout;
pub mod decide;
pub mod execute;
pub mod gather;
pub mod hash;
pub mod inplace;
pub mod model;
pub mod nodes;
pub mod observe;
pub mod plan;
pub mod reconcile;
pub mod sets;
pub mod status;
pub mod trigger;

#[cfg(test)]
mod scenarios;

pub use context::Context;
pub use observe::{deployment_for_machine, deployment_for_set, deployments_for_node};
pub use reconcile::{CONTROLLER, error_policy, reconcile};
