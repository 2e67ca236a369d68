//! What `cargo xtask e2e` and `cargo xtask demo` share: the binaries, the control plane,
//! controller processes, VM processes, applying objects, bounded waits.

use mcm_testenv::kit::{Outcome, http_get, metric, try_eventually};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{GroupVersionKind, TypeMeta};
use kube::discovery::Scope;
use mcm_provider_local::StateDirectory;
use mcm_provider_local::state;
use mcm_testenv::process::{ManagedProcess, log_tail, process_alive};
use mcm_testenv::{Components, ControlPlane, Options};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;

/// Field manager of everything the xtask applies.
const FIELD_MANAGER: &str = "mcm-xtask";

/// The workspace binaries the demo and the e2e suite run.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `machine-controller-manager` (MachineSets, MachineDeployments).
    pub manager: PathBuf,
    /// `machine-controller-local` (machine controller with the local provider).
    pub machine_controller: PathBuf,
    /// `local-node` (a local VM).
    pub local_node: PathBuf,
}

/// Asks the processes this one starts for logs without ANSI colours (they go to files).
/// Call it first thing, while this process has one thread.
pub fn plain_logs_for_children() {
    // SAFETY: called from `main`'s thread before any other thread exists (no runtime, no
    // supervisor thread yet), so nothing reads the environment concurrently.
    unsafe { std::env::set_var("NO_COLOR", "1") };
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    let root = crate::crds::workspace_root();
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// Makes sure the control-plane binaries exist (unless `KUBEBUILDER_ASSETS` names them) and
/// builds the workspace binaries.
/// A `cargo` command for a nested build. `cargo run` (behind `cargo xtask`) sets variables
/// such as `CARGO_MANIFEST_DIR` for the xtask binary; a build script that tracks one (ring's
/// does) would see it change and rebuild everything above it on every `cargo xtask` run, and
/// again on the next plain build. They are removed.
pub fn cargo_command() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    command_without_cargo_run_env(cargo)
}

/// A command for `program` without the variables `cargo run` set for the xtask binary (see
/// [`cargo_command`]): a test binary run by `cargo xtask test` gets its own package's.
pub fn command_without_cargo_run_env(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if name == "CARGO_MANIFEST_DIR"
            || name == "CARGO_MANIFEST_PATH"
            || name == "CARGO_CRATE_NAME"
            || name == "CARGO_PRIMARY_PACKAGE"
            || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
        {
            cmd.env_remove(name);
        }
    }
    cmd
}

pub fn prepare_binaries() -> Result<Binaries> {
    prepare_binaries_in(Profile::Debug)
}

/// The cargo profile binaries are built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `dev` (`target/debug`).
    Debug,
    /// `release` (`target/release`), for benchmarks.
    Release,
    /// `fast-release` (`target/fast-release`): optimised without LTO, for short benchmarks
    /// that check ratios and request counts, not code size.
    FastRelease,
}

/// The packages whose binaries [`prepare_binaries_in`] builds: the controllers and the local
/// VM. In the debug profile xtask is built with them (see `cargo xtask features`).
pub const BINARY_PACKAGES: [&str; 3] = [
    "machine-controller-manager",
    "machine-controller-local",
    "mcm-provider-local",
];

/// [`prepare_binaries`] in the given profile.
pub fn prepare_binaries_in(profile: Profile) -> Result<Binaries> {
    prepare_binaries_for(profile, None)
}

/// [`prepare_binaries`] in the given profile, for `target` (`None`: the host's).
pub fn prepare_binaries_for(profile: Profile, target: Option<&str>) -> Result<Binaries> {
    if std::env::var_os(mcm_testenv::binaries::ASSETS_ENV).is_none() {
        // The demo and the scenarios run no kwok: building it would cost a first run minutes.
        crate::testenv::ensure_control_plane(false)
            .context("preparing the control-plane binaries")?;
    }
    let mut args = vec!["build", "--bins"];
    for package in BINARY_PACKAGES {
        args.extend(["-p", package]);
    }
    match profile {
        // With xtask in the selection the build resolves the dependencies' features as
        // `cargo xtask` itself does (xtask depends on mcm-core for that): the debug build of
        // the dependency tree that runs this serves the binaries too.
        Profile::Debug => args.extend(["-p", "xtask"]),
        Profile::Release => args.push("--release"),
        Profile::FastRelease => args.extend(["--profile", "fast-release"]),
    }
    if let Some(target) = target {
        args.extend(["--target", target]);
    }
    eprintln!("building the binaries: cargo {}", args.join(" "));
    let status = cargo_command()
        .current_dir(crate::crds::workspace_root())
        .args(&args)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    let dir = target
        .map_or_else(target_dir, |t| target_dir().join(t))
        .join(match profile {
            Profile::Debug => "debug",
            Profile::Release => "release",
            Profile::FastRelease => "fast-release",
        });
    let bins = Binaries {
        manager: dir.join("machine-controller-manager"),
        machine_controller: dir.join("machine-controller-local"),
        local_node: dir.join("local-node"),
    };
    for b in [&bins.manager, &bins.machine_controller, &bins.local_node] {
        if !b.is_file() {
            bail!("{} is missing after the build", b.display());
        }
    }
    Ok(bins)
}

/// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler with the CRDs;
/// with `audit_writes` the API server logs every write (see
/// [`ControlPlane::audit_log_path`]).
pub async fn start_control_plane(audit_writes: bool) -> Result<ControlPlane> {
    let began = Instant::now();
    let cp = ControlPlane::start(Options {
        components: Components::ALL,
        audit_writes,
        ..Options::default()
    })
    .await
    .context("starting the control plane")?;
    eprintln!(
        "control plane up in {:.1}s at {} (logs in {})",
        began.elapsed().as_secs_f64(),
        cp.server_url(),
        cp.run_dir().display()
    );
    Ok(cp)
}

/// Copies the control plane's `*.log` files to `dest` (its run directory is removed when it
/// stops).
pub fn preserve_control_plane_logs(cp: &ControlPlane, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let entries = std::fs::read_dir(cp.run_dir())
        .with_context(|| format!("reading {}", cp.run_dir().display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let to = dest.join(entry.file_name());
            std::fs::copy(&path, &to)
                .with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
        }
    }
    Ok(())
}

/// Which controller binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// `machine-controller-manager`.
    Manager,
    /// `machine-controller-local --controllers=machine`.
    Machine,
}

/// How to start one controller process.
#[derive(Debug, Clone)]
pub struct ControllerSpec {
    /// Which binary.
    pub kind: ControllerKind,
    /// Name of the process and of its log file (`<name>.log`).
    pub name: String,
    /// `--namespace`.
    pub namespace: String,
    /// `--control-kubeconfig`.
    pub control_kubeconfig: PathBuf,
    /// `--target-kubeconfig`.
    pub target_kubeconfig: PathBuf,
    /// Further flags (later flags win).
    pub extra: Vec<String>,
    /// Extra environment variables (e.g. `MCM_DRIVER_FAULTS`).
    pub env: Vec<(String, String)>,
}

/// A running controller process (its own process group, killed on drop and when this
/// process dies).
#[derive(Debug)]
pub struct Controller {
    /// The name given in its [`ControllerSpec`].
    pub name: String,
    /// The port of `/metrics`, `/healthz`, `/readyz`.
    pub port: u16,
    process: ManagedProcess,
}

