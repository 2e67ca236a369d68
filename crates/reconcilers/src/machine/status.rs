//! Building Machine status patches. Pure.
//!
//! `currentStatus.lastUpdateTime` is the time the *phase* began: it only changes when the
//! phase changes, so timeouts (creation, health, drain) count from the phase transition.
//! `lastOperation` is written on every step for humans and compatibility; no decision reads it.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};
use mcm_api::{Machine, MachineOperationType, MachinePhase, MachineState};
use serde_json::{Value, json};

/// What to record in `lastOperation`.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    /// `lastOperation.type`.
    pub kind: MachineOperationType,
    /// `lastOperation.state`.
    pub state: MachineState,
    /// `lastOperation.description`.
    pub description: String,
    /// `lastOperation.errorCode` (the driver [`mcm_driver::Code`] name), for failures.
    pub error_code: Option<String>,
}

impl Operation {
    /// An operation in progress.
    pub fn processing(kind: MachineOperationType, description: impl Into<String>) -> Self {
        Operation {
            kind,
            state: MachineState::Processing,
            description: description.into(),
            error_code: None,
        }
    }

    /// A successful operation.
    pub fn successful(kind: MachineOperationType, description: impl Into<String>) -> Self {
        Operation {
            kind,
            state: MachineState::Successful,
            description: description.into(),
            error_code: None,
        }
    }

    /// A failed operation.
    pub fn failed(
        kind: MachineOperationType,
        description: impl Into<String>,
        error_code: Option<String>,
    ) -> Self {
        Operation {
            kind,
            state: MachineState::Failed,
            description: description.into(),
            error_code,
        }
    }
}

/// Whether a phase runs a timeout (shown as `currentStatus.timeoutActive`).
pub(crate) fn timeout_active(phase: &MachinePhase) -> bool {
    matches!(
        phase,
        MachinePhase::Pending | MachinePhase::Unknown | MachinePhase::CrashLoopBackOff
    )
}

/// A merge patch of `status` that records `op` and, when given, moves to `phase`.
pub(crate) fn status_patch(
    machine: &Machine,
    phase: Option<&MachinePhase>,
    op: &Operation,
    now: Timestamp,
) -> Value {
    let mut status = json!({
        "lastOperation": {
            "type": op.kind.as_str(),
            "state": op.state.as_str(),
            "description": op.description,
            "lastUpdateTime": now.to_string(),
            "errorCode": op.error_code,
        }
    });
    if let Some(phase) = phase
        && machine.phase() != Some(phase)
    {
        status["currentStatus"] = json!({
            "phase": phase.as_str(),
            "timeoutActive": timeout_active(phase),
            "lastUpdateTime": now.to_string(),
        });
    }
    json!({ "status": status })
}

/// The description of the Machine's `lastOperation`.
pub(crate) fn last_description(m: &Machine) -> Option<&str> {
    m.status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.as_deref())
}

/// Whether the Machine already shows `op` (ignoring its time) and `phase`.
pub(crate) fn already_recorded(
    machine: &Machine,
    phase: Option<&MachinePhase>,
    op: &Operation,
) -> bool {
    let Some(last) = machine
        .status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
    else {
        return false;
    };
    let same_op = last.type_.as_ref() == Some(&op.kind)
        && last.state.as_ref() == Some(&op.state)
        && last.description.as_deref() == Some(op.description.as_str())
        && last.error_code == op.error_code;
    let same_phase = phase.is_none_or(|p| machine.phase() == Some(p));
    same_op && same_phase
}

/// Whether two condition lists differ in anything but heartbeat times (so status is not
/// rewritten on every Node heartbeat).
pub(crate) fn conditions_differ(current: Option<&[NodeCondition]>, node: &[NodeCondition]) -> bool {
    let key = |c: &NodeCondition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
        )
    };
    let a: Vec<_> = current.unwrap_or(&[]).iter().map(key).collect();
    let b: Vec<_> = node.iter().map(key).collect();
    a != b
}

/// Merges the `status` of patch `extra` into `patch` (both `{"status": {...}}`), keys of
/// `extra` winning.
pub(crate) fn merge_into(patch: &mut Value, extra: Value) {
    if let (Some(into), Value::Object(mut from)) = (
        patch.get_mut("status").and_then(Value::as_object_mut),
        extra,
    ) && let Some(Value::Object(fields)) = from.remove("status")
    {
        into.extend(fields);
    }
}

/// A merge patch copying the Node's conditions and addresses into the Machine status.
pub(crate) fn node_status_patch(conditions: &[NodeCondition], addresses: &[NodeAddress]) -> Value {
    json!({ "status": { "conditions": conditions, "addresses": addresses } })
}

/// A merge patch recording what the driver returned about the VM: its opaque
/// `lastKnownState` (given back to the driver with the Machine on the next call) and, when
/// given, its addresses. `None` when the Machine shows them already, or the driver returned
/// no state and no addresses are to be recorded.
pub(crate) fn driver_state_patch(
    machine: &Machine,
    state: Option<&str>,
    addresses: Option<&[NodeAddress]>,
) -> Option<Value> {
    let current = machine.status.as_ref();
    let mut status = serde_json::Map::new();
    if let Some(state) = state
        && current.and_then(|s| s.last_known_state.as_deref()) != Some(state)
    {
        status.insert("lastKnownState".into(), json!(state));
    }
    if let Some(addresses) = addresses
        && current.and_then(|s| s.addresses.as_deref()).unwrap_or(&[]) != addresses
    {
        status.insert("addresses".into(), json!(addresses));
    }
    (!status.is_empty()).then(|| json!({ "status": status }))
}

