//! Deletion after the drain: VolumeAttachments, the VM, the Node, the bootstrap token and
//! the finalizer.

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use mcm_api::constants::annotations::progress;
use mcm_api::{Machine, MachineOperationType, MachinePhase};
use mcm_driver::{DeleteMachineRequest, DriverError, RequestId};

use crate::kube_api;
use crate::machine::decide::ClassProblem;
use crate::machine::metrics::Timed;
use crate::machine::status::{self, Operation};
use crate::machine::{Ctx, Error, token};

use super::announce::announce;
use super::records::{
    DELETION_STEP_REQUEUE, class_and_secret, machine_api, name, patch_status, record,
    record_duration, remove_finalizer, since,
};
use crate::machine::announcement::{Announcement, Note};
use crate::machine::outcome::VmDeletion;

/// Deletes the machine's bootstrap token (its Node joined, or the machine goes away and
/// may have one left). Gone already is as good as deleted.
pub(super) async fn delete_bootstrap_token(ctx: &Ctx, m: &Machine) -> Result<(), Error> {
    let api: Api<Secret> = Api::namespaced(ctx.target.clone(), token::TOKEN_NAMESPACE);
    let id = token::token_id(&ctx.settings.namespace, &name(m));
    // Gone already is as good as deleted.
    let _ = kube_api::delete(&api, &token::secret_name(&id), &DeleteParams::default())
        .await
        .map_err(|e| Error::kube("delete the bootstrap token", e))?;
    Ok(())
}

/// Deletion requested: Terminating (no Event). The description says what comes next, from what was
/// observed (a node to drain, a VM to delete, or nothing at all). A bootstrap token the
/// machine may still have ([`token::may_exist`], read from the phase it leaves) is deleted
/// first, so a crash before the Terminating write repeats it.
pub(crate) async fn mark_terminating(
    ctx: &Ctx,
    m: &Machine,
    node: Option<&Node>,
    vm_requested: bool,
) -> Result<Action, Error> {
    if ctx.settings.target_cluster && token::may_exist(m) {
        delete_bootstrap_token(ctx, m).await?;
    }
    let next = match (node, vm_requested) {
        (Some(n), _) => format!("draining node {} next", n.name_any()),
        (None, true) => "no node; deleting the VM next".to_string(),
        (None, false) => "no VM was ever requested; nothing to delete".to_string(),
    };
    let description = format!("Deleting machine {}: {next}", name(m));
    // No Event: the phase and lastOperation say it, and the deletion's one Event (`Deleted`,
    // naming what went) comes when it is done; a deletion that waits says why in Events of
    // its own (a blocked drain, a class to fix, hooks).
    let op = Operation::processing(MachineOperationType::Delete, description);
    record(ctx, m, Some(&MachinePhase::Terminating), &op).await?;
    Ok(Action::await_change())
}

/// Drained: delete the VolumeAttachments still pointing at the node (those already being
/// deleted are left to their attacher).
pub(crate) async fn delete_volume_attachments(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let Some(node_name) = m.node_name() else {
        return Ok(Action::requeue(DELETION_STEP_REQUEUE));
    };
    let api: Api<VolumeAttachment> = Api::all(ctx.target.clone());
    for va in attachments_of(ctx, node_name) {
        let _ = kube_api::delete(&api, &va, &DeleteParams::default())
            .await
            .map_err(|e| Error::kube("delete a VolumeAttachment of the node", e))?;
    }
    Ok(Action::requeue(DELETION_STEP_REQUEUE))
}

/// The VolumeAttachments to `node_name` that are not being deleted yet.
pub(crate) fn attachments_of(ctx: &Ctx, node_name: &str) -> Vec<String> {
    ctx.drain_stores
        .volume_attachments
        .state()
        .iter()
        .filter(|va| va.spec.node_name == node_name && va.metadata.deletion_timestamp.is_none())
        .map(|va| va.name_any())
        .collect()
}

/// Deletes the VM (NotFound is success) and records that it did. A class that cannot be
/// used, or a driver that calls the request invalid, blocks the deletion (the finalizer
/// stays) until the class is fixed.
pub(crate) async fn delete_vm(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let (class, secret) = match class_and_secret(ctx, m).await {
        Ok(x) => x,
        Err(Error::Class(problem)) => return deletion_blocked(ctx, m, &problem).await,
        Err(e) => return Err(e),
    };
    let request_id = RequestId::generate();
    let class_name = class.name_any();
    let deleted = ctx
        .driver
        .delete_machine(DeleteMachineRequest {
            machine: m.clone(),
            machine_class: class,
            secret,
            request_id: request_id.clone(),
        })
        .await;
    match (VmDeletion::of(&deleted), deleted) {
        (VmDeletion::Deleted, Ok(response)) => {
            let state = response.last_known_state.as_deref();
            if let Some(p) = status::driver_state_patch(m, state, None) {
                patch_status(ctx, m, p).await?;
            }
        }
        (VmDeletion::Deleted, Err(_)) => {}
        (VmDeletion::Blocked(message), _) => {
            let problem = ClassProblem::Invalid {
                class: class_name,
                message,
            };
            return deletion_blocked(ctx, m, &problem).await;
        }
        (VmDeletion::Failed, Ok(_)) => {
            return Err(Error::Invariant(
                "a deletion answered Ok read as failed".into(),
            ));
        }
        (VmDeletion::Failed, Err(source)) => return deletion_failed(ctx, m, source).await,
    }
    tracing::info!(%request_id, "VM deleted");
    record_duration(
        ctx,
        m,
        Timed::Delete,
        since(ctx, m.metadata.deletion_timestamp.as_ref()),
    );
    ctx.reset_backoff(m);
    // The Node and the finalizer go in the same reconcile, with no record of the VM's
    // deletion in between: after a crash the VM is deleted again, which the driver answers
    // with NotFound (success), and the rest follows. Recording it would cost a Machine
    // patch, a status write and a Node Event per machine for a state that lasts milliseconds.
    remove_node(ctx, m).await?;
    finish_deletion(ctx, m).await
}

