//! `machine.sapcloud.io/v1alpha1`: the API of the machine-controller-manager, in Rust.
//!
//! This crate holds the four custom resources of Gardener's machine-controller-manager
//! (`Machine`, `MachineClass`, `MachineSet`, `MachineDeployment`) with the exact JSON field
//! names of the Go API, the well-known labels, annotations, finalizers and taints
//! ([`constants`]), small pure helpers ([`intstr`], [`duration`], [`quantity`]) and the
//! generation of the CustomResourceDefinitions ([`crds`]). It performs no I/O.
//!
//! It also holds the policy kinds mcm-rs adds in its own group `policy.mcm-rs.io`:
//! [`MachineDisruptionBudget`] ([`disruption_budget`], with the cron schedules of its windows
//! in [`cron`]).
//!
//! Wire compatibility rules followed throughout:
//! - every field has the JSON name of the Go field;
//! - fields that Go marks `omitempty` are `Option`s that are skipped when `None`, so a
//!   deserialize/serialize round trip neither loses nor adds keys;
//! - string "enums" keep unknown values (see [`enums`]) instead of failing the whole object;
//! - `metav1.Duration` fields use [`GoDuration`], serialized in Go's duration syntax.

#![warn(missing_docs)]

pub mod canonical;
pub mod constants;
pub mod crds;
pub mod cron;
pub mod disruption_budget;
pub mod duration;
pub mod enums;
pub mod intstr;
pub mod machine;
pub mod machine_class;
pub mod machine_deployment;
pub mod machine_set;
pub mod owner;
pub mod policy;
pub mod preservation;
pub mod quantity;
mod resource;
mod schema;
pub mod shared;
pub mod syntax;

pub use disruption_budget::{
    DisruptionWindow, MachineDisruptionBudget, MachineDisruptionBudgetList,
    MachineDisruptionBudgetSpec, MachineDisruptionBudgetStatus,
};
pub use duration::{DurationError, GoDuration};
pub use enums::{
    ConditionStatus, DisruptionReason, MachineDeploymentConditionType,
    MachineDeploymentStrategyType, MachineOperationType, MachinePhase, MachineSetConditionType,
    MachineState, OrchestrationType,
};
pub use machine::{
    CurrentStatus, Machine, MachineList, MachineSpec, MachineStatus, NodeTemplateSpec,
};
pub use machine_class::{MachineClass, MachineClassList, NodeTemplate};
pub use machine_deployment::{
    InPlaceUpdateMachineDeployment, MachineDeployment, MachineDeploymentCondition,
    MachineDeploymentList, MachineDeploymentSpec, MachineDeploymentStatus,
    MachineDeploymentStrategy, RollbackConfig, RollingUpdateMachineDeployment, UpdateConfiguration,
};
pub use machine_set::{
    MachineSet, MachineSetCondition, MachineSetList, MachineSetSpec, MachineSetStatus,
};
pub use shared::{
    ClassSpec, LastOperation, MachineConfiguration, MachineSummary, MachineTemplateSpec,
};

/// The API group of all resources of this crate.
pub const GROUP: &str = "machine.sapcloud.io";
/// The (only) version of the API group.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every object of this crate: `machine.sapcloud.io/v1alpha1`.
pub const API_VERSION: &str = "machine.sapcloud.io/v1alpha1";
