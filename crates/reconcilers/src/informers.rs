//! One watch per kind per process: the shared reflector stores every controller of a
//! process reads, and the streams that trigger them.
//!
//! A process builds one [`Informers`], lets each controller [`Informer::subscribe`] to the
//! kinds it reacts to (and [`Informer::deletions`] where a deletion matters), then calls
//! [`Informers::start`]: from then on one watch per kind feeds one store, whichever halves of
//! mcm-rs run in the process. Subscriptions are taken before the start (a subscription made
//! later would miss the initial list); each is an unbounded channel that a [`Tap`] fills with
//! the objects themselves after the store applied them, so no subscriber can stall the watch
//! and none can miss a change.
//!
//! kube-runtime's own shared-store subscription (`ReflectHandle`) is not used: it hands out
//! object references and looks each one up in the store when its subscriber polls; when the
//! object was deleted meanwhile it returns `Pending` without arranging a wake-up, and the
//! subscribing controller hears of no further change until another stream wakes it (a
//! MachineSet that missed its machine turning Running because another machine of it had just
//! been deleted).
//!
//! Secrets are watched only when a class references them: the machineclass controller marks
//! them with the label [`CLASS_CREDENTIALS_LABEL`], and the Secret watch selects that label.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Pod, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use mcm_api::{Machine, MachineClass, MachineDeployment, MachineDisruptionBudget, MachineSet};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::decode::{Slim, unwrap_event};

/// The label the machineclass controller puts on every Secret a MachineClass references;
/// the process watches only the Secrets that carry it.
pub const CLASS_CREDENTIALS_LABEL: &str = "machine.sapcloud.io/class-credentials";

/// The watch of one kind: its store, its subscribers, and whether it has listed once.
pub struct Informer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    kind: &'static str,
    /// The kind's API, decoding without managed fields (the stores never hold them).
    api: Api<Slim<K>>,
    config: watcher::Config,
    store: Store<K>,
    writer: Option<Writer<K>>,
    tap: Tap<K>,
    synced: watch::Sender<bool>,
    wanted: bool,
    disabled: bool,
    slim: fn(&mut K),
}

