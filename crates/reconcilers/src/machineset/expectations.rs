//! Creations and deletions a set waits to see in the machine store (Kubernetes' controller
//! expectations).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcm_api::Machine;

/// How long creations/deletions are awaited in the machine store before acting again.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(60);

/// Creations and deletions a set is waiting to see in the machine store (Kubernetes'
/// controller expectations): until they are observed, the set does not act again, so a
/// stale cache never causes duplicate creations or deletions.
#[derive(Debug, Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Expected>>,
}

#[derive(Debug)]
struct Expected {
    created: HashSet<String>,
    deleted: HashSet<String>,
    since: Instant,
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
        if let Ok(mut map) = self.inner.lock() {
            map.insert(
                key.to_owned(),
                Expected {
                    created: created.into_iter().collect(),
                    deleted: deleted.into_iter().collect(),
                    since: now,
                },
            );
        }
    }

    /// Whether the store shows what was recorded for `key` (or the record timed out): the
    /// set may act again (`now`: the clock's instant). A satisfied record is dropped.
    pub(crate) fn satisfied(&self, key: &str, machines: &[Arc<Machine>], now: Instant) -> bool {
        let Ok(mut map) = self.inner.lock() else {
            return true;
        };
        let Some(exp) = map.get(key) else {
            return true;
        };
        let by_name: HashMap<&str, &Machine> = machines
            .iter()
            .map(|m| (m.metadata.name.as_deref().unwrap_or(""), m.as_ref()))
            .collect();
        let created_seen = exp.created.iter().all(|n| by_name.contains_key(n.as_str()));
        let deleted_seen = exp.deleted.iter().all(|n| {
            by_name
                .get(n.as_str())
                .is_none_or(|m| m.metadata.deletion_timestamp.is_some())
        });
        if (created_seen && deleted_seen)
            || now.saturating_duration_since(exp.since) > EXPECTATIONS_TIMEOUT
        {
            map.remove(key);
            return true;
        }
        false
    }
}
