//! Keyed permits: at most N holders per key at any time.
//!
//! The machine controller uses them as MCM's "PermitGiver" does, to throttle risky actions
//! per key, e.g. how many machines of one MachineDeployment may be replaced (marked Failed)
//! at the same time (meltdown protection).
//!
//! - [`PermitGiver::register`] a key with N permits;
//! - [`PermitGiver::try_acquire`] one with a timeout; the returned [`Permit`] releases on drop,
//!   so a cancelled task or a panic can never leak one;
//! - [`PermitGiver::delete`] a key (waiters get [`PermitError::Deleted`]);
//! - [`PermitGiver::spawn_janitor`] drops keys that nobody used for a while.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use mcm_permits::PermitGiver;
//!
//! let permits = PermitGiver::new();
//! permits.register("default/workers", 1);
//! let first = permits.try_acquire("default/workers", Duration::from_millis(10)).await.unwrap();
//! // The only permit is taken: the second attempt times out.
//! assert!(permits.try_acquire("default/workers", Duration::from_millis(10)).await.is_err());
//! drop(first);
//! assert!(permits.try_acquire("default/workers", Duration::from_millis(10)).await.is_ok());
//! # }
//! ```
#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Why no permit was handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermitError {
    /// The key was never registered (or was deleted or dropped by the janitor before).
    #[error("no permits are registered for key {key:?}")]
    NotRegistered {
        /// The key.
        key: String,
    },
    /// All permits stayed taken for the whole timeout.
    #[error("all {capacity} permits for key {key:?} are taken; waited {waited:?}")]
    Timeout {
        /// The key.
        key: String,
        /// How many permits the key has.
        capacity: usize,
        /// How long we waited.
        waited: Duration,
    },
    /// The key was deleted while we waited.
    #[error("the permits for key {key:?} were deleted while waiting")]
    Deleted {
        /// The key.
        key: String,
    },
}

#[derive(Clone)]
struct Entry {
    semaphore: Arc<Semaphore>,
    capacity: usize,
    last_used: Arc<Mutex<Instant>>,
}

impl Entry {
    fn in_use(&self) -> usize {
        self.capacity - self.semaphore.available_permits()
    }
}

/// A held permit. Dropping it gives the permit back.
#[derive(Debug)]
pub struct Permit {
    _permit: OwnedSemaphorePermit,
    last_used: Arc<Mutex<Instant>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        touch(&self.last_used);
    }
}

fn touch(last_used: &Mutex<Instant>) {
    if let Ok(mut t) = last_used.lock() {
        *t = Instant::now();
    }
}

/// Keyed permits, cheap to clone (clones share the keys).
#[derive(Clone, Default)]
pub struct PermitGiver {
    keys: Arc<Mutex<HashMap<String, Entry>>>,
}

impl std::fmt::Debug for PermitGiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermitGiver")
            .field("keys", &self.lock().len())
            .finish()
    }
}

impl PermitGiver {
    /// No keys yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // The map stays consistent even if a holder panicked: every update is one statement.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `capacity` permits for `key`. Registering a key that exists already keeps
    /// the existing permits (and their holders), as MCM does; use [`PermitGiver::delete`]
    /// first to change the capacity.
    pub fn register(&self, key: &str, capacity: usize) {
        self.lock().entry(key.to_string()).or_insert_with(|| Entry {
            semaphore: Arc::new(Semaphore::new(capacity)),
            capacity,
            last_used: Arc::new(Mutex::new(Instant::now())),
        });
    }

