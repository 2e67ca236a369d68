//! The EC2 client: EC2's Query protocol over one shared HTTP stack, signed with Signature
//! Version 4, with the call's region, credentials and request id.
//!
//! # Why not the AWS SDK's EC2 crate
//!
//! The driver makes five EC2 calls (`RunInstances`, `DescribeInstances`, `DescribeImages`,
//! `TerminateInstances`, `ModifyNetworkInterfaceAttribute`). `aws-sdk-ec2` generates every
//! one of EC2's several hundred: it was a third of the workspace's compile time (578 s of
//! a cold test build's 1966). This client builds the requests ([`crate::query`]), signs
//! them with the SDK's own signer (`aws-sigv4`), sends them on the SDK's HTTP client (hyper
//! 1 + rustls on ring, the stack kube uses), and reads the XML answers ([`crate::xml`],
//! [`crate::model`]). Credentials stay the SDK's (`aws-credential-types`, and STS through
//! `aws-config` for workload identity).
//!
//! # Endpoint
//!
//! [`AwsDriverConfig::endpoint_url`] overrides the EC2 endpoint (tests point it at moto).
//! Without it, the environment as the SDK reads it: `AWS_ENDPOINT_URL_EC2`, then
//! `AWS_ENDPOINT_URL` (both ignored with `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`), then
//! the regional endpoint of the providerSpec's region (`https://ec2.<region>.amazonaws.com`,
//! `.amazonaws.com.cn` in China; `AWS_USE_FIPS_ENDPOINT` and `AWS_USE_DUALSTACK_ENDPOINT`
//! select EC2's FIPS and dual-stack names).
//!
//! # Retries and timeouts
//!
//! A call is attempted up to [`AwsDriverConfig::max_attempts`] times (else
//! `AWS_MAX_ATTEMPTS`, else 3, as the SDK's standard mode): after throttling, EC2's server
//! errors (HTTP 5xx) and connection failures, with exponential backoff and full jitter
//! capped at 20 s. Every EC2 call the driver makes is safe to repeat (`RunInstances`
//! carries its client token). [`AwsDriverConfig::operation_timeout`] bounds a call with its
//! retries, [`AwsDriverConfig::connect_timeout`] each connection.
//!
//! # Request ids
//!
//! Every EC2 request of a driver call carries the call's [`RequestId`] in the HTTP header
//! [`REQUEST_ID_HEADER`] (`x-mcm-request-id`, visible in proxies and endpoint logs), and
//! every [`mcm_driver::DriverError`] names it next to the AWS request id. (The `ClientToken`
//! of `RunInstances` is the creation attempt's idempotency key, not the request id.)

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::{AppName, BehaviorVersion, Region, SdkConfig};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningError, SigningSettings};
use aws_sigv4::sign::v4::signing_params::BuildError;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorSettings, SharedHttpClient,
};
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;
use mcm_driver::RequestId;

use crate::query::Query;
use crate::xml::{self, Element, XmlError};

/// The HTTP header carrying the driver's request id on every EC2 request.
pub const REQUEST_ID_HEADER: &str = "x-mcm-request-id";
/// The application name in the user agent.
pub const APP_NAME: &str = "mcm-rs";
/// The page size of `DescribeInstances` by default (EC2's maximum).
pub const DEFAULT_PAGE_SIZE: i32 = 1000;
/// Attempts per EC2 call when neither the config nor `AWS_MAX_ATTEMPTS` says.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The longest pause between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(20);
/// The signing name of EC2.
const SERVICE: &str = "ec2";
/// The content type of Query requests.
const FORM: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// Driver settings that do not come from a MachineClass.
#[derive(Debug, Clone)]
pub struct AwsDriverConfig {
    /// The EC2 endpoint, e.g. `http://127.0.0.1:5000` for moto. `None`: the environment
    /// (`AWS_ENDPOINT_URL_EC2`, `AWS_ENDPOINT_URL`), else the regional endpoint.
    pub endpoint_url: Option<String>,
    /// `MaxResults` of each `DescribeInstances` page (5..=1000).
    pub page_size: i32,
    /// Timeout of one EC2 call including its retries.
    pub operation_timeout: Duration,
    /// Timeout of establishing a connection.
    pub connect_timeout: Duration,
    /// Attempts per EC2 call. `None`: `AWS_MAX_ATTEMPTS`, else 3.
    pub max_attempts: Option<u32>,
    /// How long `create_machine` waits for `DescribeInstances` to see an instance it launched
    /// (EC2's reads are eventually consistent); beyond it the create fails with `Unavailable`
    /// and its retry, with the same client token, finds the same instance.
    pub visibility_timeout: Duration,
}

