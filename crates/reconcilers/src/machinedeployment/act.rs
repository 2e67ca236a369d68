//! The effects of the MachineDeployment controller: one small action per decision, on an
//! [`Actor`] for one deployment, and the rollout markers on the target cluster's Nodes.
//! Every action is idempotent: it may run again after a crash at any point.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::{
    Machine, MachineDeployment, MachineDeploymentStatus, MachineSet, MachineTemplateSpec,
    preservation,
};
use serde_json::{Value, json};

use super::context::{Context, DeploymentProblem, Error};
use super::model::{LABEL_TRUE, RevisionPlan, RollbackPlan, SetState};
use super::nodes::{markers_patch, needs_version_guard, untaint_patch};
use super::sets::{
    annotations_to_copy, annotations_to_remove, auto_preserve_max_update, in_place_template_patch,
    new_machine_set, scale_annotations,
};
use super::status::reasons;
use super::trigger::TriggerPlan;
use crate::kube_api::{
    self, ApiCallError, ApiErrorExt, ApiResultExt, Outcome, Part, merge_patch, patch_existing,
    status_patch,
};
use crate::pacer::Admission;

/// The finalizer of the manager's controllers.
pub(crate) const FINALIZER: &str = finalizers::MACHINE_CONTROLLER_MANAGER;

/// The reason of the deployment's Event for each change of a set's replicas, the Go MCM's
/// (`Scaled up machine set <name> to <n>`, `Scaled down ...`).
pub(crate) const SCALING_MACHINE_SET: &str = "ScalingMachineSet";

/// The actions on one deployment: its API handles (the deployment's namespace), its name
/// and its Event reference.
pub(crate) struct Actor<'a> {
    ctx: &'a Context,
    d: &'a MachineDeployment,
    name: String,
    deployments: Api<MachineDeployment>,
    sets: Api<MachineSet>,
    machines: Api<Machine>,
    reference: ObjectReference,
}

impl<'a> Actor<'a> {
    /// The actions on `d`.
    pub(crate) fn new(ctx: &'a Context, d: &'a MachineDeployment) -> Self {
        let ns = d.namespace().unwrap_or_default();
        Actor {
            ctx,
            d,
            name: d.name_any(),
            deployments: Api::namespaced(ctx.client.clone(), &ns),
            sets: Api::namespaced(ctx.client.clone(), &ns),
            machines: Api::namespaced(ctx.client.clone(), &ns),
            reference: d.object_ref(&()),
        }
    }

    async fn normal_event(&self, reason: &str, action: &str, note: String) {
        let events = &self.ctx.events;
        events.normal(&self.reference, reason, action, note).await;
    }

    /// Applies a merge patch to the deployment (`part`), which must exist.
    async fn patch_deployment(
        &self,
        part: Part,
        action: &'static str,
        p: &Value,
    ) -> Result<(), Error> {
        patch_existing(&self.deployments, part, &self.name, p)
            .await
            .context(action, MachineDeployment::KIND, &self.name)?;
        Ok(())
    }

    /// Applies a merge patch to the set `name`, which must exist.
    async fn patch_set(&self, action: &'static str, name: &str, p: &Value) -> Result<(), Error> {
        patch_existing(&self.sets, Part::Object, name, p)
            .await
            .context(action, MachineSet::KIND, name)?;
        Ok(())
    }

    /// Deletes the set `name`; `action` names the deletion in the error.
    async fn delete_set(&self, action: &'static str, name: &str) -> Result<Outcome, Error> {
        let background = DeleteParams::background();
        let outcome = kube_api::delete(&self.sets, name, &background)
            .await
            .context(action, MachineSet::KIND, name)?;
        Ok(outcome)
    }

    /// Forgets what was announced for the deployment (it goes: nothing more is announced).
    pub(crate) fn forget_announcements(&self) {
        if let Some(uid) = self.d.metadata.uid.as_deref() {
            self.ctx.announced.forget(uid);
        }
    }

