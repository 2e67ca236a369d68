//! Mapping Compute API errors to MCM's codes.
//!
//! Two kinds of failure come back from GCE: an HTTP error of a call (status, a `reason` such
//! as `notFound`, `quotaExceeded` or `rateLimitExceeded`, maybe `Retry-After`), and a zone
//! operation that finished with errors (codes such as `ZONE_RESOURCE_POOL_EXHAUSTED` or
//! `QUOTA_EXCEEDED`): an instance insert is accepted first and fails in its operation when the
//! zone has no capacity. [`classify_http`] and [`classify_operation`] are the pure decisions;
//! [`GcpError`] keeps the client's error or the operation's errors and ids as the source of
//! the [`DriverError`] that [`GcpError::into_driver_error`] makes.

use std::time::Duration;

use mcm_driver::{Code, DriverError, RequestId};

/// How long to wait after throttling when GCE does not say.
pub const THROTTLE_RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long to wait after the endpoint could not be reached or was unavailable.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(5);

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

/// What an HTTP error of the Compute API says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpFailure {
    /// The HTTP status; `None` when no response came (connection, timeout).
    pub status: Option<u16>,
    /// GCE's `reason` of the first error (`notFound`, `quotaExceeded`, ...).
    pub reason: Option<String>,
    /// GCE's message.
    pub message: String,
    /// The `Retry-After` header, in seconds.
    pub retry_after: Option<Duration>,
}

/// Maps an HTTP error to an MCM code.
///
/// 404 is `NotFound`; 409 `AlreadyExists`; 429, 503 and 403/`rateLimitExceeded` are
/// `Unavailable` with GCE's `Retry-After` (or a default); 403/`quotaExceeded` and a machine
/// type or resource that "does not exist in zone" are `ResourceExhausted` (as Gardener's
/// provider maps them); other 400s are `InvalidArgument` (the class must change), 401
/// `Unauthenticated`, 403 `PermissionDenied`; no response at all is `Unavailable`.
pub fn classify_http(f: &HttpFailure) -> Classification {
    let reason = f.reason.as_deref().unwrap_or_default();
    let throttled = |default: Duration| Classification {
        code: Code::Unavailable,
        retry_after: Some(f.retry_after.unwrap_or(default)),
    };
    match f.status {
        None => throttled(UNAVAILABLE_RETRY_AFTER),
        Some(404) => Classification::code(Code::NotFound),
        Some(409) => Classification::code(Code::AlreadyExists),
        Some(429) => throttled(THROTTLE_RETRY_AFTER),
        Some(403) if is_rate_limit(reason) => throttled(THROTTLE_RETRY_AFTER),
        Some(403) if reason.eq_ignore_ascii_case("quotaExceeded") => {
            Classification::code(Code::ResourceExhausted)
        }
        Some(403) => Classification::code(Code::PermissionDenied),
        Some(401) => Classification::code(Code::Unauthenticated),
        Some(400) if reason == "resourceNotReady" => {
            Classification::retry(Code::Unavailable, UNAVAILABLE_RETRY_AFTER)
        }
        Some(_) if f.message.contains("does not exist in zone") => {
            Classification::code(Code::ResourceExhausted)
        }
        Some(400 | 422) => Classification::code(Code::InvalidArgument),
        Some(412) => Classification::code(Code::FailedPrecondition),
        Some(502..=504) => throttled(UNAVAILABLE_RETRY_AFTER),
        Some(500) => Classification::retry(Code::Internal, UNAVAILABLE_RETRY_AFTER),
        Some(_) => Classification::code(Code::Internal),
    }
}

/// Whether a reason names a rate limit, however GCE spells it: the legacy `errors[].reason`
/// (`rateLimitExceeded`, `userRateLimitExceeded`) or an `ErrorInfo` reason
/// (`RATE_LIMIT_EXCEEDED`). A 403 for a rate limit is throttling, not a missing permission.
/// Pure.
pub fn is_rate_limit(reason: &str) -> bool {
    let folded: String = reason
        .chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    folded.contains("ratelimitexceeded")
}

