//! What a machine reconcile reads and uses: clients, driver, stores, permits, backoff.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{Driver, DriverError};
use mcm_permits::PermitGiver;

use super::memory::{
    Backoff, PartitionHolds, RecentWrites, TopicRecords, UnmanagedNodes, asked_delay,
    resource_version,
};
use super::model::Topic;
use super::policy::backoff_delay;
use super::{Freeze, MachineMetrics, Settings, observe};
use crate::events::EventPublisher;
pub(crate) use crate::informers::Stores;
use crate::kube_api::ApiErrorExt;

/// Everything a machine reconcile needs.
pub(crate) struct Ctx {
    /// Client of the control cluster (Machines, classes, secrets).
    pub control: kube::Client,
    /// Client of the target cluster (Nodes, pods, bootstrap tokens).
    pub target: kube::Client,
    /// Client of the target cluster for evictions: it does not retry `429` answers, which
    /// are a PodDisruptionBudget's refusals (see [`mcm_drain::Options::eviction_client`]).
    pub evictions: kube::Client,
    /// The provider driver.
    pub driver: Arc<dyn Driver>,
    /// Settings.
    pub settings: Settings,
    /// The stores it reads (also reachable through `Deref`: `ctx.stores.machines`).
    pub stores: Stores,
    /// VolumeAttachments of the target cluster, shared with drain.
    pub drain_stores: mcm_drain::Stores,
    /// Events on Machines (control cluster).
    pub events: EventPublisher,
    /// Events on Nodes (target cluster).
    pub node_events: EventPublisher,
    /// Replacement budget per MachineDeployment (meltdown protection).
    pub permits: PermitGiver,
    /// Set by the safety controller.
    pub freeze: Freeze,
    /// Metrics.
    pub metrics: MachineMetrics,
    /// Wakes the orphan collector (after a deletion, leftovers of the VM are looked for).
    pub orphan_trigger: Arc<tokio::sync::Notify>,
    /// Set to `true` once every store above has synced: until then a missing Node or
    /// VolumeAttachment in a store is no evidence that it does not exist, so no reconcile
    /// decides before (a restarted controller would otherwise skip the drain of a node it
    /// has not listed yet).
    pub synced: tokio::sync::watch::Sender<bool>,
    /// Where a reconcile takes "now" from (once, when it gathers).
    pub clock: crate::clock::SharedClock,
    /// The backoff of machines whose last attempt failed.
    backoff: Backoff,
    /// Nodes last seen not managed by MCM (their deletion leaves their Machines).
    unmanaged: UnmanagedNodes,
    /// Our last write of a Node (by name): its resourceVersion and when, until the Node
    /// store holds it (see [`Ctx::node_store_is_behind`]).
    node_writes: RecentWrites,
    /// The resourceVersion of this controller's last write to each Machine (by uid) and when
    /// it was written: see [`Ctx::store_is_behind`].
    own_writes: RecentWrites,
    /// The warning last announced per machine (by uid), per topic.
    announced: TopicRecords,
    /// Machines held by a zone partition.
    partition_holds: PartitionHolds,
    /// Machines forgotten so far (every [`SWEEP_EVERY`]th sweeps the records).
    forgotten: std::sync::atomic::AtomicU64,
}

/// How many deleted machines are forgotten one by one between two sweeps of every record
/// of machines the store no longer has.
const SWEEP_EVERY: u64 = 64;