    /// Adds (`present`) or removes the finalizer of the deployment; [`Outcome::Gone`] when the
    /// deployment no longer exists.
    pub(crate) async fn set_finalizer(&self, present: bool) -> Result<Outcome, Error> {
        let outcome = kube_api::set_finalizer(&self.deployments, self.d, FINALIZER, present)
            .await
            .context("update finalizers of", MachineDeployment::KIND, &self.name)?;
        Ok(outcome)
    }

    /// Deletes the deployment's sets that are not being deleted yet (the deployment is being
    /// deleted), with an Event per deleted set (`DeletingMachineSet`: ours, the Go MCM reports
    /// no Event there).
    pub(crate) async fn delete_sets(&self, names: &[String]) -> Result<(), Error> {
        for name in names {
            if self.delete_set("delete", name).await? == Outcome::Done {
                let note = format!("Deleting MachineSet {name}");
                self.normal_event("DeletingMachineSet", "Delete", note)
                    .await;
            }
        }
        Ok(())
    }

    /// Deletes old sets beyond the revision history limit (a set gone meanwhile is pruned).
    pub(crate) async fn prune_sets(&self, names: &[String]) -> Result<(), Error> {
        for name in names {
            let _ = self.delete_set("prune", name).await?;
        }
        Ok(())
    }

    /// Carries out a rollback plan: the template of the chosen set becomes the deployment's
    /// (its hash label dropped) and `spec.rollbackTo` is cleared, in one update guarded by the
    /// deployment's resourceVersion; each outcome has upstream's Event.
    pub(crate) async fn rollback(
        &self,
        plan: &RollbackPlan,
        template: Option<&MachineTemplateSpec>,
    ) -> Result<(), Error> {
        let mut d = self.d.clone();
        d.spec.rollback_to = None;
        match plan {
            RollbackPlan::NotFound { message } => {
                self.warning_event(
                    "DeploymentRollbackRevisionNotFound",
                    "Rollback",
                    (*message).into(),
                )
                .await;
            }
            RollbackPlan::Unchanged { .. } => {
                let note = format!(
                    "The rollback revision contains the same template as current deployment {:?}",
                    self.name
                );
                self.warning_event("DeploymentRollbackTemplateUnchanged", "Rollback", note)
                    .await;
            }
            RollbackPlan::To { set, .. } => {
                let Some(template) = template.cloned() else {
                    return Err(Error::Problem(
                        DeploymentProblem::RollbackSetWithoutTemplate(set.clone()),
                    ));
                };
                d.spec.template = template;
                if let Some(l) = d
                    .spec
                    .template
                    .metadata
                    .as_mut()
                    .and_then(|m| m.labels.as_mut())
                {
                    l.remove(labels::MACHINE_TEMPLATE_HASH);
                }
            }
        }
        d.metadata.managed_fields = None;
        self.deployments
            .replace(&self.name, &PostParams::default(), &d)
            .await
            .context("clear rollbackTo of", MachineDeployment::KIND, &self.name)?;
        if let RollbackPlan::To { revision, .. } = plan {
            let note = format!(
                "Rolled back deployment {:?} to revision {revision}",
                self.name
            );
            self.normal_event("DeploymentRollback", "Rollback", note)
                .await;
        }
        Ok(())
    }

    async fn warning_event(&self, reason: &str, action: &str, note: String) {
        let events = &self.ctx.events;
        events.warning(&self.reference, reason, action, note).await;
    }

    /// Announces that the remediation short-circuit (or an unusable remediation
    /// annotation) stopped the replacement of the deployment's unhealthy machines.
    pub(crate) async fn remediation_stopped(&self, note: String) {
        self.warning_event("RemediationShortCircuited", "HealthCheck", note)
            .await;
    }

