//! How every controller of a process runs: concurrency, shutdown on the process's one
//! cancellation token, a tracing span per reconcile naming the object, and the reconcile
//! metrics ([`ReconcileMetrics`]).

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
pub struct Runner {
    /// Reconcile metrics shared by every controller of the process.
    pub reconciles: ReconcileMetrics,
    /// `--concurrent-syncs` and the like.
    pub config: controller::Config,
    /// The process's cancellation token: controllers stop taking work when it fires.
    pub cancel: CancellationToken,
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
    pub fn run<K, C, E, F, Fut>(
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
                timed(self.reconciles.clone(), name, reconcile),
                error_policy,
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
    }
}

/// A reconcile function that records its duration and errors under `controller`, inside a
/// span naming the object.
pub fn timed<K, C, E, F, Fut>(
    reconciles: ReconcileMetrics,
    controller: &'static str,
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
        let fut = reconcile(obj, ctx);
        async move { reconciles.time(controller, fut).await }
            .instrument(span)
            .boxed()
    }
}
