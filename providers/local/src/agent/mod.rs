//! `local-node`: the agent process that is a local VM, acting as a hollow kubelet.
//!
//! # Contract with the driver
//!
//! The driver starts `local-node` in a new session (`setsid`), with its working directory
//! `<stateDirectory>/vms/<machine>/` as current directory, stdin from `/dev/null` and
//! stdout/stderr appended to `agent.log` there, and these arguments (each may also come
//! from the environment variable in brackets):
//!
//! | argument | meaning |
//! |---|---|
//! | `--machine-name` (`LOCAL_NODE_MACHINE_NAME`) | the Machine; also the Node name by default |
//! | `--node-name` (`LOCAL_NODE_NODE_NAME`) | the Node name (optional) |
//! | `--provider-id` (`LOCAL_NODE_PROVIDER_ID`) | `spec.providerID` (default `local:///<machine>`) |
//! | `--kubeconfig` (`LOCAL_NODE_KUBECONFIG`) | kubeconfig file of the target cluster |
//! | `--user-data` (`LOCAL_NODE_USER_DATA`) | user-data file (optional; see [`bootstrap`]) |
//! | `--spec` (`LOCAL_NODE_SPEC`) | the providerSpec as JSON (optional; default: all defaults) |
//! | `--request-id` (`MCM_REQUEST_ID`) | the driver request that created the VM, for logs |
//!
//! # Life of the process
//!
//! 1. `failToBoot`: log and exit 1. `crashAfter`: arm a timer that exits 137 abruptly.
//! 2. `bootDelay`: wait.
//! 3. Bootstrap token in the user data: authenticate with it (exit 1 when still rejected
//!    after [`bootstrap::REJECTION_GRACE`]).
//! 4. Register the Node, then heartbeat (Lease + Ready) and serve Pods until SIGTERM or
//!    SIGINT, on which it exits 0 without touching the Node (deleting it is the
//!    controller's job).

pub mod bootstrap;
pub mod inplace;
pub mod node;
pub mod pods;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use jiff::Timestamp;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use crate::spec::{ProviderSpec, SpecError};

/// Exit status of a simulated crash (`crashAfter`), like a process killed by SIGKILL.
pub const CRASH_EXIT_CODE: i32 = 137;
/// How long the agent keeps trying to reach the API server at boot before it gives up.
pub const BOOT_API_TIMEOUT: Duration = Duration::from_secs(60);

/// The configuration of `local-node` (see the module documentation).
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "local-node", about = "A local VM of mcm-rs: a hollow kubelet")]
pub struct AgentConfig {
    /// The Machine this VM belongs to.
    #[arg(long, env = "LOCAL_NODE_MACHINE_NAME")]
    pub machine_name: String,
    /// The Node name (default: the machine name).
    #[arg(long, env = "LOCAL_NODE_NODE_NAME")]
    pub node_name: Option<String>,
    /// The providerID (default: `local:///<machine-name>`).
    #[arg(long, env = "LOCAL_NODE_PROVIDER_ID")]
    pub provider_id: Option<String>,
    /// Kubeconfig file of the target cluster.
    #[arg(long, env = "LOCAL_NODE_KUBECONFIG")]
    pub kubeconfig: PathBuf,
    /// User-data file.
    #[arg(long, env = "LOCAL_NODE_USER_DATA")]
    pub user_data: Option<PathBuf>,
    /// The providerSpec (JSON file).
    #[arg(long, env = "LOCAL_NODE_SPEC")]
    pub spec: Option<PathBuf>,
    /// The request id of the driver call that started this VM.
    #[arg(long, env = "MCM_REQUEST_ID")]
    pub request_id: Option<String>,
}

impl AgentConfig {
    /// The Node identity.
    pub fn identity(&self) -> node::NodeIdentity {
        node::NodeIdentity {
            node_name: self
                .node_name
                .clone()
                .unwrap_or_else(|| self.machine_name.clone()),
            provider_id: self
                .provider_id
                .clone()
                .unwrap_or_else(|| crate::state::provider_id(&self.machine_name)),
        }
    }
}

/// Why the agent stopped with an error (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A file could not be read.
    #[error("failed to read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The spec file is not JSON.
    #[error("the spec file {} is not JSON", path.display())]
    SpecJson {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// `failToBoot` is set.
    #[error("failToBoot is set in the providerSpec: this VM fails to boot")]
    FailToBoot,
    /// The user data is unusable.
    #[error(transparent)]
    UserData(#[from] bootstrap::UserDataError),
    /// The bootstrap token was rejected or could not be checked.
    #[error("bootstrap failed")]
    Bootstrap(#[source] bootstrap::TokenCheckError),
    /// The kubeconfig is unusable.
    #[error("the kubeconfig of the target cluster is unusable")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// A Kubernetes API call failed for good.
    #[error("failed to {action}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Signal handlers could not be installed.
    #[error("failed to install signal handlers")]
    Signals(#[source] std::io::Error),
}

/// Sets up logging to stderr (the driver sends it to `agent.log`); `RUST_LOG` overrides the
/// default level `info`.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Reads and validates the providerSpec file (absent: defaults).
pub fn load_spec(config: &AgentConfig) -> Result<ProviderSpec, AgentError> {
    let Some(path) = &config.spec else {
        return Ok(ProviderSpec::default());
    };
    let bytes = std::fs::read(path).map_err(|source| AgentError::Read {
        path: path.clone(),
        source,
    })?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| AgentError::SpecJson {
            path: path.clone(),
            source,
        })?;
    Ok(ProviderSpec::from_value(&value)?)
}

/// Runs the agent until SIGTERM/SIGINT (`Ok`) or a boot failure (`Err`). A `crashAfter`
/// ends the process from inside with [`CRASH_EXIT_CODE`].
pub async fn run(config: AgentConfig) -> Result<(), AgentError> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;
    let id = config.identity();
    info!(
        machine = %config.machine_name,
        node = %id.node_name,
        provider_id = %id.provider_id,
        request_id = config.request_id.as_deref().unwrap_or("-"),
        pid = std::process::id(),
        "local-node starting"
    );
    let spec = load_spec(&config)?;
    if spec.fail_to_boot {
        error!("failToBoot is set: exiting before registering the Node");
        return Err(AgentError::FailToBoot);
    }
    if let Some(after) = spec.crash_after() {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            error!(
                ?after,
                "crashAfter elapsed: crashing now (exit {CRASH_EXIT_CODE}, no clean-up)"
            );
            std::process::exit(CRASH_EXIT_CODE);
        });
    }
    tokio::select! {
        result = boot_and_serve(&config, id, spec) => result,
        _ = sigterm.recv() => {
            info!("SIGTERM: stopping; the Node is left for the controller");
            Ok(())
        }
        _ = sigint.recv() => {
            info!("SIGINT: stopping; the Node is left for the controller");
            Ok(())
        }
    }
}

