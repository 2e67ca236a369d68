//! EC2 clients: `aws-sdk-ec2` on one shared HTTP stack, one client per region and credentials,
//! kept while it is used.
//!
//! # Why the SDK
//!
//! The SDK is where EC2's quirks are fixed once for everybody: its retry classifier (every
//! throttling and transient code of the AWS services, a retry quota), its clock-skew
//! correction (the service's `Date` is read from every answer and the next signature uses it),
//! its endpoint rules (every partition: standard, China, GovCloud, ISO, the EU sovereign
//! cloud; FIPS and dual-stack names) and its paginators (which stop on a repeated token). The
//! driver uses them as they are.
//!
//! # HTTP and TLS
//!
//! The HTTP client is `aws-smithy-http-client` on hyper 1 with rustls and the `ring` crypto
//! provider: the stack kube already uses, so the binary has one HTTP/TLS implementation (no
//! aws-lc-rs, no hyper 0.14). It is built once and shared by every client, so connections are
//! pooled across calls.
//!
//! # One client per region and credentials
//!
//! A client holds what the SDK learns across calls: the clock skew and the cached credentials
//! (a web-identity role's temporary credentials are reused until shortly before they expire).
//! [`Ec2Clients`] keeps one per region and secret credentials, at most
//! [`Ec2Clients::CAPACITY`], and forgets one that has not been used for [`Ec2Clients::IDLE`]:
//! a rotated secret or a deleted class does not leave a client behind for ever.
//!
//! # Endpoint
//!
//! [`AwsDriverConfig::endpoint_url`] overrides the EC2 endpoint (tests point it at moto).
//! Without it, aws-config's environment handling applies: `AWS_ENDPOINT_URL_EC2` or
//! `AWS_ENDPOINT_URL` (and `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`), then the SDK's endpoint
//! rules for the providerSpec's region. FIPS and dual-stack endpoints are chosen by
//! [`AwsDriverConfig::use_fips`] and [`AwsDriverConfig::use_dual_stack`], else by
//! `AWS_USE_FIPS_ENDPOINT` and `AWS_USE_DUALSTACK_ENDPOINT` (how `machine-controller-aws`,
//! which takes Gardener MCM's flags only, is told).
//!
//! # Retries and timeouts
//!
//! The SDK's standard retry mode: [`AwsDriverConfig::max_attempts`] attempts (else
//! `AWS_MAX_ATTEMPTS`, else 3) after throttling, transient errors, server errors and failed
//! connections, with exponential backoff and jitter, within a retry quota.
//! [`AwsDriverConfig::operation_timeout`] bounds a call with its retries,
//! [`AwsDriverConfig::connect_timeout`] each connection.
//!
//! # Request ids
//!
//! Every EC2 request made inside [`with_request_id`] carries that [`RequestId`] in the HTTP
//! header [`REQUEST_ID_HEADER`] (`x-mcm-request-id`, visible in proxies and endpoint logs): the
//! client's interceptor reads it from the task, so the pages of a paginator and the SDK's
//! retries carry it too. (The `ClientToken` of `RunInstances` is the creation attempt's
//! idempotency key, not the request id.) Every [`mcm_driver::DriverError`] names it next to
//! the AWS request id.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_ec2::config::{
    AppName, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
    SharedCredentialsProvider, SharedHttpClient, SharedInterceptor,
};
use aws_sdk_ec2::error::BoxError;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use mcm_driver::RequestId;

use crate::credentials::WebIdentity;
use crate::spec::Auth;

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
    /// environment (`AWS_ENDPOINT_URL_EC2`, `AWS_ENDPOINT_URL`), else the SDK's endpoint for
    /// the class's region.
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
    /// EC2's FIPS endpoints. `None`: `AWS_USE_FIPS_ENDPOINT`.
    pub use_fips: Option<bool>,
    /// EC2's dual-stack (IPv4 and IPv6) endpoints. `None`: `AWS_USE_DUALSTACK_ENDPOINT`.
    pub use_dual_stack: Option<bool>,
    /// Interceptors added to every EC2 client (after the driver's own), e.g. to observe
    /// what goes on the wire.
    pub interceptors: Vec<SharedInterceptor>,
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
            use_fips: None,
            use_dual_stack: None,
            interceptors: Vec::new(),
        }
    }
}

