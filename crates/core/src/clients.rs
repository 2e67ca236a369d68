//! Kubernetes clients from MCM-style kubeconfig flags, with a client-side rate limit
//! (`--kube-api-qps` / `--kube-api-burst`).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use mcm_driver::TokenBucket;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

/// The kubeconfig value meaning "the service account of the pod".
pub const IN_CLUSTER: &str = "inClusterConfig";
/// The kubeconfig value meaning "no such cluster" (the manager can run without a target).
pub const NONE: &str = "none";

/// Errors building clients. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The in-cluster configuration is unavailable.
    #[error("cannot use the in-cluster configuration")]
    InCluster(#[source] kube::config::InClusterError),
    /// A kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a flag nor the environment names a cluster.
    #[error("no kubeconfig given and none can be inferred from the environment")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("cannot build a Kubernetes client")]
    Build(#[source] kube::Error),
}

/// Loads a client configuration from a kubeconfig flag value: a path, `inClusterConfig`, or
/// empty (infer from `KUBECONFIG`, `~/.kube/config` or the pod environment).
pub async fn load_config(kubeconfig: &str) -> Result<kube::Config, ClientError> {
    match kubeconfig {
        "" => kube::Config::infer().await.map_err(ClientError::Infer),
        IN_CLUSTER => kube::Config::incluster().map_err(ClientError::InCluster),
        path => {
            let path = PathBuf::from(path);
            let kc = Kubeconfig::read_from(&path).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig { path, source })
        }
    }
}

/// A client for `config` that sends at most `qps` requests per second (bursts of `burst`).
pub fn rate_limited_client(
    config: kube::Config,
    qps: f32,
    burst: u32,
) -> Result<kube::Client, ClientError> {
    rate_limited_client_counted(config, qps, burst, None)
}

/// [`rate_limited_client`] that also counts every request that passed the rate limit in
/// `sent` (see [`ClientMetrics`]).
pub fn rate_limited_client_counted(
    config: kube::Config,
    qps: f32,
    burst: u32,
    sent: Option<Counter>,
) -> Result<kube::Client, ClientError> {
    let mut layer = RateLimitLayer::new(Arc::new(TokenBucket::new(f64::from(qps), burst)));
    if let Some(counter) = sent {
        layer = layer.counting(counter);
    }
    let mut config = config;
    if !config
        .headers
        .iter()
        .any(|(name, _)| name == http::header::USER_AGENT)
        && let Ok(agent) = http::HeaderValue::from_str(&user_agent())
    {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder.with_layer(&layer).build())
}

/// The `User-Agent` of this process's requests, in the form of Kubernetes clients:
/// `<binary>/<version> (<os>/<arch>) replica/<identity>`, where the identity is the
/// leader-election identity ([`replica_identity`]), so that an API server's audit log tells
/// the replicas of one deployment apart.
pub fn user_agent() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "mcm-rs".into());
    format!(
        "{binary}/{} ({}/{}) replica/{}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        replica_identity()
    )
}

/// This replica's identity: `<pod or host name>_<pid>`, unique among the replicas of a
/// deployment and among restarts. `POD_NAME` names the pod when set.
pub fn replica_identity() -> String {
    let host = std::env::var("POD_NAME").ok().or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
    });
    format!(
        "{}_{}",
        host.unwrap_or_else(|| "mcm-rs".into()),
        std::process::id()
    )
}

/// The label of [`ClientMetrics`]: which cluster a client talks to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    /// `control` or `target`.
    pub cluster: String,
}

/// `mcm_kube_client_requests_total{cluster}`: requests sent by the Kubernetes clients, counted
/// after the `--kube-api-qps` rate limit.
#[derive(Clone, Debug, Default)]
pub struct ClientMetrics {
    requests: Family<ClusterLabel, Counter>,
}

impl ClientMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ClientMetrics::default();
        registry.register(
            "mcm_kube_client_requests",
            "Requests sent to the Kubernetes API servers (after the client-side rate limit)",
            m.requests.clone(),
        );
        m
    }

    /// The counter of the clients of `cluster`.
    pub fn requests(&self, cluster: &str) -> Counter {
        self.requests
            .get_or_create(&ClusterLabel {
                cluster: cluster.to_string(),
            })
            .clone()
    }
}

/// A tower layer that takes a token before each request (and optionally counts the requests
/// it let through).
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
    sent: Option<Counter>,
}

impl RateLimitLayer {
    /// A layer taking its tokens from `bucket`.
    pub fn new(bucket: Arc<TokenBucket>) -> Self {
        RateLimitLayer { bucket, sent: None }
    }

    /// Counts every request that passed the limit in `counter`.
    pub fn counting(mut self, counter: Counter) -> Self {
        self.sent = Some(counter);
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            sent: self.sent.clone(),
            waiting: None,
            permitted: false,
        }
    }
}

type Waiting = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Fencing of a leader that was stopped (e.g. `SIGSTOP`, a frozen VM) for longer than its
/// lease could outlive: once [`arm`](Fence::arm)ed, a watchdog beats every
/// [`FENCE_BEAT`]; a request is held back while the last beat is older than the limit, and
/// the watchdog ends the process when it finds such a gap (another replica may hold the
/// lease by now, and work that was in flight before the stop must not reach the API
/// server). Like the Go MCM, which exits when it stops leading.
#[derive(Debug)]
pub struct Fence {
    origin: std::time::Instant,
    last_beat_ms: std::sync::atomic::AtomicU64,
    limit_ms: std::sync::atomic::AtomicU64,
}

