//! `machine-controller-local`: the machine controller with the local provider, whose VMs are
//! `local-node` processes on this machine.
//!
//! For chaos runs, `MCM_DRIVER_FAULTS` wraps the driver in [`mcm_core::driver::FaultInjecting`]
//! (syntax: [`mcm_core::driver::FaultSpec::parse_config`], e.g.
//! `all:rate=0.3,code=Unavailable,latency=0s..2s`), seeded by `MCM_DRIVER_FAULTS_SEED`
//! (default 0) so a run is reproducible.

use clap::Parser;
use mcm_core::MachineControllerOptions;
use mcm_core::driver::{FaultInjecting, FaultSpec, Operation};
use mcm_provider_local::{LocalDriver, LocalDriverConfig};

/// Environment variable holding a fault configuration.
const FAULTS_ENV: &str = "MCM_DRIVER_FAULTS";
/// Environment variable holding the seed of the injected faults.
const FAULTS_SEED_ENV: &str = "MCM_DRIVER_FAULTS_SEED";

/// A parsed fault configuration and its seed.
type Faults = (Vec<(Operation, FaultSpec)>, u64);

/// The faults to inject, from the environment (`None`: none).
fn faults() -> Result<Option<Faults>, String> {
    let Some(config) = std::env::var(FAULTS_ENV)
        .ok()
        .filter(|c| !c.trim().is_empty())
    else {
        return Ok(None);
    };
    let faults = FaultSpec::parse_config(&config).map_err(|e| format!("{FAULTS_ENV}: {e}"))?;
    let seed = match std::env::var(FAULTS_SEED_ENV) {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("{FAULTS_SEED_ENV}={s:?} is not a number"))?,
        Err(_) => 0,
    };
    eprintln!(
        "machine-controller-local: fault injection enabled ({FAULTS_ENV}={config:?}, seed {seed}): driver calls fail and slow down on purpose"
    );
    Ok(Some((faults, seed)))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = MachineControllerOptions::parse();
    let setup = LocalDriverConfig::from_env()
        .map_err(|e| e.to_string())
        .and_then(|config| Ok((LocalDriver::new(config), faults()?)));
    let result = match setup {
        Err(e) => {
            eprintln!("machine-controller-local: {e}");
            return std::process::ExitCode::FAILURE;
        }
        Ok((local, None)) => mcm_core::run_machine_controller(options, local).await,
        Ok((local, Some((faults, seed)))) => {
            let driver = FaultInjecting::with_config(local, seed, &faults);
            mcm_core::run_machine_controller(options, driver).await
        }
    };
    match result {
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