impl Default for AwsDriverConfig {
    fn default() -> Self {
        AwsDriverConfig {
            endpoint_url: None,
            page_size: DEFAULT_PAGE_SIZE,
            operation_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_attempts: None,
            visibility_timeout: Duration::from_secs(30),
        }
    }
}

/// The shared HTTP client of the SDK's own calls (STS): hyper 1 + rustls with ring.
pub fn http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Loads the SDK configuration of the SDK's own calls (STS for workload identity) once:
/// HTTP client, timeouts, app name, endpoint and retries. Region and credentials come per
/// call from the MachineClass and its secret, so neither is looked up here (no IMDS or
/// profile access).
pub async fn load_sdk_config(config: &AwsDriverConfig) -> SdkConfig {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .operation_timeout(config.operation_timeout)
        .connect_timeout(config.connect_timeout)
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .timeout_config(timeouts)
        .region(Region::from_static("us-east-1"))
        .no_credentials();
    if let Ok(name) = AppName::new(APP_NAME) {
        loader = loader.app_name(name);
    }
    if let Some(n) = config.max_attempts {
        loader = loader
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(n.max(1)));
    }
    if let Some(url) = &config.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

/// What the environment says about EC2's endpoint and retries, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `AWS_ENDPOINT_URL_EC2`
    pub ec2_endpoint_url: Option<String>,
    /// `AWS_ENDPOINT_URL`
    pub endpoint_url: Option<String>,
    /// `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`
    pub ignore_configured_endpoint_urls: bool,
    /// `AWS_USE_FIPS_ENDPOINT=true`
    pub use_fips: bool,
    /// `AWS_USE_DUALSTACK_ENDPOINT=true`
    pub use_dual_stack: bool,
    /// `AWS_MAX_ATTEMPTS`
    pub max_attempts: Option<u32>,
}

impl Environment {
    /// The process environment.
    pub fn from_process() -> Environment {
        Environment::from_lookup(|name| std::env::var(name).ok())
    }

    /// The environment of `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Environment {
        let set = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let yes = |name: &str| set(name).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        Environment {
            ec2_endpoint_url: set("AWS_ENDPOINT_URL_EC2"),
            endpoint_url: set("AWS_ENDPOINT_URL"),
            ignore_configured_endpoint_urls: yes("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"),
            use_fips: yes("AWS_USE_FIPS_ENDPOINT"),
            use_dual_stack: yes("AWS_USE_DUALSTACK_ENDPOINT"),
            max_attempts: set("AWS_MAX_ATTEMPTS").and_then(|v| v.parse().ok()),
        }
    }
}

/// The EC2 endpoint of `region`: the configured URL, the environment's, else EC2's regional
/// name (see the module documentation). Always ends with `/`. Pure.
pub fn endpoint(configured: Option<&str>, env: &Environment, region: &str) -> String {
    let from_env = (!env.ignore_configured_endpoint_urls)
        .then(|| {
            env.ec2_endpoint_url
                .as_deref()
                .or(env.endpoint_url.as_deref())
        })
        .flatten();
    let url = match configured.or(from_env) {
        Some(url) => url.to_string(),
        None => {
            let china = region.starts_with("cn-");
            let host = if env.use_fips { "ec2-fips" } else { "ec2" };
            let suffix = match (env.use_dual_stack, china) {
                (false, false) => "amazonaws.com",
                (false, true) => "amazonaws.com.cn",
                (true, false) => "api.aws",
                (true, true) => "api.amazonwebservices.com.cn",
            };
            format!("https://{host}.{region}.{suffix}")
        }
    };
    if url.ends_with('/') {
        url
    } else {
        format!("{url}/")
    }
}

