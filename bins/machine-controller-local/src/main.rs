//! `machine-controller-local`: the machine controller with the local provider, whose VMs are
//! `local-node` processes on this machine.

use clap::Parser;
use mcm_core::MachineControllerOptions;
use mcm_provider_local::{LocalDriver, LocalDriverConfig};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = MachineControllerOptions::parse();
    let driver = match LocalDriverConfig::from_env() {
        Ok(config) => LocalDriver::new(config),
        Err(e) => {
            eprintln!("machine-controller-local: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match mcm_core::run_machine_controller(options, driver).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "machine-controller-local: {}",
                mcm_core::run::error_chain(&e)
            );
            std::process::ExitCode::FAILURE
        }
    }
}
