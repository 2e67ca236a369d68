//! The phases of a machine that exists: Available, Running, Unknown, Failed, and the
//! driver probes the health decisions ask for.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::controller::Action;
use mcm_api::{Machine, MachineDeployment, MachineOperationType, MachinePhase};
use mcm_driver::RequestId;

use crate::machine::decide::VmReport;
use crate::machine::metrics::Timed;
use crate::machine::status::{self, Operation};
use crate::machine::{Ctx, Error};

use super::announce::announce;

use super::delete::delete_bootstrap_token;
use super::records::{
    RECHECK, class_and_secret, name, patch_status, placement_labels, record, record_duration,
    since, vm_status,
};
use crate::machine::announcement::{Announcement, Note, Target};
use crate::machine::outcome;

/// The VM exists and there is no target cluster to join: `Available` (upstream's phase for
/// this mode), announced once.
pub(crate) async fn mark_available(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let op = Operation::successful(
        MachineOperationType::Create,
        "Created machine on cloud provider".to_string(),
    );
    record(ctx, m, Some(&MachinePhase::Available), &op).await?;
    let note = format!(
        "VM {} created; there is no target cluster (--target-kubeconfig=none), so the machine \
         is Available without a Node",
        m.spec.provider_id.as_deref().unwrap_or_default()
    );
    ctx.events
        .normal(&m.object_ref(&()), "Available", "Create", note)
        .await;
    Ok(Action::await_change())
}

/// The Node is Ready and healthy: Running (and the bootstrap token is no longer needed).
pub(crate) async fn mark_running(
    ctx: &Ctx,
    m: &Machine,
    node: Option<&Node>,
) -> Result<Action, Error> {
    // Unknown, or a preserved Failed machine whose node recovered.
    let from_unknown = matches!(
        m.phase(),
        Some(MachinePhase::Unknown | MachinePhase::Failed)
    );
    let joined_after = since(ctx, m.metadata.creation_timestamp.as_ref());
    let (kind, description) = if from_unknown {
        (
            MachineOperationType::HealthCheck,
            format!("Machine {} is healthy again", name(m)),
        )
    } else {
        (
            MachineOperationType::Create,
            format!(
                "Machine {} successfully joined the cluster in {}",
                name(m),
                mcm_api::duration::format_go_duration(Duration::from_secs(joined_after.as_secs()))
            ),
        )
    };
    // The token goes before the first Running is recorded, so a crash in between cannot
    // skip it (and the deletion reads "Running once" as "no token left").
    if !from_unknown {
        delete_bootstrap_token(ctx, m).await?;
        record_duration(ctx, m, Timed::Join, joined_after);
    }
    let op = Operation::successful(kind, description);
    // Running, the operation and the node's conditions and addresses in one status write.
    let mut patch = status::status_patch(m, Some(&MachinePhase::Running), &op, ctx.clock.now());
    if let Some(node) = node {
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default();
        status::merge_into(
            &mut patch,
            status::node_status_patch(
                crate::machine::observe::node_conditions_of(node),
                &addresses,
            ),
        );
    }
    patch_status(ctx, m, patch).await?;
    let note = if from_unknown {
        op.description
    } else {
        // The first Running Event also tells of the VM's creation.
        format!(
            "{} as node {} (VM {})",
            op.description,
            m.node_name().unwrap_or_default(),
            m.spec.provider_id.as_deref().unwrap_or_default()
        )
    };
    ctx.events
        .normal(&m.object_ref(&()), "Running", "HealthCheck", note)
        .await;
    Ok(Action::requeue(ctx.settings.resync))
}

/// Healthy and Running: copy Node conditions when they changed and apply the node template.
/// No API call unless something changed: this runs on every relevant Node update.
pub(crate) async fn keep_running(
    ctx: &Ctx,
    m: &Machine,
    node: Option<&Node>,
) -> Result<Action, Error> {
    if let Some(node) = node {
        copy_node_status(ctx, m, node, false).await?;
    }
    Ok(Action::requeue(ctx.settings.resync))
}

pub(super) async fn copy_node_status(
    ctx: &Ctx,
    m: &Machine,
    node: &Node,
    always: bool,
) -> Result<(), Error> {
    let conditions = crate::machine::observe::node_conditions_of(node);
    let current = m.status.as_ref().and_then(|s| s.conditions.as_deref());
    if always || status::conditions_differ(current, conditions) {
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default();
        patch_status(ctx, m, status::node_status_patch(conditions, &addresses)).await?;
    }
    Ok(())
}

/// The Node is missing or unhealthy: Unknown.
pub(crate) async fn mark_unknown(
    ctx: &Ctx,
    m: &Machine,
    reason: &str,
    node: Option<&Node>,
) -> Result<Action, Error> {
    if let Some(node) = node {
        copy_node_status(ctx, m, node, true).await?;
    }
    let description = format!(
        "Machine {} is unhealthy - changing phase to Unknown: {reason}",
        name(m)
    );
    let op = Operation::processing(MachineOperationType::HealthCheck, description);
    let note = Note::warning("Unhealthy", "HealthCheck", op.description.clone());
    let unhealthy = Announcement::every(Some(MachinePhase::Unknown), op, vec![note]);
    announce(ctx, m, unhealthy).await?;
    Ok(Action::requeue(RECHECK))
}

