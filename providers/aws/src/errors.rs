//! Mapping EC2 errors to MCM's codes.
//!
//! [`classify`] maps an EC2 error code (`InsufficientInstanceCapacity`, ...) to a [`Code`] and
//! a retry hint; [`from_sdk`] turns an SDK error into a [`DriverError`] whose message names
//! the EC2 operation, the AWS error code, the AWS request id and the driver's request id, and
//! whose source is the SDK error itself.

use std::time::Duration;

use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::operation::RequestId as _;
use mcm_driver::{Code, DriverError, RequestId};

/// How long to wait after throttling before calling EC2 again.
pub const THROTTLE_RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long to wait after the endpoint could not be reached.
pub const UNREACHABLE_RETRY_AFTER: Duration = Duration::from_secs(5);

/// What an EC2 error code means for the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// The MCM code.
    pub code: Code,
    /// When to retry, if the error says so.
    pub retry_after: Option<Duration>,
}

impl Classification {
    const fn code(code: Code) -> Self {
        Classification {
            code,
            retry_after: None,
        }
    }
}

/// Capacity and limit errors: the machine cannot be created now (`ResourceExhausted`).
pub const EXHAUSTED_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientAddressCapacity",
    "InsufficientVolumeCapacity",
    "InsufficientFreeAddressesInSubnet",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "VolumeLimitExceeded",
    "MaxIOPSLimitExceeded",
    "VolumeIOPSLimit",
    "NetworkInterfaceLimitExceeded",
    "AttachmentLimitExceeded",
    "PrivateIpAddressLimitExceeded",
    "AddressLimitExceeded",
    "TagLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "ReservationCapacityExceeded",
    // The instance type is not offered in the zone: another zone (node group) may have it,
    // as Gardener's provider tells the autoscaler.
    "Unsupported",
];

/// EC2's service-side unavailability (`Unavailable`, retry later), beside the throttling
/// codes of the SDK's retry classifier ([`THROTTLING_CODES`]).
pub const UNAVAILABLE_CODES: &[&str] = &["ServiceUnavailable", "Unavailable"];

/// Every throttling code of the SDK's retry classifier (which has retried them already):
/// `Unavailable`, retry later.
pub const THROTTLING_CODES: &[&str] = aws_runtime::retries::classifiers::THROTTLING_ERRORS;

/// A request signed at a time the service does not accept: this host's clock is off. The
/// client has read the service's time from the answer and signs the next request with it,
/// so a later call succeeds (`Unavailable`, retry later; not a credentials problem).
pub const CLOCK_SKEW_CODES: &[&str] = &["RequestExpired", "RequestTimeTooSkewed"];

/// Bad or missing credentials (`Unauthenticated`).
pub const UNAUTHENTICATED_CODES: &[&str] = &[
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "MissingAuthenticationToken",
    "IncompleteSignature",
    "ExpiredToken",
    "OptInRequired",
];

/// Valid credentials without the permission (`PermissionDenied`).
pub const PERMISSION_DENIED_CODES: &[&str] = &[
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "Blocked",
];

