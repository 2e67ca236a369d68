//! The per-object Event budget, as client-go's `EventSourceObjectSpamFilter` keeps it: a
//! burst of [`SPAM_BURST`] Events per object and type, then one per [`SPAM_REFILL`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::events::EventType;

/// Events an object may have at once (client-go's `defaultSpamBurst`).
pub(crate) const SPAM_BURST: u32 = 25;
/// The time in which one more Event per object becomes allowed after the burst (client-go's
/// `defaultSpamQPS` of 1/300).
pub(crate) const SPAM_REFILL: Duration = Duration::from_secs(300);

/// Buckets kept before full ones are forgotten.
const SPAM_FORGET_ABOVE: usize = 1024;

/// Seconds from `from` to `to`, 0 if `to` is earlier (a clock set back refills nothing).
fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64().max(0.0)
}

/// A token bucket: `tokens` left as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

impl Bucket {
    fn full(now: Timestamp) -> Self {
        Bucket {
            tokens: f64::from(SPAM_BURST),
            at: now,
        }
    }

    /// Refills for the time since the last look, then takes a token if there is one.
    fn take(&mut self, now: Timestamp) -> bool {
        let refilled = seconds_between(self.at, now) / SPAM_REFILL.as_secs_f64();
        self.tokens = (self.tokens + refilled).min(f64::from(SPAM_BURST));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket would be full at `now` (it can be forgotten).
    fn refilled_by(&self, now: Timestamp) -> bool {
        self.tokens + seconds_between(self.at, now) / SPAM_REFILL.as_secs_f64()
            >= f64::from(SPAM_BURST)
    }
}

/// The per-object Event budgets of one publisher.
#[derive(Debug, Default)]
pub(crate) struct SpamFilter {
    /// Keyed by the object (`object_key`) and whether the Events are Warnings.
    buckets: HashMap<(String, bool), Bucket>,
}

impl SpamFilter {
    /// Whether an Event of `type_` on the object `object` may be published at `now`.
    pub(crate) fn allow(&mut self, object: &str, type_: EventType, now: Timestamp) -> bool {
        if self.buckets.len() > SPAM_FORGET_ABOVE {
            self.buckets.retain(|_, b| !b.refilled_by(now));
        }
        self.buckets
            .entry((object.to_owned(), type_ == EventType::Warning))
            .or_insert_with(|| Bucket::full(now))
            .take(now)
    }

    /// Keeps only the budgets of objects `live` (UIDs) names, and those of objects without a
    /// UID.
    pub(crate) fn retain(&mut self, live: &HashSet<String>) {
        self.buckets
            .retain(|(key, _), _| key.contains('/') || live.contains(key));
    }

    /// Drops the budgets of the object with this UID (it is gone).
    pub(crate) fn forget(&mut self, uid: &str) {
        for warning in [false, true] {
            self.buckets.remove(&(uid.to_owned(), warning));
        }
    }

    /// How many budgets are kept.
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Timestamp {
        "2026-11-29T10:00:00Z".parse().unwrap()
    }

    fn at(secs: u64) -> Timestamp {
        t0() + Duration::from_secs(secs)
    }

    #[test]
    fn an_object_has_a_burst_of_events_then_one_per_refill_period() {
        let mut f = SpamFilter::default();
        let allowed = (0..40)
            .filter(|_| f.allow("1", EventType::Normal, t0()))
            .count();
        assert_eq!(allowed, SPAM_BURST as usize);
        // Just short of a refill: still nothing; after one: exactly one more.
        assert!(!f.allow("1", EventType::Normal, at(SPAM_REFILL.as_secs() / 2)));
        let later = at(SPAM_REFILL.as_secs() + 1);
        assert!(f.allow("1", EventType::Normal, later));
        assert!(!f.allow("1", EventType::Normal, later));
    }

    #[test]
    fn budgets_are_per_object_and_type() {
        let mut f = SpamFilter::default();
        for _ in 0..SPAM_BURST {
            assert!(f.allow("1", EventType::Normal, t0()));
        }
        assert!(!f.allow("1", EventType::Normal, t0()));
        // A Warning on the same object, and another object.
        assert!(f.allow("1", EventType::Warning, t0()));
        assert!(f.allow("2", EventType::Normal, t0()));
    }

    #[test]
    fn a_clock_set_back_refills_nothing() {
        let mut f = SpamFilter::default();
        for _ in 0..SPAM_BURST {
            assert!(f.allow("1", EventType::Normal, at(600)));
        }
        assert!(!f.allow("1", EventType::Normal, t0()));
    }

    #[test]
    fn refilled_buckets_are_forgotten_once_there_are_many() {
        let mut f = SpamFilter::default();
        for i in 0..=SPAM_FORGET_ABOVE {
            f.allow(&format!("u{i}"), EventType::Normal, t0());
        }
        for _ in 0..SPAM_BURST {
            f.allow("spent", EventType::Normal, t0());
        }
        // Long after, every bucket has refilled (the spent one too): the next look forgets
        // them all and keeps only the new one.
        let later = at(SPAM_REFILL.as_secs() * u64::from(SPAM_BURST + 1));
        assert!(f.allow("fresh", EventType::Normal, later));
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn a_deleted_objects_budgets_are_forgotten() {
        let mut f = SpamFilter::default();
        assert!(f.allow("1", EventType::Normal, t0()));
        assert!(f.allow("1", EventType::Warning, t0()));
        assert!(f.allow("2", EventType::Normal, t0()));
        assert_eq!(f.len(), 3);
        f.forget("1");
        assert_eq!(f.len(), 1);
        assert!(f.allow("3", EventType::Normal, t0()));
        assert!(f.allow("v1/Node//n", EventType::Normal, t0()));
        f.retain(&["3".to_string()].into());
        assert_eq!(
            f.len(),
            2,
            "the live object's budget and the one of an object without a UID are kept"
        );
    }
}
