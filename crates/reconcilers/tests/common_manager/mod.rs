//! Helpers for the manager's integration tests: a running manager per test namespace, a
//! stand-in machine controller, and watch-based waits.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use mcm_api::{
    ClassSpec, Machine, MachineDeployment, MachineDeploymentSpec, MachineDeploymentStrategy,
    MachinePhase, MachineSpec, MachineTemplateSpec,
};
use mcm_reconcilers::manager::{ManagerConfig, run_manager};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
        let cp = mcm_testenv::shared(mcm_testenv::Components {
            controller_manager: true,
            scheduler: false,
        })
        .await
        .expect("control plane");
        let client = cp.client().await.expect("client");
        let ns = cp.namespace(prefix).await.expect("namespace");
        let (tx, rx) = oneshot::channel::<()>();
        let config = ManagerConfig {
            namespace: ns.clone(),
            concurrent_syncs: 4,
            overshooting_period: Duration::from_millis(500),
            ready: Arc::new(AtomicBool::new(false)),
            ..ManagerConfig::default()
        };
        let (c1, c2) = (client.clone(), client.clone());
        let manager = tokio::spawn(async move {
            let mut registry = prometheus_client::registry::Registry::default();
            run_manager(c1, c2, config, &mut registry, async move {
                let _ = rx.await;
            })
            .await;
        });
        let fake = tokio::spawn(fake_machine_controller(client.clone(), ns.clone()));
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
        let patch = json!({"status": {"currentStatus": {
            "phase": "Running",
            "lastUpdateTime": Time(jiff::Timestamp::now()),
        }}});
        let _ = api
            .patch_status(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
    }
}

pub fn template(class: &str, name: &str) -> MachineTemplateSpec {
    MachineTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([("name".to_owned(), name.to_owned())])),
            ..ObjectMeta::default()
        }),
        spec: Some(MachineSpec {
            class: Some(ClassSpec {
                kind: Some("MachineClass".into()),
                name: Some(class.into()),
                ..ClassSpec::default()
            }),
            ..MachineSpec::default()
        }),
    }
}

pub fn deployment(
    name: &str,
    replicas: i32,
    class: &str,
    strategy: Option<MachineDeploymentStrategy>,
) -> MachineDeployment {
    MachineDeployment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: MachineDeploymentSpec {
            replicas: Some(replicas),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("name".to_owned(), name.to_owned())])),
                ..LabelSelector::default()
            }),
            template: template(class, name),
            strategy,
            ..MachineDeploymentSpec::default()
        },
        ..MachineDeployment::default()
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
    wait_list(h.machines(), what, pred).await
}

/// Waits (on a watch) until the objects of `api` satisfy `pred`.
pub async fn wait_list<K>(api: Api<K>, what: &str, pred: impl Fn(&[K]) -> bool) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    wait_list_within(api, what, WAIT, pred).await
}

/// Waits (on a watch) at most `limit` until the objects of `api` satisfy `pred`; panics with
/// the objects as they are then.
pub async fn wait_list_within<K>(
    api: Api<K>,
    what: &str,
    limit: Duration,
    pred: impl Fn(&[K]) -> bool,
) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = kube::runtime::reflector::store::<K>();
    let mut stream = kube::runtime::reflector::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default()),
    )
    .default_backoff()
    .boxed();
    let result = tokio::time::timeout(limit, async {
        let mut ready = false;
        loop {
            match stream.next().await {
                None => break None,
                Some(Ok(watcher::Event::InitDone)) => ready = true,
                Some(_) => {}
            }
            if !ready {
                continue;
            }
            let items: Vec<K> = reader.state().iter().map(|x| (**x).clone()).collect();
            if pred(&items) {
                break Some(items);
            }
        }
    })
    .await;
    match result {
        Ok(Some(items)) => items,
        _ => {
            let now = api.list(&ListParams::default()).await.map(|l| l.items);
            panic!("timed out after {limit:?} waiting for {what}; now: {now:#?}");
        }
    }
}

pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

pub fn running_of_class(ms: &[Machine], class: &str) -> usize {
    ms.iter()
        .filter(|m| is_running(m) && class_of(m).as_deref() == Some(class))
        .count()
}
