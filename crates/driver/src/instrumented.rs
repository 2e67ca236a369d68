//! Metrics around driver calls: `mcm_cloud_api_driver_request_duration_seconds` and
//! `mcm_cloud_api_driver_requests_failed_total`, the names of Gardener's MCM.

use std::future::Future;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::{Driver, DriverError, Operation};

/// Labels of the duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The provider name, e.g. `aws`.
    pub provider: String,
    /// The driver operation, e.g. `create_machine`.
    pub operation: String,
}

/// Labels of the failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The provider name.
    pub provider: String,
    /// The driver operation.
    pub operation: String,
    /// The [`crate::Code`] name of the error.
    pub error_code: String,
}

fn new_histogram() -> Histogram {
    // 10ms .. ~164s
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

/// The driver metric families, registered once and shared by every [`Instrumented`] driver.
#[derive(Clone)]
pub struct DriverMetrics {
    duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    failed: Family<FailureLabels, Counter>,
}

impl std::fmt::Debug for DriverMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverMetrics").finish_non_exhaustive()
    }
}

impl DriverMetrics {
    /// Creates the families and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = DriverMetrics {
            duration: Family::new_with_constructor(new_histogram as fn() -> Histogram),
            failed: Family::default(),
        };
        registry.register(
            "mcm_cloud_api_driver_request_duration_seconds",
            "Time taken by driver operations, by provider and operation",
            m.duration.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "mcm_cloud_api_driver_requests_failed",
            "Number of failed driver operations, by provider, operation and error code",
            m.failed.clone(),
        );
        m
    }

    /// Number of failed calls recorded for these labels.
    pub fn failed_count(&self, provider: &str, op: Operation, code: crate::Code) -> u64 {
        self.failed
            .get_or_create(&FailureLabels {
                provider: provider.into(),
                operation: op.as_str().into(),
                error_code: code.as_str().into(),
            })
            .get()
    }
}

/// A driver wrapper that records the duration of every call and counts failures.
pub struct Instrumented<D> {
    inner: D,
    provider: Arc<str>,
    metrics: DriverMetrics,
}

impl<D: Driver> Instrumented<D> {
    /// Wraps `inner`, labelling its metrics with `provider`.
    pub fn new(inner: D, provider: &str, metrics: DriverMetrics) -> Self {
        Instrumented {
            inner,
            provider: provider.into(),
            metrics,
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    async fn around<T>(
        &self,
        op: Operation,
        call: impl Future<Output = Result<T, DriverError>> + Send,
    ) -> Result<T, DriverError> {
        let began = Instant::now();
        let result = call.await;
        let labels = OperationLabels {
            provider: self.provider.to_string(),
            operation: op.as_str().to_string(),
        };
        self.metrics
            .duration
            .get_or_create(&labels)
            .observe(began.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.metrics
                .failed
                .get_or_create(&FailureLabels {
                    provider: labels.provider,
                    operation: labels.operation,
                    error_code: e.code.as_str().to_string(),
                })
                .inc();
        }
        result
    }
}

crate::wrap_driver!(Instrumented);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Code, FakeDriver, GetMachineStatusRequest, RequestId, SecretData};

    #[tokio::test]
    async fn durations_and_failures_are_exported_under_mcm_names() {
        let mut registry = Registry::default();
        let metrics = DriverMetrics::register(&mut registry);
        let d = Instrumented::new(FakeDriver::new(), "fake", metrics.clone());
        let err = d
            .get_machine_status(GetMachineStatusRequest {
                machine: mcm_api::Machine::new("absent", Default::default()),
                machine_class: Default::default(),
                secret: SecretData::default(),
                request_id: RequestId::generate(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::NotFound);
        assert_eq!(
            metrics.failed_count("fake", Operation::GetMachineStatus, Code::NotFound),
            1
        );

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "mcm_cloud_api_driver_requests_failed_total{provider=\"fake\",operation=\"get_machine_status\",error_code=\"NotFound\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "mcm_cloud_api_driver_request_duration_seconds_count{provider=\"fake\",operation=\"get_machine_status\"} 1"
            ),
            "{text}"
        );
    }
}
