//! Int-or-percent resolution with Kubernetes Deployment semantics.
//!
//! `maxSurge` rounds percentages **up**, `maxUnavailable` rounds them **down**, and when both
//! resolve to zero `maxUnavailable` becomes 1 so a rollout can always progress (Kubernetes'
//! `ResolveFenceposts`). [`resolve_rolling_update`] adds the checks of Kubernetes' Deployment
//! validation, with errors that name the field and the value (for a status condition).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Why an int-or-percent value could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntOrPercentError {
    /// A string value without a trailing `%`.
    #[error("invalid value {0:?}: a string must be a percentage like \"25%\"")]
    NotAPercentage(String),
    /// The part before `%` is not an integer.
    #[error("invalid percentage {value:?}")]
    InvalidPercentage {
        /// The offending value.
        value: String,
        /// The integer parse error.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A negative number or percentage.
    #[error("value {0:?} must not be negative")]
    Negative(String),
    /// The resolved value does not fit into an `i32`.
    #[error("value {0:?} overflows")]
    Overflow(String),
}

/// Resolves `value` against `total`: integers are taken as is, percentages are scaled and
/// rounded up (`round_up`) or down.
pub fn scaled_value(
    value: &IntOrString,
    total: i32,
    round_up: bool,
) -> Result<i32, IntOrPercentError> {
    match value {
        IntOrString::Int(i) if *i < 0 => Err(IntOrPercentError::Negative(i.to_string())),
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let digits = s
                .strip_suffix('%')
                .ok_or_else(|| IntOrPercentError::NotAPercentage(s.clone()))?;
            let percent: i64 =
                digits
                    .parse()
                    .map_err(|source| IntOrPercentError::InvalidPercentage {
                        value: s.clone(),
                        source,
                    })?;
            if percent < 0 {
                return Err(IntOrPercentError::Negative(s.clone()));
            }
            let product = percent
                .checked_mul(i64::from(total.max(0)))
                .ok_or_else(|| IntOrPercentError::Overflow(s.clone()))?;
            let scaled = if round_up {
                (product + 99) / 100
            } else {
                product / 100
            };
            i32::try_from(scaled).map_err(|_| IntOrPercentError::Overflow(s.clone()))
        }
    }
}

/// Default of `maxSurge` and `maxUnavailable` when unset in a MachineDeployment (MCM: 1).
pub const DEFAULT_MAX_SURGE_AND_UNAVAILABLE: i32 = 1;

/// Resolves a deployment's `(maxSurge, maxUnavailable)` for `desired` replicas.
///
/// Unset values default to [`DEFAULT_MAX_SURGE_AND_UNAVAILABLE`]. Surge rounds up,
/// unavailability rounds down; if both end up 0, unavailability becomes 1.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), IntOrPercentError> {
    let surge = match max_surge {
        Some(v) => scaled_value(v, desired, true)?,
        None => DEFAULT_MAX_SURGE_AND_UNAVAILABLE,
    };
    let unavailable = match max_unavailable {
        Some(v) => scaled_value(v, desired, false)?,
        None => DEFAULT_MAX_SURGE_AND_UNAVAILABLE,
    };
    if surge == 0 && unavailable == 0 {
        return Ok((0, 1));
    }
    Ok((surge, unavailable))
}

/// One of the two limits of a rolling update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollingUpdateLimit {
    /// `spec.strategy.rollingUpdate.maxSurge`.
    MaxSurge,
    /// `spec.strategy.rollingUpdate.maxUnavailable`.
    MaxUnavailable,
}

impl RollingUpdateLimit {
    /// The field path of the limit in a MachineDeployment.
    pub fn path(self) -> &'static str {
        match self {
            RollingUpdateLimit::MaxSurge => "spec.strategy.rollingUpdate.maxSurge",
            RollingUpdateLimit::MaxUnavailable => "spec.strategy.rollingUpdate.maxUnavailable",
        }
    }
}

impl std::fmt::Display for RollingUpdateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// Why the limits of a MachineDeployment's rolling update cannot be used. The message names
/// the field and the value as written (strings quoted, integers bare), e.g.
/// `spec.strategy.rollingUpdate.maxSurge: "abc" is neither an integer nor a percentage like
/// "25%"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollingUpdateError {
    /// A string limit that is not `<digits>%`.
    #[error("{field}: {value} is neither an integer nor a percentage like \"25%\"")]
    NotIntOrPercent {
        /// The limit.
        field: RollingUpdateLimit,
        /// The value as written.
        value: String,
        /// The resolution error.
        #[source]
        source: IntOrPercentError,
    },
    /// A negative integer or percentage.
    #[error("{field}: {value} must not be negative")]
    Negative {
        /// The limit.
        field: RollingUpdateLimit,
        /// The value as written.
        value: String,
        /// The resolution error.
        #[source]
        source: IntOrPercentError,
    },
    /// A percentage whose resolved value does not fit into an `i32`.
    #[error("{field}: {value} of {replicas} replicas is too large")]
    TooLarge {
        /// The limit.
        field: RollingUpdateLimit,
        /// The value as written.
        value: String,
        /// The replicas the percentage was resolved against.
        replicas: i32,
        /// The resolution error.
        #[source]
        source: IntOrPercentError,
    },
    /// Both limits are written as zero (`0` or `0%`): no machine could ever be replaced
    /// (Kubernetes rejects such a Deployment; the CRD's CEL rule does too when installed).
    #[error(
        "spec.strategy.rollingUpdate: maxSurge ({max_surge}) and maxUnavailable \
         ({max_unavailable}) must not both be 0"
    )]
    BothZero {
        /// `maxSurge` as written.
        max_surge: String,
        /// `maxUnavailable` as written.
        max_unavailable: String,
    },
}

