//! The machine controller's part of an in-place update (MachineDeployment strategy
//! `InPlaceUpdate`, upstream's GEP-31 implementation): the Node's `InPlaceUpdate` condition
//! follows the labels the MachineDeployment controller and the node agent set; a node
//! selected for update is cordoned and drained, the machine goes `InPlaceUpdating` and the
//! node `ReadyForUpdate`; the agent's `update-result` label moves the machine to
//! `InPlaceUpdateSuccessful` (then `Running` once healthy) or `InPlaceUpdateFailed` (then
//! `Failed` after the health timeout, and replaced). The VM is never deleted by an in-place
//! update; uncordoning and moving the machine to the new MachineSet are the MachineDeployment
//! controller's part.
//!
//! [`next`] decides one step from the Machine and its Node (pure); [`act::inplace_step`](super::act::inplace_step) carries it out.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::ResourceExt;
use mcm_api::constants::node_conditions::{self, in_place};
use mcm_api::constants::{annotations, labels};
use mcm_api::{Machine, MachineOperationType, MachinePhase};

use super::decide::MachineConfig;
use super::status::Operation;

/// How soon a reconcile comes back after an in-place step.
pub(crate) const NEXT_STEP: Duration = Duration::from_secs(2);
/// How often a machine waiting for its node agent is looked at again (a label change wakes
/// it sooner).
const AWAIT_AGENT: Duration = Duration::from_secs(60);

/// What the in-place update of a machine does next.
#[derive(Debug, Clone, PartialEq)]
pub enum InPlaceStep {
    /// Nothing (no in-place update concerns the machine, or it waits).
    Nothing,
    /// Waiting for the node agent (requeue in `after`).
    Await {
        /// When to look again.
        after: Duration,
    },
    /// Set the Node's `InPlaceUpdate` condition to `reason`.
    Condition {
        /// The reason.
        reason: &'static str,
        /// The message.
        message: String,
    },
    /// One pass of the cordon and drain of a node selected for update.
    Drain {
        /// Delete pods instead of evicting them (`force-drain` label, or the drain timeout
        /// since the node was selected).
        force: bool,
        /// Time since the node was selected.
        elapsed: Duration,
    },
    /// Move the machine to `phase`, recording `op`.
    Phase {
        /// The new phase.
        phase: MachinePhase,
        /// The operation recorded with it.
        op: Operation,
    },
    /// `InPlaceUpdateFailed` beyond the health timeout: the machine is Failed (and its set
    /// replaces it).
    Fail {
        /// Why.
        reason: String,
    },
}

/// The facts [`next`] decides from.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The machine's name.
    pub machine: &'a str,
    /// Its phase.
    pub phase: Option<&'a MachinePhase>,
    /// When the phase began.
    pub phase_since: Timestamp,
    /// The machine carries `force-drain: True`.
    pub force_drain: bool,
    /// Its Node.
    pub node: &'a Node,
    /// The Node is Ready and without configured bad conditions.
    pub healthy: bool,
    /// The effective in-place update timeout.
    pub inplace_timeout: Duration,
    /// The effective health timeout.
    pub health_timeout: Duration,
    /// `spec.disableHealthTimeout`.
    pub disable_health_timeout: bool,
    /// The effective drain timeout.
    pub drain_timeout: Duration,
}

