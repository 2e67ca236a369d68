//! Bootstrap tokens in the user data, and their check against the API server.
//!
//! # User-data format
//!
//! The agent reads its user data as text and looks for a line
//!
//! ```text
//! bootstrapToken: <token-id>.<token-secret>
//! ```
//!
//! (leading whitespace and surrounding quotes are allowed; the id is 6 and the secret 16
//! characters of `[a-z0-9]`, Kubernetes' bootstrap-token format). A MachineClass puts
//! `bootstrapToken: <<BOOTSTRAP_TOKEN>>` in its user data; the machine controller replaces
//! the placeholder with the token it created for the machine. User data without such a line
//! boots with the kubeconfig's credentials only. User data that still contains the literal
//! `<<BOOTSTRAP_TOKEN>>` fails the boot: the controller did not substitute it.
//!
//! When a token is present, the agent first authenticates with it as a bearer token (it
//! creates an `authentication.k8s.io/v1` `SelfSubjectReview`); a `401` means the token is
//! unknown, wrong or expired and the boot fails, as a real kubelet's TLS bootstrap would.
//! A `401` is tried again for [`REJECTION_GRACE`] first: the API server's bootstrap-token
//! authenticator reads the token Secrets from its informer cache, which may not hold a token
//! the controller created a moment before the VM booted (a real VM boots for a minute, and
//! a kubelet whose bootstrap failed is restarted by its init system and tries again).

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use mcm_api::constants::placeholders::BOOTSTRAP_TOKEN;

/// The key of the user-data line holding the bootstrap token.
pub const USER_DATA_TOKEN_KEY: &str = "bootstrapToken";

/// A bootstrap token `<id>.<secret>`. `Debug` never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    /// The public token id (6 characters).
    pub id: String,
    secret: String,
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl BootstrapToken {
    /// Parses `<id>.<secret>` (`[a-z0-9]{6}.[a-z0-9]{16}`).
    pub fn parse(s: &str) -> Option<BootstrapToken> {
        let (id, secret) = s.split_once('.')?;
        let ok = |part: &str, len: usize| {
            part.len() == len
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        (ok(id, 6) && ok(secret, 16)).then(|| BootstrapToken {
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// The bearer token `<id>.<secret>`.
    pub fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// Why the user data is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    /// The controller did not substitute the placeholder.
    #[error(
        "the user data still contains the placeholder {BOOTSTRAP_TOKEN}: the machine controller did not put a bootstrap token in it"
    )]
    UnsubstitutedPlaceholder,
    /// A `bootstrapToken:` line does not hold a token.
    #[error(
        "line {line} of the user data has a malformed bootstrap token (expected `{USER_DATA_TOKEN_KEY}: <6 chars [a-z0-9]>.<16 chars [a-z0-9]>`)"
    )]
    MalformedToken {
        /// 1-based line number.
        line: usize,
    },
}

/// Finds the bootstrap token in user data (see the module documentation for the format).
pub fn token_from_user_data(user_data: &str) -> Result<Option<BootstrapToken>, UserDataError> {
    if user_data.contains(BOOTSTRAP_TOKEN) {
        return Err(UserDataError::UnsubstitutedPlaceholder);
    }
    for (i, line) in user_data.lines().enumerate() {
        let Some(value) = line
            .trim_start()
            .strip_prefix(USER_DATA_TOKEN_KEY)
            .and_then(|rest| rest.strip_prefix(':'))
        else {
            continue;
        };
        let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
        return BootstrapToken::parse(value)
            .map(Some)
            .ok_or(UserDataError::MalformedToken { line: i + 1 });
    }
    Ok(None)
}

/// The outcome of checking a token against the API server.
#[derive(Debug, thiserror::Error)]
pub enum TokenCheckError {
    /// The API server rejected the token (401): unknown, wrong secret, or expired.
    #[error("the API server rejected bootstrap token {id:?} (401 Unauthorized): {message}")]
    Rejected {
        /// The token id.
        id: String,
        /// The API server's message.
        message: String,
    },
    /// The API server could not be asked (retryable).
    #[error("could not check bootstrap token {id:?} with the API server")]
    Unreachable {
        /// The token id.
        id: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// How long after the first check a rejected token is still tried again (see the module
/// documentation); a token still rejected then fails the boot.
pub const REJECTION_GRACE: Duration = Duration::from_secs(15);

/// Whether a failed check is tried again, `elapsed` after the first attempt: an unreachable
/// API server always (the caller bounds the whole wait), a rejection within
/// [`REJECTION_GRACE`].
pub fn worth_retrying(err: &TokenCheckError, elapsed: Duration) -> bool {
    match err {
        TokenCheckError::Unreachable { .. } => true,
        TokenCheckError::Rejected { .. } => elapsed < REJECTION_GRACE,
    }
}

/// Authenticates to the API server with the token as a bearer token (instead of the
/// kubeconfig's credentials) and returns the user name the server saw
/// (`system:bootstrap:<id>`).
pub async fn check_token(
    base: &kube::Config,
    token: &BootstrapToken,
) -> Result<String, TokenCheckError> {
    let unreachable = |source| TokenCheckError::Unreachable {
        id: token.id.clone(),
        source,
    };
    let mut config = base.clone();
    config.auth_info = serde_json::from_value(serde_json::json!({ "token": token.bearer() }))
        .map_err(|e| unreachable(kube::Error::SerdeError(e)))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(10));
    let client = kube::Client::try_from(config).map_err(unreachable)?;
    let review = SelfSubjectReview::default();
    match Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(r) => Ok(r
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_default()),
        Err(kube::Error::Api(status)) if status.code == 401 => Err(TokenCheckError::Rejected {
            id: token.id.clone(),
            message: status.message.clone(),
        }),
        Err(e) => Err(unreachable(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_token_line() {
        let ud = "#cloud-config\nfoo: bar\n  bootstrapToken: \"abcdef.0123456789abcdef\"\n";
        let t = token_from_user_data(ud).expect("valid").expect("present");
        assert_eq!(t.id, "abcdef");
        assert_eq!(t.bearer(), "abcdef.0123456789abcdef");
        assert!(!format!("{t:?}").contains("0123456789abcdef"));
        assert_eq!(token_from_user_data("nothing here\n"), Ok(None));
        assert_eq!(token_from_user_data(""), Ok(None));
    }

    #[test]
    fn a_rejection_is_tried_again_only_within_the_grace() {
        let rejected = TokenCheckError::Rejected {
            id: "abcdef".into(),
            message: "Unauthorized".into(),
        };
        assert!(worth_retrying(&rejected, Duration::ZERO));
        assert!(worth_retrying(
            &rejected,
            REJECTION_GRACE - Duration::from_millis(1)
        ));
        assert!(!worth_retrying(&rejected, REJECTION_GRACE));
        let unreachable = TokenCheckError::Unreachable {
            id: "abcdef".into(),
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        assert!(worth_retrying(&unreachable, REJECTION_GRACE * 4));
    }

    #[test]
    fn rejects_placeholders_and_malformed_tokens() {
        assert_eq!(
            token_from_user_data("bootstrapToken: <<BOOTSTRAP_TOKEN>>"),
            Err(UserDataError::UnsubstitutedPlaceholder)
        );
        assert_eq!(
            token_from_user_data("a\nbootstrapToken: ABCDEF.0123456789abcdef"),
            Err(UserDataError::MalformedToken { line: 2 })
        );
        assert!(BootstrapToken::parse("abcdef.short").is_none());
        assert!(BootstrapToken::parse("abcdef0123456789abcdef").is_none());
    }
}
