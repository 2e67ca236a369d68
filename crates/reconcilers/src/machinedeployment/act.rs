//! The async half of the MachineDeployment controller: one small action per decision. Every
//! action is idempotent: it may run again after a crash at any point.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::owner::controller_reference;
use mcm_api::{Machine, MachineDeployment, MachineDeploymentStatus, MachineSet, MachineSetSpec};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::controller::{Context, Error};
use super::decide::{RevisionPlan, SetState, TriggerPlan};
use super::hash::{template_hash, templates_equal};
use super::status::{is_invalid_strategy, reasons};
use crate::kube_api::{
    self, ApiCallError, ApiErrorExt, Outcome, add_finalizer, merge_patch_status, remove_finalizer,
};
use crate::machineset::controller::status_patch;

/// The finalizer of the manager's controllers.
pub const FINALIZER: &str = finalizers::MACHINE_CONTROLLER_MANAGER;

fn deployments(ctx: &Context, d: &MachineDeployment) -> Api<MachineDeployment> {
    Api::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default())
}

fn sets(ctx: &Context, d: &MachineDeployment) -> Api<MachineSet> {
    Api::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default())
}

fn reference(d: &MachineDeployment) -> ObjectReference {
    d.object_ref(&())
}

async fn normal_event(
    ctx: &Context,
    d: &MachineDeployment,
    reason: &str,
    action: &str,
    note: String,
) {
    ctx.events.normal(&reference(d), reason, action, note).await;
}

/// Applies a merge patch to the `kind` object `name`; `action` names the write in the error.
/// The object must exist (NotFound is an error, retried by the next reconcile).
async fn patch<K>(
    api: &Api<K>,
    (action, kind): (&'static str, &'static str),
    name: &str,
    patch: &Value,
) -> Result<(), Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
        .map_err(ApiCallError::on(action, kind, name))
}

/// Adds (`present`) or removes the finalizer of the deployment; [`Outcome::Gone`] when the
/// deployment no longer exists.
pub async fn set_finalizer(
    ctx: &Context,
    d: &MachineDeployment,
    present: bool,
) -> Result<Outcome, Error> {
    let api = deployments(ctx, d);
    let result = if present {
        add_finalizer(&api, d, FINALIZER).await
    } else {
        remove_finalizer(&api, d, FINALIZER).await
    };
    result.map_err(ApiCallError::on(
        "update finalizers of",
        MachineDeployment::KIND,
        &d.name_any(),
    ))
}

/// Deletes the deployment's sets that are not being deleted yet (the deployment is being
/// deleted), with an Event per deleted set.
pub async fn delete_sets(
    ctx: &Context,
    d: &MachineDeployment,
    sets: &[&MachineSet],
) -> Result<(), Error> {
    let api = self::sets(ctx, d);
    for s in sets {
        let name = s.name_any();
        let outcome = kube_api::delete(&api, &name, &DeleteParams::background())
            .await
            .map_err(ApiCallError::on::<Error>("delete", MachineSet::KIND, &name))?;
        if outcome == Outcome::Done {
            let note = format!("Deleting MachineSet {name}");
            normal_event(ctx, d, "DeletingMachineSet", "Delete", note).await;
        }
    }
    Ok(())
}

/// Deletes old sets beyond the revision history limit (a set gone meanwhile is pruned).
pub async fn prune_sets(
    ctx: &Context,
    d: &MachineDeployment,
    names: &[String],
) -> Result<(), Error> {
    let api = sets(ctx, d);
    for name in names {
        let _ = kube_api::delete(&api, name, &DeleteParams::background())
            .await
            .map_err(ApiCallError::on::<Error>("prune", MachineSet::KIND, name))?;
    }
    Ok(())
}

/// Warns that the deployment selects every machine (nothing else is done until it changes).
pub async fn warn_selecting_all(ctx: &Context, d: &MachineDeployment) {
    let note = "This deployment is selecting all machines. A non-empty selector is required.";
    ctx.events
        .warning(&reference(d), "SelectingAll", "Sync", note.into())
        .await;
}

/// Marks the machine `name` with priority 1 and a marked-for-deletion time, so the next
/// scale-down removes it first.
pub async fn mark_for_deletion(
    ctx: &Context,
    d: &MachineDeployment,
    name: &str,
    time: &str,
) -> Result<(), Error> {
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default());
    let marks = json!({"metadata": {"annotations": {
        annotations::MACHINE_PRIORITY: "1",
        annotations::MARKED_FOR_DELETION_TIME: time,
    }}});
    patch(&api, ("mark for deletion", Machine::KIND), name, &marks).await?;
    let note = format!("Machine {name} marked with priority 1 for deletion");
    normal_event(ctx, d, "MachineMarkedForDeletion", "TriggerDeletion", note).await;
    Ok(())
}