/// Drops from a watched object what no controller reads: its `managedFields`, the
/// server-side-apply bookkeeping of every writer, often the largest part of an object.
/// Stores hold every Machine and Node of a cluster, so this is most of their memory. (The
/// watches decode without them already, through the informers' decoding; this keeps
/// an object that reached the store another way, e.g. in a test, from holding them.)
pub fn forget_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// [`forget_managed_fields`], and every part of a Node's spec and status that no controller
/// reads: its container images (a real node lists dozens), node info, capacity, allocatable,
/// daemon endpoints, pod CIDRs, and whatever later API versions add. Kept is what the
/// controllers read: the metadata; the spec's provider ID, taints and `unschedulable`; the
/// status's conditions, addresses (copied to the Machine) and attached volumes (the drain
/// waits for their detachment). Both processes store every Node of the cluster, so what goes
/// here is memory per node in each of them. No controller writes a Node from its stored copy
/// whole (only patches of the fields above), so nothing dropped here is ever written back.
pub fn slim_node(node: &mut Node) {
    forget_managed_fields(node);
    if let Some(spec) = node.spec.take() {
        node.spec = Some(NodeSpec {
            provider_id: spec.provider_id,
            taints: spec.taints,
            unschedulable: spec.unschedulable,
            ..NodeSpec::default()
        });
    }
    if let Some(status) = node.status.take() {
        node.status = Some(NodeStatus {
            conditions: status.conditions,
            addresses: status.addresses,
            volumes_attached: status.volumes_attached,
            ..NodeStatus::default()
        });
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    /// The informer of a namespaced kind.
    fn new(
        (kind, client, namespace): (&'static str, &Client, &str),
        config: watcher::Config,
    ) -> Self
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>,
    {
        Self::with_api(
            kind,
            Api::<Slim<K>>::namespaced(client.clone(), namespace),
            config,
        )
    }

    /// The informer of a cluster-scoped kind.
    fn cluster(kind: &'static str, client: &Client) -> Self
    where
        K: Resource<Scope = kube::core::ClusterResourceScope>,
    {
        Self::with_api(
            kind,
            Api::<Slim<K>>::all(client.clone()),
            watcher::Config::default(),
        )
    }

    /// Never watched: the store stays empty and counts as synced, subscriptions never
    /// deliver (the kind's cluster does not exist, e.g. `--target-kubeconfig=none`).
    fn disabled(mut self) -> Self {
        self.disabled = true;
        self.synced.send_replace(true);
        self
    }

    /// What is dropped from each object before the store holds it (default:
    /// [`forget_managed_fields`]).
    fn slimmed_by(mut self, slim: fn(&mut K)) -> Self {
        self.slim = slim;
        self
    }

    fn with_api(kind: &'static str, api: Api<Slim<K>>, config: watcher::Config) -> Self {
        let (store, writer) = reflector::store();
        Informer {
            kind,
            api,
            config,
            tap: Tap::new(store.clone()),
            store,
            writer: Some(writer),
            synced: watch::Sender::new(false),
            wanted: false,
            disabled: false,
            slim: forget_managed_fields::<K>,
        }
    }

    /// The store (empty until the first list completed, see [`Informer::synced`]). A kind
    /// is watched only when some controller of the process asked for its store, a
    /// subscription or its deletions.
    pub fn store(&mut self) -> Store<K> {
        self.wanted = true;
        self.store.clone()
    }

    /// A stream of every object the watch applies (and of all objects after each complete
    /// list), for `Controller::for_shared_stream` / `watches_shared_stream` (see [`Tap`]).
    /// Must be taken before [`Informers::start`].
    ///
    /// # Panics
    /// After the watch started (a programming error: the stream would miss events).
    pub fn subscribe(&mut self) -> mpsc::UnboundedReceiver<Arc<K>> {
        assert!(
            self.writer.is_some(),
            "subscribe to {} before the informers start",
            self.kind
        );
        self.wanted = true;
        self.tap.subscribe()
    }

    /// [`Informer::subscribe`] and [`Informer::deletions`] in one stream: every object that
    /// was applied or deleted, for a controller that maps both alike.
    pub fn changes(&mut self) -> impl futures::Stream<Item = Arc<K>> + Send + 'static + use<K> {
        futures::stream::select(self.subscribe(), self.deletions())
    }

    /// The objects deleted from the store from now on (see [`Tap`]).
    pub fn deletions(&mut self) -> mpsc::UnboundedReceiver<Arc<K>> {
        self.wanted = true;
        self.tap.deletions()
    }

    /// Resolves once the store holds a complete list (and at once if it already did). A
    /// kind nobody asked for (see [`Informer::store`]) is never watched and never syncs.
    pub fn synced(&self) -> impl std::future::Future<Output = ()> + Send + 'static + use<K> {
        let mut rx = self.synced.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// Adds [`Informer::synced`] to `all` if the kind is watched.
    fn push_synced(&self, all: &mut Vec<BoxFuture<'static, ()>>) {
        if self.wanted && !self.disabled {
            all.push(self.synced().boxed());
        }
    }

    /// Whether the store holds a complete list.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// The watch, feeding the store, the subscribers and the deletion tap; `None` when it
    /// was started already.
    fn watch(&mut self) -> Option<BoxFuture<'static, ()>> {
        if !self.wanted || self.disabled {
            return None;
        }
        let writer = self.writer.take()?;
        let mut tap = std::mem::replace(&mut self.tap, Tap::new(self.store.clone()));
        let synced = self.synced.clone();
        let kind = self.kind;
        Some(
            watcher(self.api.clone(), self.config.clone())
                .map_ok(unwrap_event)
                .default_backoff()
                .modify(self.slim)
                .reflect(writer)
                .inspect(move |event| match event {
                    Ok(event) => {
                        tap.observe(event);
                        if matches!(event, watcher::Event::InitDone) {
                            synced.send_replace(true);
                        }
                    }
                    Err(error) => tracing::warn!(kind, %error, "watch failed; retrying"),
                })
                .for_each(|_| futures::future::ready(()))
                .boxed(),
        )
    }
}

impl Informer<MachineDisruptionBudget> {
    /// The informer of the MachineDisruptionBudgets of `namespace`. It is kept apart from
    /// [`Informers`] because only the manager reads budgets, and only when the cluster
    /// serves the kind: the manager checks that first and then [`Informer::spawn`]s it.
    pub fn disruption_budgets(control: &Client, namespace: &str) -> Self {
        Informer::new(
            ("MachineDisruptionBudget", control, namespace),
            watcher::Config::default(),
        )
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    /// Starts the watch of this informer alone (one kept apart from [`Informers`]), until
    /// `cancel` fires. Take its subscriptions first.
    pub fn spawn(&mut self, cancel: CancellationToken) {
        if let Some(watch) = self.watch() {
            tokio::spawn(async move {
                tokio::select! {
                    () = watch => {}
                    () = cancel.cancelled() => {}
                }
            });
        }
    }
}

/// Declares [`Informers`] and its reader twin [`Stores`] from one list of kinds.
macro_rules! per_kind {
    ($($(#[$doc:meta])* $field:ident: $kind:ty,)*) => {
        /// The informers of one process: control-cluster kinds of one namespace and
        /// target-cluster Nodes, VolumeAttachments and bound Pods.
        pub struct Informers {
            $($(#[$doc])* pub $field: Informer<$kind>,)*
        }

        /// The stores of every kind of [`Informers`]: what the machine controller reads.
        #[derive(Clone)]
        pub struct Stores {
            $($(#[$doc])* pub $field: Store<$kind>,)*
        }

        impl Informers {
            /// The stores of every kind (each is then watched).
            pub fn stores(&mut self) -> Stores {
                Stores { $($field: self.$field.store(),)* }
            }

            fn watches(&mut self) -> Vec<BoxFuture<'static, ()>> {
                [$(self.$field.watch(),)*].into_iter().flatten().collect()
            }

            fn synced_of_wanted(&self) -> Vec<BoxFuture<'static, ()>> {
                let mut all = Vec::new();
                $(self.$field.push_synced(&mut all);)*
                all
            }
        }
    };
}

per_kind! {
    /// Machines of the namespace.
    machines: Machine,
    /// MachineSets of the namespace.
    sets: MachineSet,
    /// MachineDeployments of the namespace.
    deployments: MachineDeployment,
    /// MachineClasses of the namespace.
    classes: MachineClass,
    /// The Secrets of the namespace that classes reference (label [`CLASS_CREDENTIALS_LABEL`]).
    secrets: Secret,
    /// Nodes of the target cluster.
    nodes: Node,
    /// VolumeAttachments of the target cluster.
    volume_attachments: VolumeAttachment,
    /// Pods of the target cluster bound to a node, slimmed to what a drain reads
    /// ([`mcm_drain::slim_pod`]); watched only by the machine controller, whose drain passes
    /// take a node's pods from it instead of listing them.
    pods: Pod,
}

impl std::fmt::Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

impl Informers {
    /// Informers of `namespace` in the control cluster and of the target cluster. Nothing
    /// is watched before [`Informers::start`].
    pub fn new(control: &Client, target: &Client, namespace: &str) -> Self {
        let ns = |kind| (kind, control, namespace);
        let everything = watcher::Config::default;
        Informers {
            machines: Informer::new(ns("Machine"), everything()),
            sets: Informer::new(ns("MachineSet"), everything()),
            deployments: Informer::new(ns("MachineDeployment"), everything()),
            classes: Informer::new(ns("MachineClass"), everything()),
            secrets: Informer::new(
                ns("Secret"),
                everything().labels(&format!("{CLASS_CREDENTIALS_LABEL}=true")),
            ),
            nodes: Informer::cluster("Node", target).slimmed_by(slim_node),
            volume_attachments: Informer::cluster("VolumeAttachment", target),
            pods: Informer::with_api(
                "Pod",
                Api::all(target.clone()),
                everything().fields("spec.nodeName!="),
            )
            .slimmed_by(mcm_drain::slim_pod),
        }
    }

    /// [`Informers::new`] for a process without a target cluster (`--target-kubeconfig=none`):
    /// Nodes and VolumeAttachments are never watched, their stores stay empty and count as
    /// synced. `control` only names the (unused) API of those kinds.
    pub fn without_target(control: &Client, namespace: &str) -> Self {
        let mut informers = Informers::new(control, control, namespace);
        informers.nodes = Informer::cluster("Node", control).disabled();
        informers.volume_attachments = Informer::cluster("VolumeAttachment", control).disabled();
        informers.pods =
            Informer::with_api("Pod", Api::all(control.clone()), Default::default()).disabled();
        informers
    }

    /// Starts the watch of every kind some controller asked for (and not started yet); they
    /// run until `cancel` fires. Take all subscriptions first.
    pub fn start(&mut self, cancel: CancellationToken) {
        for watch in self.watches() {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = watch => {}
                    () = cancel.cancelled() => {}
                }
            });
        }
    }

    /// Resolves once every kind asked for so far (see [`Informer::store`]) has listed once.
    pub fn synced(&self) -> impl std::future::Future<Output = ()> + Send + 'static + use<> {
        let all = self.synced_of_wanted();
        futures::future::join_all(all).map(|_| ())
    }
}

/// Hands the objects of one watch to the controllers that react to them, after the reflector
/// applied each event to the store (a controller woken by it finds the store up to date):
///
/// - to [`Tap::subscribe`]rs: every applied object (`Apply`), and every object of the store
///   after each complete list (`InitDone`), as kube-runtime's shared stores broadcast them;
/// - to [`Tap::deletions`] subscribers: every deleted object, which kube-runtime's shared
///   streams never report: `Delete` events, and the objects that vanished while the watch was
///   re-listing (after a `410 Gone` or a broken connection the re-list replaces the store
///   wholesale at `InitDone`, without a `Delete` for what is missing): the store's contents at
///   `Init` minus the objects listed again.
///
/// Each subscriber gets the object itself (shared with the store) on an unbounded channel: a
/// tap never blocks the watch that also feeds the store, and a subscriber never has to look
/// an object up in a store that may have lost it since.
pub struct Tap<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    applied: Vec<mpsc::UnboundedSender<Arc<K>>>,
    deleted: Vec<mpsc::UnboundedSender<Arc<K>>>,
    relist: Option<Relist<K>>,
}

/// A re-list in progress: the store before it and the objects listed so far.
struct Relist<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    before: Vec<Arc<K>>,
    listed: HashSet<ObjectRef<K>>,
}