impl Ctx {
    /// Builds a context.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        control: kube::Client,
        target: kube::Client,
        evictions: kube::Client,
        driver: Arc<dyn Driver>,
        settings: Settings,
        stores: Stores,
        drain_stores: mcm_drain::Stores,
        freeze: Freeze,
        metrics: MachineMetrics,
        clock: crate::clock::SharedClock,
    ) -> Self {
        Ctx {
            events: EventPublisher::new(control.clone(), "machine-controller")
                .with_clock(clock.clone()),
            node_events: EventPublisher::new(target.clone(), "machine-controller")
                .with_clock(clock.clone()),
            control,
            target,
            evictions,
            driver,
            settings,
            stores,
            drain_stores,
            permits: PermitGiver::new(),
            freeze,
            metrics,
            orphan_trigger: Arc::new(tokio::sync::Notify::new()),
            synced: tokio::sync::watch::Sender::new(false),
            clock,
            backoff: Backoff::default(),
            unmanaged: UnmanagedNodes::default(),
            node_writes: RecentWrites::default(),
            own_writes: RecentWrites::default(),
            announced: TopicRecords::default(),
            partition_holds: PartitionHolds::default(),
            forgotten: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A class of the namespace from the store (shared with it: a reconcile that only asks
    /// whether the class exists copies nothing).
    pub(crate) fn class(&self, name: &str) -> Option<Arc<MachineClass>> {
        self.stores
            .classes
            .get(&ObjectRef::new(name).within(&self.settings.namespace))
    }

    /// A Secret from the store of class-referenced Secrets.
    pub(crate) fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.stores
            .secrets
            .get(&ObjectRef::new(name).within(namespace))
    }

    /// A Secret a class references: from the store, or, for one the store does not hold yet
    /// (the class controller has not labelled it for the watch, or it lives in another
    /// namespace), from the API server. `None`: it does not exist.
    pub(crate) async fn class_secret(
        &self,
        r: &observe::SecretRef,
    ) -> Result<Option<Arc<Secret>>, super::Error> {
        if let Some(secret) = self.secret(&r.namespace, &r.name) {
            return Ok(Some(secret));
        }
        let api: kube::Api<Secret> = kube::Api::namespaced(self.control.clone(), &r.namespace);
        api.get_opt(&r.name)
            .await
            .map(|s| s.map(Arc::new))
            .map_err(|e| super::Error::kube("read a class secret", e))
    }

    /// Notes a Node as the Node watch delivers it, changed or deleted: the deletion of a Node
    /// last seen annotated not-managed-by-MCM does not delete its Machine. Noting every change
    /// (not only the deletion) matters: a reconcile may see the Node gone from the store before
    /// the deletion tap ran, and then only the annotated update it saw earlier tells.
    pub(crate) fn note_node(&self, node: &Node) {
        self.unmanaged
            .note(node.name_any(), observe::node_not_managed(node));
    }

    /// Whether the Node `name` was last seen not managed by MCM (asked when it is gone).
    pub(crate) fn unmanaged_node_deleted(&self, name: &str) -> bool {
        self.unmanaged.contains(name)
    }

    /// Notes a write of this controller to a Machine: `written` is the object the API server
    /// answered with.
    pub(crate) fn note_own_write(&self, written: &Machine) {
        let (Some(uid), Some(rv)) = (written.uid(), resource_version(&written.metadata)) else {
            return;
        };
        self.own_writes.note(uid, rv, self.clock.instant());
        self.publish_tracked();
    }

    /// Notes a write of ours to a Node (`written`, as the API server answered): until the
    /// Node store holds it, a write planned from the store's copy would repeat it.
    pub(crate) fn note_node_write(&self, written: &Node) {
        if let Some(rv) = resource_version(&written.metadata) {
            self.node_writes
                .note(written.name_any(), rv, self.clock.instant());
        }
    }

    /// Writes `patch` to the Node `name` as a strategic merge patch without a resourceVersion
    /// guard (the patch names only what it changes, so it cannot lose anybody's change), and
    /// notes the write ([`Ctx::note_node_write`]). A Node that is gone is fine: there is nothing
    /// left to change. `what` names the write in the error.
    pub(crate) async fn patch_node_unguarded(
        &self,
        name: &str,
        patch: &serde_json::Value,
        what: &'static str,
    ) -> Result<(), super::Error> {
        let nodes: Api<Node> = Api::all(self.target.clone());
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(written) => {
                self.note_node_write(&written);
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(super::Error::kube(what, e)),
        }
    }

    /// Whether the Node store's `copy` predates our own last write of that Node (for at most
    /// [`OWN_WRITE_WAIT`](super::memory::OWN_WRITE_WAIT)): planning a write from it would write again what was just written.
    pub(crate) fn node_store_is_behind(&self, copy: &Node) -> bool {
        self.node_writes.is_behind(
            &copy.name_any(),
            resource_version(&copy.metadata),
            self.clock.instant(),
        ) == Some(true)
    }

    /// Notes that this controller finished `m` (removed its finalizer): the Machine is about
    /// to disappear, and every copy the store still holds predates that (a reconcile queued
    /// meanwhile would start the deletion's last step again and delete the VM a second time).
    /// Such copies count as behind ([`Ctx::store_is_behind`]) until the store drops the
    /// Machine, or for [`OWN_WRITE_WAIT`](super::memory::OWN_WRITE_WAIT) at most.
    pub(crate) fn note_finished(&self, m: &Machine) {
        let Some(uid) = m.uid() else { return };
        // Nothing more is announced for it.
        self.announced.forget(&uid);
        if !self.in_store(m) {
            // Gone already (its deletion was seen): no copy is left to hold back.
            self.publish_tracked();
            return;
        }
        self.own_writes.note(uid, u64::MAX, self.clock.instant());
        self.publish_tracked();
    }

    /// Whether the store's copy `m` predates this controller's own last write to it. Acting
    /// on such a copy repeats a step that is already done: a reconcile woken by a Node
    /// before the watch delivered the providerID patch would look for the VM again and count
    /// a second creation. The watch event of the write wakes the machine once the store has
    /// it. ResourceVersions are compared as the integers the API server issues (comparable
    /// since Kubernetes 1.35); a copy whose version is not an integer is never held back.
    pub(crate) fn store_is_behind(&self, m: &Machine) -> bool {
        let Some(uid) = m.uid() else { return false };
        match self
            .own_writes
            .is_behind(&uid, resource_version(&m.metadata), self.clock.instant())
        {
            Some(behind) => {
                if !behind {
                    self.publish_tracked();
                }
                behind
            }
            None => false,
        }
    }

    /// What was last announced under `topic` for `m`.
    pub(crate) fn last_announced(&self, m: &Machine, topic: Topic) -> Option<String> {
        self.announced.of(topic).last(&m.uid().unwrap_or_default())
    }

    /// Remembers `text` as announced under `topic` for `m` (empty: forgets it).
    pub(crate) fn remember_announced(&self, m: &Machine, topic: Topic, text: &str) {
        let uid = m.uid().unwrap_or_default();
        let record = self.announced.of(topic);
        let changed = if text.is_empty() {
            record.forget(&uid)
        } else {
            record.is_new(&uid, text)
        };
        if changed {
            self.publish_tracked();
        }
    }

    pub(crate) fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.stores.nodes.get(&ObjectRef::new(name))
    }

    /// The retry delay after a failure of `m`: what the cloud asked for, or the
    /// resource-exhausted period, or exponential per consecutive failure. It is kept as the
    /// machine's next attempt (see [`Self::backoff_left`]) whichever it is: the failure's own
    /// status write wakes the machine at once, and must not make it try again before then.
    pub(crate) fn backoff(&self, m: &Machine, err: Option<&DriverError>) -> Duration {
        if !self.in_store(m) {
            // Deleted meanwhile: nothing will read a record of it.
            return asked_delay(err, &self.settings).unwrap_or_else(|| {
                backoff_delay(self.settings.backoff_initial, self.settings.backoff_max, 1)
            });
        }
        let uid = m.uid().unwrap_or_default();
        let delay = self
            .backoff
            .after_failure(&uid, err, &self.settings, self.clock.instant());
        if !self.in_store(m) {
            // Deleted between the look above and the record: the deletion's forgetting may
            // have run before the record was made.
            self.reset_backoff(m);
            return delay;
        }
        self.publish_tracked();
        delay
    }

    /// How long `m` must still wait before its next attempt after a failure (`None`: it may
    /// go on now).
    pub(crate) fn backoff_left(&self, m: &Machine) -> Option<Duration> {
        self.backoff
            .left(&m.uid().unwrap_or_default(), self.clock.instant())
    }

    /// Forgets the backoff of `m` (its step succeeded).
    pub(crate) fn reset_backoff(&self, m: &Machine) {
        self.backoff.reset(&m.uid().unwrap_or_default());
        self.publish_tracked();
    }

    /// Whether the Machines store holds `m` (this very object: same uid).
    fn in_store(&self, m: &Machine) -> bool {
        self.stores
            .machines
            .get(&ObjectRef::from_obj(m))
            .is_some_and(|stored| stored.uid() == m.uid())
    }

    /// Forgets what this process keeps for `m` between reconciles (backoff, its own last
    /// write, announcements) once the watch reports the Machine deleted. The deletion's last
    /// step forgets most of it; a Machine removed without that step (its finalizer stripped
    /// by hand) would otherwise stay in these maps until a restart.
    pub(crate) fn forget_machine(&self, m: &Machine) {
        let Some(uid) = m.uid() else { return };
        self.backoff.reset(&uid);
        self.own_writes.remove(&uid);
        self.announced.forget(&uid);
        self.note_partition_hold(m, None);
        self.events.forget(&uid);
        // And, every so many deletions, any record of another machine the store no longer
        // has (written while its deletion was being delivered). Not at every deletion: the
        // sweep reads the whole store.
        let forgotten = self
            .forgotten
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if forgotten % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep_gone();
        }
        self.publish_tracked();
    }

    /// Records whether `m` is held by the partition of `zone` (`None`: not held), and sets
    /// `mcm_machine_zone_partition_held_machines` when that changes.
    pub(crate) fn note_partition_hold(&self, m: &Machine, zone: Option<&str>) {
        let Some(uid) = m.uid() else { return };
        if let Some(zones) = self.partition_holds.note(uid, zone) {
            self.metrics.partition_holds(zones.iter());
        }
    }

    /// Forgets the records of every machine the store no longer has.
    fn sweep_gone(&self) {
        let live: HashSet<String> = self
            .stores
            .machines
            .state()
            .iter()
            .filter_map(|m| m.uid())
            .collect();
        self.backoff.retain(|uid| live.contains(uid));
        self.own_writes.retain(|uid| live.contains(uid));
        self.events.retain(&live);
    }

    /// Sets `mcm_machine_controller_tracked_entries`: the entries of the per-machine records
    /// (a machine can have one in several), the Machines' Event budgets among them.
    fn publish_tracked(&self) {
        let entries = self.backoff.len()
            + self.own_writes.len()
            + self.announced.count()
            + self.events.tracked();
        self.metrics
            .tracked
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }
}
