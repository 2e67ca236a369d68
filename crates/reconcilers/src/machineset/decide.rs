//! Pure decisions of the MachineSet controller: which machines a set claims, how many it
//! creates, which it deletes (MCM's deletion order), which Failed machines it auto-preserves,
//! its status counters and status, the machines it creates from its template and the spec
//! it keeps them in line with, and the notes of its batch Events.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::ResourceExt;
use mcm_api::constants::{annotations, labels};
use mcm_api::owner::controller_reference;
use mcm_api::preservation;
use mcm_api::{
    ConditionStatus, Machine, MachinePhase, MachineSet, MachineSetCondition,
    MachineSetConditionType, MachineSetStatus,
};
use serde_json::{Value, json};

use super::model::PendingChanges;
pub(crate) use super::model::{
    AutoPreservePlan, Claim, MachineView, ReplicaPlan, SetCounts, SetInput,
};
use crate::selector::selector_matches;

/// Most machines created or deleted by one reconcile of a set (MCM's `BurstReplicas`).
pub(crate) const BURST_REPLICAS: usize = 100;
/// How long creations/deletions are awaited in the machine store before acting again.
pub(crate) const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(60);
/// Size of the first creation batch; each following batch doubles (MCM's slow start).
pub(crate) const SLOW_START_INITIAL_BATCH_SIZE: usize = 1;

/// Rank of a phase in MCM's deletion order (lower is deleted first). Machines without a
/// phase (or with an unknown one) rank lowest, like the Go map lookup that yields 0.
pub(crate) fn phase_rank(phase: Option<&MachinePhase>) -> u8 {
    match phase {
        Some(MachinePhase::Terminating) => 0,
        Some(MachinePhase::Failed) => 1,
        Some(MachinePhase::CrashLoopBackOff) => 2,
        Some(MachinePhase::Unknown) => 3,
        Some(MachinePhase::Pending) => 4,
        Some(MachinePhase::Available) => 5,
        Some(MachinePhase::Running) => 6,
        _ => 0,
    }
}

/// The priority the cluster-autoscaler (and the trigger-deletion annotation) gives the
/// machines it wants removed.
pub(crate) const MARKED_PRIORITY: i32 = 1;

/// MCM's deletion order (upstream's `ActiveMachines.Less`), lower first:
///
/// 1. machines marked with priority [`MARKED_PRIORITY`] (or lower) go first as before
///    (upstream deletes the autoscaler's marked machines besides the sorted ones, whether
///    preserved or not);
/// 2. machines that are not preserved before preserved ones; among preserved ones
///    `auto-preserved` before manually preserved ones, then the earlier expiry;
/// 3. lower priority annotation; among equal priorities the one marked for deletion earlier
///    first (marked before unmarked); then by phase (Terminating < Failed < CrashLoopBackOff
///    < Unknown < Pending < Available < Running); then the **older** machine first (MCM,
///    unlike Kubernetes ReplicaSets); the name breaks remaining ties.
pub(crate) fn deletion_order(a: &MachineView, b: &MachineView) -> Ordering {
    let marked = |m: &MachineView| m.priority <= MARKED_PRIORITY;
    marked(b)
        .cmp(&marked(a))
        .then_with(|| a.preserved.cmp(&b.preserved))
        .then_with(|| {
            if !(a.preserved && b.preserved) {
                return Ordering::Equal;
            }
            b.auto_preserved
                .cmp(&a.auto_preserved)
                .then_with(|| a.preserve_expiry.cmp(&b.preserve_expiry))
        })
        .then_with(|| a.priority.cmp(&b.priority))
        .then_with(|| match (a.marked_for_deletion, b.marked_for_deletion) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| phase_rank(a.phase.as_ref()).cmp(&phase_rank(b.phase.as_ref())))
        .then_with(|| match (a.created, b.created) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Greater,
            (None, Some(_)) => Ordering::Less,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| a.name.cmp(&b.name))
}

/// Whether the scaler chose `m` for deletion at or before `replica_change_time`: priority 1
/// with a marked-for-deletion time not after the set's last replica change by the scaler
/// (upstream's `getMachinesMarkedForDeletion`). Such a machine is deleted even when the
/// replicas do not call for it, so the set follows what the scaler decided.
pub(crate) fn marked_by_scaler(m: &MachineView, replica_change_time: Option<Timestamp>) -> bool {
    match (replica_change_time, m.marked_for_deletion) {
        (Some(change), Some(marked)) => m.priority == MARKED_PRIORITY && marked <= change,
        _ => false,
    }
}

