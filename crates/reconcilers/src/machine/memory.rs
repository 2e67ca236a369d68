//! What the machine controller keeps in memory between reconciles, each record with its
//! rule: the backoff of failed machines ([`Backoff`]), its own recent writes that a store's
//! copy may not show yet ([`RecentWrites`]), the warnings announced per topic
//! ([`TopicRecords`]), the machines a zone partition holds ([`PartitionHolds`]) and the
//! Nodes last seen not managed by MCM ([`UnmanagedNodes`]). [`Ctx`](super::Ctx) holds
//! them; lost on a restart by design (each only saves requests or Events).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_driver::{Code, DriverError};

use super::Settings;
use super::model::Topic;
use super::policy::backoff_delay;

/// How long a write of our own is awaited in the store before a reconcile goes on without
/// it (a watch that does not deliver it for this long has bigger problems; the reconcile
/// then acts on what the store holds, as it would without this guard).
pub(crate) const OWN_WRITE_WAIT: Duration = Duration::from_secs(30);

/// The resourceVersion of `m` as the integer the API server issues.
pub(crate) fn resource_version(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// This controller's recent writes, by object key: the resourceVersion the API server
/// answered with and when, for [`OWN_WRITE_WAIT`] at most (a store copy older than the write
/// is behind; see [`copy_is_behind`]).
#[derive(Debug, Default)]
pub(crate) struct RecentWrites(Mutex<HashMap<String, (u64, Instant)>>);

impl RecentWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Instant)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a write of version `rv` to `key`, and forgets writes whose copy never caught up
    /// in time (their objects were deleted meanwhile).
    pub(crate) fn note(&self, key: String, rv: u64, now: Instant) {
        let mut writes = self.lock();
        writes.retain(|_, (_, at)| now.duration_since(*at) < OWN_WRITE_WAIT);
        writes.insert(key, (rv, now));
    }

    /// Whether a store copy of version `copy` predates our last write to `key`: `None` when
    /// there is no such write, `Some(false)` when the copy has caught up (the write is then
    /// forgotten).
    pub(crate) fn is_behind(&self, key: &str, copy: Option<u64>, now: Instant) -> Option<bool> {
        let mut writes = self.lock();
        let &(written, at) = writes.get(key)?;
        let behind = copy_is_behind(copy, written, now.saturating_duration_since(at));
        if !behind {
            writes.remove(key);
        }
        Some(behind)
    }

    pub(crate) fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|key, _| keep(key));
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Whether a store copy of version `copy` predates our write of version `written`, made
/// `since` ago. Pure.
pub(crate) fn copy_is_behind(copy: Option<u64>, written: u64, since: Duration) -> bool {
    since < OWN_WRITE_WAIT && copy.is_some_and(|c| c < written)
}

/// The backoff of machines whose last attempt failed (by uid): consecutive failures and
/// when the next attempt may come.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
    /// A failed attempt writes to the Machine, and that write wakes the machine at once;
    /// this keeps such wake-ups from retrying before the backoff is over.
    retry_at: Mutex<HashMap<String, Instant>>,
}

/// The delay a failure asks for itself: the cloud's retry time, else the resource-exhausted
/// period for a `ResourceExhausted`. Pure.
pub(crate) fn asked_delay(err: Option<&DriverError>, settings: &Settings) -> Option<Duration> {
    err.and_then(|e| e.retry_after).or_else(|| {
        err.is_some_and(|e| e.code == Code::ResourceExhausted)
            .then_some(settings.resource_exhausted_retry)
    })
}

