//! Harness for machine-controller tests: a real control plane, a namespace with a local
//! MachineClass and its Secret, and `machine-controller-local` processes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use mcm_api::{Machine, MachineClass, MachinePhase};
use mcm_provider_local::state::{self, StateDirectory};
use mcm_testenv::{Components, ControlPlane};
use serde_json::{Value, json};

/// Generous bound for anything the control plane or the controller does.
pub const WAIT: Duration = Duration::from_secs(90);

/// The user data of test machines: the local VM checks the bootstrap token at boot.
pub const USER_DATA: &str =
    "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\nmachine: <<MACHINE_NAME>>\n";

/// `local-node`, next to the controller binary (built on demand when missing).
pub fn node_binary() -> PathBuf {
    let controller = PathBuf::from(env!("CARGO_BIN_EXE_machine-controller-local"));
    let node = controller.with_file_name("local-node");
    if !node.is_file() {
        let status =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["build", "-p", "mcm-provider-local", "--bin", "local-node"])
                .status()
                .expect("cargo runs");
        assert!(status.success(), "building local-node failed");
    }
    node
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Awaits `fut` or panics naming `what`.
pub async fn within<T>(timeout: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// One test's world.
pub struct Harness {
    pub env: Arc<ControlPlane>,
    pub client: kube::Client,
    pub ns: String,
    pub state_dir: tempfile::TempDir,
    pub logs: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let killed = state::kill_all_recorded(&StateDirectory::new(self.state_dir.path()));
        if !killed.is_empty() {
            eprintln!("harness killed leftover VM processes {killed:?}");
        }
        if std::thread::panicking()
            && let Ok(entries) = std::fs::read_dir(self.logs.path())
        {
            for e in entries.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                eprintln!("--- last lines of {} ---", e.path().display());
                for l in tail.into_iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
    }
}

/// A running controller process, killed (SIGKILL) on drop.
pub struct ControllerProcess {
    pub child: tokio::process::Child,
    pub port: u16,
}

impl ControllerProcess {
    /// SIGKILL and reap.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// The text of `/metrics`.
    pub async fn metrics(&self) -> String {
        http_get(self.port, "/metrics").await.unwrap_or_default()
    }
}

/// A plain HTTP GET on 127.0.0.1 (the controller's endpoints).
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

/// The value of a metric line `name{...} value` or `name value`, summed over label sets.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

impl Harness {
    /// A namespace with the class `local` (providerSpec `spec` + a state directory) and the
    /// secret `local-secret` (target kubeconfig + user data with the token placeholder).
    pub async fn new(prefix: &str, spec: Value) -> Harness {
        let env = mcm_testenv::shared(Components::ALL)
            .await
            .expect("control plane");
        let client = env.client().await.expect("client");
        let ns = env.namespace(prefix).await.expect("namespace");
        let h = Harness {
            env,
            client,
            ns,
            state_dir: tempfile::tempdir().unwrap(),
            logs: tempfile::tempdir().unwrap(),
        };
        h.create_secret("local-secret").await;
        h.create_class("local", spec, "local-secret").await;
        h
    }

    pub fn kubeconfig(&self) -> String {
        std::fs::read_to_string(self.env.kubeconfig_path()).unwrap()
    }

    pub async fn create_secret(&self, name: &str) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": name },
            "stringData": { "kubeconfig": self.kubeconfig(), "userData": USER_DATA },
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    pub fn class_body(&self, name: &str, spec: Value, secret: &str) -> MachineClass {
        let mut spec = spec;
        spec["stateDirectory"] = json!(self.state_dir.path());
        if spec.get("heartbeatInterval").is_none() {
            spec["heartbeatInterval"] = json!("1s");
        }
        serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineClass",
            "metadata": { "name": name },
            "provider": "local",
            "providerSpec": spec,
            "secretRef": { "name": secret, "namespace": self.ns },
        }))
        .unwrap()
    }

    pub async fn create_class(&self, name: &str, spec: Value, secret: &str) {
        self.classes()
            .create(&PostParams::default(), &self.class_body(name, spec, secret))
            .await
            .unwrap();
    }

    pub fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn classes(&self) -> Api<MachineClass> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub fn state(&self) -> StateDirectory {
        StateDirectory::new(self.state_dir.path())
    }

    /// Controller flags for tests: short periods, no leader election.
    pub fn controller_args(&self, port: u16) -> Vec<String> {
        let kc = self.env.kubeconfig_path().display().to_string();
        vec![
            format!("--control-kubeconfig={kc}"),
            format!("--target-kubeconfig={kc}"),
            format!("--namespace={}", self.ns),
            format!("--port={port}"),
            "--address=127.0.0.1".into(),
            "--leader-elect=false".into(),
            "--machine-creation-timeout=60s".into(),
            "--machine-health-timeout=60s".into(),
            "--machine-drain-timeout=60s".into(),
            "--machine-safety-orphan-vms-period=2s".into(),
            "--machine-safety-apiserver-statuscheck-period=1s".into(),
            "--machine-safety-apiserver-statuscheck-timeout=10s".into(),
            "--machine-backoff-max=2s".into(),
            "--machine-eviction-retry-interval=1s".into(),
            "--machine-pv-detach-timeout=10s".into(),
            "--machine-resync-period=5s".into(),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            "--v=3".into(),
        ]
    }

    /// Starts `machine-controller-local` with the test flags, then `extra` (later flags win).
    pub fn spawn_controller(&self, name: &str, extra: &[String]) -> ControllerProcess {
        let port = free_port();
        let mut args = self.controller_args(port);
        args.extend(extra.iter().cloned());
        self.spawn_with_args(name, port, args)
    }

    pub fn spawn_with_args(&self, name: &str, port: u16, args: Vec<String>) -> ControllerProcess {
        let log = self.logs.path().join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_machine-controller-local"))
            .args(&args)
            .env(mcm_provider_local::NODE_BINARY_ENV, node_binary())
            .env("RUST_LOG", "info,mcm_reconcilers=debug,mcm_drain=debug")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .expect("the controller starts");
        ControllerProcess { child, port }
    }

    /// A Machine of class `class`, optionally with labels and owner references.
    pub fn machine_body(&self, name: &str, class: &str, extra: Value) -> Machine {
        let mut v = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": { "name": name },
            "spec": { "class": { "kind": "MachineClass", "name": class } },
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    pub async fn create_machine(&self, name: &str, class: &str) -> Machine {
        self.machines()
            .create(
                &PostParams::default(),
                &self.machine_body(name, class, json!({})),
            )
            .await
            .unwrap()
    }

    /// Waits until the machine is in `phase`.
    pub async fn await_phase(&self, name: &str, phase: MachinePhase, timeout: Duration) -> Machine {
        let want = phase.clone();
        within(
            timeout,
            &format!("machine {name} to become {}", phase.as_str()),
            await_condition(self.machines(), name, move |m: Option<&Machine>| {
                m.and_then(|m| m.phase()) == Some(&want)
            }),
        )
        .await
        .unwrap()
        .unwrap()
    }

    /// Waits until the machine is gone.
    pub async fn await_gone(&self, name: &str, timeout: Duration) {
        within(
            timeout,
            &format!("machine {name} to be deleted"),
            await_condition(self.machines(), name, |m: Option<&Machine>| m.is_none()),
        )
        .await
        .unwrap();
    }

    /// Waits until the machine's lastOperation description satisfies `pred`.
    pub async fn await_description(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&str) -> bool + Send + 'static,
    ) -> Machine {
        within(
            timeout,
            what,
            await_condition(self.machines(), name, move |m: Option<&Machine>| {
                m.and_then(|m| m.status.as_ref())
                    .and_then(|s| s.last_operation.as_ref())
                    .and_then(|o| o.description.as_deref())
                    .is_some_and(&pred)
            }),
        )
        .await
        .unwrap()
        .unwrap()
    }

    pub async fn delete_machine(&self, name: &str) {
        self.machines()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Events of the namespace whose reason is `reason`, for the object `name`.
    pub async fn events_for(&self, name: &str, reason: &str) -> Vec<String> {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.note)
            .collect()
    }

    /// Events about the Node `name` (any namespace) whose reason is `reason`.
    pub async fn node_events_for(&self, name: &str, reason: &str) -> Vec<String> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.client.clone());
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(name)
                })
            })
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.note)
            .collect()
    }

    /// Whether a VM process of `machine` is alive.
    pub fn vm_alive(&self, machine: &str) -> bool {
        self.state()
            .read(machine)
            .ok()
            .flatten()
            .is_some_and(|r| state::check_liveness(&r).is_alive())
    }

    /// The machine names with a VM record.
    pub fn vm_records(&self) -> Vec<String> {
        self.state()
            .list()
            .map(|(records, _)| records.into_iter().map(|r| r.machine_name).collect())
            .unwrap_or_default()
    }

    pub async fn patch_machine(&self, name: &str, patch: Value) {
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

/// Merges `extra` into `v` (objects key by key).
pub fn merge(v: &mut Value, extra: Value) {
    match (v, extra) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, bv) in b {
                merge(a.entry(k).or_insert(Value::Null), bv);
            }
        }
        (slot, other) => *slot = other,
    }
}

