//! What a machine reconcile reads and uses: clients, driver, stores, permits, backoff.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use mcm_api::{Machine, MachineClass, MachineDeployment, MachineSet};
use mcm_driver::{Code, Driver, DriverError};
use mcm_permits::PermitGiver;

use super::model::{Topic, TopicRecords};
use super::policy::{backoff_delay, controller_owner, max_replacements, rollout_protection};
use super::remediation;
use super::{Freeze, MachineMetrics, Settings, observe};
use crate::events::EventPublisher;
pub use crate::informers::Stores;
use crate::kube_api::ApiErrorExt;

/// Everything a machine reconcile needs.
pub struct Ctx {
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
    /// The stores it reads (also reachable through `Deref`: `ctx.machines`).
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
    failures: Mutex<HashMap<String, u32>>,
    /// When a machine whose last attempt failed may be tried again (by uid). A failed
    /// attempt writes to the Machine, and that write wakes the machine at once; this keeps
    /// such wake-ups from retrying before the backoff is over.
    retry_at: Mutex<HashMap<String, Instant>>,
    /// Names of deleted Nodes that were not managed by MCM (their Machines stay).
    unmanaged_gone: Mutex<HashSet<String>>,
    /// Our last write of a Node (by name): its resourceVersion and when, until the Node
    /// store holds it (see [`Ctx::node_store_is_behind`]).
    node_writes: RecentWrites,
    /// The resourceVersion of this controller's last write to each Machine (by uid) and when
    /// it was written: see [`Ctx::store_is_behind`].
    own_writes: RecentWrites,
    /// The warning last announced per machine (by uid), per topic.
    announced: TopicRecords,
    /// Machines held by a zone partition: UID -> zone.
    partition_holds: Mutex<HashMap<String, String>>,
    /// Machines forgotten so far (every [`SWEEP_EVERY`]th sweeps the records).
    forgotten: std::sync::atomic::AtomicU64,
}

/// How many deleted machines are forgotten one by one between two sweeps of every record
/// of machines the store no longer has.
const SWEEP_EVERY: u64 = 64;

/// How long a write of our own is awaited in the store before a reconcile goes on without
/// it (a watch that does not deliver it for this long has bigger problems; the reconcile
/// then acts on what the store holds, as it would without this guard).
pub const OWN_WRITE_WAIT: Duration = Duration::from_secs(30);

