//! [`LocalDriver`]: the [`Driver`] of the local cloud, whose VMs are `local-node` processes.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::NodeAddress;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    BoxError, Code, CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest,
    DeleteMachineResponse, Driver, DriverError, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, ListMachinesRequest, ListMachinesResponse,
    RequestId, ResourceKind, ResourceState, ResourceStatus, USER_DATA_KEY,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{info, warn};

use crate::kwok::{self, KwokError, TargetClients};
use crate::spec::{NodeKind, ProviderSpec, SpecError};
use crate::state::{
    self, KUBECONFIG_FILE, LOG_FILE, Liveness, SPEC_FILE, StateDirectory, StateError,
    USER_DATA_FILE, VmRecord,
};

/// Name of the agent binary.
pub const NODE_BINARY_NAME: &str = "local-node";
/// Environment variable naming the agent binary explicitly.
pub const NODE_BINARY_ENV: &str = "MCM_LOCAL_NODE_BINARY";
/// Secret key holding the target cluster's kubeconfig (content, not a path).
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// How long delete waits for a VM process to exit after SIGTERM before it sends SIGKILL.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(10);
/// How long delete waits for a VM process to disappear after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often delete looks at `/proc` while waiting for a process to exit.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// Errors of the local driver. Each keeps its cause; [`From<LocalError>`] for
/// [`DriverError`] maps them to MCM codes.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The `local-node` binary cannot be found.
    #[error(
        "cannot find the {NODE_BINARY_NAME} binary: set {NODE_BINARY_ENV} to its path, or install it next to the controller binary (looked at {})",
        .searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NodeBinaryNotFound {
        /// The paths that were tried.
        searched: Vec<PathBuf>,
    },
    /// The current executable's path is unknown.
    #[error("cannot determine the path of the current executable")]
    CurrentExe(#[source] io::Error),
    /// The providerSpec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The Machine has no usable name.
    #[error("invalid machine name {0:?}: must be a DNS-1123 subdomain")]
    InvalidMachineName(String),
    /// A required secret key is missing.
    #[error("the secret data has no {key:?} key (or it is not UTF-8): {purpose}")]
    MissingSecretKey {
        /// The key.
        key: &'static str,
        /// What it is needed for.
        purpose: &'static str,
    },
    /// Neither the providerSpec nor the environment names a state directory.
    #[error("no state directory: set providerSpec.stateDirectory, XDG_STATE_HOME or HOME")]
    NoStateDirectory,
    /// Reading or writing the state directory failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Preparing the VM's working directory failed.
    #[error("failed to {action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The agent process could not be started.
    #[error("failed to start {}", binary.display())]
    Spawn {
        /// The agent binary.
        binary: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The agent process started but its `/proc` entry could not be read to record it (a
    /// child not yet waited for stays there even when it exited at once).
    #[error("the {NODE_BINARY_NAME} process {pid} started but /proc/{pid}/stat could not be read to record it (see {})", log.display())]
    VanishedAtStart {
        /// Its pid.
        pid: u32,
        /// Its log file.
        log: PathBuf,
    },
    /// Signalling the VM process failed.
    #[error("failed to send {signal} to process {pid}")]
    Signal {
        /// The signal.
        signal: Signal,
        /// The pid.
        pid: i32,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// The VM process survived SIGKILL.
    #[error("process {pid} of machine {machine} still runs {waited:?} after SIGKILL")]
    StillRunning {
        /// The machine.
        machine: String,
        /// The pid.
        pid: i32,
        /// How long delete waited in total.
        waited: Duration,
    },
    /// An internal task failed (panicked or was cancelled).
    #[error("an internal task of the local driver failed")]
    Task(#[source] tokio::task::JoinError),
    /// Creating or deleting the Node of a kwok VM failed.
    #[error(transparent)]
    Kwok(#[from] KwokError),
}

impl LocalError {
    /// The MCM code of this error.
    pub fn code(&self) -> Code {
        match self {
            LocalError::Spec(_)
            | LocalError::InvalidMachineName(_)
            | LocalError::MissingSecretKey { .. } => Code::InvalidArgument,
            LocalError::NodeBinaryNotFound { .. }
            | LocalError::CurrentExe(_)
            | LocalError::NoStateDirectory => Code::FailedPrecondition,
            LocalError::State(_)
            | LocalError::Io { .. }
            | LocalError::Spawn { .. }
            | LocalError::VanishedAtStart { .. }
            | LocalError::Signal { .. }
            | LocalError::StillRunning { .. }
            | LocalError::Task(_) => Code::Internal,
            LocalError::Kwok(KwokError::Kubeconfig(_)) => Code::InvalidArgument,
            LocalError::Kwok(KwokError::ForeignNode { .. }) => Code::FailedPrecondition,
            LocalError::Kwok(KwokError::Client(_) | KwokError::Api { .. }) => Code::Unavailable,
        }
    }

    fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        LocalError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl LocalError {
    /// The underlying cause, unwrapped from this error (and from the state error it may
    /// wrap), as the boxed source of a [`DriverError`].
    pub fn into_cause(self) -> Option<BoxError> {
        match self {
            LocalError::State(StateError::Io { source, .. })
            | LocalError::Io { source, .. }
            | LocalError::Spawn { source, .. }
            | LocalError::CurrentExe(source) => Some(Box::new(source)),
            LocalError::State(StateError::Corrupt { source, .. }) => Some(Box::new(source)),
            LocalError::Signal { source, .. } => Some(Box::new(source)),
            LocalError::Task(source) => Some(Box::new(source)),
            LocalError::Kwok(KwokError::Kubeconfig(source)) => Some(Box::new(source)),
            LocalError::Kwok(KwokError::Client(source) | KwokError::Api { source, .. }) => {
                Some(Box::new(source))
            }
            LocalError::Kwok(KwokError::ForeignNode { .. })
            | LocalError::NodeBinaryNotFound { .. }
            | LocalError::Spec(_)
            | LocalError::InvalidMachineName(_)
            | LocalError::MissingSecretKey { .. }
            | LocalError::NoStateDirectory
            | LocalError::VanishedAtStart { .. }
            | LocalError::StillRunning { .. } => None,
        }
    }
}

impl From<LocalError> for DriverError {
    /// The code from [`LocalError::code`], the error's text as the message (it never repeats
    /// its cause), and the underlying cause (an `io::Error`, `nix::Error`, ...) as the typed
    /// source, so `DriverError::full_message` prints every piece once.
    fn from(err: LocalError) -> Self {
        let code = err.code();
        let message = err.to_string();
        match err.into_cause() {
            Some(cause) => DriverError::new(code, message).with_source(cause),
            None => DriverError::new(code, message),
        }
    }
}

/// Settings of a [`LocalDriver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalDriverConfig {
    /// The `local-node` binary the driver starts for each VM.
    pub node_binary: PathBuf,
}

impl LocalDriverConfig {
    /// Finds the `local-node` binary: `$MCM_LOCAL_NODE_BINARY` when set, else next to the
    /// current executable, else in its parent directory (cargo puts test binaries in
    /// `target/<profile>/deps/` and binaries in `target/<profile>/`).
    pub fn from_env() -> Result<LocalDriverConfig, LocalError> {
        let exe = std::env::current_exe().map_err(LocalError::CurrentExe)?;
        find_node_binary(std::env::var_os(NODE_BINARY_ENV).map(PathBuf::from), &exe)
            .map(|node_binary| LocalDriverConfig { node_binary })
    }
}

/// The search of [`LocalDriverConfig::from_env`] with explicit inputs.
fn find_node_binary(explicit: Option<PathBuf>, current_exe: &Path) -> Result<PathBuf, LocalError> {
    let mut candidates = Vec::new();
    if let Some(p) = explicit.filter(|p| !p.as_os_str().is_empty()) {
        candidates.push(p);
    }
    if let Some(dir) = current_exe.parent() {
        candidates.push(dir.join(NODE_BINARY_NAME));
        if let Some(parent) = dir.parent() {
            candidates.push(parent.join(NODE_BINARY_NAME));
        }
    }
    match candidates.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(LocalError::NodeBinaryNotFound {
            searched: candidates,
        }),
    }
}

/// The driver of the local cloud. VMs are `local-node` processes, tracked in the state
/// directory of their class's providerSpec, so that every operation works from the state
/// directory alone (a new driver, e.g. after a controller restart, sees the same VMs).
///
/// Decision: `list_machines` includes VMs whose process died (state `Stopped`), because a
/// crashed VM still exists in a cloud until it is deleted, and the orphan collector must be
/// able to find and delete it.
///
/// VM processes run in their own session (`setsid`), not tied to the controller: stopping or
/// restarting the controller leaves them running, and no `PR_SET_PDEATHSIG` is used. The
/// record is written before the process starts and completed with its pid right after, so a
/// controller that dies in between leaves a pending record, never an unrecorded process:
/// the next create or delete finds the process by its command line and stops it (status
/// reports no VM until the launch is finished). Create and delete of one machine are
/// serialized within a driver; two drivers sharing a state directory at the same time are
/// not coordinated.
#[derive(Debug)]
pub struct LocalDriver {
    config: LocalDriverConfig,
    /// One lock per record path, so create and delete of one machine never interleave; a
    /// path's entry lives while a call holds or waits for its lock (see [`RecordLock`]).
    locks: RecordLocks,
    /// Clients of target clusters, for the Nodes of kwok VMs.
    targets: TargetClients,
}

/// The locks of the record paths a call holds or waits for.
#[derive(Debug, Default)]
struct RecordLocks(Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>);

impl RecordLocks {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A held (or awaited) record lock. Dropping it releases the lock and forgets the path's entry
/// when no other call holds or waits for it, so the map follows the calls in flight rather than
/// every machine the process ever created (a churning fleet's names never repeat). A caller
/// takes its reference to the entry under the map's mutex, and the entry is removed only under
/// it with no reference left, so two calls for one path always share one lock.
struct RecordLock<'a> {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    key: PathBuf,
    locks: &'a RecordLocks,
}

impl Drop for RecordLock<'_> {
    fn drop(&mut self) {
        // The guard holds a reference to the entry: release it first.
        self.guard.take();
        let mut map = self.locks.map();
        if map
            .get(&self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            map.remove(&self.key);
        }
    }
}

impl LocalDriver {
    /// A driver starting `config.node_binary` for each VM.
    pub fn new(config: LocalDriverConfig) -> Self {
        LocalDriver {
            config,
            locks: RecordLocks::default(),
            targets: TargetClients::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LocalDriverConfig {
        &self.config
    }

    async fn lock(&self, key: PathBuf) -> RecordLock<'_> {
        let lock = self.locks.map().entry(key.clone()).or_default().clone();
        // Made before the wait, so a call dropped while it waits forgets the entry too: the
        // wait (holding the reference) is dropped first, then this, whose drop cleans up.
        let mut held = RecordLock {
            guard: None,
            key,
            locks: &self.locks,
        };
        held.guard = Some(lock.lock_owned().await);
        held
    }

    async fn create(&self, req: CreateMachineRequest) -> Result<CreateMachineResponse, LocalError> {
        let name = machine_name(&req.machine)?;
        let spec = parse_spec(&req.machine_class)?;
        let state = state_directory(&spec)?;
        let kubeconfig =
            req.secret
                .get_str(KUBECONFIG_KEY)
                .ok_or(LocalError::MissingSecretKey {
                    key: KUBECONFIG_KEY,
                    purpose: "the kubeconfig of the target cluster the VM's Node joins",
                })?;
        let _guard = self.lock(state.record_path(&name)).await;
        if spec.node == NodeKind::Kwok {
            return self.create_kwok(&req, state, name, spec, kubeconfig).await;
        }
        match state.read(&name)? {
            Some(existing) if existing.launch_pending() => {
                // An earlier create died between recording the VM and recording its
                // process: stop whatever it started and launch again.
                let work = state.work_dir(&name);
                let request_id = req.request_id.clone();
                tokio::task::spawn_blocking(move || stop_interrupted_launch(&work, &request_id))
                    .await
                    .map_err(LocalError::Task)??;
            }
            Some(existing) => {
                info!(machine = %name, request_id = %req.request_id, pid = existing.pid, "VM exists already");
                return Ok(create_response(&existing));
            }
            None => {}
        }
        let launch = Launch {
            binary: self.config.node_binary.clone(),
            state,
            name,
            class_name: req.machine_class.metadata.name.clone().unwrap_or_default(),
            spec,
            kubeconfig: kubeconfig.to_string(),
            user_data: req.secret.get(USER_DATA_KEY).map(<[u8]>::to_vec),
            request_id: req.request_id.clone(),
        };
        let record = tokio::task::spawn_blocking(move || launch.run())
            .await
            .map_err(LocalError::Task)??;
        info!(machine = %record.machine_name, request_id = %req.request_id, pid = record.pid, "VM started");
        Ok(create_response(&record))
    }

    /// A kwok VM: its record (kept when it exists), then its Node (created unless it exists),
    /// so a retry after a failed Node creation finishes the job.
    async fn create_kwok(
        &self,
        req: &CreateMachineRequest,
        state: StateDirectory,
        name: String,
        spec: ProviderSpec,
        kubeconfig: &str,
    ) -> Result<CreateMachineResponse, LocalError> {
        let client = self.targets.get(kubeconfig).await?;
        let record = match state.read(&name)? {
            Some(existing) => existing,
            None => {
                let record = VmRecord {
                    machine_name: name.clone(),
                    class_name: req.machine_class.metadata.name.clone().unwrap_or_default(),
                    provider_id: state::provider_id(&name),
                    node_name: name.clone(),
                    pid: 0,
                    start_time: 0,
                    created_at: jiff::Timestamp::now(),
                    request_id: Some(req.request_id.to_string()),
                    node: NodeKind::Kwok,
                };
                state.write(&record)?;
                record
            }
        };
        let node = kwok::kwok_node(&record.node_name, &record.provider_id, &spec);
        kwok::ensure_node(&client, &node).await?;
        info!(machine = %name, request_id = %req.request_id, "kwok VM recorded and its Node created");
        Ok(create_response(&record))
    }

    async fn delete(&self, req: DeleteMachineRequest) -> Result<DeleteMachineResponse, LocalError> {
        let name = machine_name(&req.machine)?;
        let spec = parse_spec(&req.machine_class)?;
        let state = state_directory(&spec)?;
        let _guard = self.lock(state.record_path(&name)).await;
        let Some(record) = state.read(&name)? else {
            // No VM; clean up a working directory a crash may have left.
            state.remove(&name)?;
            return Ok(DeleteMachineResponse::default());
        };
        if record.node == NodeKind::Kwok {
            let kubeconfig = req.secret.get_str(KUBECONFIG_KEY).ok_or(
                LocalError::MissingSecretKey {
                    key: KUBECONFIG_KEY,
                    purpose: "the kubeconfig of the target cluster the VM's Node is deleted from",
                },
            )?;
            let client = self.targets.get(kubeconfig).await?;
            kwok::delete_node(&client, &record.node_name, &record.provider_id).await?;
            state.remove(&record.machine_name)?;
            info!(machine = %record.machine_name, request_id = %req.request_id, "kwok VM and its Node deleted");
            return Ok(DeleteMachineResponse::default());
        }
        let request_id = req.request_id.clone();
        let work = state.work_dir(&name);
        tokio::task::spawn_blocking(move || {
            if record.launch_pending() {
                stop_interrupted_launch(&work, &request_id)?;
            }
            stop_process(&record, &request_id)?;
            state.remove(&record.machine_name)?;
            info!(machine = %record.machine_name, request_id = %request_id, "VM deleted");
            Ok::<_, LocalError>(())
        })
        .await
        .map_err(LocalError::Task)??;
        Ok(DeleteMachineResponse::default())
    }

    /// The record of a machine's VM. A launch that did not finish counts as no VM yet: the
    /// controller then calls create, which finishes it (the orphan collector still sees it
    /// through `list`).
    fn status(&self, req: &GetMachineStatusRequest) -> Result<Option<VmRecord>, LocalError> {
        let name = machine_name(&req.machine)?;
        let spec = parse_spec(&req.machine_class)?;
        Ok(state_directory(&spec)?
            .read(&name)?
            .filter(|r| !r.launch_pending()))
    }

    fn list(&self, req: &ListMachinesRequest) -> Result<ListMachinesResponse, LocalError> {
        let spec = parse_spec(&req.machine_class)?;
        let state = state_directory(&spec)?;
        let class = req.machine_class.metadata.name.clone().unwrap_or_default();
        let (records, broken) = state.list()?;
        for err in broken {
            warn!(request_id = %req.request_id, error = %err, "skipping a corrupt VM record");
        }
        Ok(list_response(
            records.into_iter().filter(|r| r.class_name == class),
            state::check_liveness,
        ))
    }
}

/// Everything needed to start one VM.
struct Launch {
    binary: PathBuf,
    state: StateDirectory,
    name: String,
    class_name: String,
    spec: ProviderSpec,
    kubeconfig: String,
    user_data: Option<Vec<u8>>,
    request_id: RequestId,
}

impl Launch {
    /// Records the VM, prepares the working directory, starts the agent detached, and
    /// records its process. The record comes first: a crash at any point leaves a record
    /// (with pid 0 until the process is known), so no process is ever left unrecorded.
    fn run(self) -> Result<VmRecord, LocalError> {
        let mut record = VmRecord {
            machine_name: self.name.clone(),
            class_name: self.class_name.clone(),
            provider_id: state::provider_id(&self.name),
            node_name: self.name.clone(),
            pid: 0,
            start_time: 0,
            created_at: jiff::Timestamp::now(),
            request_id: Some(self.request_id.to_string()),
            node: NodeKind::Process,
        };
        self.state.write(&record)?;
        let work = self.state.work_dir(&self.name);
        fs::create_dir_all(&work).map_err(|e| LocalError::io("create directory", &work, e))?;
        let kubeconfig = work.join(KUBECONFIG_FILE);
        write_private(&kubeconfig, self.kubeconfig.as_bytes())?;
        let user_data = match &self.user_data {
            Some(data) => {
                let path = work.join(USER_DATA_FILE);
                write_private(&path, data)?;
                Some(path)
            }
            None => None,
        };
        let spec_path = work.join(SPEC_FILE);
        let spec_json = serde_json::to_vec_pretty(&self.spec).map_err(|e| {
            LocalError::io(
                "serialize the providerSpec for",
                &spec_path,
                io::Error::other(e),
            )
        })?;
        write_private(&spec_path, &spec_json)?;
        let log_path = work.join(LOG_FILE);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(|e| LocalError::io("open", &log_path, e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| LocalError::io("duplicate the handle of", &log_path, e))?;

        let args = AgentArgs {
            machine_name: &self.name,
            provider_id: &state::provider_id(&self.name),
            kubeconfig: &kubeconfig,
            user_data: user_data.as_deref(),
            spec: &spec_path,
            request_id: self.request_id.as_str(),
        }
        .to_args();
        let mut command = std::process::Command::new(&self.binary);
        command
            .args(&args)
            .current_dir(&work)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
        // which is async-signal-safe. A new session detaches the VM from the controller's
        // process group and terminal, so a Ctrl-C or restart of the controller spares it.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| nix::unistd::setsid().map(drop).map_err(io::Error::from));
        }
        let mut child = command.spawn().map_err(|source| LocalError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        let pid = child.id();
        let raw_pid = i32::try_from(pid).unwrap_or(i32::MAX);
        // Read before the child can be reaped: until it is waited for, even a child that
        // exited at once (a boot that fails at once) stays in /proc as a zombie, and is then
        // recorded and reported stopped. Read after the reaper started, such a child could be
        // gone already, and the create failed.
        let stat = state::read_proc_stat(raw_pid);
        // Reap the child whenever it exits, so it never lingers as a zombie of ours.
        std::thread::Builder::new()
            .name(format!("reap-{pid}"))
            .stack_size(64 * 1024)
            .spawn(move || {
                let _ = child.wait();
            })
            .map_err(|e| LocalError::io("start a reaper thread for", &self.binary, e))?;
        let Some(stat) = stat else {
            return Err(LocalError::VanishedAtStart { pid, log: log_path });
        };
        record.pid = raw_pid;
        record.start_time = stat.start_time;
        if let Err(e) = self.state.write(&record) {
            // Do not leave an unrecorded VM behind.
            let _ = kill(Pid::from_raw(raw_pid), Signal::SIGKILL);
            return Err(e.into());
        }
        Ok(record)
    }
}

/// The command line the driver passes to `local-node` (see [`crate::agent::AgentConfig`]).
#[derive(Debug, Clone, Copy)]
pub struct AgentArgs<'a> {
    /// `--machine-name`
    pub machine_name: &'a str,
    /// `--provider-id`
    pub provider_id: &'a str,
    /// `--kubeconfig`
    pub kubeconfig: &'a Path,
    /// `--user-data`
    pub user_data: Option<&'a Path>,
    /// `--spec`
    pub spec: &'a Path,
    /// `--request-id`
    pub request_id: &'a str,
}

impl AgentArgs<'_> {
    /// The arguments, in order.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--machine-name".into(),
            self.machine_name.into(),
            "--provider-id".into(),
            self.provider_id.into(),
            "--kubeconfig".into(),
            self.kubeconfig.into(),
            "--spec".into(),
            self.spec.into(),
            "--request-id".into(),
            self.request_id.into(),
        ];
        if let Some(user_data) = self.user_data {
            args.push("--user-data".into());
            args.push(user_data.into());
        }
        args
    }
}

/// Writes a file readable by its owner only.
fn write_private(path: &Path, data: &[u8]) -> Result<(), LocalError> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(data))
        .map_err(|e| LocalError::io("write", path, e))
}