/// The machine would fail, but the replacement budget of its deployment is used up:
/// record why (once, with an Event) and check again later.
pub(crate) async fn throttle_replacement(
    ctx: &Ctx,
    m: &Machine,
    throttled: &str,
    reason: &str,
) -> Result<Action, Error> {
    let description = format!("replacement throttled: {throttled}; {reason}");
    let note = Note::warning("ReplacementThrottled", "HealthCheck", description.clone());
    let op = Operation::processing(MachineOperationType::HealthCheck, description);
    if announce(ctx, m, Announcement::record(None, op, vec![note])).await? {
        ctx.metrics.remediation_held();
    }
    Ok(Action::requeue(RECHECK))
}

/// How soon a machine whose failure lost the race for its deployment's permit looks again.
pub(crate) const PERMIT_BUSY_RECHECK: Duration = Duration::from_secs(1);

/// The machine is beyond repair: Failed (its deployment's budget allowed it, see
/// [`Replacement`](crate::machine::model::Replacement)).
pub(crate) async fn mark_failed(ctx: &Ctx, m: &Machine, reason: &str) -> Result<Action, Error> {
    let kind = match m.phase() {
        Some(MachinePhase::Unknown) | Some(MachinePhase::Running) => {
            MachineOperationType::HealthCheck
        }
        _ => MachineOperationType::Create,
    };
    let description = format!("Machine {} failed: {reason}", name(m));
    let op = Operation::failed(kind, description, None);
    let note = Note::warning("Failed", "HealthCheck", op.description.clone());
    announce(
        ctx,
        m,
        Announcement::every(Some(MachinePhase::Failed), op, vec![note]),
    )
    .await?;
    ctx.metrics.failed();
    // A VM that never joined within the creation timeout.
    if m.node_name().is_some()
        && matches!(
            m.phase(),
            Some(MachinePhase::Pending | MachinePhase::Available)
        )
        && let Some(labels) = placement_labels(ctx, m)
    {
        ctx.metrics.failed_join(&labels);
    }
    Ok(Action::await_change())
}

/// Holds a machine of a partitioned zone instead of marking it Failed: records why on the
/// Machine (`lastOperation`, once per distinct reason), counts it in
/// `mcm_machine_zone_partition_held_machines`, and when the reason is new, a Warning
/// `ZonePartitionHold` on its MachineDeployment names the zone (one Event series per
/// deployment and zone: the machines of a zone give the same note). Comes back within
/// `remaining`, when the hold ends unless the Node has reported again.
pub(crate) async fn hold_for_partition(
    ctx: &Ctx,
    m: &Machine,
    deployment: Option<&MachineDeployment>,
    partition: &crate::machine::partition::ZonePartition,
    max_hold: Duration,
    remaining: Duration,
) -> Result<Action, Error> {
    let why = format!(
        "not marked Failed: {}; its VM runs, so its remediation is held (at most {} past the \
         health timeout)",
        partition.describe(),
        mcm_api::duration::format_go_duration(max_hold)
    );
    let mut notes = Vec::new();
    if let Some(deployment) = deployment {
        let note = format!(
            "zone {} is partitioned: remediation of its machines is held while their VMs \
                 run (at most {} past the health timeout); {} of its {} machines unreachable, \
                 {} of {} healthy in the other zones",
            partition.zone,
            mcm_api::duration::format_go_duration(max_hold),
            partition.unreachable,
            partition.machines,
            partition.healthy_elsewhere,
            partition.elsewhere
        );
        notes.push(
            Note::warning("ZonePartitionHold", "HealthCheck", note)
                .on(Target::Object(deployment.object_ref(&()))),
        );
    }
    let op = Operation::processing(MachineOperationType::HealthCheck, why);
    announce(ctx, m, Announcement::record(None, op, notes)).await?;
    Ok(Action::requeue(remaining.min(RECHECK)))
}

/// Records that a step is held back (frozen, protected) without changing the phase.
pub(crate) async fn hold(ctx: &Ctx, m: &Machine, why: &str) -> Result<Action, Error> {
    let kind = if m.metadata.deletion_timestamp.is_some() {
        MachineOperationType::Delete
    } else {
        MachineOperationType::HealthCheck
    };
    let op = Operation::processing(kind, why);
    announce(ctx, m, Announcement::record(None, op, vec![])).await?;
    Ok(Action::requeue(RECHECK))
}

/// Asks the driver about the VM of an unhealthy machine (the fast path): gone, stopped (its
/// VM resource reported `Stopped` or `Failed`), present, or `NotAsked` when the driver
/// could not tell (an error other than `NotFound`, or the class is unusable).
pub(crate) async fn vm_report(ctx: &Ctx, m: &Machine) -> VmReport {
    let Ok((class, secret)) = class_and_secret(ctx, m).await else {
        return VmReport::NotAsked;
    };
    let answer = vm_status(ctx, m, &class, &secret, &RequestId::generate()).await;
    if let Err(e) = &answer {
        tracing::debug!(error = %e, "the driver's answer about the VM");
    }
    outcome::vm_report(&answer)
}