impl<K> std::fmt::Debug for Tap<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap")
            .field("applied", &self.applied.len())
            .field("deleted", &self.deleted.len())
            .field("relisting", &self.relist.is_some())
            .finish_non_exhaustive()
    }
}

impl<K> Tap<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    /// A tap for the watch that feeds `store`.
    pub fn new(store: Store<K>) -> Self {
        Tap {
            store,
            applied: Vec::new(),
            deleted: Vec::new(),
            relist: None,
        }
    }

    /// A stream of the objects applied from now on, for `for_shared_stream` and
    /// `watches_shared_stream`.
    pub fn subscribe(&mut self) -> mpsc::UnboundedReceiver<Arc<K>> {
        let (tx, rx) = mpsc::unbounded();
        self.applied.push(tx);
        rx
    }

    /// A stream of the objects deleted from now on, for `watches_shared_stream`.
    pub fn deletions(&mut self) -> mpsc::UnboundedReceiver<Arc<K>> {
        let (tx, rx) = mpsc::unbounded();
        self.deleted.push(tx);
        rx
    }

    /// Observes one watch event that the reflector has already applied to the store.
    pub fn observe(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) => {
                let stored = self.store.get(&ObjectRef::from_obj(obj));
                let obj = stored.unwrap_or_else(|| Arc::new(obj.clone()));
                send(&mut self.applied, &obj);
            }
            watcher::Event::Delete(obj) => send(&mut self.deleted, &Arc::new(obj.clone())),
            // `Init` leaves the store alone until `InitDone` swaps the new list in.
            watcher::Event::Init => {
                self.relist = Some(Relist {
                    before: self.store.state(),
                    listed: HashSet::new(),
                });
            }
            watcher::Event::InitApply(obj) => {
                if let Some(relist) = &mut self.relist {
                    relist.listed.insert(ObjectRef::from_obj(obj));
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    for gone in relist
                        .before
                        .iter()
                        .filter(|o| !relist.listed.contains(&ObjectRef::from_obj(o.as_ref())))
                    {
                        send(&mut self.deleted, gone);
                    }
                }
                for obj in self.store.state() {
                    send(&mut self.applied, &obj);
                }
            }
        }
    }
}

