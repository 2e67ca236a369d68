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
//! [`decide`] holds the pure decisions, [`controller`] the reconciler; the overshooting guard
//! that freezes sets with far too many machines is [`crate::safety::overshoot`].

pub mod controller;
pub mod decide;
