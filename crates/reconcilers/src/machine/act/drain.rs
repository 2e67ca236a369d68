//! The drain: one pass per reconcile, its outcome recorded in the progress annotations; the
//! Node marked terminating before the first pass.

use super::*;

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
    /// Time since the drain started.
    pub elapsed: Duration,
    /// Time since no pod was left, if so.
    pub pods_gone_for: Option<Duration>,
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
    options
}

/// One pass of the drain: this round's evictions (or deletions), then record where it
/// stands and come back. Never waits for pods or volumes inside the reconcile.
pub async fn drain_pass(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node_name: &str,
    plan: PassPlan<'_>,
) -> Result<Action, Error> {
    let pass_started = std::time::Instant::now();
    let options = drain_options(ctx, m, cfg, plan.force);
    if let Some(why) = plan.force_reason {
        tracing::info!(node = node_name, why, "force-draining");
    }
    let input = mcm_drain::PassInput {
        elapsed: plan.elapsed,
        pods_gone_for: plan.pods_gone_for,
        unreachable: plan.unreachable,
    };
    let report = drain_node_pass(ctx, node_name, &options, &input).await?;
    let mut summary = report.summary();
    if let Some(why) = plan.force_reason {
        summary.push_str(&format!(" (forced: {why})"));
    }
    let description = format!("Drain of node {node_name}: {summary}");
    let state = report.state();
    let blocked = !report.blocked.is_empty() || !report.misconfigured.is_empty();
    // An unknown drain rule value is in the summary; a Warning per pod and value goes to the
    // node when the description changes (not at every pass).
    if last_description(m) != Some(description.as_str()) {
        for bad in &report.invalid_rules {
            node_event(
                ctx,
                node_name,
                EventType::Warning,
                "DrainRuleInvalid",
                bad.to_string(),
            )
            .await;
        }
    }
    // The progress this pass makes, written in one patch: the start of the drain (first
    // pass), all pods gone (the volume wait counts from there), drained.
    let mut progress_keys = Vec::new();
    if plan.first {
        progress_keys.push(progress::DRAIN_STARTED);
    }
    match state {
        mcm_drain::PassState::Done | mcm_drain::PassState::NodeGone => {
            progress_keys.push(progress::DRAINED);
        }
        mcm_drain::PassState::Volumes if plan.pods_gone_for.is_none() => {
            progress_keys.push(progress::PODS_DRAINED);
        }
        _ => {}
    }
    set_progress_keys(ctx, m, &progress_keys).await?;
    if progress_keys.contains(&progress::DRAINED)
        && let Some(labels) = deployment_labels(m)
    {
        ctx.metrics
            .drained(&labels, plan.elapsed + pass_started.elapsed());
    }
    if plan.first {
        // One Event on the node says why it is cordoned; the Machine's lastOperation has
        // every step.
        let note = match state {
            mcm_drain::PassState::Done => format!(
                "cordoned and drained for the deletion of machine {}: {summary}",
                name(m)
            ),
            _ => format!("cordoned; draining for the deletion of machine {}", name(m)),
        };
        node_event(ctx, node_name, EventType::Normal, "DrainStarted", note).await;
    }
    match state {
        mcm_drain::PassState::Done | mcm_drain::PassState::NodeGone => {
            // A drain done in its first pass with no pod to act on had nothing to tell
            // beyond the node's DrainStarted above; otherwise it ends with Drained on both.
            let acted = !report.evicted.is_empty()
                || !report.deleted.is_empty()
                || !report.released.is_empty();
            if plan.first && !acted {
                record_deletion_step(ctx, m, description).await?;
            } else {
                announce_deletion_step(
                    ctx,
                    m,
                    description.clone(),
                    Notice::normal("Drained", "Drain"),
                )
                .await?;
                if state == mcm_drain::PassState::Done {
                    node_event(ctx, node_name, EventType::Normal, "Drained", summary).await;
                }
            }
            Ok(Action::requeue(RECHECK))
        }
        mcm_drain::PassState::Volumes => {
            record_deletion_step(ctx, m, description).await?;
            Ok(Action::requeue(
                ctx.settings.eviction_retry_interval.min(DRAIN_WAIT_RECHECK),
            ))
        }
        mcm_drain::PassState::Pods => {
            if blocked {
                ctx.metrics.drain_blocked();
            }
            let changed = last_description(m) != Some(description.as_str());
            if blocked && changed {
                let notice = Notice::warning("DrainBlockedByPDB", "Drain");
                announce_deletion_step(ctx, m, description, notice).await?;
                node_event(
                    ctx,
                    node_name,
                    EventType::Warning,
                    "DrainBlockedByPDB",
                    summary,
                )
                .await;
            } else {
                record_deletion_step(ctx, m, description).await?;
            }
            let recheck = if blocked {
                ctx.settings.eviction_retry_interval
            } else {
                ctx.settings.eviction_retry_interval.min(DRAIN_WAIT_RECHECK)
            };
            Ok(Action::requeue(recheck))
        }
    }
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
    let now = Timestamp::now().to_string();
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