/// Writes the trigger-deletion annotation of `plan` and reduces the replicas by its
/// scale-down, guarded by the deployment's resourceVersion.
pub async fn update_trigger_deletion(
    ctx: &Context,
    d: &MachineDeployment,
    plan: &TriggerPlan,
) -> Result<(), Error> {
    let mut update = json!({"metadata": {
        "resourceVersion": d.resource_version(),
        "annotations": {annotations::TRIGGER_DELETION_BY_MCM: plan.annotation},
    }});
    if plan.scale_down > 0 {
        update["spec"] = json!({"replicas": (d.spec.replicas() - plan.scale_down).max(0)});
        let note = format!(
            "Scaled down by {} for machines triggered for deletion",
            plan.scale_down
        );
        normal_event(ctx, d, "ScaledDownForTriggeredDeletion", "Scale", note).await;
    }
    let what = ("update trigger-deletion of", MachineDeployment::KIND);
    patch(&deployments(ctx, d), what, &d.name_any(), &update).await
}

/// Records the revision of `plan` on the new set (raising it above the old sets', with the
/// replaced revision in its history) and on the deployment.
pub async fn sync_revision(
    ctx: &Context,
    d: &MachineDeployment,
    new_set: &MachineSet,
    plan: &RevisionPlan,
) -> Result<(), Error> {
    if let Some(history) = &plan.bump {
        let mut anns = serde_json::Map::new();
        anns.insert(
            annotations::REVISION.into(),
            json!(plan.revision.to_string()),
        );
        if let Some(history) = history {
            anns.insert(annotations::REVISION_HISTORY.into(), json!(history));
        }
        let update = json!({"metadata": {"annotations": anns}});
        let what = ("update revision of", MachineSet::KIND);
        patch(&sets(ctx, d), what, &new_set.name_any(), &update).await?;
    }
    if plan.update_deployment {
        let revision = plan.revision.to_string();
        let update = json!({"metadata": {"annotations": {annotations::REVISION: revision}}});
        let what = ("update revision of", MachineDeployment::KIND);
        patch(&deployments(ctx, d), what, &d.name_any(), &update).await?;
    }
    Ok(())
}

/// The annotations a set of the deployment carries about the deployment's size: desired
/// replicas and the most machines allowed (`replicas + max_surge`).
pub fn replica_annotations(d: &MachineDeployment, max_surge: i32) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            annotations::DESIRED_REPLICAS.to_owned(),
            d.spec.replicas().to_string(),
        ),
        (
            annotations::MAX_REPLICAS.to_owned(),
            (d.spec.replicas() + max_surge).to_string(),
        ),
    ])
}

/// The new MachineSet of a deployment: template with the hash label (in labels, template
/// labels and selector), revision and replica annotations, the deployment as controller.
pub fn new_machine_set(
    d: &MachineDeployment,
    replicas: i32,
    revision: i64,
    max_surge: i32,
) -> MachineSet {
    let collision = d.status.as_ref().and_then(|s| s.collision_count);
    let hash = template_hash(&d.spec.template, collision);
    let mut template = d.spec.template.clone();
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let mut set_labels = meta.labels.clone().unwrap_or_default();
    set_labels.remove(labels::FREEZE);
    let mut selector = d.spec.selector.clone().unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let mut annotations_map = replica_annotations(d, max_surge);
    annotations_map.insert(annotations::REVISION.to_owned(), revision.to_string());
    MachineSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", d.name_any(), hash)),
            namespace: d.namespace(),
            labels: Some(set_labels),
            annotations: Some(annotations_map),
            owner_references: Some(vec![controller_reference(d)]),
            ..ObjectMeta::default()
        },
        spec: MachineSetSpec {
            replicas: Some(replicas),
            selector: Some(selector),
            min_ready_seconds: d.spec.min_ready_seconds,
            template: Some(template),
            auto_preserve_failed_machine_max: d.spec.auto_preserve_failed_machine_max,
            ..MachineSetSpec::default()
        },
        ..MachineSet::default()
    }
}

