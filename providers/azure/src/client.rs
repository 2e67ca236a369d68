//! ARM clients: the HTTP client, the credentials of a driver call, and the requests of one
//! driver call (each with the call's request id), sent as ARM's REST API defines them.
//!
//! # HTTP and TLS
//!
//! azure_core 1.x and azure_identity 1.x carry the transport and the credentials. Their
//! default features are off: azure_core's `reqwest_rustls` turns on reqwest's `rustls`
//! feature, which is rustls on aws-lc-rs, while this workspace's TLS is rustls on ring only.
//! azure_core's `reqwest` feature is kept, for its `HttpClient` implementation of
//! `reqwest::Client` (reqwest 0.13, the version google-cloud already brings, on hyper 1), and
//! the driver builds that client itself ([`http_client`]): rustls on ring, with
//! rustls-platform-verifier (the platform's roots, `SSL_CERT_FILE` included, as reqwest's own
//! rustls setup has them) plus [`AzureDriverConfig::extra_ca_pem`], trusted by this client only,
//! never added to the process's trust store. No HTTP client of azure_core's own making is
//! used: every credential gets this one through its `ClientOptions::transport`. The driver's
//! ARM requests are sent on the same client, without a pipeline (no retry policy: the
//! controller retries a failed call).
//!
//! The driver writes its request bodies and reads ARM's JSON itself: there is no current
//! Compute or Network management crate of the Azure SDK (`azure_resourcemanager_compute` is a
//! placeholder), and the legacy `azure_mgmt_*` line is frozen at 0.21. The API versions (the
//! resource types' [`crate::resources::ResourceType::api_version`]) and the wire format are
//! those of the golden requests, captured through the legacy crates' default tags.
//!
//! # Credentials
//!
//! - A client secret: azure_identity's `ClientSecretCredential`.
//! - Workload identity: azure_identity's `ClientAssertionCredential` (what its
//!   `WorkloadIdentityCredential` wraps), whose assertion is the token file the Secret names,
//!   read for every token request and trimmed ([`TokenFile`]). azure_identity 1.0's
//!   `WorkloadIdentityCredential` itself is not used: it sends the file as it is, trailing
//!   newline included (the driver has always trimmed it), and it reads the file again only
//!   600 s after the last read.
//!
//! Either credential is kept per authority host, tenant, client id and a SHA-256 of the
//! secret or of the token file's path, so that its token cache serves every call of the
//! service principal until the token is 300 s from its expiry: one token request an hour, not
//! one per call. A workload identity's next token request reads the file again, so a token
//! gardenlet rewrote is presented from the next refresh on. At most [`MAX_CREDENTIALS`] are
//! kept; the one unused longest goes first, so a rotated secret's credential does not stay
//! for ever.
//!
//! Token requests go to the authority host of the call's cloud (below), given to the credential
//! as a custom `CloudConfiguration`, never from the environment by azure_identity itself. They
//! are not retried (`RetryOptions::none()`, as the 0.21 credentials did not retry): a failure
//! fails the driver call with [`CREDENTIAL_FAILED`], which maps to `Unauthenticated`.
//!
//! # Request ids
//!
//! Every request of a driver call (operations, operation polls, list pages) carries
//! `x-ms-client-request-id: <request id>`, and a failure names ARM's `x-ms-request-id` and
//! honours its `Retry-After`.
//!
//! # Long-running operations
//!
//! [`Call::wait`] polls `Azure-AsyncOperation` (status
//! `InProgress` → `Succeeded` / `Failed` / `Canceled`) or `Location` (202 until done), pausing as
//! `Retry-After` says within the configured bounds, at most [`AzureDriverConfig::operation_timeout`].
//!
//! # Endpoints
//!
//! The class's `cloudConfiguration.name` chooses the cloud, and the cloud its ARM endpoint and
//! Entra ID authority ([`AzureDriverConfig::clouds`], by default [`CloudEndpoints::known`]):
//! `AzurePublic` (also without a `cloudConfiguration`), `AzureChina` or `AzureGovernment`.
//! Tokens are asked for the ARM endpoint's `/.default` scope of that cloud, and a service
//! principal gets one credential per authority.
//! [`AzureDriverConfig::arm_endpoint`] (`MCM_AZURE_ARM_ENDPOINT` in the binaries) and
//! [`AzureDriverConfig::authority_host`] (`AZURE_AUTHORITY_HOST`) override them for every
//! cloud. azure_identity 1.x refuses an authority host that is not `https`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::headers::{CLIENT_REQUEST_ID, HeaderName, Headers};
use azure_core::http::{
    ClientMethodOptions, ClientOptions, HttpClient, Method, Request, RetryOptions, Transport, Url,
};
use azure_identity::{
    ClientAssertion, ClientAssertionCredential, ClientAssertionCredentialOptions,
    ClientSecretCredential, ClientSecretCredentialOptions,
};
use mcm_driver::RequestId;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::errors::{ArmFailure, AzureError, error_of};
use crate::spec::{Auth, Credentials};

