//! `machine-controller-aws`: the machine controller of mcm-rs with the AWS (EC2) driver.
//!
//! Flags are Gardener MCM's (see `--help`). The EC2 endpoint follows `AWS_ENDPOINT_URL_EC2` /
//! `AWS_ENDPOINT_URL` when set (e.g. moto in tests), else each class's regional endpoint;
//! credentials and region come from each MachineClass and its secret.

use clap::Parser;
use mcm_core::MachineControllerOptions;
use mcm_provider_aws::AwsDriver;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = MachineControllerOptions::parse();
    let driver = AwsDriver::from_env().await;
    match mcm_core::run_machine_controller(options, driver).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("machine-controller-aws: {}", mcm_core::run::error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
