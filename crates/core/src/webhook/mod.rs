//! The validating admission webhook a provider binary serves (`--webhook-port`).
//!
//! The API server sends an `AdmissionReview` (v1) to `POST /validate` for every create and
//! update of a MachineClass, Machine, MachineSet or MachineDeployment; the webhook answers
//! with every problem it finds ([`checks`]), so a class with `cpu: "abc"` is refused before it
//! reaches etcd, with a message naming `providerSpec.capacity.cpu`.
//!
//! TLS: with `--webhook-cert-dir` the certificate comes from that directory (cert-manager);
//! otherwise the binary makes a CA and a serving certificate for the Service's DNS names
//! (`--webhook-service-name`/`--webhook-service-namespace`, plus `--webhook-cert-hosts`),
//! keeps them in the Secret `<--webhook-configuration-name>-tls` shared by the replicas
//! (renewed at start-up when less than 90 days are left), and patches the CA into every
//! webhook of `--webhook-configuration-name`.

pub mod certs;
pub mod checks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use mcm_driver::Driver;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

pub use certs::{CertError, ServingCert};
pub use checks::Kind;

/// The path the webhook serves.
pub const PATH: &str = "/validate";

/// How the webhook is served (from the `--webhook-*` flags).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Where to listen.
    pub addr: SocketAddr,
    /// `--webhook-cert-dir`: read `tls.crt`/`tls.key` there instead of self-signing.
    pub cert_dir: Option<std::path::PathBuf>,
    /// The host names and IPs of a self-signed certificate.
    pub hosts: Vec<String>,
    /// `--webhook-configuration-name`: the configuration whose caBundle is patched (and the
    /// name of the shared Secret, with `-tls`).
    pub configuration: Option<String>,
    /// The namespace of the shared Secret.
    pub namespace: String,
    /// Whether the controllers have a target cluster (an in-place update needs one).
    pub target_cluster: bool,
}

/// Errors of the webhook's start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The certificate could not be loaded, made or published.
    #[error("webhook certificate")]
    Cert(#[from] CertError),
    /// The port could not be bound.
    #[error("cannot serve the webhook on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A self-signed certificate needs a name to be valid for.
    #[error(
        "the webhook needs --webhook-cert-dir, or --webhook-service-name or --webhook-cert-hosts for its self-signed certificate"
    )]
    NoHosts,
}

