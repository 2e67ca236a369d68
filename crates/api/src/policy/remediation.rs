//! The remediation annotations of a MachineDeployment (mcm-rs additions), as the machine
//! controller applies them and the admission webhook checks them. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::constants::annotations::policy;
use crate::intstr::{IntOrPercentError, scaled_value};

/// The remediation annotations of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemediationPolicy {
    /// [`policy::MAX_IN_FLIGHT`]
    pub max_in_flight: Option<IntOrString>,
    /// [`policy::MAX_UNHEALTHY`]
    pub max_unhealthy: Option<IntOrString>,
}

/// A remediation annotation that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {source}")]
pub struct PolicyError {
    /// The annotation.
    pub annotation: &'static str,
    /// Why.
    #[source]
    pub source: IntOrPercentError,
}

/// An annotation value as an int-or-percent (`"3"` is a count, `"25%"` a percentage).
fn int_or_percent(value: &str) -> IntOrString {
    let v = value.trim();
    v.parse::<i32>()
        .map_or_else(|_| IntOrString::String(v.to_string()), IntOrString::Int)
}

/// Reads the remediation annotations of a deployment; a value that does not resolve is an
/// error naming the annotation.
pub fn policy_of(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<RemediationPolicy, PolicyError> {
    let read = |annotation: &'static str| -> Result<Option<IntOrString>, PolicyError> {
        let Some(value) = annotations.and_then(|a| a.get(annotation)) else {
            return Ok(None);
        };
        let v = int_or_percent(value);
        scaled_value(&v, 100, true).map_err(|source| PolicyError { annotation, source })?;
        Ok(Some(v))
    };
    Ok(RemediationPolicy {
        max_in_flight: read(policy::MAX_IN_FLIGHT)?,
        max_unhealthy: read(policy::MAX_UNHEALTHY)?,
    })
}
