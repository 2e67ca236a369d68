//! The MachineSet controller: keeps `spec.replicas` machines of a template, claims and
//! releases machines by selector and controller reference, creates missing machines in
//! slow-start batches and deletes surplus and failed machines in MCM's priority order.
//!
//! [`decide`] holds the pure decisions, [`controller`] the reconciler, [`safety`] the
//! overshooting guard that freezes sets (and their deployments) with far too many machines.

pub mod controller;
pub mod decide;
pub mod safety;
pub mod selector;