/// How often the armed fence's watchdog beats.
pub const FENCE_BEAT: std::time::Duration = std::time::Duration::from_millis(100);

impl Fence {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether requests may go: not armed, or the last beat is recent enough.
    pub fn allows_requests(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        fence_open(
            self.limit_ms.load(SeqCst),
            self.now_ms(),
            self.last_beat_ms.load(SeqCst),
        )
    }

    /// Arms the fence with `limit` (the longest stop the lease is sure to survive) and runs
    /// its watchdog until the process ends: a gap beyond `limit` exits the process.
    pub fn arm(&'static self, limit: std::time::Duration) {
        use std::sync::atomic::Ordering::SeqCst;
        self.last_beat_ms.store(self.now_ms(), SeqCst);
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
        self.limit_ms.store(limit_ms, SeqCst);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FENCE_BEAT);
            loop {
                tick.tick().await;
                let gap = self.now_ms().saturating_sub(self.last_beat_ms.load(SeqCst));
                if gap > limit_ms {
                    eprintln!(
                        "the process was stopped for {gap} ms, beyond the {limit_ms} ms its leader lease is sure to survive: exiting before any further request"
                    );
                    std::process::exit(1);
                }
                self.last_beat_ms.store(self.now_ms(), SeqCst);
            }
        });
    }
}

/// Whether a fence armed with `limit_ms` (0: not armed) lets requests through at `now_ms`
/// when it last beat at `last_beat_ms`. Pure.
pub fn fence_open(limit_ms: u64, now_ms: u64, last_beat_ms: u64) -> bool {
    limit_ms == 0 || now_ms.saturating_sub(last_beat_ms) <= limit_ms
}

/// The process's [`Fence`], checked by every client built by this module (unarmed, it lets
/// everything through).
pub fn fence() -> &'static Fence {
    static FENCE: std::sync::OnceLock<Fence> = std::sync::OnceLock::new();
    FENCE.get_or_init(|| Fence {
        origin: std::time::Instant::now(),
        last_beat_ms: std::sync::atomic::AtomicU64::new(0),
        limit_ms: std::sync::atomic::AtomicU64::new(0),
    })
}

/// The service of [`RateLimitLayer`]: not ready until a token was taken.
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    sent: Option<Counter>,
    waiting: Option<Waiting>,
    permitted: bool,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !fence().allows_requests() {
            // Held until the watchdog ends the process (it beats every 100 ms, so it finds
            // the gap at once); woken again in case it was only the scheduler that lagged.
            let waker = cx.waker().clone();
            tokio::spawn(async move {
                tokio::time::sleep(FENCE_BEAT).await;
                waker.wake();
            });
            return Poll::Pending;
        }
        if !self.permitted {
            let bucket = self.bucket.clone();
            let waiting = self
                .waiting
                .get_or_insert_with(|| Box::pin(async move { bucket.acquire().await }));
            match waiting.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.waiting = None;
                    self.permitted = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.permitted = false;
        if let Some(sent) = &self.sent {
            sent.inc();
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod fence_tests {
    use super::fence_open;

    #[test]
    fn an_armed_fence_closes_after_a_gap_beyond_its_limit_only() {
        // (limit, now, last beat) -> open
        let cases = [
            (0, 100_000, 0, true), // not armed
            (1000, 5_000, 4_900, true),
            (1000, 5_000, 4_000, true), // exactly the limit
            (1000, 5_001, 4_000, false),
            (1000, 12_000, 4_000, false), // a stop of 8 s
            (1000, 4_000, 4_100, true),   // a beat stored after the clock was read
        ];
        for (limit, now, last, open) in cases {
            assert_eq!(fence_open(limit, now, last), open, "{limit} {now} {last}");
        }
    }
}

/// The error of every request of [`no_target_client`].
#[derive(Debug, thiserror::Error)]
#[error(
    "there is no target cluster (--target-kubeconfig=none): {method} {path} needs one and was \
     not sent"
)]
pub struct NoTargetCluster {
    /// The request's method.
    pub method: String,
    /// The request's path.
    pub path: String,
}

/// The service behind [`no_target_client`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTarget;

impl Service<http::Request<kube::client::Body>> for NoTarget {
    type Response = http::Response<kube::client::Body>;
    type Error = NoTargetCluster;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        std::future::ready(Err(NoTargetCluster {
            method: req.method().to_string(),
            path: req.uri().path().to_string(),
        }))
    }
}

/// The target client of `--target-kubeconfig=none`: every request fails with
/// [`NoTargetCluster`]. The controllers do not use the target cluster in that mode; should a
/// path still try, it fails with that message instead of reaching some other cluster.
pub fn no_target_client() -> kube::Client {
    kube::Client::new(NoTarget, "default")
}

#[cfg(test)]
mod no_target_tests {
    use super::*;

    #[tokio::test]
    async fn every_request_of_the_no_target_client_fails_clearly() {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(no_target_client());
        let err = nodes.get("n").await.expect_err("no target cluster");
        let text = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(text.contains("--target-kubeconfig=none"), "{text}");
        assert!(text.contains("/api/v1/nodes/n"), "{text}");
    }
}
