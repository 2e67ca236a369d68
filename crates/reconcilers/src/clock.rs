//! Where the controllers take time from: the system's clocks in production, a clock a test
//! steps in tests. A reconcile takes "now" once and decides with that one value.
//!
//! Two readings: the wall clock ([`Clock::now`]: what is written into objects and compared
//! with their timestamps) and a monotonic one ([`Clock::instant`]: deadlines and durations
//! kept in memory, such as a backoff or how long a drain pass took). Every controller takes
//! both from the [`SharedClock`] of its context; this file is the only place that reads the
//! system's clocks for them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The wall-clock time now.
    fn now(&self) -> Timestamp;
    /// A monotonic instant now (for deadlines and durations kept in memory).
    fn instant(&self) -> Instant;
}

/// The clock a controller's context holds.
pub type SharedClock = Arc<dyn Clock>;

/// The system's clocks, shared.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// The system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until a test advances it: both readings move together, by
/// exactly what [`ManualClock::advance`] is given. For tests that step a controller through
/// a timeout without waiting for it.
#[derive(Debug)]
pub struct ManualClock(Mutex<(Timestamp, Instant)>);

impl ManualClock {
    /// A clock showing `at` (its monotonic reading starts at the system's instant now).
    pub fn new(at: Timestamp) -> Self {
        ManualClock(Mutex::new((at, Instant::now())))
    }

    /// A clock showing the system's time now, standing still from there.
    pub fn starting_now() -> Self {
        Self::new(Timestamp::now())
    }

    /// Moves the clock forward by `by` (a step the wall clock cannot take is not taken).
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(d) = jiff::SignedDuration::try_from(by)
            && let Ok(next) = t.0.checked_add(d)
            && let Some(instant) = t.1.checked_add(by)
        {
            *t = (next, instant);
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn instant(&self) -> Instant {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let start: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap();
        let clock = ManualClock::new(start);
        let i0 = clock.instant();
        assert_eq!(clock.now(), start);
        assert_eq!(clock.instant(), i0, "stands still");
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now().to_string(), "2026-11-26T10:01:30Z");
        assert_eq!(clock.instant() - i0, Duration::from_secs(90));
    }
}
