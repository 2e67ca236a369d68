//! Compute clients: one per credentials, shared across calls, and the waiting for zone
//! operations.
//!
//! # HTTP and TLS
//!
//! The official client (`google-cloud-compute-v1`) sends REST over reqwest on hyper 1 with
//! rustls; its crates are built without their default crypto provider (aws-lc-rs), and
//! [`install_crypto_provider`] makes ring, the provider kube and the AWS client use, the
//! process default. Service-account credentials sign their tokens locally with it (a
//! self-signed JWT), so no token endpoint is called.
//!
//! # Endpoint
//!
//! [`GcpDriverConfig::endpoint`] overrides `https://compute.googleapis.com` (tests point it at
//! a fake Compute server); `MCM_GCP_COMPUTE_ENDPOINT` sets it in the binaries.
//!
//! # Request ids
//!
//! Every request of a driver call names the call's [`RequestId`] in its user agent
//! (`mcm-rs/<version> mcm-request-id/<id>`), and `instances.insert` and `instances.delete`
//! carry GCE's `requestId` ([`gce_request_id`]): a UUID made from the driver's request id, so
//! the client's own retries of one call never start a second operation. Across calls and
//! restarts the instance name (the machine's) keeps a create from making a second VM.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use google_cloud_auth::credentials::{Credentials, external_account, service_account};
use google_cloud_compute_v1::client::Instances;
use google_cloud_compute_v1::model::Operation;
use google_cloud_compute_v1::model::operation::Status as OperationStatus;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use mcm_driver::RequestId;

use crate::errors::{GcpError, OperationFailure};
use crate::spec::{CredentialsKind, GcpCredentials};

/// The OAuth scope of the driver's tokens (as Gardener's provider asks for).
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The environment variable the binaries read [`GcpDriverConfig::endpoint`] from.
pub const ENDPOINT_ENV: &str = "MCM_GCP_COMPUTE_ENDPOINT";
/// The page size of instance lists by default (GCE's maximum).
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// At most this many clients (one per distinct credentials) are kept.
const MAX_CLIENTS: usize = 64;

/// Driver settings that do not come from a MachineClass.
#[derive(Debug, Clone)]
pub struct GcpDriverConfig {
    /// The Compute endpoint, e.g. `http://127.0.0.1:8080` for a fake. `None`: Google's.
    pub endpoint: Option<String>,
    /// How long `create_machine` and `delete_machine` wait for their zone operation (as
    /// Gardener's provider: 5 minutes). A create whose operation is still running then
    /// returns `Unavailable`; the retry finds the instance.
    pub operation_timeout: Duration,
    /// The first pause between polls of an operation (doubling up to
    /// [`Self::max_poll_interval`]).
    pub poll_interval: Duration,
    /// The longest pause between polls of an operation.
    pub max_poll_interval: Duration,
    /// `maxResults` of each list page (1..=500).
    pub page_size: u32,
    /// Attempts per idempotent call (the client retries 503s and connection errors).
    pub max_attempts: u32,
    /// Timeout of one HTTP attempt.
    pub attempt_timeout: Duration,
}

impl Default for GcpDriverConfig {
    fn default() -> Self {
        GcpDriverConfig {
            endpoint: None,
            operation_timeout: Duration::from_secs(300),
            poll_interval: Duration::from_millis(500),
            max_poll_interval: Duration::from_secs(5),
            page_size: DEFAULT_PAGE_SIZE,
            max_attempts: 3,
            attempt_timeout: Duration::from_secs(60),
        }
    }
}

impl GcpDriverConfig {
    /// The defaults, with the endpoint from [`ENDPOINT_ENV`] when it is set.
    pub fn from_env() -> Self {
        GcpDriverConfig {
            endpoint: std::env::var(ENDPOINT_ENV).ok().filter(|s| !s.is_empty()),
            ..GcpDriverConfig::default()
        }
    }
}

/// Makes ring the process's rustls crypto provider, unless one is installed already.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// GCE's `requestId` for a driver request id: a UUID (GCE requires one). A 32-hex-digit id
/// (what [`RequestId::generate`] makes) is used as it is; any other id is hashed into one.
pub fn gce_request_id(id: &RequestId) -> String {
    let s = id.as_str();
    let hex: String = if s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        s.to_ascii_lowercase()
    } else {
        let mut a = DefaultHasher::new();
        (0u8, s).hash(&mut a);
        let mut b = DefaultHasher::new();
        (1u8, s).hash(&mut b);
        format!("{:016x}{:016x}", a.finish(), b.finish())
    };
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The user agent of a call's requests.
pub fn user_agent(id: &RequestId) -> String {
    format!("mcm-rs/{} mcm-request-id/{id}", env!("CARGO_PKG_VERSION"))
}

/// Compute clients by credentials.
#[derive(Debug, Default)]
pub struct Clients {
    by_credentials: Mutex<HashMap<u64, Instances>>,
}

fn credentials_hash(c: &GcpCredentials) -> u64 {
    let mut h = DefaultHasher::new();
    c.json.to_string().hash(&mut h);
    h.finish()
}

