//! Reflector stores with a change signal, and a bounded wait on such signals.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
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

/// Starts a reflector over `api` with `config` (watch errors are retried with backoff).
pub(crate) fn watch_objects<K>(api: Api<K>, config: watcher::Config) -> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let (store, writer) = reflector::store();
    let (tx, changes) = watch::channel(0u64);
    let task = tokio::spawn(async move {
        // Nothing here reads managedFields; a store holds every object of the kind.
        let stream = reflector::reflector(
            writer,
            watcher(api, config)
                .default_backoff()
                .modify(|o: &mut K| o.meta_mut().managed_fields = None),
        );
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
}

impl Stores {
    /// Stores from a VolumeAttachment store the caller runs, without change notifications.
    pub fn new(volume_attachments: Store<VolumeAttachment>) -> Self {
        Stores {
            volume_attachments,
            volume_attachment_changes: None,
            nodes: None,
        }
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
        watched: watch_objects(Api::all(client), watcher::Config::default()),
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
