//! Mapping EC2 errors to MCM's codes.
//!
//! [`classify`] maps an EC2 error code (`InsufficientInstanceCapacity`, ...) to a [`Code`] and
//! a retry hint; [`from_ec2`] turns an EC2 client error into a [`DriverError`] whose message names
//! the EC2 operation, the AWS error code, the AWS request id and the driver's request id, and
//! whose source is the client's error itself.

use std::time::Duration;

use mcm_driver::{Code, DriverError, RequestId};

use crate::client::Ec2Error;

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

/// Throttling and service-side unavailability (`Unavailable`, retry later).
pub const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ServiceUnavailable",
    "Unavailable",
];

/// Bad or missing credentials (`Unauthenticated`).
pub const UNAUTHENTICATED_CODES: &[&str] = &[
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "MissingAuthenticationToken",
    "IncompleteSignature",
    "ExpiredToken",
    "RequestExpired",
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
    if THROTTLING_CODES.contains(&aws_code) {
        return Classification {
            code: Code::Unavailable,
            retry_after: Some(THROTTLE_RETRY_AFTER),
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

/// Turns an error of the EC2 operation `operation` into a [`DriverError`] keeping it as its
/// source. The message carries the AWS error code and message, the AWS request id and the
/// driver's request id; the error's own causes (a connection's, an unreadable answer's)
/// follow in [`DriverError::full_message`].
pub fn from_ec2(operation: &'static str, request_id: &RequestId, err: Ec2Error) -> DriverError {
    let aws_request_id = err.aws_request_id().unwrap_or("-").to_string();
    let unreachable = |code| Classification {
        code,
        retry_after: Some(UNREACHABLE_RETRY_AFTER),
    };
    let class = match &err {
        Ec2Error::Service { code, .. } => classify(code),
        Ec2Error::Timeout(_) => unreachable(Code::DeadlineExceeded),
        Ec2Error::Transport(c) if c.is_user() => Classification::code(Code::InvalidArgument),
        Ec2Error::Transport(_) => unreachable(Code::Unavailable),
        Ec2Error::Response { status, .. } if *status >= 500 => unreachable(Code::Unavailable),
        Ec2Error::Credentials(_) => Classification {
            code: Code::Unauthenticated,
            retry_after: Some(UNREACHABLE_RETRY_AFTER),
        },
        Ec2Error::Endpoint { .. } => Classification::code(Code::InvalidArgument),
        Ec2Error::Response { .. }
        | Ec2Error::SigningParams(_)
        | Ec2Error::Signing(_)
        | Ec2Error::Request(_) => Classification::code(Code::Internal),
    };
    let mut e = DriverError::new(
        class.code,
        format!(
            "EC2 {operation} failed: {err} (AWS request id {aws_request_id}, request id {request_id})"
        ),
    )
    .with_source(err);
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
            ("AuthFailure", Code::Unauthenticated),
            ("InvalidClientTokenId", Code::Unauthenticated),
            ("UnauthorizedOperation", Code::PermissionDenied),
            ("InvalidInstanceID.NotFound", Code::NotFound),
            ("InvalidAMIID.NotFound", Code::InvalidArgument),
            ("InvalidAMIID.Malformed", Code::InvalidArgument),
            ("InvalidSubnetID.NotFound", Code::InvalidArgument),
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
        let err = Ec2Error::Service {
            code: "InsufficientInstanceCapacity".into(),
            message: "no m5.large in eu-west-1a".into(),
            aws_request_id: Some("aws-req-1".into()),
            status: 500,
        };
        let id = RequestId::from_string("mcm-req-1");
        let e = from_ec2("RunInstances", &id, err);
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
        assert!(
            source.downcast_ref::<Ec2Error>().is_some(),
            "the client's error is the source"
        );
        // An answer that is not EC2's: the message says so once, its cause follows once.
        let xml = crate::xml::parse("<a>").unwrap_err();
        let e = from_ec2(
            "DescribeInstances",
            &id,
            Ec2Error::Response {
                status: 502,
                source: crate::client::ResponseError::Xml(xml),
            },
        );
        assert_eq!(e.code, Code::Unavailable);
        let full = e.full_message();
        assert_eq!(full.matches("not an EC2 answer").count(), 1, "{full}");
        assert_eq!(full.matches("is not closed").count(), 1, "{full}");
        let timeout = from_ec2(
            "DescribeInstances",
            &id,
            Ec2Error::Timeout(Duration::from_secs(1)),
        );
        assert_eq!(timeout.code, Code::DeadlineExceeded);
        assert_eq!(timeout.retry_after, Some(UNREACHABLE_RETRY_AFTER));
    }
}
