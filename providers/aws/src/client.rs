//! EC2 clients: one shared HTTP stack, one client per driver call with the call's region,
//! credentials and request id.
//!
//! # HTTP and TLS
//!
//! The HTTP client is `aws-smithy-http-client` on hyper 1 with rustls and the `ring` crypto
//! provider: the stack kube already uses, so the binary has one HTTP/TLS implementation (no
//! aws-lc-rs, no hyper 0.14). It is built once and shared by every per-call client, so
//! connections are pooled across calls.
//!
//! # Endpoint
//!
//! [`AwsDriverConfig::endpoint_url`] overrides the EC2 endpoint (tests point it at moto).
//! Without it, aws-config's environment handling applies: `AWS_ENDPOINT_URL_EC2` or
//! `AWS_ENDPOINT_URL` (and `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`), then the regional
//! endpoint of the providerSpec's region. The retry mode and attempts also follow
//! aws-config (`AWS_MAX_ATTEMPTS`, `AWS_RETRY_MODE`; default: standard, 3 attempts).
//!
//! # Request ids
//!
//! Every EC2 request of a driver call carries the call's [`RequestId`]:
//! - in the HTTP header [`REQUEST_ID_HEADER`] (`x-mcm-request-id`), added by an interceptor
//!   of the per-call client (visible in proxies and endpoint logs);
//! - (the `ClientToken` of `RunInstances` is the creation attempt's idempotency key, not the
//!   request id);
//!
//! and every [`mcm_driver::DriverError`] names it next to the AWS request id.

use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_ec2::config::{
    AppName, ConfigBag, Intercept, Region, RuntimeComponents, SharedCredentialsProvider,
    SharedHttpClient,
};
use aws_sdk_ec2::error::BoxError;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use mcm_driver::RequestId;

/// The HTTP header carrying the driver's request id on every EC2 request.
pub const REQUEST_ID_HEADER: &str = "x-mcm-request-id";
/// The application name in the SDK's user agent.
pub const APP_NAME: &str = "mcm-rs";
/// The page size of `DescribeInstances` by default (EC2's maximum).
pub const DEFAULT_PAGE_SIZE: i32 = 1000;

/// Driver settings that do not come from a MachineClass.
#[derive(Debug, Clone)]
pub struct AwsDriverConfig {
    /// The EC2 endpoint, e.g. `http://127.0.0.1:5000` for moto. `None`: aws-config's
    /// environment (`AWS_ENDPOINT_URL_EC2`, `AWS_ENDPOINT_URL`), else the regional endpoint.
    pub endpoint_url: Option<String>,
    /// `MaxResults` of each `DescribeInstances` page (5..=1000).
    pub page_size: i32,
    /// Timeout of one EC2 call including the SDK's retries.
    pub operation_timeout: Duration,
    /// Timeout of establishing a connection.
    pub connect_timeout: Duration,
    /// Attempts per EC2 call (the SDK's standard retry mode). `None`: aws-config's default
    /// (`AWS_MAX_ATTEMPTS`, else 3).
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

/// The shared HTTP client: hyper 1 + rustls with ring.
pub fn http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Loads the base SDK configuration once: HTTP client, timeouts, app name, aws-config's
/// environment (endpoint URL, retries). Region and credentials come per call from the
/// MachineClass and its secret, so neither is looked up here (no IMDS or profile access).
pub async fn load_sdk_config(config: &AwsDriverConfig) -> SdkConfig {
    let timeouts = aws_sdk_ec2::config::timeout::TimeoutConfig::builder()
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
        loader = loader.retry_config(
            aws_sdk_ec2::config::retry::RetryConfig::standard().with_max_attempts(n.max(1)),
        );
    }
    if let Some(url) = &config.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

/// An EC2 client for one driver call: `region`, the secret's credentials, and an interceptor
/// adding the request id header to every request.
pub fn ec2_client(
    base: &SdkConfig,
    region: &str,
    credentials: SharedCredentialsProvider,
    request_id: &RequestId,
) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::config::Builder::from(base)
        .region(Region::new(region.to_string()))
        .credentials_provider(credentials)
        .interceptor(RequestIdHeader(request_id.to_string()))
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

/// Adds [`REQUEST_ID_HEADER`] to every request (including the SDK's retries).
#[derive(Debug, Clone)]
pub struct RequestIdHeader(pub String);

impl Intercept for RequestIdHeader {
    fn name(&self) -> &'static str {
        "McmRequestIdHeader"
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        context
            .request_mut()
            .headers_mut()
            .insert(REQUEST_ID_HEADER, self.0.clone());
        Ok(())
    }
}
