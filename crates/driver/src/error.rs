//! Typed driver errors with MCM's status codes.

use std::fmt;
use std::time::Duration;

/// A boxed cause kept inside a [`DriverError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The status codes of MCM's `machinecodes` package: gRPC's 0..16 plus `Uninitialized` (17).
///
/// The numbering and names are part of the compatibility contract: they appear in
/// `Machine.status.lastOperation.errorCode` and in metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The operation was cancelled by the caller.
    Canceled = 1,
    /// An error of unknown kind.
    Unknown = 2,
    /// The request itself is wrong (e.g. an invalid providerSpec); retrying will not help.
    InvalidArgument = 3,
    /// The operation did not finish in time.
    DeadlineExceeded = 4,
    /// The machine (or another resource) does not exist.
    NotFound = 5,
    /// The resource exists already.
    AlreadyExists = 6,
    /// The credentials may not perform the operation.
    PermissionDenied = 7,
    /// A quota or capacity is exhausted (e.g. no capacity for the instance type).
    ResourceExhausted = 8,
    /// The system is not in a state the operation needs.
    FailedPrecondition = 9,
    /// The operation was aborted (e.g. a concurrency conflict).
    Aborted = 10,
    /// Out of the valid range (MCM uses it for "more than one VM matches").
    OutOfRange = 11,
    /// The driver does not implement the operation.
    Unimplemented = 12,
    /// An internal error of the driver or the cloud.
    Internal = 13,
    /// The cloud is unavailable right now (e.g. throttling); retry later.
    Unavailable = 14,
    /// Unrecoverable data loss.
    DataLoss = 15,
    /// The credentials are missing or invalid.
    Unauthenticated = 16,
    /// The VM exists but is not initialized yet (MCM's extension of the gRPC codes).
    Uninitialized = 17,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 18] = [
        Code::Ok,
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
        Code::Uninitialized,
    ];

    /// The numeric value (0..=17).
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The code with this number, if any.
    pub fn from_u8(n: u8) -> Option<Code> {
        Code::ALL.get(usize::from(n)).copied()
    }

    /// The name MCM prints for the code (`"NotFound"`, `"ResourceExhausted"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Canceled => "Canceled",
            Code::Unknown => "Unknown",
            Code::InvalidArgument => "InvalidArgument",
            Code::DeadlineExceeded => "DeadlineExceeded",
            Code::NotFound => "NotFound",
            Code::AlreadyExists => "AlreadyExists",
            Code::PermissionDenied => "PermissionDenied",
            Code::ResourceExhausted => "ResourceExhausted",
            Code::FailedPrecondition => "FailedPrecondition",
            Code::Aborted => "Aborted",
            Code::OutOfRange => "OutOfRange",
            Code::Unimplemented => "Unimplemented",
            Code::Internal => "Internal",
            Code::Unavailable => "Unavailable",
            Code::DataLoss => "DataLoss",
            Code::Unauthenticated => "Unauthenticated",
            Code::Uninitialized => "Uninitialized",
        }
    }

    /// The code with this name (as printed by [`Code::as_str`]).
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error every driver operation returns: a [`Code`] the controllers act on, a message for
/// humans, an optional hint when to retry, and the underlying cause, kept as an error value
/// (never flattened into the message and parsed back).
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DriverError {
    /// What kind of failure this is; controllers decide by it.
    pub code: Code,
    /// A human-readable description (shown in `lastOperation.description` and Events).
    pub message: String,
    /// When the cloud asked us to come back (throttling), if it did.
    pub retry_after: Option<Duration>,
    /// The underlying error (a cloud SDK error, an I/O error, ...).
    #[source]
    pub source: Option<BoxError>,
}

impl DriverError {
    /// An error with a code and a message and no cause.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        DriverError {
            code,
            message: message.into(),
            retry_after: None,
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Attaches a retry hint.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// `NotFound` with a message.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// `InvalidArgument` with a message.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// `Internal` with a message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// `Unimplemented` with a message.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// Whether this is `NotFound` (deletion treats it as success).
    pub fn is_not_found(&self) -> bool {
        self.code == Code::NotFound
    }

    /// The message followed by the chain of causes, for status descriptions and Events. A
    /// cause whose text the message already holds (a driver often puts its error's text in
    /// the message and keeps the error as the source) is not repeated.
    pub fn full_message(&self) -> String {
        let mut out = format!("{}: {}", self.code, self.message);
        let mut cause: Option<&(dyn std::error::Error + 'static)> =
            self.source.as_deref().map(|e| e as _);
        while let Some(e) = cause {
            let text = e.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = e.source();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_mcm_numbers_and_names() {
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(usize::from(c.as_u8()), i);
            assert_eq!(Code::from_u8(c.as_u8()), Some(*c));
            assert_eq!(Code::from_name(c.as_str()), Some(*c));
        }
        assert_eq!(Code::NotFound.as_u8(), 5);
        assert_eq!(Code::ResourceExhausted.as_u8(), 8);
        assert_eq!(Code::OutOfRange.as_u8(), 11);
        assert_eq!(Code::Unavailable.as_u8(), 14);
        assert_eq!(Code::Uninitialized.as_u8(), 17);
        assert_eq!(Code::Uninitialized.as_str(), "Uninitialized");
        assert_eq!(Code::from_u8(18), None);
    }

    #[test]
    fn the_cause_is_kept_as_an_error_not_a_string() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "disk says no");
        let err = DriverError::new(Code::Internal, "write the VM record").with_source(io);
        let source = std::error::Error::source(&err).expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the original io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert_eq!(err.to_string(), "Internal: write the VM record");
        assert_eq!(
            err.full_message(),
            "Internal: write the VM record: disk says no"
        );
    }

    #[test]
    fn a_cause_the_message_states_already_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "disk says no");
        let err =
            DriverError::new(Code::Internal, format!("write the VM record: {io}")).with_source(io);
        assert_eq!(
            err.full_message(),
            "Internal: write the VM record: disk says no"
        );
    }
}
