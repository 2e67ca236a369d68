//! Helpers for the manager's integration tests: a running manager per test namespace, a
//! stand-in machine controller, and the waits of `mcm_testenv::kit`.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use mcm_reconcilers::manager::{ManagerConfig, run_manager};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use mcm_testenv::kit::{TestNamespace, await_list, eventually};

/// Longest a single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(60);

/// A manager and a fake machine controller running for one namespace.
pub struct Harness {
    pub client: Client,
    pub ns: String,
    stop: Option<oneshot::Sender<()>>,
    manager: Option<JoinHandle<()>>,
    fake: JoinHandle<()>,
}

impl Harness {
    pub async fn start(prefix: &str) -> Harness {
        Self::start_with(prefix, |_| {}).await
    }

    /// [`Harness::start`] with the manager's configuration changed by `configure`.
    pub async fn start_with(prefix: &str, configure: impl FnOnce(&mut ManagerConfig)) -> Harness {
        Self::start_playing(prefix, configure, None).await
    }

    /// [`Harness::start`] with VMs that boot for `boot` ([`slow_machine_controller`]).
    pub async fn start_slow(prefix: &str, boot: Duration) -> Harness {
        Self::start_playing(prefix, |_| {}, Some(boot)).await
    }

    /// A namespace of its own, for objects that exist before the manager starts
    /// ([`Harness::start_in`]).
    pub async fn namespace(prefix: &str) -> (Client, String) {
        let TestNamespace { client, ns, .. } = TestNamespace::new(
            mcm_testenv::Components {
                controller_manager: true,
                scheduler: false,
            },
            prefix,
        )
        .await;
        (client, ns)
    }

    /// [`Harness::start`] in the namespace `ns` of [`Harness::namespace`].
    pub async fn start_in(client: Client, ns: String) -> Harness {
        Self::run_in(client, ns, |_| {}, None)
    }

    async fn start_playing(
        prefix: &str,
        configure: impl FnOnce(&mut ManagerConfig),
        boot: Option<Duration>,
    ) -> Harness {
        let (client, ns) = Self::namespace(prefix).await;
        Self::run_in(client, ns, configure, boot)
    }

    fn run_in(
        client: Client,
        ns: String,
        configure: impl FnOnce(&mut ManagerConfig),
        boot: Option<Duration>,
    ) -> Harness {
        let (tx, rx) = oneshot::channel::<()>();
        let mut config = ManagerConfig {
            namespace: ns.clone(),
            concurrent_syncs: 4,
            overshooting_period: Duration::from_millis(500),
            ready: Arc::new(AtomicBool::new(false)),
            ..ManagerConfig::default()
        };
        configure(&mut config);
        let (c1, c2) = (client.clone(), client.clone());
        let manager = tokio::spawn(async move {
            let mut registry = prometheus_client::registry::Registry::default();
            run_manager(c1, c2, config, &mut registry, async move {
                let _ = rx.await;
            })
            .await;
        });
        let fake = match boot {
            None => tokio::spawn(fake_machine_controller(client.clone(), ns.clone())),
            Some(boot) => tokio::spawn(slow_machine_controller(client.clone(), ns.clone(), boot)),
        };
        Harness {
            client,
            ns,
            stop: Some(tx),
            manager: Some(manager),
            fake,
        }
    }

    pub fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn deployments(&self) -> Api<MachineDeployment> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn sets(&self) -> Api<mcm_api::MachineSet> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(m) = self.manager.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), m).await;
        }
        self.fake.abort();
    }
}

/// What the tests watch: the kinds of the control plane.
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static
{
}

