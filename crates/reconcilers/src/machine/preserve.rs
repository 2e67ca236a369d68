//! Machine preservation in the machine controller (upstream's `manageMachinePreservation`):
//! a machine whose preserve value asks for it gets a `preserveExpiryTime`; its Node gets the
//! cluster-autoscaler's scale-down-disabled annotations and the `Preserved` condition, and,
//! once the machine is Failed, the `node.machine.sapcloud.io/preserved:NoSchedule` taint and a
//! drain that leaves DaemonSet pods (the node is not cordoned: a user's cordon stays the
//! user's). Preservation stops when the value is withdrawn, when the expiry passes, when a
//! `when-failed` or `auto-preserved` machine recovers; the MachineSet replaces a Failed machine
//! only once it is no longer preserved.
//!
//! [`next`] decides one step from the Machine and its Node (pure); [`act::preserve_step`](super::act::preserve_step) carries it out.
//! Each reconcile runs at most one preservation step before the lifecycle step, so both
//! converge side by side.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use kube::ResourceExt;
use mcm_api::constants::{annotations, node_conditions, taints};
use mcm_api::preservation::{self, Effective, PreserveValue};
use mcm_api::{Machine, MachinePhase};

use super::decide::{FORCE_DRAIN_NOT_READY_AFTER, MachineConfig, NodeHealth};

/// How soon a reconcile comes back after a preservation step (the next step, or the next
/// drain pass).
pub(crate) const NEXT_STEP: Duration = Duration::from_secs(2);

/// What preservation does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PreserveStep {
    /// Nothing (not preserved, or everything is in place).
    Nothing,
    /// The Node carries a preserve value upstream does not allow: nothing is changed.
    InvalidNodeValue(String),
    /// Start: record `preserveExpiryTime`.
    Start {
        /// The expiry (now + the effective preserve timeout).
        until: Timestamp,
        /// The value that asked for it.
        value: PreserveValue,
    },
    /// Bring the Node in line with a preservation in progress.
    Node(NodeWork),
    /// The machine recovered while preserved with `now`: the preserved taint goes, the
    /// preservation stays.
    Untaint,
    /// Stop: condition `False`, autoscaler annotations and taint removed, expiry cleared;
    /// with `remove_annotations` the preserve annotations of Machine and Node go too.
    Stop {
        /// Also remove the preserve annotations (expiry, or an `auto-preserved` machine that
        /// recovered).
        remove_annotations: bool,
        /// Instead of removing the Machine's value, set it to `false`: an auto-preserved
        /// Failed machine whose preservation expired is replaced, not auto-preserved again
        /// (upstream removes the value, and its MachineSet may then preserve the machine
        /// anew, over and over).
        mark_false: bool,
        /// Why, for the Event.
        why: &'static str,
    },
    /// The Node's value was applied: the Machine records it and drops its own value.
    SyncFromNode {
        /// The Node's value (empty when the Node's annotation was removed).
        node_value: String,
    },
}

/// What the Node of a preserved machine still needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeWork {
    /// The value in effect.
    pub value: PreserveValue,
    /// Add the cluster-autoscaler scale-down-disabled annotations.
    pub annotate: bool,
    /// The machine is Failed and its node not drained yet: taint and drain.
    pub drain: bool,
    /// Force the drain (delete pods): the node has been NotReady for 5 minutes or the drain
    /// timeout since the failure passed.
    pub force: bool,
    /// The node is unreachable: pods whose deletion was requested are not waited for.
    pub unreachable: bool,
    /// Until when (for the condition's message).
    pub until: Timestamp,
}

/// The facts [`next`] decides from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Facts<'a> {
    /// The machine is being deleted (preservation never holds a deletion).
    pub deleting: bool,
    /// Its phase.
    pub phase: Option<&'a MachinePhase>,
    /// When the phase began.
    pub phase_since: Timestamp,
    /// `preserveExpiryTime`.
    pub expiry: Option<Timestamp>,
    /// The preserve annotations of Machine and Node.
    pub annotations: preservation::Annotations<'a>,
    /// The Node, when the machine has one.
    pub node: Option<&'a Node>,
    /// The Node's health.
    pub health: Option<&'a NodeHealth>,
    /// The effective preserve timeout.
    pub timeout: Duration,
    /// The effective drain timeout.
    pub drain_timeout: Duration,
}

