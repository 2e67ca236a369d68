//! The drain: one pass per reconcile, its outcome recorded in the progress annotations; the
//! Node marked terminating before the first pass.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use mcm_api::constants::annotations::progress;
use mcm_api::constants::node_conditions;
use mcm_api::{Machine, MachinePhase};
use serde_json::json;

use crate::kube_api::ApiErrorExt;
use crate::machine::decide::MachineConfig;
use crate::machine::{Ctx, Error};

use super::announce::announce;
use super::records::{
    DRAIN_WAIT_RECHECK, RECHECK, deletion_step, deployment_labels, name, set_progress_keys,
};
use crate::machine::announcement::{Announcement, Note, Target};

/// What a drain pass is told by the decision.
#[derive(Debug, Clone)]
pub struct PassPlan<'a> {
    /// The first pass: the drain starts now (recorded with this pass's outcome).
    pub first: bool,
    /// Delete pods instead of evicting them.
    pub force: bool,
    /// Why, if forced.
    pub force_reason: Option<&'a str>,
    /// The node is unreachable.
    pub unreachable: bool,
    /// Why the node's pods run nowhere (its VM is gone or stopped), if they do: they are
    /// deleted, not evicted.
    pub vm_dead: Option<&'a str>,
    /// Time since the drain started.
    pub elapsed: Duration,
    /// Time since no pod was left, if so.
    pub pods_gone_for: Option<Duration>,
    /// The pass cordons the node (the first pass of a deletion finds it cordoned by
    /// [`cordon_for_deletion`]).
    pub cordon: bool,
}

/// Where a pass of a drain that does not wait for volumes (preservation and in-place
/// updates: the VM stays) leaves its caller.
#[derive(Debug)]
pub(crate) enum PodsDrain<'a> {
    /// No pod is left to move (or the Node is gone).
    Drained,
    /// Pods are left: come back after this long (the eviction retry interval when a
    /// PodDisruptionBudget refused an eviction, or can never allow one until the drain
    /// deletes the pod; the next step's pace otherwise).
    Draining(Duration),
    /// A request failed (retried after the eviction retry interval): the first failure.
    Failed(&'a mcm_drain::DrainError),
}

/// How preservation and in-place updates read a drain pass (pure). `next`: the pace of
/// their steps; `retry`: the eviction retry interval.
pub(crate) fn pods_drain(
    report: &mcm_drain::PassReport,
    next: Duration,
    retry: Duration,
) -> PodsDrain<'_> {
    match report.state() {
        mcm_drain::PassState::Done
        | mcm_drain::PassState::Volumes
        | mcm_drain::PassState::NodeGone => PodsDrain::Drained,
        mcm_drain::PassState::Pods => match report.failed.first() {
            Some(e) => PodsDrain::Failed(e),
            None if !report.blocked.is_empty() || !report.misconfigured.is_empty() => {
                PodsDrain::Draining(retry)
            }
            None => PodsDrain::Draining(next),
        },
    }
}

/// One pass of the drain of `node` (deletion, preservation and in-place updates drain through
/// it).
pub(crate) async fn drain_node_pass(
    ctx: &Ctx,
    node: &str,
    options: &mcm_drain::Options,
    input: &mcm_drain::PassInput,
) -> Result<mcm_drain::PassReport, Error> {
    mcm_drain::drain_pass(ctx.target.clone(), node, options, input, &ctx.drain_stores)
        .await
        .map_err(Error::Drain)
}

pub(crate) fn drain_options(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    force: bool,
) -> mcm_drain::Options {
    let mut options = mcm_drain::Options::new(ctx.driver.clone());
    options.force = force;
    options.timeout = cfg.drain_timeout;
    options.max_evict_retries = u32::try_from(
        m.spec
            .configuration
            .max_evict_retries
            .unwrap_or(ctx.settings.defaults.max_evict_retries)
            .max(0),
    )
    .unwrap_or(0);
    options.eviction_retry_interval = ctx.settings.eviction_retry_interval;
    options.pv_detach_timeout = ctx.settings.pv_detach_timeout;
    options.pv_reattach_timeout = ctx.settings.pv_reattach_timeout;
    options.parallelism = ctx.settings.drain_parallelism;
    options.eviction_client = Some(ctx.evictions.clone());
    options
}

