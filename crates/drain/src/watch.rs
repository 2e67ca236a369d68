//! Reflector stores with a change signal, and a bounded wait on such signals.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A reflector store kept up to date by a background task, plus a counter bumped after every
/// change applied to the store. Dropping it stops the task.
pub(crate) struct Watched<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub store: Store<K>,
    pub changes: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl<K> Drop for Watched<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a reflector over `api` with `config` (watch errors are retried with backoff); the
/// store keeps each object as `slim` leaves it.
pub(crate) fn watch_objects<K>(api: Api<K>, config: watcher::Config, slim: fn(&mut K)) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let (store, writer) = reflector::store();
    let (tx, changes) = watch::channel(0u64);
    let task = tokio::spawn(async move {
        let stream =
            reflector::reflector(writer, watcher(api, config).default_backoff().modify(slim));
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => tx.send_modify(|n| *n = n.wrapping_add(1)),
                Err(e) => tracing::warn!(error = %e, "watch failed, retrying"),
            }
        }
    });
    Watched {
        store,
        changes,
        task,
    }
}

/// The stores the drain reads and the caller keeps running (shared with its controllers).
#[derive(Clone)]
pub struct Stores {
    /// VolumeAttachments of the target cluster.
    pub volume_attachments: Store<VolumeAttachment>,
    /// Bumped after each change to [`Stores::volume_attachments`], when the caller can tell;
    /// without it the drain re-reads the store on Node events and every
    /// [`STORE_POLL_INTERVAL`].
    pub volume_attachment_changes: Option<watch::Receiver<u64>>,
    /// Nodes of the target cluster, when the caller keeps a store of them: a drain pass then
    /// plans its cordon and its volume check from the store's copy instead of reading the
    /// Node (a cordon written with a stale copy meets a conflict and re-reads the Node).
    pub nodes: Option<Store<Node>>,
    /// Pods of the target cluster that are bound to a node, when the caller keeps a store of
    /// them (slimmed by [`slim_pod`]): a drain pass then takes the node's pods from it instead
    /// of listing them (one request per pass). A pod bound moments before the cordon may not
    /// be in the store yet, as with any informer (the Go MCM's drain reads pods from its
    /// informer too).
    pub pods: Option<Store<Pod>>,
}

/// Drops an object's `managedFields`, which nothing in the drain reads.
pub(crate) fn without_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Drops from a watched pod what the drain never reads: `managedFields`, its containers
/// (images, commands, environment, probes: most of a pod), and every status field but the
/// phase. What stays: metadata (owners, labels for disruption budgets, annotations for drain
/// rules, deletion), `nodeName`, volumes, priority and the termination grace period.
pub fn slim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name,
            volumes: spec.volumes,
            priority: spec.priority,
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase,
            ..Default::default()
        });
    }
}

impl Stores {
    /// Stores from a VolumeAttachment store the caller runs, without change notifications.
    pub fn new(volume_attachments: Store<VolumeAttachment>) -> Self {
        Stores {
            volume_attachments,
            volume_attachment_changes: None,
            nodes: None,
            pods: None,
        }
    }

    /// These stores with a store of the target cluster's bound pods the caller runs (see
    /// [`Stores::pods`]).
    pub fn with_pods(mut self, pods: Store<Pod>) -> Self {
        self.pods = Some(pods);
        self
    }

    /// The pods bound to `node_name` as the pod store has them; `None` without a pod store.
    pub fn pods_of(&self, node_name: &str) -> Option<Vec<Pod>> {
        let store = self.pods.as_ref()?;
        Some(
            store
                .state()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name))
                .map(|p| Pod::clone(p))
                .collect(),
        )
    }

    /// These stores with a Node store the caller runs.
    pub fn with_nodes(mut self, nodes: Store<Node>) -> Self {
        self.nodes = Some(nodes);
        self
    }

    /// The node as the Node store has it, if there is one and it has the node.
    pub fn node(&self, name: &str) -> Option<std::sync::Arc<Node>> {
        self.nodes
            .as_ref()
            .and_then(|s| s.get(&kube::runtime::reflector::ObjectRef::new(name)))
    }
}

impl Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("volume_attachments", &self.volume_attachments.state().len())
            .finish_non_exhaustive()
    }
}

