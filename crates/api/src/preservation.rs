//! Machine preservation (upstream's `node.machine.sapcloud.io/preserve`): the pure rules that
//! the machine controller and the MachineSet controller share.
//!
//! A Failed machine that is preserved is kept (not replaced) until its
//! `status.currentStatus.preserveExpiryTime`; its Node is tainted and drained so that it can be
//! inspected. The annotation may sit on the Machine or on its Node; the Node's value wins.

use jiff::Timestamp;

use crate::constants::annotations::{self, preserve_values};
use crate::{Machine, MachinePhase};

/// A value of the preserve annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreserveValue {
    /// `now`: preserve whatever the phase.
    Now,
    /// `when-failed`: preserve once the machine is Failed.
    WhenFailed,
    /// `auto-preserved`: preserved by the MachineSet (`autoPreserveFailedMachineMax`).
    AutoPreserved,
    /// `false`: never preserve; stops a preservation.
    False,
}

impl PreserveValue {
    /// Parses an annotation value; `None` for anything upstream does not allow (the empty
    /// string included).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            preserve_values::NOW => Some(Self::Now),
            preserve_values::WHEN_FAILED => Some(Self::WhenFailed),
            preserve_values::AUTO_PRESERVED => Some(Self::AutoPreserved),
            preserve_values::FALSE => Some(Self::False),
            _ => None,
        }
    }

    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Now => preserve_values::NOW,
            Self::WhenFailed => preserve_values::WHEN_FAILED,
            Self::AutoPreserved => preserve_values::AUTO_PRESERVED,
            Self::False => preserve_values::FALSE,
        }
    }
}

/// The preserve value in effect for a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effective {
    /// No preservation asked for (or it was withdrawn).
    Unset,
    /// A valid value.
    Value(PreserveValue),
    /// The Node carries a value upstream does not allow: preservation is left as it is
    /// (upstream skips the whole step) until it is corrected.
    InvalidOnNode(String),
}

/// What the preserve annotations say, as seen on the Machine and its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations<'a> {
    /// The Machine's `node.machine.sapcloud.io/preserve`.
    pub machine: Option<&'a str>,
    /// The Node's `node.machine.sapcloud.io/preserve`, `None` when the Node has none or
    /// does not exist.
    pub node: Option<&'a str>,
    /// The Machine's `node.machine.sapcloud.io/last-applied-node-preserve-value`.
    pub last_applied_node: Option<&'a str>,
}

impl<'a> Annotations<'a> {
    /// The annotations of `machine` and of its Node (`node_annotation`: the Node's value).
    pub fn of(machine: &'a Machine, node_annotation: Option<&'a str>) -> Self {
        let get = |k: &str| {
            machine
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .map(String::as_str)
        };
        Annotations {
            machine: get(annotations::PRESERVE),
            node: node_annotation,
            last_applied_node: get(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE),
        }
    }
}

/// The value in effect (upstream's `getEffectivePreservationAnnotations`): the Node's value
/// once a Node value was ever applied (its removal then withdraws the preservation), else the
/// Machine's. An invalid Machine value counts as none.
pub fn effective(a: &Annotations<'_>) -> Effective {
    let node = a.node.unwrap_or("");
    let last = a.last_applied_node.unwrap_or("");
    let raw = if node.is_empty() && last.is_empty() {
        match a.machine.and_then(PreserveValue::parse) {
            Some(v) => return Effective::Value(v),
            None => return Effective::Unset,
        }
    } else {
        node
    };
    if raw.is_empty() {
        return Effective::Unset;
    }
    match PreserveValue::parse(raw) {
        Some(v) => Effective::Value(v),
        None => Effective::InvalidOnNode(raw.to_string()),
    }
}

/// `status.currentStatus.preserveExpiryTime`.
pub fn expiry(machine: &Machine) -> Option<Timestamp> {
    machine
        .status
        .as_ref()?
        .current_status
        .as_ref()?
        .preserve_expiry_time
        .as_ref()
        .map(|t| t.0)
}

/// Preserved now: an expiry in the future.
pub fn is_preserved(machine: &Machine, now: Timestamp) -> bool {
    expiry(machine).is_some_and(|t| t > now)
}

/// Failed and preserved (counted in `preservedFailedReplicas`, not among the failed machines
/// to replace). As upstream: any expiry set counts.
pub fn is_preserved_failed(machine: &Machine) -> bool {
    machine.phase() == Some(&MachinePhase::Failed) && expiry(machine).is_some()
}