/// Where a pass of a deletion's drain leaves the machine.
#[derive(Debug)]
pub enum DeletionDrain {
    /// Pods or volumes are left: the pass recorded where it stands; come back.
    Wait(Action),
    /// The node is drained, nothing recorded yet: the deletion goes on in this reconcile
    /// when its next step needs no wait ([`drained_and_going_on`]), else the drain is
    /// recorded ([`record_drained`]).
    Drained(Drained),
}

/// A finished drain, as the pass that finished it saw it.
#[derive(Debug)]
pub struct Drained {
    node: String,
    first: bool,
    /// Pods were evicted, deleted or released on the way (else there is nothing to tell).
    acted: bool,
    /// The node was drained (not gone).
    node_drained: bool,
    /// Pods were deleted without an eviction because the node's VM is dead: the drain is
    /// recorded in `lastOperation` (and announced) before the deletion goes on, so that the
    /// Machine says why no budget was asked.
    pub without_eviction: bool,
    description: String,
    summary: String,
    /// Warnings about drain rules that do not parse, for the node.
    invalid: Vec<Note>,
}

/// One pass of the drain: this round's evictions (or deletions); a pass that leaves pods or
/// volumes records where it stands. Never waits for pods or volumes inside the reconcile. The
/// first pass of a deletion's drain finds the node cordoned already ([`cordon_for_deletion`]).
pub async fn drain_pass(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node_name: &str,
    plan: PassPlan<'_>,
) -> Result<DeletionDrain, Error> {
    let pass_started = ctx.clock.instant();
    let mut options = drain_options(ctx, m, cfg, plan.force);
    options.cordon = plan.cordon;
    if let Some(why) = plan.force_reason {
        tracing::info!(node = node_name, why, "force-draining");
    }
    let input = mcm_drain::PassInput {
        elapsed: plan.elapsed,
        pods_gone_for: plan.pods_gone_for,
        unreachable: plan.unreachable,
        vm_dead: plan.vm_dead.is_some(),
    };
    let report = drain_node_pass(ctx, node_name, &options, &input).await?;
    let mut summary = report.summary();
    let without_eviction = plan.vm_dead.is_some()
        && report
            .deleted
            .iter()
            .any(|d| d.reason == mcm_drain::DeleteReason::VmDead);
    if let Some(why) = plan.vm_dead {
        summary.push_str(&format!(
            " (pods deleted, not evicted: {why}, so they run nowhere; a PodDisruptionBudget \
             guards running pods only)"
        ));
    } else if let Some(why) = plan.force_reason {
        summary.push_str(&format!(" (forced: {why})"));
    }
    let description = format!("Drain of node {node_name}: {summary}");
    let state = report.state();
    let blocked = !report.blocked.is_empty() || !report.misconfigured.is_empty();
    // An unknown drain rule value is in the summary; a Warning per pod and value goes to the
    // node with the pass's record (when that is new, not at every pass).
    let on_node = Target::Node(node_name.to_string());
    let invalid: Vec<Note> = report
        .invalid_rules
        .iter()
        .map(|bad| Note::warning("DrainRuleInvalid", "Delete", bad.to_string()).on(on_node.clone()))
        .collect();
    if let mcm_drain::PassState::Done | mcm_drain::PassState::NodeGone = state {
        if let Some(labels) = deployment_labels(m) {
            ctx.metrics.drained(
                &labels,
                plan.elapsed + ctx.clock.instant().saturating_duration_since(pass_started),
            );
        }
        let acted =
            !report.evicted.is_empty() || !report.deleted.is_empty() || !report.released.is_empty();
        return Ok(DeletionDrain::Drained(Drained {
            node: node_name.to_string(),
            first: plan.first,
            acted,
            node_drained: state == mcm_drain::PassState::Done,
            without_eviction,
            description,
            summary,
            invalid,
        }));
    }
    // The progress this pass makes, written in one patch: the start of the drain (first
    // pass), all pods gone (the volume wait counts from there).
    let mut progress_keys = Vec::new();
    if plan.first {
        progress_keys.push(progress::DRAIN_STARTED);
    }
    if state == mcm_drain::PassState::Volumes && plan.pods_gone_for.is_none() {
        progress_keys.push(progress::PODS_DRAINED);
    }
    set_progress_keys(ctx, m, &progress_keys).await?;
    if plan.first {
        // One Event on the node says why it is cordoned and pods leave it; the Machine's
        // lastOperation has every step.
        let note = format!("cordoned; draining for the deletion of machine {}", name(m));
        let started = Note::normal("DrainStarted", "Delete", note).on(on_node.clone());
        announce(ctx, m, Announcement::events(vec![started])).await?;
    }
    let mut notes = invalid;
    if state == mcm_drain::PassState::Pods && blocked {
        ctx.metrics.drain_blocked();
        notes.push(Note::warning(
            "DrainBlockedByPDB",
            "Drain",
            description.clone(),
        ));
        notes.push(Note::warning("DrainBlockedByPDB", "Delete", summary).on(on_node));
    }
    announce(ctx, m, deletion_step(description, notes)).await?;
    Ok(DeletionDrain::Wait(match state {
        mcm_drain::PassState::Pods if blocked => {
            Action::requeue(ctx.settings.eviction_retry_interval)
        }
        mcm_drain::PassState::Volumes | mcm_drain::PassState::Pods => {
            Action::requeue(ctx.settings.eviction_retry_interval.min(DRAIN_WAIT_RECHECK))
        }
        mcm_drain::PassState::Done | mcm_drain::PassState::NodeGone => {
            return Err(Error::Invariant("a finished drain left to wait".into()));
        }
    }))
}