/// How often stores are re-read when no change notification arrives.
pub const STORE_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A running VolumeAttachment reflector (see [`start_volume_attachment_reflector`]). Dropping
/// it stops the reflector.
pub struct VolumeAttachmentReflector {
    watched: Watched<VolumeAttachment>,
}

impl VolumeAttachmentReflector {
    /// The stores to pass to [`crate::drain`].
    pub fn stores(&self) -> Stores {
        Stores {
            volume_attachments: self.watched.store.clone(),
            volume_attachment_changes: Some(self.watched.changes.clone()),
            nodes: None,
            pods: None,
        }
    }
}

impl Debug for VolumeAttachmentReflector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeAttachmentReflector")
            .finish_non_exhaustive()
    }
}

/// Starts a reflector over all VolumeAttachments of the target cluster in a background task
/// (for tests and callers without their own). Must be called within a tokio runtime.
pub fn start_volume_attachment_reflector(client: kube::Client) -> VolumeAttachmentReflector {
    VolumeAttachmentReflector {
        watched: watch_objects(
            Api::all(client),
            watcher::Config::default(),
            without_managed_fields,
        ),
    }
}

/// Marks the current values of `receivers` as seen.
pub(crate) fn mark_seen(receivers: &mut [watch::Receiver<u64>]) {
    for r in receivers.iter_mut() {
        r.borrow_and_update();
    }
}

/// Waits until one of `receivers` changes, `poll` elapses, or `deadline` passes, whichever is
/// first. Closed receivers are ignored.
pub(crate) async fn wait_for_change(
    receivers: &mut [watch::Receiver<u64>],
    poll: Duration,
    deadline: Instant,
) {
    let wake_at = deadline.min(Instant::now() + poll);
    let open: Vec<_> = receivers
        .iter_mut()
        .filter(|r| r.has_changed().is_ok())
        .map(|r| Box::pin(r.changed()))
        .collect();
    if open.is_empty() {
        tokio::time::sleep_until(wake_at).await;
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep_until(wake_at) => {}
        _ = futures::future::select_all(open) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "labels": { "app": "web" },
                "annotations": { "a": "b" },
                "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "u", "controller": true }],
                "managedFields": [{ "manager": "kubectl" }],
            },
            "spec": {
                "nodeName": node, "priority": 7, "terminationGracePeriodSeconds": 30,
                "containers": [{ "name": "c", "image": "registry.example/web:1",
                    "env": [{ "name": "A", "value": "1" }] }],
                "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "c" } }],
            },
            "status": { "phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{ "type": "Ready", "status": "True" }] },
        }))
        .unwrap()
    }

    #[test]
    fn a_slim_pod_keeps_what_the_drain_reads() {
        let full = pod("p", "n1");
        let mut slim = full.clone();
        slim_pod(&mut slim);
        assert!(slim.metadata.managed_fields.is_none());
        assert_eq!(slim.metadata.labels, full.metadata.labels);
        assert_eq!(slim.metadata.annotations, full.metadata.annotations);
        assert_eq!(
            slim.metadata.owner_references,
            full.metadata.owner_references
        );
        let (spec, full_spec) = (slim.spec.clone().unwrap(), full.spec.clone().unwrap());
        assert_eq!(spec.node_name, full_spec.node_name);
        assert_eq!(spec.volumes, full_spec.volumes);
        assert_eq!(spec.priority, Some(7));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert!(spec.containers.is_empty(), "containers dropped");
        let status = slim.status.clone().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.conditions.is_none() && status.pod_ip.is_none());
        // The drain classifies the slim pod as the full one.
        assert_eq!(
            format!("{:?}", crate::classify_pod(&slim)),
            format!("{:?}", crate::classify_pod(&full))
        );
        assert_eq!(crate::classify::pod_priority(&slim), 7);
    }

    #[test]
    fn a_nodes_pods_come_from_the_pod_store_when_there_is_one() {
        let (vas, _) = reflector::store::<VolumeAttachment>();
        let stores = Stores::new(vas.clone());
        assert_eq!(stores.pods_of("n1"), None, "no pod store: the pass lists");
        let (pods, mut writer) = reflector::store::<Pod>();
        for p in [pod("a", "n1"), pod("b", "n2"), pod("c", "n1")] {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let stores = Stores::new(vas).with_pods(pods);
        let mut names: Vec<String> = stores
            .pods_of("n1")
            .expect("a pod store")
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        assert_eq!(names, ["a", "c"]);
    }
}
