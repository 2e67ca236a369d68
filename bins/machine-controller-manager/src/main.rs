//! `machine-controller-manager`: the MachineSet and MachineDeployment controllers of mcm-rs,
//! with the flags of Gardener's machine-controller-manager.

use clap::Parser;
use mcm_core::ManagerOptions;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = ManagerOptions::parse();
    match mcm_core::run_manager(options).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "machine-controller-manager: {}",
                mcm_core::run::error_chain(&e)
            );
            std::process::ExitCode::FAILURE
        }
    }
}