impl Drained {
    /// Whether the drain has something to tell: pods were moved (in this pass, or in earlier
    /// ones: a drain that took more than one pass). An empty node's drain tells nothing the
    /// deletion's own Event does not.
    fn tells(&self) -> bool {
        self.acted || !self.first
    }

    /// The Events of a drain that finished, besides the one on the Machine: the warnings
    /// about drain rules; when it tells, `Drained` on the node, and when it finished in its
    /// first pass after moving pods, the node's `DrainStarted` (which a drain that waits
    /// publishes with its first pass).
    fn node_notes(&self, m: &Machine) -> Vec<Note> {
        let on_node = Target::Node(self.node.clone());
        let mut notes = self.invalid.clone();
        if !self.tells() {
            return notes;
        }
        if self.first && self.acted {
            let note = format!(
                "cordoned and drained for the deletion of machine {}: {}",
                name(m),
                self.summary
            );
            notes.push(Note::normal("DrainStarted", "Delete", note).on(on_node.clone()));
        }
        if self.node_drained {
            notes.push(Note::normal("Drained", "Delete", self.summary.clone()).on(on_node));
        }
        notes
    }
}

/// A drain finished and the deletion goes on in this reconcile: nothing is recorded (a crash
/// before the VM is deleted repeats a pass that finds the node drained). A drain that moved
/// pods says so on the Machine and the node (`Drained`).
pub async fn drained_and_going_on(ctx: &Ctx, m: &Machine, d: &Drained) -> Result<(), Error> {
    let mut notes = Vec::new();
    if d.tells() {
        notes.push(Note::normal("Drained", "Drain", d.description.clone()));
    }
    notes.extend(d.node_notes(m));
    announce(ctx, m, Announcement::events(notes)).await?;
    Ok(())
}