/// SIGTERMs the VM process (if the record's pid still is the VM), waits up to
/// [`TERMINATE_GRACE`], then SIGKILLs it and waits for it to be gone.
/// Stops the process(es) an interrupted launch may have started for the VM working in
/// `work` (found by the spec path on their command line), and waits until they are gone.
fn stop_interrupted_launch(work: &Path, request_id: &RequestId) -> Result<(), LocalError> {
    let spec = work.join(SPEC_FILE);
    let began = Instant::now();
    let deadline = began + KILL_WAIT;
    loop {
        let left = state::processes_with_arg(&spec);
        let Some(&pid) = left.first() else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(LocalError::StillRunning {
                machine: work.display().to_string(),
                pid,
                waited: began.elapsed(),
            });
        }
        for pid in left {
            info!(request_id = %request_id, pid, "stopping the process of an interrupted launch");
            match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                Ok(()) | Err(nix::Error::ESRCH) => {}
                Err(source) => {
                    return Err(LocalError::Signal {
                        signal: Signal::SIGKILL,
                        pid,
                        source,
                    });
                }
            }
        }
        std::thread::sleep(EXIT_POLL);
    }
}

fn stop_process(record: &VmRecord, request_id: &RequestId) -> Result<(), LocalError> {
    if record.process_pid().is_none() {
        return Ok(());
    }
    let began = Instant::now();
    for (signal, wait) in [
        (Signal::SIGTERM, TERMINATE_GRACE),
        (Signal::SIGKILL, KILL_WAIT),
    ] {
        if !state::check_liveness(record).is_alive() {
            return Ok(());
        }
        info!(machine = %record.machine_name, request_id = %request_id, pid = record.pid, %signal, "stopping VM process");
        match kill(Pid::from_raw(record.pid), signal) {
            Ok(()) | Err(nix::Error::ESRCH) => {}
            Err(source) => {
                return Err(LocalError::Signal {
                    signal,
                    pid: record.pid,
                    source,
                });
            }
        }
        if signal == Signal::SIGTERM {
            // A VM cut off from the cluster with SIGSTOP (how the demo and the tests play a
            // network partition) acts on the SIGTERM once continued, as a cloud stops a VM it
            // cannot reach the guest of.
            let _ = kill(Pid::from_raw(record.pid), Signal::SIGCONT);
        }
        let deadline = Instant::now() + wait;
        while state::check_liveness(record).is_alive() && Instant::now() < deadline {
            std::thread::sleep(EXIT_POLL);
        }
    }
    if state::check_liveness(record).is_alive() {
        return Err(LocalError::StillRunning {
            machine: record.machine_name.clone(),
            pid: record.pid,
            waited: began.elapsed(),
        });
    }
    Ok(())
}

