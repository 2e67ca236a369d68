//! The trigger-deletion annotation (`node.machine.sapcloud.io/trigger-deletion-by-mcm`),
//! Gardener's cluster-autoscaler's way to name the machines it removes: its parsing and the
//! plan of marks and annotation updates ([`plan_trigger_deletion`]), pure.

use std::collections::BTreeMap;

use jiff::Timestamp;

/// One entry of the trigger-deletion annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TriggerEntry {
    /// Machine name.
    pub machine: String,
    /// When the scaler decided to delete it (`name~time`), `None` for a bare name.
    pub time: Option<String>,
}

/// Parses `node.machine.sapcloud.io/trigger-deletion-by-mcm`: comma-separated machine names,
/// each optionally followed by `~<RFC 3339 time>` (the cluster-autoscaler's current format,
/// written together with the reduced replicas). Blank entries are dropped.
pub(crate) fn parse_trigger_deletion(value: &str) -> Vec<TriggerEntry> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('~') {
            Some((name, time)) => TriggerEntry {
                machine: name.trim().to_owned(),
                time: Some(time.trim().to_owned()),
            },
            None => TriggerEntry {
                machine: e.to_owned(),
                time: None,
            },
        })
        .collect()
}

/// `t` as Go's `time.RFC3339` formats a UTC time: whole seconds and `Z`.
pub(crate) fn rfc3339_seconds(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The time a replica change by the scaler is recorded with: now, but strictly after the
/// change time the new set already has (`set_time`), in whole seconds. The set deletes the
/// machines marked at or before its change time; a machine marked now must not look like one
/// to a set whose replicas have not come down yet (it would replace the machine first).
pub(crate) fn replica_change_time(now: Timestamp, set_time: Option<Timestamp>) -> String {
    let after = set_time.and_then(|t| t.checked_add(jiff::SignedDuration::from_secs(1)).ok());
    let at = after.filter(|a| *a > now).unwrap_or(now);
    rfc3339_seconds(at)
}

/// What the trigger-deletion annotation asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TriggerPlan {
    /// Machines to mark with priority 1, each with its marked-for-deletion time (`None`: it
    /// already has one, which is kept).
    pub mark: Vec<(String, Option<String>)>,
    /// The new value of the annotation (`None`: remove it).
    pub annotation: Option<String>,
    /// The `last-deployment-replica-change-by-scaler-time` to set on the deployment (it had
    /// none and bare names were rewritten with this time).
    pub replica_change_time: Option<String>,
    /// Whether the deployment must be updated (annotation or replica-change time).
    pub update_deployment: bool,
}

/// The deployment as the trigger-deletion plan sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TriggerInput<'a> {
    /// The value of `node.machine.sapcloud.io/trigger-deletion-by-mcm`.
    pub value: &'a str,
    /// The value of `machine.sapcloud.io/last-deployment-replica-change-by-scaler-time`.
    pub replica_change_time: Option<&'a str>,
    /// Now, in RFC 3339 with seconds (as Go's `time.RFC3339` formats it).
    pub now: &'a str,
}

/// The plan for the trigger-deletion annotation, given the deployment's machines by name.
///
/// The protocol of Gardener's cluster-autoscaler, as upstream MCM implements it
/// (`adjustingMachineDeploymentDeletionAnnotations`, `computeMachineTriggerDeletionData`):
/// the scaler lowers `spec.replicas` **itself**, in the same update that names the machines
/// it chose, so replicas are never changed here. Bare names are rewritten to `name~<now>`
/// and `last-deployment-replica-change-by-scaler-time` is set to now (upstream sets it only
/// when missing and rewrites with the old time; then the machine of a second scale-down is
/// marked before the old time its set already has, and the set replaces it before its
/// replicas come down); an entry of any other shape, with a time that is not RFC 3339, or
/// naming a machine that is gone, not the deployment's, Failed or terminating is dropped;
/// the machines of the remaining entries get priority 1 and, unless they have one, the
/// entry's time as marked-for-deletion time. A machine that already has both is left alone.
/// The MachineSet then deletes those machines ([`crate::machineset::decide::plan_replicas`]).
pub(crate) fn plan_trigger_deletion(
    input: &TriggerInput<'_>,
    machines: &BTreeMap<String, TriggerMachine>,
) -> TriggerPlan {
    let mut plan = TriggerPlan::default();
    let value = input.value;
    if value.trim().is_empty() {
        // An empty annotation is removed.
        plan.update_deployment = true;
        return plan;
    }
    let mut rewritten = false;
    let mut keep = Vec::new();
    // An entry with more than one `~` keeps the rest in its time, which then is no time.
    for entry in parse_trigger_deletion(value) {
        // Bare names come with the scaler's replica change: now is its time.
        let time = entry.time.as_deref().unwrap_or(input.now);
        rewritten |= entry.time.is_none();
        let name = entry.machine.as_str();
        if name.is_empty() || time.parse::<Timestamp>().is_err() {
            continue;
        }
        let Some(m) = machines.get(name) else {
            continue;
        };
        if m.gone_or_failed {
            continue;
        }
        keep.push(format!("{name}~{time}"));
        if !(m.priority_one && m.marked) {
            let time = (!m.marked).then(|| time.to_owned());
            plan.mark.push((name.to_owned(), time));
        }
    }
    if rewritten && input.replica_change_time != Some(input.now) {
        plan.replica_change_time = Some(input.now.to_owned());
    }
    let new_value = keep.join(",");
    plan.update_deployment = new_value != value || plan.replica_change_time.is_some();
    plan.annotation = (!new_value.is_empty()).then_some(new_value);
    plan
}