/// Phases seen per machine, in order.
pub type PhaseLog = Arc<std::sync::Mutex<BTreeMap<String, Vec<String>>>>;

/// The phases a machine went through, recorded from a watch until the returned handle is
/// stopped.
pub fn record_phases(api: Api<Machine>) -> (tokio::task::JoinHandle<()>, PhaseLog) {
    use futures::StreamExt;
    let seen: PhaseLog = Default::default();
    let s = seen.clone();
    let task = tokio::spawn(async move {
        // A watch error must not end the recording: retry with backoff.
        let stream = kube::runtime::WatchStreamExt::default_backoff(kube::runtime::watcher(
            api,
            Default::default(),
        ));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { continue };
            if let kube::runtime::watcher::Event::Apply(m)
            | kube::runtime::watcher::Event::InitApply(m) = ev
            {
                let name = m.metadata.name.clone().unwrap_or_default();
                if let Some(p) = m.phase() {
                    let mut seen = s.lock().unwrap();
                    let list = seen.entry(name).or_default();
                    if list.last().map(String::as_str) != Some(p.as_str()) {
                        list.push(p.as_str().to_string());
                    }
                }
            }
        }
    });
    (task, seen)
}

/// The path of a file in `dir`.
pub fn path_in(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

impl ControllerProcess {
    /// The pid of the controller process.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// The value of one metric (summed over label sets), 0 when absent.
    pub async fn metric(&self, name: &str) -> f64 {
        metric(&self.metrics().await, name).unwrap_or(0.0)
    }

    /// Waits until `/metrics` shows `name` (summed over label sets; 0 when absent)
    /// satisfying `pred`; polls every 200 ms.
    pub async fn await_metric(
        &self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        within(timeout, &format!("metric {name}"), async {
            loop {
                let v = self.metric(name).await;
                if pred(v) {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
    }

    /// The HTTP status code of a GET on the controller's endpoint.
    pub async fn status_of(&self, path: &str) -> Option<u16> {
        http_status(self.port, path).await
    }
}

/// The HTTP status code of a GET on 127.0.0.1:`port`.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let text = http_get(port, path).await?;
    text.lines().next()?.split(' ').nth(1)?.parse().ok()
}

/// The value of a metric line with the label `label="value"`, 0 when absent.
pub fn metric_with(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether a process is alive (exists and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    state::read_proc_stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

/// SIGKILLs a process.
pub fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

impl Harness {
    /// The live `local-node` processes started for `machine` from this harness's state
    /// directory, found in /proc (recorded or not).
    pub fn vm_pids(&self, machine: &str) -> Vec<i32> {
        let dir = self.state_dir.path().to_string_lossy().into_owned();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return vec![];
        };
        let mut pids: Vec<i32> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                    return false;
                };
                let args: Vec<String> = raw
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args.first().is_some_and(|a| a.ends_with("local-node"))
                    && args
                        .windows(2)
                        .any(|w| w[0] == "--machine-name" && w[1] == machine)
                    && args.iter().any(|a| a.starts_with(&dir))
            })
            .filter(|pid| process_alive(*pid))
            .collect();
        pids.sort();
        pids
    }

    /// The pid of the recorded VM of `machine`.
    pub fn vm_pid(&self, machine: &str) -> i32 {
        self.state()
            .read(machine)
            .unwrap()
            .unwrap_or_else(|| panic!("no VM record for {machine}"))
            .pid
    }

    /// Crashes the VM of `machine` (kill -9).
    pub fn kill_vm(&self, machine: &str) {
        sigkill(self.vm_pid(machine));
    }

    /// Kills any `local-node` process of `machines` (recorded or not) — for tests that may
    /// leave an unrecorded VM behind when they fail.
    pub fn kill_vm_processes(&self, machines: &[&str]) {
        for m in machines {
            for pid in self.vm_pids(m) {
                sigkill(pid);
            }
        }
    }

    /// Waits until the Node satisfies `pred` (`None`: no such Node).
    pub async fn await_node(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(Option<&Node>) -> bool + Send + 'static,
    ) -> Option<Node> {
        within(timeout, what, await_condition(self.nodes(), name, pred))
            .await
            .unwrap()
    }

    /// Waits until every machine in `names` is in `phase` (polling the list every 500 ms).
    pub async fn await_all_phase(&self, names: &[String], phase: MachinePhase, timeout: Duration) {
        within(
            timeout,
            &format!("{} machines to become {}", names.len(), phase.as_str()),
            async {
                loop {
                    let list = self.machines().list(&Default::default()).await.unwrap();
                    let done = names.iter().all(|n| {
                        list.items.iter().any(|m| {
                            m.metadata.name.as_deref() == Some(n.as_str())
                                && m.phase() == Some(&phase)
                        })
                    });
                    if done {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            },
        )
        .await
    }

    /// A kubeconfig like the admin one whose server is `server` (e.g. a proxy), written to
    /// the log directory; returns its path.
    pub fn kubeconfig_via(&self, server: &str, file: &str) -> PathBuf {
        let text = self.kubeconfig().replace(self.env.server_url(), server);
        assert!(text.contains(server), "the kubeconfig names the server");
        let path = self.logs.path().join(file);
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A TCP proxy on 127.0.0.1 in front of an upstream address that a test can cut (close all
/// connections and refuse new ones) and restore.
pub struct Proxy {
    pub port: u16,
    upstream: std::net::SocketAddr,
    running: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Proxy {
    /// Starts proxying `upstream` on a free port.
    pub async fn start(upstream: std::net::SocketAddr) -> Proxy {
        let p = Proxy {
            port: free_port(),
            upstream,
            running: Default::default(),
        };
        p.restore();
        p
    }

    /// Accepts connections (again).
    pub fn restore(&self) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], self.port)))
            .expect("the proxy port can be bound again");
        let listener = socket.listen(128).unwrap();
        let upstream = self.upstream;
        let task = tokio::spawn(async move {
            // Aborting this task drops the JoinSet, which aborts (and closes) every
            // connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                conns.spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        *self.running.lock().unwrap() = Some(task);
    }

    /// Closes every connection and the listener (new connections are refused).
    pub async fn cut(&self) {
        let task = self.running.lock().unwrap().take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(t) = self.running.lock().unwrap().take() {
            t.abort();
        }
    }
}