    /// Announces that no zone of the deployment's machines is partitioned any more.
    pub(crate) async fn zone_partition_lifted(&self) {
        self.normal_event(
            "ZonePartitionLifted",
            "HealthCheck",
            "no zone of its machines is partitioned any more: their remediation is no longer held"
                .into(),
        )
        .await;
    }

    /// Announces that remediation is allowed again.
    pub(crate) async fn remediation_resumed(&self, note: String) {
        self.normal_event("RemediationResumed", "HealthCheck", note)
            .await;
    }

    /// Warns that the deployment selects every machine (nothing else is done until it
    /// changes).
    pub(crate) async fn warn_selecting_all(&self) {
        let note = "This deployment is selecting all machines. A non-empty selector is required.";
        let events = &self.ctx.events;
        events
            .warning(&self.reference, "SelectingAll", "Sync", note.into())
            .await;
    }

    /// Marks the machine `name` with priority 1 and, when `time` is given, that
    /// marked-for-deletion time, so its set deletes it ([`TriggerPlan::mark`]).
    pub(crate) async fn mark_for_deletion(
        &self,
        name: &str,
        time: Option<&str>,
    ) -> Result<(), Error> {
        let mut marks = serde_json::Map::new();
        marks.insert(annotations::MACHINE_PRIORITY.into(), json!("1"));
        if let Some(time) = time {
            marks.insert(annotations::MARKED_FOR_DELETION_TIME.into(), json!(time));
        }
        let patch = json!({"metadata": {"annotations": marks}});
        patch_existing(&self.machines, Part::Object, name, &patch)
            .await
            .context("mark for deletion", Machine::KIND, name)?;
        let note = format!("Machine {name} marked with priority 1 for deletion");
        self.normal_event("MachineMarkedForDeletion", "TriggerDeletion", note)
            .await;
        Ok(())
    }

    /// Writes the trigger-deletion annotation of `plan` (and the replica-change time when it
    /// sets one), guarded by the deployment's resourceVersion. The replicas are the
    /// scaler's: they are never changed here.
    pub(crate) async fn update_trigger_deletion(&self, plan: &TriggerPlan) -> Result<(), Error> {
        let mut anns = serde_json::Map::new();
        anns.insert(
            annotations::TRIGGER_DELETION_BY_MCM.into(),
            json!(plan.annotation),
        );
        if let Some(time) = &plan.replica_change_time {
            anns.insert(
                annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME.into(),
                json!(time),
            );
        }
        let update = json!({"metadata": {
            "resourceVersion": self.d.resource_version(),
            "annotations": anns,
        }});
        self.patch_deployment(Part::Object, "update trigger-deletion of", &update)
            .await
    }

