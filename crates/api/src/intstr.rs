//! Int-or-percent resolution with Kubernetes Deployment semantics.
//!
//! `maxSurge` rounds percentages **up**, `maxUnavailable` rounds them **down**, and when both
//! resolve to zero `maxUnavailable` becomes 1 so a rollout can always progress (Kubernetes'
//! `ResolveFenceposts`).

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
}
