//! ARM clients: credentials shared per service principal, a transport per driver call that
//! stamps its request id on every request, and the waiting for long-running operations.
//!
//! # HTTP and TLS
//!
//! The management crates send their requests through azure_core's reqwest client on rustls
//! with ring (hyper 1, the stack kube uses). One reqwest client is shared by every call.
//!
//! # Request ids
//!
//! Each driver call gets a [`CallTransport`] that adds `x-ms-client-request-id: <request id>` to
//! every request (operations, operation polls, list pages) and remembers what ARM said in the
//! last error response (`x-ms-request-id`, `Retry-After`), which azure_core's errors do not
//! expose.
//!
//! # Long-running operations
//!
//! The SDK's own waiting is not used: [`Call::wait`] polls `Azure-AsyncOperation` (status
//! `InProgress` → `Succeeded` / `Failed` / `Canceled`) or `Location` (202 until done), pausing as
//! `Retry-After` says within the configured bounds, at most [`AzureDriverConfig::operation_timeout`].
//!
//! # Endpoints
//!
//! [`AzureDriverConfig::arm_endpoint`] (`MCM_AZURE_ARM_ENDPOINT` in the binaries) overrides
//! `https://management.azure.com`; [`AzureDriverConfig::authority_host`]
//! (`AZURE_AUTHORITY_HOST`) overrides `https://login.microsoftonline.com`.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_core::auth::TokenCredential;
use azure_core::headers::{CLIENT_REQUEST_ID, HeaderName, Headers};
use azure_core::{HttpClient, Method, Request, Response, RetryOptions, TransportOptions, Url};
use azure_identity::ClientSecretCredential;
use mcm_driver::RequestId;

use crate::errors::{ArmFailure, AzureError, error_of};
use crate::spec::Credentials;

/// Public Azure's ARM endpoint.
pub const PUBLIC_ARM: &str = "https://management.azure.com";
/// Public Azure's authority host.
pub const PUBLIC_AUTHORITY: &str = "https://login.microsoftonline.com";
/// The environment variable the binaries read [`AzureDriverConfig::arm_endpoint`] from.
pub const ARM_ENDPOINT_ENV: &str = "MCM_AZURE_ARM_ENDPOINT";
/// The environment variable of [`AzureDriverConfig::authority_host`] (azure_identity's).
pub const AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";
/// At most this many credentials (one per service principal) are kept.
const MAX_CREDENTIALS: usize = 64;

/// The code of a failure to get a token (not an ARM code).
pub const CREDENTIAL_FAILED: &str = "CredentialUnavailable";

const AZURE_ASYNC_OPERATION: HeaderName = HeaderName::from_static("azure-asyncoperation");
const LOCATION: HeaderName = HeaderName::from_static("location");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const MS_REQUEST_ID: HeaderName = HeaderName::from_static("x-ms-request-id");

/// Driver settings that do not come from a MachineClass.
#[derive(Debug, Clone)]
pub struct AzureDriverConfig {
    /// The ARM endpoint. `None`: public Azure.
    pub arm_endpoint: Option<String>,
    /// The Entra ID authority host. `None`: public Azure.
    pub authority_host: Option<String>,
    /// How long a create or delete waits for one long-running operation.
    pub operation_timeout: Duration,
    /// The shortest pause between polls of an operation.
    pub poll_interval: Duration,
    /// The longest pause between polls (also caps ARM's `Retry-After`).
    pub max_poll_interval: Duration,
}

impl Default for AzureDriverConfig {
    fn default() -> Self {
        AzureDriverConfig {
            arm_endpoint: None,
            authority_host: None,
            operation_timeout: Duration::from_secs(600),
            poll_interval: Duration::from_secs(1),
            max_poll_interval: Duration::from_secs(15),
        }
    }
}

impl AzureDriverConfig {
    /// The defaults, with the endpoints from [`ARM_ENDPOINT_ENV`] and [`AUTHORITY_HOST_ENV`].
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
        AzureDriverConfig {
            arm_endpoint: var(ARM_ENDPOINT_ENV),
            authority_host: var(AUTHORITY_HOST_ENV),
            ..AzureDriverConfig::default()
        }
    }

    fn arm(&self) -> Result<Url, AzureError> {
        parse_url(self.arm_endpoint.as_deref().unwrap_or(PUBLIC_ARM))
    }

    fn authority(&self) -> Result<Url, AzureError> {
        parse_url(self.authority_host.as_deref().unwrap_or(PUBLIC_AUTHORITY))
    }
}

fn parse_url(s: &str) -> Result<Url, AzureError> {
    Url::parse(s).map_err(|e| {
        AzureError::Client(Box::new(azure_core::Error::full(
            azure_core::error::ErrorKind::DataConversion,
            e,
            format!("invalid URL {s:?}"),
        )))
    })
}

/// What ARM said in a response.
#[derive(Debug, Clone, Default)]
pub struct ResponseMeta {
    /// The status.
    pub status: u16,
    /// `x-ms-request-id`.
    pub request_id: Option<String>,
    /// `Retry-After`.
    pub retry_after: Option<Duration>,
}

