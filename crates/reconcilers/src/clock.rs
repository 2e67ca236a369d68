//! Where the controllers take "now" from: the system's clock in production, a clock a test
//! sets in tests. A reconcile takes it once and decides with that one value.

#[cfg(test)]
use std::sync::Mutex;

use jiff::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that stands still until it is set or advanced (for tests that step time).
#[cfg(test)]
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

#[cfg(test)]
impl ManualClock {
    /// A clock showing `at`.
    pub fn new(at: Timestamp) -> Self {
        ManualClock(Mutex::new(at))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(d) = jiff::SignedDuration::try_from(by)
            && let Ok(next) = t.checked_add(d)
        {
            *t = next;
        }
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let start: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap();
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(std::time::Duration::from_secs(90));
        assert_eq!(clock.now().to_string(), "2026-11-26T10:01:30Z");
    }
}
