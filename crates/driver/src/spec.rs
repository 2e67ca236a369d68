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

    /// The problems as a list for the admission webhook: a decode error becomes one problem
    /// of `providerSpec` that says why the JSON does not decode.
    pub fn into_problems(self) -> Vec<SpecProblem> {
        match self {
            SpecError::Decode { provider, source } => vec![SpecProblem::new(
                "providerSpec",
                format!("is not a valid {provider} providerSpec: {source}"),
            )],
            SpecError::Invalid { problems, .. } => problems,
        }
    }

    /// An `InvalidArgument` driver error with this error as its source.
    pub fn into_driver_error(self) -> DriverError {
        DriverError::new(Code::InvalidArgument, self.to_string()).with_source(self)
    }
}

/// Whether a class is for `provider` (e.g. `AWS`): its `provider` field names it (compared
/// without case) or is absent. A driver's [`crate::Driver::validate_machine_class`] accepts the
/// classes of other providers, which share the namespace in some installations.
pub fn is_for_provider(class: &mcm_api::MachineClass, provider: &str) -> bool {
    class
        .provider
        .as_deref()
        .map(str::trim)
        .is_none_or(|p| p.is_empty() || p.eq_ignore_ascii_case(provider))
}

/// The problems of a class for [`crate::Driver::validate_machine_class`] by a driver's own
/// decoder and rules: none for a class of another provider, the decode error as one problem
/// of `providerSpec`, else every problem `validate` finds.
pub fn class_problems<S>(
    class: &mcm_api::MachineClass,
    provider: &str,
    decode: impl FnOnce(&mcm_api::MachineClass) -> Result<S, SpecError>,
    validate: impl FnOnce(&S) -> Vec<SpecProblem>,
) -> Vec<SpecProblem> {
    if !is_for_provider(class, provider) {
        return Vec::new();
    }
    match decode(class) {
        Ok(spec) => validate(&spec),
        Err(e) => e.into_problems(),
    }
}

/// The root of the paths of a providerSpec's keys.
pub const PROVIDER_SPEC: &str = "providerSpec";

/// Decodes a class's `providerSpec` into `S` as the provider's Go driver decodes it
/// ([`crate::gojson::go_decode`]: keys matched ignoring case, unknown keys ignored and
/// reported); a value of the wrong type is [`SpecError::Decode`].
pub fn decode_provider_spec<S: serde::de::DeserializeOwned>(
    class: &mcm_api::MachineClass,
    provider: &'static str,
) -> Result<crate::GoDecoded<S>, SpecError> {
    crate::gojson::go_decode(&class.provider_spec, PROVIDER_SPEC)
        .map_err(|source| SpecError::Decode { provider, source })
}

/// The warnings of a class for [`crate::Driver::machine_class_warnings`]: the keys of its
/// `providerSpec` that decoding into `S` ignores. None for a class of another provider or
/// one that does not decode (that is a problem, reported by validation).
pub fn class_warnings<S: serde::de::DeserializeOwned>(
    class: &mcm_api::MachineClass,
    provider: &'static str,
) -> Vec<String> {
    if !is_for_provider(class, provider) {
        return Vec::new();
    }
    decode_provider_spec::<S>(class, provider)
        .map(|d| d.unknown.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_for_the_provider_it_names_or_for_any_when_it_names_none() {
        let mut class = mcm_api::MachineClass::default();
        assert!(is_for_provider(&class, "AWS"));
        class.provider = Some("aws".into());
        assert!(is_for_provider(&class, "AWS"));
        class.provider = Some("GCP".into());
        assert!(!is_for_provider(&class, "AWS"));
    }

    #[test]
    fn a_decode_error_is_one_problem_of_the_provider_spec() {
        let decode = SpecError::Decode {
            provider: "AWS",
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        let problems = decode.into_problems();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field, "providerSpec");
        assert!(
            problems[0]
                .detail
                .starts_with("is not a valid AWS providerSpec: ")
        );
    }

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
