//! `machine-controller-gcp`: the machine controller of mcm-rs with the GCP (Compute Engine)
//! driver.
//!
//! Flags are Gardener MCM's (see `--help`). The Compute endpoint follows
//! `MCM_GCP_COMPUTE_ENDPOINT` when set (e.g. a fake Compute server in tests), else Google's;
//! credentials, project and zone come from each MachineClass and its secret.

use clap::Parser;
use mcm_core::MachineControllerOptions;
use mcm_provider_gcp::GcpDriver;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = MachineControllerOptions::parse();
    let driver = GcpDriver::from_env();
    match mcm_core::run_machine_controller(options, driver).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("machine-controller-gcp: {}", mcm_core::run::error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
