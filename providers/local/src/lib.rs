//! The local provider of mcm-rs: a "cloud" whose VMs are real OS processes.
//!
//! - [`LocalDriver`] implements [`mcm_driver::Driver`]: `create_machine` starts a
//!   `local-node` process (detached in its own session) and records it in the state
//!   directory; `delete_machine` stops it; `get_machine_status` / `list_machines` read the
//!   records and `/proc` (a VM whose process died is reported `Stopped`, not absent).
//! - `local-node` ([`agent`]) is the VM: a hollow kubelet that registers its Node with the
//!   target cluster, heartbeats its Lease and Ready condition, runs the Pods bound to it
//!   (Running/Ready, deleted after their grace period), and reports attached volumes.
//! - [`spec`] is the providerSpec (capacity, labels, taints, boot delay, boot failure,
//!   crash injection, heartbeat interval, state directory, node kind), [`state`] the on-disk
//!   records.
//! - [`kwok`] is the second kind of VM, for scale: no process, a Node the kwok controller
//!   keeps Ready (`providerSpec.node: kwok`).
//!
//! The secret of a local MachineClass holds `kubeconfig` (the target cluster's kubeconfig,
//! required) and `userData` (optional; a `bootstrapToken: <id>.<secret>` line in it is
//! checked at boot, see [`agent::bootstrap`]).
#![warn(missing_docs)]

pub mod agent;
pub mod driver;
pub mod kwok;
pub mod spec;
pub mod state;

pub use driver::{
    KUBECONFIG_KEY, LocalDriver, LocalDriverConfig, LocalError, NODE_BINARY_ENV,
    parse_provider_spec, volume_id,
};
pub use spec::{Capacity, NodeKind, ProviderSpec, SpecError, SpecProblem};
pub use state::{Liveness, StateDirectory, VmRecord};
