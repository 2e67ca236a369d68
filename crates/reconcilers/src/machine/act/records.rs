//! What every action writes: status and metadata patches (each noted as our own write), the
//! deletion progress record, announcements (lastOperation plus one Event per change), the
//! finalizer, hooks and the Node Events.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use mcm_api::constants::labels;
use mcm_api::{Machine, MachineClass, MachinePhase};
use mcm_driver::{
    DriverError, GetMachineStatusRequest, GetMachineStatusResponse, RequestId, SecretData,
};
use serde_json::json;

use crate::kube_api::{self, ApiErrorExt};
use crate::machine::decide::ClassProblem;
use crate::machine::metrics::{DeploymentLabels, PlacementLabels, Timed};
use crate::machine::status::{self, Operation};
use crate::machine::{Ctx, Error, FINALIZER, LEGACY_FINALIZERS};

pub(super) const RECHECK: Duration = Duration::from_secs(30);

pub(super) fn machine_api(ctx: &Ctx) -> Api<Machine> {
    Api::namespaced(ctx.control.clone(), &ctx.settings.namespace)
}

pub(super) fn name(m: &Machine) -> String {
    m.name_any()
}

/// The labels of upstream's duration metrics for `m`; `None` without its deployment's `name`
/// label (upstream records nothing then).
pub(super) fn placement_labels(ctx: &Ctx, m: &Machine) -> Option<PlacementLabels> {
    let deployment = deployment_labels(m)?;
    let instance_type = m
        .class_name()
        .and_then(|c| ctx.class(c))
        .and_then(|c| c.node_template.clone())
        .map(|t| t.instance_type)
        .unwrap_or_default();
    let zone = m
        .spec
        .node_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|meta| meta.labels.as_ref())
        .and_then(|l| l.get("topology.kubernetes.io/zone").cloned())
        .unwrap_or_default();
    Some(PlacementLabels {
        namespace: deployment.namespace,
        machine_deployment: deployment.machine_deployment,
        instance_type,
        zone,
    })
}

pub(super) fn deployment_labels(m: &Machine) -> Option<DeploymentLabels> {
    let deployment = m.labels().get(labels::NAME).filter(|n| !n.is_empty())?;
    Some(DeploymentLabels {
        namespace: m.namespace().unwrap_or_default(),
        machine_deployment: deployment.clone(),
    })
}

