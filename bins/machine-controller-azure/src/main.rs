//! `machine-controller-azure`: the machine controller of mcm-rs with the Azure driver.
//!
//! Flags are Gardener MCM's (see `--help`). The ARM endpoint follows `MCM_AZURE_ARM_ENDPOINT`
//! and the Entra ID authority host `AZURE_AUTHORITY_HOST` when set (e.g. a fake ARM in tests),
//! else those of the class's cloud; `MCM_AZURE_CA_FILE` names a PEM file of CA certificates
//! the driver's HTTP client trusts besides the platform's roots (e.g. a fake ARM's). The
//! service principal, subscription and resource group come from each MachineClass and its
//! secret.

use clap::Parser;
use mcm_core::MachineControllerOptions;
use mcm_provider_azure::AzureDriver;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = MachineControllerOptions::parse();
    let driver = match AzureDriver::from_env() {
        Ok(driver) => driver,
        Err(e) => {
            eprintln!(
                "machine-controller-azure: {}",
                mcm_core::run::error_chain(&e)
            );
            return std::process::ExitCode::FAILURE;
        }
    };
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