/// Operation error codes that mean "no capacity now" (`ResourceExhausted`), besides any code
/// containing `QUOTA`.
pub const EXHAUSTED_OPERATION_CODES: &[&str] = &[
    "RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
];

/// Maps the error codes of a finished operation to an MCM code, by the last code as
/// Gardener's provider does: capacity and quota are `ResourceExhausted`; a missing or invalid
/// resource the class names (image, network, machine type) is `InvalidArgument`; throttling and
/// not-ready resources are `Unavailable`.
pub fn classify_operation(codes: &[String]) -> Classification {
    let last = codes.last().map(String::as_str).unwrap_or_default();
    if EXHAUSTED_OPERATION_CODES.contains(&last) || last.contains("QUOTA") {
        return Classification::code(Code::ResourceExhausted);
    }
    match last {
        "RESOURCE_NOT_FOUND"
        | "INVALID_FIELD_VALUE"
        | "INVALID_USAGE"
        | "BAD_REQUEST"
        | "REQUIRED_FIELD_MISSING"
        | "CONDITION_NOT_MET" => Classification::code(Code::InvalidArgument),
        "RESOURCE_ALREADY_EXISTS" | "ALREADY_EXISTS" => Classification::code(Code::AlreadyExists),
        "PERMISSIONS_ERROR" | "FORBIDDEN" => Classification::code(Code::PermissionDenied),
        "RATE_LIMIT_EXCEEDED" | "RESOURCE_NOT_READY" | "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" => {
            Classification::retry(Code::Unavailable, UNAVAILABLE_RETRY_AFTER)
        }
        _ => Classification::code(Code::Internal),
    }
}

/// One error of a finished operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationFailure {
    /// GCE's code, e.g. `ZONE_RESOURCE_POOL_EXHAUSTED`.
    pub code: String,
    /// GCE's message.
    pub message: String,
}