fn machine_name(machine: &Machine) -> Result<String, LocalError> {
    let name = machine.metadata.name.clone().unwrap_or_default();
    if is_dns_subdomain(&name) {
        Ok(name)
    } else {
        Err(LocalError::InvalidMachineName(name))
    }
}

/// A DNS-1123 subdomain (also guarantees the name is a safe file name).
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && !part.starts_with('-')
                && !part.ends_with('-')
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The provider name a local class may give in its `provider` field.
pub const PROVIDER: &str = "local";

/// The problems of a class's providerSpec, for the admission webhook: every bad field, none
/// for a class of another provider.
pub fn class_problems(class: &MachineClass) -> Vec<mcm_driver::SpecProblem> {
    if !mcm_driver::spec::is_for_provider(class, PROVIDER) {
        return Vec::new();
    }
    match ProviderSpec::from_value(&class.provider_spec) {
        Ok(_) => Vec::new(),
        Err(e) => e
            .problems
            .into_iter()
            .map(|p| mcm_driver::SpecProblem::new(p.field, p.message))
            .collect(),
    }
}

/// Parses and validates the providerSpec of a class (the error names every bad field).
pub fn parse_provider_spec(class: &MachineClass) -> Result<ProviderSpec, DriverError> {
    parse_spec(class).map_err(DriverError::from)
}