/// Creates the new set. A set of that name with the same template counts as created; one
/// with another template is a hash collision: the deployment's collision count goes up and
/// the error makes the next reconcile try the next name.
pub async fn create_new_set(
    ctx: &Context,
    d: &MachineDeployment,
    replicas: i32,
    revision: i64,
    max_surge: i32,
) -> Result<(), Error> {
    let set = new_machine_set(d, replicas, revision, max_surge);
    let name = set.name_any();
    let api = sets(ctx, d);
    match api.create(&PostParams::default(), &set).await {
        Ok(_) => {
            let note = format!("Created new MachineSet {name} with {replicas} replicas");
            normal_event(ctx, d, "NewMachineSetCreated", "Rollout", note).await;
            Ok(())
        }
        Err(e) if e.is_conflict() => {
            let existing = api.get(&name).await.map_err(ApiCallError::on::<Error>(
                "get",
                MachineSet::KIND,
                &name,
            ))?;
            let same = existing
                .spec
                .template
                .as_ref()
                .is_some_and(|t| templates_equal(t, &d.spec.template));
            if same {
                return Ok(());
            }
            bump_collision_count(ctx, d).await?;
            Err(Error::HashCollision(name))
        }
        Err(e) => Err(ApiCallError::on::<Error>("create", MachineSet::KIND, &name)(e)),
    }
}

/// Raises the deployment's `status.collisionCount` by one.
async fn bump_collision_count(ctx: &Context, d: &MachineDeployment) -> Result<(), Error> {
    let count = d
        .status
        .as_ref()
        .and_then(|s| s.collision_count)
        .unwrap_or(0)
        + 1;
    let update = json!({"status": {"collisionCount": count}});
    deployments(ctx, d)
        .patch_status(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&update),
        )
        .await
        .map(drop)
        .map_err(ApiCallError::on(
            "update collision count of",
            MachineDeployment::KIND,
            &d.name_any(),
        ))
}

/// Scales the set `current` to `replicas` and refreshes its replica annotations; an Event
/// when the replicas change.
pub async fn scale_set(
    ctx: &Context,
    d: &MachineDeployment,
    name: &str,
    current: Option<&SetState>,
    replicas: i32,
    max_surge: i32,
) -> Result<(), Error> {
    let update = json!({
        "metadata": {"annotations": replica_annotations(d, max_surge)},
        "spec": {"replicas": replicas},
    });
    patch(&sets(ctx, d), ("scale", MachineSet::KIND), name, &update).await?;
    if let Some(cur) = current.filter(|c| c.replicas != replicas) {
        let direction = if replicas > cur.replicas {
            "up"
        } else {
            "down"
        };
        let note = format!(
            "Scaled {direction} MachineSet {name} from {} to {replicas}",
            cur.replicas
        );
        normal_event(ctx, d, "ScalingMachineSet", "Scale", note).await;
    }
    Ok(())
}

/// Writes `status` unless the deployment already has it (a deployment gone meanwhile needs
/// no status).
pub async fn update_status(
    ctx: &Context,
    d: &MachineDeployment,
    status: &MachineDeploymentStatus,
) -> Result<(), Error> {
    if d.status.as_ref() == Some(status) {
        return Ok(());
    }
    let patch = status_patch(status, &["conditions", "failedMachines"]);
    let _ = merge_patch_status(&deployments(ctx, d), &d.name_any(), &patch)
        .await
        .map_err(ApiCallError::on::<Error>(
            "update status of",
            MachineDeployment::KIND,
            &d.name_any(),
        ))?;
    Ok(())
}

/// Records an unusable strategy: writes `status` (with its `Progressing=False,
/// InvalidStrategy` condition) and, only when that condition is new or its message changed,
/// publishes one Warning Event. The condition is stored, so neither later reconciles nor a
/// restarted controller repeat the Event.
pub async fn report_invalid_strategy(
    ctx: &Context,
    d: &MachineDeployment,
    status: MachineDeploymentStatus,
) -> Result<(), Error> {
    let invalid = |s: Option<&MachineDeploymentStatus>| {
        s.and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| is_invalid_strategy(c)))
            .and_then(|c| c.message.clone())
    };
    let before = invalid(d.status.as_ref());
    let message = invalid(Some(&status)).unwrap_or_default();
    tracing::debug!(deployment = %d.name_any(), %message, "invalid strategy");
    update_status(ctx, d, &status).await?;
    if before.as_deref() != Some(message.as_str()) {
        ctx.events
            .warning(&reference(d), reasons::INVALID_STRATEGY, "Sync", message)
            .await;
    }
    Ok(())
}
