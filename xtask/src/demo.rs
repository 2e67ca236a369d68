//! `cargo xtask demo`: a local cluster with both controllers, three local machines and a
//! workload, shown live until Ctrl-C (see docs/demo.md).
//!
//! Set-up: control-plane binaries (`cargo xtask testenv`), `cargo build --bins`, the control
//! plane in this process, `machine-controller-manager` and `machine-controller-local` as
//! processes, then `docs/examples/*.yaml` applied. Everything lives in `target/demo/`: the
//! controllers' logs in `logs/`, the VM records and VM logs in `vms/` (`$MCM_DEMO_DIR`
//! instead of `target/demo/` when set). Ctrl-C (or SIGTERM, SIGHUP) stops every process and
//! checks that none is left.
//!
//! Stopping must not depend on anyone reading the output. The VMs run detached (like real
//! VMs, so that they survive controller restarts): if this process does not kill them, nothing
//! does. With `cargo xtask demo | tee demo.log`, Ctrl-C kills `tee` as well, every later write
//! to stdout fails with a broken pipe, and since Rust ignores SIGPIPE, `println!` would panic
//! and skip the clean-up. Hence: all output goes through [`say`], [`show`] and [`note`], which
//! ignore write errors; the shutdown stops everything before it writes anything; a failed
//! write in the live view stops the demo (nobody is watching any more); and [`VmReaper`] kills
//! the VMs even when the demo panics. A demo killed with SIGKILL loses its control plane and
//! controllers with it (they die with their parent); its VMs are killed by the next demo
//! ([`reset_dir`]).

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use mcm_api::{Machine, MachineClass, MachinePhase};
use mcm_provider_local::StateDirectory;
use mcm_testenv::ControlPlane;
use serde_json::json;
use tokio::sync::Notify;

use crate::e2e::env::{
    self, Binaries, Check, Controller, ControllerKind, ControllerSpec, ProcessInfo, kill_vms,
};

/// The environment variable naming the demo's directory (default `<target>/demo`).
pub const DIR_ENV: &str = "MCM_DEMO_DIR";

/// The namespace of `docs/examples/`.
const NAMESPACE: &str = "mcm-demo";
/// The MachineDeployment of `docs/examples/` and its replicas.
const DEPLOYMENT: &str = "workers";
const MACHINES: usize = 3;
/// The workload Deployment of `docs/examples/` and its replicas.
const WORKLOAD: &str = "web";
const WORKLOAD_REPLICAS: i32 = 3;

/// The ValidatingWebhookConfiguration the demo's machine controller publishes its CA into.
const WEBHOOK_CONFIGURATION: &str = "mcm-demo";

/// Whose machine controller the demo runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// `machine-controller-local`: each VM is a `local-node` process that also runs the
    /// workload's pods.
    Local,
    /// `examples/provider-skeleton`, the out-of-tree provider on mcm-core alone: its VMs
    /// register Ready Nodes but run no pods, so the workload is not applied.
    Skeleton,
}

impl Provider {
    /// Whether its VMs run pods (the workload of `docs/examples/`).
    fn runs_pods(self) -> bool {
        self == Provider::Local
    }
}

/// The example that needs VMs running pods.
const WORKLOAD_FILE: &str = "30-workload.yaml";

/// Runs the demo with `provider`'s machine controller; with `exit_when_ready`, a one-shot
/// check bounded by `timeout`.
pub fn run(exit_when_ready: bool, timeout: Duration, provider: Provider) -> Result<()> {
    env::plain_logs_for_children();
    let mut bins = env::prepare_binaries()?;
    if provider == Provider::Skeleton {
        bins.machine_controller = skeleton_binary()?;
    }
    let dir = demo_dir()?;
    reset_dir(&dir)?;
    // Declared before the runtime, so dropped after it and after the demo's future (which
    // owns the controllers and the control plane), on every way out, panics included.
    let _reaper = VmReaper(StateDirectory::new(dir.join("vms")));
    let runtime = tokio::runtime::Runtime::new()?;
    let mode = if exit_when_ready {
        Mode::ExitWhenReady(timeout)
    } else {
        Mode::Live
    };
    runtime.block_on(demo(&bins, &dir, mode, provider))
}