async fn boot_and_serve(
    config: &AgentConfig,
    id: node::NodeIdentity,
    spec: ProviderSpec,
) -> Result<(), AgentError> {
    let delay = spec.boot_delay();
    if !delay.is_zero() {
        info!(?delay, "booting (bootDelay)");
        tokio::time::sleep(delay).await;
    }
    let user_data = match &config.user_data {
        Some(path) => std::fs::read(path).map_err(|source| AgentError::Read {
            path: path.clone(),
            source,
        })?,
        None => Vec::new(),
    };
    let token = bootstrap::token_from_user_data(&String::from_utf8_lossy(&user_data))?;

    let kubeconfig = Kubeconfig::read_from(&config.kubeconfig).map_err(AgentError::Kubeconfig)?;
    let kube_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(AgentError::Kubeconfig)?;

    if let Some(token) = token {
        let first_check = std::time::Instant::now();
        let user = retry(
            "check the bootstrap token",
            || bootstrap::check_token(&kube_config, &token),
            |e| bootstrap::worth_retrying(e, first_check.elapsed()),
        )
        .await
        .map_err(|e| {
            error!(token_id = %token.id, error = %e, "bootstrap token rejected: boot fails");
            AgentError::Bootstrap(e)
        })?;
        info!(token_id = %token.id, %user, "bootstrap token accepted");
    }

    let client = kube::Client::try_from(kube_config).map_err(|source| AgentError::Kube {
        action: "build a client from the kubeconfig",
        source,
    })?;
    let ready_since = Timestamp::now();
    let node = retry(
        "register the Node",
        || node::register(&client, &id, &spec, ready_since),
        |_| true,
    )
    .await
    .map_err(|source| AgentError::Kube {
        action: "register the Node",
        source,
    })?;
    info!(node = %id.node_name, "Node registered and Ready");
    tokio::join!(
        node::heartbeat_loop(client.clone(), node, spec.heartbeat_interval(), ready_since),
        pods::run(client.clone(), id.node_name.clone()),
        inplace::run(
            client.clone(),
            id.node_name.clone(),
            spec.fail_in_place_update
        ),
    );
    Ok(())
}

/// Calls `op` until it succeeds, fails with a non-retryable error, or
/// [`BOOT_API_TIMEOUT`] of waiting has passed, with exponential backoff between attempts
/// (200 ms doubling up to 5 s).
async fn retry<T, E, F, Fut>(what: &str, op: F, retryable: impl Fn(&E) -> bool) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let backoff = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(2.0)
        .without_max_times()
        .with_total_delay(Some(BOOT_API_TIMEOUT));
    op.retry(backoff)
        .when(|e| retryable(e))
        .notify(|e, backoff| warn!(error = %e, ?backoff, "failed to {what}; retrying"))
        .await
}

/// The error and its causes on one line (`a: b: c`), for the final log line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn parses_the_driver_arguments() {
        let c = AgentConfig::try_parse_from([
            "local-node",
            "--machine-name",
            "m1",
            "--kubeconfig",
            "/k",
            "--request-id",
            "r",
        ])
        .expect("parses");
        let id = c.identity();
        assert_eq!(id.node_name, "m1");
        assert_eq!(id.provider_id, "local:///m1");
        assert_eq!(c.request_id.as_deref(), Some("r"));
        assert_eq!(load_spec(&c).expect("defaults"), ProviderSpec::default());
    }

    #[test]
    fn driver_args_are_understood_by_the_agent() {
        let args = crate::driver::AgentArgs {
            machine_name: "m1",
            provider_id: "local:///m1",
            kubeconfig: std::path::Path::new("/w/kubeconfig"),
            user_data: Some(std::path::Path::new("/w/userData")),
            spec: std::path::Path::new("/w/spec.json"),
            request_id: "req-1",
        }
        .to_args();
        let c = AgentConfig::try_parse_from(
            std::iter::once(std::ffi::OsString::from("local-node")).chain(args),
        )
        .expect("parses");
        assert_eq!(c.machine_name, "m1");
        assert_eq!(c.user_data, Some(PathBuf::from("/w/userData")));
        assert_eq!(c.spec, Some(PathBuf::from("/w/spec.json")));
        assert_eq!(c.request_id.as_deref(), Some("req-1"));
    }

    #[test]
    fn chains_errors() {
        let e = AgentError::Read {
            path: "/x".into(),
            source: std::io::Error::other("boom"),
        };
        assert_eq!(error_chain(&e), "failed to read /x: boom");
    }
}
