//! HTTPS for the fake: a CA of its own (made with rcgen, one per server), a serving
//! certificate for `127.0.0.1` and `localhost` signed by it, and an axum listener that runs
//! the TLS handshake of each connection (rustls on ring) before axum serves it.
//!
//! Clients trust the CA by its PEM ([`HttpsServer::ca_pem`]); nothing is added to a trust
//! store.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh CA and a serving certificate for 127.0.0.1 signed by it.
pub(crate) struct Certificates {
    /// The CA certificate, PEM.
    pub(crate) ca_pem: String,
    /// The server's rustls configuration (ring), with the serving certificate and key.
    pub(crate) server: Arc<ServerConfig>,
}

impl Certificates {
    /// Makes them. Panics when rcgen or rustls cannot (a broken test setup).
    pub(crate) fn generate() -> Certificates {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.distinguished_name
            .push(DnType::CommonName, "mcm-fake-arm CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(ca, ca_key).expect("self-signed CA");

        let mut serving =
            CertificateParams::new(vec!["localhost".to_string()]).expect("serving parameters");
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving
            .distinguished_name
            .push(DnType::CommonName, "mcm-fake-arm");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("serving key");
        let cert = serving.signed_by(&key, &ca).expect("serving certificate");

        let chain = vec![
            CertificateDer::from(cert.der().to_vec()),
            CertificateDer::from(ca.der().to_vec()),
        ];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let server =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("serving certificate and key");
        Certificates {
            ca_pem: ca.pem(),
            server: Arc::new(server),
        }
    }
}

/// `router` served over HTTPS on 127.0.0.1 and a free port, with a CA of its own; it stops when
/// dropped. The fake's authority host is one; a test can make another for a server of its own.
pub struct HttpsServer {
    url: String,
    ca_pem: String,
    handshakes: Arc<Handshakes>,
    server: JoinHandle<()>,
    accept: JoinHandle<()>,
}

/// TLS handshakes of a server: completed and failed (a channel, so that a test can await a
/// failure the server sees after the client gave up).
#[derive(Debug)]
struct Handshakes {
    completed: AtomicU64,
    failed: watch::Sender<u64>,
}

impl HttpsServer {
    /// Serves `router` over HTTPS.
    pub async fn start(router: Router) -> HttpsServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0 for HTTPS");
        HttpsServer::serve(listener, Certificates::generate(), router)
    }

    pub(crate) fn serve(
        listener: TcpListener,
        certificates: Certificates,
        router: Router,
    ) -> HttpsServer {
        let local = listener
            .local_addr()
            .expect("local address of the HTTPS listener");
        let handshakes = Arc::new(Handshakes {
            completed: AtomicU64::new(0),
            failed: watch::channel(0).0,
        });
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(certificates.server);
        let counts = Arc::clone(&handshakes);
        let accept = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    // Out of file descriptors and the like: give the process a moment.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let (acceptor, tx, counts) = (acceptor.clone(), tx.clone(), Arc::clone(&counts));
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            counts.completed.fetch_add(1, Ordering::SeqCst);
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(_)) | Err(_) => {
                            counts.failed.send_modify(|n| *n += 1);
                        }
                    }
                });
            }
        });
        let server = tokio::spawn(async move {
            let _ = axum::serve(TlsListener { ready, local }, router).await;
        });
        HttpsServer {
            url: format!("https://{local}"),
            ca_pem: certificates.ca_pem,
            handshakes,
            server,
            accept,
        }
    }

    /// The base URL (no trailing slash), e.g. `https://127.0.0.1:40124`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM of the CA that signed the server's certificate: what a client has to trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// How many TLS handshakes failed (e.g. a client that does not trust [`HttpsServer::ca_pem`]).
    pub fn failed_handshakes(&self) -> u64 {
        *self.handshakes.failed.borrow()
    }

    /// Waits until at least `count` TLS handshakes failed, at most `deadline`; whether they did.
    /// (The server sees a client's refusal after the client has given up.)
    pub async fn wait_for_failed_handshakes(&self, count: u64, deadline: Duration) -> bool {
        let mut failed = self.handshakes.failed.subscribe();
        tokio::time::timeout(deadline, failed.wait_for(|n| *n >= count))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// How many TLS handshakes completed.
    pub fn completed_handshakes(&self) -> u64 {
        self.handshakes.completed.load(Ordering::SeqCst)
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.server.abort();
    }
}

/// Connections whose handshake completed, for axum.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