/// The provider skeleton's package (examples/provider-skeleton), whose binary has its name.
pub const SKELETON_PACKAGE: &str = "machine-controller-skeleton";

/// Builds the provider skeleton's binary.
fn skeleton_binary() -> Result<PathBuf> {
    const PACKAGE: &str = SKELETON_PACKAGE;
    eprintln!("building the provider skeleton: cargo build --bins -p {PACKAGE} -p xtask");
    // xtask in the selection: the dependencies' features as `cargo xtask` has them, so its
    // debug build of the dependency tree serves the skeleton too (see `env::prepare_binaries`).
    let status = env::cargo_command()
        .current_dir(crate::crds::workspace_root())
        .args(["build", "--bins", "-p", PACKAGE, "-p", "xtask"])
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build -p {PACKAGE} failed ({status})");
    }
    let binary = env::target_dir().join("debug").join(PACKAGE);
    if !binary.is_file() {
        bail!("{} is missing after the build", binary.display());
    }
    Ok(binary)
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Live,
    ExitWhenReady(Duration),
}

/// `$MCM_DEMO_DIR` (made absolute: the controllers and VMs get paths in it), else
/// `<target>/demo`.
fn demo_dir() -> Result<PathBuf> {
    match std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        Some(d) => std::path::absolute(&d)
            .with_context(|| format!("{DIR_ENV}={}", Path::new(&d).display())),
        None => Ok(env::target_dir().join("demo")),
    }
}

/// Removes what an earlier demo left in `logs/` and `vms/` (killing its VMs, should it have
/// died without cleaning up, e.g. by SIGKILL) and creates them afresh. Nothing else in `dir`
/// is touched.
fn reset_dir(dir: &Path) -> Result<()> {
    let killed = kill_vms(&StateDirectory::new(dir.join("vms")));
    if !killed.is_empty() {
        note(format_args!(
            "killed {} VMs left by an earlier demo",
            killed.len()
        ));
    }
    for sub in ["logs", "vms"] {
        let d = dir.join(sub);
        match std::fs::remove_dir_all(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", d.display())),
        }
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    Ok(())
}

/// Kills the VMs of the demo's state directory when dropped, also while unwinding from a
/// panic: they run detached, so nothing else would (the controllers and the control plane die
/// with their owners).
struct VmReaper(StateDirectory);

impl Drop for VmReaper {
    fn drop(&mut self) {
        let killed = kill_vms(&self.0);
        if !killed.is_empty() {
            note(format_args!("killed {} VMs on the way out", killed.len()));
        }
    }
}

/// Writes a line to stdout; `false` when that failed (stdout is a pipe nobody reads any
/// more). Unlike `println!`, never panics.
fn say(text: impl Display) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
}

/// [`say`] without the newline (a terminal's redraws).
fn show(text: impl Display) -> bool {
    let mut out = std::io::stdout().lock();
    write!(out, "{text}").and_then(|()| out.flush()).is_ok()
}

/// Writes a line to stderr, ignoring failures (stderr may be a closed pipe too).
fn note(text: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Why the demo ends.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// `--exit-when-ready`: it was ready.
    Ready,
    /// Ctrl-C, SIGTERM or SIGHUP, named.
    Signal(&'static str),
    /// Writing to stdout failed: the viewer is gone (e.g. the `tee` of `| tee` was killed by
    /// the same Ctrl-C).
    ViewerGone,
}

/// Starts everything, runs until done or interrupted, and always stops everything, before
/// writing anything more.
async fn demo(bins: &Binaries, dir: &Path, mode: Mode, provider: Provider) -> Result<()> {
    let cp = env::start_control_plane(false).await?;
    let mut controllers = Vec::new();
    let outcome = tokio::select! {
        r = run_demo(&cp, bins, dir, mode, provider, &mut controllers) => r,
        signal = interrupted() => Ok(Stop::Signal(signal)),
    };
    let stopped = shutdown(cp, controllers, dir).await;
    match &outcome {
        Ok(Stop::Ready) => {}
        Ok(Stop::Signal(signal)) => {
            say(format_args!("\n{signal}: stopped the demo"));
        }
        Ok(Stop::ViewerGone) => note("stdout was closed: stopped the demo"),
        Err(e) => {
            say(format_args!("\ndemo failed: {e:#}"));
        }
    }
    let checked = stopped.report(dir);
    outcome.map(drop).and(checked)
}

/// Resolves on Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal went away), naming it. Once
/// polled, these signals no longer end the process (a second Ctrl-C does not cut the
/// shutdown short).
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    async fn on(kind: SignalKind) {
        match signal(kind) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    }
    tokio::select! {
        _ = on(SignalKind::interrupt()) => "Ctrl-C",
        _ = on(SignalKind::terminate()) => "SIGTERM",
        _ = on(SignalKind::hangup()) => "SIGHUP",
    }
}

