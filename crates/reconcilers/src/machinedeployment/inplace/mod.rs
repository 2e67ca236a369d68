//! The MachineDeployment controller's part of an in-place update (strategy `InPlaceUpdate`,
//! upstream's `rolloutInPlace`).
//!
//! Machines are not replaced: the nodes of the old sets' machines are labelled
//! `candidate-for-update`, some of them `selected-for-update` (by this controller within
//! `maxUnavailable` under [`Orchestration::Auto`], by a user under
//! [`Orchestration::Manual`]); the machine controller drains a selected node and the node
//! agent updates it. Once the node reports `update-result: successful` and its
//! `InPlaceUpdate` condition says `UpdateSuccessful`, its machine **moves** to the new set
//! (one patch of its controller reference and labels; same name, same VM), the old set is
//! scaled down and the new one up by the number moved, and the node is cleaned up
//! (labels removed, uncordoned, the old-set taint replaced by Gardener's
//! critical-components-not-ready taint). The old sets carry `scale-up-disabled`, so that
//! they never replace a machine that just left them.
//!
//! One reconcile runs the steps of upstream in order: label the old sets
//! ([`sets_to_disable_scale_up`]), mark candidates ([`nodes_to_mark_candidate`]),
//! [`sync_machine_sets`], [`reconcile_new_machine_set`] (the moves) and, unless that
//! scaled, [`reconcile_old_machine_sets`] (the selection). Each step decides from the state
//! the previous ones left ([`InPlaceSnapshot::scale`]); the deployment's
//! [`plan`](super::plan) composes them into the reconcile's steps.
//!
//! The modules: [`model`] (the facts of the sets, machines and Nodes, the plans),
//! [`strategy`] (the strategy's validation and limits), [`decide`] (the steps, pure) and
//! [`patch`] (the patches of machines and Nodes, pure) depend only on the deployment
//! controller's [`model`](super::model) and on those before them; [`observe`] (the facts from
//! the stores) and [`act`] (the writes) come after the deployment controller's
//! [`observe`](super::observe) and [`act`](super::act) they use.
//!
//! [`Orchestration::Auto`]: super::model::Orchestration::Auto
//! [`Orchestration::Manual`]: super::model::Orchestration::Manual

pub(crate) mod act;
pub(crate) mod decide;
pub(crate) mod model;
pub(crate) mod observe;
pub(crate) mod patch;
pub(crate) mod strategy;