/// A drain finished but the deletion's next step waits (VolumeAttachments, pre-terminate
/// hooks, a class to fix): record the drain (its start too, when it finished in its first
/// pass), announce it when pods were moved, and come back.
pub async fn record_drained(ctx: &Ctx, m: &Machine, d: Drained) -> Result<Action, Error> {
    let mut progress_keys = Vec::new();
    if d.first {
        progress_keys.push(progress::DRAIN_STARTED);
    }
    progress_keys.push(progress::DRAINED);
    set_progress_keys(ctx, m, &progress_keys).await?;
    let mut notes = Vec::new();
    if d.tells() {
        notes.push(Note::normal("Drained", "Drain", d.description.clone()));
    }
    notes.extend(d.node_notes(m));
    announce(ctx, m, deletion_step(d.description, notes)).await?;
    Ok(Action::requeue(RECHECK))
}

/// The first step of a deletion's drain on the node: cordon it (`spec.unschedulable`) and
/// release the Node finalizer in one strategic merge patch that names only what it changes,
/// so it needs no resourceVersion guard (a Node's version changes with every status write of
/// its kubelet: a guarded write planned from the store's copy met a conflict, a read and a
/// second write on most deletions). The `node.kubernetes.io/unschedulable` taint comes from
/// the node lifecycle controller, as with the Go MCM's cordon (a Node's taints have no merge
/// key: adding one means writing the whole list). The finalizer turns a `kubectl delete
/// node` into the machine's deletion; once the machine is being deleted it has done its
/// part, and releasing it with the cordon saves the separate write before the Node's deletion
/// (the Go MCM's order). A Node that is itself being deleted keeps it until the VM is gone,
/// so that it stays while it is drained. Nothing is written when there is nothing to change;
/// a node gone is fine.
pub async fn cordon_for_deletion(ctx: &Ctx, node: &Node) -> Result<(), Error> {
    let Some(patch) = cordon_and_release(node) else {
        return Ok(());
    };
    ctx.patch_node_unguarded(&node.name_any(), &patch, "cordon the node")
        .await
}

/// The strategic merge patch that cordons `node` (recorded as the drain's cordon records it)
/// and releases the Node finalizer unless the Node is being deleted; `None` when neither is
/// needed. Pure.
pub(crate) fn cordon_and_release(node: &Node) -> Option<serde_json::Value> {
    let cordon = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let release =
        node.metadata.deletion_timestamp.is_none() && crate::machine::nodefinalizer::held(node);
    if !cordon && !release {
        return None;
    }
    let mut patch = if release {
        crate::machine::nodefinalizer::release_patch()
    } else {
        json!({ "metadata": {} })
    };
    if cordon {
        let mut record = node
            .annotations()
            .get(mcm_drain::CORDON_RECORD_ANNOTATION)
            .map(|v| mcm_drain::parse_record(v))
            .unwrap_or_default();
        record.unschedulable = true;
        patch["metadata"]["annotations"] =
            json!({ mcm_drain::CORDON_RECORD_ANNOTATION: mcm_drain::format_record(record) });
        patch["spec"] = json!({ "unschedulable": true });
    }
    Some(patch)
}

/// Sets the node's `Terminating` condition (unless it is set), before its drain starts.
pub async fn set_node_terminating(ctx: &Ctx, node: &Node, m: &Machine) -> Result<(), Error> {
    let already = crate::machine::observe::node_conditions_of(node)
        .iter()
        .any(|c| c.type_ == node_conditions::TERMINATING && c.status == "True");
    if already {
        return Ok(());
    }
    let reason = if m.phase() == Some(&MachinePhase::Failed) {
        node_conditions::REASON_UNHEALTHY
    } else {
        node_conditions::REASON_SCALE_DOWN
    };
    let now = ctx.clock.now().to_string();
    let condition = json!({
        "type": node_conditions::TERMINATING,
        "status": "True",
        "reason": reason,
        "message": format!("machine {} is being deleted", name(m)),
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    });
    patch_node_condition(
        ctx,
        &node.name_any(),
        condition,
        "set the node's Terminating condition",
    )
    .await
}