async fn run_demo(
    cp: &ControlPlane,
    bins: &Binaries,
    dir: &Path,
    mode: Mode,
    provider: Provider,
    controllers: &mut Vec<Controller>,
) -> Result<Stop> {
    let client = cp.client().await.context("building a client")?;
    // The machine controller serves the admission webhook: its configuration and the
    // namespace of its certificate Secret exist before it starts.
    let webhook_port = env::free_port()?;
    env::apply(
        &client,
        NAMESPACE,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )
    .await?;
    // Fail: while the webhook cannot be reached, the demo namespace's machine objects
    // cannot be written.
    let configuration = mcm_testenv::kit::webhook_configuration(
        WEBHOOK_CONFIGURATION,
        NAMESPACE,
        webhook_port,
        "Fail",
    );
    env::apply(&client, NAMESPACE, &configuration).await?;
    for spec in controller_specs(cp, webhook_port) {
        let c = Controller::spawn(bins, cp, &dir.join("logs"), &spec)?;
        say(format_args!(
            "started {} (pid {}, metrics on http://127.0.0.1:{}/metrics)",
            c.name,
            c.pid(),
            c.port
        ));
        controllers.push(c);
    }
    for c in controllers.iter() {
        c.await_ready(Duration::from_secs(60)).await?;
    }
    let refusal = await_webhook(&client).await?;
    say(format_args!(
        "admission webhook on https://127.0.0.1:{webhook_port}/validate refuses a class without a secretRef and with cpu: abc: {refusal}"
    ));
    apply_examples(&client, cp, dir, provider).await?;
    let view = View::start(client);
    let began = Instant::now();
    match mode {
        Mode::ExitWhenReady(timeout) => {
            let machines_only = !provider.runs_pods();
            let ready = tokio::time::timeout(timeout, await_ready(&view, machines_only)).await;
            match ready {
                Err(_) => bail!(
                    "not ready after {timeout:?}: {}; logs in {}",
                    view.readiness(),
                    dir.join("logs").display()
                ),
                Ok(false) => bail!(
                    "stdout was closed before the demo was ready: {}",
                    view.readiness()
                ),
                Ok(true) => {}
            }
            // Ready: the exit status says so even if nobody reads these lines.
            say(view.table(dir, true));
            let workload = if machines_only {
                String::new()
            } else {
                format!(" and {WORKLOAD_REPLICAS} workload pods available")
            };
            say(format_args!(
                "ready: {MACHINES} machines Running{workload} {:.1}s after applying docs/examples ({provider:?} provider)",
                began.elapsed().as_secs_f64()
            ));
            Ok(Stop::Ready)
        }
        Mode::Live => {
            let shown = await_ready(&view, true).await
                && say(format_args!(
                    "ready: {MACHINES} machines Running {:.1}s after applying docs/examples; Ctrl-C stops everything",
                    began.elapsed().as_secs_f64()
                ));
            if !shown {
                return Ok(Stop::ViewerGone);
            }
            Ok(live(&view, cp, dir).await)
        }
    }
}

