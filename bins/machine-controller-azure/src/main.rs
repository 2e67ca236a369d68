//! `machine-controller-azure`: the machine controller of mcm-rs with the Azure driver.
//!
//! Flags are Gardener MCM's (see `--help`). The ARM endpoint follows `MCM_AZURE_ARM_ENDPOINT`
//! and the Entra ID authority host `AZURE_AUTHORITY_HOST` when set (e.g. a fake ARM in tests),
//! else public Azure's; the service principal, subscription and resource group come from each
//! MachineClass and its secret.

use clap::Parser;
use mcm_core::MachineControllerOptions;
use mcm_provider_azure::AzureDriver;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = MachineControllerOptions::parse();
    let driver = AzureDriver::from_env();
    match mcm_core::run_machine_controller(options, driver).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "machine-controller-azure: {}",
                mcm_core::run::error_chain(&e)
            );
            std::process::ExitCode::FAILURE
        }
    }
}