/// The driver could not delete the VM (the cloud is unreachable, throttles, fails): the
/// machine keeps its finalizer and says so (lastOperation `Delete`/`Failed` with the error's
/// code, a `DeletionFailed` Event), and the deletion is retried when the error says, else
/// with the machine's backoff.
async fn deletion_failed(ctx: &Ctx, m: &Machine, err: DriverError) -> Result<Action, Error> {
    let description = format!(
        "{} could not be deleted: delete_machine failed: {}; the machine keeps its finalizer \
         and the deletion is retried",
        vm_description(m),
        err.full_message()
    );
    tracing::warn!(error = %description, "VM deletion failed");
    let op = Operation::failed(
        MachineOperationType::Delete,
        description,
        Some(err.code.as_str().to_string()),
    );
    let note = Note::warning("DeletionFailed", "Delete", op.description.clone());
    announce(ctx, m, Announcement::every(None, op, vec![note])).await?;
    Ok(Action::requeue(ctx.backoff(m, Some(&err))))
}

/// The VM as a Machine knows it: its providerID, or when its creation was requested.
pub(super) fn vm_description(m: &Machine) -> String {
    match m.spec.provider_id.as_deref().filter(|p| !p.is_empty()) {
        Some(id) => format!("VM {id}"),
        None => match crate::machine::observe::progress(m, progress::VM_REQUESTED) {
            Some(t) => format!("the VM requested at {t}"),
            None => "the VM".to_string(),
        },
    }
}

/// A VM may exist but cannot be deleted with the class as it is: keep the finalizer, say
/// exactly that (lastOperation and one Event), and retry (a class change wakes us too).
pub(crate) async fn deletion_blocked(
    ctx: &Ctx,
    m: &Machine,
    problem: &ClassProblem,
) -> Result<Action, Error> {
    let description = format!(
        "{} may still exist and cannot be deleted: {problem}; the machine keeps its finalizer \
         until the class is fixed",
        vm_description(m)
    );
    let note = Note::warning("DeletionBlocked", "Delete", description.clone());
    let op = Operation::failed(MachineOperationType::Delete, description, None);
    announce(ctx, m, Announcement::record(None, op, vec![note])).await?;
    Ok(Action::requeue(ctx.backoff(m, None)))
}

/// The VM is gone (recorded so by an earlier release, or never requested) but the Node is
/// still there: release its finalizer and delete it.
pub(crate) async fn delete_node(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    remove_node(ctx, m).await?;
    Ok(Action::requeue(DELETION_STEP_REQUEUE))
}

/// Deletes the machine's Node, after releasing its finalizer (the Go MCM's order: the Node
/// object goes at once). A Node the store does not hold is gone already, and one not managed
/// by MCM is left alone (as the lifecycle
/// decides: [`Step::RemoveFinalizer`](crate::machine::decide::Step::RemoveFinalizer) follows
/// when there is no Node).
pub(super) async fn remove_node(ctx: &Ctx, m: &Machine) -> Result<(), Error> {
    let Some(node_name) = m.node_name() else {
        return Ok(());
    };
    // A Node not managed by MCM is not ours to delete.
    let Some(known) = ctx
        .node(node_name)
        .filter(|n| !crate::machine::observe::node_not_managed(n))
    else {
        return Ok(());
    };
    // A copy older than our own last write of the Node (the cordon that released the
    // finalizer, moments ago in this reconcile) may still show the finalizer: the write
    // after the cordon is then only the deletion (a Node still held would be released by the
    // next reconcile, which finds it being deleted).
    if crate::machine::nodefinalizer::held(&known) && !ctx.node_store_is_behind(&known) {
        crate::machine::nodefinalizer::release(ctx, node_name).await?;
    }
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    let _ = kube_api::delete(&nodes, node_name, &DeleteParams::default())
        .await
        .map_err(|e| Error::kube("delete the machine's node", e))?;
    Ok(())
}

/// Everything is gone (the bootstrap token went when the machine became Terminating):
/// remove the finalizer.
pub(crate) async fn finish_deletion(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let note = if crate::machine::observe::vm_requested(m) {
        format!("Machine {}: VM and node deleted", name(m))
    } else {
        format!("Machine {}: deleted (no VM was ever requested)", name(m))
    };
    ctx.events
        .normal(&m.object_ref(&()), "Deleted", "Delete", note)
        .await;
    remove_finalizer(ctx, m).await?;
    ctx.note_finished(m);
    ctx.metrics.deleted();
    ctx.reset_backoff(m);
    // Look for leftovers (e.g. of an earlier failed creation) right away.
    ctx.orphan_trigger.notify_one();
    Ok(Action::await_change())
}

/// Whether a Machine of this name exists, read from the API server (used where the store
/// could be stale, e.g. before deleting a VM as an orphan).
pub(crate) async fn machine_exists(ctx: &Ctx, name: &str) -> Result<bool, Error> {
    Ok(machine_api(ctx)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube("read the machine", e))?
        .is_some())
}
