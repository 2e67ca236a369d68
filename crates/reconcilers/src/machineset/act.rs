//! The effects of the MachineSet controller: its API writes (finalizer, controller
//! references, machine specs and auto-preservation, creations in slow-start batches,
//! deletions, status) and its Events.

use crate::pacer::Admission;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use mcm_api::constants::annotations;
use mcm_api::constants::annotations::preserve_values;
use mcm_api::{Machine, MachineSet, MachineSetStatus};
use serde_json::{Value, json};

use super::context::{Context, Error, FINALIZER, SetProblem};
use super::decide::{
    SLOW_START_INITIAL_BATCH_SIZE, batch_note, desired_status, effective_creation_timeout,
    machine_from_template, machine_spec_patch, overlapping_owners, slow_start_batches,
    without_counters,
};
use super::model::{AutoPreservePlan, SetCounts};
use crate::disruptionbudget::{self, Refusal};
use crate::kube_api::{
    self, ApiCallError, ApiErrorExt, ApiResultExt, Outcome, Part, merge_patch, status_patch,
};

/// Reason of the Warning Event when a MachineDisruptionBudget holds back a deletion.
pub const DISRUPTION_BLOCKED: &str =
    mcm_api::disruption_budget::condition_reasons::DISRUPTION_BLOCKED;
/// Reason of the Warning Event about a selector that matches others' machines.
pub const SELECTOR_OVERLAP: &str = "SelectorOverlap";

/// The object reference of a set for events.
pub fn set_reference(set: &MachineSet) -> ObjectReference {
    set.object_ref(&())
}