/// A rustls server configuration for `cert` (HTTP/1.1).
pub fn server_config(cert: &ServingCert) -> Result<rustls::ServerConfig, CertError> {
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem(format!("certificate: {e}")))?;
    if chain.is_empty() {
        return Err(CertError::Pem("no certificate in tls.crt".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| CertError::Pem(format!("key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(CertError::Tls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(CertError::Tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The certificate the flags ask for: from the directory, or self-signed (shared through
/// the Secret and published in the configuration when a configuration is named).
pub async fn certificate(
    config: &WebhookConfig,
    control: &kube::Client,
) -> Result<ServingCert, WebhookError> {
    if let Some(dir) = &config.cert_dir {
        return Ok(certs::from_dir(dir)?);
    }
    if config.hosts.is_empty() {
        return Err(WebhookError::NoHosts);
    }
    let Some(name) = &config.configuration else {
        // Nothing to publish to and nobody to share with: this process's own certificate.
        return Ok(certs::self_signed(&config.hosts, jiff::Timestamp::now())?);
    };
    let secrets: Api<Secret> = Api::namespaced(control.clone(), &config.namespace);
    let cert = certs::shared(&secrets, &format!("{name}-tls"), &config.hosts).await?;
    if let Some(ca) = &cert.ca_pem {
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(control.clone());
        let n = certs::patch_ca_bundle(&configs, name, ca).await?;
        tracing::info!(configuration = %name, webhooks = n, "webhook caBundle published");
    }
    Ok(cert)
}

#[derive(Clone)]
struct AppState {
    driver: Arc<dyn Driver>,
    target_cluster: bool,
}

/// Starts the webhook: loads or makes the certificate, binds, and serves until `cancel`.
/// Returns the bound address.
pub async fn serve(
    config: WebhookConfig,
    control: kube::Client,
    driver: Arc<dyn Driver>,
    cancel: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), WebhookError> {
    // Bound before the CA is published: the API server's first calls wait in the backlog
    // instead of being refused.
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| WebhookError::Bind {
            addr: config.addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| WebhookError::Bind {
        addr: config.addr,
        source,
    })?;
    let cert = certificate(&config, &control).await?;
    let tls = TlsAcceptor::from(Arc::new(server_config(&cert)?));
    let app = router(driver, config.target_cluster);
    let listener = TlsListener::start(listener, tls, cancel.clone());
    let handle = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "webhook server failed");
        }
    });
    tracing::info!(%bound, path = PATH, "admission webhook serving");
    Ok((bound, handle))
}

/// The webhook's routes (plain HTTP; [`serve`] puts TLS in front).
pub fn router(driver: Arc<dyn Driver>, target_cluster: bool) -> Router {
    Router::new()
        .route(PATH, post(validate))
        .with_state(AppState {
            driver,
            target_cluster,
        })
}

async fn validate(State(s): State<AppState>, body: Bytes) -> impl IntoResponse {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain")],
                format!("not an AdmissionReview: {e}"),
            )
                .into_response();
        }
    };
    let response = match review.try_into() {
        Ok(request) => {
            let ctx = checks::Context {
                driver: s.driver.as_ref(),
                target_cluster: s.target_cluster,
            };
            review_request(&request, &ctx)
        }
        Err(_) => AdmissionResponse::invalid("the AdmissionReview has no request"),
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("cannot encode the response: {e}").into_bytes(),
        )
            .into_response(),
    }
}

/// The answer to one admission request (pure): creates and updates of the four kinds are
/// checked; anything else is allowed (the configuration should not send it).
pub fn review_request(
    request: &AdmissionRequest<DynamicObject>,
    ctx: &checks::Context<'_>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return response;
    }
    let Some(kind) = Kind::parse(&request.kind.kind) else {
        return response;
    };
    let Some(object) = &request.object else {
        return response.deny(format!("no object in the {} request", kind.as_str()));
    };
    // An object on its way out is let go: the controllers' last updates (finalizers) must
    // never be refused.
    if object.metadata.deletion_timestamp.is_some() {
        return response;
    }
    let json = match serde_json::to_value(object) {
        Ok(v) => v,
        Err(e) => return response.deny(format!("the object cannot be read: {e}")),
    };
    let mut problems = checks::problems(kind, &json, ctx);
    // Keys the provider ignores are allowed (as Gardener's Go driver ignores them), never
    // silently: `kubectl apply` prints the warnings.
    let warnings = checks::warnings(kind, &json, ctx);
    let mut response = response;
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    // Ratcheting, as Kubernetes does for CRD validation: an update is refused only for what
    // it makes wrong, so an object stored before the webhook existed (or before a rule did)
    // can still be labelled, annotated and finalized by the controllers.
    if request.operation == Operation::Update
        && let Some(old) = request
            .old_object
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
    {
        let before = checks::problems(kind, &old, ctx);
        problems.retain(|p| !before.contains(p));
    }
    if problems.is_empty() {
        return response;
    }
    let name = if request.name.is_empty() {
        object.metadata.name.clone().unwrap_or_default()
    } else {
        request.name.clone()
    };
    let mut denied = response.deny(checks::message(kind, &name, &problems));
    denied.result.code = 422;
    denied.result.reason = "Invalid".into();
    denied
}

/// A TLS listener for axum: connections are accepted and their handshakes run in their own
/// tasks (bounded by a timeout), so one slow client does not hold up the others.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

