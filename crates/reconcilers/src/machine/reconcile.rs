//! One reconcile of a Machine: observe, decide, act.

use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use mcm_api::{Machine, MachinePhase};

use super::decide::{self, ClassProblem, Step};
use super::{Ctx, Error, act, inplace, nodefinalizer, observe, preserve};

/// One reconcile of a Machine: observe, decide, act.
pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    reconcile_once(&machine, &ctx).await
}

/// How long a reconcile whose store copy predates our own write waits before looking again
/// (the watch event of the write normally wakes it sooner).
const STORE_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machine";

async fn reconcile_once(m: &Machine, ctx: &Ctx) -> Result<Action, Error> {
    // Decisions read the stores: wait for them to have synced (once, at start-up).
    if ctx
        .synced
        .subscribe()
        .wait_for(|synced| *synced)
        .await
        .is_err()
    {
        return Err(Error::Invariant(
            "the store readiness signal was dropped".into(),
        ));
    }
    // A copy older than our own last write would repeat what that write recorded; the
    // watch event of the write wakes the machine again (the requeue only bounds the wait).
    if ctx.store_is_behind(m) {
        tracing::debug!("the store has not caught up with our last write yet");
        return Ok(Action::requeue(STORE_CATCH_UP));
    }
    if node_was_deleted(m, ctx, ctx.freeze.is_frozen()) {
        return delete_machine_of_deleted_node(ctx, m).await;
    }
    let (_, deployment) = ctx.owners(m);
    let (cfg, policy_problem) = observe::machine_config_in(
        m,
        deployment
            .as_ref()
            .and_then(|d| d.metadata.annotations.as_ref()),
        &ctx.settings.defaults,
    );
    if ctx.policy_problem_is_new(m, policy_problem.as_deref())
        && let Some(problem) = &policy_problem
    {
        act::warn_policy_problem(ctx, m, problem).await;
    }
    let class = match observe::class_name(m) {
        Err(p) => Err(p),
        Ok(name) => match ctx.class(name) {
            None => Err(ClassProblem::ClassMissing { name: name.into() }),
            Some(_) => Ok(()),
        },
    };
    let node = observe::node_name(m)
        .and_then(|n| ctx.node(n))
        .filter(|n| !observe::node_not_managed(n));
    // Preservation's step comes before the lifecycle's (one of them per reconcile; both
    // converge). Not while frozen: the API servers may be unreachable.
    if !ctx.freeze.is_frozen() {
        let health = node
            .as_deref()
            .map(|n| observe::node_health(n, &cfg.bad_conditions));
        let facts = preserve::facts(
            m,
            node.as_deref(),
            health.as_ref(),
            &cfg,
            ctx.settings.defaults.preserve_timeout,
        );
        let step = preserve::next(&facts, Timestamp::now());
        if step != preserve::PreserveStep::Nothing {
            tracing::debug!(?step, "preservation step");
        }
        if let Some(result) = preserve::run(ctx, m, &cfg, node.as_deref(), step).await {
            return result;
        }
        // An in-place update's step (a Node is needed: none without a target cluster).
        if let Some(node) = node.as_deref()
            && m.metadata.deletion_timestamp.is_none()
            && m.phase().is_some()
        {
            let healthy = observe::node_health(node, &cfg.bad_conditions).healthy();
            let inplace_timeout = ctx.settings.defaults.inplace_timeout;
            let facts = inplace::facts(m, node, healthy, &cfg, inplace_timeout);
            let step = inplace::next(&facts, Timestamp::now());
            if step != inplace::InPlaceStep::Nothing {
                tracing::debug!(?step, "in-place update step");
            }
            if let Some(result) = inplace::run(ctx, m, &cfg, node, step).await {
                return result;
            }
        }
    }
    let protection = ctx.failure_protection(m);
    let deleting = m.metadata.deletion_timestamp.is_some();
    // The replacement budget is counted only where a failure can be decided.
    let may_fail = !deleting
        && matches!(
            m.phase(),
            Some(
                MachinePhase::Unknown
                    | MachinePhase::Pending
                    | MachinePhase::Available
                    | MachinePhase::CrashLoopBackOff
            )
        );
    let throttled = may_fail.then(|| ctx.replacement_throttle(m)).flatten();
    let attachments_left = match observe::node_name(m) {
        Some(n) if deleting => act::attachments_of(ctx, n).len(),
        _ => 0,
    };
    // Before a drain starts, ask the driver whether the VM still exists: a vanished VM has
    // nothing left to drain.
    let vm_gone = deleting
        && node.is_some()
        && observe::vm_requested(m)
        && class.is_ok()
        && m.phase() == Some(&MachinePhase::Terminating)
        && observe::progress(m, mcm_api::constants::annotations::progress::DRAIN_STARTED).is_none()
        && act::vm_is_gone(ctx, m).await;
    // The fast path: an Unknown machine whose node is not Ready asks the driver whether its
    // VM is still there and running.
    let vm = if !deleting
        && m.phase() == Some(&MachinePhase::Unknown)
        && !cfg.disable_health_timeout
        && class.is_ok()
        && observe::vm_requested(m)
        && node
            .as_deref()
            .is_none_or(|n| !observe::node_health(n, &cfg.bad_conditions).ready)
    {
        act::vm_report(ctx, m).await
    } else {
        decide::VmReport::NotAsked
    };
    let observed = observe::observe(
        m,
        &cfg,
        observe::Context {
            class: &class,
            node: node.as_deref(),
            frozen: ctx.freeze.is_frozen(),
            failure_protected: protection.as_deref(),
            replacement_throttled: throttled.as_deref(),
            vm_gone,
            vm: &vm,
            attachments_left,
            target_cluster: ctx.settings.target_cluster,
        },
    );
    let step = decide::next_step(&observed, &cfg, Timestamp::now());
    tracing::debug!(?step, "next step");
    let node = node.as_deref();
    // The Node finalizer: with the node template's write where this step makes one.
    if let Some(node) = node
        && !ctx.freeze.is_frozen()
        && step != Step::KeepRunning
        && nodefinalizer::to_add(m, node)
    {
        nodefinalizer::hold(ctx, node).await?;
    }
    match step {
        Step::AddFinalizer => act::add_finalizer(ctx, m).await,
        Step::ReportClassProblem(p) => act::report_class_problem(ctx, m, &p).await,
        Step::CreateVm => act::create_vm(ctx, m, &cfg).await,
        Step::FinishCreation => act::finish_creation(ctx, m, &cfg).await,
        Step::MarkAvailable => act::mark_available(ctx, m).await,
        Step::AwaitNode { remaining } => Ok(Action::requeue(remaining.min(ctx.settings.resync))),
        Step::MarkRunning => act::mark_running(ctx, m, node).await,
        Step::MarkUnknown { reason } => act::mark_unknown(ctx, m, &reason, node).await,
        Step::AwaitRecovery { remaining } => Ok(Action::requeue(
            remaining
                .unwrap_or(ctx.settings.resync)
                .min(ctx.settings.resync),
        )),
        Step::MarkFailed { reason } => act::mark_failed(ctx, m, &reason).await,
        Step::ReplacementThrottled { throttled, reason } => {
            act::throttle_replacement(ctx, m, &throttled, &reason).await
        }
        Step::Frozen => {
            act::hold(
                ctx,
                m,
                "machine controller is frozen by the safety controller",
            )
            .await
        }
        Step::Protected { reason } => {
            act::hold(ctx, m, &format!("not marked Failed: {reason}")).await
        }
        Step::AwaitHooks {
            stage,
            hooks,
            remaining,
        } => act::await_hooks(ctx, m, stage, &hooks, remaining).await,
        Step::ExpireHooks { stage, hooks } => act::expire_hooks(ctx, m, stage, &hooks, &cfg).await,
        Step::KeepRunning => act::keep_running(ctx, m, node).await,
        Step::Nothing => Ok(Action::await_change()),
        Step::MarkTerminating => act::mark_terminating(ctx, m, node, observed.vm_requested).await,
        Step::DrainPass {
            first,
            force,
            force_reason,
            unreachable,
            elapsed,
            pods_gone_for,
        } => {
            let Some(node_name) = observe::node_name(m) else {
                return Err(Error::Invariant("DrainPass without a node name".into()));
            };
            if first {
                let Some(node) = node else {
                    return Err(Error::Invariant(
                        "the first drain pass without a node".into(),
                    ));
                };
                act::set_node_terminating(ctx, node, m).await?;
            }
            let plan = act::PassPlan {
                first,
                force,
                force_reason: force_reason.as_deref(),
                unreachable,
                elapsed,
                pods_gone_for,
            };
            act::drain_pass(ctx, m, &cfg, node_name, plan).await
        }
        Step::DeleteVolumeAttachments => act::delete_volume_attachments(ctx, m).await,
        Step::DeleteVm => act::delete_vm(ctx, m).await,
        Step::DeletionBlocked(problem) => act::deletion_blocked(ctx, m, &problem).await,
        Step::DeleteNode => act::delete_node(ctx, m).await,
        Step::RemoveFinalizer => act::finish_deletion(ctx, m).await,
    }
}