fn parse_spec(class: &MachineClass) -> Result<ProviderSpec, LocalError> {
    Ok(ProviderSpec::from_value(&class.provider_spec)?)
}

fn state_directory(spec: &ProviderSpec) -> Result<StateDirectory, LocalError> {
    spec.state_directory()
        .map(StateDirectory::new)
        .ok_or(LocalError::NoStateDirectory)
}

/// The addresses of every local VM: InternalIP 127.0.0.1 and its host name.
pub fn vm_addresses(node_name: &str) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: "127.0.0.1".into(),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: node_name.into(),
        },
    ]
}

fn create_response(record: &VmRecord) -> CreateMachineResponse {
    CreateMachineResponse {
        provider_id: record.provider_id.clone(),
        node_name: record.node_name.clone(),
        last_known_state: None,
        addresses: vm_addresses(&record.node_name),
    }
}

/// The VM resource of a record with the given liveness.
pub fn vm_resource(record: &VmRecord, liveness: Liveness) -> ResourceStatus {
    if record.launch_pending() {
        return ResourceStatus {
            kind: ResourceKind::Vm,
            id: record.provider_id.clone(),
            state: ResourceState::Stopped,
            message: Some(
                "its launch did not finish: the next create or delete stops whatever it started"
                    .into(),
            ),
        };
    }
    if record.node == NodeKind::Kwok {
        return ResourceStatus {
            kind: ResourceKind::Vm,
            id: record.provider_id.clone(),
            state: ResourceState::Running,
            message: Some("a VM without a process; kwok runs its Node".into()),
        };
    }
    let (state, message) = match liveness {
        Liveness::Alive => (
            ResourceState::Running,
            format!("process {} runs", record.pid),
        ),
        Liveness::Exited | Liveness::Zombie => (
            ResourceState::Stopped,
            format!(
                "process {} exited (the VM crashed or was stopped)",
                record.pid
            ),
        ),
        Liveness::PidReused => (
            ResourceState::Stopped,
            format!(
                "process {} exited (its pid belongs to another process now)",
                record.pid
            ),
        ),
    };
    ResourceStatus {
        kind: ResourceKind::Vm,
        id: record.provider_id.clone(),
        state,
        message: Some(message),
    }
}