/// Maps an EC2 error code to an MCM code.
///
/// `InvalidInstanceID.NotFound` is the only `NotFound` (the machine's VM is gone); other
/// `*.NotFound` codes (an AMI, subnet, security group or key pair of the class) and malformed
/// or invalid parameters are `InvalidArgument`: retrying does not help until the class is
/// fixed. Unknown codes are `Internal`, as in Gardener's driver.
pub fn classify(aws_code: &str) -> Classification {
    if EXHAUSTED_CODES.contains(&aws_code) {
        return Classification::code(Code::ResourceExhausted);
    }
    if THROTTLING_CODES.contains(&aws_code) || UNAVAILABLE_CODES.contains(&aws_code) {
        return Classification {
            code: Code::Unavailable,
            retry_after: Some(THROTTLE_RETRY_AFTER),
        };
    }
    if CLOCK_SKEW_CODES.contains(&aws_code) {
        return Classification {
            code: Code::Unavailable,
            retry_after: Some(UNREACHABLE_RETRY_AFTER),
        };
    }
    if UNAUTHENTICATED_CODES.contains(&aws_code) {
        return Classification::code(Code::Unauthenticated);
    }
    if PERMISSION_DENIED_CODES.contains(&aws_code) {
        return Classification::code(Code::PermissionDenied);
    }
    match aws_code {
        "InvalidInstanceID.NotFound" => Classification::code(Code::NotFound),
        "IdempotentParameterMismatch" => Classification::code(Code::AlreadyExists),
        "IncorrectInstanceState" | "IncorrectState" | "InvalidInstanceState" => {
            Classification::code(Code::FailedPrecondition)
        }
        "InternalError" | "InternalFailure" => Classification {
            code: Code::Internal,
            retry_after: Some(UNREACHABLE_RETRY_AFTER),
        },
        // IAM's "not found" (an instance profile the class names that does not exist).
        "NoSuchEntity" => Classification::code(Code::InvalidArgument),
        c if c.ends_with(".NotFound")
            || c.ends_with(".Malformed")
            || c.starts_with("InvalidParameter")
            || c.starts_with("Invalid")
            || c == "MissingParameter"
            || c == "UnknownParameter"
            || c == "UnsupportedOperation"
            || c == "ValidationError" =>
        {
            Classification::code(Code::InvalidArgument)
        }
        _ => Classification::code(Code::Internal),
    }
}

/// EC2's refusal of a request, as it answered it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ServiceError {
    /// EC2's error code (`InvalidAMIID.NotFound`, ...).
    pub code: String,
    /// EC2's message.
    pub message: String,
    /// The AWS request id of the answer (`-` when it had none).
    pub aws_request_id: String,
    /// The HTTP status of the answer.
    pub status: u16,
}

