//! Process lifecycle shared by the binaries: logging, clients, HTTP endpoints, signals and
//! leader election around the controllers.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use mcm_driver::{Driver, DriverMetrics, Instrumented};
use mcm_reconcilers::MachineMetrics;
use mcm_reconcilers::ReconcileMetrics;
use mcm_reconcilers::informers::Informers;
use mcm_reconcilers::machine_controller::{self, Handles};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::clients::{self, ClientError, ClientMetrics};
use crate::http::{self, Readiness};
use crate::options::{CommonOptions, MachineControllerOptions, ManagerOptions};

/// Errors that end a controller process. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A client could not be built.
    #[error("cannot connect to the {cluster} cluster")]
    Client {
        /// `control` or `target`.
        cluster: &'static str,
        /// The cause.
        #[source]
        source: ClientError,
    },
    /// A flag value is not usable.
    #[error("invalid flag {flag}: {reason}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// Why.
        reason: String,
    },
    /// The HTTP endpoint could not be bound.
    #[error("cannot serve HTTP on {addr}")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The admission webhook could not start.
    #[error("cannot start the admission webhook")]
    Webhook(#[from] crate::webhook::WebhookError),
    /// Leader election failed.
    #[error("leader election failed")]
    LeaderElection(#[source] kube_lease_manager::LeaseManagerError),
    /// This replica lost the leadership; it exits so that it restarts as a candidate.
    #[error("lost the leader lease {0}; exiting")]
    LeadershipLost(String),
}

pub use mcm_reconcilers::error_chain;

/// Installs the tracing subscriber: `--v` maps to a level, `RUST_LOG` overrides it.
pub fn init_logging(common: &CommonOptions) {
    let level = match common.verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},kube=warn,hyper=warn,tower=warn"))
    });
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi);
    // A second initialisation (tests running several controllers) is not an error.
    let _ = if common.log_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A token cancelled on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = term => tracing::info!("SIGTERM received: finishing in-flight work"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received: finishing in-flight work"),
        }
        t.cancel();
    });
    token
}

/// Builds the control and target clients from the flags (`--control-kubeconfig` defaults to
/// `--target-kubeconfig`); no target client for `--target-kubeconfig=none`, which needs an
/// explicit `--control-kubeconfig` (upstream's rule).
pub async fn clients(
    common: &CommonOptions,
) -> Result<(kube::Client, Option<kube::Client>), RunError> {
    clients_counted(common, &ClientMetrics::default()).await
}

/// [`clients()`] whose requests are counted in `metrics` (`cluster="control"|"target"`).
pub async fn clients_counted(
    common: &CommonOptions,
    metrics: &ClientMetrics,
) -> Result<(kube::Client, Option<kube::Client>), RunError> {
    let target_flag = common.target_kubeconfig.as_str();
    if target_flag == clients::NONE && common.control_kubeconfig.is_empty() {
        return Err(RunError::Flag {
            flag: "--control-kubeconfig",
            reason: format!(
                "cannot be empty if --target-kubeconfig={} is specified",
                clients::NONE
            ),
        });
    }
    let control_flag = if common.control_kubeconfig.is_empty() && target_flag != clients::NONE {
        target_flag
    } else {
        common.control_kubeconfig.as_str()
    };
    let control = counted_client(
        common,
        metrics,
        load(control_flag, "control").await?,
        "control",
    )?;
    if target_flag == clients::NONE {
        return Ok((control, None));
    }
    let target = counted_client(
        common,
        metrics,
        load(target_flag, "target").await?,
        "target",
    )?;
    Ok((control, Some(target)))
}

/// The client configuration a kubeconfig flag value names, for `cluster`.
async fn load(flag: &str, cluster: &'static str) -> Result<kube::Config, RunError> {
    clients::load_config(flag)
        .await
        .map_err(|source| RunError::Client { cluster, source })
}

/// A client for `config`, rate-limited by `--kube-api-qps/burst` and counted as `cluster`.
fn counted_client(
    common: &CommonOptions,
    metrics: &ClientMetrics,
    config: kube::Config,
    cluster: &'static str,
) -> Result<kube::Client, RunError> {
    clients::rate_limited_client_counted(
        config,
        common.kube_api_qps,
        common.kube_api_burst,
        Some(metrics.requests(cluster)),
    )
    .map_err(|source| RunError::Client { cluster, source })
}

/// The client a machine controller sends evictions to the target cluster with (`None` with
/// `--target-kubeconfig=none`): the target's configuration without the client-side retry of
/// `429` answers. An eviction a PodDisruptionBudget refuses is answered `429`; a retrying
/// client repeats it with a growing backoff until the attempt gives up (the eviction retry
/// interval), and the reconcile running the drain pass would hold that long. Rate-limited
/// like the other clients (`--kube-api-qps/burst`, a bucket of its own), counted as
/// `cluster="target"`.
pub async fn eviction_client(
    common: &CommonOptions,
    metrics: &ClientMetrics,
) -> Result<Option<kube::Client>, RunError> {
    let target_flag = common.target_kubeconfig.as_str();
    if target_flag == clients::NONE {
        return Ok(None);
    }
    let mut config = load(target_flag, "target").await?;
    config.default_retry = false;
    counted_client(common, metrics, config, "target").map(Some)
}