impl Controller {
    /// Starts the controller with its output in `<log_dir>/<name>.log`; its process group is
    /// recorded in the control plane's run directory (swept should this process die).
    pub fn spawn(
        bins: &Binaries,
        cp: &ControlPlane,
        log_dir: &Path,
        spec: &ControllerSpec,
    ) -> Result<Controller> {
        let port = free_port()?;
        let program = match spec.kind {
            ControllerKind::Manager => &bins.manager,
            ControllerKind::Machine => &bins.machine_controller,
        };
        let mut args = vec![
            format!("--control-kubeconfig={}", spec.control_kubeconfig.display()),
            format!("--target-kubeconfig={}", spec.target_kubeconfig.display()),
            format!("--namespace={}", spec.namespace),
            format!("--port={port}"),
            "--address=127.0.0.1".into(),
            "--leader-elect=false".into(),
        ];
        if spec.kind == ControllerKind::Machine {
            args.push("--controllers=machine".into());
        }
        args.extend(spec.extra.iter().cloned());
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let process = ManagedProcess::spawn_with_env(
            &spec.name,
            program,
            &args,
            &spec.env,
            log_dir.join(format!("{}.log", spec.name)),
            cp.run_dir(),
        )
        .with_context(|| format!("starting {}", spec.name))?;
        Ok(Controller {
            name: spec.name.clone(),
            port,
            process,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// SIGKILL (the whole process group).
    pub fn kill(&self) {
        self.process.kill();
    }

    /// SIGSTOP (the whole process group): the process stays but does nothing, as in a long
    /// pause of its VM or a stalled node.
    pub fn pause(&self) {
        let _ = killpg(Pid::from_raw(self.pid() as i32), Signal::SIGSTOP);
    }

    /// SIGCONT after [`Controller::pause`].
    pub fn resume(&self) {
        let _ = killpg(Pid::from_raw(self.pid() as i32), Signal::SIGCONT);
    }

    /// Whether the process still runs.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(self, grace: Duration) {
        let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while process_alive(self.pid()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Dropping the process kills its group.
    }

    /// Waits until `/readyz` answers 200 (caches synced), failing early when the process exits.
    pub async fn await_ready(&self, timeout: Duration) -> Result<()> {
        let began = Instant::now();
        loop {
            if !self.process.is_running() {
                bail!(
                    "{} exited; last lines of {}:\n{}",
                    self.name,
                    self.log().display(),
                    log_tail(self.log(), 20)
                );
            }
            let answer = http_get(self.port, "/readyz").await;
            if answer.as_deref().and_then(status_code) == Some(200) {
                return Ok(());
            }
            if began.elapsed() > timeout {
                let answer = answer.map_or("no answer".to_string(), |a| {
                    a.lines().next().unwrap_or_default().to_string()
                });
                bail!(
                    "{} (pid {}, port {}) not ready within {timeout:?}: /readyz: {answer}; log {}",
                    self.name,
                    self.pid(),
                    self.port,
                    self.log().display(),
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value of a metric on `/metrics` (summed over label sets), `None` when absent or
    /// unreachable.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        metric(&self.metrics_text().await?, name)
    }

    /// The text of `/metrics`, `None` when unreachable.
    pub async fn metrics_text(&self) -> Option<String> {
        http_get(self.port, "/metrics").await
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(mcm_testenv::kit::free_port())
}

/// The status code of an HTTP response.
fn status_code(response: &str) -> Option<u16> {
    response.lines().next()?.split(' ').nth(1)?.parse().ok()
}

/// A live process: pid and command line.
#[derive(Debug, Clone)]
pub struct ProcessInfo {
    /// The pid.
    pub pid: i32,
    /// The command line, arguments joined by spaces.
    pub cmdline: String,
}

/// Live processes (not this one, not zombies) whose command line mentions one of `needles`.
/// Whether a process's arguments name the directory `dir` or a path in it (as a path: the
/// directory `/e2e/run-1` is not mentioned by `/e2e/run-1-shard-1-of-2/x`, a job's beside it).
fn mentions(args: &[String], dir: &str) -> bool {
    let inside = format!("{}/", dir.trim_end_matches('/'));
    args.iter()
        .any(|a| a == dir || a.contains(&inside) || a.ends_with(&format!("={dir}")))
}

pub fn processes_mentioning(needles: &[&Path]) -> Vec<ProcessInfo> {
    let me = std::process::id() as i32;
    let needles: Vec<String> = needles
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let mut found: Vec<ProcessInfo> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me && process_alive(*pid as u32))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            needles
                .iter()
                .any(|n| mentions(&args, n))
                .then(|| ProcessInfo {
                    pid,
                    cmdline: args.join(" "),
                })
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// The live `local-node` processes started from the state directory `root` (recorded or
/// not).
pub fn vm_processes(root: &Path) -> Vec<ProcessInfo> {
    processes_mentioning(&[root])
        .into_iter()
        .filter(|p| {
            p.cmdline
                .split(' ')
                .next()
                .is_some_and(|a| a.ends_with("local-node"))
        })
        .collect()
}

/// How many live `local-node` processes (VMs) each machine of state directory `root` has, by
/// the machine's work directory (`<root>/vms/<machine>/`) on their command lines.
pub fn vm_processes_per_machine(root: &Path) -> BTreeMap<String, usize> {
    let vms = root.join("vms");
    let prefix = format!("{}/", vms.display());
    let mut out = BTreeMap::new();
    for p in vm_processes(root) {
        let machine = p.cmdline.split(' ').find_map(|arg| {
            let rest = arg.strip_prefix(&prefix)?;
            rest.split('/').next().filter(|m| !m.is_empty())
        });
        if let Some(machine) = machine {
            *out.entry(machine.to_string()).or_default() += 1;
        }
    }
    out
}

/// SIGKILLs every VM of a state directory: the recorded ones and any `local-node` process
/// whose command line names the directory. Returns the pids killed.
pub fn kill_vms(state_dir: &StateDirectory) -> Vec<i32> {
    let mut killed = state::kill_all_recorded(state_dir);
    for p in vm_processes(state_dir.root()) {
        if kill(Pid::from_raw(p.pid), Signal::SIGKILL).is_ok() && !killed.contains(&p.pid) {
            killed.push(p.pid);
        }
    }
    killed
}

/// Waits (bounded) until no process mentions `needles`; returns those still alive.
pub async fn await_no_process(needles: &[&Path], timeout: Duration) -> Vec<ProcessInfo> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_mentioning(needles);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Server-side applies one object (any kind the API server knows), in `namespace` unless the
/// object names its own. Returns the applied object.
pub async fn apply(client: &kube::Client, namespace: &str, obj: &Value) -> Result<DynamicObject> {
    let types: TypeMeta =
        serde_json::from_value(obj.clone()).context("the object has no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types).context("parsing apiVersion")?;
    let name = obj["metadata"]["name"]
        .as_str()
        .with_context(|| format!("a {} without metadata.name", types.kind))?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the API server does not serve {}", types.kind))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or(namespace);
            Api::namespaced_with(client.clone(), ns, &resource)
        }
    };
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("applying {} {name}", types.kind))
}

/// The outcome of one look at the world while waiting.
pub enum Check<T> {
    /// The condition holds.
    Done(T),
    /// Not yet; what was seen (reported on timeout).
    Pending(String),
}

impl<T> Outcome for Check<T> {
    type Value = T;
    fn judge(self) -> Result<T, String> {
        match self {
            Check::Done(v) => Ok(v),
            Check::Pending(seen) => Err(seen),
        }
    }
}

/// Polls `look` (the kit's [`try_eventually`]) until it reports [`Check::Done`], failing
/// after `timeout` with `what` and the last thing seen; a look still running then is cut
/// off. Errors of `look` are retried (and reported on timeout).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut look: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let found = try_eventually(timeout, what, || {
        let looking = look();
        async move {
            looking
                .await
                .unwrap_or_else(|e| Check::Pending(format!("error: {e:#}")))
        }
    })
    .await?;
    Ok(found)
}

/// Replaces every string value equal to a key of `vars` by its value (placeholders such as
/// `${TARGET_KUBECONFIG}` in the example manifests).
pub fn substitute(value: &mut Value, vars: &[(&str, &str)]) {
    match value {
        Value::String(s) => {
            if let Some((_, v)) = vars.iter().find(|(k, _)| k == s) {
                *s = (*v).to_string();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| substitute(v, vars)),
        Value::Object(map) => map.values_mut().for_each(|v| substitute(v, vars)),
        _ => {}
    }
}

/// The documents of a multi-document YAML text (empty documents skipped).
pub fn yaml_documents(text: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| anyhow::anyhow!("invalid YAML: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_mentions_a_directory_by_path_not_by_a_longer_name() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dir = "/t/e2e/run-17";
        assert!(mentions(
            &args(&["local-node", "--spec", "/t/e2e/run-17/vm/spec.json"]),
            dir
        ));
        assert!(mentions(&args(&["x", "/t/e2e/run-17"]), dir));
        assert!(mentions(&args(&["x", "--state=/t/e2e/run-17"]), dir));
        assert!(!mentions(
            &args(&[
                "local-node",
                "--spec",
                "/t/e2e/run-17-shard-1-of-2/vm/spec.json"
            ]),
            dir
        ));
        assert!(!mentions(&args(&["x", "/t/e2e/run-170/a"]), dir));
    }
    use serde_json::json;

    #[test]
    fn placeholders_are_replaced_in_whole_string_values_only() {
        let mut v = json!({"a": "${X}", "b": ["${X}", "keep ${X}"], "c": 1});
        substitute(&mut v, &[("${X}", "line1\nline2")]);
        assert_eq!(
            v,
            json!({"a": "line1\nline2", "b": ["line1\nline2", "keep ${X}"], "c": 1})
        );
    }

    #[test]
    fn multi_document_yaml_is_split() {
        let docs = yaml_documents("# c\na: 1\n---\n---\nb: \"2\"\n").unwrap();
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": "2"})]);
    }
}