/// Turns an SDK error of the EC2 operation `operation` into a [`DriverError`] keeping the
/// SDK error as its source. The message carries the AWS error code and message, the AWS
/// request id and the driver's request id.
pub fn from_sdk<E>(
    operation: &'static str,
    request_id: &RequestId,
    err: SdkError<E, HttpResponse>,
) -> DriverError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    // EC2 puts the request id in the XML error body (parsed into the error metadata); other
    // protocols use a response header.
    let aws_request_id = err
        .meta()
        .request_id()
        .or_else(|| err.request_id())
        .unwrap_or("-")
        .to_string();
    let (class, what) = match &err {
        SdkError::ServiceError(_) => {
            let code = err.code().unwrap_or("Unknown");
            let message = err.message().unwrap_or("no message");
            (classify(code), format!("{code}: {message}"))
        }
        SdkError::TimeoutError(_) => (
            Classification {
                code: Code::DeadlineExceeded,
                retry_after: Some(UNREACHABLE_RETRY_AFTER),
            },
            "the request timed out".to_string(),
        ),
        SdkError::DispatchFailure(d) => (
            Classification {
                code: if d.is_user() {
                    Code::InvalidArgument
                } else {
                    Code::Unavailable
                },
                retry_after: (!d.is_user()).then_some(UNREACHABLE_RETRY_AFTER),
            },
            "the request could not be sent".to_string(),
        ),
        SdkError::ResponseError(_) => (
            Classification::code(Code::Internal),
            "the response could not be read".to_string(),
        ),
        SdkError::ConstructionFailure(_) => (
            Classification::code(Code::Internal),
            "the request could not be built".to_string(),
        ),
        _ => (
            Classification::code(Code::Unknown),
            "unexpected SDK error".to_string(),
        ),
    };
    let message = format!(
        "EC2 {operation} failed: {what} (AWS request id {aws_request_id}, request id {request_id})"
    );
    let mut e = match err {
        // EC2's answer is all in the message; the SDK's wrappers of it ("service error:
        // unhandled error (Code): Error { code: .. }") would only repeat it in Events.
        SdkError::ServiceError(service) => {
            DriverError::new(class.code, message).with_source(ServiceError {
                code: service.err().code().unwrap_or("Unknown").to_string(),
                message: service.err().message().unwrap_or("no message").to_string(),
                aws_request_id,
                status: service.raw().status().as_u16(),
            })
        }
        // A connection's, a timeout's or an unreadable answer's causes tell what went wrong.
        err => DriverError::new(class.code, message).with_source(err),
    };
    if let Some(after) = class.retry_after {
        e = e.with_retry_after(after);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_like_gardener_and_the_issue_asks() {
        let cases = [
            ("InsufficientInstanceCapacity", Code::ResourceExhausted),
            ("InstanceLimitExceeded", Code::ResourceExhausted),
            ("VcpuLimitExceeded", Code::ResourceExhausted),
            ("VolumeLimitExceeded", Code::ResourceExhausted),
            ("InsufficientVolumeCapacity", Code::ResourceExhausted),
            // The instance type is not offered in that zone (Gardener: ResourceExhausted, so
            // the autoscaler backs off to another node group).
            ("Unsupported", Code::ResourceExhausted),
            ("UnsupportedOperation", Code::InvalidArgument),
            ("RequestLimitExceeded", Code::Unavailable),
            ("Throttling", Code::Unavailable),
            ("EC2ThrottledException", Code::Unavailable),
            ("RequestExpired", Code::Unavailable),
            ("RequestTimeTooSkewed", Code::Unavailable),
            ("AuthFailure", Code::Unauthenticated),
            ("InvalidClientTokenId", Code::Unauthenticated),
            ("UnauthorizedOperation", Code::PermissionDenied),
            ("InvalidInstanceID.NotFound", Code::NotFound),
            ("InvalidAMIID.NotFound", Code::InvalidArgument),
            ("InvalidAMIID.Malformed", Code::InvalidArgument),
            ("InvalidSubnetID.NotFound", Code::InvalidArgument),
            ("NoSuchEntity", Code::InvalidArgument),
            ("InvalidParameterValue", Code::InvalidArgument),
            ("IdempotentParameterMismatch", Code::AlreadyExists),
            ("IncorrectInstanceState", Code::FailedPrecondition),
            ("InternalError", Code::Internal),
            ("SomethingNew", Code::Internal),
        ];
        for (aws, want) in cases {
            assert_eq!(classify(aws).code, want, "{aws}");
        }
    }

    #[test]
    fn throttling_carries_a_retry_hint_and_capacity_does_not() {
        assert_eq!(
            classify("RequestLimitExceeded").retry_after,
            Some(THROTTLE_RETRY_AFTER)
        );
        assert_eq!(classify("InsufficientInstanceCapacity").retry_after, None);
    }

    #[test]
    fn a_service_error_keeps_code_request_ids_and_source() {
        use aws_sdk_ec2::operation::run_instances::RunInstancesError;
        use aws_smithy_runtime_api::http::StatusCode;
        use aws_smithy_types::body::SdkBody;

        let meta = aws_sdk_ec2::error::ErrorMetadata::builder()
            .code("InsufficientInstanceCapacity")
            .message("no m5.large in eu-west-1a")
            .custom("aws_request_id", "aws-req-1")
            .build();
        let service = RunInstancesError::generic(meta);
        let raw = HttpResponse::new(StatusCode::try_from(500).unwrap(), SdkBody::empty());
        let err = SdkError::service_error(service, raw);
        let id = RequestId::from_string("mcm-req-1");
        let e = from_sdk("RunInstances", &id, err);
        assert_eq!(e.code, Code::ResourceExhausted);
        for want in [
            "RunInstances",
            "InsufficientInstanceCapacity",
            "no m5.large",
            "aws-req-1",
            "mcm-req-1",
        ] {
            assert!(e.message.contains(want), "{want} in {}", e.message);
        }
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(
            source.downcast_ref::<ServiceError>(),
            Some(&ServiceError {
                code: "InsufficientInstanceCapacity".into(),
                message: "no m5.large in eu-west-1a".into(),
                aws_request_id: "aws-req-1".into(),
                status: 500,
            }),
            "EC2's answer is the source"
        );
        // An Event reads EC2's answer once, not the SDK's wrappers of it.
        assert_eq!(
            e.full_message(),
            format!("ResourceExhausted: {}", e.message),
            "nothing repeated after the message"
        );
    }
}