/// Runs `work` while this replica holds the lease named `lease` (or at once without leader
/// election) until `cancel` fires. Losing the lease cancels the work and returns
/// [`RunError::LeadershipLost`].
pub async fn with_leader_election<F, Fut>(
    client: kube::Client,
    common: &CommonOptions,
    lease: &str,
    readiness: Readiness,
    cancel: CancellationToken,
    work: F,
) -> Result<(), RunError>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    if !common.leader_elect {
        readiness.leader.store(true, Ordering::SeqCst);
        work(cancel).await;
        return Ok(());
    }
    let name = if common.leader_elect_resource_name.is_empty() {
        lease.to_string()
    } else {
        common.leader_elect_resource_name.clone()
    };
    let namespace = if common.leader_elect_resource_namespace.is_empty() {
        common.namespace.clone()
    } else {
        common.leader_elect_resource_namespace.clone()
    };
    let identity = clients::replica_identity();
    let duration = common.leader_elect_lease_duration.as_secs().max(2);
    let grace = duration
        .saturating_sub(common.leader_elect_renew_deadline.as_secs())
        .clamp(1, duration - 1);
    let manager = LeaseManagerBuilder::new(client, &name)
        .with_namespace(&namespace)
        .with_identity(&identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
        .map_err(RunError::LeaderElection)?;
    let (mut leading, lease_task) = manager.watch().await;
    tracing::info!(lease = %name, %namespace, %identity, "waiting for leadership");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    return Err(RunError::LeadershipLost(name));
                }
            }
            _ = cancel.cancelled() => {
                drop(leading);
                let _ = lease_task.await;
                return Ok(());
            }
        }
    }
    tracing::info!(lease = %name, %identity, "became leader");
    // A stop longer than the lease's grace may have let another replica take over: the
    // fence holds every request after such a stop and ends the process.
    clients::fence().arm(Duration::from_secs(grace));
    readiness.leader.store(true, Ordering::SeqCst);
    let work_cancel = cancel.child_token();
    let lost = {
        let work_cancel = work_cancel.clone();
        let mut leading = leading.clone();
        async move {
            loop {
                if leading.changed().await.is_err() || !*leading.borrow_and_update() {
                    work_cancel.cancel();
                    return true;
                }
            }
        }
    };
    let mut lost = Box::pin(lost);
    let mut was_lost = false;
    let work = work(work_cancel.clone());
    tokio::pin!(work);
    tokio::select! {
        _ = &mut work => {}
        l = &mut lost => {
            was_lost = l;
            work.await;
        }
    }
    readiness.leader.store(false, Ordering::SeqCst);
    // Dropping the receivers makes the lease task release the lease.
    drop(leading);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    if was_lost && !cancel.is_cancelled() {
        return Err(RunError::LeadershipLost(name));
    }
    Ok(())
}