    /// Whether `key` is registered.
    pub fn is_registered(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many permits of `key` are free right now.
    pub fn available(&self, key: &str) -> Option<usize> {
        self.lock()
            .get(key)
            .map(|e| e.semaphore.available_permits())
    }

    /// How many permits of `key` are held right now.
    pub fn in_use(&self, key: &str) -> Option<usize> {
        self.lock().get(key).map(Entry::in_use)
    }

    /// The entry of `key`, its last use touched now.
    fn entry_of(&self, key: &str) -> Result<Entry, PermitError> {
        let keys = self.lock();
        let entry = keys.get(key).ok_or_else(|| PermitError::NotRegistered {
            key: key.to_string(),
        })?;
        touch(&entry.last_used);
        Ok(entry.clone())
    }

    /// Takes a permit of `key`, waiting at most `timeout`.
    pub async fn try_acquire(&self, key: &str, timeout: Duration) -> Result<Permit, PermitError> {
        let Entry {
            semaphore,
            capacity,
            last_used,
        } = self.entry_of(key)?;
        let began = Instant::now();
        match tokio::time::timeout(timeout, semaphore.acquire_owned()).await {
            Ok(Ok(permit)) => {
                touch(&last_used);
                Ok(Permit {
                    _permit: permit,
                    last_used,
                })
            }
            Ok(Err(_closed)) => Err(PermitError::Deleted {
                key: key.to_string(),
            }),
            Err(_elapsed) => Err(PermitError::Timeout {
                key: key.to_string(),
                capacity,
                waited: began.elapsed(),
            }),
        }
    }

    /// Takes a permit of `key` if one is free right now, without waiting (a busy key fails
    /// with [`PermitError::Timeout`] after zero time).
    pub fn try_acquire_now(&self, key: &str) -> Result<Permit, PermitError> {
        let Entry {
            semaphore,
            capacity,
            last_used,
        } = self.entry_of(key)?;
        match semaphore.try_acquire_owned() {
            Ok(permit) => Ok(Permit {
                _permit: permit,
                last_used,
            }),
            Err(tokio::sync::TryAcquireError::Closed) => Err(PermitError::Deleted {
                key: key.to_string(),
            }),
            Err(tokio::sync::TryAcquireError::NoPermits) => Err(PermitError::Timeout {
                key: key.to_string(),
                capacity,
                waited: Duration::ZERO,
            }),
        }
    }

    /// Deletes `key`. Waiters fail with [`PermitError::Deleted`]; held permits stay valid
    /// until dropped but no longer count for anything.
    pub fn delete(&self, key: &str) {
        if let Some(entry) = self.lock().remove(key) {
            entry.semaphore.close();
        }
    }

    /// Deletes every key that has no holder and was not used for `stale_after`. Returns the
    /// deleted keys.
    pub fn drop_stale(&self, stale_after: Duration) -> Vec<String> {
        let now = Instant::now();
        let mut keys = self.lock();
        let stale: Vec<String> = keys
            .iter()
            .filter(|(_, e)| {
                let idle = e
                    .last_used
                    .lock()
                    .map(|t| now.duration_since(*t))
                    .unwrap_or_default();
                e.in_use() == 0 && idle >= stale_after
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &stale {
            if let Some(e) = keys.remove(k) {
                e.semaphore.close();
            }
        }
        stale
    }

    /// Starts a task that calls [`PermitGiver::drop_stale`] every `period`. Abort the handle
    /// to stop it.
    pub fn spawn_janitor(&self, period: Duration, stale_after: Duration) -> JoinHandle<()> {
        let giver = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let dropped = giver.drop_stale(stale_after);
                if !dropped.is_empty() {
                    tracing::debug!(?dropped, "dropped stale permit keys");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn try_acquire_now_never_waits() {
        let p = PermitGiver::new();
        assert!(p.try_acquire_now("k").is_err(), "unregistered");
        p.register("k", 1);
        let held = p.try_acquire_now("k").expect("free");
        assert!(matches!(
            p.try_acquire_now("k"),
            Err(PermitError::Timeout { waited, .. }) if waited == Duration::ZERO
        ));
        drop(held);
        assert!(p.try_acquire_now("k").is_ok(), "free again once dropped");
        p.delete("k");
        assert!(p.try_acquire_now("k").is_err(), "deleted");
    }

    #[tokio::test]
    async fn unregistered_keys_are_an_error() {
        let p = PermitGiver::new();
        let err = p.try_acquire("x", Duration::ZERO).await.unwrap_err();
        assert_eq!(err, PermitError::NotRegistered { key: "x".into() });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_more_than_n_holders_under_contention() {
        let p = PermitGiver::new();
        p.register("k", 3);
        let holders = Arc::new(AtomicUsize::new(0));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let acquired = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (p, holders, max_seen, acquired) = (
                    p.clone(),
                    holders.clone(),
                    max_seen.clone(),
                    acquired.clone(),
                );
                tokio::spawn(async move {
                    for _ in 0..20 {
                        let permit = p.try_acquire("k", Duration::from_secs(30)).await.unwrap();
                        let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        max_seen.fetch_max(now, Ordering::SeqCst);
                        acquired.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(acquired.load(Ordering::SeqCst), 64 * 20);
        assert_eq!(max_seen.load(Ordering::SeqCst), 3);
        assert_eq!(p.in_use("k"), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_key_times_out() {
        let p = PermitGiver::new();
        p.register("k", 1);
        let _held = p.try_acquire("k", Duration::ZERO).await.unwrap();
        let err = p
            .try_acquire("k", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, PermitError::Timeout { capacity: 1, waited, .. } if waited == Duration::from_secs(5)),
            "{err:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_and_panicking_tasks_do_not_leak_permits() {
        let p = PermitGiver::new();
        p.register("k", 1);

        // A task that holds the permit and is aborted mid-way.
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let holder = {
            let p = p.clone();
            tokio::spawn(async move {
                let _permit = p.try_acquire("k", Duration::ZERO).await.unwrap();
                let _ = held_tx.send(());
                std::future::pending::<()>().await;
            })
        };
        held_rx.await.unwrap();
        assert_eq!(p.available("k"), Some(0));
        holder.abort();
        let _ = holder.await;
        assert_eq!(p.available("k"), Some(1));

        // A task that panics while holding it.
        let panicking = {
            let p = p.clone();
            tokio::spawn(async move {
                let _permit = p.try_acquire("k", Duration::ZERO).await.unwrap();
                panic!("boom");
            })
        };
        assert!(panicking.await.is_err());
        assert_eq!(p.available("k"), Some(1));

        // A waiter cancelled while waiting does not take a permit later.
        let _held = p.try_acquire("k", Duration::ZERO).await.unwrap();
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move { p.try_acquire("k", Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        drop(_held);
        assert_eq!(p.available("k"), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn delete_wakes_waiters_with_an_error() {
        let p = PermitGiver::new();
        p.register("k", 1);
        let _held = p.try_acquire("k", Duration::ZERO).await.unwrap();
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move { p.try_acquire("k", Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        p.delete("k");
        let err = waiter.await.unwrap().unwrap_err();
        assert_eq!(err, PermitError::Deleted { key: "k".into() });
        assert!(!p.is_registered("k"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_janitor_drops_only_idle_unheld_keys() {
        let p = PermitGiver::new();
        p.register("idle", 2);
        p.register("held", 1);
        p.register("busy", 1);
        let _held = p.try_acquire("held", Duration::ZERO).await.unwrap();
        let janitor = p.spawn_janitor(Duration::from_secs(10), Duration::from_secs(60));

        // Keep "busy" in use every 30s; "idle" sees no use.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(p.try_acquire("busy", Duration::ZERO).await.unwrap());
        }
        // 120s have passed.
        assert!(!p.is_registered("idle"), "idle key should be dropped");
        assert!(p.is_registered("held"), "a held key is never dropped");
        assert!(p.is_registered("busy"), "a recently used key stays");
        janitor.abort();
    }

    #[tokio::test]
    async fn registering_again_keeps_the_existing_permits() {
        let p = PermitGiver::new();
        p.register("k", 1);
        let _held = p.try_acquire("k", Duration::ZERO).await.unwrap();
        p.register("k", 5);
        assert_eq!(p.available("k"), Some(0));
    }
}