/// Adds or replaces one condition of a Node (a strategic merge patch keyed by the condition
/// type: the kubelet's and the node lifecycle controller's conditions are left as they are,
/// never rewritten from a possibly stale copy). A node gone meanwhile needs no condition.
pub(crate) async fn patch_node_condition(
    ctx: &Ctx,
    node: &str,
    condition: serde_json::Value,
    what: &'static str,
) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    let patch = json!({ "status": { "conditions": [condition] } });
    match nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(what, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deletion_cordons_and_releases_the_node_in_one_unguarded_patch() {
        let node = |unschedulable: bool, held: bool, deleting: bool| -> Node {
            let mut n: Node = serde_json::from_value(json!({
                "metadata": { "name": "n", "resourceVersion": "7",
                    "finalizers": if held { vec![crate::machine::nodefinalizer::NODE_FINALIZER, "other"] } else { vec!["other"] } },
                "spec": { "unschedulable": unschedulable },
            }))
            .unwrap();
            if deleting {
                n.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            n
        };
        let both = cordon_and_release(&node(false, true, false)).expect("a patch");
        assert_eq!(
            both,
            json!({
                "metadata": {
                    "$deleteFromPrimitiveList/finalizers": [crate::machine::nodefinalizer::NODE_FINALIZER],
                    "annotations": { mcm_drain::CORDON_RECORD_ANNOTATION: "unschedulable" },
                },
                "spec": { "unschedulable": true },
            })
        );
        assert!(
            both["metadata"].get("resourceVersion").is_none(),
            "unguarded"
        );
        let release = cordon_and_release(&node(true, true, false)).expect("a patch");
        assert!(release.get("spec").is_none(), "cordoned already");
        // A Node being deleted keeps the finalizer while it is drained.
        let cordon = cordon_and_release(&node(false, true, true)).expect("a patch");
        assert!(
            cordon["metadata"]
                .get("$deleteFromPrimitiveList/finalizers")
                .is_none()
        );
        assert_eq!(cordon_and_release(&node(true, false, false)), None);
        assert_eq!(cordon_and_release(&node(true, true, true)), None);
    }

    #[test]
    fn a_pass_without_the_volume_wait_is_drained_draining_or_failed() {
        let next = Duration::from_secs(2);
        let retry = Duration::from_secs(20);
        let report = |state, f: &dyn Fn(&mut mcm_drain::PassReport)| {
            let mut r = mcm_drain::PassReport {
                state: Some(state),
                ..Default::default()
            };
            f(&mut r);
            r
        };
        use mcm_drain::PassState::*;
        for state in [Done, Volumes, NodeGone] {
            let r = report(state, &|_| {});
            assert!(
                matches!(pods_drain(&r, next, retry), PodsDrain::Drained),
                "{state:?}"
            );
        }
        let moving = report(Pods, &|r| r.terminating.push("ns/p".into()));
        assert!(matches!(pods_drain(&moving, next, retry), PodsDrain::Draining(d) if d == next));
        let refused = report(Pods, &|r| {
            r.misconfigured.push(mcm_drain::MisconfiguredBudget {
                pod: "ns/p".into(),
                pdb: "ns/budget".into(),
                reason: mcm_drain::MisconfiguredReason::MultipleBudgets,
            })
        });
        assert!(matches!(pods_drain(&refused, next, retry), PodsDrain::Draining(d) if d == retry));
        let failed = report(Pods, &|r| {
            r.failed.push(mcm_drain::DrainError::CacheNotReady {
                what: "VolumeAttachment",
            })
        });
        assert!(matches!(
            pods_drain(&failed, next, retry),
            PodsDrain::Failed(_)
        ));
    }
}