/// How long a client may take for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl TlsListener {
    fn start(listener: TcpListener, tls: TlsAcceptor, cancel: CancellationToken) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = cancel.cancelled() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook accept failed");
                        // Out of file descriptors and the like: give the process a moment.
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                            _ = cancel.cancelled() => return,
                        }
                    }
                };
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "webhook TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "webhook TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop ended (shutdown): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mcm_driver::FakeDriver;
    use serde_json::json;

    pub(crate) fn request(
        kind: &str,
        operation: &str,
        object: serde_json::Value,
    ) -> AdmissionRequest<DynamicObject> {
        update(kind, operation, object, serde_json::Value::Null)
    }

    fn update(
        kind: &str,
        operation: &str,
        object: serde_json::Value,
        old: serde_json::Value,
    ) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "machine.sapcloud.io", "version": "v1alpha1", "kind": kind},
                "resource": {"group": "machine.sapcloud.io", "version": "v1alpha1", "resource": "x"},
                "name": "obj",
                "namespace": "ns",
                "operation": operation,
                "userInfo": {},
                "object": object,
                "oldObject": old,
            }
        }))
        .unwrap();
        review.try_into().unwrap()
    }

    #[test]
    fn a_bad_object_is_denied_with_its_fields_and_a_good_one_allowed() {
        let d = FakeDriver::new();
        let ctx = checks::Context {
            driver: &d,
            target_cluster: true,
        };
        let bad = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "obj"},
            "spec": {"class": {"name": ""}},
        });
        let r = review_request(&request("Machine", "CREATE", bad.clone()), &ctx);
        assert!(!r.allowed);
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.result.code, 422);
        assert!(
            r.result
                .message
                .starts_with("invalid Machine \"obj\": spec.class.name: is required"),
            "{}",
            r.result.message
        );
        let good = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "obj"},
            "spec": {"class": {"kind": "MachineClass", "name": "c"}},
        });
        assert!(review_request(&request("Machine", "UPDATE", good), &ctx).allowed);
        // Deletions and other kinds are not this webhook's business.
        assert!(review_request(&request("Machine", "DELETE", bad.clone()), &ctx).allowed);
        assert!(review_request(&request("Pod", "CREATE", bad), &ctx).allowed);
    }

    #[test]
    fn an_update_is_refused_only_for_what_it_makes_wrong() {
        let d = FakeDriver::new();
        let ctx = checks::Context {
            driver: &d,
            target_cluster: true,
        };
        let machine = |annotations: serde_json::Value, finalizers: serde_json::Value| {
            json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": "obj", "annotations": annotations, "finalizers": finalizers},
                "spec": {"class": {"kind": "MachineClass", "name": "c"}},
            })
        };
        // Stored before the webhook: a bad priority. The controller adds its finalizer.
        let old = machine(
            json!({"machinepriority.machine.sapcloud.io": "high"}),
            json!([]),
        );
        let new = machine(
            json!({"machinepriority.machine.sapcloud.io": "high"}),
            json!(["machine.sapcloud.io/machine-controller-manager"]),
        );
        assert!(review_request(&update("Machine", "UPDATE", new, old.clone()), &ctx).allowed);
        // A new problem on top of the old one is refused, naming only the new one.
        let worse = machine(
            json!({"machinepriority.machine.sapcloud.io": "high", "node.machine.sapcloud.io/preserve": "x"}),
            json!([]),
        );
        let r = review_request(&update("Machine", "UPDATE", worse, old.clone()), &ctx);
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("preserve"),
            "{}",
            r.result.message
        );
        assert!(
            !r.result.message.contains("machinepriority"),
            "{}",
            r.result.message
        );
        // An object being deleted is let go whatever it holds.
        let mut leaving = machine(json!({"node.machine.sapcloud.io/preserve": "x"}), json!([]));
        leaving["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(review_request(&update("Machine", "UPDATE", leaving, old), &ctx).allowed);
    }
}