/// MCM's `manageReplicas` (and the deletion of a deleted set's machines) as a pure function.
///
/// Terminating machines do not count. Missing machines are created unless the set is frozen
/// or its scale-up is disabled (label `node.machine.sapcloud.io/scale-up-disabled`, put on
/// the old sets of an in-place rollout, whose machines move to the new set before their old
/// set's replicas go down). Surplus machines are chosen by [`deletion_order`] among the
/// machines **without** the label `update-result: successful` (one just moved here by an
/// in-place rollout is never deleted before the set's replicas are raised for it), as
/// upstream. Machines the scaler marked ([`marked_by_scaler`]) are deleted as well, even
/// when no machine is surplus; failed machines without that label too (they are replaced on
/// the next pass) unless the set keeps them for their preservation
/// ([`MachineView::keep_if_failed`]): a kept Failed machine counts among the set's machines,
/// so no replacement is created for it.
pub(crate) fn plan_replicas(set: &SetInput, machines: &[MachineView]) -> ReplicaPlan {
    if set.deleting {
        return ReplicaPlan {
            delete: machines
                .iter()
                .filter(|m| !m.deleting)
                .map(|m| m.name.clone())
                .collect(),
            ..ReplicaPlan::default()
        };
    }
    let mut active: Vec<&MachineView> = machines.iter().filter(|m| !m.is_terminating()).collect();
    let desired = usize::try_from(set.replicas.max(0)).unwrap_or(0);
    if active.len() < desired {
        let blocked = if set.frozen {
            Some("frozen")
        } else if set.scale_up_disabled {
            Some("scale-up disabled")
        } else {
            None
        };
        return ReplicaPlan {
            create: if blocked.is_some() {
                0
            } else {
                (desired - active.len()).min(BURST_REPLICAS)
            },
            delete: Vec::new(),
            scale_up_blocked: blocked,
        };
    }
    active.retain(|m| !m.update_successful);
    active.sort_by(|a, b| deletion_order(a, b));
    let surplus = active.len().saturating_sub(desired).min(BURST_REPLICAS);
    let mut chosen: BTreeSet<&str> = BTreeSet::new();
    let mut delete = Vec::new();
    let failed = active.iter().filter(|m| m.is_failed_to_replace());
    let marked = active
        .iter()
        .filter(|m| marked_by_scaler(m, set.replica_change_time));
    for m in active.iter().take(surplus).chain(marked).chain(failed) {
        if delete.len() >= BURST_REPLICAS {
            break;
        }
        if chosen.insert(m.name.as_str()) {
            delete.push(m.name.clone());
        }
    }
    ReplicaPlan {
        create: 0,
        delete,
        scale_up_blocked: None,
    }
}

/// Batch sizes of MCM's slow start for `count` creations: 1, 2, 4, ... (the last one cut to
/// what is left).
pub(crate) fn slow_start_batches(count: usize, initial: usize) -> Vec<usize> {
    let mut batches = Vec::new();
    let mut remaining = count;
    let mut size = initial.max(1).min(remaining);
    while size > 0 {
        batches.push(size);
        remaining -= size;
        size = (2 * size).min(remaining);
    }
    batches
}

/// Kubernetes' `ClaimObject` for machines: adopt orphans that match, release owned machines
/// that no longer match (unless the set is being deleted), never touch others' machines or
/// machines being deleted.
pub(crate) fn claim(
    set_uid: &str,
    set_deleting: bool,
    selector: Option<&LabelSelector>,
    machine: &Machine,
) -> Claim {
    // The selector is matched only where the answer counts (not for other sets' machines).
    let matches = || selector_matches(selector, machine.metadata.labels.as_ref());
    match mcm_api::owner::controller_of(&machine.metadata) {
        Some(owner) if owner.uid != set_uid => Claim::Ignore,
        Some(_) if matches() => Claim::Owned,
        Some(_) if set_deleting => Claim::Ignore,
        Some(_) => Claim::Release,
        None if set_deleting || machine.metadata.deletion_timestamp.is_some() || !matches() => {
            Claim::Ignore
        }
        None => Claim::Adopt,
    }
}

/// The names of the controllers (other than the set `set_uid`) of machines that `selector`
/// matches: the set's selector overlaps theirs. Those machines are left alone ([`claim`]);
/// the overlap is worth a warning because the set will never own them. Pure.
pub(crate) fn overlapping_owners<'m>(
    set_uid: &str,
    selector: Option<&LabelSelector>,
    machines: impl IntoIterator<Item = &'m Machine>,
) -> std::collections::BTreeSet<String> {
    machines
        .into_iter()
        .filter(|m| selector_matches(selector, m.metadata.labels.as_ref()))
        .filter_map(|m| mcm_api::owner::controller_of(&m.metadata))
        .filter(|owner| owner.uid != set_uid)
        .map(|owner| format!("{} {}", owner.kind, owner.name))
        .collect()
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Counts the claimed machines of a set.
pub(crate) fn count_machines(
    machines: &[MachineView],
    min_ready_seconds: i32,
    now: Timestamp,
) -> SetCounts {
    let mut counts = SetCounts {
        replicas: count(machines.len()),
        ..SetCounts::default()
    };
    for m in machines {
        if m.fully_labeled {
            counts.fully_labeled += 1;
        }
        if m.is_ready() {
            counts.ready += 1;
        }
        if let Some(left) = m.until_available(min_ready_seconds, now) {
            if left.is_zero() {
                counts.available += 1;
            } else {
                counts.recheck_after = Some(counts.recheck_after.map_or(left, |r| r.min(left)));
            }
        }
        if m.is_preserved_failed() {
            counts.preserved_failed += 1;
        }
        if let Some(f) = m.failed_summary() {
            counts.failed.push(f.clone());
        }
        if m.auto_preserved {
            counts.auto_preserved += 1;
        }
    }
    counts
}

/// Which machines of a set get (or lose) the `auto-preserved` annotation, so that at most
/// `max` (`spec.autoPreserveFailedMachineMax`) of them carry it. The machines carrying it
/// now are counted from `machines` themselves (not from the set's status, which may be
/// stale).
///
/// Room left: Failed machines whose own preserve annotation is not a valid value (a user's
/// `now`, `when-failed` or `false` is never overridden; the Node's annotation is not looked
/// at, as upstream) are annotated, the **newest** first. Over the limit (the maximum was
/// lowered): the annotation is removed from the **oldest** auto-preserved machines; manually
/// preserved machines are never touched. Machines being deleted are not annotated. Pure.
pub(crate) fn plan_auto_preservation<'m>(
    max: i32,
    machines: impl IntoIterator<Item = &'m Machine>,
) -> AutoPreservePlan {
    let machines: Vec<&Machine> = machines.into_iter().collect();
    let carrying: Vec<&Machine> = machines
        .iter()
        .copied()
        .filter(|m| preservation::is_auto_preserved(m))
        .collect();
    let remaining = i64::from(max.max(0)) - i64::try_from(carrying.len()).unwrap_or(i64::MAX);
    let created = |m: &Machine| m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let name = |m: &Machine| m.metadata.name.clone().unwrap_or_default();
    let take = |n: i64| usize::try_from(n).unwrap_or(0);
    let mut plan = AutoPreservePlan::default();
    if remaining < 0 {
        let mut oldest = carrying;
        oldest.sort_by(|a, b| {
            created(a)
                .cmp(&created(b))
                .then_with(|| name(a).cmp(&name(b)))
        });
        plan.release = oldest
            .into_iter()
            .take(take(-remaining))
            .map(name)
            .collect();
    } else if remaining > 0 {
        let mut newest: Vec<&Machine> = machines
            .into_iter()
            .filter(|m| {
                m.phase() == Some(&MachinePhase::Failed)
                    && m.metadata.deletion_timestamp.is_none()
                    && !preservation::has_own_preserve_value(m)
            })
            .collect();
        newest.sort_by(|a, b| {
            created(b)
                .cmp(&created(a))
                .then_with(|| name(a).cmp(&name(b)))
        });
        plan.annotate = newest.into_iter().take(take(remaining)).map(name).collect();
    }
    plan
}