/// Sends `obj` to every subscriber; a subscriber whose controller stopped is dropped.
fn send<K>(subscribers: &mut Vec<mpsc::UnboundedSender<Arc<K>>>, obj: &Arc<K>) {
    subscribers.retain(|tx| tx.unbounded_send(obj.clone()).is_ok());
}

/// Passes on only the objects whose `fingerprint` changed since the stream last passed that
/// object (e.g. Nodes whose heartbeat alone changed are dropped). Objects with no
/// fingerprint always pass. The fingerprints of objects `store` no longer holds (deleted)
/// are forgotten whenever the record has doubled since it was last pruned, so it stays
/// within twice the live objects however many come and go.
pub fn changed_only<K, S>(
    stream: S,
    fingerprint: fn(&K) -> Option<u64>,
    store: Store<K>,
) -> impl futures::Stream<Item = Arc<K>> + Send + 'static
where
    S: futures::Stream<Item = Arc<K>> + Send + 'static,
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    const PRUNE_FROM: usize = 64;
    let mut seen = std::collections::HashMap::<ObjectRef<K>, u64>::new();
    let mut prune_at = PRUNE_FROM;
    stream.filter(move |obj| {
        let pass = match fingerprint(obj) {
            Some(fp) => seen.insert(ObjectRef::from_obj(obj.as_ref()), fp) != Some(fp),
            None => true,
        };
        if seen.len() >= prune_at {
            seen.retain(|key, _| store.get(key).is_some());
            prune_at = (2 * seen.len()).max(PRUNE_FROM);
        }
        futures::future::ready(pass)
    })
}