impl Ctx {
    /// Builds a context.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
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
            failures: Mutex::new(HashMap::new()),
            retry_at: Mutex::new(HashMap::new()),
            unmanaged_gone: Mutex::new(HashSet::new()),
            node_writes: RecentWrites::default(),
            own_writes: RecentWrites::default(),
            announced: TopicRecords::default(),
            partition_holds: Mutex::new(HashMap::new()),
            forgotten: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A class of the namespace from the store (shared with it: a reconcile that only asks
    /// whether the class exists copies nothing).
    pub fn class(&self, name: &str) -> Option<Arc<MachineClass>> {
        self.classes
            .get(&ObjectRef::new(name).within(&self.settings.namespace))
    }

    /// A Secret from the store of class-referenced Secrets.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// A Secret a class references: from the store, or, for one the store does not hold yet
    /// (the class controller has not labelled it for the watch, or it lives in another
    /// namespace), from the API server. `None`: it does not exist.
    pub async fn class_secret(
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
    pub fn note_node(&self, node: &Node) {
        let mut gone = self
            .unmanaged_gone
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if observe::node_not_managed(node) {
            gone.insert(node.name_any());
        } else {
            gone.remove(&node.name_any());
        }
    }

    /// Whether the Node `name` was last seen not managed by MCM (asked when it is gone).
    pub fn unmanaged_node_deleted(&self, name: &str) -> bool {
        self.unmanaged_gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
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
    /// [`OWN_WRITE_WAIT`]): planning a write from it would write again what was just written.
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
    /// Machine, or for [`OWN_WRITE_WAIT`] at most.
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
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The retry delay after a failure of `m`: what the cloud asked for, or the
    /// resource-exhausted period, or exponential per consecutive failure. It is kept as the
    /// machine's next attempt (see [`Self::backoff_left`]) whichever it is: the failure's own
    /// status write wakes the machine at once, and must not make it try again before then.
    pub(crate) fn backoff(&self, m: &Machine, err: Option<&DriverError>) -> Duration {
        let asked = err.and_then(|e| e.retry_after).or_else(|| {
            err.is_some_and(|e| e.code == Code::ResourceExhausted)
                .then_some(self.settings.resource_exhausted_retry)
        });
        if !self.in_store(m) {
            // Deleted meanwhile: nothing will read a record of it.
            return asked.unwrap_or_else(|| {
                backoff_delay(self.settings.backoff_initial, self.settings.backoff_max, 1)
            });
        }
        let delay = match asked {
            Some(after) => after,
            None => {
                let n = {
                    let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
                    let n = f.entry(m.uid().unwrap_or_default()).or_insert(0);
                    *n = n.saturating_add(1);
                    *n
                };
                backoff_delay(self.settings.backoff_initial, self.settings.backoff_max, n)
            }
        };
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(m.uid().unwrap_or_default(), self.clock.instant() + delay);
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
        let retry_at = self.retry_at.lock().unwrap_or_else(|e| e.into_inner());
        let left = retry_at
            .get(&m.uid().unwrap_or_default())?
            .checked_duration_since(self.clock.instant())?;
        (!left.is_zero()).then_some(left)
    }

    pub(crate) fn reset_backoff(&self, m: &Machine) {
        let uid = m.uid().unwrap_or_default();
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.remove(&uid);
        drop(f);
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        self.publish_tracked();
    }

    /// Whether the Machines store holds `m` (this very object: same uid).
    fn in_store(&self, m: &Machine) -> bool {
        self.machines
            .get(&ObjectRef::from_obj(m))
            .is_some_and(|stored| stored.uid() == m.uid())
    }

    /// Forgets what this process keeps for `m` between reconciles (backoff, its own last
    /// write, announcements) once the watch reports the Machine deleted. The deletion's last
    /// step forgets most of it; a Machine removed without that step (its finalizer stripped
    /// by hand) would otherwise stay in these maps until a restart.
    pub fn forget_machine(&self, m: &Machine) {
        let Some(uid) = m.uid() else { return };
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
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
        let mut holds = self
            .partition_holds
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let changed = match zone {
            Some(z) => holds.insert(uid, z.to_string()).as_deref() != Some(z),
            None => holds.remove(&uid).is_some(),
        };
        if changed {
            self.metrics.partition_holds(holds.values());
        }
    }

    /// Forgets the records of every machine the store no longer has.
    fn sweep_gone(&self) {
        let live: HashSet<String> = self
            .machines
            .state()
            .iter()
            .filter_map(|m| m.uid())
            .collect();
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live.contains(uid));
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live.contains(uid));
        self.own_writes.retain(|uid| live.contains(uid));
        self.events.retain(&live);
    }

    /// Sets `mcm_machine_controller_tracked_entries`: the entries of the per-machine records
    /// (a machine can have one in several), the Machines' Event budgets among them.
    fn publish_tracked(&self) {
        let entries = self
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
            + self
                .retry_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .len()
            + self.own_writes.len()
            + self.announced.count()
            + self.events.tracked();
        self.metrics
            .tracked
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// The MachineSet and MachineDeployment that own a Machine, from the stores.
    pub(crate) fn owners(
        &self,
        m: &Machine,
    ) -> (Option<Arc<MachineSet>>, Option<Arc<MachineDeployment>>) {
        let ns = &self.settings.namespace;
        let set = controller_owner(m.owner_references(), "MachineSet")
            .and_then(|n| self.sets.get(&ObjectRef::new(n).within(ns)));
        let deployment = set.as_ref().and_then(|s| {
            controller_owner(s.owner_references(), "MachineDeployment")
                .and_then(|n| self.deployments.get(&ObjectRef::new(n).within(ns)))
        });
        (set, deployment)
    }

    /// Why `m` must not be marked Failed now: it belongs to an old MachineSet of a
    /// MachineDeployment that is rolling out (failing it would leave pods unschedulable
    /// while the new machines are not ready yet).
    pub(crate) fn failure_protection(&self, m: &Machine) -> Option<String> {
        let (set, deployment) = self.owners(m);
        let (set, deployment) = (set?, deployment?);
        let owned: Vec<Arc<MachineSet>> = self
            .sets
            .state()
            .into_iter()
            .filter(|s| {
                controller_owner(s.owner_references(), "MachineDeployment")
                    == Some(deployment.name_any().as_str())
            })
            .collect();
        rollout_protection(&set, &deployment, &owned)
    }

    /// Whether the machine's deployment allows no further failure now: its remediation
    /// short-circuit holds (too many of its machines are unhealthy at once), or its budget
    /// of machines in flight is used up (the `remediation.mcm-rs.io/max-in-flight`
    /// annotation, else maxSurge, at least 1). `Some` says why; machines without a
    /// deployment are not limited. A remediation annotation that does not resolve holds all
    /// remediation and says so. Reads the stores only.
    pub fn replacement_throttle(&self, m: &Machine) -> Option<String> {
        let (_, Some(deployment)) = self.owners(m) else {
            return None;
        };
        let name = deployment.name_any();
        let policy = match remediation::policy_of(deployment.metadata.annotations.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                return Some(format!(
                    "remediation of MachineDeployment {name} is held until its annotation is fixed: {e}"
                ));
            }
        };
        let census = self.census(m, &deployment);
        remediation::verdict(&policy, max_replacements(&deployment), census)
            .map(|t| t.describe(&name))
    }

    /// Counts the machines of `deployment` for its remediation decision about `m` (counted
    /// as unhealthy: it is about to fail), as [`remediation::Member`] defines them, with
    /// their Nodes from the store.
    fn census(&self, m: &Machine, deployment: &MachineDeployment) -> remediation::Census {
        let members = self
            .machines
            .state()
            .into_iter()
            .filter(|other| {
                self.owners(other)
                    .1
                    .is_some_and(|d| d.uid() == deployment.uid())
            })
            .map(|other| {
                let node = observe::node_name(&other).and_then(|n| self.node(n));
                let member = remediation::Member::of(&other, node.as_deref());
                if other.uid() == m.uid() {
                    member.deciding()
                } else {
                    member
                }
            });
        remediation::census(deployment.spec.replicas(), members)
    }

    /// The verdict of the machine's deployment on replacing `m`, with the deployment's permit
    /// when it was taken (held while the failure is written).
    pub(crate) fn replacement(
        &self,
        m: &Machine,
    ) -> (super::model::Replacement, Option<mcm_permits::Permit>) {
        use super::model::Replacement;
        let permit = match self.replacement_permit(m) {
            Ok(Some(permit)) => permit,
            Ok(None) => return (Replacement::NotAsked, None),
            Err(busy) => {
                tracing::debug!(%busy, "replacement permit busy");
                return (Replacement::Busy, None);
            }
        };
        match self.replacement_throttle(m) {
            Some(throttled) => (Replacement::Throttled(throttled), Some(permit)),
            None => (Replacement::Allowed, Some(permit)),
        }
    }

    /// The permit of the machine's deployment, taken without waiting (`Err` when another
    /// reconcile holds it). `None` for machines without a deployment.
    pub(crate) fn replacement_permit(
        &self,
        m: &Machine,
    ) -> Result<Option<mcm_permits::Permit>, String> {
        let (_, Some(deployment)) = self.owners(m) else {
            return Ok(None);
        };
        let key = format!("{}/{}", self.settings.namespace, deployment.name_any());
        self.permits.register(&key, 1);
        self.permits
            .try_acquire_now(&key)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// The resourceVersion of `m` as the integer the API server issues.
fn resource_version(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// This controller's recent writes, by object key: the resourceVersion the API server
/// answered with and when, for [`OWN_WRITE_WAIT`] at most (a store copy older than the write
/// is behind; see [`copy_is_behind`]).
#[derive(Debug, Default)]
struct RecentWrites(Mutex<HashMap<String, (u64, Instant)>>);

impl RecentWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Instant)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a write of version `rv` to `key`, and forgets writes whose copy never caught up
    /// in time (their objects were deleted meanwhile).
    fn note(&self, key: String, rv: u64, now: Instant) {
        let mut writes = self.lock();
        writes.retain(|_, (_, at)| now.duration_since(*at) < OWN_WRITE_WAIT);
        writes.insert(key, (rv, now));
    }

    /// Whether a store copy of version `copy` predates our last write to `key`: `None` when
    /// there is no such write, `Some(false)` when the copy has caught up (the write is then
    /// forgotten).
    fn is_behind(&self, key: &str, copy: Option<u64>, now: Instant) -> Option<bool> {
        let mut writes = self.lock();
        let &(written, at) = writes.get(key)?;
        let behind = copy_is_behind(copy, written, now.saturating_duration_since(at));
        if !behind {
            writes.remove(key);
        }
        Some(behind)
    }

    fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|key, _| keep(key));
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Whether a store copy of version `copy` predates our write of version `written`, made
/// `since` ago. Pure.
pub fn copy_is_behind(copy: Option<u64>, written: u64, since: Duration) -> bool {
    since < OWN_WRITE_WAIT && copy.is_some_and(|c| c < written)
}

impl std::ops::Deref for Ctx {
    type Target = Stores;

    fn deref(&self) -> &Stores {
        &self.stores
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_held_back_only_while_it_predates_our_write() {
        let recent = Duration::from_millis(10);
        assert!(copy_is_behind(Some(41), 42, recent));
        // The store has our write, or a later one of someone else.
        assert!(!copy_is_behind(Some(42), 42, recent));
        assert!(!copy_is_behind(Some(50), 42, recent));
        // Not an integer: never held back.
        assert!(!copy_is_behind(None, 42, recent));
        // Awaited long enough: the reconcile goes on with what the store holds.
        assert!(!copy_is_behind(Some(41), 42, OWN_WRITE_WAIT));
    }

    #[test]
    fn a_write_is_forgotten_once_the_store_has_caught_up() {
        let writes = RecentWrites::default();
        let clock = crate::clock::ManualClock::starting_now();
        let now = || crate::clock::Clock::instant(&clock);
        assert_eq!(
            writes.is_behind("n", Some(1), now()),
            None,
            "nothing written"
        );
        writes.note("n".into(), 42, now());
        assert_eq!(writes.is_behind("n", Some(41), now()), Some(true));
        assert_eq!(writes.len(), 1, "kept while the copy is behind");
        clock.advance(OWN_WRITE_WAIT);
        assert_eq!(
            writes.is_behind("n", Some(41), now()),
            Some(false),
            "awaited long enough"
        );
        writes.note("n".into(), 42, now());
        assert_eq!(writes.is_behind("n", Some(42), now()), Some(false));
        assert_eq!(writes.len(), 0, "forgotten once caught up");
        writes.note("a".into(), 1, now());
        writes.note("b".into(), 1, now());
        writes.retain(|k| k == "a");
        writes.remove("a");
        assert_eq!(writes.len(), 0);
    }
}