/// The addresses of a machine without a target cluster (upstream's `buildAddressStatus`):
/// the driver's addresses and the node name as `Hostname`, without duplicates, sorted by
/// type and address.
pub(crate) fn address_status(addresses: &[NodeAddress], node_name: &str) -> Vec<NodeAddress> {
    let mut all: Vec<NodeAddress> = addresses.to_vec();
    if !node_name.is_empty() {
        all.push(NodeAddress {
            type_: "Hostname".into(),
            address: node_name.into(),
        });
    }
    all.sort_by(|a, b| (&a.type_, &a.address).cmp(&(&b.type_, &b.address)));
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcm_api::{CurrentStatus, MachineSpec, MachineStatus};

    fn machine_in(phase: MachinePhase) -> Machine {
        let mut m = Machine::new("m", MachineSpec::default());
        m.status = Some(MachineStatus {
            current_status: Some(CurrentStatus {
                phase: Some(phase),
                ..Default::default()
            }),
            ..Default::default()
        });
        m
    }

    #[test]
    fn node_status_merges_into_a_phase_change() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let op = Operation::successful(MachineOperationType::Create, "joined");
        let mut p = status_patch(
            &machine_in(MachinePhase::Pending),
            Some(&MachinePhase::Running),
            &op,
            now,
        );
        merge_into(&mut p, node_status_patch(&[], &[]));
        assert_eq!(p["status"]["currentStatus"]["phase"], "Running");
        assert_eq!(p["status"]["lastOperation"]["description"], "joined");
        assert_eq!(p["status"]["conditions"], json!([]));
        assert_eq!(p["status"]["addresses"], json!([]));
    }

    #[test]
    fn a_phase_change_restarts_the_phase_clock_and_a_repeat_does_not() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let op = Operation::processing(MachineOperationType::HealthCheck, "unhealthy");
        let p = status_patch(
            &machine_in(MachinePhase::Running),
            Some(&MachinePhase::Unknown),
            &op,
            now,
        );
        assert_eq!(p["status"]["currentStatus"]["phase"], "Unknown");
        assert_eq!(p["status"]["currentStatus"]["timeoutActive"], true);
        assert_eq!(
            p["status"]["currentStatus"]["lastUpdateTime"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(p["status"]["lastOperation"]["type"], "HealthCheck");

        let p = status_patch(
            &machine_in(MachinePhase::Unknown),
            Some(&MachinePhase::Unknown),
            &op,
            now,
        );
        assert!(p["status"].get("currentStatus").is_none());
    }

    #[test]
    fn an_identical_operation_is_recognised_so_it_is_not_rewritten() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let op = Operation::failed(
            MachineOperationType::Create,
            "boom",
            Some("Internal".into()),
        );
        let mut m = machine_in(MachinePhase::CrashLoopBackOff);
        assert!(!already_recorded(
            &m,
            Some(&MachinePhase::CrashLoopBackOff),
            &op
        ));
        let patch = status_patch(&m, Some(&MachinePhase::CrashLoopBackOff), &op, now);
        let last: mcm_api::LastOperation =
            serde_json::from_value(patch["status"]["lastOperation"].clone()).unwrap();
        m.status.as_mut().unwrap().last_operation = Some(last);
        assert!(already_recorded(
            &m,
            Some(&MachinePhase::CrashLoopBackOff),
            &op
        ));
        assert!(already_recorded(&m, None, &op));
        assert!(!already_recorded(&m, Some(&MachinePhase::Failed), &op));
        let other = Operation::failed(MachineOperationType::Create, "boom again", None);
        assert!(!already_recorded(&m, None, &other));
    }

    #[test]
    fn heartbeats_alone_are_not_a_difference() {
        let c = |status: &str, hb: &str| NodeCondition {
            type_: "Ready".into(),
            status: status.into(),
            last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                hb.parse().unwrap(),
            )),
            ..Default::default()
        };
        let a = [c("True", "2026-01-01T00:00:00Z")];
        let b = [c("True", "2026-01-01T00:00:09Z")];
        assert!(!conditions_differ(Some(&a), &b));
        assert!(conditions_differ(
            Some(&a),
            &[c("False", "2026-01-01T00:00:00Z")]
        ));
        assert!(conditions_differ(None, &a));
    }

    #[test]
    fn driver_state_is_written_only_when_it_changes() {
        let mut m = Machine::new("m", MachineSpec::default());
        assert_eq!(driver_state_patch(&m, None, None), None);
        let p = driver_state_patch(&m, Some("s1"), None).unwrap();
        assert_eq!(p, json!({"status": {"lastKnownState": "s1"}}));
        m.status = Some(MachineStatus {
            last_known_state: Some("s1".into()),
            ..MachineStatus::default()
        });
        assert_eq!(driver_state_patch(&m, Some("s1"), None), None);
        let ip = NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        };
        let p = driver_state_patch(&m, Some("s1"), Some(std::slice::from_ref(&ip))).unwrap();
        assert_eq!(
            p,
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}})
        );
        m.status.as_mut().unwrap().addresses = Some(vec![ip.clone()]);
        assert_eq!(driver_state_patch(&m, Some("s1"), Some(&[ip])), None);
    }

    #[test]
    fn addresses_without_a_target_cluster_include_the_host_name_once() {
        let ip = |t: &str, a: &str| NodeAddress {
            type_: t.into(),
            address: a.into(),
        };
        let got = address_status(
            &[
                ip("InternalIP", "10.0.0.2"),
                ip("Hostname", "m1"),
                ip("ExternalIP", "1.2.3.4"),
            ],
            "m1",
        );
        assert_eq!(
            got,
            vec![
                ip("ExternalIP", "1.2.3.4"),
                ip("Hostname", "m1"),
                ip("InternalIP", "10.0.0.2")
            ]
        );
        assert_eq!(address_status(&[], ""), vec![]);
    }
}