/// A stream of `()`, one per notification of `notify`, for `Controller::reconcile_all_on`,
/// at most one per `min_gap`: a notification within `min_gap` of the last one yielded is
/// yielded when the gap has passed (notifications meanwhile count as one; none is lost).
pub fn notifications(
    notify: Arc<tokio::sync::Notify>,
    min_gap: Duration,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    let each = futures::stream::unfold(notify, |n| async move {
        n.notified().await;
        Some(((), n))
    });
    throttled_per_key(each, min_gap)
}

/// Passes each item of `stream` at once, unless an equal item passed less than `gap` ago:
/// such an item is held and passed when the gap has passed, and equal items meanwhile count
/// as one (none is lost; a held item is passed even after `stream` ended). Different items
/// do not wait for each other.
///
/// For the triggers of a controller whose reconcile reads every object of a kind (a
/// MachineSet's reads all machines of its namespace): a burst of machine changes reconciles
/// each set once per `gap` instead of once per change.
pub fn throttled_per_key<T, S>(
    stream: S,
    gap: Duration,
) -> impl futures::Stream<Item = T> + Send + 'static
where
    S: futures::Stream<Item = T> + Send + 'static,
    T: Eq + std::hash::Hash + Clone + Send + 'static,
{
    use std::collections::HashMap;
    use tokio::time::Instant;

    enum Wake<T> {
        Due,
        Item(Option<T>),
    }
    struct State<T, S> {
        input: std::pin::Pin<Box<S>>,
        ended: bool,
        /// When each item last passed (pruned, see [`forget_passed_before`]).
        last: HashMap<T, Instant>,
        /// Items held, with when each may pass.
        held: HashMap<T, Instant>,
    }
    let state: State<T, S> = State {
        input: Box::pin(stream),
        ended: false,
        last: HashMap::new(),
        held: HashMap::new(),
    };
    futures::stream::unfold(state, move |mut s| async move {
        loop {
            let due = s.held.values().min().copied();
            if s.ended && due.is_none() {
                return None;
            }
            // Without a held item there is nothing to wake for but the input.
            let until_due = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let wake = tokio::select! {
                biased;
                () = until_due => Wake::Due,
                item = s.input.next(), if !s.ended => Wake::Item(item),
            };
            let now = Instant::now();
            match wake {
                Wake::Due => {
                    let ready = s
                        .held
                        .iter()
                        .find(|(_, at)| **at <= now)
                        .map(|(k, _)| k.clone());
                    if let Some(key) = ready {
                        s.held.remove(&key);
                        s.last.insert(key.clone(), now);
                        return Some((key, s));
                    }
                }
                Wake::Item(None) => s.ended = true,
                Wake::Item(Some(key)) if s.held.contains_key(&key) => {}
                Wake::Item(Some(key)) => match s.last.get(&key) {
                    Some(&passed) if now < passed + gap => {
                        s.held.insert(key, passed + gap);
                    }
                    _ => {
                        forget_passed_before(&mut s.last, now.checked_sub(gap));
                        s.last.insert(key.clone(), now);
                        return Some((key, s));
                    }
                },
            }
        }
    })
}

