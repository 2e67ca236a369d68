//! Credentials of a driver call: the secret's static access key, or workload identity.
//!
//! Workload identity is Gardener's: the secret names an IAM role (`roleARN`) and a file with a
//! web-identity token (`workloadIdentityTokenFile`, kept fresh by gardenlet and mounted into
//! the provider's container). [`WebIdentity`] exchanges the token for temporary credentials
//! with STS `AssumeRoleWithWebIdentity` and reads the file again on every exchange (the token
//! rotates). The EC2 client's identity cache keeps the credentials until shortly before they
//! expire, so one exchange serves every call of that client ([`crate::client::Ec2Clients`]).
//!
//! Why not aws-config's `WebIdentityTokenCredentialsProvider`: it takes its STS endpoint from
//! the process environment only. [`WebIdentity`] calls STS with the driver's own SDK
//! configuration, so STS follows the same endpoint override
//! (`AwsDriverConfig::endpoint_url`, `AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`), FIPS and
//! dual-stack settings, HTTP stack, timeouts and retries as EC2. No ambient credentials are
//! ever read (no IMDS, no profile, no environment keys).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use aws_config::Region;
use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::future;

/// The session name of the assumed role (in CloudTrail).
pub const SESSION_NAME: &str = "machine-controller-manager";

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
        }
    }

    async fn credentials(&self) -> Result<Credentials, CredentialsError> {
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
        Ok(Credentials::new(
            c.access_key_id(),
            c.secret_access_key(),
            Some(c.session_token().to_string()),
            SystemTime::try_from(*c.expiration()).ok(),
            "mcm-web-identity",
        ))
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
