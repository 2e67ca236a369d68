//! A real Kubernetes control plane for tests.
//!
//! [`ControlPlane::start`] launches etcd and kube-apiserver on 127.0.0.1 (free ports, a freshly
//! generated CA, serving and client certificates, service-account keys), installs the project's
//! CRDs, and on request kube-controller-manager (all default controllers, with a short node
//! monitor grace period) and kube-scheduler. Binaries come from `KUBEBUILDER_ASSETS` or from the
//! cache `cargo xtask testenv` fills ([`binaries`]).
//!
//! Tests share one control plane per test process through [`shared`]; each test takes a
//! fresh namespace from [`ControlPlane::namespace`] and a client from [`ControlPlane::client`]
//! (a new client per call, because every `#[tokio::test]` has its own runtime).
//!
//! ```no_run
//! # async fn demo() -> Result<(), mcm_testenv::TestEnvError> {
//! use mcm_testenv::{Components, shared};
//! let env = shared(Components::API_SERVER).await?;
//! let client = env.client().await?;
//! let ns = env.namespace("my-test").await?;
//! # let _ = (client, ns);
//! # Ok(()) }
//! ```
//!
//! No process outlives the test process: see [`process`] for how. What the tests share
//! besides the control plane (waits, fixtures, processes, metrics) is in [`kit`].
#![warn(missing_docs)]

pub mod binaries;
pub mod kit;
pub mod node;
pub mod pki;
pub mod process;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use tokio::sync::Mutex;

use binaries::Binary;
use pki::{Pki, PkiFiles};
use process::ManagedProcess;

/// Errors of the test control plane. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// Neither `XDG_CACHE_HOME` nor `HOME` is set.
    #[error("cannot find a cache directory: neither XDG_CACHE_HOME nor HOME is set")]
    NoCacheDir,
    /// Control-plane binaries are missing.
    #[error(
        "control-plane binaries missing in {dir} ({source_name}): {missing}; \
         run `cargo xtask testenv` to build them, or point KUBEBUILDER_ASSETS at a directory that has them"
    )]
    BinariesMissing {
        /// The directory searched.
        dir: PathBuf,
        /// Where the directory came from.
        source_name: &'static str,
        /// The missing file names.
        missing: String,
    },
    /// The `helm` binary the chart tests render with is missing.
    #[error(
        "helm {version} missing: {path} ({source_name}) is not an executable file; \
         run `cargo xtask chart` to build it, or point HELM at a helm binary"
    )]
    HelmMissing {
        /// The path looked at.
        path: PathBuf,
        /// Where the path came from.
        source_name: &'static str,
        /// The helm release the project uses.
        version: &'static str,
    },
    /// A file-system or socket operation failed.
    #[error("failed to {action}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Generating certificates failed.
    #[error("failed to generate test certificates")]
    Pki(#[from] rcgen::Error),
    /// The supervisor thread that spawns processes is gone.
    #[error("the process supervisor thread of mcm-testenv is gone")]
    Supervisor,
    /// A process could not be started.
    #[error("failed to start {program}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A component exited or did not become healthy in time.
    #[error(
        "{component} did not become ready within {waited:?}: {reason}\n--- last lines of {log} ---\n{log_tail}"
    )]
    NotReady {
        /// The component, e.g. `kube-apiserver`.
        component: String,
        /// How long we waited.
        waited: Duration,
        /// Why we gave up.
        reason: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        log_tail: String,
    },
    /// The kubeconfig could not be loaded.
    #[error("failed to load the generated kubeconfig")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed: {action}")]
    Kube {
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Waiting on a condition failed or timed out.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// Rendering a generated CRD failed.
    #[error("failed to serialize a CRD")]
    CrdSerialize(#[source] serde_json::Error),
    /// A [`node::KubeletNode`] could not be set up: what is missing or what failed.
    #[error("node: {0}")]
    Node(String),
}

impl TestEnvError {
    pub(crate) fn io(action: &'static str, source: std::io::Error) -> Self {
        TestEnvError::Io { action, source }
    }

    fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        TestEnvError::Kube {
            action: action.into(),
            source,
        }
    }
}

