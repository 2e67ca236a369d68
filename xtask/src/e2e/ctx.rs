//! One scenario's world: a fresh namespace, a state directory for its VMs, a Secret for its
//! classes, and its own controller processes. Dropping it kills the controllers and VMs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use mcm_api::{Machine, MachinePhase};
use mcm_provider_local::StateDirectory;
use mcm_testenv::ControlPlane;
use mcm_testenv::kit::Proxy;
use serde_json::{Value, json};

use super::env::{
    self, Binaries, Check, Controller, ControllerKind, ControllerSpec, kill_vms, wait_for,
};

/// Label put on the Nodes of a scenario (through the class's providerSpec): the namespace.
pub const RUN_LABEL: &str = "e2e.mcm-rs.io/namespace";
/// The Secret every class of a scenario uses.
pub const SECRET: &str = "local-secret";
/// User data of the scenario VMs: the controller fills in the bootstrap token.
const USER_DATA: &str = "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\n";
/// Bound of single waits on the controllers.
pub const WAIT: Duration = Duration::from_secs(120);

/// Timings of the machine controller of a scenario.
#[derive(Debug, Clone)]
pub struct Timings {
    /// `--machine-health-timeout`.
    pub health_timeout: &'static str,
    /// `--machine-drain-timeout`.
    pub drain_timeout: &'static str,
    /// `--machine-safety-orphan-vms-period`.
    pub orphan_period: &'static str,
    /// `--machine-safety-apiserver-statuscheck-timeout`.
    pub statuscheck_timeout: &'static str,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            health_timeout: "60s",
            drain_timeout: "30s",
            orphan_period: "30s",
            statuscheck_timeout: "30s",
        }
    }
}

/// The world of one scenario.
pub struct Ctx<'a> {
    pub cp: &'a ControlPlane,
    bins: &'a Binaries,
    pub client: kube::Client,
    pub ns: String,
    /// Logs of this scenario's processes (and the VM state directory below it).
    pub dir: PathBuf,
    pub state: StateDirectory,
    manager: Option<Controller>,
    machine: Option<Controller>,
    machine_starts: u32,
    manager_starts: u32,
    /// Extra environment of the machine controller (e.g. injected cloud faults).
    pub machine_env: Vec<(String, String)>,
    /// The machine controller's control kubeconfig, when not the control plane's own (e.g.
    /// through a proxy that can be cut).
    pub machine_control_kubeconfig: Option<PathBuf>,
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // Controllers first, so none recreates a VM that is being killed.
        self.manager.take();
        self.machine.take();
        kill_vms(&self.state);
    }
}

