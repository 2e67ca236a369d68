//! Per-condition health rules and the node-startup timeout (mcm-rs additions), as the
//! machine controller applies them and the admission webhook checks them. Pure.
//!
//! A rule `Type=Status:duration` fails a machine whose Node has had condition `Type` with
//! status `Status` for `duration` (counted from the condition's last transition), without
//! waiting for the health timeout. A condition that matches a rule also makes the machine
//! unhealthy (Unknown) at once, like `--node-conditions`. Rules come from the Machine's
//! annotation, else its MachineDeployment's, else `--unhealthy-conditions`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::constants::annotations::policy;
use crate::duration::{DurationError, format_go_duration, parse_go_duration};

/// One per-condition health rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionRule {
    /// The Node condition type, e.g. `Ready`.
    pub type_: String,
    /// The status that is unhealthy: `True`, `False` or `Unknown`.
    pub status: String,
    /// How long the condition may hold that status before the machine fails.
    pub timeout: Duration,
}

impl fmt::Display for ConditionRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} for {}",
            self.type_,
            self.status,
            format_go_duration(self.timeout)
        )
    }
}

/// Why a health-rule or node-startup value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A rule is not of the form `Type=Status:duration`.
    #[error("rule {0:?} is not of the form Type=Status:duration (e.g. Ready=Unknown:5m)")]
    Malformed(String),
    /// The status is not `True`, `False` or `Unknown`.
    #[error("rule {rule:?}: status {status:?} must be True, False or Unknown")]
    Status {
        /// The rule as written.
        rule: String,
        /// The status as written.
        status: String,
    },
    /// The duration does not parse.
    #[error("rule {rule:?}: invalid duration")]
    Duration {
        /// The rule (or value) as written.
        rule: String,
        /// The parse error.
        #[source]
        source: DurationError,
    },
    /// `Ready=True` would fail every healthy machine.
    #[error("rule {0:?} would fail every healthy machine")]
    ReadyTrue(String),
}

/// Parses a comma-separated list of rules (blank entries are ignored).
pub fn parse_rules(value: &str) -> Result<Vec<ConditionRule>, RuleError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(parse_rule)
        .collect()
}

fn parse_rule(rule: &str) -> Result<ConditionRule, RuleError> {
    let malformed = || RuleError::Malformed(rule.to_string());
    let (type_, rest) = rule.split_once('=').ok_or_else(malformed)?;
    let (status, duration) = rest.split_once(':').ok_or_else(malformed)?;
    let (type_, status, duration) = (type_.trim(), status.trim(), duration.trim());
    if type_.is_empty() || duration.is_empty() {
        return Err(malformed());
    }
    if !matches!(status, "True" | "False" | "Unknown") {
        return Err(RuleError::Status {
            rule: rule.to_string(),
            status: status.to_string(),
        });
    }
    if type_ == "Ready" && status == "True" {
        return Err(RuleError::ReadyTrue(rule.to_string()));
    }
    let timeout = parse_go_duration(duration).map_err(|source| RuleError::Duration {
        rule: rule.to_string(),
        source,
    })?;
    Ok(ConditionRule {
        type_: type_.to_string(),
        status: status.to_string(),
        timeout,
    })
}

/// Parses a node-startup timeout (`0s` turns it off).
pub fn parse_node_startup_timeout(value: &str) -> Result<Option<Duration>, RuleError> {
    let d = parse_go_duration(value.trim()).map_err(|source| RuleError::Duration {
        rule: value.to_string(),
        source,
    })?;
    Ok((!d.is_zero()).then_some(d))
}

/// The health policy of one machine, before the flags' defaults apply: `None` where neither
/// the Machine nor its deployment sets a value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthOverrides {
    /// [`policy::UNHEALTHY_CONDITIONS`]
    pub unhealthy_conditions: Option<Vec<ConditionRule>>,
    /// [`policy::NODE_STARTUP_TIMEOUT`] (`Some(None)`: turned off).
    pub node_startup_timeout: Option<Option<Duration>>,
}