/// Which optional components to run besides etcd and kube-apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Components {
    /// kube-controller-manager: garbage collector, namespace, node lifecycle, deployment,
    /// replicaset, daemonset, disruption (PDB status), bootstrap signer/token cleaner, ...
    pub controller_manager: bool,
    /// kube-scheduler.
    pub scheduler: bool,
}

impl Components {
    /// etcd and kube-apiserver only.
    pub const API_SERVER: Components = Components {
        controller_manager: false,
        scheduler: false,
    };
    /// Everything: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.
    pub const ALL: Components = Components {
        controller_manager: true,
        scheduler: true,
    };
}

/// Settings of a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Optional components to start right away.
    pub components: Components,
    /// Where the binaries are; `None` = [`binaries::find_bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// kube-controller-manager `--node-monitor-grace-period`: how long a Node may miss
    /// heartbeats before the node lifecycle controller marks it `Unknown`.
    pub node_monitor_grace_period: Duration,
    /// Install the project's CRDs and wait until they are Established.
    pub install_crds: bool,
    /// How long each component may take to become healthy.
    pub ready_timeout: Duration,
    /// Write an audit log of every write request (not reads) to
    /// [`ControlPlane::audit_log_path`], one JSON event per line.
    pub audit_writes: bool,
    /// With [`Options::audit_writes`]: log reads (get, list, watch) too, to count every
    /// request a client makes.
    pub audit_reads: bool,
    /// Run the `ServiceAccount` admission plugin, which gives pods their ServiceAccount's
    /// token volume (what a [`node::KubeletNode`]'s pods need for in-cluster credentials).
    /// Off by default: tests create pods in fresh namespaces before kube-controller-manager
    /// (if it runs at all) has made their `default` ServiceAccount, which the plugin refuses.
    pub service_account_admission: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            components: Components::API_SERVER,
            bin_dir: None,
            node_monitor_grace_period: Duration::from_secs(10),
            install_crds: true,
            ready_timeout: Duration::from_secs(120),
            audit_writes: false,
            audit_reads: false,
            service_account_admission: false,
        }
    }
}

/// A running control plane. Dropping it kills every process it started and removes its
/// run directory.
pub struct ControlPlane {
    options: Options,
    bin_dir: PathBuf,
    run_dir: PathBuf,
    pki_files: PkiFiles,
    kubeconfig_path: PathBuf,
    server_url: String,
    startup: Duration,
    processes: std::sync::Mutex<Vec<ManagedProcess>>,
    optional_started: Mutex<Components>,
    kwok_started: Mutex<bool>,
}

/// The annotation that hands a Node to kwok ([`ControlPlane::start_kwok`]) with the value
/// `fake`.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server_url", &self.server_url)
            .field("run_dir", &self.run_dir)
            .finish_non_exhaustive()
    }
}

/// `--audit-log-maxsize` in MB: large enough that the audit log is never rotated.
const AUDIT_LOG_NEVER_ROTATED_MB: u32 = 1 << 20;

/// Audit policy of [`Options::audit_writes`]: metadata of every write, no reads.
const AUDIT_WRITES_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  verbs: [get, list, watch]
- level: Metadata
";

/// Audit policy of [`Options::audit_reads`]: metadata of every request.
const AUDIT_ALL_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

