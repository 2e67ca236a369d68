//! The drain: one pass per reconcile, its outcome recorded in the progress annotations; the
//! Node marked terminating before the first pass.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use mcm_api::constants::node_conditions;
use mcm_api::{Machine, MachinePhase};
use serde_json::json;

use crate::kube_api::ApiErrorExt;
use crate::machine::decide::MachineConfig;
use crate::machine::{Ctx, Error};

use super::announce::announce;
use super::records::{RECHECK, deployment_labels, name, set_progress_keys};
use crate::machine::drainplan::{self, DrainVerdict, Drained};

/// What a drain pass is told by the decision.
#[derive(Debug, Clone)]
pub(crate) struct PassPlan<'a> {
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
pub(crate) enum DeletionDrain {
    /// Pods or volumes are left: the pass recorded where it stands; come back.
    Wait(Action),
    /// The node is drained, nothing recorded yet: the deletion goes on in this reconcile
    /// when its next step needs no wait ([`drained_and_going_on`]), else the drain is
    /// recorded ([`record_drained`]).
    Drained(Drained),
}

/// One pass of the drain: this round's evictions (or deletions); a pass that leaves pods or
/// volumes records where it stands. Never waits for pods or volumes inside the reconcile. The
/// first pass of a deletion's drain finds the node cordoned already ([`cordon_for_deletion`]).
pub(crate) async fn drain_pass(
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
    let verdict = drainplan::verdict(
        &drainplan::PassFacts {
            machine: m.name_any(),
            node: node_name.to_string(),
            first: plan.first,
            vm_dead: plan.vm_dead,
            force_reason: plan.force_reason,
            pods_gone_for: plan.pods_gone_for,
            eviction_retry_interval: ctx.settings.eviction_retry_interval,
        },
        &report,
    );
    match verdict {
        DrainVerdict::Drained(drained) => {
            if let Some(labels) = deployment_labels(m) {
                ctx.metrics.drained(
                    &labels,
                    plan.elapsed + ctx.clock.instant().saturating_duration_since(pass_started),
                );
            }
            Ok(DeletionDrain::Drained(drained))
        }
        DrainVerdict::Wait {
            progress_keys,
            started,
            record,
            blocked,
            requeue,
        } => {
            set_progress_keys(ctx, m, &progress_keys).await?;
            if let Some(started) = started {
                announce(ctx, m, started).await?;
            }
            if blocked {
                ctx.metrics.drain_blocked();
            }
            announce(ctx, m, record).await?;
            Ok(DeletionDrain::Wait(Action::requeue(requeue)))
        }
    }
}

/// A drain finished and the deletion goes on in this reconcile: nothing is recorded (a crash
/// before the VM is deleted repeats a pass that finds the node drained). A drain that moved
/// pods says so on the Machine and the node (`Drained`).
pub(crate) async fn drained_and_going_on(ctx: &Ctx, m: &Machine, d: &Drained) -> Result<(), Error> {
    announce(ctx, m, d.going_on()).await?;
    Ok(())
}

/// A drain finished but the deletion's next step waits (VolumeAttachments, pre-terminate
/// hooks, a class to fix): record the drain (its start too, when it finished in its first
/// pass), announce it when pods were moved, and come back.
pub(crate) async fn record_drained(ctx: &Ctx, m: &Machine, d: Drained) -> Result<Action, Error> {
    set_progress_keys(ctx, m, &d.recorded_keys()).await?;
    announce(ctx, m, d.recorded()).await?;
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
pub(crate) async fn cordon_for_deletion(ctx: &Ctx, node: &Node) -> Result<(), Error> {
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
pub(crate) async fn set_node_terminating(ctx: &Ctx, node: &Node, m: &Machine) -> Result<(), Error> {
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
}