impl<'a> Ctx<'a> {
    /// A fresh namespace `<name>-<random>` with the Secret [`SECRET`].
    pub async fn new(
        cp: &'a ControlPlane,
        bins: &'a Binaries,
        name: &str,
        logs_root: &Path,
    ) -> Result<Ctx<'a>> {
        let client = cp.client().await.context("building a client")?;
        let ns = cp.namespace(name).await.context("creating a namespace")?;
        let dir = logs_root.join(name);
        let state = StateDirectory::new(dir.join("state"));
        std::fs::create_dir_all(state.root())
            .with_context(|| format!("creating {}", state.root().display()))?;
        let ctx = Ctx {
            cp,
            bins,
            client,
            ns,
            dir,
            state,
            manager: None,
            machine: None,
            machine_starts: 0,
            manager_starts: 0,
            machine_env: Vec::new(),
            machine_control_kubeconfig: None,
        };
        ctx.apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": SECRET },
            "stringData": { "kubeconfig": ctx.kubeconfig()?, "userData": USER_DATA },
        }))
        .await?;
        Ok(ctx)
    }

    /// A cuttable proxy in front of the API server, and a kubeconfig file `name` (in the
    /// scenario's directory) that reaches the API server through it.
    pub fn proxied_kubeconfig(&self, name: &str) -> Result<(Proxy, PathBuf)> {
        let upstream = self
            .cp
            .server_url()
            .strip_prefix("https://")
            .context("the API server URL is not https")?
            .parse()
            .context("parsing the API server address")?;
        let proxy = Proxy::start(upstream)?;
        let path = self.dir.join(name);
        let text = self.kubeconfig()?.replace(
            self.cp.server_url(),
            &format!("https://127.0.0.1:{}", proxy.port),
        );
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok((proxy, path))
    }

    /// The admin kubeconfig of the control plane (content).
    pub fn kubeconfig(&self) -> Result<String> {
        let path = self.cp.kubeconfig_path();
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }

    /// Server-side applies an object in the scenario's namespace.
    pub async fn apply(&self, obj: &Value) -> Result<()> {
        env::apply(&self.client, &self.ns, obj).await.map(drop)
    }

    /// A local MachineClass named `name` whose Nodes get `labels` and the [`RUN_LABEL`].
    pub async fn create_class(&self, name: &str, labels: Value) -> Result<()> {
        self.apply(&self.class_body(name, labels)).await
    }

    /// The body of [`Ctx::create_class`].
    pub fn class_body(&self, name: &str, labels: Value) -> Value {
        let mut labels = labels;
        labels[RUN_LABEL] = json!(self.ns);
        json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
            "metadata": { "name": name },
            "provider": "local",
            "providerSpec": {
                "labels": labels,
                "heartbeatInterval": "1s",
                "stateDirectory": self.state.root(),
            },
            "secretRef": { "name": SECRET, "namespace": self.ns },
        })
    }

    /// A MachineDeployment of `replicas` machines of `class`, RollingUpdate with maxSurge 1
    /// and maxUnavailable 0.
    pub async fn create_deployment(&self, name: &str, replicas: i32, class: &str) -> Result<()> {
        self.apply(&json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": { "name": name },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "deployment": name } },
                "strategy": { "type": "RollingUpdate",
                              "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } },
                "template": {
                    "metadata": { "labels": { "deployment": name } },
                    "spec": { "class": { "kind": "MachineClass", "name": class } },
                },
            },
        }))
        .await
    }

    /// Merge-patches a MachineDeployment.
    pub async fn patch_deployment(&self, name: &str, patch: Value) -> Result<()> {
        Api::<mcm_api::MachineDeployment>::namespaced(self.client.clone(), &self.ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching MachineDeployment {name}"))
            .map(drop)
    }

    /// A workload Deployment `web` of `replicas` pods on this scenario's Nodes and, with
    /// `min_available`, a PodDisruptionBudget `web`.
    pub async fn create_workload(&self, replicas: i32, min_available: Option<i32>) -> Result<()> {
        self.apply(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "web" },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "app": "web" } },
                "template": {
                    "metadata": { "labels": { "app": "web" } },
                    "spec": {
                        "nodeSelector": { RUN_LABEL: self.ns },
                        "terminationGracePeriodSeconds": 2,
                        "containers": [{ "name": "web", "image": "registry.k8s.io/pause:3.10" }],
                    },
                },
            },
        }))
        .await?;
        if let Some(min) = min_available {
            self.apply(&json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": { "name": "web" },
                "spec": { "minAvailable": min, "selector": { "matchLabels": { "app": "web" } } },
            }))
            .await?;
        }
        Ok(())
    }

    /// Starts the manager and the machine controller with `timings`, the machine controller
    /// reaching the target cluster through `target_kubeconfig` when given.
    pub async fn start_controllers(
        &mut self,
        timings: &Timings,
        target_kubeconfig: Option<PathBuf>,
    ) -> Result<()> {
        self.start_manager(timings).await?;
        self.start_machine_controller(timings, target_kubeconfig)
            .await
    }

    /// (Re)starts the manager; each start logs to a new file.
    pub async fn start_manager(&mut self, timings: &Timings) -> Result<()> {
        self.manager_starts += 1;
        let name = match self.manager_starts {
            1 => "manager".to_string(),
            n => format!("manager-{n}"),
        };
        let manager = self.spawn(ControllerKind::Manager, &name, None, timings)?;
        manager.await_ready(WAIT).await?;
        self.manager = Some(manager);
        Ok(())
    }

    /// Starts the manager with `--target-kubeconfig=<target>` (e.g. `none`).
    pub async fn start_manager_with_target(
        &mut self,
        timings: &Timings,
        target: PathBuf,
    ) -> Result<()> {
        self.manager_starts += 1;
        let name = format!("manager-{}", self.manager_starts);
        let manager = self.spawn(ControllerKind::Manager, &name, Some(target), timings)?;
        manager.await_ready(WAIT).await?;
        self.manager = Some(manager);
        Ok(())
    }

    /// SIGKILLs the manager.
    pub fn kill_manager(&mut self) -> Result<u32> {
        let m = self.manager.take().context("the manager is not running")?;
        let pid = m.pid();
        m.kill();
        Ok(pid)
    }

    /// The running manager.
    pub fn manager(&self) -> Result<&Controller> {
        self.manager.as_ref().context("the manager is not running")
    }

    /// (Re)starts the machine controller; each start logs to a new file.
    pub async fn start_machine_controller(
        &mut self,
        timings: &Timings,
        target_kubeconfig: Option<PathBuf>,
    ) -> Result<()> {
        self.machine_starts += 1;
        let name = match self.machine_starts {
            1 => "machine-controller".to_string(),
            n => format!("machine-controller-{n}"),
        };
        let mc = self.spawn(ControllerKind::Machine, &name, target_kubeconfig, timings)?;
        mc.await_ready(WAIT).await?;
        self.machine = Some(mc);
        Ok(())
    }

    fn spawn(
        &self,
        kind: ControllerKind,
        name: &str,
        target: Option<PathBuf>,
        t: &Timings,
    ) -> Result<Controller> {
        self.spawn_with(kind, name, target, t, &[])
    }

    /// Starts a controller process of this scenario that the caller owns (e.g. one of
    /// several replicas), with the scenario's flags followed by `more` (later flags win).
    pub fn spawn_with(
        &self,
        kind: ControllerKind,
        name: &str,
        target: Option<PathBuf>,
        t: &Timings,
        more: &[String],
    ) -> Result<Controller> {
        let kubeconfig = self.cp.kubeconfig_path().to_path_buf();
        let mut extra: Vec<String> = [
            "--v=3",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--machine-safety-overshooting-period=5s",
        ]
        .map(String::from)
        .to_vec();
        if kind == ControllerKind::Machine {
            extra.extend([
                "--machine-creation-timeout=90s".to_string(),
                format!("--machine-health-timeout={}", t.health_timeout),
                format!("--machine-drain-timeout={}", t.drain_timeout),
                format!("--machine-safety-orphan-vms-period={}", t.orphan_period),
                "--machine-safety-apiserver-statuscheck-period=1s".into(),
                format!(
                    "--machine-safety-apiserver-statuscheck-timeout={}",
                    t.statuscheck_timeout
                ),
                "--machine-backoff-max=2s".into(),
                "--machine-eviction-retry-interval=1s".into(),
                "--machine-pv-detach-timeout=10s".into(),
                "--machine-resync-period=5s".into(),
            ]);
        }
        extra.extend(more.iter().cloned());
        Controller::spawn(
            self.bins,
            self.cp,
            &self.dir,
            &ControllerSpec {
                kind,
                name: name.to_string(),
                namespace: self.ns.clone(),
                control_kubeconfig: match (kind, &self.machine_control_kubeconfig) {
                    (ControllerKind::Machine, Some(via)) => via.clone(),
                    _ => kubeconfig.clone(),
                },
                target_kubeconfig: target.unwrap_or(kubeconfig),
                extra,
                env: match kind {
                    ControllerKind::Machine => self.machine_env.clone(),
                    ControllerKind::Manager => Vec::new(),
                },
            },
        )
    }

    /// The workspace binaries.
    pub fn bins(&self) -> &'a Binaries {
        self.bins
    }

    /// The running machine controller.
    pub fn machine_controller(&self) -> Result<&Controller> {
        self.machine
            .as_ref()
            .context("the machine controller is not running")
    }

    /// SIGKILLs the machine controller.
    pub fn kill_machine_controller(&mut self) -> Result<u32> {
        let mc = self
            .machine
            .take()
            .context("the machine controller is not running")?;
        let pid = mc.pid();
        mc.kill();
        Ok(pid)
    }

    pub fn machines_api(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Every Machine of the namespace.
    pub async fn machines(&self) -> Result<Vec<Machine>> {
        Ok(self
            .machines_api()
            .list(&ListParams::default())
            .await
            .context("listing Machines")?
            .items)
    }

    /// The Nodes of this scenario ([`RUN_LABEL`]).
    pub async fn nodes(&self) -> Result<Vec<Node>> {
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.ns));
        Ok(Api::<Node>::all(self.client.clone())
            .list(&lp)
            .await
            .context("listing Nodes")?
            .items)
    }

    /// The pods of the namespace.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        Ok(Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .context("listing Pods")?
            .items)
    }

    /// Machine names with a VM record.
    pub fn vm_records(&self) -> Vec<String> {
        self.state
            .list()
            .map(|(records, _)| records.into_iter().map(|r| r.machine_name).collect())
            .unwrap_or_default()
    }

    /// Live `local-node` processes of this scenario.
    pub fn vm_process_count(&self) -> usize {
        env::vm_processes(self.state.root()).len()
    }

    /// Waits until exactly `n` Machines exist, all Running (and of `class` when given),
    /// with `n` Nodes, all Ready, `n` VM records and `n` live VM processes.
    pub async fn await_fleet(&self, n: usize, class: Option<&str>) -> Result<Vec<Machine>> {
        let what = match class {
            Some(c) => format!("{n} Running machines of class {c}, with Nodes and VMs"),
            None => format!("{n} Running machines, with Nodes and VMs"),
        };
        wait_for(&what, WAIT, || async {
            let machines = self.machines().await?;
            let running = machines.iter().filter(|m| is_running(m)).count();
            let of_class = machines
                .iter()
                .filter(|m| class.is_none_or(|c| class_of(m) == c))
                .count();
            let nodes = self.nodes().await?;
            let ready = nodes.iter().filter(|n| node_ready(n)).count();
            let records = self.vm_records().len();
            let procs = self.vm_process_count();
            let counts = [
                machines.len(),
                running,
                of_class,
                nodes.len(),
                ready,
                records,
                procs,
            ];
            Ok(if counts.iter().all(|c| *c == n) {
                Check::Done(machines)
            } else {
                Check::Pending(format!(
                    "{} machines ({}; {of_class} of the class), {} nodes ({ready} Ready), \
                     {records} VM records, {procs} VM processes",
                    machines.len(),
                    phase_summary(&machines),
                    nodes.len(),
                ))
            })
        })
        .await
    }

    /// Waits until the workload `web` has `n` available pods.
    pub async fn await_workload(&self, n: i32) -> Result<()> {
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.ns);
        wait_for(&format!("{n} available workload pods"), WAIT, || async {
            let d = api.get("web").await.context("reading Deployment web")?;
            let status = d.status.unwrap_or_default();
            let available = status.available_replicas.unwrap_or(0);
            let updated = status.updated_replicas.unwrap_or(0);
            let total = status.replicas.unwrap_or(0);
            Ok(if available == n && total == n && updated == n {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "{available} available, {total} pods, {updated} updated"
                ))
            })
        })
        .await
    }

    /// Stops both controllers (SIGTERM; killed after 10 s), as an operator stops them
    /// before a swap.
    pub async fn stop_controllers(&mut self) {
        if let Some(m) = self.machine.take() {
            m.stop(Duration::from_secs(10)).await;
        }
        if let Some(m) = self.manager.take() {
            m.stop(Duration::from_secs(10)).await;
        }
    }

    /// Stops the controllers, kills the VMs and deletes the scenario's Nodes (releasing the
    /// Node finalizer, which no controller will release any more).
    pub async fn cleanup(mut self) {
        if let Some(m) = self.machine.take() {
            m.stop(Duration::from_secs(2)).await;
        }
        if let Some(m) = self.manager.take() {
            m.stop(Duration::from_secs(2)).await;
        }
        kill_vms(&self.state);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.ns));
        if let Ok(list) = nodes.list(&lp).await {
            let release = json!({ "metadata": { "finalizers": null } });
            let held = |n: &&Node| {
                n.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
            };
            for n in list.items.iter().filter(held) {
                let name = n.metadata.name.clone().unwrap_or_default();
                let _ = nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
                    .await;
            }
        }
        let _ = nodes.delete_collection(&DeleteParams::default(), &lp).await;
    }
}

