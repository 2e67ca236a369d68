//! Carries out a preservation step ([`PreserveStep`]): the expiry, the Node's taint, condition
//! and autoscaler annotation, the drain of a preserved Node, and the end of a preservation.

use crate::kube_api::{self, Part};
use crate::machine::decide::MachineConfig;
use crate::machine::drainplan;
use crate::machine::preserve::{
    NEXT_STEP, NodeWork, PreserveStep, condition_for, preserved_condition, taints_of,
};
use crate::machine::{Ctx, Error};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use mcm_api::constants::{annotations, node_conditions, taints};
use mcm_api::preservation::PreserveValue;
use mcm_api::{Machine, MachinePhase};
use serde_json::{Value, json};
use std::time::Duration;

/// Carries out a preservation step; `None` for [`PreserveStep::Nothing`] (the lifecycle
/// step goes on).
pub(crate) async fn preserve_step(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node: Option<&Node>,
    step: PreserveStep,
) -> Option<Result<Action, Error>> {
    let result = match step {
        // An invalid value is a warning of the plan, never a preservation step.
        PreserveStep::Nothing | PreserveStep::InvalidNodeValue(_) => return None,
        PreserveStep::Start { until, value } => start(ctx, m, until, value).await,
        PreserveStep::Node(work) => match node {
            Some(node) => {
                return Some(
                    node_work(ctx, m, cfg, node, &work)
                        .await
                        .map(Action::requeue),
                );
            }
            None => Ok(()),
        },
        PreserveStep::Untaint => match node {
            Some(node) => remove_taint(ctx, node).await,
            None => Ok(()),
        },
        PreserveStep::Stop {
            remove_annotations,
            mark_false,
            why,
        } => stop_preservation(ctx, m, node, remove_annotations, mark_false, why).await,
        PreserveStep::SyncFromNode { node_value } => {
            let patch = json!({"metadata": {"annotations": {
                annotations::PRESERVE: null,
                annotations::LAST_APPLIED_NODE_PRESERVE_VALUE: node_value,
            }}});
            super::patch_machine(ctx, m, &patch, "record the node's preserve value").await
        }
    };
    Some(result.map(|()| Action::requeue(NEXT_STEP)))
}

async fn start(
    ctx: &Ctx,
    m: &Machine,
    until: Timestamp,
    value: PreserveValue,
) -> Result<(), Error> {
    let patch = json!({"status": {"currentStatus": {"preserveExpiryTime": until.to_string()}}});
    super::patch_status(ctx, m, patch).await?;
    let note = format!(
        "preserved until {until} ({}={})",
        annotations::PRESERVE,
        value.as_str()
    );
    ctx.events
        .normal(&m.object_ref(&()), "Preserved", "Preserve", note)
        .await;
    Ok(())
}

fn nodes(ctx: &Ctx) -> Api<Node> {
    Api::all(ctx.target.clone())
}

async fn patch_node(ctx: &Ctx, node: &str, part: Part, patch: &Value) -> Result<(), Error> {
    // A node gone meanwhile needs nothing.
    let _ = kube_api::merge_patch(&nodes(ctx), part, node, patch)
        .await
        .map_err(|e| Error::kube("update the preserved node", e))?;
    Ok(())
}

/// The Node's part of a preservation in progress; returns when to come back (the next drain
/// pass, or later after a failed or blocked one).
async fn node_work(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node: &Node,
    work: &NodeWork,
) -> Result<Duration, Error> {
    let name = node.name_any();
    if work.annotate {
        let v = annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_VALUE;
        let patch = json!({"metadata": {"annotations": {
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED: v,
            annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM: v,
        }}});
        patch_node(ctx, &name, Part::Object, &patch).await?;
    }
    let failed = m.phase() == Some(&MachinePhase::Failed);
    let mut drain_failed = false;
    if work.drain {
        update_taints(ctx, node, |current| {
            let held = current.iter().any(|t| t.key == taints::NODE_PRESERVED);
            (!held).then(|| {
                let mut list = current.to_vec();
                list.push(Taint {
                    key: taints::NODE_PRESERVED.into(),
                    value: None,
                    effect: "NoSchedule".into(),
                    time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        ctx.clock.now(),
                    )),
                });
                list
            })
        })
        .await?;
        let mut options = super::drain_options(ctx, m, cfg, work.force);
        options.cordon = false;
        let input = mcm_drain::PassInput {
            elapsed: Duration::ZERO,
            pods_gone_for: None,
            unreachable: work.unreachable,
            vm_dead: false,
        };
        let report = super::drain_node_pass(ctx, &name, &options, &input).await?;
        let retry = ctx.settings.eviction_retry_interval;
        match drainplan::pods_drain(&report, NEXT_STEP, retry) {
            drainplan::PodsDrain::Drained => {}
            drainplan::PodsDrain::Draining(again) => return Ok(again),
            drainplan::PodsDrain::Failed(_) => drain_failed = true,
        }
    }
    write_condition(
        ctx,
        node,
        condition_for(work.value, failed, drain_failed, work.until),
    )
    .await?;
    Ok(if drain_failed {
        ctx.settings.eviction_retry_interval
    } else {
        NEXT_STEP
    })
}