fn retry_after(headers: &Headers) -> Option<Duration> {
    headers
        .get_optional_str(&RETRY_AFTER)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The transport of one driver call: the shared client, plus the request id on every request
/// and the last error response remembered.
#[derive(Debug)]
pub struct CallTransport {
    inner: Arc<dyn HttpClient>,
    request_id: String,
    last_error: Mutex<Option<ResponseMeta>>,
}

impl CallTransport {
    /// What the last error response said.
    pub fn last_error(&self) -> Option<ResponseMeta> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[async_trait::async_trait]
impl HttpClient for CallTransport {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        let mut request = request.clone();
        request.insert_header(CLIENT_REQUEST_ID, self.request_id.clone());
        let response = self.inner.execute_request(&request).await?;
        let status = u16::from(response.status());
        if status >= 400 {
            let meta = ResponseMeta {
                status,
                request_id: response.headers().get_optional_string(&MS_REQUEST_ID),
                retry_after: retry_after(response.headers()),
            };
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(meta);
        }
        Ok(response)
    }
}

/// Credentials by service principal, and the shared HTTP client.
#[derive(Debug)]
pub struct Clients {
    http: Arc<dyn HttpClient>,
    credentials: Mutex<HashMap<u64, Arc<ClientSecretCredential>>>,
}

impl Default for Clients {
    fn default() -> Self {
        Clients {
            http: azure_core::new_http_client(),
            credentials: Mutex::default(),
        }
    }
}

impl Clients {
    fn credential(
        &self,
        config: &AzureDriverConfig,
        c: &Credentials,
    ) -> Result<Arc<ClientSecretCredential>, AzureError> {
        let mut h = DefaultHasher::new();
        (&c.tenant_id, &c.client_id, &c.client_secret).hash(&mut h);
        let key = h.finish();
        let mut map = self.credentials.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cred) = map.get(&key) {
            return Ok(cred.clone());
        }
        if map.len() >= MAX_CREDENTIALS {
            map.clear();
        }
        let cred = Arc::new(ClientSecretCredential::new(
            self.http.clone(),
            config.authority()?,
            c.tenant_id.clone(),
            c.client_id.clone(),
            c.client_secret.clone(),
        ));
        map.insert(key, cred.clone());
        Ok(cred)
    }

    /// The clients of one driver call.
    pub fn call(
        &self,
        config: &AzureDriverConfig,
        c: &Credentials,
        request_id: &RequestId,
    ) -> Result<Call, AzureError> {
        let credential = self.credential(config, c)?;
        let transport = Arc::new(CallTransport {
            inner: self.http.clone(),
            request_id: request_id.to_string(),
            last_error: Mutex::default(),
        });
        let arm = config.arm()?;
        let scope = format!("{}/.default", arm.as_str().trim_end_matches('/'));
        let compute = azure_mgmt_compute::Client::builder(credential.clone())
            .endpoint(arm.clone())
            .scopes(&[&scope])
            .retry(RetryOptions::none())
            .transport(TransportOptions::new(transport.clone()))
            .build()
            .map_err(|e| AzureError::Client(Box::new(e)))?;
        let network = azure_mgmt_network::Client::builder(credential.clone())
            .endpoint(arm)
            .scopes(&[&scope])
            .retry(RetryOptions::none())
            .transport(TransportOptions::new(transport.clone()))
            .build()
            .map_err(|e| AzureError::Client(Box::new(e)))?;
        Ok(Call {
            compute,
            network,
            transport,
            credential,
            scope,
            subscription: c.subscription_id.clone(),
            request_id: request_id.clone(),
        })
    }
}

/// What one driver call works with.
#[derive(Clone)]
pub struct Call {
    /// The compute client.
    pub compute: azure_mgmt_compute::Client,
    /// The network client.
    pub network: azure_mgmt_network::Client,
    /// The call's transport.
    pub transport: Arc<CallTransport>,
    credential: Arc<ClientSecretCredential>,
    scope: String,
    /// The subscription.
    pub subscription: String,
    /// The driver's request id.
    pub request_id: RequestId,
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
    /// The failure an SDK error describes, with the `x-ms-request-id` and `Retry-After` of the
    /// response it came from.
    pub fn api_error(&self, call: impl Into<String>, e: azure_core::Error) -> AzureError {
        let mut failure = ArmFailure::default();
        if let Some(h) = e.as_http_error() {
            failure.status = Some(u16::from(h.status()));
            failure.code = h.error_code().map(str::to_string);
            failure.message = h.error_message().unwrap_or_default().to_string();
            if let Some(meta) = self
                .transport
                .last_error()
                .filter(|m| Some(m.status) == failure.status)
            {
                failure.request_id = meta.request_id;
                failure.retry_after = meta.retry_after;
            }
        } else if matches!(e.kind(), azure_core::error::ErrorKind::Credential) {
            // The token could not be obtained: Entra ID refused the service principal.
            failure.code = Some(CREDENTIAL_FAILED.to_string());
            failure.message = e.to_string();
        } else {
            failure.message = e.to_string();
        }
        AzureError::Api {
            call: call.into(),
            failure: Box::new(failure),
            source: Box::new(e),
        }
    }

    async fn get_json(
        &self,
        call: &str,
        url: &str,
    ) -> Result<(u16, Headers, serde_json::Value), AzureError> {
        let url = parse_url(url)?;
        let token = self
            .credential
            .get_token(&[&self.scope])
            .await
            .map_err(|e| self.api_error(format!("{call} (token)"), e))?;
        let mut request = Request::new(url, Method::Get);
        request.insert_header(
            azure_core::headers::AUTHORIZATION,
            format!("Bearer {}", token.token.secret()),
        );
        let response = self
            .transport
            .execute_request(&request)
            .await
            .map_err(|e| self.api_error(format!("{call} (poll)"), e))?;
        let (status, headers, body) = response.deconstruct();
        let bytes = body
            .collect()
            .await
            .map_err(|e| self.api_error(format!("{call} (poll)"), e))?;
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        Ok((u16::from(status), headers, json))
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
            let (status, headers, body) = match &poll {
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
