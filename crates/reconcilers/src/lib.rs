//! The controllers of mcm-rs.
//!
//! Machine-controller side (one binary per provider): [`machine`] (lifecycle of each
//! Machine: create, health, delete), machine classes and their secrets, nodes, and safety
//! (orphan VMs, API-server freeze). Manager side (provider independent): [`machineset`] and
//! [`machinedeployment`] with Kubernetes Deployment semantics, and the overshooting guard.
//!
//! Every controller is a `kube_runtime::Controller` over shared reflector stores; the
//! decisions are pure functions (`decide` modules) and the effects are small async actions.
#![warn(missing_docs)]

pub mod events;
pub mod machine;
pub mod machine_controller;
pub mod machineclass;
pub mod machinedeployment;
pub mod machineset;
pub mod manager;
pub mod safety;