/// Decides the next preservation step. Pure.
pub(crate) fn next(f: &Facts<'_>, now: Timestamp) -> PreserveStep {
    let a = &f.annotations;
    let bound = f.expiry.is_some()
        || a.node.is_some()
        || a.machine.is_some()
        || a.last_applied_node.is_some_and(|v| !v.is_empty());
    if f.deleting || !bound {
        return PreserveStep::Nothing;
    }
    let expired = f.expiry.is_some_and(|t| t <= now);
    let failed = f.phase == Some(&MachinePhase::Failed);
    let step = match preservation::effective(a) {
        Effective::InvalidOnNode(v) => return PreserveStep::InvalidNodeValue(v),
        Effective::Unset | Effective::Value(PreserveValue::False) => stop(f, false, "withdrawn"),
        Effective::Value(PreserveValue::WhenFailed) if expired => stop(f, true, "expired"),
        Effective::Value(PreserveValue::WhenFailed) if !failed => {
            stop(f, false, "the machine is no longer Failed")
        }
        Effective::Value(PreserveValue::Now) if expired => stop(f, true, "expired"),
        Effective::Value(PreserveValue::AutoPreserved) if expired && failed => {
            match stop(f, true, "expired; the machine is replaced") {
                PreserveStep::Stop {
                    remove_annotations,
                    why,
                    ..
                } => PreserveStep::Stop {
                    remove_annotations,
                    mark_false: true,
                    why,
                },
                other => other,
            }
        }
        Effective::Value(PreserveValue::AutoPreserved) if expired => stop(f, true, "expired"),
        Effective::Value(PreserveValue::AutoPreserved) if !failed => {
            stop(f, true, "the machine is no longer Failed")
        }
        Effective::Value(value) => preserve(f, value, now),
    };
    if step != PreserveStep::Nothing {
        return step;
    }
    sync_from_node(a)
}

fn stop(f: &Facts<'_>, remove_annotations: bool, why: &'static str) -> PreserveStep {
    if f.expiry.is_none() {
        return PreserveStep::Nothing;
    }
    PreserveStep::Stop {
        remove_annotations,
        mark_false: false,
        why,
    }
}

fn preserve(f: &Facts<'_>, value: PreserveValue, now: Timestamp) -> PreserveStep {
    let Some(until) = f.expiry else {
        let secs = i64::try_from(f.timeout.as_secs()).unwrap_or(i64::MAX / 4);
        return PreserveStep::Start {
            until: now
                .saturating_add(jiff::SignedDuration::from_secs(secs))
                .unwrap_or(Timestamp::MAX),
            value,
        };
    };
    let Some(node) = f.node else {
        return PreserveStep::Nothing;
    };
    let failed = f.phase == Some(&MachinePhase::Failed);
    if !failed && has_preserved_taint(node) {
        return PreserveStep::Untaint;
    }
    let condition = preserved_condition(node);
    let drained = condition.is_some_and(|c| {
        c.message
            .as_deref()
            .is_some_and(|m| m.contains(node_conditions::PRESERVED_NODE_DRAIN_SUCCESSFUL))
    });
    let drain = failed && !drained;
    let complete = condition.is_some_and(|c| c.status == "True");
    if complete && !drain && !needs_autoscaler_annotation(node) {
        return PreserveStep::Nothing;
    }
    let not_ready_long = f
        .health
        .and_then(|h| h.not_ready_since)
        .is_some_and(|t| elapsed(t, now) >= FORCE_DRAIN_NOT_READY_AFTER);
    PreserveStep::Node(NodeWork {
        value,
        annotate: needs_autoscaler_annotation(node),
        drain,
        force: drain && (not_ready_long || elapsed(f.phase_since, now) >= f.drain_timeout),
        unreachable: f.health.is_some_and(|h| h.unreachable),
        until,
    })
}

/// Upstream's `shouldAnnotationsBeUpdatedOnMachine`: once the Node has (or had) a value, the
/// Machine records the Node's value and drops its own.
fn sync_from_node(a: &preservation::Annotations<'_>) -> PreserveStep {
    let node = a.node.unwrap_or("");
    let last = a.last_applied_node.unwrap_or("");
    if a.node.is_none() && last.is_empty() {
        return PreserveStep::Nothing;
    }
    if node == last && a.machine.is_none() {
        return PreserveStep::Nothing;
    }
    PreserveStep::SyncFromNode {
        node_value: node.to_string(),
    }
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// The Node's `Preserved` condition.
pub(crate) fn preserved_condition(node: &Node) -> Option<&NodeCondition> {
    super::observe::node_conditions_of(node)
        .iter()
        .find(|c| c.type_ == node_conditions::NODE_PRESERVED)
}

/// The Node carries the preserved taint.
pub(crate) fn has_preserved_taint(node: &Node) -> bool {
    taints_of(node)
        .iter()
        .any(|t| t.key == taints::NODE_PRESERVED)
}

pub(crate) fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

fn needs_autoscaler_annotation(node: &Node) -> bool {
    !node
        .annotations()
        .contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED)
}

