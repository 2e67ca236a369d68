//! A token bucket on driver calls, so a controller never exceeds a cloud's API rate.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::{Driver, DriverError, Operation};

/// A token bucket: `rate` tokens per second, at most `burst` saved up. Waiters are served in
/// the order they arrive (a tokio mutex is fair).
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A bucket that starts full. `rate` must be positive; `burst` is at least 1.
    pub fn new(rate_per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate: if rate_per_second > 0.0 {
                rate_per_second
            } else {
                f64::MIN_POSITIVE
            },
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                refilled: Instant::now(),
            }),
        }
    }

    /// Waits until a token is available and takes it.
    pub async fn acquire(&self) {
        let mut state = self.state.lock().await;
        loop {
            let now = Instant::now();
            let earned = now.duration_since(state.refilled).as_secs_f64() * self.rate;
            state.tokens = (state.tokens + earned).min(self.burst);
            state.refilled = now;
            if state.tokens >= 1.0 {
                state.tokens -= 1.0;
                return;
            }
            let missing = 1.0 - state.tokens;
            // Holding the lock while waiting keeps later callers behind this one.
            tokio::time::sleep(Duration::from_secs_f64(missing / self.rate)).await;
        }
    }
}

/// A driver wrapper that takes a token from a [`TokenBucket`] before every call.
pub struct RateLimited<D> {
    inner: D,
    bucket: TokenBucket,
}

impl<D: Driver> RateLimited<D> {
    /// Limits `inner` to `rate_per_second` calls per second with bursts of `burst`.
    pub fn new(inner: D, rate_per_second: f64, burst: u32) -> Self {
        RateLimited {
            inner,
            bucket: TokenBucket::new(rate_per_second, burst),
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    async fn around<T>(
        &self,
        _op: Operation,
        call: impl Future<Output = Result<T, DriverError>> + Send,
    ) -> Result<T, DriverError> {
        self.bucket.acquire().await;
        call.await
    }
}

crate::wrap_driver!(RateLimited);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FakeDriver, ListMachinesRequest, RequestId, SecretData};

    #[tokio::test(start_paused = true)]
    async fn burst_passes_then_calls_are_spaced_by_the_rate() {
        let d = RateLimited::new(FakeDriver::new(), 2.0, 3);
        let began = Instant::now();
        let mut at = Vec::new();
        for _ in 0..7 {
            d.list_machines(ListMachinesRequest {
                machine_class: Default::default(),
                secret: SecretData::default(),
                request_id: RequestId::generate(),
            })
            .await
            .unwrap();
            at.push(began.elapsed().as_millis());
        }
        // 3 at once (burst), then one every 500ms.
        assert_eq!(at, vec![0, 0, 0, 500, 1000, 1500, 2000]);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_the_rate() {
        let bucket = std::sync::Arc::new(TokenBucket::new(10.0, 1));
        let began = Instant::now();
        let tasks: Vec<_> = (0..11)
            .map(|_| {
                let b = bucket.clone();
                tokio::spawn(async move {
                    b.acquire().await;
                    began.elapsed()
                })
            })
            .collect();
        let mut last = Duration::ZERO;
        for t in tasks {
            last = last.max(t.await.unwrap());
        }
        // 1 immediately + 10 more at 10/s.
        assert_eq!(last, Duration::from_secs(1));
    }
}
