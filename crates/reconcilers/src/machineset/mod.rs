//! The MachineSet controller: keeps `spec.replicas` machines of a template, claims and
//! releases machines by selector and controller reference, creates missing machines in
//! slow-start batches and deletes surplus and failed machines in MCM's priority order.
//!
//! Machine preservation (upstream's `node.machine.sapcloud.io/preserve`): a Failed machine
//! that is preserved, or whose preservation is starting, is kept and still counted (no
//! replacement); preserved machines go last on a scale-down; up to
//! `spec.autoPreserveFailedMachineMax` Failed machines are annotated `auto-preserved` before
//! the replicas are managed. The machine controller does the preserving itself.
//!
//! A reconcile ([`reconcile`](mod@reconcile)) runs three steps and never returns to one it
//! left: [`gather`] (reads only: the stores through [`observe`], the expectations, the
//! budget gate's view, the clock) → [`plan`] (pure: composes [`decide`] and [`budget`] into
//! a decision naming every write, Event and the requeue) → [`execute`] (writes only, through
//! [`act`]).
//!
//! The modules, each depending only on those before it: [`model`] (plain data),
//! [`expectations`] (the record of creations and deletions a set waits to see), [`context`]
//! (the controller's state and error), [`decide`] (pure decisions), [`observe`] (reads the
//! stores), [`budget`] (pure: voluntary deletions and the MachineDisruptionBudget gate's
//! verdicts), [`gather`], [`plan`], [`act`] (API writes and Events), [`execute`] and
//! [`reconcile`](mod@reconcile). The overshooting guard that freezes sets with far too many
//! machines is [`crate::safety::overshoot`].

pub(crate) mod act;
pub(crate) mod budget;
pub(crate) mod context;
pub(crate) mod decide;
pub(crate) mod execute;
pub(crate) mod expectations;
pub(crate) mod gather;
pub(crate) mod model;
pub(crate) mod observe;
pub(crate) mod plan;
pub(crate) mod reconcile;

pub(crate) use context::Context;
pub(crate) use expectations::Expectations;
pub(crate) use observe::{sets_for_budget, sets_for_machine};
pub(crate) use reconcile::{CONTROLLER, error_policy, reconcile};