/// The shared HTTP client: hyper 1 + rustls with ring. The SDK gives each connection the
/// configured connect timeout.
pub fn http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Loads the base SDK configuration once: HTTP client, timeouts, app name, aws-config's
/// environment (endpoint URL, FIPS, dual-stack, retries). Region and credentials come per
/// client from the MachineClass and its secret, so neither is looked up here: no IMDS,
/// no profile or environment credentials.
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
    if let Some(fips) = config.use_fips {
        loader = loader.use_fips(fips);
    }
    if let Some(dual) = config.use_dual_stack {
        loader = loader.use_dual_stack(dual);
    }
    loader.load().await
}

tokio::task_local! {
    /// The request id of the driver call the current task runs.
    static REQUEST_ID: RequestId;
}

/// Runs `fut` (a driver call's EC2 requests) with `request_id` on every request it makes.
pub async fn with_request_id<F: Future>(request_id: RequestId, fut: F) -> F::Output {
    REQUEST_ID.scope(request_id, fut).await
}

/// Adds [`REQUEST_ID_HEADER`] with the request id of [`with_request_id`] to every request
/// (including the SDK's retries and a paginator's pages).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdHeader;

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
        if let Ok(id) = REQUEST_ID.try_with(|id| id.to_string()) {
            context
                .request_mut()
                .headers_mut()
                .insert(REQUEST_ID_HEADER, id);
        }
        Ok(())
    }
}

/// What a client is kept by: the region and the secret's credentials.
type ClientKey = (String, Auth);

/// A kept client and when it was last handed out.
#[derive(Debug)]
struct Kept {
    client: aws_sdk_ec2::Client,
    used: Instant,
}

/// The EC2 clients of a driver, one per region and credentials (see the module
/// documentation).
#[derive(Debug)]
pub struct Ec2Clients {
    sdk: SdkConfig,
    interceptors: Vec<SharedInterceptor>,
    kept: Mutex<HashMap<ClientKey, Kept>>,
}

impl Ec2Clients {
    /// At most this many clients are kept; the least recently used goes first.
    pub const CAPACITY: usize = 64;
    /// A client not used for this long is forgotten.
    pub const IDLE: Duration = Duration::from_secs(3600);