/// Waits until the API server calls the webhook with its published CA: a dry-run create of
/// a class without a `secretRef` (refused by every provider's webhook) and with `cpu: abc`
/// (refused by the local provider's rules too) is refused by it. Returns the refusal.
async fn await_webhook(client: &kube::Client) -> Result<String> {
    let classes: Api<MachineClass> = Api::namespaced(client.clone(), NAMESPACE);
    let bad: MachineClass = serde_json::from_value(json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": {"name": "refused-by-the-webhook"},
        "provider": "local",
        "providerSpec": {"capacity": {"cpu": "abc"}},
    }))?;
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    env::wait_for(
        "the admission webhook to answer",
        Duration::from_secs(60),
        || async {
            Ok(match classes.create(&dry_run, &bad).await {
                Err(kube::Error::Api(e)) if e.message.contains("denied the request") => {
                    Check::Done(e.message)
                }
                Err(e) => Check::Pending(e.to_string()),
                Ok(_) => Check::Pending("accepted: the configuration is not in effect yet".into()),
            })
        },
    )
    .await
}

/// The two controllers, with short timeouts for a demo and no leader election; the machine
/// controller serves the admission webhook on `webhook_port`.
fn controller_specs(cp: &ControlPlane, webhook_port: u16) -> Vec<ControllerSpec> {
    let kubeconfig = cp.kubeconfig_path().to_path_buf();
    let webhook = mcm_testenv::kit::webhook_args(webhook_port, WEBHOOK_CONFIGURATION);
    let spec = |kind, name: &str, extra: &[&str]| ControllerSpec {
        kind,
        name: name.to_string(),
        namespace: NAMESPACE.to_string(),
        control_kubeconfig: kubeconfig.clone(),
        target_kubeconfig: kubeconfig.clone(),
        extra: extra.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
    };
    vec![
        spec(ControllerKind::Manager, "machine-controller-manager", &[]),
        spec(
            ControllerKind::Machine,
            "machine-controller-local",
            &[
                "--machine-creation-timeout=3m",
                "--machine-health-timeout=1m",
                "--machine-drain-timeout=2m",
                "--machine-safety-orphan-vms-period=30s",
                "--machine-safety-apiserver-statuscheck-period=10s",
                "--machine-eviction-retry-interval=5s",
                "--machine-backoff-max=10s",
            ]
            .into_iter()
            .chain(webhook.iter().map(String::as_str))
            .collect::<Vec<_>>()[..],
        ),
    ]
}