/// Publishes one Warning Event when the set's selector matches machines that other
/// controllers own (and again when the list of owners changes).
pub(crate) async fn warn_overlap(ctx: &Context, set: &MachineSet, all: &[Arc<Machine>]) {
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let owners = overlapping_owners(
        &uid,
        set.spec.selector.as_ref(),
        all.iter().map(AsRef::as_ref),
    );
    let note = if owners.is_empty() {
        String::new()
    } else {
        format!(
            "spec.selector also matches machines controlled by {}; this MachineSet leaves them alone and never owns them (make the selectors disjoint)",
            owners.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    let changed = ctx.overlaps.is_new(&uid, &note);
    if changed && !note.is_empty() {
        ctx.events
            .warning(&set_reference(set), SELECTOR_OVERLAP, "Claim", note)
            .await;
    }
}

/// Publishes the Warning Events of budget refusals (on the set and on each budget) when
/// they differ from those announced last for the set.
pub(crate) async fn announce_refusals(ctx: &Context, set: &MachineSet, refused: &[Refusal]) {
    let blocked: Vec<&disruptionbudget::Blocked> = refused
        .iter()
        .filter_map(|r| match r {
            Refusal::Blocked(b) => Some(b),
            Refusal::NotSynced => None,
        })
        .collect();
    let note = blocked
        .iter()
        .map(|b| format!("{}/{}", b.budget, b.machine))
        .collect::<Vec<_>>()
        .join(",");
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let changed = ctx.announced_blocks.is_new(&uid, &note);
    if !changed {
        return;
    }
    let ns = set.namespace().unwrap_or_default();
    for b in blocked {
        let text = format!(
            "Not deleting machine {} ({}) of MachineSet {}: MachineDisruptionBudget {} allows no disruption now ({})",
            b.machine,
            b.reason,
            set.name_any(),
            b.budget,
            b.message
        );
        ctx.events
            .warning(
                &set_reference(set),
                DISRUPTION_BLOCKED,
                "Delete",
                text.clone(),
            )
            .await;
        if let Some(budget) = ctx
            .budget_gate
            .budgets
            .get(&ObjectRef::new(&b.budget).within(&ns))
        {
            ctx.events
                .warning(
                    &disruptionbudget::act::budget_reference(&budget),
                    DISRUPTION_BLOCKED,
                    "Delete",
                    text,
                )
                .await;
        }
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

pub(crate) async fn sync_machine_specs(
    api: &Api<Machine>,
    set: &MachineSet,
    machines: &[Arc<Machine>],
) -> Result<(), Error> {
    for m in machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
    {
        if let Some(patch) = machine_spec_patch(set, m) {
            // A machine gone meanwhile needs no sync.
            let name = m.name_any();
            let _ = merge_patch(api, Part::Object, &name, &patch)
                .await
                .context("sync spec of", "Machine", &name)?;
        }
    }
    Ok(())
}

/// Carries out an [`AutoPreservePlan`]: sets or removes `node.machine.sapcloud.io/preserve:
/// auto-preserved` on the machines it names (each patch guarded by the resourceVersion the
/// plan was made from, so that a user's annotation set meanwhile is never overwritten: the
/// conflict retries the reconcile), and puts the patched machines into `machines`, so that
/// the rest of the reconcile sees the annotations. A machine gone meanwhile is skipped.
pub(crate) async fn manage_auto_preservation(
    api: &Api<Machine>,
    plan: &AutoPreservePlan,
    machines: &mut [Arc<Machine>],
) -> Result<(), Error> {
    let changes = plan
        .annotate
        .iter()
        .map(|n| (n, Value::from(preserve_values::AUTO_PRESERVED)))
        .chain(plan.release.iter().map(|n| (n, Value::Null)));
    for (name, value) in changes {
        let Some(slot) = machines.iter_mut().find(|m| m.name_any() == *name) else {
            continue;
        };
        let patch = json!({"metadata": {
            "resourceVersion": slot.resource_version(),
            "annotations": {annotations::PRESERVE: value},
        }});
        let patched = kube_api::patch_existing(api, Part::Object, name, &patch).await;
        match patched {
            Ok(m) => {
                tracing::info!(
                    machine = %name,
                    auto_preserved = !value.is_null(),
                    "updated the auto-preservation of a machine"
                );
                *slot = Arc::new(m);
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                return Err(
                    ApiCallError::new("update auto-preservation of", "Machine", name, e).into(),
                );
            }
        }
    }
    Ok(())
}

pub(crate) async fn create_machines(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    count: usize,
    created: &mut Vec<String>,
) -> Result<(), Error> {
    let name = set.name_any();
    if set.template_labels().is_none_or(BTreeMap::is_empty) {
        return Err(Error::Problem(SetProblem::TemplateWithoutLabels(name)));
    }
    let reference = set_reference(set);
    let template = machine_from_template(set);
    if let Some(Err(e)) = effective_creation_timeout(set) {
        let note = format!(
            "annotation {} is not a duration ({e}); new machines keep the creation timeout of \
             their template",
            annotations::EFFECTIVE_CREATION_TIMEOUT
        );
        ctx.events
            .warning(
                &reference,
                "InvalidEffectiveCreationTimeout",
                "Create",
                note,
            )
            .await;
    }
    for batch in slow_start_batches(count, SLOW_START_INITIAL_BATCH_SIZE) {
        let results = join_all(
            (0..batch).map(|_| async { api.create(&PostParams::default(), &template).await }),
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

pub(crate) async fn delete_machines(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    names: &[String],
    deleted: &mut Vec<String>,
) -> Result<(), Error> {
    let reference = set_reference(set);
    let uids: HashMap<String, Option<String>> = ctx
        .machines
        .state()
        .iter()
        .map(|m| (m.name_any(), m.metadata.uid.clone()))
        .collect();
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

/// Writes the set's status when it changed; a change of counters only waits for the pacer
/// (`Some`: how long; the reconcile comes back then).
pub(crate) async fn update_status(
    ctx: &Context,
    api: &Api<MachineSet>,
    set: &MachineSet,
    counts: &SetCounts,
    failure: Option<&Error>,
) -> Result<Option<Duration>, Error> {
    let status = desired_status(set, counts, failure, ctx.clock.now());
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    match ctx
        .status_pacer
        .admit(uid, set.status.as_ref(), &status, without_counters)
    {
        Admission::Unchanged => Ok(None),
        Admission::Wait(wait) => Ok(Some(wait)),
        Admission::Write => write_status(api, set, &status).await.map(|()| None),
    }
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