/// The Node's `InPlaceUpdate` condition.
pub(crate) fn condition(node: &Node) -> Option<&NodeCondition> {
    super::observe::node_conditions_of(node)
        .iter()
        .find(|c| c.type_ == node_conditions::IN_PLACE_UPDATE)
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// Decides the next in-place step. Pure.
pub fn next(f: &Facts<'_>, now: Timestamp) -> InPlaceStep {
    let cond = condition(f.node);
    let reason = cond.and_then(|c| c.reason.as_deref());
    let result = label(f.node, labels::UPDATE_RESULT);
    let failed_reason = f
        .node
        .annotations()
        .get(annotations::UPDATE_FAILED_REASON)
        .cloned()
        .unwrap_or_default();
    let in_phase = elapsed(f.phase_since, now);
    let m = f.machine;

    // The machine's phase (upstream's reconcileMachineHealth rules for in-place phases).
    match f.phase {
        Some(MachinePhase::InPlaceUpdating | MachinePhase::InPlaceUpdateFailed)
            if result == Some(labels::update_result::SUCCESSFUL) =>
        {
            return InPlaceStep::Phase {
                phase: MachinePhase::InPlaceUpdateSuccessful,
                op: Operation::successful(
                    MachineOperationType::InPlaceUpdate,
                    format!("Machine {m} successfully updated dependencies"),
                ),
            };
        }
        Some(MachinePhase::InPlaceUpdating) if result == Some(labels::update_result::FAILED) => {
            return InPlaceStep::Phase {
                phase: MachinePhase::InPlaceUpdateFailed,
                op: Operation::failed(
                    MachineOperationType::InPlaceUpdate,
                    format!("Machine {m} failed to update dependencies: {failed_reason}"),
                    None,
                ),
            };
        }
        Some(MachinePhase::InPlaceUpdating) if in_phase > f.inplace_timeout => {
            return InPlaceStep::Phase {
                phase: MachinePhase::InPlaceUpdateFailed,
                op: Operation::failed(
                    MachineOperationType::InPlaceUpdate,
                    format!(
                        "Machine {m} failed to in-place update in {}.",
                        mcm_api::duration::format_go_duration(f.inplace_timeout)
                    ),
                    None,
                ),
            };
        }
        Some(MachinePhase::InPlaceUpdateFailed)
            if !f.disable_health_timeout && in_phase >= f.health_timeout =>
        {
            return InPlaceStep::Fail {
                reason: format!(
                    "the in-place update failed and the machine did not recover within the \
                     health timeout ({})",
                    mcm_api::duration::format_go_duration(f.health_timeout)
                ),
            };
        }
        Some(MachinePhase::InPlaceUpdateSuccessful) if f.healthy => {
            return InPlaceStep::Phase {
                phase: MachinePhase::Running,
                op: Operation::successful(
                    MachineOperationType::HealthCheck,
                    format!("Machine {m} successfully re-joined the cluster"),
                ),
            };
        }
        _ => {}
    }

    // The condition follows the labels (upstream's updateNodeConditionBasedOnLabel).
    let candidate = label(f.node, labels::CANDIDATE_FOR_UPDATE).is_some();
    let selected = label(f.node, labels::SELECTED_FOR_UPDATE).is_some();
    if candidate {
        let restart = reason == Some(in_place::UPDATE_SUCCESSFUL) && result.is_none();
        if cond.is_none() || restart {
            return condition_step(in_place::CANDIDATE_FOR_UPDATE, String::new());
        }
        if selected && reason == Some(in_place::CANDIDATE_FOR_UPDATE) {
            return condition_step(in_place::SELECTED_FOR_UPDATE, String::new());
        }
        let selected_waiting = selected && reason == Some(in_place::SELECTED_FOR_UPDATE);
        if !selected_waiting {
            match result {
                Some(labels::update_result::SUCCESSFUL)
                    if reason != Some(in_place::UPDATE_SUCCESSFUL) =>
                {
                    return condition_step(in_place::UPDATE_SUCCESSFUL, String::new());
                }
                Some(labels::update_result::FAILED) if reason != Some(in_place::UPDATE_FAILED) => {
                    return condition_step(in_place::UPDATE_FAILED, failed_reason);
                }
                _ => {}
            }
        }
    }

    // The drain and the hand-over to the node agent (upstream's inPlaceUpdate).
    let step = match reason {
        Some(in_place::SELECTED_FOR_UPDATE) => {
            let since = cond
                .and_then(|c| c.last_transition_time.as_ref())
                .map_or(now, |t| t.0);
            let elapsed = elapsed(since, now);
            let forced = f.force_drain || elapsed > f.drain_timeout;
            InPlaceStep::Drain {
                force: forced,
                elapsed,
            }
        }
        Some(in_place::DRAIN_SUCCESSFUL) => {
            condition_step(in_place::READY_FOR_UPDATE, String::new())
        }
        // Waiting for the agent; the lifecycle's health checks go on for a machine that is
        // not updating (a crash between the phase and the condition).
        Some(in_place::READY_FOR_UPDATE) if f.phase == Some(&MachinePhase::InPlaceUpdating) => {
            InPlaceStep::Await { after: AWAIT_AGENT }
        }
        _ => InPlaceStep::Nothing,
    };
    if step != InPlaceStep::Nothing {
        return step;
    }
    // Nothing to do but wait: come back when a timeout of the phase expires.
    let left = |timeout: Duration| timeout.saturating_sub(in_phase) + Duration::from_secs(1);
    match f.phase {
        Some(MachinePhase::InPlaceUpdating) => InPlaceStep::Await {
            after: left(f.inplace_timeout).min(AWAIT_AGENT),
        },
        Some(MachinePhase::InPlaceUpdateFailed) if !f.disable_health_timeout => {
            InPlaceStep::Await {
                after: left(f.health_timeout),
            }
        }
        _ => InPlaceStep::Nothing,
    }
}

fn condition_step(reason: &'static str, detail: String) -> InPlaceStep {
    let message = match reason {
        in_place::CANDIDATE_FOR_UPDATE => "Node is a candidate for in-place update".to_string(),
        in_place::SELECTED_FOR_UPDATE => "Node is selected for in-place update".to_string(),
        in_place::DRAIN_SUCCESSFUL => "Node draining successful".to_string(),
        in_place::READY_FOR_UPDATE => "Node is ready for in-place update".to_string(),
        in_place::UPDATE_SUCCESSFUL => "Node in-place update successful".to_string(),
        _ => format!("Node in-place update failed: {detail}"),
    };
    InPlaceStep::Condition { reason, message }
}

/// The facts of `m` and its `node` for [`next`].
pub(crate) fn facts<'a>(
    m: &'a Machine,
    node: &'a Node,
    healthy: bool,
    cfg: &MachineConfig,
    default_inplace_timeout: Duration,
) -> Facts<'a> {
    Facts {
        machine: m.metadata.name.as_deref().unwrap_or_default(),
        phase: m.phase(),
        phase_since: super::observe::phase_since(m),
        force_drain: m
            .labels()
            .get(labels::FORCE_DRAIN)
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        node,
        healthy,
        inplace_timeout: m
            .spec
            .configuration
            .in_place_update_timeout
            .map(|g| g.0)
            .unwrap_or(default_inplace_timeout),
        health_timeout: cfg.health_timeout,
        disable_health_timeout: cfg.disable_health_timeout,
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

    fn node(node_labels: &[(&str, &str)], reason: Option<&str>) -> Node {
        let mut n: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        n.metadata.labels = Some(
            node_labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        if let Some(reason) = reason {
            n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: node_conditions::IN_PLACE_UPDATE.into(),
                    status: "True".into(),
                    reason: Some(reason.into()),
                    last_transition_time: Some(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(
                            "2026-01-01T11:59:00Z",
                        )),
                    ),
                    ..NodeCondition::default()
                }]),
                ..Default::default()
            });
        }
        n
    }

    fn facts<'a>(phase: &'a MachinePhase, node: &'a Node) -> Facts<'a> {
        Facts {
            machine: "m",
            phase: Some(phase),
            phase_since: t("2026-01-01T11:58:00Z"),
            force_drain: false,
            node,
            healthy: true,
            inplace_timeout: Duration::from_secs(20 * 60),
            health_timeout: Duration::from_secs(10 * 60),
            disable_health_timeout: false,
            drain_timeout: Duration::from_secs(2 * 3600),
        }
    }

    fn reason_of(step: &InPlaceStep) -> Option<&'static str> {
        match step {
            InPlaceStep::Condition { reason, .. } => Some(reason),
            _ => None,
        }
    }

    const CANDIDATE: (&str, &str) = (labels::CANDIDATE_FOR_UPDATE, "true");
    const SELECTED: (&str, &str) = (labels::SELECTED_FOR_UPDATE, "true");
    const OK: (&str, &str) = (labels::UPDATE_RESULT, "successful");
    const FAILED: (&str, &str) = (labels::UPDATE_RESULT, "failed");

    #[test]
    fn the_condition_follows_the_labels_through_a_successful_update() {
        let running = MachinePhase::Running;
        let updating = MachinePhase::InPlaceUpdating;
        let now = t(NOW);
        let n = node(&[], None);
        assert_eq!(next(&facts(&running, &n), now), InPlaceStep::Nothing);
        let n = node(&[CANDIDATE], None);
        assert_eq!(
            reason_of(&next(&facts(&running, &n), now)),
            Some("CandidateForUpdate")
        );
        let n = node(&[CANDIDATE], Some("CandidateForUpdate"));
        assert_eq!(
            next(&facts(&running, &n), now),
            InPlaceStep::Nothing,
            "waits to be selected"
        );
        let n = node(&[CANDIDATE, SELECTED], Some("CandidateForUpdate"));
        assert_eq!(
            reason_of(&next(&facts(&running, &n), now)),
            Some("SelectedForUpdate")
        );
        let n = node(&[CANDIDATE, SELECTED], Some("SelectedForUpdate"));
        assert_eq!(
            next(&facts(&running, &n), now),
            InPlaceStep::Drain {
                force: false,
                elapsed: Duration::from_secs(60)
            }
        );
        let n = node(&[CANDIDATE, SELECTED], Some("DrainSuccessful"));
        assert_eq!(
            reason_of(&next(&facts(&updating, &n), now)),
            Some("ReadyForUpdate")
        );
        let n = node(&[CANDIDATE, SELECTED], Some("ReadyForUpdate"));
        assert!(matches!(
            next(&facts(&updating, &n), now),
            InPlaceStep::Await { .. }
        ));
        // The agent reports success: the phase first, then the condition, then Running.
        let n = node(&[CANDIDATE, SELECTED, OK], Some("ReadyForUpdate"));
        let InPlaceStep::Phase { phase, .. } = next(&facts(&updating, &n), now) else {
            panic!("a phase change");
        };
        assert_eq!(phase, MachinePhase::InPlaceUpdateSuccessful);
        let successful = MachinePhase::InPlaceUpdateSuccessful;
        let InPlaceStep::Phase { phase, .. } = next(&facts(&successful, &n), now) else {
            panic!("a phase change");
        };
        assert_eq!(phase, MachinePhase::Running);
        assert_eq!(
            reason_of(&next(&facts(&running, &n), now)),
            Some("UpdateSuccessful")
        );
        let n = node(&[CANDIDATE, SELECTED, OK], Some("UpdateSuccessful"));
        assert_eq!(next(&facts(&running, &n), now), InPlaceStep::Nothing);
        // A later rollout starts over once the result label is gone.
        let n = node(&[CANDIDATE], Some("UpdateSuccessful"));
        assert_eq!(
            reason_of(&next(&facts(&running, &n), now)),
            Some("CandidateForUpdate")
        );
    }

    #[test]
    fn a_failed_update_or_a_timeout_fails_the_machine_after_the_health_timeout() {
        let updating = MachinePhase::InPlaceUpdating;
        let failed_phase = MachinePhase::InPlaceUpdateFailed;
        let now = t(NOW);
        let mut n = node(&[CANDIDATE, SELECTED, FAILED], Some("ReadyForUpdate"));
        n.metadata.annotations = Some(
            [(
                annotations::UPDATE_FAILED_REASON.to_string(),
                "disk full".to_string(),
            )]
            .into(),
        );
        let InPlaceStep::Phase { phase, op } = next(&facts(&updating, &n), now) else {
            panic!("a phase change");
        };
        assert_eq!(phase, MachinePhase::InPlaceUpdateFailed);
        assert_eq!(
            op.description,
            "Machine m failed to update dependencies: disk full"
        );
        let step = next(&facts(&failed_phase, &n), now);
        assert_eq!(reason_of(&step), Some("UpdateFailed"));
        // Then it waits for the health timeout (10m from 11:58; now is 12:00).
        let mut condition_set = n.clone();
        condition_set
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .reason = Some("UpdateFailed".into());
        assert_eq!(
            next(&facts(&failed_phase, &condition_set), now),
            InPlaceStep::Await {
                after: Duration::from_secs(8 * 60 + 1)
            }
        );
        let InPlaceStep::Condition { message, .. } = step else {
            unreachable!()
        };
        assert_eq!(message, "Node in-place update failed: disk full");
        // After the health timeout: Failed, unless disabled.
        let later = t("2026-01-01T12:30:00Z");
        assert!(matches!(
            next(&facts(&failed_phase, &n), later),
            InPlaceStep::Fail { .. }
        ));
        let mut f = facts(&failed_phase, &n);
        f.disable_health_timeout = true;
        assert!(!matches!(next(&f, later), InPlaceStep::Fail { .. }));
        // No answer within the in-place timeout.
        let n = node(&[CANDIDATE, SELECTED], Some("ReadyForUpdate"));
        let InPlaceStep::Phase { phase, op } = next(&facts(&updating, &n), later) else {
            panic!("a phase change");
        };
        assert_eq!(phase, MachinePhase::InPlaceUpdateFailed);
        assert_eq!(
            op.description,
            "Machine m failed to in-place update in 20m0s."
        );
    }

    #[test]
    fn the_drain_is_forced_by_label_or_after_the_drain_timeout() {
        let running = MachinePhase::Running;
        let n = node(&[CANDIDATE, SELECTED], Some("SelectedForUpdate"));
        let mut f = facts(&running, &n);
        f.force_drain = true;
        assert!(matches!(
            next(&f, t(NOW)),
            InPlaceStep::Drain { force: true, .. }
        ));
        let f = facts(&running, &n);
        assert!(matches!(
            next(&f, t("2026-01-01T14:00:00Z")),
            InPlaceStep::Drain { force: true, .. }
        ));
    }
}