/// Retry policy of failed reconciles: exponential backoff per machine.
pub fn error_policy(machine: Arc<Machine>, err: &Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(error = %crate::error_chain(err), "reconcile failed");
    let driver_err = match err {
        Error::Driver { source, .. } => Some(source),
        _ => None,
    };
    Action::requeue(ctx.backoff(&machine, driver_err))
}

/// What the Node store says about the Node a Machine records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// The machine records no node.
    NotRecorded,
    /// The Node exists (or is not managed by MCM: deleting it is not ours to act on).
    Present,
    /// The Node is being deleted: our finalizer (or another) holds it.
    Deleting,
    /// The Node is gone.
    Gone,
}

/// Whether the Node of `m` was deleted ([`node_gone`] on the stores). A level-triggered
/// observation: a failed deletion of the Machine is retried by the next reconcile. A Node
/// deleted while annotated not-managed-by-MCM counts as present: its Machine stays.
fn node_was_deleted(m: &Machine, ctx: &Ctx, frozen: bool) -> bool {
    let state = match observe::node_name(m) {
        None => NodeState::NotRecorded,
        Some(n) => match ctx.node(n) {
            Some(node) if observe::node_not_managed(&node) => NodeState::Present,
            Some(node) if node.metadata.deletion_timestamp.is_some() => NodeState::Deleting,
            Some(_) => NodeState::Present,
            None if ctx.unmanaged_node_deleted(n) => NodeState::Present,
            None => NodeState::Gone,
        },
    };
    node_gone(m, state, frozen)
}

