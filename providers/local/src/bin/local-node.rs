//! `local-node`: a local VM of mcm-rs (a hollow kubelet). See
//! `mcm_provider_local::agent` for the arguments and the behaviour.

use std::process::ExitCode;

use clap::Parser;
use mcm_provider_local::agent::{self, AgentConfig};

fn main() -> ExitCode {
    let config = AgentConfig::parse();
    agent::init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "failed to start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %agent::error_chain(&e), "local-node failed");
            ExitCode::FAILURE
        }
    }
}
