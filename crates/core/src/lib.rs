//! The crate provider teams build on.
//!
//! A provider implements [`driver::Driver`] and ships a binary whose `main` is:
//!
//! ```no_run
//! # struct MyDriver;
//! # #[async_trait::async_trait]
//! # impl mcm_core::driver::Driver for MyDriver {
//! #   async fn create_machine(&self, _: mcm_core::driver::CreateMachineRequest) -> Result<mcm_core::driver::CreateMachineResponse, mcm_core::driver::DriverError> { Err(mcm_core::driver::DriverError::unimplemented("")) }
//! #   async fn delete_machine(&self, _: mcm_core::driver::DeleteMachineRequest) -> Result<mcm_core::driver::DeleteMachineResponse, mcm_core::driver::DriverError> { Err(mcm_core::driver::DriverError::unimplemented("")) }
//! #   async fn get_machine_status(&self, _: mcm_core::driver::GetMachineStatusRequest) -> Result<mcm_core::driver::GetMachineStatusResponse, mcm_core::driver::DriverError> { Err(mcm_core::driver::DriverError::unimplemented("")) }
//! #   async fn list_machines(&self, _: mcm_core::driver::ListMachinesRequest) -> Result<mcm_core::driver::ListMachinesResponse, mcm_core::driver::DriverError> { Err(mcm_core::driver::DriverError::unimplemented("")) }
//! #   async fn get_volume_ids(&self, _: mcm_core::driver::GetVolumeIdsRequest) -> Result<mcm_core::driver::GetVolumeIdsResponse, mcm_core::driver::DriverError> { Err(mcm_core::driver::DriverError::unimplemented("")) }
//! # }
//! use clap::Parser;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), mcm_core::RunError> {
//!     let options = mcm_core::MachineControllerOptions::parse();
//!     mcm_core::run_machine_controller(options, MyDriver).await
//! }
//! ```
//!
//! It re-exports the API types ([`api`]) and the driver SPI ([`driver`]), and provides the
//! options with Gardener MCM's flag names ([`options`]), clients with `--kube-api-qps`
//! ([`clients`]), the HTTP endpoints ([`http`]) and the process lifecycle ([`run`]).
#![warn(missing_docs)]

pub mod clients;
pub mod http;
pub mod options;
pub mod run;
pub mod webhook;

/// Re-exported so that a provider depends on `mcm-core` alone: the attribute of
/// [`driver::Driver`] implementations, the runtime, the flag parser and the Kubernetes
/// client and types, in the versions mcm-core is built with.
pub use async_trait::async_trait;
pub use clap;
pub use k8s_openapi;
pub use kube;
pub use mcm_api as api;
pub use mcm_driver as driver;
pub use options::{
    CommonOptions, MachineControllerOptions, ManagerFlags, ManagerOptions, WebhookFlags,
};
pub use run::{
    RunError, run_machine_controller, run_machine_controller_until, run_manager, run_manager_until,
};
pub use tokio;