/// Public Azure's ARM endpoint.
pub const PUBLIC_ARM: &str = "https://management.azure.com";
/// Public Azure's authority host.
pub const PUBLIC_AUTHORITY: &str = "https://login.microsoftonline.com";
/// The name of public Azure in `cloudConfiguration.name`.
pub const AZURE_PUBLIC: &str = "AzurePublic";
/// The name of Azure operated by 21Vianet in China.
pub const AZURE_CHINA: &str = "AzureChina";
/// The name of Azure Government (US).
pub const AZURE_GOVERNMENT: &str = "AzureGovernment";

/// Where the clients of one Azure cloud go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEndpoints {
    /// The ARM endpoint; tokens are asked for its `/.default` scope.
    pub arm: String,
    /// The Entra ID authority host.
    pub authority: String,
}

impl CloudEndpoints {
    /// The endpoints of the clouds `cloudConfiguration.name` can name (those of Azure's SDKs).
    pub fn known() -> BTreeMap<String, CloudEndpoints> {
        [
            (AZURE_PUBLIC, PUBLIC_ARM, PUBLIC_AUTHORITY),
            (
                AZURE_CHINA,
                "https://management.chinacloudapi.cn",
                "https://login.chinacloudapi.cn",
            ),
            (
                AZURE_GOVERNMENT,
                "https://management.usgovcloudapi.net",
                "https://login.microsoftonline.us",
            ),
        ]
        .into_iter()
        .map(|(name, arm, authority)| {
            (
                name.to_string(),
                CloudEndpoints {
                    arm: arm.to_string(),
                    authority: authority.to_string(),
                },
            )
        })
        .collect()
    }
}
/// The environment variable the binaries read [`AzureDriverConfig::arm_endpoint`] from.
pub const ARM_ENDPOINT_ENV: &str = "MCM_AZURE_ARM_ENDPOINT";
/// The environment variable of [`AzureDriverConfig::authority_host`] (azure_identity's).
pub const AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";
/// The environment variable naming the PEM file the binaries read
/// [`AzureDriverConfig::extra_ca_pem`] from.
pub const CA_FILE_ENV: &str = "MCM_AZURE_CA_FILE";
/// At most this many client-secret credentials (one per service principal, authority and
/// secret) are kept.
pub const MAX_CREDENTIALS: usize = 64;
/// How long the HTTP client waits for a connection (azure_core's own reqwest client's).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the HTTP client waits for a read (azure_core's own reqwest client's).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The code of a failure to get a token (not an ARM code).
pub const CREDENTIAL_FAILED: &str = "CredentialUnavailable";

const AZURE_ASYNC_OPERATION: HeaderName = HeaderName::from_static("azure-asyncoperation");
const LOCATION: HeaderName = HeaderName::from_static("location");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const MS_REQUEST_ID: HeaderName = HeaderName::from_static("x-ms-request-id");
const ERROR_CODE: HeaderName = HeaderName::from_static("x-ms-error-code");

/// Driver settings that do not come from a MachineClass.
#[derive(Debug, Clone)]
pub struct AzureDriverConfig {
    /// The ARM endpoint. `None`: public Azure.
    pub arm_endpoint: Option<String>,
    /// The Entra ID authority host. `None`: public Azure.
    pub authority_host: Option<String>,
    /// The endpoints of each cloud a class can name in `cloudConfiguration.name` (by default
    /// [`CloudEndpoints::known`]); [`AzureDriverConfig::arm_endpoint`] and
    /// [`AzureDriverConfig::authority_host`] win over them.
    pub clouds: BTreeMap<String, CloudEndpoints>,
    /// How long a create or delete waits for one long-running operation.
    pub operation_timeout: Duration,
    /// The shortest pause between polls of an operation.
    pub poll_interval: Duration,
    /// The longest pause between polls (also caps ARM's `Retry-After`).
    pub max_poll_interval: Duration,
    /// CA certificates (PEM, one or more) the driver's HTTP client trusts besides the
    /// platform's roots, for ARM and for Entra ID: e.g. the fake ARM's CA in tests. Only this
    /// driver's client trusts them. `None`: the platform's roots only.
    pub extra_ca_pem: Option<String>,
}

impl Default for AzureDriverConfig {
    fn default() -> Self {
        AzureDriverConfig {
            arm_endpoint: None,
            authority_host: None,
            clouds: CloudEndpoints::known(),
            operation_timeout: Duration::from_secs(600),
            poll_interval: Duration::from_secs(1),
            max_poll_interval: Duration::from_secs(15),
            extra_ca_pem: None,
        }
    }
}