/// Reads the health annotations of a Machine, falling back to its deployment's, per key.
/// A value that does not parse is an error naming the annotation (the machine controller
/// reports it; the webhook refuses it).
pub fn overrides(
    machine: Option<&BTreeMap<String, String>>,
    deployment: Option<&BTreeMap<String, String>>,
) -> Result<HealthOverrides, (String, RuleError)> {
    let pick = |key: &str| {
        machine
            .and_then(|a| a.get(key))
            .or_else(|| deployment.and_then(|a| a.get(key)))
    };
    let unhealthy_conditions = pick(policy::UNHEALTHY_CONDITIONS)
        .map(|v| parse_rules(v).map_err(|e| (policy::UNHEALTHY_CONDITIONS.to_string(), e)))
        .transpose()?;
    let node_startup_timeout = pick(policy::NODE_STARTUP_TIMEOUT)
        .map(|v| {
            parse_node_startup_timeout(v).map_err(|e| (policy::NODE_STARTUP_TIMEOUT.to_string(), e))
        })
        .transpose()?;
    Ok(HealthOverrides {
        unhealthy_conditions,
        node_startup_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(t: &str, s: &str, secs: u64) -> ConditionRule {
        ConditionRule {
            type_: t.into(),
            status: s.into(),
            timeout: Duration::from_secs(secs),
        }
    }

    #[test]
    fn rules_parse_and_name_what_is_wrong() {
        assert_eq!(
            parse_rules(" Ready=Unknown:5m, KernelDeadlock=True:1m30s ,").unwrap(),
            vec![
                rule("Ready", "Unknown", 300),
                rule("KernelDeadlock", "True", 90)
            ]
        );
        assert_eq!(parse_rules("").unwrap(), vec![]);
        let cases = [
            ("Ready", "not of the form"),
            ("Ready=Unknown", "not of the form"),
            ("=True:1m", "not of the form"),
            ("Ready=Maybe:1m", "must be True, False or Unknown"),
            ("Ready=False:soon", "invalid duration"),
            ("Ready=True:1m", "would fail every healthy machine"),
        ];
        for (value, want) in cases {
            let err = parse_rules(value).unwrap_err().to_string();
            assert!(err.contains(want), "{value}: {err}");
        }
        assert_eq!(
            rule("Ready", "Unknown", 300).to_string(),
            "Ready=Unknown for 5m0s"
        );
    }

    #[test]
    fn the_machine_wins_over_its_deployment_per_key() {
        let m: BTreeMap<String, String> =
            [(policy::NODE_STARTUP_TIMEOUT.to_string(), "2m".to_string())].into();
        let d: BTreeMap<String, String> = [
            (policy::NODE_STARTUP_TIMEOUT.to_string(), "9m".to_string()),
            (
                policy::UNHEALTHY_CONDITIONS.to_string(),
                "Ready=False:1m".to_string(),
            ),
        ]
        .into();
        let o = overrides(Some(&m), Some(&d)).unwrap();
        assert_eq!(o.node_startup_timeout, Some(Some(Duration::from_secs(120))));
        assert_eq!(
            o.unhealthy_conditions,
            Some(vec![rule("Ready", "False", 60)])
        );
        assert_eq!(overrides(None, None).unwrap(), HealthOverrides::default());
        let off: BTreeMap<String, String> =
            [(policy::NODE_STARTUP_TIMEOUT.to_string(), "0s".to_string())].into();
        assert_eq!(
            overrides(Some(&off), None).unwrap().node_startup_timeout,
            Some(None)
        );
        let bad: BTreeMap<String, String> = [(
            policy::UNHEALTHY_CONDITIONS.to_string(),
            "Ready".to_string(),
        )]
        .into();
        assert_eq!(
            overrides(Some(&bad), None).unwrap_err().0,
            policy::UNHEALTHY_CONDITIONS
        );
    }
}