/// A machine of the deployment named in the trigger-deletion annotation, as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TriggerMachine {
    /// Terminating, being deleted or Failed: its entry is dropped.
    pub gone_or_failed: bool,
    /// Carries `machinepriority.machine.sapcloud.io: "1"`.
    pub priority_one: bool,
    /// Carries `machine.sapcloud.io/marked-for-deletion-time`.
    pub marked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-11-26T09:00:00Z";
    const T1: &str = "2026-11-26T09:30:00Z";
    const NOW: &str = "2026-11-26T10:00:00Z";

    fn trigger_machine(gone_or_failed: bool, priority_one: bool, marked: bool) -> TriggerMachine {
        TriggerMachine {
            gone_or_failed,
            priority_one,
            marked,
        }
    }

    fn trigger(value: &str, change: Option<&str>) -> TriggerPlan {
        let machines = BTreeMap::from([
            ("a".to_owned(), trigger_machine(false, false, false)),
            ("b".to_owned(), trigger_machine(false, true, true)),
            ("c".to_owned(), trigger_machine(true, false, false)),
            ("d".to_owned(), trigger_machine(false, true, false)),
            ("e".to_owned(), trigger_machine(false, false, true)),
        ]);
        let input = TriggerInput {
            value,
            replica_change_time: change,
            now: NOW,
        };
        plan_trigger_deletion(&input, &machines)
    }

    #[test]
    fn bare_names_take_the_replica_change_time_and_never_change_replicas() {
        // The autoscaler wrote replicas and bare names in one update; no change time yet.
        let plan = trigger("a,d", None);
        assert_eq!(
            plan,
            TriggerPlan {
                mark: vec![
                    ("a".into(), Some(NOW.into())),
                    ("d".into(), Some(NOW.into()))
                ],
                annotation: Some(format!("a~{NOW},d~{NOW}")),
                replica_change_time: Some(NOW.into()),
                update_deployment: true,
            }
        );
        // After an earlier change, bare names are a new change: now, and the change time
        // moves to now (a set still at the old time does not see them marked before it).
        let plan = trigger(&format!("a,b~{T0}"), Some(T0));
        assert_eq!(plan.annotation, Some(format!("a~{NOW},b~{T0}")));
        assert_eq!(plan.replica_change_time, Some(NOW.into()));
        assert_eq!(plan.mark, vec![("a".into(), Some(NOW.into()))]);
        assert!(plan.update_deployment);
    }

    #[test]
    fn the_change_time_is_after_the_sets() {
        let now: Timestamp = "2026-11-26T10:00:00.7Z".parse().expect("time");
        assert_eq!(replica_change_time(now, None), "2026-11-26T10:00:00Z");
        let earlier = "2026-11-26T09:00:00Z".parse().ok();
        assert_eq!(replica_change_time(now, earlier), "2026-11-26T10:00:00Z");
        // The set's time is this very second: one second later.
        let same = "2026-11-26T10:00:00Z".parse().ok();
        assert_eq!(replica_change_time(now, same), "2026-11-26T10:00:01Z");
    }

    #[test]
    fn timed_entries_mark_with_their_time_and_stay() {
        let value = format!("a~{T1},b~{T0}");
        let plan = trigger(&value, Some(T1));
        // b already has priority 1 and a time: left alone, its entry stays.
        assert_eq!(plan.mark, vec![("a".into(), Some(T1.into()))]);
        assert_eq!(plan.annotation.as_deref(), Some(value.as_str()));
        assert!(!plan.update_deployment, "nothing changes on the deployment");
        // A machine with a time but another priority gets priority 1 and keeps its time;
        // one with priority 1 but no time gets the entry's time.
        let plan = trigger(&format!("e~{T1},d~{T1}"), Some(T1));
        assert_eq!(
            plan.mark,
            vec![("e".into(), None), ("d".into(), Some(T1.into()))]
        );
    }

    #[test]
    fn entries_of_gone_failed_or_malformed_are_dropped() {
        let plan = trigger(
            &format!("c~{T0},x~{T0},a~yesterday,a~{T0}~{T1},,b~{T0}"),
            Some(T0),
        );
        assert_eq!(plan.annotation, Some(format!("b~{T0}")));
        assert!(plan.mark.is_empty());
        assert!(plan.update_deployment);
        assert_eq!(plan.replica_change_time, None, "no bare name was rewritten");
        // Nothing left: the annotation is removed.
        let plan = trigger(&format!("c~{T0}"), Some(T0));
        assert_eq!(plan.annotation, None);
        assert!(plan.update_deployment);
        let plan = trigger("", Some(T0));
        assert_eq!(plan.annotation, None);
        assert!(plan.update_deployment);
    }

    #[test]
    fn parses_trigger_deletion() {
        assert_eq!(
            parse_trigger_deletion(" a, b~2024-01-01T00:00:00Z ,,"),
            vec![
                TriggerEntry {
                    machine: "a".into(),
                    time: None
                },
                TriggerEntry {
                    machine: "b".into(),
                    time: Some("2024-01-01T00:00:00Z".into())
                },
            ]
        );
    }
}
