//! Fault injection around a driver, for tests and chaos runs.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Code, Driver, DriverError, Operation};

/// What to inject into one operation.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// Probability in `0.0..=1.0` that a call fails instead of reaching the inner driver.
    pub error_rate: f64,
    /// The code of injected errors.
    pub code: Code,
    /// Latency added before every call (failing or not).
    pub latency: Duration,
}

impl FaultSpec {
    /// Fail every call with `code`.
    pub fn always(code: Code) -> Self {
        FaultSpec {
            error_rate: 1.0,
            code,
            latency: Duration::ZERO,
        }
    }

    /// Fail with `code` at `rate`.
    pub fn rate(rate: f64, code: Code) -> Self {
        FaultSpec {
            error_rate: rate.clamp(0.0, 1.0),
            code,
            latency: Duration::ZERO,
        }
    }

    /// Only add latency.
    pub fn latency(latency: Duration) -> Self {
        FaultSpec {
            error_rate: 0.0,
            code: Code::Unavailable,
            latency,
        }
    }
}

/// A driver wrapper that fails calls at configured rates, with configured codes and added
/// latency, per operation. Decisions come from a seeded RNG, so a run is reproducible.
pub struct FaultInjecting<D> {
    inner: D,
    faults: Mutex<BTreeMap<Operation, FaultSpec>>,
    rng: Mutex<StdRng>,
}

impl<D: Driver> FaultInjecting<D> {
    /// Wraps `inner`; no faults until [`FaultInjecting::set`] is called.
    pub fn new(inner: D, seed: u64) -> Self {
        FaultInjecting {
            inner,
            faults: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// Sets the faults of one operation (replacing earlier ones).
    pub fn set(&self, op: Operation, spec: FaultSpec) {
        if let Ok(mut f) = self.faults.lock() {
            f.insert(op, spec);
        }
    }

    /// Removes the faults of one operation.
    pub fn clear(&self, op: Operation) {
        if let Ok(mut f) = self.faults.lock() {
            f.remove(&op);
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Whether the next call of `op` fails, and the latency to add.
    fn decide(&self, op: Operation) -> (Option<Code>, Duration) {
        let spec = self.faults.lock().ok().and_then(|f| f.get(&op).cloned());
        let Some(spec) = spec else {
            return (None, Duration::ZERO);
        };
        let roll: f64 = self.rng.lock().map(|mut r| r.random()).unwrap_or(1.0);
        let fail = spec.error_rate > 0.0 && roll < spec.error_rate;
        (fail.then_some(spec.code), spec.latency)
    }

    async fn around<T>(
        &self,
        op: Operation,
        call: impl Future<Output = Result<T, DriverError>> + Send,
    ) -> Result<T, DriverError> {
        let (fail, latency) = self.decide(op);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match fail {
            Some(code) => Err(DriverError::new(code, format!("fault injected into {op}"))),
            None => call.await,
        }
    }
}

crate::wrap_driver!(FaultInjecting);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FakeDriver, GetVolumeIdsRequest, ListMachinesRequest, RequestId, SecretData};

    fn list_req() -> ListMachinesRequest {
        ListMachinesRequest {
            machine_class: Default::default(),
            secret: SecretData::default(),
            request_id: RequestId::generate(),
        }
    }

    async fn failures(seed: u64, rate: f64, calls: usize) -> Vec<bool> {
        let d = FaultInjecting::new(FakeDriver::new(), seed);
        d.set(
            Operation::ListMachines,
            FaultSpec::rate(rate, Code::Unavailable),
        );
        let mut out = Vec::new();
        for _ in 0..calls {
            out.push(d.list_machines(list_req()).await.is_err());
        }
        out
    }

    #[tokio::test]
    async fn the_same_seed_gives_the_same_faults() {
        let a = failures(7, 0.5, 200).await;
        let b = failures(7, 0.5, 200).await;
        assert_eq!(a, b);
        let failed = a.iter().filter(|f| **f).count();
        assert!(
            (60..140).contains(&failed),
            "{failed} of 200 failed at rate 0.5"
        );
    }

    #[tokio::test]
    async fn rates_zero_and_one_are_exact() {
        assert!(failures(1, 0.0, 50).await.iter().all(|f| !f));
        assert!(failures(1, 1.0, 50).await.iter().all(|f| *f));
    }

    #[tokio::test]
    async fn injected_errors_carry_the_code_and_other_operations_pass() {
        let d = FaultInjecting::new(FakeDriver::new(), 1);
        d.set(
            Operation::ListMachines,
            FaultSpec::always(Code::ResourceExhausted),
        );
        let err = d.list_machines(list_req()).await.unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
        let ok = d
            .get_volume_ids(GetVolumeIdsRequest {
                pv_specs: vec![],
                request_id: RequestId::generate(),
            })
            .await;
        assert!(ok.is_ok());
        d.clear(Operation::ListMachines);
        assert!(d.list_machines(list_req()).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_added() {
        let d = FaultInjecting::new(FakeDriver::new(), 1);
        d.set(
            Operation::ListMachines,
            FaultSpec::latency(Duration::from_secs(3)),
        );
        let began = tokio::time::Instant::now();
        d.list_machines(list_req()).await.unwrap();
        assert_eq!(began.elapsed().as_secs(), 3);
    }
}