/// Whether a Machine is Running (and not being deleted).
pub fn is_running(m: &Machine) -> bool {
    m.phase() == Some(&MachinePhase::Running) && m.metadata.deletion_timestamp.is_none()
}

/// The name of a Machine's class.
pub fn class_of(m: &Machine) -> &str {
    m.spec
        .class
        .as_ref()
        .and_then(|c| c.name.as_deref())
        .unwrap_or("")
}

/// Whether a Node's Ready condition is True.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `Running: 2, Pending: 1` for a list of machines.
pub fn phase_summary(machines: &[Machine]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for m in machines {
        *counts
            .entry(m.phase().map_or("(none)", |p| p.as_str()))
            .or_default() += 1;
    }
    counts
        .iter()
        .map(|(p, n)| format!("{p}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Phases seen per machine, in order, recorded from a watch.
pub type PhaseLog = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// Records the phases of the Machines of `api` until the returned task is aborted.
pub fn record_phases(api: Api<Machine>) -> (tokio::task::JoinHandle<()>, PhaseLog) {
    let seen: PhaseLog = Default::default();
    let log = seen.clone();
    let task = tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = ev else {
                continue;
            };
            let (Some(name), Some(phase)) = (m.metadata.name.clone(), m.phase()) else {
                continue;
            };
            let mut seen = log.lock().unwrap_or_else(|e| e.into_inner());
            let list = seen.entry(name).or_default();
            if list.last().map(String::as_str) != Some(phase.as_str()) {
                list.push(phase.as_str().to_string());
            }
        }
    });
    (task, seen)
}

/// A copy of a phase log.
pub fn phases(log: &PhaseLog) -> BTreeMap<String, Vec<String>> {
    log.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