impl Clients {
    /// The client for `credentials`, built on first use.
    pub async fn get(
        &self,
        config: &GcpDriverConfig,
        credentials: &GcpCredentials,
    ) -> Result<Instances, GcpError> {
        let key = credentials_hash(credentials);
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        let client = build_client(config, credentials).await?;
        let mut map = self.lock();
        if map.len() >= MAX_CLIENTS {
            map.clear();
        }
        Ok(map.entry(key).or_insert(client).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instances>> {
        self.by_credentials
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// Token source of the credentials.
fn token_source(c: &GcpCredentials) -> Result<Credentials, GcpError> {
    let built = match c.kind {
        CredentialsKind::ServiceAccount => service_account::Builder::new(c.json.clone())
            .with_access_specifier(service_account::AccessSpecifier::from_scopes([
                CLOUD_PLATFORM_SCOPE,
            ]))
            .build(),
        CredentialsKind::ExternalAccount => external_account::Builder::new(c.json.clone())
            .with_scopes([CLOUD_PLATFORM_SCOPE])
            .build(),
    };
    built.map_err(|source| GcpError::Credentials { key: c.key, source })
}

async fn build_client(
    config: &GcpDriverConfig,
    credentials: &GcpCredentials,
) -> Result<Instances, GcpError> {
    install_crypto_provider();
    let mut builder = Instances::builder()
        .with_credentials(token_source(credentials)?)
        .with_retry_policy(Aip194Strict.with_attempt_limit(config.max_attempts.max(1)))
        .with_attempt_timeout(config.attempt_timeout);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
    }
    builder.build().await.map_err(GcpError::Client)
}

/// What one driver call works with: the client, the project and the request id.
#[derive(Debug, Clone)]
pub struct Call {
    /// The client.
    pub client: Instances,
    /// The project.
    pub project: String,
    /// The driver's request id.
    pub request_id: RequestId,
}

impl Call {
    /// The user agent naming the request id.
    pub fn user_agent(&self) -> String {
        user_agent(&self.request_id)
    }

    /// Waits until `op` is done, polling `zoneOperations.get` with a doubling pause, at most
    /// `config.operation_timeout`. An operation that finished with errors is an error.
    pub async fn wait(
        &self,
        config: &GcpDriverConfig,
        zone: &str,
        mut op: Operation,
    ) -> Result<Operation, GcpError> {
        let began = Instant::now();
        let mut pause = config.poll_interval;
        loop {
            if op.status == Some(OperationStatus::Done) {
                return finished(op);
            }
            let name = op.name.clone().unwrap_or_default();
            if began.elapsed() + pause > config.operation_timeout {
                return Err(GcpError::OperationTimeout {
                    operation: name,
                    kind: op.operation_type.clone().unwrap_or_default(),
                    target: target_name(&op),
                    timeout: config.operation_timeout,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(config.max_poll_interval);
            op = self
                .client
                .get_operation()
                .set_project(&self.project)
                .set_zone(zone)
                .set_operation(&name)
                .with_user_agent(self.user_agent())
                .send()
                .await
                .map_err(|e| GcpError::api("zoneOperations.get", e))?;
        }
    }
}

fn target_name(op: &Operation) -> String {
    op.target_link
        .as_deref()
        .and_then(|l| l.rsplit('/').next())
        .unwrap_or_default()
        .to_string()
}

/// A done operation: itself, or its errors.
fn finished(op: Operation) -> Result<Operation, GcpError> {
    let errors: Vec<OperationFailure> = op
        .error
        .as_ref()
        .map(|e| {
            e.errors
                .iter()
                .map(|x| OperationFailure {
                    code: x.code.clone().unwrap_or_default(),
                    message: x.message.clone().unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    if errors.is_empty() {
        return Ok(op);
    }
    Err(GcpError::Operation {
        operation: op.name.clone().unwrap_or_default(),
        kind: op.operation_type.clone().unwrap_or_default(),
        target: target_name(&op),
        errors,
    })
}

/// Shared, cheaply cloned client cache.
pub type SharedClients = Arc<Clients>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gce_request_ids_are_uuids() {
        let id = RequestId::from_string("0123456789abcdef0123456789ABCDEF");
        assert_eq!(gce_request_id(&id), "01234567-89ab-cdef-0123-456789abcdef");
        let other = gce_request_id(&RequestId::from_string("r1"));
        assert_eq!(other.len(), 36);
        assert_eq!(
            other,
            gce_request_id(&RequestId::from_string("r1")),
            "stable"
        );
        assert_ne!(other, gce_request_id(&RequestId::from_string("r2")));
        let generated = gce_request_id(&RequestId::generate());
        assert_eq!(generated.matches('-').count(), 4);
    }

    #[test]
    fn user_agents_name_the_request() {
        assert!(user_agent(&RequestId::from_string("abc")).ends_with(" mcm-request-id/abc"));
    }

    #[test]
    fn a_finished_operation_with_errors_is_an_error() {
        let op: Operation = serde_json::from_value(serde_json::json!({
            "name": "operation-1", "operationType": "insert", "status": "DONE",
            "targetLink": "https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/m-0",
            "error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'CPUS' exceeded."}]}
        }))
        .unwrap();
        let e = finished(op).unwrap_err();
        assert_eq!(
            e.to_string(),
            "operation operation-1 (insert of m-0) failed: QUOTA_EXCEEDED: Quota 'CPUS' exceeded."
        );
        let ok: Operation =
            serde_json::from_value(serde_json::json!({"name": "operation-2", "status": "DONE"}))
                .unwrap();
        assert!(finished(ok).is_ok());
    }
}