/// Whether the deletion of its Node deletes `m`, as in the Go MCM: a Node being deleted
/// (held by the Node finalizer) deletes the machine in any phase, which then drains the
/// Node and deletes the VM before the Node object goes; a Node already gone deletes a machine
/// that had joined (Running or Unknown; before that its Node is only missing). Never a
/// machine already being deleted, nor while frozen. Pure.
pub fn node_gone(m: &Machine, node: NodeState, frozen: bool) -> bool {
    if m.metadata.deletion_timestamp.is_some() || frozen {
        return false;
    }
    match node {
        NodeState::Deleting => true,
        NodeState::Gone => matches!(
            m.phase(),
            Some(MachinePhase::Running | MachinePhase::Unknown)
        ),
        NodeState::NotRecorded | NodeState::Present => false,
    }
}

/// Deletes a Machine whose Node was deleted (MCM's rule: the node's deletion deletes its
/// machine, which then drains the Node if it still exists and deletes the VM).
async fn delete_machine_of_deleted_node(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let node = observe::node_name(m).unwrap_or_default();
    tracing::info!(node, "node deleted: deleting its machine");
    let api: kube::Api<Machine> =
        kube::Api::namespaced(ctx.control.clone(), &ctx.settings.namespace);
    let outcome = crate::kube_api::delete(&api, &m.name_any(), &Default::default())
        .await
        .map_err(|e| Error::kube("delete the machine of a deleted node", e))?;
    if outcome.is_gone() {
        return Ok(Action::await_change());
    }
    ctx.events
        .normal(
            &kube::Resource::object_ref(m, &()),
            "NodeDeleted",
            "Delete",
            format!("node {node} was deleted: deleting the machine"),
        )
        .await;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(phase: Option<&str>, deleting: bool) -> Machine {
        let mut m: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m", "labels": { "node": "n" } },
            "spec": {},
            "status": { "currentStatus": { "phase": phase } }
        }))
        .unwrap();
        if deleting {
            m.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
            );
        }
        m
    }

    #[test]
    fn a_deleting_node_or_a_joined_machine_whose_node_is_gone_deletes_the_machine() {
        use NodeState::*;
        // (phase, deleting, node, frozen) -> deleted
        let cases = [
            (Some("Running"), false, Gone, false, true),
            (Some("Unknown"), false, Gone, false, true),
            // The node has not joined yet.
            (Some("Pending"), false, Gone, false, false),
            (None, false, Gone, false, false),
            // A Node being deleted deletes its machine in any phase.
            (Some("Running"), false, Deleting, false, true),
            (Some("Pending"), false, Deleting, false, true),
            (Some("Failed"), false, Deleting, false, true),
            // Present, no node recorded, already deleting, or frozen.
            (Some("Running"), false, Present, false, false),
            (Some("Running"), false, NotRecorded, false, false),
            (Some("Running"), true, Gone, false, false),
            (Some("Running"), true, Deleting, false, false),
            (Some("Running"), false, Gone, true, false),
            (Some("Running"), false, Deleting, true, false),
        ];
        for (phase, deleting, present, frozen, want) in cases {
            assert_eq!(
                node_gone(&machine(phase, deleting), present, frozen),
                want,
                "{phase:?} deleting={deleting} present={present:?} frozen={frozen}"
            );
        }
    }
}
