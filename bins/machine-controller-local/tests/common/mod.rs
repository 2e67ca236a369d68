//! Harness for machine-controller tests: a real control plane, a namespace with a local
//! MachineClass and its Secret, and `machine-controller-local` processes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use mcm_api::{Machine, MachineClass, MachinePhase};
use mcm_provider_local::state::{self, StateDirectory};
use mcm_testenv::kit::{
    MachineBuilder, MachineClassBuilder, ServedProcess, TestNamespace, await_gone, await_object,
    binary_beside, create, eventually, free_port, kubeconfig_text, process_alive, secret, sigkill,
};
use mcm_testenv::{Components, ControlPlane};
use serde_json::{Value, json};

/// Generous bound for anything the control plane or the controller does.
pub const WAIT: Duration = Duration::from_secs(90);

/// The user data of test machines: the local VM checks the bootstrap token at boot.
pub const USER_DATA: &str =
    "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\nmachine: <<MACHINE_NAME>>\n";

/// `local-node`, next to the controller binary (built on demand when missing).
pub fn node_binary() -> PathBuf {
    binary_beside(
        env!("CARGO_BIN_EXE_machine-controller-local"),
        "local-node",
        "mcm-provider-local",
    )
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
        let vms = StateDirectory::new(self.state_dir.path());
        let killed = state::kill_all_recorded(&vms);
        if !killed.is_empty() {
            eprintln!("harness killed leftover VM processes {killed:?}");
        }
        if std::thread::panicking() {
            // The controllers' logs, then each VM's agent log (why a VM never registered).
            let logs = std::fs::read_dir(self.logs.path())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| (e.path(), 60));
            let agents = std::fs::read_dir(vms.vms_dir())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| (e.path().join(state::LOG_FILE), 20))
                .filter(|(path, _)| path.is_file());
            for (path, lines) in logs.chain(agents) {
                eprintln!("--- last lines of {} ---", path.display());
                eprintln!("{}", mcm_testenv::process::log_tail(&path, lines));
            }
        }
    }
}

/// A running `machine-controller-local`, SIGKILLed on drop, serving on its port.
pub type ControllerProcess = ServedProcess;

impl Harness {
    /// A namespace with the class `local` (providerSpec `spec` + a state directory) and the
    /// secret `local-secret` (target kubeconfig + user data with the token placeholder).
    pub async fn new(prefix: &str, spec: Value) -> Harness {
        let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, prefix).await;
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
        kubeconfig_text(&self.env)
    }

    /// Creates the Secret `name` (target kubeconfig + user data with the token placeholder).
    pub async fn create_secret(&self, name: &str) {
        let s = secret(
            name,
            &[("kubeconfig", &self.kubeconfig()), ("userData", USER_DATA)],
        );
        create(
            &Api::<Secret>::namespaced(self.client.clone(), &self.ns),
            &s,
        )
        .await;
    }

    /// A local class: `spec` with this harness's state directory and a 1s heartbeat unless
    /// `spec` has one.
    pub fn class_body(&self, name: &str, spec: Value, secret: &str) -> MachineClass {
        let mut spec = spec;
        spec["stateDirectory"] = json!(self.state_dir.path());
        if spec.get("heartbeatInterval").is_none() {
            spec["heartbeatInterval"] = json!("1s");
        }
        MachineClassBuilder::new(name)
            .provider("local")
            .spec(spec)
            .secret(&self.ns, secret)
            .build()
    }

    pub async fn create_class(&self, name: &str, spec: Value, secret: &str) {
        create(&self.classes(), &self.class_body(name, spec, secret)).await;
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
        let mut command =
            tokio::process::Command::new(env!("CARGO_BIN_EXE_machine-controller-local"));
        command
            .args(&args)
            .env(mcm_provider_local::NODE_BINARY_ENV, node_binary())
            .env("RUST_LOG", "info,mcm_reconcilers=debug,mcm_drain=debug");
        let log = self.logs.path().join(format!("{name}.log"));
        ServedProcess::spawn(command, port, &log)
    }

    pub async fn create_machine(&self, name: &str, class: &str) -> Machine {
        create(
            &self.machines(),
            &MachineBuilder::new(name).class(class).build(),
        )
        .await
    }

    /// Waits until the machine is in `phase`.
    pub async fn await_phase(&self, name: &str, phase: MachinePhase, timeout: Duration) -> Machine {
        await_object(
            self.machines(),
            name,
            timeout,
            &format!("machine {name} to become {}", phase.as_str()),
            |m: Option<&Machine>| m.and_then(|m| m.phase()) == Some(&phase),
        )
        .await
        .unwrap()
    }

    /// Waits until the machine is gone.
    pub async fn await_gone(&self, name: &str, timeout: Duration) {
        await_gone(self.machines(), name, timeout).await;
    }

    /// Waits until the machine's lastOperation description satisfies `pred`.
    pub async fn await_description(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&str) -> bool + Send + 'static,
    ) -> Machine {
        await_object(
            self.machines(),
            name,
            timeout,
            what,
            |m: Option<&Machine>| {
                m.and_then(|m| m.status.as_ref())
                    .and_then(|s| s.last_operation.as_ref())
                    .and_then(|o| o.description.as_deref())
                    .is_some_and(&pred)
            },
        )
        .await
        .unwrap()
    }

    pub async fn delete_machine(&self, name: &str) {
        self.machines()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
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

    /// Creates the Pod `name` on the Node `node` (one container, `grace` seconds to
    /// terminate) and waits until it runs.
    pub async fn run_pod(&self, name: &str, node: &str, grace: i64) -> Api<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "nodeName": node, "terminationGracePeriodSeconds": grace,
                      "containers": [{ "name": "c", "image": format!("example.invalid/{name}") }] }
        }))
        .unwrap();
        create(&pods, &pod).await;
        await_object(
            pods.clone(),
            name,
            WAIT,
            &format!("the pod {name} to run"),
            |p: Option<&Pod>| {
                p.and_then(|p| p.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    == Some("Running")
            },
        )
        .await;
        pods
    }

    pub async fn patch_machine(&self, name: &str, patch: Value) {
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
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

    /// Partitions the VM of `machine` from the cluster (SIGSTOP): its Node stops
    /// heartbeating while the driver still finds the process, so reports the VM running.
    pub fn stop_vm(&self, machine: &str) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.vm_pid(machine)),
            nix::sys::signal::Signal::SIGSTOP,
        );
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
        pred: impl Fn(Option<&Node>) -> bool,
    ) -> Option<Node> {
        await_object(self.nodes(), name, timeout, what, pred).await
    }

    /// Waits until every machine in `names` is in `phase` (polling the list); a timeout
    /// names the machines not there yet.
    pub async fn await_all_phase(&self, names: &[String], phase: MachinePhase, timeout: Duration) {
        let what = format!("{} machines to become {}", names.len(), phase.as_str());
        eventually(timeout, &what, || async {
            let list = self.machines().list(&Default::default()).await.unwrap();
            let behind: Vec<&String> = names
                .iter()
                .filter(|n| {
                    !list.items.iter().any(|m| {
                        m.metadata.name.as_deref() == Some(n.as_str()) && m.phase() == Some(&phase)
                    })
                })
                .collect();
            if behind.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet: {behind:?}"))
            }
        })
        .await
    }
}
