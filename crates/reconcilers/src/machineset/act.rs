//! The effects of the MachineSet controller, as [`super::execute`] carries a decision out:
//! its API writes (finalizer, controller references, machine specs and auto-preservation,
//! creations in slow-start batches, deletions, status) and its Events (announcements
//! deduplicated by the context's records).

use crate::pacer::Admission;
use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};
use mcm_api::constants::annotations;
use mcm_api::constants::annotations::preserve_values;
use mcm_api::{Machine, MachineSet, MachineSetConditionType, MachineSetStatus};
use serde_json::{Value, json};

use super::budget::RefusalNote;
use super::context::{Context, Error, FINALIZER};
use super::plan::PreserveWrite;
use crate::kube_api::{
    self, ApiCallError, ApiErrorExt, ApiResultExt, Outcome, Part, merge_patch, status_patch,
};

/// Reason of the Warning Event when a MachineDisruptionBudget holds back a deletion.
pub(crate) const DISRUPTION_BLOCKED: &str =
    mcm_api::disruption_budget::condition_reasons::DISRUPTION_BLOCKED;
/// Reason of the Warning Event about a selector that matches others' machines.
pub(crate) const SELECTOR_OVERLAP: &str = "SelectorOverlap";

/// The object reference of a set for events.
pub(crate) fn set_reference(set: &MachineSet) -> ObjectReference {
    set.object_ref(&())
}

/// Publishes the selector-overlap Warning `note` on the set when it differs from the one
/// announced last for the set (an empty note: the overlap is gone, a later one is new).
pub(crate) async fn announce_overlap(ctx: &Context, set: &MachineSet, note: &str) {
    let uid = set.metadata.uid.clone().unwrap_or_default();
    if ctx.overlaps.is_new(&uid, note) {
        ctx.events
            .warning(
                &set_reference(set),
                SELECTOR_OVERLAP,
                "Claim",
                note.to_owned(),
            )
            .await;
    }
}

/// Publishes the Warning Events of budget refusals (on the set and on each budget) when
/// their note differs from the one announced last for the set.
pub(crate) async fn announce_refusals(ctx: &Context, set: &MachineSet, refusals: &RefusalNote) {
    let uid = set.metadata.uid.clone().unwrap_or_default();
    if !ctx.announced_blocks.is_new(&uid, &refusals.note) {
        return;
    }
    for (reference, text) in &refusals.events {
        ctx.events
            .warning(reference, DISRUPTION_BLOCKED, "Delete", text.clone())
            .await;
    }
}

/// Forgets what was announced for `set` (it goes: nothing more is announced).
pub(crate) fn forget_announcements(ctx: &Context, set: &MachineSet) {
    if let Some(uid) = set.metadata.uid.as_deref() {
        ctx.overlaps.forget(uid);
        ctx.announced_blocks.forget(uid);
    }
}

/// Adds (`present`) or removes the finalizer of `set`; [`Outcome::Gone`] when the set no
/// longer exists.
pub(crate) async fn set_finalizer(
    api: &Api<MachineSet>,
    set: &MachineSet,
    present: bool,
) -> Result<Outcome, Error> {
    let outcome = kube_api::set_finalizer(api, set, FINALIZER, present)
        .await
        .context("update finalizers of", MachineSet::KIND, &set.name_any())?;
    Ok(outcome)
}

/// Sets (adopt) or removes (release) the controller reference of a machine. Returns false
/// when the machine is gone.
pub(crate) async fn set_controller(
    api: &Api<Machine>,
    machine: &Machine,
    owner: Option<OwnerReference>,
) -> Result<bool, Error> {
    let mut refs: Vec<OwnerReference> = machine
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.controller != Some(true))
        .collect();
    refs.extend(owner);
    let patch = json!({"metadata": {
        "ownerReferences": refs,
        "uid": machine.metadata.uid,
    }});
    let name = machine.name_any();
    let outcome = merge_patch(api, Part::Object, &name, &patch)
        .await
        .context("update owner of", "Machine", &name)?;
    Ok(!outcome.is_gone())
}