/// The `Preserved` condition a node of a preservation in progress shows: `True` with the
/// expiry, and for a Failed machine whether its drain succeeded (`False` when it failed).
pub(crate) fn condition_for(
    value: PreserveValue,
    failed: bool,
    drain_failed: bool,
    until: Timestamp,
) -> (bool, String, String) {
    let reason = if value == PreserveValue::AutoPreserved {
        node_conditions::PRESERVED_BY_MCM
    } else {
        node_conditions::PRESERVED_BY_USER
    };
    let until = format!("Machine preserved until {until}.");
    let (status, message) = match (failed, drain_failed) {
        (true, false) => (
            true,
            format!(
                "{} {until}",
                node_conditions::PRESERVED_NODE_DRAIN_SUCCESSFUL
            ),
        ),
        (true, true) => (
            false,
            format!(
                "{} {until}",
                node_conditions::PRESERVED_NODE_DRAIN_UNSUCCESSFUL
            ),
        ),
        (false, _) => (true, until),
    };
    (status, reason.to_string(), message)
}

/// The facts of `m` for [`next`].
pub(crate) fn facts<'a>(
    m: &'a Machine,
    node: Option<&'a Node>,
    health: Option<&'a NodeHealth>,
    cfg: &MachineConfig,
    default_timeout: Duration,
) -> Facts<'a> {
    let node_value = node.and_then(|n| {
        n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::PRESERVE))
            .map(String::as_str)
    });
    Facts {
        deleting: m.metadata.deletion_timestamp.is_some(),
        phase: m.phase(),
        phase_since: super::observe::phase_since(m),
        expiry: preservation::expiry(m),
        annotations: preservation::Annotations::of(m, node_value),
        node,
        health,
        timeout: m
            .spec
            .configuration
            .machine_preserve_timeout
            .map(|g| g.0)
            .unwrap_or(default_timeout),
        drain_timeout: cfg.drain_timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-01-01T12:00:00Z";

    fn node(cond: Option<(&str, &str)>, tainted: bool, annotated: bool) -> Node {
        let mut n: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        if let Some((status, message)) = cond {
            n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: node_conditions::NODE_PRESERVED.into(),
                    status: status.into(),
                    message: Some(message.into()),
                    ..NodeCondition::default()
                }]),
                ..Default::default()
            });
        }
        if tainted {
            n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(vec![Taint {
                    key: taints::NODE_PRESERVED.into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
                ..Default::default()
            });
        }
        if annotated {
            n.metadata.annotations = Some(
                [(
                    annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED.to_string(),
                    "true".to_string(),
                )]
                .into(),
            );
        }
        n
    }

    fn facts<'a>(
        phase: &'a MachinePhase,
        expiry: Option<&str>,
        machine: Option<&'a str>,
        node: Option<&'a Node>,
    ) -> Facts<'a> {
        Facts {
            deleting: false,
            phase: Some(phase),
            phase_since: t("2026-01-01T11:59:00Z"),
            expiry: expiry.map(t),
            annotations: preservation::Annotations {
                machine,
                node: None,
                last_applied_node: None,
            },
            node,
            health: None,
            timeout: Duration::from_secs(3600),
            drain_timeout: Duration::from_secs(7200),
        }
    }

    #[test]
    fn a_value_starts_preservation_with_the_timeout() {
        let running = MachinePhase::Running;
        let failed = MachinePhase::Failed;
        assert_eq!(
            next(&facts(&running, None, Some("now"), None), t(NOW)),
            PreserveStep::Start {
                until: t("2026-01-01T13:00:00Z"),
                value: PreserveValue::Now
            }
        );
        // when-failed waits for the failure; auto-preserved only ever comes on Failed ones.
        assert_eq!(
            next(&facts(&running, None, Some("when-failed"), None), t(NOW)),
            PreserveStep::Nothing
        );
        assert!(matches!(
            next(&facts(&failed, None, Some("when-failed"), None), t(NOW)),
            PreserveStep::Start { .. }
        ));
        assert_eq!(
            next(&facts(&running, None, None, None), t(NOW)),
            PreserveStep::Nothing
        );
    }

    #[test]
    fn a_failed_preserved_machine_gets_its_node_tainted_and_drained() {
        let failed = MachinePhase::Failed;
        let until = Some("2026-01-02T00:00:00Z");
        let n = node(None, false, false);
        let PreserveStep::Node(work) = next(&facts(&failed, until, Some("now"), Some(&n)), t(NOW))
        else {
            panic!("node work expected");
        };
        assert!(work.drain && work.annotate && !work.force);
        // Drained and annotated: nothing more.
        let msg = format!(
            "{} Machine preserved until x.",
            node_conditions::PRESERVED_NODE_DRAIN_SUCCESSFUL
        );
        let n = node(Some(("True", &msg)), true, true);
        assert_eq!(
            next(&facts(&failed, until, Some("now"), Some(&n)), t(NOW)),
            PreserveStep::Nothing
        );
        // A Running preserved machine: annotations and condition, no drain.
        let running = MachinePhase::Running;
        let n = node(None, false, false);
        let PreserveStep::Node(work) = next(&facts(&running, until, Some("now"), Some(&n)), t(NOW))
        else {
            panic!("node work expected");
        };
        assert!(!work.drain && work.annotate);
        // Recovered with `now`: the taint goes, the preservation stays.
        let n = node(Some(("True", &msg)), true, true);
        assert_eq!(
            next(&facts(&running, until, Some("now"), Some(&n)), t(NOW)),
            PreserveStep::Untaint
        );
    }

    #[test]
    fn preservation_stops_on_expiry_withdrawal_and_recovery() {
        let failed = MachinePhase::Failed;
        let running = MachinePhase::Running;
        let past = Some("2026-01-01T11:00:00Z");
        let future = Some("2026-01-02T00:00:00Z");
        let stop = |remove| PreserveStep::Stop {
            remove_annotations: remove,
            mark_false: false,
            why: "",
        };
        let same = |a: PreserveStep, b: PreserveStep| match (a, b) {
            (
                PreserveStep::Stop {
                    remove_annotations: x,
                    ..
                },
                PreserveStep::Stop {
                    remove_annotations: y,
                    ..
                },
            ) => x == y,
            (a, b) => a == b,
        };
        assert!(same(
            next(&facts(&failed, past, Some("now"), None), t(NOW)),
            stop(true)
        ));
        assert!(same(
            next(&facts(&failed, future, Some("false"), None), t(NOW)),
            stop(false)
        ));
        assert!(same(
            next(&facts(&failed, future, None, None), t(NOW)),
            stop(false)
        ));
        assert!(same(
            next(&facts(&running, future, Some("when-failed"), None), t(NOW)),
            stop(false)
        ));
        assert!(same(
            next(
                &facts(&running, future, Some("auto-preserved"), None),
                t(NOW)
            ),
            stop(true)
        ));
        // An expired auto-preservation of a Failed machine: `false`, so it is replaced.
        assert!(matches!(
            next(&facts(&failed, past, Some("auto-preserved"), None), t(NOW)),
            PreserveStep::Stop {
                remove_annotations: true,
                mark_false: true,
                ..
            }
        ));
        // Being deleted: never in the way.
        let mut f = facts(&failed, future, Some("now"), None);
        f.deleting = true;
        assert_eq!(next(&f, t(NOW)), PreserveStep::Nothing);
    }

    #[test]
    fn the_nodes_value_is_recorded_on_the_machine() {
        let running = MachinePhase::Running;
        let mut f = facts(&running, None, Some("now"), None);
        f.annotations.node = Some("false");
        assert_eq!(
            next(&f, t(NOW)),
            PreserveStep::SyncFromNode {
                node_value: "false".into()
            }
        );
        f.annotations.machine = None;
        f.annotations.last_applied_node = Some("false");
        assert_eq!(next(&f, t(NOW)), PreserveStep::Nothing);
        // An invalid value on the Node: nothing changes.
        f.annotations.node = Some("soon");
        assert_eq!(
            next(&f, t(NOW)),
            PreserveStep::InvalidNodeValue("soon".into())
        );
    }

    #[test]
    fn the_condition_says_who_preserved_and_whether_the_drain_worked() {
        let until = t("2026-01-02T00:00:00Z");
        let (status, reason, message) =
            condition_for(PreserveValue::AutoPreserved, true, false, until);
        assert!(status);
        assert_eq!(reason, "Preserved by MCM.");
        assert_eq!(
            message,
            "Preserved node drained successfully. Machine preserved until 2026-01-02T00:00:00Z."
        );
        let (status, reason, message) = condition_for(PreserveValue::Now, true, true, until);
        assert!(!status);
        assert_eq!(reason, "Preserved by user.");
        assert!(message.starts_with("Preserved node could not be drained."));
        let (status, _, message) = condition_for(PreserveValue::Now, false, false, until);
        assert!(status);
        assert_eq!(message, "Machine preserved until 2026-01-02T00:00:00Z.");
    }
}