/// The provider name used in metric labels: `--cloud-provider`, else the binary name without
/// `machine-controller-`.
fn provider_name(options: &MachineControllerOptions) -> String {
    if !options.cloud_provider.is_empty() {
        return options.cloud_provider.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|n| n.trim_start_matches("machine-controller-").to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Runs a machine controller for `driver` until SIGTERM/SIGINT: the whole `main` of a
/// provider binary.
///
/// ```no_run
/// # async fn main_of_a_provider(driver: impl mcm_core::driver::Driver) -> Result<(), mcm_core::RunError> {
/// use clap::Parser;
/// let options = mcm_core::MachineControllerOptions::parse();
/// mcm_core::run_machine_controller(options, driver).await
/// # }
/// ```
pub async fn run_machine_controller(
    options: MachineControllerOptions,
    driver: impl Driver,
) -> Result<(), RunError> {
    init_logging(&options.common);
    let cancel = shutdown_on_signals();
    run_machine_controller_until(options, Arc::new(driver), cancel).await
}

/// [`run_machine_controller`] with an explicit cancellation token instead of signals (tests,
/// embedding). With `--controllers=machine,manager` the manager half runs in this process too.
pub async fn run_machine_controller_until(
    options: MachineControllerOptions,
    driver: Arc<dyn Driver>,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    let mut registry = Registry::default();
    let client_metrics = ClientMetrics::register(&mut registry);
    let (control, target) = clients_counted(&options.common, &client_metrics).await?;
    // `--target-kubeconfig=none`: machines are Available without Nodes, and nothing that
    // needs a target cluster is watched or asked (a request would fail with that reason).
    let target_cluster = target.is_some();
    let target = target.unwrap_or_else(clients::no_target_client);
    let evictions = eviction_client(&options.common, &client_metrics)
        .await?
        .unwrap_or_else(clients::no_target_client);
    let driver_metrics = DriverMetrics::register(&mut registry);
    let provider = provider_name(&options);
    let driver: Arc<dyn Driver> = Arc::new(Instrumented::new(driver, &provider, driver_metrics));
    let reconciles = ReconcileMetrics::register(&mut registry);
    let metrics = MachineMetrics::register(&mut registry, reconciles.clone());

    let handles = Handles::default();
    let mut readiness = Readiness::default();
    let run_machine = options.runs("machine");
    let manager_config = options.runs("manager").then(|| {
        let mut config = options
            .manager
            .manager_config(&options.common.namespace, options.concurrent_syncs);
        // One set of reconcile metrics for both halves.
        config.reconciles = Some(reconciles.clone());
        config.creation_timeouts.default_timeout = options.machine_creation_timeout;
        config.zone_partition = options.common.zone_partition.rule();
        config.target_cluster = target_cluster;
        config
    });
    if run_machine {
        readiness.synced.push(handles.ready.clone());
    }
    if let Some(c) = &manager_config {
        readiness.synced.push(c.ready.clone());
    }
    // The manager registers its collectors when its future is created (below).
    let registry = Arc::new(Mutex::new(registry));
    let addr = SocketAddr::new(options.common.address, options.port);
    let (bound, server) = http::serve(addr, registry.clone(), readiness.clone(), cancel.clone())
        .await
        .map_err(|source| RunError::Http { addr, source })?;
    tracing::info!(%bound, provider, namespace = %options.common.namespace, controllers = ?options.controllers, "machine controller starting");
    // The webhook serves on every replica, leader or not: it needs no stores.
    let webhook = match options
        .webhook
        .config(&options.common.namespace, target_cluster)
    {
        Some(config) => Some(
            crate::webhook::serve(config, control.clone(), driver.clone(), cancel.clone())
                .await?
                .1,
        ),
        None => None,
    };

    let config = options.controller_config();
    let namespace = options.common.namespace.clone();
    let result = with_leader_election(
        control.clone(),
        &options.common,
        "machine-controller",
        readiness,
        cancel.clone(),
        |work_cancel| async move {
            // One set of informers for both halves: one watch per kind in the process.
            let mut informers = if target_cluster {
                Informers::new(&control, &target, &namespace)
            } else {
                Informers::without_target(&control, &namespace)
            };
            let manager = manager_config.map(|mc| {
                let mut r = registry.lock().unwrap_or_else(|e| e.into_inner());
                mcm_reconcilers::manager::prepare(
                    &mut informers,
                    control.clone(),
                    target.clone(),
                    mc,
                    &mut r,
                    work_cancel.clone(),
                )
            });
            let machine = run_machine.then(|| {
                let side = machine_controller::MachineSide {
                    control: control.clone(),
                    target: target.clone(),
                    evictions,
                    driver,
                    config,
                    metrics,
                    handles,
                };
                machine_controller::prepare(&mut informers, side, work_cancel.clone())
            });
            informers.start(work_cancel.clone());
            futures::join!(
                async {
                    if let Some(m) = machine {
                        m.await;
                    }
                },
                async {
                    if let Some(m) = manager {
                        m.await;
                    }
                }
            );
        },
    )
    .await;
    cancel.cancel();
    let _ = server.await;
    if let Some(w) = webhook {
        let _ = w.await;
    }
    result
}

/// Runs the manager half (`machine-controller-manager`) until SIGTERM/SIGINT.
pub async fn run_manager(options: ManagerOptions) -> Result<(), RunError> {
    init_logging(&options.common);
    let cancel = shutdown_on_signals();
    run_manager_until(options, cancel).await
}

/// [`run_manager`] with an explicit cancellation token instead of signals.
pub async fn run_manager_until(
    options: ManagerOptions,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    let mut registry = Registry::default();
    let client_metrics = ClientMetrics::register(&mut registry);
    let (control, target) = clients_counted(&options.common, &client_metrics).await?;
    let mut config = options
        .manager
        .manager_config(&options.common.namespace, options.concurrent_syncs);
    // Without a target cluster the manager watches no Nodes; machines then have no `node`
    // label, so the rollout markers and rollback untainting have nothing to do.
    config.target_cluster = target.is_some();
    config.creation_timeouts.default_timeout = options.machine_creation_timeout;
    config.zone_partition = options.common.zone_partition.rule();
    let target = target.unwrap_or_else(clients::no_target_client);
    let readiness = Readiness {
        leader: Default::default(),
        synced: vec![config.ready.clone()],
    };
    let registry = Arc::new(Mutex::new(registry));
    let addr = SocketAddr::new(options.common.address, options.port);
    let (bound, server) = http::serve(addr, registry.clone(), readiness.clone(), cancel.clone())
        .await
        .map_err(|source| RunError::Http { addr, source })?;
    tracing::info!(%bound, namespace = %options.common.namespace, "machine controller manager starting");
    let result = with_leader_election(
        control.clone(),
        &options.common,
        "machine-controller-manager",
        readiness,
        cancel.clone(),
        |work_cancel| async move {
            let fut = {
                let mut r = registry.lock().unwrap_or_else(|e| e.into_inner());
                mcm_reconcilers::manager::run_manager(
                    control,
                    target,
                    config,
                    &mut r,
                    work_cancel.clone().cancelled_owned(),
                )
            };
            fut.await;
        },
    )
    .await;
    cancel.cancel();
    let _ = server.await;
    result
}
