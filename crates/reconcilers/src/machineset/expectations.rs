//! Creations and deletions a set waits to see in the machine store (Kubernetes' controller
//! expectations): the record per set. Whether the store shows them is decided purely
//! ([`super::decide::expectations_satisfied`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::model::PendingChanges;

/// Creations and deletions a set is waiting to see in the machine store (Kubernetes'
/// controller expectations): until they are observed, the set does not act again, so a
/// stale cache never causes duplicate creations or deletions.
#[derive(Debug, Default)]
pub(crate) struct Expectations {
    inner: Mutex<HashMap<String, PendingChanges>>,
}

impl Expectations {
    /// Records the creations and deletions just issued for the set `key` at `now`.
    pub(crate) fn record(
        &self,
        key: &str,
        created: Vec<String>,
        deleted: Vec<String>,
        now: Instant,
    ) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(
            key.to_owned(),
            PendingChanges {
                created: created.into_iter().collect(),
                deleted: deleted.into_iter().collect(),
                since: now,
            },
        );
    }

    /// What is recorded for the set `key`.
    pub(crate) fn pending(&self, key: &str) -> Option<PendingChanges> {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).cloned()
    }

    /// Drops the record of `key` (the store showed it, or it timed out).
    pub(crate) fn clear(&self, key: &str) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(key);
    }
}