impl AzureDriverConfig {
    /// The defaults, with the endpoints from [`ARM_ENDPOINT_ENV`] and [`AUTHORITY_HOST_ENV`],
    /// and the extra CAs from the file [`CA_FILE_ENV`] names.
    pub fn from_env() -> Result<Self, AzureError> {
        let var = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
        let extra_ca_pem = match var(CA_FILE_ENV) {
            Some(path) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|source| AzureError::CaFile { path, source })?,
            ),
            None => None,
        };
        Ok(AzureDriverConfig {
            arm_endpoint: var(ARM_ENDPOINT_ENV),
            authority_host: var(AUTHORITY_HOST_ENV),
            extra_ca_pem,
            ..AzureDriverConfig::default()
        })
    }

    /// The ARM endpoint and the authority host of `cloud` (`None`: public Azure). Pure.
    pub fn endpoints(&self, cloud: Option<&str>) -> Result<(Url, Url), AzureError> {
        let name = cloud.unwrap_or(AZURE_PUBLIC);
        let known = self.clouds.get(name);
        let pick =
            |over: &Option<String>, of: fn(&CloudEndpoints) -> &str| match (over.as_deref(), known)
            {
                (Some(url), _) => parse_url(url),
                (None, Some(c)) => parse_url(of(c)),
                (None, None) => Err(AzureError::UnknownCloud(name.to_string())),
            };
        Ok((
            pick(&self.arm_endpoint, |c| &c.arm)?,
            pick(&self.authority_host, |c| &c.authority)?,
        ))
    }
}

/// The `/.default` scope of an ARM endpoint (what a token for it is asked for).
pub fn arm_scope(arm: &Url) -> String {
    format!("{}/.default", arm.as_str().trim_end_matches('/'))
}

fn parse_url(s: &str) -> Result<Url, AzureError> {
    Url::parse(s).map_err(|e| invalid_url(e, format!("invalid URL {s:?}")))
}

/// The error of a URL that cannot be made: `what` it was, and why.
fn invalid_url(e: impl std::error::Error + Send + Sync + 'static, what: String) -> AzureError {
    AzureError::Client(Box::new(azure_core::Error::with_error(
        azure_core::error::ErrorKind::DataConversion,
        e,
        what,
    )))
}