/// Sets the phase of the machine `name` to `Running`, as the machine controller does. A
/// failed write is retried (a loaded API server can time a request out, and no later watch
/// event would bring the machine back); a machine that is gone is left alone.
async fn set_running(api: &Api<Machine>, name: &str) {
    const ATTEMPTS: u32 = 20;
    for attempt in 1..=ATTEMPTS {
        let patch = json!({"status": {"currentStatus": {
            "phase": "Running",
            "lastUpdateTime": Time(jiff::Timestamp::now()),
        }}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => {
                eprintln!("fake machine controller: {name} not set Running ({attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(100) * attempt).await;
            }
        }
    }
}

/// Plays the machine controller: every new machine becomes `Running` at once.
pub async fn fake_machine_controller(client: Client, ns: String) {
    let api: Api<Machine> = Api::namespaced(client, &ns);
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(ev) = stream.next().await {
        let Ok(m) = ev else { continue };
        if m.metadata.deletion_timestamp.is_some() || m.phase().is_some() {
            continue;
        }
        set_running(&api, &m.name_any()).await;
    }
}

/// The finalizer [`slow_machine_controller`] holds its machines with.
pub const SLOW_FINALIZER: &str = "test.mcm-rs.io/vm";

/// Plays a machine controller whose VMs take `boot` to become `Running`: a new machine gets
/// a finalizer at once and turns Running after `boot`; a deleted machine loses its finalizer
/// at once (so its last update and its removal follow each other closely, as when the real
/// machine controller finishes a deletion).
pub async fn slow_machine_controller(client: Client, ns: String, boot: Duration) {
    let api: Api<Machine> = Api::namespaced(client, &ns);
    let mut booting = std::collections::BTreeSet::new();
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(ev) = stream.next().await {
        let Ok(m) = ev else { continue };
        let name = m.name_any();
        let held = m.finalizers().iter().any(|f| f == SLOW_FINALIZER);
        if m.metadata.deletion_timestamp.is_some() {
            if held {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
            continue;
        }
        if m.phase().is_some() || !booting.insert(name.clone()) {
            continue;
        }
        let patch = json!({"metadata": {"finalizers": [SLOW_FINALIZER]}});
        let _ = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let api = api.clone();
        tokio::spawn(async move {
            tokio::time::sleep(boot).await;
            set_running(&api, &name).await;
        });
    }
}

pub async fn create_deployment(h: &Harness, d: &MachineDeployment) {
    h.deployments()
        .create(&PostParams::default(), d)
        .await
        .expect("create deployment");
}

pub async fn patch_deployment(h: &Harness, name: &str, patch: serde_json::Value) {
    h.deployments()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch deployment");
}

pub fn class_of(m: &Machine) -> Option<String> {
    m.spec.class.as_ref().and_then(|c| c.name.clone())
}

pub fn is_running(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_none() && m.phase() == Some(&MachinePhase::Running)
}

/// Waits (on a watch) until the namespace's machines satisfy `pred`.
pub async fn wait_machines(
    h: &Harness,
    what: &str,
    pred: impl Fn(&[Machine]) -> bool,
) -> Vec<Machine> {
    await_list(h.machines(), WAIT, what, pred).await
}

/// Waits (on a watch) until the objects of `api` satisfy `pred`, for at most [`WAIT`].
pub async fn wait_list<K: Watched>(api: Api<K>, what: &str, pred: impl Fn(&[K]) -> bool) -> Vec<K> {
    await_list(api, WAIT, what, pred).await
}

/// Waits until the manager's Machine store holds what the test has written to the machine
/// `name` so far (the test's own watch seeing a write says nothing about the manager's): gives
/// the machine a Node template label and waits until its MachineSet, which syncs its
/// machines' specs from that store, has taken it away again. For a machine of a MachineSet
/// whose template has no Node template.
pub async fn manager_caught_up(h: &Harness, name: &str) {
    let fence =
        json!({"spec": {"nodeTemplate": {"metadata": {"labels": {"test.mcm-rs/fence": "up"}}}}});
    h.machines()
        .patch(name, &PatchParams::default(), &Patch::Merge(&fence))
        .await
        .expect("give the machine a Node template");
    let what = format!("the manager to take {name}'s Node template away");
    eventually(WAIT, &what, || async {
        h.machines()
            .get(name)
            .await
            .map(|m| m.spec.node_template.is_none())
    })
    .await;
}

pub fn running_of_class(ms: &[Machine], class: &str) -> usize {
    ms.iter()
        .filter(|m| is_running(m) && class_of(m).as_deref() == Some(class))
        .count()
}