/// Applies `docs/examples/*.yaml` in file-name order, filling in the placeholders (the
/// workload only when `provider`'s VMs run pods).
async fn apply_examples(
    client: &kube::Client,
    cp: &ControlPlane,
    dir: &Path,
    provider: Provider,
) -> Result<()> {
    let examples = crate::crds::workspace_root().join("docs").join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples)
        .with_context(|| format!("reading {}", examples.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let kubeconfig = std::fs::read_to_string(cp.kubeconfig_path())?;
    let state = dir.join("vms").display().to_string();
    let vars = [
        ("${TARGET_KUBECONFIG}", kubeconfig.as_str()),
        ("${STATE_DIRECTORY}", state.as_str()),
    ];
    for file in files {
        if !provider.runs_pods() && file_name(&file) == WORKLOAD_FILE {
            say(format_args!(
                "skipped docs/examples/{WORKLOAD_FILE}: the {provider:?} provider's VMs run no pods"
            ));
            continue;
        }
        let text = std::fs::read_to_string(&file)?;
        let docs = env::yaml_documents(&text).with_context(|| format!("in {}", file.display()))?;
        for mut doc in docs {
            env::substitute(&mut doc, &vars);
            let obj = env::apply(client, NAMESPACE, &doc)
                .await
                .with_context(|| format!("applying {}", file.display()))?;
            let kind = obj.types.map(|t| t.kind).unwrap_or_default();
            let name = obj.metadata.name.unwrap_or_default();
            say(format_args!(
                "applied {kind}/{name} from docs/examples/{}",
                file_name(&file)
            ));
        }
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reflector stores of what the demo shows, and a notification on every change.
struct View {
    machines: Store<Machine>,
    pods: Store<Pod>,
    nodes: Store<Node>,
    deployments: Store<Deployment>,
    changed: Arc<Notify>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for View {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

fn reflect<K>(api: Api<K>, changed: &Arc<Notify>) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let task = tokio::spawn(async move {
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {
            changed.notify_one();
        }
    });
    (reader, task)
}

impl View {
    fn start(client: kube::Client) -> View {
        let changed = Arc::new(Notify::new());
        let (machines, t1) = reflect(Api::namespaced(client.clone(), NAMESPACE), &changed);
        let (pods, t2) = reflect(Api::namespaced(client.clone(), NAMESPACE), &changed);
        let (nodes, t3) = reflect(Api::all(client.clone()), &changed);
        let (deployments, t4) = reflect(Api::namespaced(client, NAMESPACE), &changed);
        View {
            machines,
            pods,
            nodes,
            deployments,
            changed,
            tasks: vec![t1, t2, t3, t4],
        }
    }

    /// Waits for a change, or one second (ages move on).
    async fn next_change(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.changed.notified()).await;
    }

    fn machines_sorted(&self) -> Vec<Arc<Machine>> {
        let mut ms = self.machines.state();
        ms.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        ms
    }

    fn running(&self) -> usize {
        self.machines
            .state()
            .iter()
            .filter(|m| {
                m.phase() == Some(&MachinePhase::Running) && m.metadata.deletion_timestamp.is_none()
            })
            .count()
    }

    fn workload_available(&self) -> i32 {
        self.deployments
            .state()
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(WORKLOAD))
            .and_then(|d| d.status.as_ref()?.available_replicas)
            .unwrap_or(0)
    }

    /// `2/3 machines Running (Pending: 1), workload 0/3 available`.
    fn readiness(&self) -> String {
        let machines: Vec<Machine> = self
            .machines
            .state()
            .iter()
            .map(|m| (**m).clone())
            .collect();
        let phases = match crate::e2e::ctx::phase_summary(&machines) {
            p if p.is_empty() => "no machine yet".to_string(),
            p => p,
        };
        format!(
            "{}/{MACHINES} machines Running ({phases}), workload {}/{WORKLOAD_REPLICAS} available",
            self.running(),
            self.workload_available()
        )
    }

    /// Machines, then workload pods per node; the AGE column only `with_ages`.
    fn table(&self, dir: &Path, with_ages: bool) -> String {
        let state = StateDirectory::new(dir.join("vms"));
        let now = jiff::Timestamp::now();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<32} {:<12} {:<32} {:>6} {:>8}",
            "MACHINE", "PHASE", "NODE", "AGE", "VM PID"
        );
        for m in self.machines_sorted() {
            let name = m.metadata.name.clone().unwrap_or_default();
            let phase = m.phase().map_or("-", |p| p.as_str()).to_string();
            let phase = if m.metadata.deletion_timestamp.is_some() && phase != "Terminating" {
                format!("{phase}*")
            } else {
                phase
            };
            let node = node_of(&m).unwrap_or("-").to_string();
            let age = match &m.metadata.creation_timestamp {
                Some(t) if with_ages => age(now.duration_since(t.0)),
                _ => "-".into(),
            };
            let pid = vm_pid(&state, &name);
            let _ = writeln!(out, "{name:<32} {phase:<12} {node:<32} {age:>6} {pid:>8}");
        }
        let _ = writeln!(out, "\n{:<32} {:<6} WORKLOAD PODS", "NODE", "READY");
        for (node, pods) in self.pods_per_node() {
            let ready = self.node_ready(&node);
            let _ = writeln!(out, "{node:<32} {ready:<6} {}", pods.join(" "));
        }
        out
    }

    /// Pod names per node name (`(unscheduled)` for pending pods), every node listed.
    fn pods_per_node(&self) -> BTreeMap<String, Vec<String>> {
        let mut per: BTreeMap<String, Vec<String>> = self
            .nodes
            .state()
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .map(|n| (n, Vec::new()))
            .collect();
        for p in self.pods.state() {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "(unscheduled)".into());
            let mut name = p.metadata.name.clone().unwrap_or_default();
            if p.metadata.deletion_timestamp.is_some() {
                name.push_str("(terminating)");
            }
            per.entry(node).or_default().push(name);
        }
        per
    }

    fn node_ready(&self, name: &str) -> &'static str {
        let node = self
            .nodes
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(name));
        match node {
            Some(n) if crate::e2e::ctx::node_ready(&n) => "True",
            Some(_) => "False",
            None => "-",
        }
    }
}