fn status_response(record: &VmRecord, liveness: Liveness) -> GetMachineStatusResponse {
    GetMachineStatusResponse {
        provider_id: record.provider_id.clone(),
        node_name: record.node_name.clone(),
        addresses: vm_addresses(&record.node_name),
        resources: vec![vm_resource(record, liveness)],
    }
}

/// Builds a list response from records (already filtered by class) and a liveness check.
fn list_response(
    records: impl IntoIterator<Item = VmRecord>,
    liveness: impl Fn(&VmRecord) -> Liveness,
) -> ListMachinesResponse {
    let mut machines = BTreeMap::new();
    let mut resources = BTreeMap::new();
    for r in records {
        resources.insert(r.provider_id.clone(), vec![vm_resource(&r, liveness(&r))]);
        machines.insert(r.provider_id.clone(), r.machine_name.clone());
    }
    ListMachinesResponse {
        machines,
        resources,
    }
}

/// The volume id of a PersistentVolume spec in the local cloud: the CSI `volumeHandle`, or
/// the `hostPath` path; `None` for other volume sources.
pub fn volume_id(spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> Option<String> {
    if let Some(csi) = &spec.csi {
        return Some(csi.volume_handle.clone());
    }
    spec.host_path.as_ref().map(|h| h.path.clone())
}

#[async_trait]
impl Driver for LocalDriver {
    fn validate_machine_class(&self, class: &MachineClass) -> Vec<mcm_driver::SpecProblem> {
        class_problems(class)
    }

    async fn create_machine(
        &self,
        req: CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        Ok(self.create(req).await?)
    }

    async fn delete_machine(
        &self,
        req: DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        Ok(self.delete(req).await?)
    }

    async fn get_machine_status(
        &self,
        req: GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        match self.status(&req)? {
            Some(record) => Ok(status_response(&record, state::check_liveness(&record))),
            None => Err(DriverError::not_found(format!(
                "no VM for machine {:?} in the local cloud",
                req.machine.metadata.name.as_deref().unwrap_or_default()
            ))),
        }
    }

    async fn list_machines(
        &self,
        req: ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        Ok(self.list(&req)?)
    }

    async fn get_volume_ids(
        &self,
        req: GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        Ok(GetVolumeIdsResponse {
            volume_ids: req.pv_specs.iter().filter_map(volume_id).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, HostPathVolumeSource, NFSVolumeSource, PersistentVolumeSpec,
    };

    fn record(name: &str) -> VmRecord {
        VmRecord {
            machine_name: name.into(),
            class_name: "c".into(),
            provider_id: state::provider_id(name),
            node_name: name.into(),
            pid: 1,
            start_time: 1,
            created_at: jiff::Timestamp::UNIX_EPOCH,
            request_id: None,
            node: NodeKind::Process,
        }
    }

    /// A record's lock serialises the calls for its path and is forgotten once none holds
    /// or waits for it: after a churn of machines the driver keeps no entry per machine.
    #[tokio::test]
    async fn a_records_lock_is_forgotten_once_no_call_holds_or_waits_for_it() {
        let driver = Arc::new(LocalDriver::new(LocalDriverConfig {
            node_binary: PathBuf::from("local-node"),
        }));
        let key = PathBuf::from("state/m-1.json");
        let first = driver.lock(key.clone()).await;
        let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::channel(1);
        let waiter = tokio::spawn({
            let driver = driver.clone();
            let key = key.clone();
            async move {
                let _second = driver.lock(key).await;
                acquired_tx.send(()).await.expect("the test waits");
                // Hold the lock until the test has looked at the map.
                acquired_tx.closed().await;
            }
        });
        // The waiter's reference (beside the map's and the first guard's) is taken under the
        // map's mutex before it waits.
        let waiting = |driver: &LocalDriver| {
            driver
                .locks
                .map()
                .get(&key)
                .is_some_and(|l| Arc::strong_count(l) == 3)
        };
        for _ in 0..100_000 {
            if waiting(&driver) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(waiting(&driver), "the second call never asked for the lock");
        assert!(acquired_rx.try_recv().is_err(), "the second call waits");
        drop(first);
        acquired_rx
            .recv()
            .await
            .expect("the second call gets the lock");
        assert_eq!(
            driver.locks.map().len(),
            1,
            "kept while the second call holds it"
        );
        drop(acquired_rx);
        waiter.await.expect("the waiter");
        assert!(
            driver.locks.map().is_empty(),
            "forgotten once nobody holds it"
        );
        for i in 0..100 {
            drop(
                driver
                    .lock(PathBuf::from(format!("state/m-{i}.json")))
                    .await,
            );
        }
        assert!(
            driver.locks.map().is_empty(),
            "no entry per machine after a churn"
        );
    }

    /// A call dropped while it waits for a record's lock (a reconcile cancelled at shutdown or
    /// by a timeout) leaves no entry behind, also when the lock was handed to it just before.
    #[tokio::test]
    async fn a_record_lock_awaited_by_a_dropped_call_is_forgotten() {
        let driver = Arc::new(LocalDriver::new(LocalDriverConfig {
            node_binary: PathBuf::from("local-node"),
        }));
        let key = PathBuf::from("state/m-1.json");
        let first = driver.lock(key.clone()).await;
        let waiter = tokio::spawn({
            let driver = driver.clone();
            let key = key.clone();
            async move { drop(driver.lock(key).await) }
        });
        let waiting = |driver: &LocalDriver| {
            driver
                .locks
                .map()
                .get(&key)
                .is_some_and(|l| Arc::strong_count(l) == 3)
        };
        for _ in 0..100_000 {
            if waiting(&driver) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(waiting(&driver), "the second call never asked for the lock");
        // Released while the second call waits: the entry stays for it. The waiter is then
        // dropped before it runs again (this test's runtime has one thread), so it never
        // takes the lock it was handed.
        drop(first);
        assert_eq!(driver.locks.map().len(), 1, "kept for the waiting call");
        waiter.abort();
        assert!(waiter.await.expect_err("aborted").is_cancelled());
        assert!(
            driver.locks.map().is_empty(),
            "forgotten with the dropped call"
        );
    }

    #[test]
    fn finds_the_node_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deps = dir.path().join("deps");
        fs::create_dir_all(&deps).expect("mkdir");
        let exe = deps.join("test-abc");
        // Absent everywhere: the error names the variable and every path tried.
        let err = find_node_binary(None, &exe).expect_err("absent");
        let msg = err.to_string();
        assert!(msg.contains(NODE_BINARY_ENV), "{msg}");
        assert!(
            msg.contains(&deps.join("local-node").display().to_string()),
            "{msg}"
        );
        assert!(
            msg.contains(&dir.path().join("local-node").display().to_string()),
            "{msg}"
        );
        assert_eq!(err.code(), Code::FailedPrecondition);
        // In the parent directory (cargo's deps layout).
        fs::write(dir.path().join("local-node"), "").expect("write");
        assert_eq!(
            find_node_binary(None, &exe).expect("found"),
            dir.path().join("local-node")
        );
        // Next to the executable wins over the parent.
        fs::write(deps.join("local-node"), "").expect("write");
        assert_eq!(
            find_node_binary(None, &exe).expect("found"),
            deps.join("local-node")
        );
        // The variable wins over both.
        let explicit = dir.path().join("elsewhere");
        fs::write(&explicit, "").expect("write");
        assert_eq!(
            find_node_binary(Some(explicit.clone()), &exe).expect("found"),
            explicit
        );
    }

    #[test]
    fn machine_names_must_be_safe_file_names() {
        assert!(is_dns_subdomain("worker-1.a"));
        for bad in ["", "..", "a/b", "Upper", "-a", "a..b"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn resources_reflect_liveness() {
        let r = record("a");
        assert_eq!(
            vm_resource(&r, Liveness::Alive).state,
            ResourceState::Running
        );
        assert_eq!(
            vm_resource(&r, Liveness::Exited).state,
            ResourceState::Stopped
        );
        assert_eq!(
            vm_resource(&r, Liveness::Zombie).state,
            ResourceState::Stopped
        );
        assert_eq!(
            vm_resource(&r, Liveness::PidReused).state,
            ResourceState::Stopped
        );
        let list = list_response([record("a"), record("b")], |r| {
            if r.machine_name == "a" {
                Liveness::Alive
            } else {
                Liveness::Exited
            }
        });
        assert_eq!(list.machines["local:///a"], "a");
        assert_eq!(list.machines["local:///b"], "b");
        assert_eq!(
            list.resources["local:///b"][0].state,
            ResourceState::Stopped
        );
        let status = status_response(&r, Liveness::Alive);
        assert_eq!(status.addresses, vm_addresses("a"));
        assert_eq!(status.provider_id, "local:///a");
    }

    #[test]
    fn volume_ids() {
        let csi = PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: "vol-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let host = PersistentVolumeSpec {
            host_path: Some(HostPathVolumeSource {
                path: "/data".into(),
                type_: None,
            }),
            ..Default::default()
        };
        let nfs = PersistentVolumeSpec {
            nfs: Some(NFSVolumeSource {
                path: "/x".into(),
                server: "s".into(),
                read_only: None,
            }),
            ..Default::default()
        };
        let ids: Vec<_> = [csi, nfs, host].iter().filter_map(volume_id).collect();
        assert_eq!(ids, ["vol-1", "/data"]);
    }

    #[test]
    fn errors_map_to_codes_and_keep_causes() {
        let spec_err =
            ProviderSpec::from_value(&serde_json::json!({"cpu": "1"})).expect_err("invalid");
        let d: DriverError = LocalError::from(spec_err).into();
        assert_eq!(d.code, Code::InvalidArgument);
        assert!(d.message.contains("providerSpec.cpu"), "{}", d.message);

        let io = io::Error::new(io::ErrorKind::PermissionDenied, "nope");
        let d: DriverError = LocalError::io("write", Path::new("/x"), io).into();
        assert_eq!(d.code, Code::Internal);
        assert_eq!(d.full_message(), "Internal: failed to write /x: nope");
        let cause = std::error::Error::source(&d)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .expect("typed source");
        assert_eq!(cause.kind(), io::ErrorKind::PermissionDenied);

        let d: DriverError = LocalError::MissingSecretKey {
            key: KUBECONFIG_KEY,
            purpose: "x",
        }
        .into();
        assert_eq!(d.code, Code::InvalidArgument);
        assert!(d.message.contains("\"kubeconfig\""));
    }
}