/// Forgets the items that passed before `cutoff` (they would pass at once again, as if
/// never seen), so the record holds only the items of the last gap.
fn forget_passed_before<T>(
    last: &mut std::collections::HashMap<T, tokio::time::Instant>,
    cutoff: Option<tokio::time::Instant>,
) {
    if let Some(cutoff) = cutoff {
        last.retain(|_, passed| *passed >= cutoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn machine(name: &str) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..Machine::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn equal_items_within_the_gap_pass_as_one_after_it_and_others_do_not_wait() {
        use futures::StreamExt;
        use tokio::time::Instant;
        let gap = Duration::from_millis(500);
        let (tx, rx) = mpsc::unbounded::<&str>();
        let stream = throttled_per_key(rx, gap);
        futures::pin_mut!(stream);
        let start = Instant::now();
        // The first passes at once.
        tx.unbounded_send("a").unwrap();
        assert_eq!(stream.next().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Three more of it at once are held; another item passes at once meanwhile.
        for _ in 0..3 {
            tx.unbounded_send("a").unwrap();
        }
        tx.unbounded_send("b").unwrap();
        assert_eq!(stream.next().await, Some("b"));
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The three as one, when the gap has passed.
        assert_eq!(stream.next().await, Some("a"));
        assert_eq!(start.elapsed(), gap);
        let none = tokio::time::timeout(Duration::from_secs(60), stream.next()).await;
        assert!(none.is_err(), "the three passed as one");
        // After a quiet time it passes at once again.
        tx.unbounded_send("a").unwrap();
        let later = Instant::now();
        assert_eq!(stream.next().await, Some("a"));
        assert_eq!(later.elapsed(), Duration::ZERO);
        // A held item still passes when the input ends; then the stream ends.
        tx.unbounded_send("a").unwrap();
        drop(tx);
        assert_eq!(stream.next().await, Some("a"));
        assert_eq!(later.elapsed(), gap);
        assert_eq!(stream.next().await, None);
    }

    #[test]
    fn the_throttle_forgets_items_that_passed_before_the_last_gap() {
        let now = tokio::time::Instant::now();
        let gap = Duration::from_secs(1);
        let mut last = std::collections::HashMap::from([
            ("old", now),
            ("recent", now + Duration::from_millis(1500)),
        ]);
        let later = now + Duration::from_secs(2);
        forget_passed_before(&mut last, later.checked_sub(gap));
        assert_eq!(last.keys().copied().collect::<Vec<_>>(), vec!["recent"]);
        forget_passed_before(&mut last, None);
        assert_eq!(last.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn notifications_within_the_gap_come_as_one_after_it() {
        use futures::StreamExt;
        let gap = Duration::from_secs(5);
        let notify = Arc::new(tokio::sync::Notify::new());
        let stream = notifications(notify.clone(), gap);
        futures::pin_mut!(stream);
        // The first comes at once.
        notify.notify_one();
        let start = tokio::time::Instant::now();
        stream.next().await.expect("a notification");
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Three more at once: one, when the gap has passed.
        for _ in 0..3 {
            notify.notify_one();
        }
        stream.next().await.expect("a notification");
        assert_eq!(start.elapsed(), gap);
        let none = tokio::time::timeout(Duration::from_secs(60), stream.next()).await;
        assert!(none.is_err(), "the three counted as one");
        // One after a quiet time longer than the gap comes at once.
        notify.notify_one();
        let later = tokio::time::Instant::now();
        stream.next().await.expect("a notification");
        assert_eq!(later.elapsed(), Duration::ZERO);
    }

    /// Applies `event` to the store as the reflector does, then lets the tap see it.
    fn feed(
        writer: &mut reflector::store::Writer<Machine>,
        tap: &mut Tap<Machine>,
        event: watcher::Event<Machine>,
    ) {
        writer.apply_watcher_event(&event);
        tap.observe(&event);
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Arc<Machine>>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(m) = rx.try_recv() {
            names.push(m.metadata.name.clone().unwrap_or_default());
        }
        names.sort();
        names
    }

    #[test]
    fn deletions_and_objects_lost_in_a_relist_reach_every_subscriber() {
        let (store, mut writer) = reflector::store::<Machine>();
        let mut tap = Tap::new(store);
        let mut first = tap.deletions();
        let mut second = tap.deletions();
        let mut applied = tap.subscribe();

        // Initial list: nothing was known before, nothing is reported deleted; every listed
        // object is applied once the list is complete.
        feed(&mut writer, &mut tap, watcher::Event::Init);
        for n in ["a", "b", "c", "d"] {
            feed(&mut writer, &mut tap, watcher::Event::InitApply(machine(n)));
        }
        assert_eq!(drain(&mut applied), Vec::<String>::new());
        feed(&mut writer, &mut tap, watcher::Event::InitDone);
        assert_eq!(drain(&mut applied), ["a", "b", "c", "d"]);
        feed(&mut writer, &mut tap, watcher::Event::Apply(machine("e")));
        assert_eq!(drain(&mut applied), ["e"]);
        assert_eq!(drain(&mut first), Vec::<String>::new());

        feed(&mut writer, &mut tap, watcher::Event::Delete(machine("a")));
        assert_eq!(drain(&mut first), ["a"]);
        assert_eq!(drain(&mut second), ["a"]);

        // A re-list after a broken watch: `c` and `e` went away meanwhile, `f` is new.
        feed(&mut writer, &mut tap, watcher::Event::Init);
        for n in ["b", "d", "f"] {
            feed(&mut writer, &mut tap, watcher::Event::InitApply(machine(n)));
        }
        assert_eq!(
            drain(&mut first),
            Vec::<String>::new(),
            "not before InitDone"
        );
        feed(&mut writer, &mut tap, watcher::Event::InitDone);
        assert_eq!(drain(&mut first), ["c", "e"]);
        assert_eq!(drain(&mut second), ["c", "e"]);

        // A subscriber that went away does not stop the others.
        drop(first);
        feed(&mut writer, &mut tap, watcher::Event::Delete(machine("b")));
        assert_eq!(drain(&mut second), ["b"]);
        assert_eq!(tap.deleted.len(), 1);
    }

    /// A subscriber that looks at an applied object only after it was deleted from the store
    /// still hears of every later change (the lost wake-up of a MachineSet whose machine
    /// turned Running right after another machine of the set was deleted).
    #[tokio::test]
    async fn an_object_gone_before_its_subscriber_looked_does_not_stall_the_subscription() {
        let (store, mut writer) = reflector::store::<Machine>();
        let mut tap = Tap::new(store.clone());
        let mut sub = tap.subscribe();
        feed(&mut writer, &mut tap, watcher::Event::Init);
        feed(&mut writer, &mut tap, watcher::Event::InitDone);
        // `gone` is applied (its deletion timestamp set), then deleted before the
        // subscriber polls.
        feed(
            &mut writer,
            &mut tap,
            watcher::Event::Apply(machine("gone")),
        );
        feed(
            &mut writer,
            &mut tap,
            watcher::Event::Delete(machine("gone")),
        );
        assert!(store.get(&ObjectRef::new("gone").within("ns")).is_none());
        let wakes = Arc::new(Wakes::default());
        let waker = futures::task::waker(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        // The controller polls its trigger stream until nothing is left (it is told of
        // `gone`'s last state, which its store no longer has), then sleeps until woken.
        let mut seen = Vec::new();
        while let std::task::Poll::Ready(Some(m)) = sub.poll_next_unpin(&mut cx) {
            seen.push(m.metadata.name.clone().unwrap_or_default());
        }
        assert_eq!(seen, ["gone"]);
        let before = wakes.0.load(std::sync::atomic::Ordering::SeqCst);
        // `running` changes next: the subscriber must be woken, and get it.
        feed(
            &mut writer,
            &mut tap,
            watcher::Event::Apply(machine("running")),
        );
        assert!(
            wakes.0.load(std::sync::atomic::Ordering::SeqCst) > before,
            "the subscriber is never woken for the next change"
        );
        let next = sub.poll_next_unpin(&mut cx);
        let name = match next {
            std::task::Poll::Ready(Some(m)) => m.metadata.name.clone(),
            _ => None,
        };
        assert_eq!(name.as_deref(), Some("running"));
    }

    /// Counts the wake-ups of a task.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn changed_only_drops_repeats_of_the_same_fingerprint() {
        fn fp(m: &Machine) -> Option<u64> {
            m.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("v"))
                .and_then(|v| v.parse().ok())
        }
        let with = |name: &str, v: Option<&str>| {
            let mut m = machine(name);
            if let Some(v) = v {
                m.metadata.labels = Some([("v".to_string(), v.to_string())].into());
            }
            Arc::new(m)
        };
        let input = futures::stream::iter(vec![
            with("a", Some("1")),
            with("a", Some("1")),
            with("b", Some("1")),
            with("a", Some("2")),
            with("c", None),
            with("c", None),
        ]);
        let (store, _writer) = reflector::store::<Machine>();
        let out: Vec<String> = changed_only(input, fp, store)
            .map(|m| m.metadata.name.clone().unwrap_or_default())
            .collect()
            .await;
        assert_eq!(out, ["a", "b", "a", "c", "c"]);
    }

    #[tokio::test]
    async fn the_fingerprints_of_deleted_objects_are_forgotten() {
        let (store, mut writer) = reflector::store::<Machine>();
        let numbered = |i: usize| {
            let mut m = machine(&format!("m{i}"));
            m.metadata.labels = Some([("v".to_string(), "1".to_string())].into());
            m
        };
        // One live object (m0); a thousand others come and go (gone from the store). Then m1
        // (gone) and m0 (live) again, unchanged: m1 was forgotten and passes, m0 is dropped.
        writer.apply_watcher_event(&watcher::Event::Apply(numbered(0)));
        let input = (0..1000).chain([1, 0]).map(move |i| Arc::new(numbered(i)));
        let fp = |m: &Machine| m.metadata.labels.as_ref().map(|l| l.len() as u64);
        let passed: Vec<String> = changed_only(futures::stream::iter(input), fp, store)
            .map(|m| m.metadata.name.clone().unwrap_or_default())
            .collect()
            .await;
        assert_eq!(passed.len(), 1001);
        assert_eq!(passed.last().map(String::as_str), Some("m1"));
    }

    #[test]
    fn a_stored_node_keeps_what_controllers_read_and_nothing_else() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "n", "labels": { "a": "b" }, "annotations": { "c": "d" },
                "managedFields": [{ "manager": "kubelet", "operation": "Update" }]
            },
            "spec": {
                "providerID": "local:///n", "unschedulable": true, "podCIDR": "10.1.0.0/24",
                "taints": [{ "key": "k", "effect": "NoSchedule" }]
            },
            "status": {
                "conditions": [{ "type": "Ready", "status": "True" }],
                "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }],
                "volumesAttached": [{ "name": "kubernetes.io/csi/x^v", "devicePath": "" }],
                "images": [{ "names": ["registry/x:1"], "sizeBytes": 1 }],
                "nodeInfo": {
                    "architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
                    "kernelVersion": "k", "kubeProxyVersion": "", "kubeletVersion": "v",
                    "machineID": "m", "operatingSystem": "linux", "osImage": "o",
                    "systemUUID": "s"
                },
                "capacity": { "cpu": "2", "memory": "4Gi", "pods": "110" },
                "allocatable": { "cpu": "2", "memory": "4Gi", "pods": "110" },
                "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
                "config": {},
                "features": { "supplementalGroupsPolicy": true },
                "runtimeHandlers": [{ "name": "runc" }],
                "volumesInUse": ["kubernetes.io/csi/x^v"]
            }
        }))
        .unwrap();
        slim_node(&mut node);
        assert_eq!(node.metadata.managed_fields, None);
        assert_eq!(node.metadata.labels.as_ref().unwrap()["a"], "b");
        assert_eq!(node.metadata.annotations.as_ref().unwrap()["c"], "d");
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("local:///n"));
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.as_ref().unwrap().len(), 1);
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
        assert_eq!(status.addresses.as_ref().unwrap().len(), 1);
        assert_eq!(status.volumes_attached.as_ref().unwrap().len(), 1);
        // Everything else is gone: the slimmed spec and status are the kept fields alone.
        let kept_spec = NodeSpec {
            provider_id: spec.provider_id.clone(),
            taints: spec.taints.clone(),
            unschedulable: spec.unschedulable,
            ..Default::default()
        };
        assert_eq!(spec, &kept_spec);
        let kept = NodeStatus {
            conditions: status.conditions.clone(),
            addresses: status.addresses.clone(),
            volumes_attached: status.volumes_attached.clone(),
            ..Default::default()
        };
        assert_eq!(status, &kept);
    }
}
