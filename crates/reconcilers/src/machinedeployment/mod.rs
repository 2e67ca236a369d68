//! The MachineDeployment controller: Kubernetes Deployment semantics over MachineSets.
//!
//! [`decide`] holds the rollout arithmetic (pure), [`status`] the status and conditions,
//! [`hash`] the template hash, [`nodes`] the node taints/annotations applied during a
//! rollout, and [`controller`] the reconciler that applies the decisions.

pub mod controller;
pub mod decide;
pub mod hash;
pub mod nodes;
pub mod status;