/// Whether a set carries the `freeze: True` label.
pub(crate) fn is_frozen(set_labels: Option<&BTreeMap<String, String>>) -> bool {
    set_labels
        .and_then(|l| l.get(labels::FREEZE))
        .is_some_and(|v| v == labels::TRUE_VALUE)
}

/// The set's `node.machine.sapcloud.io/effective-creation-timeout` annotation, parsed
/// (`None` without one).
pub(crate) fn effective_creation_timeout(
    set: &MachineSet,
) -> Option<Result<Duration, mcm_api::duration::DurationError>> {
    let value = set
        .annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)?;
    Some(mcm_api::duration::parse_go_duration(value))
}

/// The Machine a set creates: template labels, annotations and spec, `generateName:
/// <set>-`, the set as controller, no finalizers (the machine controller adds its own).
/// The set's effective-creation-timeout annotation goes onto the Machine, and when it parses
/// it is the Machine's `spec.creationTimeout` too (upstream's rule).
pub(crate) fn machine_from_template(set: &MachineSet) -> Machine {
    let template = set.spec.template.clone().unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut machine_annotations = meta.annotations;
    let mut spec = template.spec.unwrap_or_default();
    if let Some(value) = set
        .annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
    {
        machine_annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                annotations::EFFECTIVE_CREATION_TIMEOUT.into(),
                value.clone(),
            );
        if let Some(Ok(timeout)) = effective_creation_timeout(set) {
            spec.configuration.creation_timeout = Some(mcm_api::GoDuration(timeout));
        }
    }
    Machine {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", set.name_any())),
            namespace: set.namespace(),
            labels: meta.labels,
            annotations: machine_annotations,
            owner_references: Some(vec![controller_reference(set)]),
            ..ObjectMeta::default()
        },
        spec,
        ..Machine::default()
    }
}

/// The patch that brings a machine's node template, configuration and class kind in line
/// with its set's template (MCM's `syncMachinesNodeTemplates`, `syncMachinesConfig`,
/// `syncMachinesClassKind`), or `None` when nothing differs.
pub(crate) fn machine_spec_patch(set: &MachineSet, machine: &Machine) -> Option<Value> {
    let template = set.spec.template.as_ref()?.spec.as_ref()?;
    let mut spec = serde_json::Map::new();
    let want = serde_json::to_value(&template.node_template).unwrap_or(Value::Null);
    let have = serde_json::to_value(&machine.spec.node_template).unwrap_or(Value::Null);
    if mcm_api::canonical::canonical(&want, &[]) != mcm_api::canonical::canonical(&have, &[]) {
        // A merge patch that also removes the labels, annotations and taints the set no
        // longer has.
        let patch = mcm_api::canonical::merge_patch_to(&have, &want).unwrap_or(Value::Null);
        spec.insert("nodeTemplate".into(), patch);
    }
    // A machine created under an effective creation timeout keeps it.
    let mut configuration = template.configuration.clone();
    if let Some(timeout) = machine
        .annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
        .and_then(|v| mcm_api::duration::parse_go_duration(v).ok())
    {
        configuration.creation_timeout = Some(mcm_api::GoDuration(timeout));
    }
    if configuration != machine.spec.configuration {
        let want = serde_json::to_value(&configuration).unwrap_or(Value::Null);
        let have = serde_json::to_value(&machine.spec.configuration).unwrap_or(Value::Null);
        if let (Value::Object(want), Value::Object(have)) = (want, have) {
            for k in have.keys() {
                if !want.contains_key(k) {
                    spec.insert(k.clone(), Value::Null);
                }
            }
            spec.extend(want);
        }
    }
    let want_kind = template.class.as_ref().and_then(|c| c.kind.as_ref());
    let have_kind = machine.spec.class.as_ref().and_then(|c| c.kind.as_ref());
    if want_kind.is_some() && want_kind != have_kind {
        spec.insert("class".into(), json!({"kind": want_kind}));
    }
    (!spec.is_empty()).then(|| json!({"spec": spec}))
}

