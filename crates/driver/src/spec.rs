//! Problems of a MachineClass's `providerSpec` or secret, as drivers report them.
//!
//! A driver validates a class before it calls its cloud and reports *every* problem at once,
//! each naming its field (`providerSpec.disks[0].image: image is required for boot disk`), so
//! a user fixes a class in one round. [`SpecError`] carries them (or the JSON error of a spec
//! that does not decode) as the source of an `InvalidArgument` [`crate::DriverError`]
//! ([`SpecError::into_driver_error`]).

use std::fmt;

use crate::{Code, DriverError};

/// One problem of a spec or secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The field path, e.g. `providerSpec.disks[0].image` or `secretRef.userData`.
    pub field: String,
    /// What is wrong.
    pub detail: String,
}

impl SpecProblem {
    /// A problem of `field`.
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        SpecProblem {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// A providerSpec or secret that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The providerSpec is not the provider's JSON shape.
    #[error("providerSpec is not a valid {provider} providerSpec")]
    Decode {
        /// The provider, e.g. `GCP`.
        provider: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The spec decoded but has problems.
    #[error("invalid {provider} machine class: {}", join(.problems))]
    Invalid {
        /// The provider, e.g. `GCP`.
        provider: &'static str,
        /// Every problem.
        problems: Vec<SpecProblem>,
    },
}

/// The problems joined with `; `.
pub fn join(problems: &[SpecProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl SpecError {
    /// The problems (empty for a decode error).
    pub fn problems(&self) -> &[SpecProblem] {
        match self {
            SpecError::Decode { .. } => &[],
            SpecError::Invalid { problems, .. } => problems,
        }
    }

    /// An `InvalidArgument` driver error with this error as its source.
    pub fn into_driver_error(self) -> DriverError {
        DriverError::new(Code::InvalidArgument, self.to_string()).with_source(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_fields_and_keep_the_source() {
        let e = SpecError::Invalid {
            provider: "GCP",
            problems: vec![
                SpecProblem::new("providerSpec.zone", "zone is required"),
                SpecProblem::new("secretRef.userData", "is required"),
            ],
        };
        assert_eq!(e.problems().len(), 2);
        let d = e.into_driver_error();
        assert_eq!(d.code, Code::InvalidArgument);
        assert_eq!(
            d.message,
            "invalid GCP machine class: providerSpec.zone: zone is required; secretRef.userData: is required"
        );
        assert!(d.source.is_some());
        let decode = SpecError::Decode {
            provider: "AWS",
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        assert_eq!(
            decode.to_string(),
            "providerSpec is not a valid AWS providerSpec"
        );
        assert!(decode.problems().is_empty());
    }
}
