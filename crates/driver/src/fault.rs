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
    /// Latency added before every call (failing or not); with [`FaultSpec::max_latency`]
    /// above it, the lower bound of a uniformly drawn latency.
    pub latency: Duration,
    /// Upper bound of the added latency (`latency` when not above it).
    pub max_latency: Duration,
}

impl FaultSpec {
    /// Fail every call with `code`.
    pub fn always(code: Code) -> Self {
        FaultSpec {
            error_rate: 1.0,
            code,
            latency: Duration::ZERO,
            max_latency: Duration::ZERO,
        }
    }

    /// Fail with `code` at `rate`.
    pub fn rate(rate: f64, code: Code) -> Self {
        FaultSpec {
            error_rate: rate.clamp(0.0, 1.0),
            code,
            latency: Duration::ZERO,
            max_latency: Duration::ZERO,
        }
    }

    /// Only add latency.
    pub fn latency(latency: Duration) -> Self {
        FaultSpec {
            error_rate: 0.0,
            code: Code::Unavailable,
            latency,
            max_latency: latency,
        }
    }

    /// Parses a fault configuration, entries separated by `;`, each
    /// `<operations>:<key>=<value>,...` where `<operations>` is `all` or operation names
    /// joined by `+` (`create_machine+delete_machine`) and the keys are `rate` (`0.0..=1.0`),
    /// `code` (an MCM code name, default `Unavailable`) and `latency` (a Go duration, or a
    /// range `0s..2s` drawn uniformly). Later entries override earlier ones per operation.
    ///
    /// `all:rate=0.3,latency=0s..2s;create_machine:rate=0.5,code=ResourceExhausted`
    pub fn parse_config(config: &str) -> Result<Vec<(Operation, FaultSpec)>, FaultConfigError> {
        let mut out: BTreeMap<Operation, FaultSpec> = BTreeMap::new();
        for entry in config.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why: String| FaultConfigError {
                entry: entry.to_string(),
                why,
            };
            let (ops, settings) = entry
                .split_once(':')
                .ok_or_else(|| bad("expected <operations>:<key>=<value>,...".into()))?;
            let ops: Vec<Operation> = if ops.trim() == "all" {
                Operation::ALL.to_vec()
            } else {
                ops.split('+')
                    .map(|name| {
                        let name = name.trim();
                        Operation::ALL
                            .into_iter()
                            .find(|o| o.as_str() == name)
                            .ok_or_else(|| bad(format!("unknown operation {name:?}")))
                    })
                    .collect::<Result<_, _>>()?
            };
            let mut spec = FaultSpec::rate(0.0, Code::Unavailable);
            for setting in settings.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (key, value) = setting
                    .split_once('=')
                    .ok_or_else(|| bad(format!("expected key=value, got {setting:?}")))?;
                match key.trim() {
                    "rate" => {
                        let rate: f64 = value
                            .parse()
                            .map_err(|_| bad(format!("rate {value:?} is not a number")))?;
                        if !(0.0..=1.0).contains(&rate) {
                            return Err(bad(format!("rate {rate} is not within 0..=1")));
                        }
                        spec.error_rate = rate;
                    }
                    "code" => {
                        spec.code = Code::from_name(value.trim())
                            .ok_or_else(|| bad(format!("unknown code {value:?}")))?;
                    }
                    "latency" => {
                        let duration = |d: &str| {
                            mcm_api::duration::parse_go_duration(d.trim())
                                .map_err(|e| bad(format!("latency {d:?}: {e}")))
                        };
                        let (low, high) = match value.split_once("..") {
                            Some((low, high)) => (duration(low)?, duration(high)?),
                            None => (duration(value)?, duration(value)?),
                        };
                        if high < low {
                            return Err(bad(format!("latency range {value:?} is empty")));
                        }
                        spec.latency = low;
                        spec.max_latency = high;
                    }
                    other => return Err(bad(format!("unknown key {other:?}"))),
                }
            }
            for op in ops {
                out.insert(op, spec.clone());
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// A fault configuration that cannot be parsed (see [`FaultSpec::parse_config`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault configuration entry {entry:?}: {why}")]
pub struct FaultConfigError {
    /// The entry.
    pub entry: String,
    /// What is wrong.
    pub why: String,
}

/// A driver wrapper that fails calls at configured rates, with configured codes and added
/// latency, per operation. Decisions come from a seeded RNG, so a run is reproducible.
pub struct FaultInjecting<D> {
    inner: D,
    faults: Mutex<BTreeMap<Operation, FaultSpec>>,
    rng: Mutex<StdRng>,
    injected: Mutex<BTreeMap<Operation, u64>>,
}

impl<D: Driver> FaultInjecting<D> {
    /// Wraps `inner`; no faults until [`FaultInjecting::set`] is called.
    pub fn new(inner: D, seed: u64) -> Self {
        FaultInjecting {
            inner,
            faults: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            injected: Mutex::new(BTreeMap::new()),
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

    /// How many calls of `op` failed with an injected fault so far.
    pub fn injected(&self, op: Operation) -> u64 {
        self.injected
            .lock()
            .map(|i| i.get(&op).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Wraps `inner` with the faults of a parsed configuration ([`FaultSpec::parse_config`]).
    pub fn with_config(inner: D, seed: u64, config: &[(Operation, FaultSpec)]) -> Self {
        let d = FaultInjecting::new(inner, seed);
        for (op, spec) in config {
            d.set(*op, spec.clone());
        }
        d
    }

    /// Whether the next call of `op` fails, and the latency to add.
    fn decide(&self, op: Operation) -> (Option<Code>, Duration) {
        let spec = self.faults.lock().ok().and_then(|f| f.get(&op).cloned());
        let Some(spec) = spec else {
            return (None, Duration::ZERO);
        };
        let Ok(mut rng) = self.rng.lock() else {
            return (None, spec.latency);
        };
        let roll: f64 = rng.random();
        let fail = spec.error_rate > 0.0 && roll < spec.error_rate;
        let latency = if spec.max_latency > spec.latency {
            let extra: f64 = rng.random();
            spec.latency + (spec.max_latency - spec.latency).mul_f64(extra)
        } else {
            spec.latency
        };
        (fail.then_some(spec.code), latency)
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
            Some(code) => {
                if let Ok(mut i) = self.injected.lock() {
                    *i.entry(op).or_insert(0) += 1;
                }
                Err(DriverError::new(code, format!("fault injected into {op}")))
            }
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

    #[test]
    fn configurations_parse_and_bad_ones_name_the_entry() {
        let c = FaultSpec::parse_config(
            "all:rate=0.3,latency=0s..2s; create_machine+delete_machine:rate=0.5,code=ResourceExhausted",
        )
        .unwrap();
        assert_eq!(c.len(), 6);
        let create = &c
            .iter()
            .find(|(o, _)| *o == Operation::CreateMachine)
            .unwrap()
            .1;
        assert_eq!(create.error_rate, 0.5);
        assert_eq!(create.code, Code::ResourceExhausted);
        assert_eq!(
            create.max_latency,
            Duration::ZERO,
            "the later entry replaces"
        );
        let list = &c
            .iter()
            .find(|(o, _)| *o == Operation::ListMachines)
            .unwrap()
            .1;
        assert_eq!(list.error_rate, 0.3);
        assert_eq!(list.code, Code::Unavailable);
        assert_eq!(
            (list.latency, list.max_latency),
            (Duration::ZERO, Duration::from_secs(2))
        );
        for (bad, says) in [
            ("all:rate=2", "not within 0..=1"),
            ("reboot:rate=0.1", "unknown operation"),
            ("all:code=Oops", "unknown code"),
            ("all:latency=2s..1s", "is empty"),
            ("all", "expected <operations>"),
        ] {
            let err = FaultSpec::parse_config(bad).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains(bad), "{bad}: {err}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn latency_ranges_stay_within_their_bounds() {
        let d = FaultInjecting::with_config(
            FakeDriver::new(),
            3,
            &FaultSpec::parse_config("list_machines:latency=1s..3s").unwrap(),
        );
        let mut seen = Vec::new();
        for _ in 0..20 {
            let began = tokio::time::Instant::now();
            d.list_machines(list_req()).await.unwrap();
            seen.push(began.elapsed());
        }
        assert!(
            seen.iter()
                .all(|l| *l >= Duration::from_secs(1) && *l <= Duration::from_secs(3))
        );
        assert!(
            seen.iter().any(|l| *l != seen[0]),
            "drawn, not fixed: {seen:?}"
        );
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