/// Why a reconcile failed to manage a set's replicas: the `ReplicaFailure` condition's
/// reason and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaFailure<'a> {
    /// `FailedCreate` or `FailedDelete`.
    pub reason: &'a str,
    /// The error.
    pub message: &'a str,
}

/// The status a set should have at `now`, after a reconcile that failed with `failure`
/// (`None`: it did not). Pure.
pub(crate) fn desired_status(
    set: &MachineSet,
    counts: &SetCounts,
    failure: Option<ReplicaFailure<'_>>,
    now: Timestamp,
) -> MachineSetStatus {
    let prev = set.status.clone().unwrap_or_default();
    let mut conditions = prev.conditions.clone().unwrap_or_default();
    match failure {
        Some(f) => {
            match conditions
                .iter_mut()
                .find(|c| c.type_ == MachineSetConditionType::ReplicaFailure)
            {
                Some(c) if c.message.as_deref() == Some(f.message) => {}
                Some(c) => c.message = Some(f.message.to_owned()),
                None => conditions.push(MachineSetCondition {
                    type_: MachineSetConditionType::ReplicaFailure,
                    status: ConditionStatus::True,
                    last_transition_time: Some(Time(now)),
                    reason: Some(f.reason.to_owned()),
                    message: Some(f.message.to_owned()),
                }),
            }
        }
        None => conditions.retain(|c| c.type_ != MachineSetConditionType::ReplicaFailure),
    }
    MachineSetStatus {
        replicas: Some(counts.replicas),
        fully_labeled_replicas: Some(counts.fully_labeled),
        ready_replicas: Some(counts.ready),
        available_replicas: Some(counts.available),
        observed_generation: set.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        last_operation: prev.last_operation,
        failed_machines: (!counts.failed.is_empty()).then(|| counts.failed.clone()),
        // Both `omitempty` upstream.
        auto_preserve_failed_machine_count: (counts.auto_preserved > 0)
            .then_some(counts.auto_preserved),
        preserved_failed_replicas: (counts.preserved_failed > 0).then_some(counts.preserved_failed),
    }
}

/// Whether the store's `machines` show the changes a set waits for (or the wait timed out
/// at `now`): the set may act again. Pure.
pub(crate) fn expectations_satisfied(
    pending: &PendingChanges,
    machines: &[Arc<Machine>],
    now: Instant,
) -> bool {
    let by_name: BTreeMap<&str, &Machine> = machines
        .iter()
        .map(|m| (m.metadata.name.as_deref().unwrap_or(""), m.as_ref()))
        .collect();
    let created_seen = pending
        .created
        .iter()
        .all(|n| by_name.contains_key(n.as_str()));
    let deleted_seen = pending.deleted.iter().all(|n| {
        by_name
            .get(n.as_str())
            .is_none_or(|m| m.metadata.deletion_timestamp.is_some())
    });
    (created_seen && deleted_seen)
        || now.saturating_duration_since(pending.since) > EXPECTATIONS_TIMEOUT
}

/// The set as [`plan_replicas`] sees it. Pure.
pub(crate) fn set_input(set: &MachineSet) -> SetInput {
    SetInput {
        replicas: set.spec.replicas(),
        frozen: is_frozen(set.metadata.labels.as_ref()),
        scale_up_disabled: set
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(labels::MACHINE_SET_SCALE_UP_DISABLED)),
        deleting: set.metadata.deletion_timestamp.is_some(),
        replica_change_time: set
            .annotations()
            .get(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
            .and_then(|t| t.parse().ok()),
    }
}

/// The views of the `claimed` machines of `set` at `now`; a Failed machine's with its Node's
/// preserve annotation from `node_preserve` (by machine name), which decides only whether a
/// Failed machine is kept ([`MachineView::keep_if_failed`]). Pure.
pub(crate) fn views(
    set: &MachineSet,
    claimed: &[Arc<Machine>],
    node_preserve: &BTreeMap<String, String>,
    now: Timestamp,
) -> Vec<MachineView> {
    let template_labels = set.template_labels();
    claimed
        .iter()
        .map(|m| {
            let node = (m.phase() == Some(&MachinePhase::Failed))
                .then(|| node_preserve.get(&m.name_any()).map(String::as_str))
                .flatten();
            MachineView::from_machine(m, template_labels, node, now)
        })
        .collect()
}

/// The note of the selector-overlap warning of the set `set_uid` (empty: no overlap): the
/// controllers of other machines its selector matches. Pure.
pub(crate) fn overlap_note<'m>(
    set_uid: &str,
    selector: Option<&LabelSelector>,
    machines: impl IntoIterator<Item = &'m Machine>,
) -> String {
    let owners = overlapping_owners(set_uid, selector, machines);
    if owners.is_empty() {
        return String::new();
    }
    format!(
        "spec.selector also matches machines controlled by {}; this MachineSet leaves them alone and never owns them (make the selectors disjoint)",
        owners.into_iter().collect::<Vec<_>>().join(", ")
    )
}