/// The HTTP client of ARM and Entra ID requests: reqwest 0.13 on rustls with ring (no
/// aws-lc-rs, whatever rustls provider the process has installed), HTTP/1.1, no redirects,
/// azure_core's timeouts; its certificates are verified against the platform's roots and the
/// CA certificates in `extra_ca_pem`.
pub fn http_client(extra_ca_pem: Option<&str>) -> Result<Arc<dyn HttpClient>, AzureError> {
    let failed = |what: &str| {
        let what = what.to_string();
        move |e: rustls::Error| AzureError::HttpClient {
            what,
            source: Box::new(e),
        }
    };
    let extra: Vec<CertificateDer<'static>> = match extra_ca_pem {
        Some(pem) => {
            let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| AzureError::HttpClient {
                    what: "the extra CA certificates are not PEM certificates".into(),
                    source: Box::new(e),
                })?;
            if certs.is_empty() {
                return Err(AzureError::HttpClient {
                    what: "the extra CA certificates are not PEM certificates".into(),
                    source: "no CERTIFICATE block".into(),
                });
            }
            certs
        }
        None => Vec::new(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = if extra.is_empty() {
        rustls_platform_verifier::Verifier::new(provider.clone())
    } else {
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
    }
    .map_err(failed("the certificate verifier cannot be made"))?;
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(failed("no TLS version"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| AzureError::HttpClient {
            what: "reqwest refused the client".into(),
            source: Box::new(e),
        })?;
    Ok(Arc::new(client))
}

fn retry_after(headers: &Headers) -> Option<Duration> {
    headers
        .get_optional_str(&RETRY_AFTER)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The URL of the page a list's `nextLink` names, as the SDK follows it: resolved against the
/// page it came from (ARM's are absolute), with the list's `api-version` when the link has
/// none. Pure.
pub fn next_page(current: &Url, next_link: &str) -> Result<Url, AzureError> {
    let mut next = current
        .join(next_link)
        .map_err(|e| invalid_url(e, format!("invalid nextLink {next_link:?}")))?;
    let version = |u: &Url| {
        u.query_pairs()
            .find(|(k, _)| k == "api-version")
            .map(|(_, v)| v.into_owned())
    };
    if version(&next).is_none()
        && let Some(v) = version(current)
    {
        next.query_pairs_mut().append_pair("api-version", &v);
    }
    Ok(next)
}

/// The shared HTTP client (made on the first call) and the client-secret credentials.
#[derive(Debug, Default)]
pub struct Clients {
    http: Mutex<Option<Arc<dyn HttpClient>>>,
    secrets: Mutex<KeptCredentials>,
}

/// The credentials kept, by [`credential_key`], at most [`MAX_CREDENTIALS`].
#[derive(Debug, Default)]
struct KeptCredentials {
    by_key: HashMap<[u8; 32], KeptCredential>,
    /// Counts the uses: the credential whose last use counted least goes first.
    uses: u64,
}

/// A credential and the use that used it last.
#[derive(Debug)]
struct KeptCredential {
    credential: Arc<dyn TokenCredential>,
    used: u64,
}

/// Workload identity's client assertion: the federated token in the file the Secret names,
/// read for every token request azure_identity makes, surrounding whitespace trimmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile(pub std::path::PathBuf);

#[async_trait::async_trait]
impl ClientAssertion for TokenFile {
    async fn secret(&self, _: Option<ClientMethodOptions<'_>>) -> azure_core::Result<String> {
        match tokio::fs::read_to_string(&self.0).await {
            Ok(token) => Ok(token.trim().to_string()),
            Err(e) => Err(azure_core::Error::with_error(
                azure_core::error::ErrorKind::Credential,
                e,
                format!(
                    "cannot read the workload identity token file {}",
                    self.0.display()
                ),
            )),
        }
    }
}

/// The key of a credential: a SHA-256 of what makes it, the client secret or the token
/// file's path included (so that the secret is not kept as a key, and a rotated secret makes
/// a new credential).
fn credential_key(authority: &Url, c: &Credentials) -> [u8; 32] {
    let (kind, material) = match &c.auth {
        Auth::ClientSecret(secret) => ("client-secret", secret.as_str()),
        Auth::WorkloadIdentity { token_file } => ("workload-identity", token_file.as_str()),
    };
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        authority.as_str(),
        &c.tenant_id,
        &c.client_id,
        kind,
        material,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let mut key = [0; 32];
    key.copy_from_slice(h.finish().as_ref());
    key
}

impl Clients {
    /// Clients whose requests, token requests included, go through `http`.
    pub fn with_http_client(http: Arc<dyn HttpClient>) -> Clients {
        Clients {
            http: Mutex::new(Some(http)),
            secrets: Mutex::default(),
        }
    }

    /// The HTTP client, made on first use from `config` ([`http_client`]); a failure is
    /// returned, and the next call tries again.
    fn http(&self, config: &AzureDriverConfig) -> Result<Arc<dyn HttpClient>, AzureError> {
        let mut http = self.http.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = &*http {
            return Ok(client.clone());
        }
        let client = http_client(config.extra_ca_pem.as_deref())?;
        *http = Some(client.clone());
        Ok(client)
    }

    /// The options of a credential: the token requests go to `authority` on `http`, once.
    fn credential_options(authority: &Url, http: Arc<dyn HttpClient>) -> ClientOptions {
        let mut cloud = CustomConfiguration::default();
        cloud.authority_host = authority.to_string();
        ClientOptions {
            transport: Some(Transport::new(http)),
            retry: RetryOptions::none(),
            cloud: Some(Arc::new(CloudConfiguration::Custom(cloud))),
            ..ClientOptions::default()
        }
    }

    /// How many credentials are kept.
    pub fn kept_credentials(&self) -> usize {
        self.secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .len()
    }

    /// The credential of a service principal at `authority`: the kept one while nothing
    /// about it changes, else a new one (kept).
    fn credential(
        &self,
        http: Arc<dyn HttpClient>,
        authority: &Url,
        c: &Credentials,
    ) -> Result<Arc<dyn TokenCredential>, AzureError> {
        let key = credential_key(authority, c);
        let mut kept = self.secrets.lock().unwrap_or_else(|e| e.into_inner());
        kept.uses += 1;
        let used = kept.uses;
        if let Some(k) = kept.by_key.get_mut(&key) {
            k.used = used;
            return Ok(k.credential.clone());
        }
        let credential = Self::new_credential(http, authority, c)?;
        if kept.by_key.len() >= MAX_CREDENTIALS
            && let Some(oldest) = kept
                .by_key
                .iter()
                .min_by_key(|(_, k)| k.used)
                .map(|(key, _)| *key)
        {
            kept.by_key.remove(&oldest);
        }
        kept.by_key.insert(
            key,
            KeptCredential {
                credential: credential.clone(),
                used,
            },
        );
        Ok(credential)
    }

    fn new_credential(
        http: Arc<dyn HttpClient>,
        authority: &Url,
        c: &Credentials,
    ) -> Result<Arc<dyn TokenCredential>, AzureError> {
        let client_options = Self::credential_options(authority, http);
        match &c.auth {
            Auth::WorkloadIdentity { token_file } => Ok(ClientAssertionCredential::new(
                c.tenant_id.clone(),
                c.client_id.clone(),
                TokenFile(token_file.into()),
                Some(ClientAssertionCredentialOptions { client_options }),
            )
            .map_err(|e| AzureError::Credential {
                what: format!(
                    "workload identity credential of client {} with the token file {token_file}",
                    c.client_id
                ),
                source: Box::new(e),
            })?),
            Auth::ClientSecret(secret) => Ok(ClientSecretCredential::new(
                &c.tenant_id,
                c.client_id.clone(),
                Secret::new(secret.clone()),
                Some(ClientSecretCredentialOptions { client_options }),
            )
            .map_err(|e| AzureError::Credential {
                what: format!("client secret credential of client {}", c.client_id),
                source: Box::new(e),
            })?),
        }
    }

    /// The clients of one driver call in `cloud` (the class's `cloudConfiguration.name`;
    /// `None`: public Azure).
    pub fn call(
        &self,
        config: &AzureDriverConfig,
        cloud: Option<&str>,
        c: &Credentials,
        request_id: &RequestId,
    ) -> Result<Call, AzureError> {
        let (arm, authority) = config.endpoints(cloud)?;
        let http = self.http(config)?;
        let credential = self.credential(http.clone(), &authority, c)?;
        Ok(Call {
            http,
            credential,
            scope: arm_scope(&arm),
            arm,
            subscription: c.subscription_id.clone(),
            request_id: request_id.clone(),
        })
    }
}

/// What one driver call works with: the shared HTTP client, the credential and the request id
/// every request carries.
#[derive(Clone)]
pub struct Call {
    http: Arc<dyn HttpClient>,
    credential: Arc<dyn TokenCredential>,
    scope: String,
    /// The ARM endpoint of the call's cloud.
    pub arm: Url,
    /// The subscription.
    pub subscription: String,
    /// The driver's request id.
    pub request_id: RequestId,
}

/// An ARM answer: its status, headers and JSON body (`null` when the body is not JSON).
#[derive(Debug)]
pub struct ArmResponse {
    /// The HTTP status.
    pub status: u16,
    /// The headers.
    pub headers: Headers,
    /// The body.
    pub json: serde_json::Value,
}

impl ArmResponse {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// What an answer that is not a success says: ARM's code (the `x-ms-error-code` header,
    /// else the body's `error.code`, as azure_core reads it), message, `x-ms-request-id` and
    /// `Retry-After`. Pure.
    pub fn failure(&self) -> ArmFailure {
        let (body_code, message) = error_of(&self.json);
        ArmFailure {
            status: Some(self.status),
            code: self.headers.get_optional_string(&ERROR_CODE).or(body_code),
            message,
            request_id: self.headers.get_optional_string(&MS_REQUEST_ID),
            retry_after: retry_after(&self.headers),
        }
    }
}

/// Where an accepted long-running operation can be watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// Nothing to wait for: the response was final.
    Done,
    /// `Azure-AsyncOperation`: a status resource.
    AsyncOperation(String),
    /// `Location`: 202 until done.
    Location(String),
}

impl Poll {
    /// How to wait for the operation a response with `status` and `headers` started.
    pub fn of(status: u16, headers: &Headers) -> Poll {
        if let Some(url) = headers.get_optional_string(&AZURE_ASYNC_OPERATION) {
            return Poll::AsyncOperation(url);
        }
        match headers.get_optional_string(&LOCATION) {
            Some(url) if status == 202 => Poll::Location(url),
            _ => Poll::Done,
        }
    }
}

impl Call {
    /// A failure without an ARM answer: the token could not be obtained (Entra ID refused the
    /// service principal: [`CREDENTIAL_FAILED`]), or the request could not be sent or its
    /// answer not read.
    fn unanswered(&self, call: impl Into<String>, e: azure_core::Error) -> AzureError {
        let mut failure = ArmFailure {
            message: e.to_string(),
            ..ArmFailure::default()
        };
        match e.kind() {
            azure_core::error::ErrorKind::HttpResponse {
                status, error_code, ..
            } => {
                failure.status = Some(u16::from(*status));
                failure.code = error_code.clone();
            }
            azure_core::error::ErrorKind::Credential => {
                failure.code = Some(CREDENTIAL_FAILED.to_string());
            }
            _ => {}
        }
        AzureError::Api {
            call: call.into(),
            failure: Box::new(failure),
            source: Some(Box::new(e)),
        }
    }

    /// A token for the call's ARM scope, from the credential (its cache, else the authority);
    /// `call` names what it is for.
    async fn bearer(&self, call: &str) -> Result<String, AzureError> {
        let token = self
            .credential
            .get_token(&[&self.scope], None)
            .await
            .map_err(|e| self.unanswered(format!("{call} (token)"), e))?;
        Ok(token.token.secret().to_string())
    }

    /// The failure an ARM answer that is not a success describes.
    fn refused(call: impl Into<String>, response: &ArmResponse) -> AzureError {
        AzureError::Api {
            call: call.into(),
            failure: Box::new(response.failure()),
            source: None,
        }
    }

    /// The URL of the ARM path `path` (with its query) below the cloud's endpoint.
    fn url(&self, path: &str) -> Result<Url, AzureError> {
        self.arm
            .join(path)
            .map_err(|e| invalid_url(e, format!("invalid ARM path {path:?}")))
    }

    /// Sends `method` to `url` with `body` (JSON), with the call's bearer token and its
    /// request id in `x-ms-client-request-id`; the answer, whatever its status.
    async fn exchange(
        &self,
        call: &str,
        method: Method,
        url: Url,
        body: Option<&serde_json::Value>,
    ) -> Result<ArmResponse, AzureError> {
        let token = self.bearer(call).await?;
        let mut request = Request::new(url, method);
        request.insert_header(
            azure_core::http::headers::AUTHORIZATION,
            format!("Bearer {token}"),
        );
        request.insert_header(CLIENT_REQUEST_ID, self.request_id.to_string());
        if let Some(body) = body {
            request.insert_header(azure_core::http::headers::CONTENT_TYPE, "application/json");
            request.set_body(serde_json::to_vec(body).unwrap_or_default());
        }
        let response = self
            .http
            .execute_request(&request)
            .await
            .map_err(|e| self.unanswered(call, e))?;
        let (status, headers, body) = response.deconstruct();
        let bytes = body.collect().await.map_err(|e| self.unanswered(call, e))?;
        Ok(ArmResponse {
            status: u16::from(status),
            headers,
            json: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        })
    }

    /// Sends `method` to the ARM path `path` (with its query) with `body`; the answer of a
    /// 2xx, else the failure ARM describes.
    pub async fn send(
        &self,
        call: &str,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<ArmResponse, AzureError> {
        let response = self.exchange(call, method, self.url(path)?, body).await?;
        if response.is_success() {
            Ok(response)
        } else {
            Err(Self::refused(call, &response))
        }
    }

    /// [`Call::send`], for the JSON of the answer.
    pub async fn arm_json(
        &self,
        call: &str,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, AzureError> {
        Ok(self.send(call, method, path, body).await?.json)
    }

    /// PUTs `body` to the ARM path `path` and waits for the operation it started.
    pub async fn put(
        &self,
        config: &AzureDriverConfig,
        call: &str,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<(), AzureError> {
        let response = self.send(call, Method::Put, path, Some(body)).await?;
        self.wait(config, call, Poll::of(response.status, &response.headers))
            .await
    }

    /// The resource at `path`, or `None` when ARM says 404.
    pub async fn get_optional(
        &self,
        call: &str,
        path: &str,
    ) -> Result<Option<serde_json::Value>, AzureError> {
        match self.send(call, Method::Get, path, None).await {
            Ok(r) => Ok(Some(r.json)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every item of the list at `path`: its `value`s, page after page as `nextLink` says
    /// ([`next_page`]; a link seen before ends the list with an error instead of a loop).
    pub async fn list(&self, call: &str, path: &str) -> Result<Vec<serde_json::Value>, AzureError> {
        let mut items = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut url = self.url(path)?;
        loop {
            let page = self.exchange(call, Method::Get, url.clone(), None).await?;
            if !page.is_success() {
                return Err(Self::refused(call, &page));
            }
            let serde_json::Value::Object(mut page) = page.json else {
                return Err(AzureError::Answer {
                    call: call.to_string(),
                    problem: "a list page that is not a JSON object".into(),
                });
            };
            if let Some(serde_json::Value::Array(values)) = page.remove("value") {
                items.extend(values);
            }
            let next = match page.remove("nextLink") {
                Some(serde_json::Value::String(next)) if !next.is_empty() => next,
                _ => return Ok(items),
            };
            if !seen.insert(next.clone()) {
                return Err(AzureError::Answer {
                    call: call.to_string(),
                    problem: format!("the nextLink {next} came twice"),
                });
            }
            url = next_page(&url, &next)?;
        }
    }

    /// A GET of the absolute `url` (an operation's status), whatever its status.
    async fn get_json(&self, call: &str, url: &str) -> Result<ArmResponse, AzureError> {
        self.exchange(
            &format!("{call} (poll)"),
            Method::Get,
            parse_url(url)?,
            None,
        )
        .await
    }

    /// Waits for the operation `poll` names, at most `config.operation_timeout`.
    pub async fn wait(
        &self,
        config: &AzureDriverConfig,
        call: &str,
        poll: Poll,
    ) -> Result<(), AzureError> {
        let began = Instant::now();
        let mut pause = config.poll_interval;
        loop {
            let ArmResponse {
                status,
                headers,
                json: body,
            } = match &poll {
                Poll::Done => return Ok(()),
                Poll::AsyncOperation(url) | Poll::Location(url) => self.get_json(call, url).await?,
            };
            let request_id = headers.get_optional_string(&MS_REQUEST_ID);
            match (&poll, status) {
                (_, 400..) => {
                    let (code, message) = error_of(&body);
                    return Err(AzureError::Operation {
                        call: call.to_string(),
                        status: format!("poll answered HTTP {status}"),
                        failure: Box::new(ArmFailure {
                            status: Some(status),
                            code,
                            message,
                            request_id,
                            retry_after: retry_after(&headers),
                        }),
                    });
                }
                (Poll::AsyncOperation(_), _) => {
                    match body
                        .get("status")
                        .and_then(|s| s.as_str())
                        .unwrap_or("InProgress")
                    {
                        "Succeeded" => return Ok(()),
                        s @ ("Failed" | "Canceled") => {
                            let (code, message) = error_of(&body);
                            return Err(AzureError::Operation {
                                call: call.to_string(),
                                status: s.to_string(),
                                failure: Box::new(ArmFailure {
                                    status: None,
                                    code,
                                    message,
                                    request_id,
                                    retry_after: None,
                                }),
                            });
                        }
                        _ => {}
                    }
                }
                (Poll::Location(_), 202) => {}
                (Poll::Location(_), _) => return Ok(()),
                (Poll::Done, _) => return Ok(()),
            }
            let wanted = retry_after(&headers)
                .unwrap_or(pause)
                .clamp(config.poll_interval, config.max_poll_interval);
            if began.elapsed() + wanted > config.operation_timeout {
                return Err(AzureError::OperationTimeout {
                    call: call.to_string(),
                    timeout: config.operation_timeout,
                });
            }
            tokio::time::sleep(wanted).await;
            pause = (pause * 2).min(config.max_poll_interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core::http::{AsyncRawResponse, Body, StatusCode};

    const TENANT: &str = "00000000-0000-0000-0000-00000000000b";
    const CLIENT: &str = "00000000-0000-0000-0000-00000000000c";

    /// An HTTP client that records every request (URL and body) and answers each with a
    /// token.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(String, String)>>);

    #[async_trait::async_trait]
    impl HttpClient for Recorder {
        async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
            let body = match request.body() {
                Body::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                Body::SeekableStream(_) => String::new(),
            };
            self.0
                .lock()
                .unwrap()
                .push((request.url().to_string(), body));
            Ok(AsyncRawResponse::from_bytes(
                StatusCode::Ok,
                Headers::new(),
                r#"{"token_type":"Bearer","expires_in":3599,"ext_expires_in":3599,"access_token":"t"}"#,
            ))
        }
    }

    impl Recorder {
        fn last(&self) -> (String, String) {
            self.0.lock().unwrap().last().cloned().expect("a request")
        }
    }

    fn credentials(auth: Auth) -> Credentials {
        Credentials {
            subscription_id: "s".into(),
            tenant_id: TENANT.into(),
            client_id: CLIENT.into(),
            auth,
        }
    }

    fn secret(s: &str) -> Credentials {
        credentials(Auth::ClientSecret(s.into()))
    }

    #[tokio::test]
    async fn each_cloud_asks_its_own_authority_host_for_a_token_for_its_arm() {
        let recorder = Arc::new(Recorder::default());
        let clients = Clients::with_http_client(recorder.clone());
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "eyJ.federated").unwrap();
        let workload_identity = credentials(Auth::WorkloadIdentity {
            token_file: token_file.display().to_string(),
        });
        let config = AzureDriverConfig::default();
        let id = RequestId::generate();
        for (cloud, authority, arm) in [
            (
                None,
                "https://login.microsoftonline.com",
                "https://management.azure.com",
            ),
            (
                Some(AZURE_CHINA),
                "https://login.chinacloudapi.cn",
                "https://management.chinacloudapi.cn",
            ),
            (
                Some(AZURE_GOVERNMENT),
                "https://login.microsoftonline.us",
                "https://management.usgovcloudapi.net",
            ),
        ] {
            for c in [secret("s3cret"), workload_identity.clone()] {
                let call = clients.call(&config, cloud, &c, &id).unwrap();
                call.bearer("test").await.unwrap();
                let (url, form) = recorder.last();
                assert_eq!(
                    url,
                    format!("{authority}/{TENANT}/oauth2/v2.0/token"),
                    "{cloud:?}"
                );
                let scope = format!("scope={}", arm.replace(':', "%3A").replace('/', "%2F"));
                assert!(form.contains(&scope), "{cloud:?}: {form}");
            }
        }
        // AZURE_AUTHORITY_HOST wins over the cloud's.
        let overridden = AzureDriverConfig {
            authority_host: Some("https://login.example.test".into()),
            ..AzureDriverConfig::default()
        };
        let call = clients
            .call(&overridden, Some(AZURE_GOVERNMENT), &secret("s3cret"), &id)
            .unwrap();
        call.bearer("test").await.unwrap();
        assert_eq!(
            recorder.last().0,
            format!("https://login.example.test/{TENANT}/oauth2/v2.0/token")
        );
        // azure_identity 1.x refuses a plain-http authority: a credential failure.
        let plain = AzureDriverConfig {
            authority_host: Some("http://127.0.0.1:1".into()),
            ..AzureDriverConfig::default()
        };
        let e = clients
            .call(&plain, None, &secret("other"), &id)
            .err()
            .expect("refused");
        assert!(matches!(e, AzureError::Credential { .. }), "{e:?}");
        assert_eq!(e.classification().code, mcm_driver::Code::Unauthenticated);
    }

    #[test]
    fn credentials_are_shared_and_the_least_recently_used_go_first() {
        let clients = Clients::with_http_client(Arc::new(Recorder::default()));
        let config = AzureDriverConfig::default();
        let id = RequestId::generate();
        let credential = |c: &Credentials| clients.call(&config, None, c, &id).unwrap().credential;
        let first = credential(&secret("s-0"));
        assert!(Arc::ptr_eq(&first, &credential(&secret("s-0"))), "shared");
        // A rotated secret is another credential; the authority is part of it too.
        assert!(!Arc::ptr_eq(&first, &credential(&secret("s-1"))));
        let china = clients
            .call(&config, Some(AZURE_CHINA), &secret("s-0"), &id)
            .unwrap()
            .credential;
        assert!(!Arc::ptr_eq(&first, &china));
        assert_eq!(clients.kept_credentials(), 3);
        // One credential per Secret is never kept for ever: at most MAX_CREDENTIALS, and the
        // one used last stays.
        for i in 2..MAX_CREDENTIALS + 10 {
            credential(&secret(&format!("s-{i}")));
            assert!(Arc::ptr_eq(&first, &credential(&secret("s-0"))), "s-{i}");
        }
        assert_eq!(clients.kept_credentials(), MAX_CREDENTIALS);
        assert!(
            !Arc::ptr_eq(
                &china,
                &clients
                    .call(&config, Some(AZURE_CHINA), &secret("s-0"), &id)
                    .unwrap()
                    .credential
            ),
            "the least recently used went"
        );
        // A workload identity's credential is shared too (its token cache serves every call;
        // it reads the file when it asks for a token), one per token file.
        let wi = |file: &str| {
            credential(&credentials(Auth::WorkloadIdentity {
                token_file: file.into(),
            }))
        };
        let token_a = wi("/var/run/token-a");
        assert!(Arc::ptr_eq(&token_a, &wi("/var/run/token-a")), "shared");
        assert!(!Arc::ptr_eq(&token_a, &wi("/var/run/token-b")));
        assert_eq!(clients.kept_credentials(), MAX_CREDENTIALS);
    }

    #[test]
    fn extra_ca_certificates_must_be_pem_certificates() {
        for pem in ["", "not a certificate"] {
            let e = http_client(Some(pem)).expect_err("refused");
            assert!(matches!(e, AzureError::HttpClient { .. }), "{e:?}");
        }
    }

    #[test]
    fn each_cloud_has_its_endpoints_and_the_overrides_win() {
        let config = AzureDriverConfig::default();
        let of = |cloud: Option<&str>| {
            let (arm, authority) = config.endpoints(cloud).unwrap();
            (arm_scope(&arm), authority.to_string())
        };
        assert_eq!(
            of(None),
            (
                "https://management.azure.com/.default".to_string(),
                "https://login.microsoftonline.com/".to_string()
            )
        );
        assert_eq!(of(Some(AZURE_PUBLIC)), of(None));
        assert_eq!(
            of(Some(AZURE_CHINA)),
            (
                "https://management.chinacloudapi.cn/.default".to_string(),
                "https://login.chinacloudapi.cn/".to_string()
            )
        );
        assert_eq!(
            of(Some(AZURE_GOVERNMENT)),
            (
                "https://management.usgovcloudapi.net/.default".to_string(),
                "https://login.microsoftonline.us/".to_string()
            )
        );
        assert!(matches!(
            config.endpoints(Some("AzureStack")),
            Err(AzureError::UnknownCloud(c)) if c == "AzureStack"
        ));
        let overridden = AzureDriverConfig {
            arm_endpoint: Some("http://127.0.0.1:1".into()),
            authority_host: Some("http://127.0.0.1:2".into()),
            ..AzureDriverConfig::default()
        };
        let (arm, authority) = overridden.endpoints(Some(AZURE_CHINA)).unwrap();
        assert_eq!(
            (arm.as_str(), authority.as_str()),
            ("http://127.0.0.1:1/", "http://127.0.0.1:2/")
        );
    }

    #[test]
    fn a_refusal_is_read_from_the_headers_and_the_body() {
        let mut headers = Headers::new();
        headers.insert(MS_REQUEST_ID, "arm-1");
        headers.insert(RETRY_AFTER, "3");
        let mut answer = ArmResponse {
            status: 409,
            headers,
            json: serde_json::json!({"error": {"code": "Conflict", "message": "busy"}}),
        };
        assert!(!answer.is_success());
        assert_eq!(
            answer.failure(),
            ArmFailure {
                status: Some(409),
                code: Some("Conflict".into()),
                message: "busy".into(),
                request_id: Some("arm-1".into()),
                retry_after: Some(Duration::from_secs(3)),
            }
        );
        // `x-ms-error-code` wins over the body's code, as azure_core reads it.
        answer
            .headers
            .insert(ERROR_CODE, "AnotherOperationInProgress");
        assert_eq!(
            answer.failure().code.as_deref(),
            Some("AnotherOperationInProgress")
        );
        // A body that is not ARM's error: no code, no message.
        answer.json = serde_json::Value::Null;
        answer.headers = Headers::new();
        assert_eq!(
            answer.failure(),
            ArmFailure {
                status: Some(409),
                ..ArmFailure::default()
            }
        );
    }

    #[test]
    fn a_next_link_is_followed_as_the_sdk_follows_it() {
        let first = Url::parse(
            "https://management.azure.com/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks?api-version=2024-03-02",
        )
        .unwrap();
        let absolute = "https://management.azure.com/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks?api-version=2024-03-02&%24skiptoken=x";
        assert_eq!(next_page(&first, absolute).unwrap().as_str(), absolute);
        assert_eq!(
            next_page(&first, "/subscriptions/s/next?%24skiptoken=y")
                .unwrap()
                .as_str(),
            "https://management.azure.com/subscriptions/s/next?%24skiptoken=y&api-version=2024-03-02"
        );
    }

    #[test]
    fn how_to_wait_for_an_operation() {
        let mut h = Headers::new();
        assert_eq!(Poll::of(200, &h), Poll::Done);
        h.insert(LOCATION, "http://x/op");
        assert_eq!(
            Poll::of(200, &h),
            Poll::Done,
            "a Location of a final response is no operation"
        );
        assert_eq!(Poll::of(202, &h), Poll::Location("http://x/op".into()));
        h.insert(AZURE_ASYNC_OPERATION, "http://x/status");
        assert_eq!(
            Poll::of(201, &h),
            Poll::AsyncOperation("http://x/status".into())
        );
        let mut r = Headers::new();
        r.insert(RETRY_AFTER, "7");
        assert_eq!(retry_after(&r), Some(Duration::from_secs(7)));
    }
}
