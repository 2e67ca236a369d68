//! Mapping Azure Resource Manager errors to MCM's codes.
//!
//! ARM answers a failed call with `{"error": {"code", "message"}}`, an HTTP status, an
//! `x-ms-request-id` and sometimes `Retry-After`; a long-running operation that fails reports
//! the same `code`/`message` in its status. [`classify`] is the pure decision over the status,
//! the code and the message; [`AzureError`] keeps what ARM answered, the transport's error or the operation's outcome as
//! the source of the [`DriverError`] that [`AzureError::into_driver_error`] makes, whose message
//! names the call, the ARM code, `x-ms-request-id` and the driver's request id.

use std::time::Duration;

use mcm_driver::{Code, DriverError, RequestId};

/// How long to wait after throttling when ARM does not say.
pub const THROTTLE_RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long to wait after a transient failure (busy resource, 5xx, no response).
pub const TRANSIENT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// What an error means for the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// The MCM code.
    pub code: Code,
    /// When to retry, if known.
    pub retry_after: Option<Duration>,
}

impl Classification {
    const fn code(code: Code) -> Self {
        Classification {
            code,
            retry_after: None,
        }
    }

    const fn retry(code: Code, after: Duration) -> Self {
        Classification {
            code,
            retry_after: Some(after),
        }
    }
}

/// What a failed ARM call or operation says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArmFailure {
    /// The HTTP status; `None` for a failed operation or when no response came.
    pub status: Option<u16>,
    /// ARM's error code, e.g. `AllocationFailed`.
    pub code: Option<String>,
    /// ARM's message.
    pub message: String,
    /// ARM's `x-ms-request-id`.
    pub request_id: Option<String>,
    /// The `Retry-After` header.
    pub retry_after: Option<Duration>,
}

/// Capacity and quota codes (`ResourceExhausted`), as Gardener's provider lists them, plus
/// ARM's other quota codes.
pub const EXHAUSTED_CODES: &[&str] = &[
    "ZonalAllocationFailed",
    "AllocationFailed",
    "SkuNotAvailable",
    "ResourceQuotaExceeded",
    "QuotaExceeded",
    "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest",
];

/// Codes of a resource that is busy or still attached (`Unavailable`, retry soon).
pub const BUSY_CODES: &[&str] = &[
    "NicInUse",
    "AnotherOperationInProgress",
    "OperationPreempted",
    "RetryableError",
    "Conflict",
    "InUseSubnetCannotBeDeleted",
];

fn contains_ci(haystack: &str, needle: &str) -> bool {
    haystack.to_ascii_lowercase().contains(needle)
}

/// Maps an ARM failure to an MCM code: capacity and quota → `ResourceExhausted`; 404 →
/// `NotFound`; throttling → `Unavailable` with ARM's `Retry-After`; a busy or attached resource
/// and 5xx → `Unavailable`; 401 → `Unauthenticated`; 403 → `PermissionDenied`; other 400s →
/// `InvalidArgument`.
pub fn classify(f: &ArmFailure) -> Classification {
    let code = f.code.as_deref().unwrap_or_default();
    if EXHAUSTED_CODES.contains(&code)
        || (code == "OperationNotAllowed" && contains_ci(&f.message, "quota"))
        || (code == "BadRequest" && contains_ci(&f.message, "not supported"))
    {
        return Classification::code(Code::ResourceExhausted);
    }
    let after = |default| f.retry_after.unwrap_or(default);
    if f.status == Some(429) || code == "TooManyRequests" || code == "Throttled" {
        return Classification::retry(Code::Unavailable, after(THROTTLE_RETRY_AFTER));
    }
    if BUSY_CODES.contains(&code)
        || (code == "OperationNotAllowed" && contains_ci(&f.message, "attached"))
    {
        return Classification::retry(Code::Unavailable, after(TRANSIENT_RETRY_AFTER));
    }
    match (f.status, code) {
        (Some(404), _) | (_, "ResourceNotFound" | "NotFound" | "ResourceGroupNotFound") => {
            Classification::code(Code::NotFound)
        }
        (Some(401), _)
        | (_, "AuthenticationFailed" | "InvalidAuthenticationToken" | "CredentialUnavailable") => {
            Classification::code(Code::Unauthenticated)
        }
        (Some(403), _) | (_, "AuthorizationFailed" | "LinkedAuthorizationFailed") => {
            Classification::code(Code::PermissionDenied)
        }
        (None, "") => Classification::retry(Code::Unavailable, TRANSIENT_RETRY_AFTER),
        (Some(500..=599), _) | (_, "InternalServerError" | "ServiceUnavailable") => {
            Classification::retry(Code::Unavailable, after(TRANSIENT_RETRY_AFTER))
        }
        (Some(409), _) => Classification::retry(Code::Unavailable, after(TRANSIENT_RETRY_AFTER)),
        (Some(400), _)
        | (
            _,
            "InvalidParameter" | "InvalidResourceReference" | "InvalidRequestFormat" | "BadRequest",
        ) => Classification::code(Code::InvalidArgument),
        _ => Classification::code(Code::Internal),
    }
}