/// `machine` as it is once its `auto-preserved` annotation is set (`auto_preserved`) or
/// removed: what the auto-preservation patch makes of it. Pure.
pub(crate) fn with_auto_preservation(machine: &Machine, auto_preserved: bool) -> Machine {
    let mut m = machine.clone();
    let anns = m.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if auto_preserved {
        anns.insert(
            annotations::PRESERVE.to_owned(),
            annotations::preserve_values::AUTO_PRESERVED.to_owned(),
        );
    } else {
        anns.remove(annotations::PRESERVE);
    }
    m
}

#[cfg(test)]
use super::act::{batch_note, without_counters};

#[cfg(test)]
mod tests {
    use super::*;
    use mcm_api::MachineState;

    #[test]
    fn machines_of_other_controllers_that_the_selector_matches_are_an_overlap() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let machine = |labels: &[(&str, &str)], owner: Option<(&str, &str)>| {
            let mut m = Machine::default();
            m.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            m.metadata.owner_references = owner.map(|(name, uid)| {
                vec![OwnerReference {
                    api_version: "machine.sapcloud.io/v1alpha1".into(),
                    kind: "MachineSet".into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            });
            m
        };
        let selector = LabelSelector {
            match_labels: Some([("pool".to_string(), "a".to_string())].into()),
            ..Default::default()
        };
        let machines = [
            machine(&[("pool", "a")], Some(("other", "u2"))),
            machine(&[("pool", "a")], Some(("me", "u1"))),
            machine(&[("pool", "a")], None),
            machine(&[("pool", "b")], Some(("third", "u3"))),
        ];
        let owners = overlapping_owners("u1", Some(&selector), &machines);
        assert_eq!(owners.into_iter().collect::<Vec<_>>(), ["MachineSet other"]);
        assert!(overlapping_owners("u2", Some(&selector), &machines[..1]).is_empty());
    }

    fn view(name: &str, phase: MachinePhase, priority: i32, created: i64) -> MachineView {
        MachineView {
            name: name.into(),
            phase: Some(phase),
            priority,
            marked_for_deletion: None,
            created: Timestamp::from_second(created).ok(),
            deleting: false,
            phase_since: None,
            fully_labeled: true,
            preserved: false,
            auto_preserved: false,
            preserve_expiry: None,
            keep_if_failed: false,
            failure: None,
            update_successful: false,
        }
    }

    /// `v` just moved to its set by an in-place rollout (label `update-result: successful`).
    fn moved(mut v: MachineView) -> MachineView {
        v.update_successful = true;
        v
    }

    #[test]
    fn a_machine_moved_by_an_in_place_update_is_never_surplus() {
        // The new set still has 1 replica when its second machine arrives: nothing goes.
        let input = SetInput {
            replicas: 1,
            ..SetInput::default()
        };
        let ms = [
            view("fresh", MachinePhase::Running, 3, 1),
            moved(view("moved", MachinePhase::Running, 3, 2)),
        ];
        assert_eq!(plan_replicas(&input, &ms), ReplicaPlan::default());
        // Even the autoscaler's mark does not make it surplus; the surplus is counted over
        // the other machines only.
        let ms = [
            view("a", MachinePhase::Running, 3, 1),
            view("b", MachinePhase::Running, 3, 2),
            moved(view("moved", MachinePhase::Running, 1, 3)),
        ];
        assert_eq!(plan_replicas(&input, &ms).delete, vec!["a"]);
        // A Failed machine with the label is not replaced either (upstream keeps it).
        let ms = [moved(view("moved", MachinePhase::Failed, 3, 1))];
        assert_eq!(plan_replicas(&input, &ms), ReplicaPlan::default());
        // It still counts among the machines: no creation for it.
        let input = SetInput {
            replicas: 2,
            ..SetInput::default()
        };
        let ms = [
            view("fresh", MachinePhase::Running, 3, 1),
            moved(view("moved", MachinePhase::Running, 3, 2)),
        ];
        assert_eq!(plan_replicas(&input, &ms), ReplicaPlan::default());
    }

    fn marked(mut v: MachineView, at: i64) -> MachineView {
        v.marked_for_deletion = Timestamp::from_second(at).ok();
        v
    }

    #[test]
    fn machines_the_scaler_marked_go_even_when_the_replicas_do_not_change() {
        // Upstream #1078: the autoscaler's priority-1 machine beyond what its replica count
        // removed is deleted, though the set has exactly its replicas.
        let input = SetInput {
            replicas: 2,
            replica_change_time: Timestamp::from_second(100).ok(),
            ..SetInput::default()
        };
        let ms = [
            view("a", MachinePhase::Running, 3, 1),
            marked(view("b", MachinePhase::Running, 1, 2), 100),
        ];
        assert_eq!(plan_replicas(&input, &ms).delete, vec!["b"]);
        // Marked after the last replica change, or without the set's change time, or with
        // another priority: only the surplus goes.
        let later = [
            view("a", MachinePhase::Running, 3, 1),
            marked(view("b", MachinePhase::Running, 1, 2), 101),
        ];
        assert_eq!(plan_replicas(&input, &later), ReplicaPlan::default());
        let no_time = SetInput {
            replica_change_time: None,
            ..input
        };
        assert_eq!(plan_replicas(&no_time, &ms), ReplicaPlan::default());
        let priority_two = [
            view("a", MachinePhase::Running, 3, 1),
            marked(view("b", MachinePhase::Running, 2, 2), 50),
        ];
        assert_eq!(plan_replicas(&input, &priority_two), ReplicaPlan::default());
        // Scaled down by one together with the mark: that machine, and only it, goes.
        let down = SetInput {
            replicas: 1,
            ..input
        };
        assert_eq!(plan_replicas(&down, &ms).delete, vec!["b"]);
        // While machines are missing the set creates first (as upstream).
        let up = SetInput {
            replicas: 3,
            ..input
        };
        assert_eq!(plan_replicas(&up, &ms).create, 1);
        assert!(plan_replicas(&up, &ms).delete.is_empty());
        // A terminating marked machine is not deleted again.
        let mut going = marked(view("b", MachinePhase::Running, 1, 2), 100);
        going.deleting = true;
        let ms = [view("a", MachinePhase::Running, 3, 1), going];
        assert_eq!(
            plan_replicas(
                &SetInput {
                    replicas: 1,
                    ..input
                },
                &ms
            ),
            ReplicaPlan::default()
        );
    }

    #[test]
    fn a_set_with_scale_up_disabled_creates_no_machine_but_still_deletes() {
        let disabled = SetInput {
            replicas: 3,
            scale_up_disabled: true,
            ..SetInput::default()
        };
        let ms = [view("a", MachinePhase::Running, 3, 1)];
        assert_eq!(
            plan_replicas(&disabled, &ms),
            ReplicaPlan {
                create: 0,
                delete: Vec::new(),
                scale_up_blocked: Some("scale-up disabled"),
            }
        );
        let enabled = SetInput {
            scale_up_disabled: false,
            ..disabled
        };
        assert_eq!(plan_replicas(&enabled, &ms).create, 2);
        // Scaled down, it deletes its surplus as usual.
        let down = SetInput {
            replicas: 0,
            ..disabled
        };
        assert_eq!(plan_replicas(&down, &ms).delete, vec!["a"]);
    }

    #[test]
    fn available_machines_count_as_available_not_as_ready() {
        let now = Timestamp::from_second(1_000).unwrap();
        let ms = [
            view("running", MachinePhase::Running, 3, 1),
            view("available", MachinePhase::Available, 3, 2),
            view("pending", MachinePhase::Pending, 3, 3),
            view("updating", MachinePhase::InPlaceUpdating, 3, 4),
        ];
        let by = |n: &str| ms.iter().find(|m| m.name == n).unwrap();
        assert!(by("available").is_available_phase() && !by("available").is_ready());
        assert!(by("running").is_available_phase() && by("running").is_ready());
        assert!(!by("pending").is_available_phase());
        assert!(!by("updating").is_available_phase());
        let counts = count_machines(&ms, 0, now);
        assert_eq!((counts.ready, counts.available), (1, 2));
        // A terminating Available machine is neither.
        let mut gone = view("gone", MachinePhase::Available, 3, 5);
        gone.deleting = true;
        assert_eq!(count_machines(&[gone], 0, now).available, 0);
        // minReadySeconds applies to both phases.
        let mut since = view("available", MachinePhase::Available, 3, 2);
        since.phase_since = Timestamp::from_second(990).ok();
        let counts = count_machines(&[since], 30, now);
        assert_eq!(counts.available, 0);
        assert_eq!(counts.recheck_after, Some(Duration::from_secs(20)));
    }

    /// `v` preserved until `expiry` (seconds), automatically or not.
    fn preserved(mut v: MachineView, expiry: i64, auto: bool) -> MachineView {
        v.preserved = true;
        v.auto_preserved = auto;
        v.preserve_expiry = Timestamp::from_second(expiry).ok();
        v.keep_if_failed = true;
        v
    }

    fn names(ms: &[MachineView]) -> Vec<&str> {
        ms.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn preserved_machines_are_deleted_last_auto_preserved_and_earlier_expiry_first() {
        let mut ms = [
            preserved(view("manual-late", MachinePhase::Running, 3, 1), 900, false),
            preserved(view("manual-early", MachinePhase::Failed, 3, 2), 500, false),
            preserved(view("auto-late", MachinePhase::Failed, 3, 3), 800, true),
            preserved(view("auto-early", MachinePhase::Failed, 3, 4), 700, true),
            view("running", MachinePhase::Running, 3, 5),
            view("pending", MachinePhase::Pending, 3, 6),
            // A user's priority does not make a preserved machine go before others ...
            preserved(view("manual-low", MachinePhase::Running, 2, 7), 950, false),
            // ... but the autoscaler's mark does.
            preserved(
                view("marked-preserved", MachinePhase::Running, 1, 8),
                999,
                false,
            ),
            view("marked", MachinePhase::Running, 1, 9),
        ];
        ms.sort_by(deletion_order);
        assert_eq!(
            names(&ms),
            vec![
                "marked",
                "marked-preserved",
                "pending",
                "running",
                "auto-early",
                "auto-late",
                "manual-early",
                "manual-late",
                "manual-low",
            ]
        );
    }

    #[test]
    fn scale_down_spares_preserved_machines_and_kept_failed_ones_are_not_replaced() {
        let input = SetInput {
            replicas: 2,
            ..SetInput::default()
        };
        let ms = [
            preserved(
                view("old-preserved", MachinePhase::Running, 3, 1),
                900,
                false,
            ),
            view("mid", MachinePhase::Running, 3, 2),
            view("new", MachinePhase::Running, 3, 3),
        ];
        assert_eq!(plan_replicas(&input, &ms).delete, vec!["mid"]);

        // A preserved Failed machine counts: nothing is created or deleted for it.
        let input = SetInput {
            replicas: 3,
            ..SetInput::default()
        };
        let kept = preserved(view("failed", MachinePhase::Failed, 3, 1), 900, false);
        let ms = [
            kept.clone(),
            view("a", MachinePhase::Running, 3, 2),
            view("b", MachinePhase::Running, 3, 3),
        ];
        assert_eq!(plan_replicas(&input, &ms), ReplicaPlan::default());
        // Starting to be preserved (annotated, no expiry yet): kept as well.
        let mut starting = view("failed", MachinePhase::Failed, 3, 1);
        starting.keep_if_failed = true;
        let ms = [starting, ms[1].clone(), ms[2].clone()];
        assert_eq!(plan_replicas(&input, &ms), ReplicaPlan::default());
        // Not kept: deleted (and replaced on the next pass).
        let ms = [
            view("failed", MachinePhase::Failed, 3, 1),
            ms[1].clone(),
            ms[2].clone(),
        ];
        assert_eq!(plan_replicas(&input, &ms).delete, vec!["failed"]);
    }

    fn machine(name: &str, phase: &str, created: i64, annotation: Option<&str>) -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some(name.into());
        m.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(created).unwrap(),
        ));
        m.metadata.annotations =
            annotation.map(|v| [(annotations::PRESERVE.to_string(), v.to_string())].into());
        m.status = Some(mcm_api::MachineStatus {
            current_status: Some(mcm_api::CurrentStatus {
                phase: Some(MachinePhase::from(phase.to_string())),
                ..Default::default()
            }),
            ..Default::default()
        });
        m
    }

    #[test]
    fn auto_preservation_takes_the_newest_failed_machines_without_a_users_value() {
        let ms = [
            machine("old-failed", "Failed", 1, None),
            machine("new-failed", "Failed", 3, None),
            machine("mid-failed", "Failed", 2, Some("bogus")),
            machine("users-false", "Failed", 4, Some("false")),
            machine("users-when-failed", "Failed", 5, Some("when-failed")),
            machine("running", "Running", 6, None),
        ];
        let plan = plan_auto_preservation(2, &ms);
        assert_eq!(plan.annotate, vec!["new-failed", "mid-failed"]);
        assert!(plan.release.is_empty());
        // Already one auto-preserved (any phase counts): room for one more.
        let mut with_one = ms.to_vec();
        with_one.push(machine("auto", "Running", 0, Some("auto-preserved")));
        let plan = plan_auto_preservation(2, &with_one);
        assert_eq!(plan.annotate, vec!["new-failed"]);
        // Limit reached, or none allowed: nothing.
        assert_eq!(
            plan_auto_preservation(1, &with_one),
            AutoPreservePlan::default()
        );
        assert_eq!(plan_auto_preservation(0, &ms), AutoPreservePlan::default());
        // A machine being deleted is not annotated.
        let mut deleting = machine("deleting", "Failed", 9, None);
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        assert!(plan_auto_preservation(1, [&deleting]).annotate.is_empty());
    }

    #[test]
    fn over_the_limit_the_oldest_auto_preserved_machines_are_released() {
        let ms = [
            machine("new", "Failed", 3, Some("auto-preserved")),
            machine("old", "Failed", 1, Some("auto-preserved")),
            machine("mid", "Running", 2, Some("auto-preserved")),
            machine("manual", "Failed", 0, Some("now")),
            machine("candidate", "Failed", 4, None),
        ];
        let plan = plan_auto_preservation(1, &ms);
        assert_eq!(plan.release, vec!["old", "mid"]);
        assert!(plan.annotate.is_empty());
        assert_eq!(plan_auto_preservation(0, &ms).release.len(), 3);
    }

    #[test]
    fn views_and_counts_of_preserved_machines() {
        let now = Timestamp::from_second(1_000).unwrap();
        let with_expiry = |mut m: Machine, expiry: i64| {
            let cs = m.status.as_mut().unwrap().current_status.as_mut().unwrap();
            cs.preserve_expiry_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(expiry).unwrap(),
            ));
            m
        };
        let failed_op = |mut m: Machine| {
            m.status.as_mut().unwrap().last_operation = Some(mcm_api::LastOperation {
                state: Some(MachineState::Failed),
                ..Default::default()
            });
            m
        };
        let ms = [
            // Preserved and Failed: counted as preserved, not as failed.
            failed_op(with_expiry(
                machine("kept", "Failed", 1, Some("when-failed")),
                2_000,
            )),
            // Expired: still counted as preserved (any expiry), but replaced.
            failed_op(with_expiry(
                machine("expired", "Failed", 2, Some("now")),
                500,
            )),
            // Failed, not preserved: a failed machine.
            failed_op(machine("failed", "Failed", 3, None)),
            // Auto-preserved, preservation not started yet: kept.
            failed_op(machine("auto", "Failed", 4, Some("auto-preserved"))),
            with_expiry(machine("running", "Running", 5, Some("now")), 2_000),
        ];
        let views: Vec<MachineView> = ms
            .iter()
            .map(|m| MachineView::from_machine(m, None, None, now))
            .collect();
        let by = |n: &str| views.iter().find(|v| v.name == n).unwrap();
        assert!(by("kept").preserved && by("kept").keep_if_failed);
        assert!(!by("expired").preserved && !by("expired").keep_if_failed);
        assert!(!by("failed").keep_if_failed);
        assert!(by("auto").keep_if_failed && by("auto").auto_preserved);
        assert!(by("running").preserved);
        let counts = count_machines(&views, 0, now);
        assert_eq!(counts.preserved_failed, 2);
        assert_eq!(counts.auto_preserved, 1);
        let failed: Vec<_> = counts
            .failed
            .iter()
            .map(|f| f.name.clone().unwrap())
            .collect();
        assert_eq!(failed, vec!["failed", "auto"]);
        // The Node's value wins: `false` there ends the wait for a preservation.
        let v = MachineView::from_machine(&ms[3], None, Some("false"), now);
        assert!(!v.keep_if_failed);
    }

    #[test]
    fn slow_start() {
        assert_eq!(slow_start_batches(0, 1), Vec::<usize>::new());
        assert_eq!(slow_start_batches(1, 1), vec![1]);
        assert_eq!(slow_start_batches(6, 1), vec![1, 2, 3]);
        assert_eq!(slow_start_batches(15, 1), vec![1, 2, 4, 8]);
        assert_eq!(slow_start_batches(20, 1), vec![1, 2, 4, 8, 5]);
    }

    #[test]
    fn deletion_order_table() {
        let mut ms = [
            view("running-old", MachinePhase::Running, 3, 10),
            view("running-new", MachinePhase::Running, 3, 20),
            view("pending", MachinePhase::Pending, 3, 30),
            view("failed", MachinePhase::Failed, 3, 40),
            view("marked", MachinePhase::Running, 1, 50),
            view("unknown", MachinePhase::Unknown, 3, 5),
            view("crash", MachinePhase::CrashLoopBackOff, 3, 5),
            view("low", MachinePhase::Running, 2, 5),
        ];
        ms.sort_by(deletion_order);
        let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "marked",
                "low",
                "failed",
                "crash",
                "unknown",
                "pending",
                "running-old",
                "running-new"
            ]
        );
    }

    #[test]
    fn a_batch_is_told_in_one_note() {
        let names = |n: usize| (0..n).map(|i| format!("m-{i}")).collect::<Vec<_>>();
        assert_eq!(super::batch_note("Created", "Machine", &[]), None);
        assert_eq!(
            super::batch_note("Created", "Machine", &names(1)).as_deref(),
            Some("Created Machine: m-0")
        );
        assert_eq!(
            super::batch_note("Deleted", "machine", &names(3)).as_deref(),
            Some("Deleted 3 machines: m-0, m-1, m-2")
        );
        let many = super::batch_note("Created", "Machine", &names(64)).unwrap();
        assert!(many.starts_with("Created 64 Machines: m-0, m-1,"), "{many}");
        assert!(many.ends_with("m-9 and 54 more"), "{many}");
        assert!(many.len() < 1024);
    }

    fn status(ready: i32, failure: Option<&str>) -> MachineSetStatus {
        MachineSetStatus {
            replicas: Some(3),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            observed_generation: Some(1),
            conditions: failure.map(|m| {
                vec![MachineSetCondition {
                    type_: MachineSetConditionType::ReplicaFailure,
                    status: ConditionStatus::True,
                    last_transition_time: None,
                    reason: Some("FailedCreate".into()),
                    message: Some(m.into()),
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn counters_and_messages_are_not_significant_a_new_failure_is() {
        assert_eq!(
            without_counters(&status(1, None)),
            without_counters(&status(2, None))
        );
        assert_eq!(
            without_counters(&status(1, Some("quota"))),
            without_counters(&status(2, Some("quota again")))
        );
        assert_ne!(
            without_counters(&status(1, None)),
            without_counters(&status(1, Some("quota")))
        );
    }

    #[test]
    fn a_set_passes_its_effective_creation_timeout_to_new_machines() {
        let mut set = MachineSet::default();
        set.metadata.name = Some("s".into());
        let mut template = mcm_api::MachineTemplateSpec::default();
        let mut spec = mcm_api::MachineSpec::default();
        spec.configuration.creation_timeout = Some(mcm_api::GoDuration(Duration::from_secs(60)));
        template.spec = Some(spec);
        set.spec.template = Some(template);
        let m = machine_from_template(&set);
        assert_eq!(
            m.spec.configuration.creation_timeout,
            Some(mcm_api::GoDuration(Duration::from_secs(60)))
        );
        set.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "7m".to_owned(),
        )]));
        let m = machine_from_template(&set);
        assert_eq!(
            m.spec.configuration.creation_timeout,
            Some(mcm_api::GoDuration(Duration::from_secs(420)))
        );
        assert_eq!(
            m.annotations()[annotations::EFFECTIVE_CREATION_TIMEOUT],
            "7m"
        );
        // The spec sync of the set keeps it.
        assert_eq!(machine_spec_patch(&set, &m), None);
        // A value that is no duration is copied but sets nothing.
        set.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "7 minutes".to_owned(),
        )]));
        let m = machine_from_template(&set);
        assert_eq!(
            m.spec.configuration.creation_timeout.map(|g| g.0.as_secs()),
            Some(60)
        );
        assert!(matches!(effective_creation_timeout(&set), Some(Err(_))));
    }
}