    /// The clients of `sdk` (see [`load_sdk_config`]) with `config`'s interceptors.
    pub fn new(sdk: SdkConfig, config: &AwsDriverConfig) -> Ec2Clients {
        Ec2Clients {
            sdk,
            interceptors: config.interceptors.clone(),
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// The SDK configuration the clients are built from.
    pub fn sdk_config(&self) -> &SdkConfig {
        &self.sdk
    }

    /// The client of `region` with `auth`'s credentials: the kept one, else a new one.
    pub fn client(&self, region: &str, auth: &Auth) -> aws_sdk_ec2::Client {
        let now = Instant::now();
        let key = (region.to_string(), auth.clone());
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.get_mut(&key) {
            k.used = now;
            return k.client.clone();
        }
        kept.retain(|_, k| now.duration_since(k.used) < Self::IDLE);
        if kept.len() >= Self::CAPACITY
            && let Some(oldest) = kept
                .iter()
                .min_by_key(|(_, k)| k.used)
                .map(|(key, _)| key.clone())
        {
            kept.remove(&oldest);
        }
        let client = self.build(region, auth);
        kept.insert(
            key,
            Kept {
                client: client.clone(),
                used: now,
            },
        );
        client
    }

    /// How many clients are kept.
    pub fn kept(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn build(&self, region: &str, auth: &Auth) -> aws_sdk_ec2::Client {
        let credentials = match auth {
            Auth::AccessKey(key) => SharedCredentialsProvider::new(Credentials::new(
                key.id.clone(),
                key.secret.clone(),
                None,
                None,
                "mcm-machine-class-secret",
            )),
            Auth::WebIdentity {
                role_arn,
                token_file,
            } => SharedCredentialsProvider::new(WebIdentity::new(
                &self.sdk, region, role_arn, token_file,
            )),
        };
        let mut conf = aws_sdk_ec2::config::Builder::from(&self.sdk)
            .region(Region::new(region.to_string()))
            .credentials_provider(credentials)
            .interceptor(RequestIdHeader);
        for i in &self.interceptors {
            conf.push_interceptor(i.clone());
        }
        aws_sdk_ec2::Client::from_conf(conf.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::AccessKey;
    use aws_sdk_ec2::config::endpoint::{Params, ResolveEndpoint};

    fn key(id: &str) -> Auth {
        Auth::AccessKey(AccessKey {
            id: id.into(),
            secret: "s".into(),
        })
    }

    #[tokio::test]
    async fn one_client_per_region_and_credentials_and_no_more_than_the_capacity() {
        let config = AwsDriverConfig {
            endpoint_url: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        };
        let clients = Ec2Clients::new(load_sdk_config(&config).await, &config);
        clients.client("eu-west-1", &key("a"));
        clients.client("eu-west-1", &key("a"));
        assert_eq!(clients.kept(), 1, "the same credentials reuse the client");
        clients.client("eu-central-1", &key("a"));
        clients.client("eu-west-1", &key("b"));
        assert_eq!(clients.kept(), 3);
        for i in 0..2 * Ec2Clients::CAPACITY {
            clients.client("eu-west-1", &key(&format!("rotated-{i}")));
        }
        assert_eq!(
            clients.kept(),
            Ec2Clients::CAPACITY,
            "rotated secrets do not grow the clients for ever"
        );
    }

    /// The endpoint the SDK's rules give EC2 in `region`.
    async fn endpoint(region: &str, fips: bool, dual_stack: bool) -> String {
        let params = Params::builder()
            .region(region)
            .use_fips(fips)
            .use_dual_stack(dual_stack)
            .build()
            .unwrap();
        let resolver = aws_sdk_ec2::config::endpoint::DefaultResolver::new();
        let resolved = resolver.resolve_endpoint(&params).await.unwrap();
        resolved.url().to_string()
    }

    #[tokio::test]
    async fn every_partition_gets_its_own_endpoint_names() {
        for (region, fips, dual, want) in [
            (
                "eu-west-1",
                false,
                false,
                "https://ec2.eu-west-1.amazonaws.com",
            ),
            (
                "us-east-1",
                true,
                false,
                "https://ec2-fips.us-east-1.amazonaws.com",
            ),
            ("us-east-1", false, true, "https://ec2.us-east-1.api.aws"),
            (
                "cn-north-1",
                false,
                false,
                "https://ec2.cn-north-1.amazonaws.com.cn",
            ),
            // GovCloud's FIPS endpoint is its regular name.
            (
                "us-gov-west-1",
                true,
                false,
                "https://ec2.us-gov-west-1.amazonaws.com",
            ),
            // The ISO partitions and the EU sovereign cloud.
            (
                "us-iso-east-1",
                false,
                false,
                "https://ec2.us-iso-east-1.c2s.ic.gov",
            ),
            (
                "us-isob-east-1",
                false,
                false,
                "https://ec2.us-isob-east-1.sc2s.sgov.gov",
            ),
            (
                "eusc-de-east-1",
                false,
                false,
                "https://ec2.eusc-de-east-1.amazonaws.eu",
            ),
        ] {
            assert_eq!(
                endpoint(region, fips, dual).await,
                want,
                "{region} fips={fips} dual={dual}"
            );
        }
    }
}
