//! The HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the process is alive) and
//! `/readyz` (caches synced, or standing by for leadership).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What `/readyz` reports.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    /// This replica leads (or leader election is off).
    pub leader: Arc<AtomicBool>,
    /// One flag per controller group: its caches have synced.
    pub synced: Vec<Arc<AtomicBool>>,
}

impl Readiness {
    /// Ready: a standby replica is ready (it waits for the lease); a leader once every
    /// controller group synced.
    pub fn is_ready(&self) -> bool {
        !self.leader.load(Ordering::SeqCst) || self.synced.iter().all(|s| s.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_is_ready_and_a_leader_only_once_synced() {
        let r = Readiness {
            leader: Default::default(),
            synced: vec![Default::default(), Default::default()],
        };
        assert!(r.is_ready(), "standby");
        r.leader.store(true, Ordering::SeqCst);
        assert!(!r.is_ready());
        r.synced[0].store(true, Ordering::SeqCst);
        assert!(!r.is_ready());
        r.synced[1].store(true, Ordering::SeqCst);
        assert!(r.is_ready());
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<std::sync::Mutex<Registry>>,
    readiness: Readiness,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    let encoded = match s.registry.lock() {
        Ok(r) => prometheus_client::encoding::text::encode(&mut body, &r),
        Err(_) => Err(std::fmt::Error),
    };
    match encoded {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "metrics encoding failed".to_string(),
        ),
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// Binds `addr` and serves until `cancel` fires. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<std::sync::Mutex<Registry>>,
    readiness: Readiness,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            registry,
            readiness,
        });
    let handle = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok((bound, handle))
}