/// Applies the spec patches `syncs` (machine name, merge patch) to the set's machines (a
/// machine gone meanwhile needs no sync).
pub(crate) async fn sync_machine_specs(
    api: &Api<Machine>,
    syncs: &[(String, Value)],
) -> Result<(), Error> {
    for (name, patch) in syncs {
        let _ = merge_patch(api, Part::Object, name, patch).await.context(
            "sync spec of",
            "Machine",
            name,
        )?;
    }
    Ok(())
}

/// Carries out the auto-preservation `writes`: sets or removes
/// `node.machine.sapcloud.io/preserve: auto-preserved` (each patch guarded by the
/// resourceVersion the plan was made from, so that a user's annotation set meanwhile is
/// never overwritten: the conflict retries the reconcile). `Ok(false)`: a machine was gone
/// (the writes after it are not made).
pub(crate) async fn manage_auto_preservation(
    api: &Api<Machine>,
    writes: &[PreserveWrite],
) -> Result<bool, Error> {
    for w in writes {
        let value = if w.auto_preserved {
            Value::from(preserve_values::AUTO_PRESERVED)
        } else {
            Value::Null
        };
        let patch = json!({"metadata": {
            "resourceVersion": w.resource_version,
            "annotations": {annotations::PRESERVE: value},
        }});
        match kube_api::patch_existing(api, Part::Object, &w.machine, &patch).await {
            Ok(_) => tracing::info!(
                machine = %w.machine,
                auto_preserved = w.auto_preserved,
                "updated the auto-preservation of a machine"
            ),
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => {
                return Err(ApiCallError::new(
                    "update auto-preservation of",
                    "Machine",
                    &w.machine,
                    e,
                )
                .into());
            }
        }
    }
    Ok(true)
}