async fn write_condition(
    ctx: &Ctx,
    node: &Node,
    (status, reason, message): (bool, String, String),
) -> Result<(), Error> {
    let status = if status { "True" } else { "False" };
    let existing = preserved_condition(node);
    if existing.is_some_and(|c| {
        c.status == status
            && c.reason.as_deref() == Some(reason.as_str())
            && c.message.as_deref() == Some(message.as_str())
    }) {
        return Ok(());
    }
    let now = ctx.clock.now().to_string();
    let transition = match existing {
        Some(c) if c.status == status => c
            .last_transition_time
            .as_ref()
            .map_or(now.clone(), |t| t.0.to_string()),
        _ => now.clone(),
    };
    let condition = json!({
        "type": node_conditions::NODE_PRESERVED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition,
    });
    let what = "set the node's Preserved condition";
    super::patch_node_condition(ctx, &node.name_any(), condition, what).await
}

async fn remove_taint(ctx: &Ctx, node: &Node) -> Result<(), Error> {
    update_taints(ctx, node, |current| {
        let held = current.iter().any(|t| t.key == taints::NODE_PRESERVED);
        held.then(|| {
            current
                .iter()
                .filter(|t| t.key != taints::NODE_PRESERVED)
                .cloned()
                .collect()
        })
    })
    .await
}

/// Writes the Node's taints as `change` makes them from the current ones (`None`: nothing to
/// change), guarded by the resourceVersion, since the list is replaced whole. The store's copy
/// is tried first; its version can be behind the API server's (the Node store passes on no
/// change of heartbeats only), so a conflict reads the Node and tries again.
async fn update_taints(
    ctx: &Ctx,
    node: &Node,
    change: impl Fn(&[Taint]) -> Option<Vec<Taint>>,
) -> Result<(), Error> {
    let patch_of = |n: &Node| change(taints_of(n)).map(|list| json!({"spec": {"taints": list}}));
    kube_api::patch_from_copy(&nodes(ctx), node, patch_of)
        .await
        .map(drop)
        .map_err(|e| Error::kube("update the preserved node", e))
}

async fn stop_preservation(
    ctx: &Ctx,
    m: &Machine,
    node: Option<&Node>,
    remove_annotations: bool,
    mark_false: bool,
    why: &str,
) -> Result<(), Error> {
    if let Some(node) = node {
        write_condition(
            ctx,
            node,
            (
                false,
                node_conditions::PRESERVATION_STOPPED.to_string(),
                String::new(),
            ),
        )
        .await?;
        let anns = node.annotations();
        let mut remove = serde_json::Map::new();
        if anns.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM) {
            remove.insert(
                annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED.into(),
                Value::Null,
            );
            remove.insert(
                annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM.into(),
                Value::Null,
            );
        }
        if remove_annotations && anns.contains_key(annotations::PRESERVE) {
            remove.insert(annotations::PRESERVE.into(), Value::Null);
        }
        if !remove.is_empty() {
            let patch = json!({"metadata": {"annotations": remove}});
            patch_node(ctx, &node.name_any(), Part::Object, &patch).await?;
        }
        remove_taint(ctx, node).await?;
    }
    if remove_annotations {
        let value = mark_false.then_some(mcm_api::constants::annotations::preserve_values::FALSE);
        let patch = json!({"metadata": {"annotations": {
            annotations::PRESERVE: value,
            annotations::LAST_APPLIED_NODE_PRESERVE_VALUE: null,
        }}});
        super::patch_machine(ctx, m, &patch, "remove the preserve annotations").await?;
    }
    let patch = json!({"status": {"currentStatus": {"preserveExpiryTime": null}}});
    super::patch_status(ctx, m, patch).await?;
    ctx.events
        .normal(
            &m.object_ref(&()),
            "PreservationStopped",
            "Preserve",
            format!("preservation stopped: {why}"),
        )
        .await;
    Ok(())
}