/// Why an EC2 call failed.
#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    /// EC2 answered with an error.
    #[error("{code}: {message}")]
    Service {
        /// EC2's error code (`InvalidInstanceID.NotFound`, ...).
        code: String,
        /// EC2's message.
        message: String,
        /// The AWS request id of the answer.
        aws_request_id: Option<String>,
        /// The HTTP status.
        status: u16,
    },
    /// The call with its retries took longer than the operation timeout.
    #[error("the request timed out after {0:?}")]
    Timeout(Duration),
    /// The request could not be sent, or its answer not received.
    #[error("the request could not be sent")]
    Transport(#[source] ConnectorError),
    /// The answer is not one of EC2's.
    #[error("HTTP {status}: the response is not an EC2 answer")]
    Response {
        /// The HTTP status.
        status: u16,
        /// Why it could not be read.
        #[source]
        source: ResponseError,
    },
    /// The call's credentials could not be had.
    #[error("no credentials")]
    Credentials(#[source] CredentialsError),
    /// The signing parameters are incomplete.
    #[error("the request could not be signed")]
    SigningParams(#[source] BuildError),
    /// The request could not be signed.
    #[error("the request could not be signed")]
    Signing(#[source] SigningError),
    /// The HTTP client does not take the request.
    #[error("the request could not be built")]
    Request(#[source] aws_smithy_runtime_api::http::HttpError),
    /// The endpoint is not a URL an HTTP request can go to.
    #[error("the endpoint {endpoint} cannot be used")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: http::Error,
    },
}

/// Why an answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    /// Its body could not be received.
    #[error("reading the body")]
    Body(#[source] aws_smithy_types::byte_stream::error::Error),
    /// Its body is not XML.
    #[error(transparent)]
    Xml(XmlError),
    /// An error answer without `Errors/Error/Code`.
    #[error("an error answer without an error code: {0}")]
    NoCode(String),
}

impl Ec2Error {
    /// EC2's error code, when EC2 answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Ec2Error::Service { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The AWS request id, when EC2 answered.
    pub fn aws_request_id(&self) -> Option<&str> {
        match self {
            Ec2Error::Service { aws_request_id, .. } => aws_request_id.as_deref(),
            _ => None,
        }
    }
}

/// Whether another attempt may succeed where `e` failed: throttling, EC2's server errors and
/// connections that failed; never a refusal of the request itself. Pure.
pub fn retryable(e: &Ec2Error) -> bool {
    match e {
        Ec2Error::Service { code, status, .. } => {
            *status >= 500
                || crate::errors::THROTTLING_CODES.contains(&code.as_str())
                || matches!(
                    code.as_str(),
                    "RequestTimeout"
                        | "RequestTimeoutException"
                        | "InternalError"
                        | "InternalFailure"
                )
        }
        Ec2Error::Transport(c) => !c.is_user(),
        Ec2Error::Response { status, .. } => *status >= 500,
        _ => false,
    }
}

/// The pause before attempt `attempt + 1` (`attempt` >= 1): `jitter` (0..1) times
/// 2^(attempt-1) seconds, at most [`MAX_BACKOFF`]. Pure.
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let base = 2f64.powi(attempt.saturating_sub(1).min(16) as i32);
    Duration::from_secs_f64(jitter.clamp(0.0, 1.0) * base).min(MAX_BACKOFF)
}

/// The response header carrying the AWS request id (EC2 repeats it in its XML bodies).
pub const AWS_REQUEST_ID_HEADER: &str = "x-amzn-requestid";

/// Reads an answer: the root element of a 2xx answer, else EC2's error, with the request id
/// of the [`AWS_REQUEST_ID_HEADER`] header, else of the body. Pure.
pub fn read_answer(
    status: u16,
    header_request_id: Option<&str>,
    body: &[u8],
) -> Result<Element, Ec2Error> {
    let text = String::from_utf8_lossy(body);
    let bad = |source| Ec2Error::Response { status, source };
    let doc = xml::parse(&text).map_err(|e| bad(ResponseError::Xml(e)));
    if (200..300).contains(&status) {
        return doc;
    }
    let doc = doc?;
    let error = doc
        .at(&["Errors", "Error"])
        .or_else(|| doc.child("Error"))
        .filter(|e| e.text_of("Code").is_some_and(|c| !c.trim().is_empty()))
        .ok_or_else(|| bad(ResponseError::NoCode(text.chars().take(200).collect())))?;
    Err(Ec2Error::Service {
        code: error.text_of("Code").unwrap_or_default().trim().to_string(),
        message: error
            .text_of("Message")
            .unwrap_or("no message")
            .trim()
            .to_string(),
        aws_request_id: header_request_id
            .or_else(|| doc.text_of("RequestID"))
            .or_else(|| doc.text_of("RequestId"))
            .map(|r| r.trim().to_string())
            .filter(|r| !r.is_empty()),
        status,
    })
}

/// What every call of a driver shares: the HTTP connection pool and the environment.
#[derive(Debug, Clone)]
pub struct Ec2Transport {
    connector: Arc<aws_smithy_http_client::Connector>,
    env: Arc<Environment>,
    config: AwsDriverConfig,
}

impl Ec2Transport {
    /// The transport of `config`, with the process environment.
    pub fn new(config: &AwsDriverConfig) -> Ec2Transport {
        Ec2Transport::with_environment(config, Environment::from_process())
    }

    /// The transport of `config` with `env` for the environment.
    pub fn with_environment(config: &AwsDriverConfig, env: Environment) -> Ec2Transport {
        let settings = HttpConnectorSettings::builder()
            .connect_timeout(config.connect_timeout)
            .build();
        let connector = aws_smithy_http_client::Connector::builder()
            .connector_settings(settings)
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build();
        Ec2Transport {
            connector: Arc::new(connector),
            env: Arc::new(env),
            config: config.clone(),
        }
    }

    /// A client for one driver call: `region`, its credentials, and the call's request id.
    pub fn client(
        &self,
        region: &str,
        credentials: SharedCredentialsProvider,
        request_id: &RequestId,
    ) -> Ec2Client {
        Ec2Client {
            transport: self.clone(),
            endpoint: endpoint(self.config.endpoint_url.as_deref(), &self.env, region),
            region: region.to_string(),
            credentials,
            request_id: request_id.to_string(),
        }
    }
}

/// An EC2 client for one driver call.
#[derive(Debug, Clone)]
pub struct Ec2Client {
    transport: Ec2Transport,
    endpoint: String,
    region: String,
    credentials: SharedCredentialsProvider,
    request_id: String,
}

impl Ec2Client {
    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends `query` and returns the answer's root element, retrying as the module
    /// documentation says, within the operation timeout.
    pub async fn call(&self, query: &Query) -> Result<Element, Ec2Error> {
        let timeout = self.transport.config.operation_timeout;
        tokio::time::timeout(timeout, self.attempts(query))
            .await
            .unwrap_or(Err(Ec2Error::Timeout(timeout)))
    }

    async fn attempts(&self, query: &Query) -> Result<Element, Ec2Error> {
        let max = self
            .transport
            .config
            .max_attempts
            .or(self.transport.env.max_attempts)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS)
            .max(1);
        let mut attempt = 1;
        loop {
            match self.attempt(query).await {
                Err(e) if attempt < max && retryable(&e) => {
                    let pause = backoff(attempt, rand::random::<f64>());
                    tracing::debug!(action = query.action(), attempt, error = %e, ?pause, request_id = %self.request_id, "EC2 call failed; retrying");
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    async fn attempt(&self, query: &Query) -> Result<Element, Ec2Error> {
        let request = self.signed_request(query).await?;
        let response = self
            .transport
            .connector
            .call(request)
            .await
            .map_err(Ec2Error::Transport)?;
        let status = response.status().as_u16();
        let header_request_id = response
            .headers()
            .get(AWS_REQUEST_ID_HEADER)
            .map(str::to_string);
        let body = ByteStream::new(response.into_body())
            .collect()
            .await
            .map_err(|e| Ec2Error::Response {
                status,
                source: ResponseError::Body(e),
            })?
            .into_bytes();
        read_answer(status, header_request_id.as_deref(), &body)
    }

    async fn signed_request(&self, query: &Query) -> Result<HttpRequest, Ec2Error> {
        let body = query.body();
        let endpoint_error = |source: http::Error| Ec2Error::Endpoint {
            endpoint: self.endpoint.clone(),
            source,
        };
        let uri: http::Uri = self
            .endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| endpoint_error(e.into()))?;
        let host = uri.authority().map(|a| a.to_string()).unwrap_or_default();
        let user_agent = format!("{APP_NAME}/{}", env!("CARGO_PKG_VERSION"));
        let headers = [
            ("content-type", FORM),
            ("host", host.as_str()),
            (REQUEST_ID_HEADER, self.request_id.as_str()),
        ];
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(Ec2Error::Credentials)?;
        let identity: Identity = credentials.into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(Ec2Error::SigningParams)?
            .into();
        let signable = SignableRequest::new(
            "POST",
            self.endpoint.as_str(),
            headers.iter().copied(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(Ec2Error::Signing)?;
        let (instructions, _signature) = aws_sigv4::http_request::sign(signable, &params)
            .map_err(Ec2Error::Signing)?
            .into_parts();
        let mut builder = http::Request::builder().method("POST").uri(uri);
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        let mut request = builder
            .header("user-agent", user_agent)
            .body(SdkBody::from(body))
            .map_err(endpoint_error)?;
        instructions.apply_to_request_http1x(&mut request);
        HttpRequest::try_from(request).map_err(Ec2Error::Request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Environment {
        Environment::from_lookup(|name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn endpoints_follow_config_environment_and_region() {
        let none = env(&[]);
        assert_eq!(
            endpoint(None, &none, "eu-west-1"),
            "https://ec2.eu-west-1.amazonaws.com/"
        );
        assert_eq!(
            endpoint(None, &none, "cn-north-1"),
            "https://ec2.cn-north-1.amazonaws.com.cn/"
        );
        let fips = env(&[("AWS_USE_FIPS_ENDPOINT", "true")]);
        assert_eq!(
            endpoint(None, &fips, "us-east-1"),
            "https://ec2-fips.us-east-1.amazonaws.com/"
        );
        let dual = env(&[("AWS_USE_DUALSTACK_ENDPOINT", "TRUE")]);
        assert_eq!(
            endpoint(None, &dual, "us-east-1"),
            "https://ec2.us-east-1.api.aws/"
        );
        let both = env(&[
            ("AWS_ENDPOINT_URL", "http://global:1"),
            ("AWS_ENDPOINT_URL_EC2", "http://ec2:2/"),
        ]);
        assert_eq!(endpoint(None, &both, "eu-west-1"), "http://ec2:2/");
        let global = env(&[("AWS_ENDPOINT_URL", "http://global:1")]);
        assert_eq!(endpoint(None, &global, "eu-west-1"), "http://global:1/");
        assert_eq!(
            endpoint(Some("http://127.0.0.1:5000"), &both, "eu-west-1"),
            "http://127.0.0.1:5000/",
            "the config wins"
        );
        let ignored = env(&[
            ("AWS_ENDPOINT_URL", "http://global:1"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
        ]);
        assert_eq!(
            endpoint(None, &ignored, "eu-west-1"),
            "https://ec2.eu-west-1.amazonaws.com/"
        );
        assert_eq!(env(&[("AWS_MAX_ATTEMPTS", "7")]).max_attempts, Some(7));
    }

    #[test]
    fn answers_are_documents_or_ec2_errors() {
        let ok = read_answer(
            200,
            None,
            b"<RunInstancesResponse><requestId>r</requestId></RunInstancesResponse>",
        )
        .unwrap();
        assert_eq!(ok.name, "RunInstancesResponse");
        let e = read_answer(
            400,
            None,
            b"<?xml version=\"1.0\"?><Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-1' does not exist</Message></Error></Errors><RequestID>aws-1</RequestID></Response>",
        )
        .unwrap_err();
        assert_eq!(e.code(), Some("InvalidInstanceID.NotFound"));
        assert_eq!(e.aws_request_id(), Some("aws-1"));
        assert_eq!(
            e.to_string(),
            "InvalidInstanceID.NotFound: The instance ID 'i-1' does not exist"
        );
        assert!(!retryable(&e));
        let throttled = read_answer(
            503,
            Some("header-2"),
            b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>slow down</Message></Error></Errors><RequestID>aws-2</RequestID></Response>",
        )
        .unwrap_err();
        assert!(retryable(&throttled));
        assert_eq!(
            throttled.aws_request_id(),
            Some("header-2"),
            "the header wins"
        );
        // A proxy's HTML page is no EC2 answer; a 502 of it may pass, a 403 will not.
        let html = read_answer(502, None, b"<html><body>bad gateway</body></html>").unwrap_err();
        assert!(
            matches!(html, Ec2Error::Response { status: 502, .. }),
            "{html:?}"
        );
        assert!(retryable(&html));
        let text = read_answer(403, None, b"forbidden").unwrap_err();
        assert!(
            matches!(text, Ec2Error::Response { status: 403, .. }),
            "{text:?}"
        );
        assert!(!retryable(&text));
        assert!(matches!(
            read_answer(200, None, b"not xml").unwrap_err(),
            Ec2Error::Response { status: 200, .. }
        ));
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        assert_eq!(backoff(1, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(3, 0.5), Duration::from_secs(2));
        assert_eq!(backoff(10, 1.0), MAX_BACKOFF);
        assert_eq!(backoff(2, 0.0), Duration::ZERO);
    }
}
