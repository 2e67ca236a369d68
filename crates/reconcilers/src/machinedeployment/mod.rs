//! The MachineDeployment controller: Kubernetes Deployment semantics over MachineSets.
//!
//! Each reconcile ([`controller`]) observes ([`observe`]: the deployment's sets and their
//! machines as facts), decides ([`decide`], pure: the rollout arithmetic, revisions and the
//! trigger-deletion annotation) and acts ([`act`], one small async function per action).
//! [`status`] computes the status and conditions, [`hash`] the template hash and [`nodes`]
//! the node taints/annotations applied during a rollout. [`inplace`] decides the steps of an
//! in-place update (strategy `InPlaceUpdate`) from the machines' Nodes, [`inplace_act`]
//! carries them out.

pub mod act;
pub mod controller;
pub mod decide;
pub mod hash;
pub mod inplace;
pub mod inplace_act;
pub mod nodes;
pub mod observe;
pub mod status;