impl Backoff {
    /// Records a failure of `uid` at `now`: the delay before its next attempt (what the
    /// failure asked for, else exponential per consecutive failure), kept as its next
    /// attempt whichever it is.
    pub(crate) fn after_failure(
        &self,
        uid: &str,
        err: Option<&DriverError>,
        settings: &Settings,
        now: Instant,
    ) -> Duration {
        let delay = asked_delay(err, settings).unwrap_or_else(|| {
            let n = {
                let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
                let n = f.entry(uid.to_owned()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            };
            backoff_delay(settings.backoff_initial, settings.backoff_max, n)
        });
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), now + delay);
        delay
    }

    /// How long `uid` must still wait at `now` (`None`: it may go on).
    pub(crate) fn left(&self, uid: &str, now: Instant) -> Option<Duration> {
        let retry_at = self.retry_at.lock().unwrap_or_else(|e| e.into_inner());
        let left = retry_at.get(uid)?.checked_duration_since(now)?;
        (!left.is_zero()).then_some(left)
    }

    /// Forgets `uid` (it succeeded, or is gone).
    pub(crate) fn reset(&self, uid: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// Keeps only the machines `keep` names.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| keep(uid));
        self.retry_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| keep(uid));
    }

    /// Entries over both records.
    pub(crate) fn len(&self) -> usize {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
            + self
                .retry_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .len()
    }
}

/// The machines a zone partition holds (uid -> zone).
#[derive(Debug, Default)]
pub(crate) struct PartitionHolds(Mutex<HashMap<String, String>>);

impl PartitionHolds {
    /// Records whether `uid` is held by the partition of `zone` (`None`: not held); the
    /// zones of all holds when that changed.
    pub(crate) fn note(&self, uid: String, zone: Option<&str>) -> Option<Vec<String>> {
        let mut holds = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match zone {
            Some(z) => holds.insert(uid, z.to_string()).as_deref() != Some(z),
            None => holds.remove(&uid).is_some(),
        };
        changed.then(|| holds.values().cloned().collect())
    }
}

/// Names of Nodes last seen annotated not-managed-by-MCM (their deletion does not delete
/// their Machines).
#[derive(Debug, Default)]
pub(crate) struct UnmanagedNodes(Mutex<HashSet<String>>);

impl UnmanagedNodes {
    /// Notes the Node `name` as last seen, managed or not.
    pub(crate) fn note(&self, name: String, unmanaged: bool) {
        let mut names = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if unmanaged {
            names.insert(name);
        } else {
            names.remove(&name);
        }
    }

    /// Whether `name` was last seen not managed.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }
}

/// One record per [`Topic`] of what was last announced per machine.
#[derive(Debug, Default)]
pub(crate) struct TopicRecords([crate::announce::Announced; 2]);

impl TopicRecords {
    /// The record of `topic`.
    pub(crate) fn of(&self, topic: Topic) -> &crate::announce::Announced {
        &self.0[topic.index()]
    }

    /// Entries over all topics.
    pub(crate) fn count(&self) -> usize {
        self.0.iter().map(crate::announce::Announced::count).sum()
    }

    /// Forgets `uid` under every topic.
    pub(crate) fn forget(&self, uid: &str) {
        for r in &self.0 {
            r.forget(uid);
        }
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

    #[test]
    fn a_failure_waits_as_long_as_it_asks_else_longer_each_time() {
        let clock = crate::clock::ManualClock::starting_now();
        let now = || crate::clock::Clock::instant(&clock);
        let settings = crate::machine::plan::tests::settings();
        let b = Backoff::default();
        let first = b.after_failure("u", None, &settings, now());
        let second = b.after_failure("u", None, &settings, now());
        assert!(second > first, "{first:?} then {second:?}");
        assert_eq!(b.left("u", now()), Some(second));
        clock.advance(second);
        assert_eq!(b.left("u", now()), None, "the backoff is over");
        let asked = DriverError::new(Code::ResourceExhausted, "no capacity");
        assert_eq!(
            b.after_failure("u", Some(&asked), &settings, now()),
            settings.resource_exhausted_retry
        );
        b.reset("u");
        assert_eq!(b.len(), 0);
        assert_eq!(b.left("u", now()), None);
    }
}