/// Whether a Failed machine is to be deleted (and replaced) by its MachineSet (upstream's
/// `shouldFailedMachineBeTerminated`): an expiry decides when it is set; without one, a
/// valid preserve value other than `false` keeps the machine (its preservation is starting).
pub fn failed_machine_to_terminate(
    machine: &Machine,
    node_annotation: Option<&str>,
    now: Timestamp,
) -> bool {
    if let Some(t) = expiry(machine) {
        return t <= now;
    }
    !matches!(
        effective(&Annotations::of(machine, node_annotation)),
        Effective::Value(
            PreserveValue::Now | PreserveValue::WhenFailed | PreserveValue::AutoPreserved
        )
    )
}

/// The Machine's own annotation is a valid preserve value (such a machine is never
/// auto-preserved: a user decided).
pub fn has_own_preserve_value(machine: &Machine) -> bool {
    Annotations::of(machine, None)
        .machine
        .and_then(PreserveValue::parse)
        .is_some()
}

/// The Machine carries `auto-preserved`.
pub fn is_auto_preserved(machine: &Machine) -> bool {
    Annotations::of(machine, None).machine == Some(preserve_values::AUTO_PRESERVED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CurrentStatus, MachineSpec, MachineStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn a<'a>(m: Option<&'a str>, n: Option<&'a str>, l: Option<&'a str>) -> Annotations<'a> {
        Annotations {
            machine: m,
            node: n,
            last_applied_node: l,
        }
    }

    #[test]
    fn the_node_wins_once_it_had_a_value() {
        use PreserveValue::*;
        assert_eq!(effective(&a(None, None, None)), Effective::Unset);
        assert_eq!(
            effective(&a(Some("now"), None, None)),
            Effective::Value(Now)
        );
        assert_eq!(effective(&a(Some("bogus"), None, None)), Effective::Unset);
        assert_eq!(
            effective(&a(Some("now"), Some("when-failed"), None)),
            Effective::Value(WhenFailed)
        );
        // The Node's value was applied and then removed: withdrawn, whatever the Machine says.
        assert_eq!(
            effective(&a(Some("now"), None, Some("now"))),
            Effective::Unset
        );
        assert_eq!(
            effective(&a(None, Some("later"), None)),
            Effective::InvalidOnNode("later".into())
        );
        assert_eq!(
            effective(&a(None, Some("false"), None)),
            Effective::Value(False)
        );
    }

    fn machine(phase: &str, expiry: Option<&str>, annotation: Option<&str>) -> Machine {
        let mut m = Machine::new("m", MachineSpec::default());
        m.status = Some(MachineStatus {
            current_status: Some(CurrentStatus {
                phase: Some(MachinePhase::from(phase.to_string())),
                preserve_expiry_time: expiry.map(|t| Time(t.parse().unwrap())),
                ..CurrentStatus::default()
            }),
            ..MachineStatus::default()
        });
        if let Some(v) = annotation {
            m.metadata.annotations =
                Some([(annotations::PRESERVE.to_string(), v.to_string())].into());
        }
        m
    }

    #[test]
    fn a_failed_machine_is_kept_while_preserved_or_starting_to_be() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let later = Some("2026-01-02T00:00:00Z");
        let earlier = Some("2025-12-31T00:00:00Z");
        assert!(failed_machine_to_terminate(
            &machine("Failed", None, None),
            None,
            now
        ));
        assert!(!failed_machine_to_terminate(
            &machine("Failed", later, None),
            None,
            now
        ));
        assert!(failed_machine_to_terminate(
            &machine("Failed", earlier, Some("now")),
            None,
            now
        ));
        assert!(!failed_machine_to_terminate(
            &machine("Failed", None, Some("when-failed")),
            None,
            now
        ));
        assert!(failed_machine_to_terminate(
            &machine("Failed", None, Some("false")),
            None,
            now
        ));
        // The Node's value wins.
        assert!(failed_machine_to_terminate(
            &machine("Failed", None, Some("now")),
            Some("false"),
            now
        ));
        assert!(is_preserved_failed(&machine("Failed", later, None)));
        assert!(!is_preserved_failed(&machine("Running", later, None)));
        assert!(is_preserved(&machine("Running", later, None), now));
        assert!(!is_preserved(&machine("Running", earlier, None), now));
        assert!(is_auto_preserved(&machine(
            "Failed",
            None,
            Some("auto-preserved")
        )));
        assert!(has_own_preserve_value(&machine(
            "Failed",
            None,
            Some("false")
        )));
        assert!(!has_own_preserve_value(&machine("Failed", None, Some("x"))));
    }
}