/// The base directory of run directories: `$TMPDIR/mcm-testenv`.
pub fn runs_base_dir() -> PathBuf {
    std::env::temp_dir().join("mcm-testenv")
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and the components in `options.components`), installs
    /// the CRDs, and returns once everything is healthy.
    pub async fn start(options: Options) -> Result<ControlPlane, TestEnvError> {
        let began = Instant::now();
        let mut needed = vec![Binary::Etcd, Binary::KubeApiserver];
        if options.components.controller_manager {
            needed.push(Binary::KubeControllerManager);
        }
        if options.components.scheduler {
            needed.push(Binary::KubeScheduler);
        }
        let bin_dir = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => binaries::find_bin_dir(&needed)?,
        };

        let base = runs_base_dir();
        std::fs::create_dir_all(&base)
            .map_err(|e| TestEnvError::io("create the run base directory", e))?;
        process::sweep_stale_runs(&base);
        let run_dir = tempfile::Builder::new()
            .prefix(&format!("run-{}-", std::process::id()))
            .tempdir_in(&base)
            .map_err(|e| TestEnvError::io("create a run directory", e))?
            .keep();
        process::claim_run_dir(&run_dir)?;

        let pki = Pki::generate()?;
        let pki_files = pki.write(&run_dir.join("pki"))?;
        let api_port = free_port()?;
        let server_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig_path = run_dir.join("kubeconfig");
        std::fs::write(&kubeconfig_path, admin_kubeconfig(&pki, &server_url))
            .map_err(|e| TestEnvError::io("write the kubeconfig", e))?;

        let mut cp = ControlPlane {
            options: options.clone(),
            bin_dir,
            run_dir,
            pki_files,
            kubeconfig_path,
            server_url,
            startup: Duration::ZERO,
            processes: std::sync::Mutex::new(Vec::new()),
            optional_started: Mutex::new(Components::API_SERVER),
            kwok_started: Mutex::new(false),
        };
        cp.start_etcd_and_apiserver(api_port).await?;
        if options.install_crds {
            cp.install_crds().await?;
        }
        cp.ensure(options.components).await?;
        cp.startup = began.elapsed();
        tracing::info!(url = %cp.server_url, startup = ?cp.startup, "test control plane ready");
        Ok(cp)
    }

    /// The API server URL (`https://127.0.0.1:<port>`).
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// A kubeconfig file with cluster-admin (`system:masters`) credentials.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The directory holding this control plane's data, certificates and logs.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The audit log of write requests (JSON lines), when [`Options::audit_writes`] is set.
    pub fn audit_log_path(&self) -> Option<PathBuf> {
        self.options
            .audit_writes
            .then(|| self.run_dir.join("audit.log"))
    }

    /// The directory the binaries were taken from.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The CA certificate file (trusted by the API server for client certificates too).
    pub fn ca_cert_path(&self) -> &Path {
        &self.pki_files.ca_cert
    }

    /// How long [`ControlPlane::start`] took.
    pub fn startup_duration(&self) -> Duration {
        self.startup
    }

    /// The log file of a component (`etcd`, `kube-apiserver`, ...).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.run_dir.join(format!("{component}.log"))
    }

    /// A new admin client. Create one per test (per tokio runtime).
    pub async fn client(&self) -> Result<kube::Client, TestEnvError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig_path)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        kube::Client::try_from(config).map_err(|e| TestEnvError::kube("build a client", e))
    }

    /// A new admin client that does not retry `429`, `503` and `504` answers
    /// ([`kube::Config::default_retry`] off): what a machine controller sends evictions with.
    pub async fn client_without_retries(&self) -> Result<kube::Client, TestEnvError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig_path)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.default_retry = false;
        kube::Client::try_from(config).map_err(|e| TestEnvError::kube("build a client", e))
    }

    /// Creates a fresh namespace `<prefix>-<random>` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String, TestEnvError> {
        let client = self.client().await?;
        let name = format!("{}-{}", sanitize(prefix), random_suffix(6));
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("mcm-testenv".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client)
            .create(&PostParams::default(), &ns)
            .await
            .map_err(|e| TestEnvError::kube(format!("create namespace {name}"), e))?;
        Ok(name)
    }

    /// Starts the optional components in `components` that are not running yet.
    pub async fn ensure(&self, components: Components) -> Result<(), TestEnvError> {
        let mut started = self.optional_started.lock().await;
        if components.controller_manager && !started.controller_manager {
            self.start_controller_manager().await?;
            started.controller_manager = true;
        }
        if components.scheduler && !started.scheduler {
            self.start_scheduler().await?;
            started.scheduler = true;
        }
        Ok(())
    }

    /// Kills one component's process group (e.g. to simulate an outage). It is not restarted.
    pub fn kill(&self, component: &str) {
        if let Ok(procs) = self.processes.lock() {
            procs
                .iter()
                .filter(|p| p.name() == component)
                .for_each(ManagedProcess::kill);
        }
    }

    fn binary(&self, b: Binary) -> Result<PathBuf, TestEnvError> {
        let path = self.bin_dir.join(b.file_name());
        if path.is_file() {
            Ok(path)
        } else {
            binaries::find_bin_dir(&[b]).map(|d| d.join(b.file_name()))
        }
    }

    fn spawn(&self, b: Binary, args: Vec<String>) -> Result<usize, TestEnvError> {
        self.spawn_program(b.file_name(), &self.binary(b)?, args)
    }

    fn spawn_program(
        &self,
        name: &str,
        program: &Path,
        args: Vec<String>,
    ) -> Result<usize, TestEnvError> {
        let p = ManagedProcess::spawn(name, program, &args, self.log_path(name), &self.run_dir)?;
        let mut procs = self
            .processes
            .lock()
            .map_err(|_| TestEnvError::Supervisor)?;
        procs.push(p);
        Ok(procs.len() - 1)
    }

    fn not_ready(&self, index: usize, waited: Duration, reason: String) -> TestEnvError {
        let procs = self.processes.lock();
        let (component, log, log_tail) = match procs.as_ref().ok().and_then(|p| p.get(index)) {
            Some(p) => (p.name().to_string(), p.log().to_path_buf(), p.log_tail(30)),
            None => ("unknown".into(), PathBuf::new(), String::new()),
        };
        TestEnvError::NotReady {
            component,
            waited,
            reason,
            log,
            log_tail,
        }
    }

    fn is_running(&self, index: usize) -> bool {
        self.processes
            .lock()
            .ok()
            .and_then(|p| p.get(index).map(ManagedProcess::is_running))
            .unwrap_or(false)
    }

    /// Starts the kwok controller (see [`binaries::find_kwok_dir`]) against this control
    /// plane, managing the Nodes annotated [`KWOK_NODE_ANNOTATION`]`=fake`: they become Ready,
    /// their Leases are renewed, their Pods run. Returns once its `/healthz` answers; a second
    /// call does nothing. Its log is [`ControlPlane::log_path`]`("kwok")`.
    pub async fn start_kwok(&self) -> Result<(), TestEnvError> {
        let mut started = self.kwok_started.lock().await;
        if *started {
            return Ok(());
        }
        let dir = binaries::find_kwok_dir()?;
        let port = free_port()?;
        let idx = self.spawn_program(
            "kwok",
            &dir.join("kwok"),
            vec![
                format!("--kubeconfig={}", self.kubeconfig_path.display()),
                format!(
                    "--config={}",
                    dir.join(binaries::KWOK_STAGES_FILE).display()
                ),
                "--manage-all-nodes=false".into(),
                format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
                "--node-lease-duration-seconds=40".into(),
                "--node-ip=127.0.0.1".into(),
                format!("--server-address=127.0.0.1:{port}"),
            ],
        )?;
        let url: http::Uri = format!("http://127.0.0.1:{port}")
            .parse()
            .map_err(|e| TestEnvError::io("parse kwok's URL", std::io::Error::other(e)))?;
        let mut config = kube::Config::new(url);
        config.default_retry = false;
        let client = kube::Client::try_from(config)
            .map_err(|e| TestEnvError::kube("build a kwok health client", e))?;
        self.wait_healthy(idx, &client, "/healthz", self.options.ready_timeout)
            .await?;
        *started = true;
        Ok(())
    }

    async fn start_etcd_and_apiserver(&self, api_port: u16) -> Result<(), TestEnvError> {
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let data = self.run_dir.join("etcd");
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        self.spawn(
            Binary::Etcd,
            vec![
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        let f = &self.pki_files;
        let mut audit = Vec::new();
        if let Some(log) = self.audit_log_path() {
            let policy = self.run_dir.join("audit-policy.yaml");
            let text = if self.options.audit_reads {
                AUDIT_ALL_POLICY
            } else {
                AUDIT_WRITES_POLICY
            };
            std::fs::write(&policy, text)
                .map_err(|e| TestEnvError::io("write the audit policy", e))?;
            audit = vec![
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", log.display()),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
                // Never rotated: readers take the one file to be the whole log (unset, the
                // log is rotated at 100 MB, which a benchmark of 1000 kwok Nodes, whose
                // Lease renewals are audited too, reaches in ten minutes).
                format!("--audit-log-maxsize={AUDIT_LOG_NEVER_ROTATED_MB}"),
            ];
        }
        let idx = self.spawn(
            Binary::KubeApiserver,
            [
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", self.run_dir.join("apiserver").display()),
                format!("--tls-cert-file={}", f.serving_cert.display()),
                format!("--tls-private-key-file={}", f.serving_key.display()),
                format!("--client-ca-file={}", f.ca_cert.display()),
                format!(
                    "--service-account-key-file={}",
                    f.service_account_pub.display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    f.service_account_key.display()
                ),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                // No kube-proxy routes Service addresses: webhooks and aggregated APIs are
                // called at their Services' endpoints.
                "--enable-aggregator-routing=true".into(),
                "--authorization-mode=RBAC".into(),
                "--enable-bootstrap-token-auth=true".into(),
                "--allow-privileged=true".into(),
                "--v=1".into(),
            ]
            .into_iter()
            // Tests create pods in fresh namespaces before any service account exists.
            .chain(
                (!self.options.service_account_admission)
                    .then(|| "--disable-admission-plugins=ServiceAccount".to_string()),
            )
            .chain(audit)
            .collect(),
        )?;
        let client = self.client().await?;
        let deadline = self.options.ready_timeout;
        self.wait_healthy(idx, &client, "/readyz", deadline).await
    }

    async fn start_controller_manager(&self) -> Result<(), TestEnvError> {
        let f = &self.pki_files;
        let port = free_port()?;
        let grace = self.options.node_monitor_grace_period.as_secs().max(2);
        let kc = self.kubeconfig_path.display().to_string();
        let idx = self.spawn(
            Binary::KubeControllerManager,
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", self.run_dir.join("kcm").display()),
                "--leader-elect=false".into(),
                "--controllers=*,bootstrap-signer-controller,token-cleaner-controller".into(),
                format!(
                    "--service-account-private-key-file={}",
                    f.service_account_key.display()
                ),
                format!("--root-ca-file={}", f.ca_cert.display()),
                format!("--cluster-signing-cert-file={}", f.ca_cert.display()),
                format!("--cluster-signing-key-file={}", f.ca_key.display()),
                format!("--node-monitor-grace-period={grace}s"),
                "--node-monitor-period=1s".into(),
                "--concurrent-gc-syncs=5".into(),
                "--v=1".into(),
            ],
        )?;
        self.wait_component_healthz(idx, port).await
    }

    async fn start_scheduler(&self) -> Result<(), TestEnvError> {
        let port = free_port()?;
        let kc = self.kubeconfig_path.display().to_string();
        let idx = self.spawn(
            Binary::KubeScheduler,
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", self.run_dir.join("scheduler").display()),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
        )?;
        self.wait_component_healthz(idx, port).await
    }

    /// kube-controller-manager and kube-scheduler serve `/healthz` with a self-signed
    /// certificate; the path is always allowed without credentials.
    async fn wait_component_healthz(&self, idx: usize, port: u16) -> Result<(), TestEnvError> {
        let url: http::Uri = format!("https://127.0.0.1:{port}")
            .parse()
            .map_err(|e| TestEnvError::io("parse a component URL", std::io::Error::other(e)))?;
        let mut config = kube::Config::new(url);
        config.accept_invalid_certs = true;
        config.default_retry = false;
        let client = kube::Client::try_from(config)
            .map_err(|e| TestEnvError::kube("build a component health client", e))?;
        self.wait_healthy(idx, &client, "/healthz", self.options.ready_timeout)
            .await
    }

    async fn wait_healthy(
        &self,
        idx: usize,
        client: &kube::Client,
        path: &str,
        timeout: Duration,
    ) -> Result<(), TestEnvError> {
        let began = Instant::now();
        let mut last = String::from("no answer yet");
        while began.elapsed() < timeout {
            if !self.is_running(idx) {
                return Err(self.not_ready(idx, began.elapsed(), "the process exited".into()));
            }
            let req = http::Request::get(path)
                .body(Vec::new())
                .map_err(|e| TestEnvError::io("build a request", std::io::Error::other(e)))?;
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last = format!("{path} answered {body:?}"),
                Ok(Err(e)) => last = format!("{path}: {e}"),
                Err(_) => last = format!("{path}: no answer within 5s"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(self.not_ready(idx, began.elapsed(), last))
    }

    async fn install_crds(&self) -> Result<(), TestEnvError> {
        let client = self.client().await?;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let params = PatchParams::apply("mcm-testenv").force();
        let crds = mcm_api::crds::all();
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(crd))
                .await
                .map_err(|e| TestEnvError::kube(format!("apply CRD {name}"), e))?;
        }
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let timeout = Duration::from_secs(30);
            tokio::time::timeout(
                timeout,
                await_condition(api.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .map_err(|_| TestEnvError::Timeout(timeout, format!("CRD {name} to be Established")))?
            .map_err(|e| TestEnvError::Timeout(timeout, format!("CRD {name}: {e}")))?;
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Ok(mut procs) = self.processes.lock() {
            // Stop in reverse start order: clients of the API server first, etcd last.
            while let Some(p) = procs.pop() {
                drop(p);
            }
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

static SHARED: Mutex<Option<Arc<ControlPlane>>> = Mutex::const_new(None);

/// The control plane shared by the tests of this process: started on first use, extended with
/// the optional `components` asked for, killed when the process exits.
pub async fn shared(components: Components) -> Result<Arc<ControlPlane>, TestEnvError> {
    let mut slot = SHARED.lock().await;
    let cp = match slot.as_ref() {
        Some(cp) => cp.clone(),
        None => {
            let cp = Arc::new(ControlPlane::start(Options::default()).await?);
            *slot = Some(cp.clone());
            cp
        }
    };
    drop(slot);
    cp.ensure(components).await?;
    Ok(cp)
}

/// A port on 127.0.0.1 that was free when asked, taken from 20000..32000: below Linux's
/// ephemeral range (32768 and up), so an outgoing connection of any process cannot be given it
/// between this check and the bind of the process it is meant for (a port the kernel picks for
/// `bind(0)` is an ephemeral one, and was seen taken that way). Each call moves on to the next
/// port, from a start that differs per process, so two calls never hand out the same port.
fn free_port() -> Result<u16, TestEnvError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    let mut last = None;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(_) => return Ok(port),
            Err(e) => last = Some(e),
        }
    }
    Err(TestEnvError::io(
        "find a free port in 20000..32000",
        last.unwrap_or_else(|| std::io::Error::other("no port tried")),
    ))
}

fn admin_kubeconfig(pki: &Pki, server: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mcm-testenv\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {cert}\n    \
         client-key-data: {key}\ncontexts:\n- name: mcm-testenv\n  context:\n    cluster: mcm-testenv\n    user: admin\n\
         current-context: mcm-testenv\n",
        ca = b64(&pki.ca_cert_pem),
        cert = b64(&pki.admin_cert_pem),
        key = b64(&pki.admin_key_pem),
    )
}

/// Lower-case alphanumerics and dashes, at most 40 characters, as a namespace prefix.
fn sanitize(prefix: &str) -> String {
    let s: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let s = s.trim_matches('-');
    if s.is_empty() {
        "test".into()
    } else {
        s.into()
    }
}

fn random_suffix(len: usize) -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_prefixes_are_valid_dns_labels() {
        assert_eq!(sanitize("My_Test::case"), "my-test--case");
        assert_eq!(sanitize("__"), "test");
        assert!(sanitize(&"x".repeat(100)).len() <= 40);
    }

    #[test]
    fn generated_kubeconfig_parses() {
        let pki = Pki::generate().unwrap();
        let text = admin_kubeconfig(&pki, "https://127.0.0.1:6443");
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("mcm-testenv"));
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://127.0.0.1:6443")
        );
    }
}