impl RollingUpdateError {
    /// The limit at fault; `None` when only the combination of both is invalid.
    pub fn field(&self) -> Option<RollingUpdateLimit> {
        match self {
            RollingUpdateError::NotIntOrPercent { field, .. }
            | RollingUpdateError::Negative { field, .. }
            | RollingUpdateError::TooLarge { field, .. } => Some(*field),
            RollingUpdateError::BothZero { .. } => None,
        }
    }
}

/// An int-or-string as written in YAML/JSON: integers bare, strings quoted.
fn as_written(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => format!("{s:?}"),
    }
}

/// Whether a value is written as zero (`0`, `"0%"`, `"00%"`): Kubernetes' validation looks
/// at the written number, not at the value resolved for the current replicas.
fn written_zero(value: &IntOrString) -> bool {
    match value {
        IntOrString::Int(i) => *i == 0,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|d| d.parse::<i64>().ok())
            .is_some_and(|p| p == 0),
    }
}

fn resolve_limit(
    field: RollingUpdateLimit,
    value: Option<&IntOrString>,
    desired: i32,
) -> Result<i32, RollingUpdateError> {
    let Some(value) = value else {
        return Ok(DEFAULT_MAX_SURGE_AND_UNAVAILABLE);
    };
    let round_up = field == RollingUpdateLimit::MaxSurge;
    scaled_value(value, desired, round_up).map_err(|source| {
        let value = as_written(value);
        match source {
            IntOrPercentError::NotAPercentage(_) | IntOrPercentError::InvalidPercentage { .. } => {
                RollingUpdateError::NotIntOrPercent {
                    field,
                    value,
                    source,
                }
            }
            IntOrPercentError::Negative(_) => RollingUpdateError::Negative {
                field,
                value,
                source,
            },
            IntOrPercentError::Overflow(_) => RollingUpdateError::TooLarge {
                field,
                value,
                replicas: desired,
                source,
            },
        }
    })
}