    /// Writes the effective creation timeout's annotations `changes` (a value, or `None` to
    /// remove the key) in one merge patch guarded by the deployment's resourceVersion (they
    /// were decided from this version: a cycle count must not be applied twice), then
    /// publishes `event` (a Normal Event: reason and message).
    pub(crate) async fn adjust_creation_timeout(
        &self,
        changes: &std::collections::BTreeMap<&'static str, Option<String>>,
        event: Option<&(&'static str, String)>,
    ) -> Result<(), Error> {
        let anns: serde_json::Map<String, Value> = changes
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    v.as_ref().map_or(Value::Null, |v| json!(v)),
                )
            })
            .collect();
        let update = json!({"metadata": {
            "resourceVersion": self.d.resource_version(),
            "annotations": anns,
        }});
        self.patch_deployment(
            Part::Object,
            "adjust the effective creation timeout of",
            &update,
        )
        .await?;
        if let Some((reason, note)) = event {
            tracing::info!(reason, note, "effective creation timeout adjusted");
            self.normal_event(reason, "CreationTimeout", note.clone())
                .await;
        }
        Ok(())
    }

    /// Records the revision of `plan` on the new set (raising it above the old sets', with
    /// the replaced revision in its history) and on the deployment, copies the
    /// deployment's annotations the set lacks ([`annotations_to_copy`]; the one it dropped
    /// goes: [`annotations_to_remove`]), its
    /// `spec.autoPreserveFailedMachineMax` when it differs ([`auto_preserve_max_update`]) and
    /// its node template, machine configuration and class kind when they differ
    /// ([`in_place_template_patch`]), in one patch. Old sets keep theirs, as upstream.
    pub(crate) async fn sync_revision(
        &self,
        new_set: &MachineSet,
        plan: &RevisionPlan,
    ) -> Result<(), Error> {
        let revision = plan.revision.to_string();
        let mut anns = serde_json::Map::new();
        for (k, v) in annotations_to_copy(self.d, new_set) {
            anns.insert(k, json!(v));
        }
        for k in annotations_to_remove(self.d, new_set) {
            anns.insert(k.into(), Value::Null);
        }
        if let Some(history) = &plan.bump {
            anns.insert(annotations::REVISION.into(), json!(revision));
            if let Some(history) = history {
                anns.insert(annotations::REVISION_HISTORY.into(), json!(history));
            }
        }
        let max = auto_preserve_max_update(self.d, new_set);
        let template = in_place_template_patch(self.d, new_set);
        if !anns.is_empty() || max.is_some() || template.is_some() {
            let mut update = json!({"metadata": {"annotations": anns}, "spec": {}});
            if let Some(max) = max {
                update["spec"]["autoPreserveFailedMachineMax"] = max;
            }
            if let Some(template) = template {
                update["spec"]["template"] = json!({ "spec": template });
            }
            self.patch_set("update annotations of", &new_set.name_any(), &update)
                .await?;
        }
        if plan.update_deployment {
            let update = json!({"metadata": {"annotations": {annotations::REVISION: revision}}});
            self.patch_deployment(Part::Object, "update revision of", &update)
                .await?;
        }
        Ok(())
    }

    /// Creates the new set. A set of that name with the same template counts as created; one
    /// with another template is a hash collision: the deployment's collision count goes up
    /// and the error makes the next reconcile try the next name.
    pub(crate) async fn create_new_set(
        &self,
        replicas: i32,
        revision: i64,
        max_surge: i32,
    ) -> Result<(), Error> {
        let set = new_machine_set(self.d, replicas, revision, max_surge);
        let name = set.name_any();
        match self.sets.create(&PostParams::default(), &set).await {
            Ok(_) => {
                // The Go MCM's Event (reason and text): a new set created with machines. Its
                // creation itself is in the Progressing condition (`NewMachineSetCreated`).
                if replicas > 0 {
                    let note = format!("Scaled up machine set {name} to {replicas}");
                    self.normal_event(SCALING_MACHINE_SET, "Scale", note).await;
                }
                Ok(())
            }
            Err(e) if e.is_conflict() => {
                let existing =
                    self.sets
                        .get(&name)
                        .await
                        .context("get", MachineSet::KIND, &name)?;
                let same = existing.spec.template.as_ref().is_some_and(|t| {
                    mcm_api::canonical::same_set_template(t, &self.d.spec.template)
                });
                if same {
                    return Ok(());
                }
                self.bump_collision_count().await?;
                Err(Error::Problem(DeploymentProblem::HashCollision(name)))
            }
            Err(e) => Err(ApiCallError::new("create", MachineSet::KIND, &name, e).into()),
        }
    }

    /// Raises the deployment's `status.collisionCount` by one.
    async fn bump_collision_count(&self) -> Result<(), Error> {
        let status = self.d.status.as_ref();
        let count = status.and_then(|s| s.collision_count).unwrap_or(0) + 1;
        let update = json!({"status": {"collisionCount": count}});
        self.patch_deployment(Part::Status, "update collision count of", &update)
            .await
    }

    /// Scales the set `name` (now as `current`) to `replicas` and refreshes its replica
    /// annotations ([`scale_annotations`]; `new_set`: it is the deployment's new set); an
    /// Event when the replicas change.
    pub(crate) async fn scale_set(
        &self,
        name: &str,
        current: Option<&SetState>,
        replicas: i32,
        max_surge: i32,
        new_set: bool,
    ) -> Result<(), Error> {
        let update = json!({
            "metadata": {"annotations": scale_annotations(self.d, max_surge, new_set)},
            "spec": {"replicas": replicas},
        });
        self.patch_set("scale", name, &update).await?;
        if let Some(cur) = current.filter(|c| c.replicas != replicas) {
            let direction = if replicas > cur.replicas {
                "up"
            } else {
                "down"
            };
            let note = format!("Scaled {direction} machine set {name} to {replicas}");
            self.normal_event(SCALING_MACHINE_SET, "Scale", note).await;
        }
        Ok(())
    }

    /// Labels the old set `name` `node.machine.sapcloud.io/scale-up-disabled: "true"`: it no
    /// longer creates machines (an in-place rollout moves its machines away before it
    /// lowers its replicas). Never removed again, as upstream.
    pub(crate) async fn disable_scale_up(&self, name: &str) -> Result<(), Error> {
        let update = json!({"metadata": {"labels": {
            labels::MACHINE_SET_SCALE_UP_DISABLED: LABEL_TRUE,
        }}});
        self.patch_set("disable scale-up of", name, &update).await
    }

    /// Moves the machine `name` to the new set with a [`super::inplace::transfer_patch`].
    pub(crate) async fn move_machine(&self, name: &str, patch: &Value) -> Result<(), Error> {
        patch_existing(&self.machines, Part::Object, name, patch)
            .await
            .context("move to the new MachineSet", Machine::KIND, name)?;
        Ok(())
    }

    /// Removes the label `update-result` from the machine `name` once its move to the new
    /// set is accounted for (a machine gone meanwhile needs nothing).
    pub(crate) async fn unlabel_update_result(&self, name: &str) -> Result<(), Error> {
        let update = json!({"metadata": {"labels": {labels::UPDATE_RESULT: null}}});
        let _ = merge_patch(&self.machines, Part::Object, name, &update)
            .await
            .context("remove the update-result label of", Machine::KIND, name)?;
        Ok(())
    }

    /// Writes `status` unless the deployment already has it (a deployment gone meanwhile
    /// needs no status).
    pub(crate) async fn update_status(
        &self,
        status: &MachineDeploymentStatus,
    ) -> Result<(), Error> {
        if self.d.status.as_ref() == Some(status) {
            return Ok(());
        }
        self.write_status(status).await
    }

    /// Writes `status` when it changed; a change of counters only waits for `pacer`
    /// (`Some`: how long; the reconcile comes back then).
    pub(crate) async fn update_status_paced(
        &self,
        status: &MachineDeploymentStatus,
        pacer: &crate::pacer::StatusPacer,
    ) -> Result<Option<std::time::Duration>, Error> {
        let uid = self.d.metadata.uid.as_deref().unwrap_or_default();
        match pacer.admit(uid, self.d.status.as_ref(), status, without_counters) {
            Admission::Unchanged => Ok(None),
            Admission::Wait(wait) => Ok(Some(wait)),
            Admission::Write => self.write_status(status).await.map(|()| None),
        }
    }

    async fn write_status(&self, status: &MachineDeploymentStatus) -> Result<(), Error> {
        let patch = status_patch(
            status,
            &["conditions", "failedMachines", "preservedFailedReplicas"],
        );
        let _ = merge_patch(&self.deployments, Part::Status, &self.name, &patch)
            .await
            .context("update status of", MachineDeployment::KIND, &self.name)?;
        Ok(())
    }

    /// Records an unusable strategy: writes `status` (with its `Progressing=False,
    /// InvalidStrategy` condition) and, only when that condition is new or its message
    /// changed, publishes one Warning Event. The condition is stored, so neither later
    /// reconciles nor a restarted controller repeat the Event; a reconcile that still reads
    /// the deployment from before this process's status write does not either. `message`:
    /// the condition's message; `before`: that of the condition the deployment has stored.
    pub(crate) async fn report_invalid_strategy(
        &self,
        status: MachineDeploymentStatus,
        message: String,
        before: Option<&str>,
    ) -> Result<(), Error> {
        tracing::debug!(%message, "invalid strategy");
        self.update_status(&status).await?;
        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let first = self.ctx.announced.is_new(&uid, &message);
        if first && before != Some(message.as_str()) {
            let reason = reasons::INVALID_STRATEGY;
            let events = &self.ctx.events;
            events
                .warning(&self.reference, reason, "Sync", message)
                .await;
        }
        Ok(())
    }
}

