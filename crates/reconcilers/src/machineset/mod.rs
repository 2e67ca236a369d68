//! The MachineSet controller: keeps `spec.replicas` machines of a template, claims and
//! releases machines by selector and controller reference, creates missing machines in
//! slow-start batches and deletes surplus and failed machines in MCM's priority order.
//!
//! [`decide`] holds the pure decisions, [`controller`] the reconciler; the overshooting guard
//! that freezes sets with far too many machines is [`crate::safety::overshoot`].

pub mod controller;
pub mod decide;
pub mod selector;