/// Time since `since` (zero for a time in the future).
pub(super) fn since(
    ctx: &Ctx,
    since: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Duration {
    since
        .and_then(|t| ctx.clock.now().duration_since(t.0).try_into().ok())
        .unwrap_or(Duration::ZERO)
}

pub(super) fn record_duration(ctx: &Ctx, m: &Machine, step: Timed, took: Duration) {
    if let Some(labels) = placement_labels(ctx, m) {
        ctx.metrics.timed(step, &labels, took);
    }
}

pub(crate) async fn patch_status(
    ctx: &Ctx,
    m: &Machine,
    patch: serde_json::Value,
) -> Result<(), Error> {
    patch_status_for(ctx, m, patch).await.map(drop)
}

/// [`patch_status`], returning the Machine as written.
pub(super) async fn patch_status_for(
    ctx: &Ctx,
    m: &Machine,
    patch: serde_json::Value,
) -> Result<Machine, Error> {
    machine_api(ctx)
        .patch_status(&name(m), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .inspect(|written| ctx.note_own_write(written))
        .map_err(|e| Error::kube("update machine status", e))
}

/// Writes `op` (and `phase`) unless the Machine already shows exactly that: every status
/// write triggers another reconcile through the watch, so rewriting an unchanged failure
/// (with a new timestamp) would turn a retry backoff into a hot loop.
pub(super) async fn record(
    ctx: &Ctx,
    m: &Machine,
    phase: Option<&MachinePhase>,
    op: &Operation,
) -> Result<(), Error> {
    if status::already_recorded(m, phase, op) {
        return Ok(());
    }
    patch_status(ctx, m, status::status_patch(m, phase, op, ctx.clock.now())).await
}

/// Adds our finalizer (replacing a legacy name), guarded by the resource version. A Machine
/// gone meanwhile needs nothing more.
pub(crate) async fn add_finalizer(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let api = machine_api(ctx);
    let _ = kube_api::set_finalizer_as(&api, m, FINALIZER, LEGACY_FINALIZERS, true)
        .await
        .map_err(|e| Error::kube("add the machine finalizer", e))?;
    Ok(Action::await_change())
}

/// Removes our finalizer, under either name (the last step of deletion).
///
/// The deletion wrote the Machine's status on the way (Terminating, drain results), so the
/// resourceVersion of `m` is stale by now: guarding the patch with it failed with a conflict
/// on every deletion and cost a second full deletion pass. The finalizers are read again and
/// the patch is guarded by the fresh version (someone else may be editing finalizers).
pub(super) async fn remove_finalizer(ctx: &Ctx, m: &Machine) -> Result<(), Error> {
    let api = machine_api(ctx);
    // With the reconciled copy first (its resourceVersion guards the patch); a conflict
    // means it was stale: read the Machine and try again.
    match kube_api::set_finalizer_as(&api, m, FINALIZER, LEGACY_FINALIZERS, false).await {
        Ok(_) => return Ok(()),
        Err(e) if e.is_conflict() => {}
        Err(e) => return Err(Error::kube("remove the machine finalizer", e)),
    }
    let current = match api.get_opt(&name(m)).await {
        Ok(Some(c)) if c.uid() == m.uid() => c,
        // Gone, or a new Machine of the same name: nothing of ours to remove.
        Ok(_) => return Ok(()),
        Err(e) => return Err(Error::kube("read the machine", e)),
    };
    // Gone meanwhile: nothing left to remove.
    let _ = kube_api::set_finalizer_as(&api, &current, FINALIZER, LEGACY_FINALIZERS, false)
        .await
        .map_err(|e| Error::kube("remove the machine finalizer", e))?;
    Ok(())
}

/// Reads the class and its secrets for a driver call.
pub(crate) async fn class_and_secret(
    ctx: &Ctx,
    m: &Machine,
) -> Result<(MachineClass, SecretData), Error> {
    let class_name = crate::machine::observe::class_name(m).map_err(Error::Class)?;
    let class = ctx
        .class(class_name)
        .ok_or_else(|| {
            Error::Class(ClassProblem::ClassMissing {
                name: class_name.into(),
            })
        })
        .map(|c| (*c).clone())?;
    let [secret_ref, credentials] = crate::machine::observe::class_secret_refs(&class);
    let mut fetched = Vec::new();
    for r in [secret_ref, credentials].into_iter().flatten() {
        let secret = ctx.class_secret(&r).await?.ok_or_else(|| {
            Error::Class(ClassProblem::SecretMissing {
                class: class_name.into(),
                secret: r.name.clone(),
            })
        })?;
        fetched.push(secret);
    }
    let data = SecretData::merge(
        fetched.first().map(AsRef::as_ref),
        fetched.get(1).map(AsRef::as_ref),
    );
    Ok((class, data))
}

/// Pause before the next deletion step where no watch event of the Machine will come (after
/// deleting VolumeAttachments or the Node).
pub(super) const DELETION_STEP_REQUEUE: Duration = Duration::from_millis(200);

/// Writes a progress annotation (`key` = now) on the Machine.
pub(super) async fn set_progress(ctx: &Ctx, m: &Machine, key: &str) -> Result<(), Error> {
    let patch = json!({ "metadata": { "annotations": { key: ctx.clock.now().to_string() } } });
    patch_machine(ctx, m, &patch, "record the machine's progress").await
}

/// Writes the progress annotations `keys` (each = now) on the Machine in one patch; none, no
/// request.
pub(super) async fn set_progress_keys(ctx: &Ctx, m: &Machine, keys: &[&str]) -> Result<(), Error> {
    if keys.is_empty() {
        return Ok(());
    }
    let now = ctx.clock.now().to_string();
    let annotations: serde_json::Map<String, serde_json::Value> =
        keys.iter().map(|k| (k.to_string(), json!(now))).collect();
    let patch = json!({ "metadata": { "annotations": annotations } });
    patch_machine(ctx, m, &patch, "record the machine's progress").await
}

/// Removes a progress annotation from the Machine.
pub(super) async fn clear_progress(ctx: &Ctx, m: &Machine, key: &str) -> Result<(), Error> {
    let patch = json!({ "metadata": { "annotations": { key: null } } });
    patch_machine(ctx, m, &patch, "clear the machine's progress record").await
}

pub(crate) async fn patch_machine(
    ctx: &Ctx,
    m: &Machine,
    patch: &serde_json::Value,
    action: &'static str,
) -> Result<(), Error> {
    patch_machine_for(ctx, m, patch, action).await.map(drop)
}

/// [`patch_machine`], returning the Machine as written.
pub(super) async fn patch_machine_for(
    ctx: &Ctx,
    m: &Machine,
    patch: &serde_json::Value,
    action: &'static str,
) -> Result<Machine, Error> {
    machine_api(ctx)
        .patch(&name(m), &PatchParams::default(), &Patch::Merge(patch))
        .await
        .inspect(|written| ctx.note_own_write(written))
        .map_err(|e| Error::kube(action, e))
}

/// Asks the driver for the machine's VM.
pub(super) async fn vm_status(
    ctx: &Ctx,
    m: &Machine,
    class: &MachineClass,
    secret: &SecretData,
    request_id: &RequestId,
) -> Result<GetMachineStatusResponse, DriverError> {
    let request = GetMachineStatusRequest {
        machine: m.clone(),
        machine_class: class.clone(),
        secret: secret.clone(),
        request_id: request_id.clone(),
    };
    ctx.driver.get_machine_status(request).await
}
