//! Reconcile metrics shared by every controller of a process: how many reconciles ran, how
//! many failed, how long they took, and the longest one so far (no step may hold a worker
//! for long: a drain pass, a budget or a hook waits by requeueing, not inside a reconcile).

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A reconcile longer than this is logged as a warning.
pub(crate) const SLOW_RECONCILE: Duration = Duration::from_secs(5);

/// The `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ])
}

/// `mcm_controller_reconcile_duration_seconds`, `mcm_controller_reconcile_errors_total` and
/// `mcm_controller_reconcile_longest_seconds`, labelled by controller. Register once per
/// process ([`ReconcileMetrics::register`]) and hand clones to every controller.
#[derive(Clone)]
pub struct ReconcileMetrics {
    duration: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    errors: Family<ControllerLabel, Counter>,
    longest: Family<ControllerLabel, Gauge<f64, AtomicU64>>,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        ReconcileMetrics {
            duration: Family::new_with_constructor(duration_histogram),
            errors: Family::default(),
            longest: Family::default(),
        }
    }
}

impl std::fmt::Debug for ReconcileMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconcileMetrics").finish_non_exhaustive()
    }
}

impl ReconcileMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ReconcileMetrics::default();
        registry.register(
            "mcm_controller_reconcile_duration_seconds",
            "Duration of reconciles, per controller",
            m.duration.clone(),
        );
        registry.register(
            "mcm_controller_reconcile_errors",
            "Reconciles that failed, per controller",
            m.errors.clone(),
        );
        registry.register(
            "mcm_controller_reconcile_longest_seconds",
            "The longest reconcile so far, per controller",
            m.longest.clone(),
        );
        m
    }

    /// Records one reconcile of `controller`.
    pub fn observe(&self, controller: &str, took: Duration, failed: bool) {
        let label = ControllerLabel {
            controller: controller.to_string(),
        };
        let secs = took.as_secs_f64();
        self.duration.get_or_create(&label).observe(secs);
        if failed {
            self.errors.get_or_create(&label).inc();
        }
        let longest = self.longest.get_or_create(&label);
        if secs > longest.get() {
            longest.set(secs);
        }
        if took > SLOW_RECONCILE {
            tracing::warn!(
                controller,
                seconds = secs,
                "a reconcile took longer than {}s",
                SLOW_RECONCILE.as_secs()
            );
        }
    }

    /// Runs one reconcile of `controller` and records it.
    pub async fn time<T, E>(
        &self,
        controller: &str,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let result = reconcile.await;
        self.observe(controller, started.elapsed(), result.is_err());
        result
    }

    /// The longest reconcile of `controller` so far (zero before the first).
    pub fn longest(&self, controller: &str) -> Duration {
        let label = ControllerLabel {
            controller: controller.to_string(),
        };
        Duration::from_secs_f64(self.longest.get_or_create(&label).get().max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reconciles_are_counted_per_controller_and_the_longest_kept() {
        let m = ReconcileMetrics::default();
        m.observe("machine", Duration::from_millis(300), false);
        m.observe("machine", Duration::from_millis(100), true);
        let r: Result<(), ()> = m.time("machineset", async { Err(()) }).await;
        assert!(r.is_err());
        assert_eq!(m.longest("machine"), Duration::from_millis(300));
        let mut registry = Registry::default();
        registry.register("x", "x", m.errors.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("x_total{controller=\"machine\"} 1"), "{text}");
        assert!(
            text.contains("x_total{controller=\"machineset\"} 1"),
            "{text}"
        );
    }
}