fn node_of(m: &Machine) -> Option<&str> {
    m.metadata.labels.as_ref()?.get("node").map(String::as_str)
}

fn vm_pid(state: &StateDirectory, machine: &str) -> String {
    match state.read(machine) {
        Ok(Some(r)) if mcm_provider_local::state::check_liveness(&r).is_alive() => {
            r.pid.to_string()
        }
        Ok(Some(_)) => "dead".into(),
        _ => "-".into(),
    }
}

/// `42s`, `3m12s`, `2h5m`.
fn age(d: jiff::SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Shows a progress bar (indicatif, on a terminal) or one line per change until the machines
/// run and, unless `machines_only`, the workload is available: `true` then, `false` as soon as
/// a write fails (stdout is gone; only detectable without a terminal).
async fn await_ready(view: &View, machines_only: bool) -> bool {
    let bar = std::io::stdout().is_terminal().then(|| {
        let bar =
            ProgressBar::with_draw_target(Some(MACHINES as u64), ProgressDrawTarget::stdout());
        let style = ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#>-");
        bar.set_style(style);
        bar
    });
    let mut last = String::new();
    loop {
        let line = view.readiness();
        match &bar {
            Some(bar) => {
                bar.set_position(view.running().min(MACHINES) as u64);
                bar.set_message(line.clone());
            }
            None if line != last && !say(&line) => return false,
            None => {}
        }
        last = line;
        let machines_done = view.running() >= MACHINES;
        if machines_done && (machines_only || view.workload_available() >= WORKLOAD_REPLICAS) {
            if let Some(bar) = bar {
                bar.finish();
            }
            return true;
        }
        view.next_change().await;
    }
}

/// Redraws the table on every change until interrupted, or until stdout is gone. A terminal
/// gets the screen redrawn (ages move on); other output gets the table again when something
/// but the ages changed.
async fn live(view: &View, cp: &ControlPlane, dir: &Path) -> Stop {
    let tty = std::io::stdout().is_terminal();
    let help = help(cp, dir);
    if !tty && !say(&help) {
        return Stop::ViewerGone;
    }
    let mut last = String::new();
    loop {
        let written = if tty {
            show(format_args!(
                "\x1b[H\x1b[2J{help}\n{}",
                view.table(dir, true)
            ))
        } else {
            let table = view.table(dir, false);
            let changed = table != last;
            last = table;
            !changed || say(view.table(dir, true))
        };
        if !written {
            return Stop::ViewerGone;
        }
        view.next_change().await;
    }
}

/// How to look at and play with the demo.
fn help(cp: &ControlPlane, dir: &Path) -> String {
    let kc = cp.kubeconfig_path().display();
    let logs = dir.join("logs");
    let vms = dir.join("vms");
    let patch = r#"'{"spec":{"template":{"metadata":{"labels":{"rev":"2"}}}}}'"#;
    let bad = r#"'{"providerSpec":{"capacity":{"cpu":"abc"}}}'"#;
    format!(
        "mcm-rs demo: {MACHINES} local machines and a workload. Ctrl-C stops everything.\n\
         \n  logs       {logs}/ (controllers), {cplogs}/ (control plane)\
         \n  VMs        {vms}/vms/<machine>/agent.log\
         \n  kubectl    export KUBECONFIG={kc}   (kubectl is not installed by the demo)\
         \n             kubectl -n {NAMESPACE} get machinedeployments,machinesets,machines; kubectl get nodes\
         \n  roll out   kubectl -n {NAMESPACE} patch machinedeployment {DEPLOYMENT} --type merge -p {patch}\
         \n  scale      kubectl -n {NAMESPACE} scale machinedeployment {DEPLOYMENT} --replicas=5\
         \n  crash      kill -9 <VM PID>   (the machine goes Unknown, Failed ~20s later as its VM is stopped, its pods deleted, then replaced)\
         \n  refused    kubectl -n {NAMESPACE} patch machineclass local-small --type merge -p {bad}   (the admission webhook names the field)\n",
        logs = logs.display(),
        cplogs = cp.run_dir().display(),
        vms = vms.display(),
    )
}

/// What [`shutdown`] did, for [`Stopped::report`] once nothing is left running.
struct Stopped {
    vms: usize,
    took: Duration,
    cp_logs: Result<()>,
    run_dir: PathBuf,
    left: Vec<ProcessInfo>,
}

/// Stops the VMs, the controllers and the control plane, keeps the control-plane logs, and
/// waits (bounded) until no process mentioning the demo's directories is left. Writes
/// nothing: it must not depend on stdout or stderr being writable.
async fn shutdown(cp: ControlPlane, controllers: Vec<Controller>, dir: &Path) -> Stopped {
    let started = Instant::now();
    let state = StateDirectory::new(dir.join("vms"));
    // The VMs first: they run detached, nothing else stops them.
    let mut vms = kill_vms(&state);
    futures::future::join_all(
        controllers
            .into_iter()
            .map(|c| c.stop(Duration::from_secs(5))),
    )
    .await;
    // And any VM the machine controller created meanwhile.
    vms.extend(kill_vms(&state));
    vms.sort_unstable();
    vms.dedup();
    let cp_logs = env::preserve_control_plane_logs(&cp, &dir.join("logs").join("control-plane"));
    let run_dir = cp.run_dir().to_path_buf();
    drop(cp);
    let took = started.elapsed();
    let left = env::await_no_process(&[dir, &run_dir], Duration::from_secs(10)).await;
    Stopped {
        vms: vms.len(),
        took,
        cp_logs,
        run_dir,
        left,
    }
}

impl Stopped {
    /// Says what was stopped; an error when a process is left.
    fn report(self, dir: &Path) -> Result<()> {
        if let Err(e) = &self.cp_logs {
            note(format_args!("could not keep the control-plane logs: {e:#}"));
        }
        say(format_args!(
            "stopped the controllers, {} VMs and the control plane in {:.1}s; logs kept in {}",
            self.vms,
            self.took.as_secs_f64(),
            dir.join("logs").display()
        ));
        if self.left.is_empty() {
            say(format_args!(
                "process check: no process mentioning {} or {} is left",
                dir.display(),
                self.run_dir.display()
            ));
            return Ok(());
        }
        for p in &self.left {
            say(format_args!("  left: {} {}", p.pid, p.cmdline));
        }
        let pids: Vec<String> = self.left.iter().map(|p| p.pid.to_string()).collect();
        Err(anyhow!(
            "process check failed: {} processes mentioning {} or {} are left (pids {})",
            self.left.len(),
            dir.display(),
            self.run_dir.display(),
            pids.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcm_provider_local::state::{VmRecord, provider_id, read_proc_stat};
    use std::os::unix::process::ExitStatusExt;

    /// A panic anywhere in the demo unwinds through [`VmReaper`], which kills the recorded VMs.
    #[test]
    fn a_panic_still_kills_the_recorded_vms() {
        let root = std::env::temp_dir().join(format!("mcm-demo-reaper-{}", std::process::id()));
        let state = StateDirectory::new(&root);
        let mut vm = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = vm.id() as i32;
        state
            .write(&VmRecord {
                machine_name: "m1".into(),
                class_name: "c".into(),
                provider_id: provider_id("m1"),
                node_name: "m1".into(),
                pid,
                start_time: read_proc_stat(pid).unwrap().start_time,
                created_at: jiff::Timestamp::now(),
                request_id: None,
                node: mcm_provider_local::NodeKind::Process,
            })
            .unwrap();
        let unwound = std::panic::catch_unwind(|| {
            let _reaper = VmReaper(state.clone());
            panic!("the demo panics");
        });
        assert!(unwound.is_err());
        // Killed by the reaper; otherwise `sleep 600` runs on: kill it here, and fail.
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = vm.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = vm.kill();
                let _ = vm.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = std::fs::remove_dir_all(&root);
        let status = status.expect("the VM survived the panic");
        assert_eq!(status.signal(), Some(9), "{status}");
    }
}