/// Removes the old-set taint from `nodes` (as the store had them: the Nodes of the machines
/// of the set a rollback makes the new one again). Unlike the advisory markers, a failure is
/// returned: the rollback is retried.
pub(crate) async fn remove_old_set_taint(
    target: &Client,
    nodes: &[Arc<Node>],
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(target.clone());
    for node in nodes {
        // A node gone meanwhile needs no untainting.
        let _ = kube_api::patch_from_copy(&api, node.as_ref(), untaint_patch).await?;
    }
    Ok(())
}

/// Applies the markers: during a rollout, taints the nodes of `old` machines and (with
/// `autoscaler_annotations`) annotates the nodes of `all` machines; afterwards removes MCM's
/// annotations from the nodes of `all`, except those of machines with a preservation expiry.
/// One patch per node that needs one (`nodes`: the Nodes as the store had them, by name).
/// Errors are logged and retried on the next reconcile: markers are advisory.
pub(crate) async fn apply_markers(
    target: &Client,
    nodes: &BTreeMap<String, Arc<Node>>,
    old: &[Arc<Machine>],
    all: &[Arc<Machine>],
    rollout: bool,
    autoscaler_annotations: bool,
) {
    let api: Api<Node> = Api::all(target.clone());
    let old_nodes: BTreeSet<&str> = old.iter().filter_map(|m| m.node_name()).collect();
    let preserved_nodes: BTreeSet<&str> = all
        .iter()
        .filter(|m| preservation::expiry(m).is_some())
        .filter_map(|m| m.node_name())
        .collect();
    // Without the annotations enabled, only ever remove what MCM added earlier.
    let annotate = rollout && autoscaler_annotations;
    let all_nodes = all.iter().filter_map(|m| m.node_name());
    for node in all_nodes.filter_map(|n| nodes.get(n)) {
        let name = node.name_any();
        let taint = rollout && old_nodes.contains(name.as_str());
        let preserved = preserved_nodes.contains(name.as_str());
        let patch_of = |n: &Node| markers_patch(n, taint, annotate, preserved);
        let written = match patch_of(node) {
            None => continue,
            Some(patch) if !needs_version_guard(&patch) => {
                merge_patch(&api, Part::Object, &name, &patch).await
            }
            // Planned again from a fresh read after a conflict: the store's copy may be behind.
            Some(_) => kube_api::patch_from_copy(&api, node.as_ref(), patch_of).await,
        };
        if let Err(error) = written {
            tracing::debug!(node = name, %error, "could not update rollout markers of node");
        }
    }
}

/// `status` without what changes as machines come and go: the replica counters, and the
/// times and messages of conditions. Two statuses that differ only there differ only in
/// counters ([`crate::pacer`]). Pure.
pub(crate) fn without_counters(status: &MachineDeploymentStatus) -> MachineDeploymentStatus {
    let mut s = status.clone();
    s.replicas = None;
    s.updated_replicas = None;
    s.ready_replicas = None;
    s.available_replicas = None;
    s.unavailable_replicas = None;
    for c in s.conditions.iter_mut().flatten() {
        c.last_update_time = None;
        c.last_transition_time = None;
        c.message = None;
    }
    s
}
