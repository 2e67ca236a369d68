//! How every controller of a process runs: concurrency, shutdown on the process's one
//! cancellation token, no reconcile before every store of the process has listed once, a
//! tracing span per reconcile naming the object, and the reconcile metrics
//! ([`ReconcileMetrics`]).

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{self, Action, Controller};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::metrics::ReconcileMetrics;

/// Runs controllers the same way: see the module documentation.
#[derive(Clone)]
pub(crate) struct Runner {
    /// Reconcile metrics shared by every controller of the process.
    pub reconciles: ReconcileMetrics,
    /// `--concurrent-syncs` and the like.
    pub config: controller::Config,
    /// The process's cancellation token: controllers stop taking work when it fires.
    pub cancel: CancellationToken,
    /// Turns true once every store of the process has listed once. Reconciles wait for it:
    /// a decision read from a store that has not listed yet sees objects missing (a
    /// deployment whose sets are not in the store yet would create a new set: with a set
    /// named by the Go MCM, a rollout of the whole pool after every restart).
    pub synced: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").finish_non_exhaustive()
    }
}

impl Runner {
    /// The future that runs `controller` with `(name, reconcile, error_policy)` (`name`
    /// labels the metrics), until the token fires and in-flight reconciles finished.
    #[allow(clippy::type_complexity)]
    pub(crate) fn run<K, C, E, F, Fut>(
        &self,
        controller: Controller<K>,
        (name, reconcile, error_policy): (&'static str, F, fn(Arc<K>, &E, Arc<C>) -> Action),
        ctx: Arc<C>,
    ) -> impl Future<Output = ()> + Send + 'static + use<K, C, E, F, Fut>
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: std::fmt::Debug + Eq + std::hash::Hash + Clone + Unpin + Send + Sync,
        C: Send + Sync + 'static,
        E: std::error::Error + Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        controller
            .with_config(self.config.clone())
            .graceful_shutdown_on(self.cancel.clone().cancelled_owned())
            .run(
                timed(
                    self.reconciles.clone(),
                    name,
                    self.synced.clone(),
                    reconcile,
                ),
                error_policy,
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
    }
}

/// A reconcile function that waits for `synced` (once, at start-up), then records its
/// duration and errors under `controller`, inside a span naming the object.
pub(crate) fn timed<K, C, E, F, Fut>(
    reconciles: ReconcileMetrics,
    controller: &'static str,
    synced: tokio::sync::watch::Receiver<bool>,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, E>>
where
    K: kube::Resource + Send + Sync + 'static,
    C: Send + Sync + 'static,
    E: Send + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    move |obj, ctx| {
        let reconciles = reconciles.clone();
        let span = tracing::info_span!(
            "reconcile",
            controller,
            namespace = obj.meta().namespace.as_deref().unwrap_or_default(),
            name = obj.meta().name.as_deref().unwrap_or_default(),
        );
        let reconcile = reconcile.clone();
        let mut synced = synced.clone();
        async move {
            // A dropped sender means the process is shutting down before it synced.
            let _ = synced.wait_for(|s| *s).await;
            reconciles.time(controller, reconcile(obj, ctx)).await
        }
        .instrument(span)
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// No reconcile runs before the stores listed: the reconcile waits for `synced`.
    #[tokio::test]
    async fn a_reconcile_waits_until_the_stores_synced() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ReconcileMetrics::register(&mut registry);
        let (tx, rx) = tokio::sync::watch::channel(false);
        let ran = Arc::new(AtomicBool::new(false));
        let reconcile = |_: Arc<k8s_openapi::api::core::v1::Node>, ran: Arc<AtomicBool>| async move {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(Action::await_change())
        };
        let mut timed = timed(metrics, "test", rx, reconcile);
        let task = tokio::spawn(timed(Arc::new(Default::default()), ran.clone()));
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(
            !ran.load(Ordering::SeqCst),
            "reconciled before the stores synced"
        );
        tx.send_replace(true);
        task.await.expect("task").expect("reconcile");
        assert!(ran.load(Ordering::SeqCst));
    }
}