/// A failure of a driver call against ARM.
#[derive(Debug, thiserror::Error)]
pub enum AzureError {
    /// A call failed.
    #[error("{call} failed{}", describe(.failure))]
    Api {
        /// What was called, e.g. `PUT virtualMachines/m-0`.
        call: String,
        /// What ARM said.
        failure: Box<ArmFailure>,
        /// Why no answer came (the token, the connection); `None` when ARM answered.
        #[source]
        source: Option<Box<azure_core::Error>>,
    },
    /// ARM's answer is not what its API defines.
    #[error("{call}: {problem}")]
    Answer {
        /// What was called.
        call: String,
        /// What is wrong with the answer.
        problem: String,
    },
    /// A long-running operation finished as failed or canceled.
    #[error("{call}: the operation {status}{}", describe(.failure))]
    Operation {
        /// What was called.
        call: String,
        /// `Failed` or `Canceled`.
        status: String,
        /// What ARM said.
        failure: Box<ArmFailure>,
    },
    /// A long-running operation did not finish in time.
    #[error("{call}: the operation did not finish within {timeout:?}")]
    OperationTimeout {
        /// What was called.
        call: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The ARM client could not be built or used.
    #[error("the Azure client cannot be used")]
    Client(#[source] Box<azure_core::Error>),
    /// The class's marketplace image does not exist in its location.
    #[error("the marketplace image {urn} does not exist in {location}")]
    ImageNotFound {
        /// `publisher:offer:sku:version`.
        urn: String,
        /// The class's location.
        location: String,
        /// What ARM answered.
        #[source]
        source: Box<AzureError>,
    },
    /// A credential cannot be made from the Secret (for workload identity: its token file
    /// cannot be read, which azure_identity does when it makes the credential).
    #[error("cannot make the {what}")]
    Credential {
        /// Which credential, e.g. `workload identity credential of client ... with the token
        /// file ...` (never the secret).
        what: String,
        /// azure_identity's error.
        #[source]
        source: Box<azure_core::Error>,
    },
    /// The HTTP client cannot be built.
    #[error("the Azure HTTP client cannot be built: {what}")]
    HttpClient {
        /// What failed.
        what: String,
        /// Why (rustls, reqwest or the PEM parser).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The file of extra CA certificates ([`crate::client::CA_FILE_ENV`]) cannot be read.
    #[error("cannot read the CA file {path}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The class names a cloud the driver has no endpoints for.
    #[error("no endpoints are known for the cloud {0:?} (cloudConfiguration.name)")]
    UnknownCloud(String),
}

fn describe(f: &ArmFailure) -> String {
    let mut out = String::new();
    if let Some(s) = f.status {
        out.push_str(&format!(" with HTTP {s}"));
    }
    if let Some(c) = &f.code {
        out.push_str(&format!(" ({c})"));
    }
    if !f.message.is_empty() {
        out.push_str(&format!(": {}", f.message));
    }
    if let Some(id) = &f.request_id {
        out.push_str(&format!(" [x-ms-request-id {id}]"));
    }
    out
}

impl AzureError {
    /// What ARM said, if it said anything.
    pub fn failure(&self) -> Option<&ArmFailure> {
        match self {
            AzureError::Api { failure, .. } | AzureError::Operation { failure, .. } => {
                Some(failure)
            }
            _ => None,
        }
    }

    /// What the error means for the controller.
    pub fn classification(&self) -> Classification {
        match self {
            AzureError::Api { failure, .. } | AzureError::Operation { failure, .. } => {
                classify(failure)
            }
            AzureError::OperationTimeout { .. } => {
                Classification::retry(Code::Unavailable, TRANSIENT_RETRY_AFTER)
            }
            AzureError::Client(_)
            | AzureError::Answer { .. }
            | AzureError::HttpClient { .. }
            | AzureError::CaFile { .. } => Classification::code(Code::Internal),
            AzureError::Credential { .. } => Classification::code(Code::Unauthenticated),
            AzureError::UnknownCloud(_) | AzureError::ImageNotFound { .. } => {
                Classification::code(Code::InvalidArgument)
            }
        }
    }

    /// Whether ARM said the resource does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, AzureError::Api { failure, .. } if failure.status == Some(404))
    }

    /// The driver error: the classification's code and retry hint, a message naming the
    /// failure and the driver's request id, and this error as the source.
    pub fn into_driver_error(self, context: &str, request_id: &RequestId) -> DriverError {
        let c = self.classification();
        let mut e = DriverError::new(
            c.code,
            format!("{context}: {self} (request id {request_id})"),
        );
        if let Some(after) = c.retry_after {
            e = e.with_retry_after(after);
        }
        e.with_source(self)
    }
}

/// ARM's `{"error": {"code", "message"}}` (or an operation status's `error`) in `body`.
pub fn error_of(body: &serde_json::Value) -> (Option<String>, String) {
    let e = body.get("error").unwrap_or(body);
    (
        e.get("code").and_then(|c| c.as_str()).map(str::to_string),
        e.get("message")
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(status: Option<u16>, code: &str, message: &str) -> ArmFailure {
        ArmFailure {
            status,
            code: (!code.is_empty()).then(|| code.to_string()),
            message: message.into(),
            ..Default::default()
        }
    }

    #[test]
    fn arm_errors() {
        let cases: &[(ArmFailure, Code, Option<u64>)] = &[
            (
                f(None, "AllocationFailed", "no capacity"),
                Code::ResourceExhausted,
                None,
            ),
            (
                f(None, "ZonalAllocationFailed", "x"),
                Code::ResourceExhausted,
                None,
            ),
            (
                f(Some(409), "SkuNotAvailable", "x"),
                Code::ResourceExhausted,
                None,
            ),
            (
                f(
                    Some(409),
                    "OperationNotAllowed",
                    "would result in exceeding quota limits",
                ),
                Code::ResourceExhausted,
                None,
            ),
            (
                f(
                    Some(400),
                    "BadRequest",
                    "Size Standard_X is not supported in zone 3",
                ),
                Code::ResourceExhausted,
                None,
            ),
            (
                f(Some(429), "TooManyRequests", "x"),
                Code::Unavailable,
                Some(10),
            ),
            (
                ArmFailure {
                    retry_after: Some(Duration::from_secs(17)),
                    ..f(Some(429), "", "")
                },
                Code::Unavailable,
                Some(17),
            ),
            (
                f(
                    Some(400),
                    "NicInUse",
                    "Network Interface is used by existing resource",
                ),
                Code::Unavailable,
                Some(5),
            ),
            (
                f(Some(409), "OperationNotAllowed", "Disk is attached to VM"),
                Code::Unavailable,
                Some(5),
            ),
            (f(Some(404), "ResourceNotFound", "x"), Code::NotFound, None),
            (
                f(Some(401), "InvalidAuthenticationToken", "x"),
                Code::Unauthenticated,
                None,
            ),
            (
                f(Some(403), "AuthorizationFailed", "x"),
                Code::PermissionDenied,
                None,
            ),
            (
                f(Some(400), "InvalidResourceReference", "subnet not found"),
                Code::InvalidArgument,
                None,
            ),
            (
                f(Some(400), "InvalidParameter", "x"),
                Code::InvalidArgument,
                None,
            ),
            (f(Some(503), "", "x"), Code::Unavailable, Some(5)),
            (f(None, "", ""), Code::Unavailable, Some(5)),
            (f(None, "SomethingNew", "x"), Code::Internal, None),
        ];
        for (failure, code, after) in cases {
            let c = classify(failure);
            assert_eq!(
                (c.code, c.retry_after.map(|d| d.as_secs())),
                (*code, *after),
                "{failure:?}"
            );
        }
    }

    #[test]
    fn errors_name_the_call_the_code_and_both_request_ids() {
        let e = AzureError::Operation {
            call: "PUT virtualMachines/m-0".into(),
            status: "Failed".into(),
            failure: Box::new(ArmFailure {
                code: Some("AllocationFailed".into()),
                message: "Allocation failed.".into(),
                request_id: Some("req-1".into()),
                ..Default::default()
            }),
        };
        let d = e.into_driver_error("creating VM m-0", &RequestId::from_string("mcm-1"));
        assert_eq!(d.code, Code::ResourceExhausted);
        assert_eq!(
            d.message,
            "creating VM m-0: PUT virtualMachines/m-0: the operation Failed (AllocationFailed): Allocation failed. \
             [x-ms-request-id req-1] (request id mcm-1)"
        );
        assert!(d.source.is_some());
        assert_eq!(
            error_of(&serde_json::json!({"error": {"code": "NicInUse", "message": "m"}})),
            (Some("NicInUse".to_string()), "m".to_string())
        );
    }
}
