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

pub(crate) mod act;
pub(crate) mod context;
pub(crate) mod creation_timeout;
pub(crate) mod decide;
pub(crate) mod execute;
pub(crate) mod gather;
pub(crate) mod hash;
pub(crate) mod inplace;
pub(crate) mod model;
pub(crate) mod nodes;
pub(crate) mod observe;
pub(crate) mod plan;
pub(crate) mod reconcile;
pub(crate) mod sets;
pub(crate) mod status;
pub(crate) mod trigger;

#[cfg(test)]
mod scenarios;

pub(crate) use context::Context;
pub(crate) use observe::{deployment_for_machine, deployment_for_set, deployments_for_node};
pub(crate) use reconcile::{CONTROLLER, error_policy, reconcile};
