//! Credentials of a driver call: the secret's static access key, or workload identity.
//!
//! Workload identity is Gardener's: the secret names an IAM role (`roleARN`) and a file with a
//! web-identity token (`workloadIdentityTokenFile`, kept fresh by gardenlet and mounted into
//! the provider's container). [`WebIdentity`] exchanges the token for temporary credentials
//! with STS `AssumeRoleWithWebIdentity`, reads the file again on every exchange (the token
//! rotates), and keeps the credentials until five minutes before they expire. The STS client
//! is built from the driver's SDK configuration, so it follows the same endpoint override
//! (`AwsDriverConfig::endpoint_url`, `AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`) and HTTP stack.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::Region;
use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::future;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};

use crate::spec::Auth;

/// The session name of the assumed role (in CloudTrail).
pub const SESSION_NAME: &str = "machine-controller-manager";
/// Credentials are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(300);

/// The token file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the workload identity token file {path}")]
pub struct TokenFileError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// Temporary credentials of an IAM role for a web-identity token in a file.
#[derive(Debug)]
pub struct WebIdentity {
    sts: aws_sdk_sts::Client,
    role_arn: String,
    token_file: PathBuf,
    cached: tokio::sync::Mutex<Option<Credentials>>,
}

impl WebIdentity {
    /// Credentials of `role_arn` for the token in `token_file`, from STS in `region`.
    pub fn new(sdk: &SdkConfig, region: &str, role_arn: &str, token_file: &Path) -> Self {
        let conf = aws_sdk_sts::config::Builder::from(sdk)
            .region(Region::new(region.to_string()))
            .build();
        WebIdentity {
            sts: aws_sdk_sts::Client::from_conf(conf),
            role_arn: role_arn.to_string(),
            token_file: token_file.to_path_buf(),
            cached: tokio::sync::Mutex::new(None),
        }
    }

    async fn credentials(&self) -> Result<Credentials, CredentialsError> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && c.expiry()
                .is_none_or(|e| e > SystemTime::now() + RENEW_BEFORE)
        {
            return Ok(c.clone());
        }
        let token = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|source| {
                CredentialsError::provider_error(TokenFileError {
                    path: self.token_file.clone(),
                    source,
                })
            })?;
        let out = self
            .sts
            .assume_role_with_web_identity()
            .role_arn(&self.role_arn)
            .role_session_name(SESSION_NAME)
            .web_identity_token(token.trim())
            .send()
            .await
            .map_err(CredentialsError::provider_error)?;
        let c = out.credentials().ok_or_else(|| {
            CredentialsError::unhandled("STS AssumeRoleWithWebIdentity returned no credentials")
        })?;
        let fresh = Credentials::new(
            c.access_key_id(),
            c.secret_access_key(),
            Some(c.session_token().to_string()),
            SystemTime::try_from(*c.expiration()).ok(),
            "mcm-web-identity",
        );
        *cached = Some(fresh.clone());
        Ok(fresh)
    }
}

impl ProvideCredentials for WebIdentity {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.credentials())
    }
}

/// What a [`WebIdentity`] is kept by: role, token file, region.
type WebIdentityKey = (String, PathBuf, String);

/// The credential providers of a driver: one [`WebIdentity`] per role, token file and region,
/// kept across calls so their credentials are reused until they expire.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    web_identities: Arc<Mutex<HashMap<WebIdentityKey, SharedCredentialsProvider>>>,
}

impl Providers {
    /// The provider of `auth`'s credentials in `region`.
    pub fn of(&self, sdk: &SdkConfig, auth: &Auth, region: &str) -> SharedCredentialsProvider {
        match auth {
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
            } => {
                let mut map = self
                    .web_identities
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                map.entry((role_arn.clone(), token_file.clone(), region.to_string()))
                    .or_insert_with(|| {
                        SharedCredentialsProvider::new(WebIdentity::new(
                            sdk, region, role_arn, token_file,
                        ))
                    })
                    .clone()
            }
        }
    }
}