/// Creates machines like `template` in `batches` (a failed batch skips the rest: slow
/// start), after the Warning `invalid_timeout` if any; puts the names created into
/// `created`.
pub(crate) async fn create_machines(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    batches: &[usize],
    template: &Machine,
    invalid_timeout: Option<&str>,
    created: &mut Vec<String>,
) -> Result<(), Error> {
    let name = set.name_any();
    let reference = set_reference(set);
    if let Some(note) = invalid_timeout {
        ctx.events
            .warning(
                &reference,
                "InvalidEffectiveCreationTimeout",
                "Create",
                note.to_owned(),
            )
            .await;
    }
    for &batch in batches {
        let results = join_all(
            (0..batch).map(|_| async { api.create(&PostParams::default(), template).await }),
        )
        .await;
        let mut first_error = None;
        let mut batch_created = Vec::new();
        for r in results {
            match r {
                Ok(m) => batch_created.push(m.name_any()),
                Err(e) => {
                    ctx.events
                        .warning(
                            &reference,
                            "FailedCreate",
                            "Create",
                            format!("Error creating: {e}"),
                        )
                        .await;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(note) = batch_note("Created", "Machine", &batch_created) {
            ctx.events
                .normal(&reference, "SuccessfulCreate", "Create", note)
                .await;
        }
        created.append(&mut batch_created);
        if let Some(e) = first_error {
            // Slow start: skip the remaining batches; the next reconcile retries.
            return Err(ApiCallError::new("create", "Machine", &name, e).into());
        }
    }
    Ok(())
}

/// Deletes the machines `names` (each guarded by its uid in `uids`), puts the names deleted
/// into `deleted`; one Event for the batch, one per failure.
pub(crate) async fn delete_machines(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    names: &[String],
    uids: &BTreeMap<String, Option<String>>,
    deleted: &mut Vec<String>,
) -> Result<(), Error> {
    let reference = set_reference(set);
    let results = join_all(names.iter().map(|n| {
        let dp = DeleteParams {
            preconditions: uids.get(n).cloned().flatten().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        async move { (n, kube_api::delete(api, n, &dp).await) }
    }))
    .await;
    let mut first_error = None;
    let mut now_deleted = Vec::new();
    for (n, r) in results {
        match r {
            Ok(Outcome::Gone) => {}
            Ok(Outcome::Done) => now_deleted.push(n.clone()),
            Err(e) => {
                ctx.events
                    .warning(
                        &reference,
                        "FailedDelete",
                        "Delete",
                        format!("Error deleting {n}: {e}"),
                    )
                    .await;
                first_error.get_or_insert(ApiCallError::new("delete", "Machine", n, e).into());
            }
        }
    }
    if let Some(note) = batch_note("Deleted", "machine", &now_deleted) {
        ctx.events
            .normal(&reference, "SuccessfulDelete", "Delete", note)
            .await;
    }
    deleted.append(&mut now_deleted);
    first_error.map_or(Ok(()), Err)
}

/// Writes `status` when it differs from the set's; a change of counters only waits for the
/// pacer (`Some`: how long; the reconcile comes back then).
pub(crate) async fn update_status(
    ctx: &Context,
    api: &Api<MachineSet>,
    set: &MachineSet,
    status: &MachineSetStatus,
) -> Result<Option<Duration>, Error> {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    match ctx
        .status_pacer
        .admit(uid, set.status.as_ref(), status, without_counters)
    {
        Admission::Unchanged => Ok(None),
        Admission::Wait(wait) => Ok(Some(wait)),
        Admission::Write => write_status(api, set, status).await.map(|()| None),
    }
}

/// `status` with the message of its `ReplicaFailure` condition set to `message` (the
/// error of this reconcile, which the plan could not know).
pub(crate) fn with_failure_message(status: &MachineSetStatus, message: String) -> MachineSetStatus {
    let mut status = status.clone();
    if let Some(c) = status
        .conditions
        .iter_mut()
        .flatten()
        .find(|c| c.type_ == MachineSetConditionType::ReplicaFailure)
    {
        c.message = Some(message);
    }
    status
}

async fn write_status(
    api: &Api<MachineSet>,
    set: &MachineSet,
    status: &MachineSetStatus,
) -> Result<(), Error> {
    let patch = status_patch(
        status,
        &[
            "machineSetCondition",
            "failedMachines",
            "autoPreserveFailedMachineCount",
            "preservedFailedReplicas",
        ],
    );
    // A set gone meanwhile needs no status.
    let name = set.name_any();
    let _ = merge_patch(api, Part::Status, &name, &patch)
        .await
        .context("update status of", "MachineSet", &name)?;
    Ok(())
}

/// The most names one batch Event lists (an Event's note holds 1 KiB).
const NAMES_PER_EVENT: usize = 10;

/// The note of one Event for a batch of machines created or deleted together: MCM's text
/// (`Created Machine: a`) for one, the count and the first names for more (`Created 12
/// Machines: a, b, ... and 2 more`). One Event per batch instead of one per machine: at 20
/// QPS, an Event per machine is a twentieth of a second of the budget each.
pub(crate) fn batch_note(verb: &str, noun: &str, names: &[String]) -> Option<String> {
    match names {
        [] => None,
        [one] => Some(format!("{verb} {noun}: {one}")),
        _ => {
            let listed = names[..names.len().min(NAMES_PER_EVENT)].join(", ");
            let more = names.len().saturating_sub(NAMES_PER_EVENT);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            Some(format!("{verb} {} {noun}s: {listed}{tail}", names.len()))
        }
    }
}

/// `status` without what changes as machines come and go: the replica counters, and the
/// times and messages of conditions. Two statuses that differ only there differ only in
/// counters ([`crate::pacer`]). Pure.
pub(crate) fn without_counters(status: &MachineSetStatus) -> MachineSetStatus {
    let mut s = status.clone();
    s.replicas = None;
    s.fully_labeled_replicas = None;
    s.ready_replicas = None;
    s.available_replicas = None;
    for c in s.conditions.iter_mut().flatten() {
        c.last_transition_time = None;
        c.message = None;
    }
    s
}