fn join_failures(errors: &[OperationFailure]) -> String {
    errors
        .iter()
        .map(|e| format!("{}: {}", e.code, e.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A failure of a driver call against GCE.
#[derive(Debug, thiserror::Error)]
pub enum GcpError {
    /// A call failed (HTTP error, connection, timeout).
    #[error("{call} failed{}", http_suffix(.failure))]
    Api {
        /// The API method, e.g. `instances.insert`.
        call: &'static str,
        /// What the error says.
        failure: HttpFailure,
        /// The client's error.
        #[source]
        source: google_cloud_gax::error::Error,
    },
    /// A zone operation finished with errors.
    #[error("operation {operation} ({kind} of {target}) failed: {}", join_failures(.errors))]
    Operation {
        /// The operation's name.
        operation: String,
        /// `insert`, `delete`, ...
        kind: String,
        /// The instance it works on.
        target: String,
        /// Its errors.
        errors: Vec<OperationFailure>,
    },
    /// A zone operation did not finish in time.
    #[error("operation {operation} ({kind} of {target}) did not finish within {timeout:?}")]
    OperationTimeout {
        /// The operation's name.
        operation: String,
        /// `insert`, `delete`, ...
        kind: String,
        /// The instance it works on.
        target: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The credentials could not be turned into a token source.
    #[error("the credentials in secret key {key} cannot be used")]
    Credentials {
        /// The secret key.
        key: &'static str,
        /// The auth library's error.
        #[source]
        source: google_cloud_auth::build_errors::Error,
    },
    /// The Compute client could not be built.
    #[error("the Compute API client cannot be built")]
    Client(#[source] google_cloud_gax::client_builder::Error),
}

fn http_suffix(f: &HttpFailure) -> String {
    match (f.status, &f.reason) {
        (Some(s), Some(r)) => format!(" with HTTP {s} ({r}): {}", f.message),
        (Some(s), None) => format!(" with HTTP {s}: {}", f.message),
        (None, _) => format!(": {}", f.message),
    }
}

impl GcpError {
    /// A failed call, with what its error says.
    pub fn api(call: &'static str, source: google_cloud_gax::error::Error) -> Self {
        GcpError::Api {
            call,
            failure: http_failure(&source),
            source,
        }
    }

    /// What the error means for the controller.
    pub fn classification(&self) -> Classification {
        match self {
            GcpError::Api { failure, .. } => classify_http(failure),
            GcpError::Operation { errors, .. } => {
                let codes: Vec<String> = errors.iter().map(|e| e.code.clone()).collect();
                classify_operation(&codes)
            }
            GcpError::OperationTimeout { .. } => {
                Classification::retry(Code::Unavailable, UNAVAILABLE_RETRY_AFTER)
            }
            GcpError::Credentials { .. } => Classification::code(Code::InvalidArgument),
            GcpError::Client(_) => Classification::code(Code::Internal),
        }
    }

    /// Whether GCE said the resource does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, GcpError::Api { failure, .. } if failure.status == Some(404))
    }

    /// Whether GCE said the resource exists already.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, GcpError::Api { failure, .. } if failure.status == Some(409))
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

/// The client error that carries the HTTP response: `e` itself, or, when the client's retry
/// policy gave up ("exhausted"), the last attempt's error it wraps.
fn response_error(e: &google_cloud_gax::error::Error) -> &google_cloud_gax::error::Error {
    let mut current = e;
    while current.http_status_code().is_none() {
        let inner = std::error::Error::source(current)
            .and_then(|s| s.downcast_ref::<google_cloud_gax::error::Error>());
        match inner {
            Some(i) => current = i,
            None => return e,
        }
    }
    current
}

/// Reads status, GCE reason, message and `Retry-After` from a client error.
///
/// GCE's own error bodies (`{"error": {"code", "message", "errors": [{"reason"}]}}`) reach the
/// client's status with the first reason as an `ErrorInfo` detail (`notFound`,
/// `quotaExceeded`, `resourceNotReady`); the API front end's (401, 429) carry their own
/// `ErrorInfo` (`RATE_LIMIT_EXCEEDED`). A body that is not JSON is read as it is.
pub fn http_failure(e: &google_cloud_gax::error::Error) -> HttpFailure {
    use google_cloud_gax::error::rpc::StatusDetails;
    let r = response_error(e);
    let status = r.http_status_code();
    let reason = r.status().and_then(|s| {
        s.details.iter().find_map(|d| match d {
            StatusDetails::ErrorInfo(info) if !info.reason.is_empty() => Some(info.reason.clone()),
            _ => None,
        })
    });
    let payload: Option<serde_json::Value> = r
        .http_payload()
        .and_then(|p| serde_json::from_slice(p).ok());
    let reason = reason.or_else(|| {
        payload
            .as_ref()
            .and_then(|p| p.pointer("/error/errors/0/reason"))
            .and_then(|r| r.as_str())
            .map(str::to_string)
    });
    let message = r
        .status()
        .map(|s| s.message.clone())
        .filter(|m| !m.is_empty())
        .or_else(|| {
            payload
                .as_ref()
                .and_then(|p| p.pointer("/error/message"))
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| e.to_string());
    let retry_after = r
        .http_headers()
        .and_then(|h| h.get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    HttpFailure {
        status,
        reason,
        message,
        retry_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16, reason: Option<&str>, message: &str) -> HttpFailure {
        HttpFailure {
            status: Some(status),
            reason: reason.map(str::to_string),
            message: message.into(),
            retry_after: None,
        }
    }

    #[test]
    fn http_errors() {
        let cases: &[(HttpFailure, Code, Option<u64>)] = &[
            (http(404, Some("notFound"), "x"), Code::NotFound, None),
            (
                http(409, Some("alreadyExists"), "x"),
                Code::AlreadyExists,
                None,
            ),
            (
                http(429, Some("rateLimitExceeded"), "x"),
                Code::Unavailable,
                Some(10),
            ),
            (
                HttpFailure {
                    retry_after: Some(Duration::from_secs(3)),
                    ..http(429, None, "x")
                },
                Code::Unavailable,
                Some(3),
            ),
            (
                http(403, Some("rateLimitExceeded"), "x"),
                Code::Unavailable,
                Some(10),
            ),
            (
                http(403, Some("userRateLimitExceeded"), "x"),
                Code::Unavailable,
                Some(10),
            ),
            // The ErrorInfo reason comes first when GCE sends one.
            (
                http(403, Some("RATE_LIMIT_EXCEEDED"), "x"),
                Code::Unavailable,
                Some(10),
            ),
            (
                http(403, Some("quotaExceeded"), "Quota 'CPUS' exceeded"),
                Code::ResourceExhausted,
                None,
            ),
            (
                http(403, Some("forbidden"), "x"),
                Code::PermissionDenied,
                None,
            ),
            (http(401, None, "x"), Code::Unauthenticated, None),
            (
                http(400, Some("invalid"), "Invalid value for field"),
                Code::InvalidArgument,
                None,
            ),
            (
                http(
                    400,
                    Some("invalid"),
                    "Machine type n9-x does not exist in zone z",
                ),
                Code::ResourceExhausted,
                None,
            ),
            (
                http(400, Some("resourceNotReady"), "x"),
                Code::Unavailable,
                Some(5),
            ),
            (
                http(503, Some("backendError"), "x"),
                Code::Unavailable,
                Some(5),
            ),
            (http(500, None, "x"), Code::Internal, Some(5)),
            (HttpFailure::default(), Code::Unavailable, Some(5)),
        ];
        for (f, code, after) in cases {
            let c = classify_http(f);
            assert_eq!(
                (c.code, c.retry_after.map(|d| d.as_secs())),
                (*code, *after),
                "{f:?}"
            );
        }
    }

    #[test]
    fn operation_errors() {
        let c = |codes: &[&str]| {
            classify_operation(&codes.iter().map(|s| s.to_string()).collect::<Vec<_>>()).code
        };
        assert_eq!(
            c(&["ZONE_RESOURCE_POOL_EXHAUSTED"]),
            Code::ResourceExhausted
        );
        assert_eq!(
            c(&["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"]),
            Code::ResourceExhausted
        );
        assert_eq!(c(&["QUOTA_EXCEEDED"]), Code::ResourceExhausted);
        assert_eq!(c(&["REGION_QUOTA_EXCEEDED"]), Code::ResourceExhausted);
        assert_eq!(c(&["RESOURCE_NOT_FOUND"]), Code::InvalidArgument);
        assert_eq!(
            c(&["QUOTA_EXCEEDED", "RESOURCE_NOT_FOUND"]),
            Code::InvalidArgument,
            "the last one counts"
        );
        assert_eq!(c(&["RATE_LIMIT_EXCEEDED"]), Code::Unavailable);
        assert_eq!(c(&["SOMETHING_NEW"]), Code::Internal);
        assert_eq!(c(&[]), Code::Internal);
    }

    #[test]
    fn operation_failures_name_the_operation_and_request() {
        let e = GcpError::Operation {
            operation: "operation-1-abc".into(),
            kind: "insert".into(),
            target: "m-0".into(),
            errors: vec![OperationFailure {
                code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
                message: "The zone 'projects/p/zones/z' does not have enough resources".into(),
            }],
        };
        let d = e.into_driver_error("creating VM m-0", &RequestId::from_string("r1"));
        assert_eq!(d.code, Code::ResourceExhausted);
        assert_eq!(
            d.message,
            "creating VM m-0: operation operation-1-abc (insert of m-0) failed: ZONE_RESOURCE_POOL_EXHAUSTED: \
             The zone 'projects/p/zones/z' does not have enough resources (request id r1)"
        );
        assert!(d.source.is_some(), "the operation's errors stay the source");
    }
}