/// Validates and resolves a MachineDeployment's rolling-update limits for `desired`
/// replicas: [`resolve_fenceposts`] plus the checks of Kubernetes' Deployment validation, with
/// errors that name the field and the value.
///
/// Invalid: a limit that is neither a non-negative integer nor a non-negative percentage, a
/// percentage too large to resolve, and both limits written as zero. Values that merely
/// *resolve* to zero together (e.g. `maxSurge: 0`, `maxUnavailable: "10%"` of 5 replicas)
/// are valid and get Kubernetes' fencepost: `maxUnavailable` becomes 1.
pub fn resolve_rolling_update(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), RollingUpdateError> {
    let surge = resolve_limit(RollingUpdateLimit::MaxSurge, max_surge, desired)?;
    let unavailable = resolve_limit(RollingUpdateLimit::MaxUnavailable, max_unavailable, desired)?;
    if let (Some(s), Some(u)) = (max_surge, max_unavailable)
        && written_zero(s)
        && written_zero(u)
    {
        return Err(RollingUpdateError::BothZero {
            max_surge: as_written(s),
            max_unavailable: as_written(u),
        });
    }
    if surge == 0 && unavailable == 0 {
        return Ok((0, 1));
    }
    Ok((surge, unavailable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn int(i: i32) -> IntOrString {
        IntOrString::Int(i)
    }

    fn s(v: &str) -> IntOrString {
        IntOrString::String(v.to_owned())
    }

    #[test]
    fn scales_values() {
        let cases = [
            (int(3), 10, true, 3),
            (int(0), 10, false, 0),
            (s("25%"), 10, true, 3),
            (s("25%"), 10, false, 2),
            (s("0%"), 10, true, 0),
            (s("100%"), 7, false, 7),
            (s("30%"), 1, true, 1),
            (s("30%"), 1, false, 0),
            (s("50%"), 0, true, 0),
        ];
        for (value, total, up, want) in cases {
            assert_eq!(
                scaled_value(&value, total, up),
                Ok(want),
                "{value:?} of {total}, up={up}"
            );
        }
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(
            scaled_value(&s("25"), 10, true),
            Err(IntOrPercentError::NotAPercentage("25".into()))
        );
        assert!(matches!(
            scaled_value(&s("x%"), 10, true),
            Err(IntOrPercentError::InvalidPercentage { .. })
        ));
        assert!(matches!(
            scaled_value(&s("%"), 10, true),
            Err(IntOrPercentError::InvalidPercentage { .. })
        ));
        assert_eq!(
            scaled_value(&s("-5%"), 10, true),
            Err(IntOrPercentError::Negative("-5%".into()))
        );
        assert_eq!(
            scaled_value(&int(-1), 10, true),
            Err(IntOrPercentError::Negative("-1".into()))
        );
        assert_eq!(
            scaled_value(&s("9999999999999999%"), i32::MAX, true),
            Err(IntOrPercentError::Overflow("9999999999999999%".into()))
        );
        let err = scaled_value(&s("x%"), 1, true).expect_err("invalid");
        assert!(
            std::error::Error::source(&err).is_some(),
            "keeps the parse error"
        );
    }

    #[test]
    fn resolves_fenceposts() {
        let cases = [
            (Some(int(1)), Some(int(0)), 3, (1, 0)),
            (Some(int(0)), Some(int(0)), 3, (0, 1)),
            (Some(s("0%")), Some(s("0%")), 3, (0, 1)),
            (Some(s("25%")), Some(s("25%")), 3, (1, 0)),
            (Some(s("10%")), Some(s("10%")), 5, (1, 0)),
            (Some(s("10%")), Some(s("20%")), 5, (1, 1)),
            (Some(s("10%")), Some(s("10%")), 0, (0, 1)),
            (None, None, 10, (1, 1)),
            (None, Some(int(0)), 10, (1, 0)),
        ];
        for (surge, unavailable, desired, want) in cases {
            assert_eq!(
                resolve_fenceposts(surge.as_ref(), unavailable.as_ref(), desired),
                Ok(want),
                "surge {surge:?} unavailable {unavailable:?} desired {desired}"
            );
        }
        assert!(resolve_fenceposts(Some(&s("1")), None, 3).is_err());
        assert!(resolve_fenceposts(None, Some(&s("a%")), 3).is_err());
    }

    #[test]
    fn rolling_update_limits_resolve_like_fenceposts() {
        let cases = [
            (Some(int(1)), Some(int(0)), 3, (1, 0)),
            (Some(s("25%")), Some(s("25%")), 3, (1, 0)),
            (Some(s("10%")), Some(s("20%")), 5, (1, 1)),
            (Some(s("10%")), Some(s("10%")), 0, (0, 1)),
            (Some(int(0)), Some(s("10%")), 5, (0, 1)),
            (None, None, 10, (1, 1)),
            (None, Some(int(0)), 10, (1, 0)),
            (Some(int(0)), None, 10, (0, 1)),
        ];
        for (surge, unavailable, desired, want) in cases {
            let got = resolve_rolling_update(surge.as_ref(), unavailable.as_ref(), desired);
            assert_eq!(
                got,
                Ok(want),
                "surge {surge:?} unavailable {unavailable:?} desired {desired}"
            );
            assert_eq!(
                got.ok(),
                resolve_fenceposts(surge.as_ref(), unavailable.as_ref(), desired).ok(),
                "agrees with resolve_fenceposts"
            );
        }
    }

    #[test]
    fn invalid_rolling_update_limits_name_field_and_value() {
        let cases: [(Option<IntOrString>, Option<IntOrString>, &str); 8] = [
            (
                Some(s("abc")),
                Some(int(0)),
                r#"spec.strategy.rollingUpdate.maxSurge: "abc" is neither an integer nor a percentage like "25%""#,
            ),
            (
                None,
                Some(s("1")),
                r#"spec.strategy.rollingUpdate.maxUnavailable: "1" is neither an integer nor a percentage like "25%""#,
            ),
            (
                Some(s("x%")),
                None,
                r#"spec.strategy.rollingUpdate.maxSurge: "x%" is neither an integer nor a percentage like "25%""#,
            ),
            (
                Some(int(-1)),
                None,
                "spec.strategy.rollingUpdate.maxSurge: -1 must not be negative",
            ),
            (
                Some(int(1)),
                Some(s("-5%")),
                r#"spec.strategy.rollingUpdate.maxUnavailable: "-5%" must not be negative"#,
            ),
            (
                Some(s("9999999999999%")),
                None,
                r#"spec.strategy.rollingUpdate.maxSurge: "9999999999999%" of 3 replicas is too large"#,
            ),
            (
                Some(int(0)),
                Some(int(0)),
                "spec.strategy.rollingUpdate: maxSurge (0) and maxUnavailable (0) must not both be 0",
            ),
            (
                Some(s("0%")),
                Some(s("00%")),
                r#"spec.strategy.rollingUpdate: maxSurge ("0%") and maxUnavailable ("00%") must not both be 0"#,
            ),
        ];
        for (surge, unavailable, want) in cases {
            let err = resolve_rolling_update(surge.as_ref(), unavailable.as_ref(), 3)
                .expect_err("invalid limits");
            assert_eq!(err.to_string(), want);
        }
        let err = resolve_rolling_update(Some(&s("abc")), None, 3).expect_err("invalid");
        assert_eq!(err.field(), Some(RollingUpdateLimit::MaxSurge));
        assert!(
            std::error::Error::source(&err).is_some(),
            "keeps the resolution error"
        );
        let both = resolve_rolling_update(Some(&int(0)), Some(&int(0)), 3).expect_err("invalid");
        assert_eq!(both.field(), None);
    }
}
