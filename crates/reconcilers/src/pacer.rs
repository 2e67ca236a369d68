//! Pacing of status writes that only move counters.
//!
//! While a MachineSet or MachineDeployment scales, every Machine that turns Running changes
//! its replica counters, and writing each change costs one API request per machine (at 1000
//! machines and the default 20 QPS, a tenth of the whole budget). A write that changes only
//! counters (and the timestamps or messages of conditions that keep their status and reason)
//! is therefore held back until [`STATUS_INTERVAL`] has passed since the object's last status
//! write, and the reconcile is requeued for then; a change of generation, of a condition's
//! status or reason, or of the failed machines is written at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock::SharedClock;

/// The least time between two counter-only status writes of one object.
pub(crate) const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Remembers when each object's status was last written (by uid).
#[derive(Debug)]
pub(crate) struct StatusPacer {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
    clock: SharedClock,
}

impl Default for StatusPacer {
    fn default() -> Self {
        StatusPacer::new(STATUS_INTERVAL)
    }
}

/// What to do with a desired status ([`StatusPacer::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The object has it already: no write.
    Unchanged,
    /// Write it now (the write is noted).
    Write,
    /// Only counters changed and the last write is recent: come back after this long.
    Wait(Duration),
}

impl StatusPacer {
    /// Whether the object `uid`, whose status is `current`, gets `desired` written now.
    /// `without_counters` strips what changes with every machine (see the module's
    /// introduction); a difference beyond it is written at once.
    pub(crate) fn admit<S: PartialEq>(
        &self,
        uid: &str,
        current: Option<&S>,
        desired: &S,
        without_counters: impl Fn(&S) -> S,
    ) -> Admission {
        if current == Some(desired) {
            return Admission::Unchanged;
        }
        let significant = current.is_none_or(|c| without_counters(c) != without_counters(desired));
        match self.hold_back(uid, significant) {
            Some(wait) => Admission::Wait(wait),
            None => Admission::Write,
        }
    }

    /// A pacer allowing one counter-only write per `interval` and object.
    pub(crate) fn new(interval: Duration) -> Self {
        StatusPacer {
            interval,
            last: Mutex::new(HashMap::new()),
            clock: crate::clock::system(),
        }
    }

    /// The same pacer taking time from `clock` (for tests: a pacer paces real API traffic,
    /// so the controllers keep it on the system's clock even under a test's `ManualClock`,
    /// which would otherwise hold a paced write until the test steps the clock).
    #[cfg(test)]
    pub(crate) fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long a write to the object `uid` must wait (`None`: write now, and the write is
    /// noted). `significant`: the write changes more than counters.
    pub(crate) fn hold_back(&self, uid: &str, significant: bool) -> Option<Duration> {
        let now = self.clock.instant();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let wait = hold_back_for(last.get(uid).copied(), now, self.interval, significant);
        if wait.is_none() {
            last.retain(|_, at| now.duration_since(*at) < self.interval);
            last.insert(uid.to_owned(), now);
        }
        wait
    }
}

/// The decision of [`StatusPacer::hold_back`] on facts: the last write at `last`, now `now`.
/// Pure.
pub(crate) fn hold_back_for(
    last: Option<Instant>,
    now: Instant,
    interval: Duration,
    significant: bool,
) -> Option<Duration> {
    if significant {
        return None;
    }
    let since = now.duration_since(last?);
    interval.checked_sub(since).filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_written_when_it_changed_and_counters_only_wait() {
        // A status of two fields: a counter and something significant.
        let strip = |s: &(u32, &'static str)| (0, s.1);
        let pacer = StatusPacer::new(Duration::from_secs(60));
        assert_eq!(
            pacer.admit("a", Some(&(1, "ok")), &(1, "ok"), strip),
            Admission::Unchanged
        );
        assert_eq!(pacer.admit("a", None, &(1, "ok"), strip), Admission::Write);
        assert!(matches!(
            pacer.admit("a", Some(&(1, "ok")), &(2, "ok"), strip),
            Admission::Wait(_)
        ));
        assert_eq!(
            pacer.admit("a", Some(&(1, "ok")), &(2, "quota"), strip),
            Admission::Write
        );
        // Another object has its own pace.
        assert_eq!(
            pacer.admit("b", Some(&(1, "ok")), &(2, "ok"), strip),
            Admission::Write
        );
    }

    #[test]
    fn the_pace_follows_the_pacers_clock() {
        let clock = std::sync::Arc::new(crate::clock::ManualClock::starting_now());
        let pacer = StatusPacer::new(Duration::from_secs(1)).with_clock(clock.clone());
        let strip = |s: &(u32, &'static str)| (0, s.1);
        assert_eq!(pacer.admit("a", None, &(1, "ok"), strip), Admission::Write);
        assert_eq!(
            pacer.admit("a", Some(&(1, "ok")), &(2, "ok"), strip),
            Admission::Wait(Duration::from_secs(1)),
            "the clock stood still"
        );
        clock.advance(Duration::from_millis(400));
        assert_eq!(
            pacer.admit("a", Some(&(1, "ok")), &(2, "ok"), strip),
            Admission::Wait(Duration::from_millis(600))
        );
        clock.advance(Duration::from_millis(600));
        assert_eq!(
            pacer.admit("a", Some(&(1, "ok")), &(2, "ok"), strip),
            Admission::Write
        );
    }

    #[test]
    fn counter_only_writes_wait_for_the_interval_significant_ones_do_not() {
        let second = Duration::from_secs(1);
        let t0 = crate::clock::Clock::instant(&crate::clock::SystemClock);
        // Never written: at once.
        assert_eq!(hold_back_for(None, t0, second, false), None);
        // Written 300 ms ago: the rest of the second.
        let now = t0 + Duration::from_millis(300);
        assert_eq!(
            hold_back_for(Some(t0), now, second, false),
            Some(Duration::from_millis(700))
        );
        // Significant: at once all the same.
        assert_eq!(hold_back_for(Some(t0), now, second, true), None);
        // The interval is over.
        assert_eq!(hold_back_for(Some(t0), t0 + second, second, false), None);
    }

    #[test]
    fn the_pacer_notes_the_writes_it_lets_through() {
        let pacer = StatusPacer::new(Duration::from_secs(60));
        assert_eq!(pacer.hold_back("a", false), None);
        assert!(pacer.hold_back("a", false).is_some(), "within the interval");
        assert_eq!(pacer.hold_back("b", false), None, "per object");
        assert_eq!(pacer.hold_back("a", true), None);
    }
}
