//! The journey of one pod: evict (or delete) -> wait until gone -> wait for its volumes to
//! detach -> optionally wait for them to reattach elsewhere. Each step is a small async
//! function bounded by the drain's deadline.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::Options;
use crate::classify::{is_finished, pod_key};
use crate::outcome::{DeleteReason, PdbBlock, Phase, PodFailure, PodReport, Removal};
use crate::pdb::{Refusal, assess_refusal, is_multiple_budgets_error};
use crate::volumes::{TrackedVolume, not_reattached, still_attached};
use crate::watch::{STORE_POLL_INTERVAL, Stores, Watched, mark_seen, wait_for_change};

/// Time a pod may take to disappear beyond its termination grace period (as in MCM).
const DELETION_BUFFER: Duration = Duration::from_secs(30);
/// The shortest time one eviction request may take before it counts as refused.
const MIN_EVICTION_ATTEMPT: Duration = Duration::from_secs(2);
/// Default `terminationGracePeriodSeconds` of a pod.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// What every pod's journey shares.
pub(crate) struct Ctx<'a> {
    pub client: kube::Client,
    pub node: &'a str,
    pub options: &'a Options,
    pub deadline: Instant,
    pub pods: &'a Watched<Pod>,
    pub node_watch: &'a Watched<Node>,
    pub stores: &'a Stores,
}

/// One pod to drain.
pub(crate) struct PodPlan {
    pub pod: Pod,
    /// Terminating already: only wait for it.
    pub wait_only: bool,
    /// A `wait-completed` drain rule: never evict or delete it, wait until it finished or is
    /// gone (force mode included), at most until the deadline.
    pub wait_completed: bool,
    /// Its volumes to wait for.
    pub volumes: Vec<TrackedVolume>,
}

/// Runs the whole journey of one pod and reports what happened.
pub(crate) async fn drain_pod(ctx: &Ctx<'_>, plan: PodPlan) -> PodReport {
    let PodPlan {
        pod,
        wait_only,
        wait_completed,
        volumes,
    } = plan;
    let mut report = PodReport::new(pod_key(&pod));

    if wait_completed {
        let t = Instant::now();
        let completed = wait_until_completed(ctx, &pod).await;
        report.span(Phase::WaitForDeletion, t.into_std());
        if !completed {
            return report.fail(PodFailure::Timeout {
                phase: Phase::WaitForDeletion,
            });
        }
        report.removal = Removal::Completed;
        return report;
    }

    if wait_only && ctx.options.force {
        // Terminating already, but force mode does not wait: a pod on a dead node would stay
        // Terminating forever, bound to a Node that is about to be deleted.
        let t = Instant::now();
        let deleted = delete_pod(&ctx.client, &pod)
            .await
            .map_err(|e| delete_failure(&pod, e));
        report.span(Phase::Evict, t.into_std());
        report.removal = match deleted {
            Ok(true) => Removal::Deleted(DeleteReason::Force),
            Ok(false) => Removal::AlreadyGone,
            Err(failure) => return report.fail(failure),
        };
    } else if wait_only {
        report.removal = Removal::AlreadyGone;
    } else {
        let t = Instant::now();
        let removed = remove_pod(ctx, &pod, &mut report).await;
        report.span(Phase::Evict, t.into_std());
        if let Err(failure) = removed {
            return report.fail(failure);
        }
    }
    if ctx.options.force {
        return report;
    }

    let t = Instant::now();
    let gone = wait_until_gone(ctx, &pod).await;
    report.span(Phase::WaitForDeletion, t.into_std());
    if !gone {
        return report.fail(PodFailure::Timeout {
            phase: Phase::WaitForDeletion,
        });
    }
    if volumes.is_empty() {
        return report;
    }

    let t = Instant::now();
    let detached = wait_until_detached(ctx, &pod, &volumes).await;
    report.span(Phase::VolumeDetach, t.into_std());
    if let Err(failure) = detached {
        return report.fail(failure);
    }
    report.detached_volumes = volumes.iter().map(ToString::to_string).collect();

    if ctx.options.wait_for_reattach {
        let t = Instant::now();
        let pending = wait_until_reattached(ctx, &volumes).await;
        report.span(Phase::VolumeReattach, t.into_std());
        report.reattached_volumes = volumes
            .iter()
            .filter(|v| !pending.contains(v))
            .map(ToString::to_string)
            .collect();
        report.reattach_timeouts = pending.iter().map(ToString::to_string).collect();
    }
    report
}

/// How long one eviction request may take: the retry interval, at least
/// [`MIN_EVICTION_ATTEMPT`].
pub(crate) fn attempt_timeout(retry_interval: Duration) -> Duration {
    retry_interval.max(MIN_EVICTION_ATTEMPT)
}

/// How an eviction attempt went.
pub(crate) enum Evicted {
    /// Accepted: the pod is terminating.
    Yes,
    /// The pod (with this UID) is gone already.
    Gone,
    /// Refused by a PodDisruptionBudget (429), or because several budgets select the pod.
    Refused { multiple_budgets: bool },
    /// Another error: retried like a refusal.
    Failed(kube::Error),
}

/// Evicts the pod, retrying refusals; deletes it in force mode, after `max_evict_retries`, or
/// once the deadline passed. Records the removal and any budget block in `report`.
async fn remove_pod(ctx: &Ctx<'_>, pod: &Pod, report: &mut PodReport) -> Result<(), PodFailure> {
    let options = ctx.options;
    let key = pod_key(pod);
    let mut attempts: u32 = 0;
    let mut block: Option<(Instant, PdbBlock)> = None;
    let finish_block = |block: Option<(Instant, PdbBlock)>, misconfigured: bool| {
        block.map(|(first, mut b)| {
            b.blocked_for = first.elapsed();
            b.misconfigured = misconfigured;
            b
        })
    };
    loop {
        let delete_reason = if options.force {
            Some(DeleteReason::Force)
        } else if attempts >= options.max_evict_retries {
            Some(DeleteReason::MaxEvictRetries)
        } else if Instant::now() >= ctx.deadline {
            Some(DeleteReason::Timeout)
        } else {
            None
        };
        if let Some(reason) = delete_reason {
            report.pdb_block = finish_block(block, false);
            report.removal = if delete_pod(&ctx.client, pod)
                .await
                .map_err(|e| delete_failure(pod, e))?
            {
                tracing::info!(pod = %key, %reason, "deleted pod instead of evicting it");
                Removal::Deleted(reason)
            } else {
                Removal::AlreadyGone
            };
            return Ok(());
        }

        attempts += 1;
        let attempt_deadline = ctx
            .deadline
            .min(Instant::now() + attempt_timeout(options.eviction_retry_interval));
        match evict_pod(
            ctx.options.eviction_client.as_ref().unwrap_or(&ctx.client),
            pod,
            attempt_deadline,
        )
        .await
        {
            Evicted::Yes => {
                report.pdb_block = finish_block(block, false);
                report.removal = Removal::Evicted;
                return Ok(());
            }
            Evicted::Gone => {
                report.pdb_block = finish_block(block, false);
                report.removal = Removal::AlreadyGone;
                return Ok(());
            }
            Evicted::Refused { multiple_budgets } => {
                let pdbs = list_budgets(&ctx.client, pod).await;
                match assess_refusal(pod, &pdbs, multiple_budgets) {
                    Refusal::Misconfigured { pdb, reason } => {
                        let (first, mut b) = block.take().unwrap_or_else(|| {
                            (Instant::now(), new_block(&key, Some(pdb.clone())))
                        });
                        b.refusals += 1;
                        b.pdb = Some(pdb.clone());
                        report.pdb_block = finish_block(Some((first, b)), true);
                        tracing::warn!(pod = %key, %pdb, %reason, "misconfigured PodDisruptionBudget");
                        return Err(PodFailure::Misconfigured { pdb, reason });
                    }
                    Refusal::Blocked { pdb } => {
                        let (first, b) =
                            block.get_or_insert_with(|| (Instant::now(), new_block(&key, None)));
                        b.refusals += 1;
                        if pdb.is_some() {
                            b.pdb = pdb;
                        }
                        tracing::debug!(pod = %key, pdb = ?b.pdb, refusals = b.refusals, "eviction refused");
                        if let Some(hook) = &options.on_pdb_block {
                            let mut so_far = b.clone();
                            so_far.blocked_for = first.elapsed();
                            hook(&so_far);
                        }
                    }
                }
            }
            Evicted::Failed(e) => {
                tracing::warn!(pod = %key, error = %e, attempts, "eviction failed, will retry");
            }
        }
        let retry_at = Instant::now() + options.eviction_retry_interval;
        tokio::time::sleep_until(retry_at.min(ctx.deadline)).await;
    }
}

fn new_block(pod: &str, pdb: Option<String>) -> PdbBlock {
    PdbBlock {
        pod: pod.to_string(),
        pdb,
        blocked_for: Duration::ZERO,
        refusals: 0,
        misconfigured: false,
    }
}

fn pod_api(client: &kube::Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    )
}

fn uid_precondition(pod: &Pod) -> Preconditions {
    Preconditions {
        uid: pod.metadata.uid.clone(),
        resource_version: None,
    }
}

/// One `policy/v1` eviction, with a UID precondition so a recreated pod of the same name is
/// never evicted by mistake. The request is bounded by the retry interval (at least
/// [`MIN_EVICTION_ATTEMPT`]) and the deadline; a request still pending then counts as refused.
pub(crate) async fn evict_pod(
    client: &kube::Client,
    pod: &Pod,
    attempt_deadline: Instant,
) -> Evicted {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: pod.metadata.namespace.clone(),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(uid_precondition(pod)),
            ..Default::default()
        }),
    };
    let api = pod_api(client, pod);
    let post = PostParams::default();
    let call = api.create_subresource::<_, serde_json::Value>("eviction", &name, &post, &eviction);
    let Ok(result) = tokio::time::timeout_at(attempt_deadline, call).await else {
        // kube's client retries 429 answers itself (with a growing backoff) unless its config
        // disables `default_retry`: an eviction that hangs is a refusal we cannot see.
        return Evicted::Refused {
            multiple_budgets: false,
        };
    };
    match result {
        Ok(_) => Evicted::Yes,
        Err(kube::Error::Api(s)) if s.code == 404 || is_precondition_failure(&s) => Evicted::Gone,
        Err(kube::Error::Api(s)) if s.code == 429 => Evicted::Refused {
            multiple_budgets: false,
        },
        Err(kube::Error::Api(s)) if is_multiple_budgets_error(&s) => Evicted::Refused {
            multiple_budgets: true,
        },
        Err(e) => Evicted::Failed(e),
    }
}

/// A 409 from the UID precondition: the pod of that UID is gone (a new one has the name).
/// Other conflicts (e.g. on the budget's status during an eviction) are retried.
pub(crate) fn is_precondition_failure(status: &kube::core::Status) -> bool {
    status.code == 409 && status.message.contains("Precondition failed")
}

/// Deletes the pod with grace period 0 (as MCM's force deletion). `Ok(false)` when it was gone.
pub(crate) async fn delete_pod(client: &kube::Client, pod: &Pod) -> Result<bool, kube::Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pod_api(client, pod).delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || is_precondition_failure(&s) => Ok(false),
        Err(source) => Err(source),
    }
}

fn delete_failure(pod: &Pod, source: kube::Error) -> PodFailure {
    PodFailure::Kube {
        action: format!("delete pod {}", pod_key(pod)),
        source,
    }
}

/// The budgets of the pod's namespace (empty when they cannot be listed: the refusal is then
/// reported without a budget name and retried).
pub(crate) async fn list_budgets(client: &kube::Client, pod: &Pod) -> Vec<PodDisruptionBudget> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(pod = %pod_key(pod), error = %e, "cannot list PodDisruptionBudgets");
            Vec::new()
        }
    }
}

/// The pod in the store, if it is still the same pod (same UID).
fn current(ctx: &Ctx<'_>, pod: &Pod) -> Option<std::sync::Arc<Pod>> {
    let key = ObjectRef::new(pod.metadata.name.as_deref().unwrap_or_default())
        .within(pod.metadata.namespace.as_deref().unwrap_or_default());
    ctx.pods
        .store
        .get(&key)
        .filter(|p| p.metadata.uid == pod.metadata.uid)
}

/// Waits until the pod (this UID) is gone from the node, for at most its grace period plus a
/// buffer, capped by the deadline. `false` on timeout.
async fn wait_until_gone(ctx: &Ctx<'_>, pod: &Pod) -> bool {
    let grace = current(ctx, pod)
        .and_then(|p| {
            p.metadata.deletion_grace_period_seconds.or_else(|| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
        })
        .map(|s| Duration::from_secs(s.max(0) as u64))
        .unwrap_or(DEFAULT_GRACE);
    let deadline = ctx.deadline.min(Instant::now() + grace + DELETION_BUFFER);
    let mut changes = [ctx.pods.changes.clone()];
    loop {
        mark_seen(&mut changes);
        if current(ctx, pod).is_none() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        wait_for_change(&mut changes, STORE_POLL_INTERVAL * 2, deadline).await;
    }
}

/// Waits until the pod (this UID) finished (`Succeeded`/`Failed`) or is gone, until the
/// drain's deadline. `false` on timeout.
async fn wait_until_completed(ctx: &Ctx<'_>, pod: &Pod) -> bool {
    let mut changes = [ctx.pods.changes.clone()];
    loop {
        mark_seen(&mut changes);
        if current(ctx, pod).is_none_or(|p| is_finished(&p)) {
            return true;
        }
        if Instant::now() >= ctx.deadline {
            return false;
        }
        wait_for_change(&mut changes, STORE_POLL_INTERVAL * 2, ctx.deadline).await;
    }
}

fn change_receivers(ctx: &Ctx<'_>) -> Vec<tokio::sync::watch::Receiver<u64>> {
    let mut receivers = vec![ctx.node_watch.changes.clone()];
    receivers.extend(ctx.stores.volume_attachment_changes.clone());
    receivers
}

/// Waits until none of `volumes` is attached to the node, for at most the pod's grace period
/// plus the PV detach timeout, capped by the deadline.
async fn wait_until_detached(
    ctx: &Ctx<'_>,
    pod: &Pod,
    volumes: &[TrackedVolume],
) -> Result<(), PodFailure> {
    let start = Instant::now();
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .map(|s| Duration::from_secs(s.max(0) as u64))
        .unwrap_or(Duration::ZERO);
    let deadline = ctx
        .deadline
        .min(start + grace + ctx.options.pv_detach_timeout);
    let store = &ctx.stores.volume_attachments;
    if tokio::time::timeout_at(deadline, store.wait_until_ready())
        .await
        .is_err()
    {
        return Err(PodFailure::VolumeDetachTimeout {
            volumes: volumes.iter().map(ToString::to_string).collect(),
            waited: start.elapsed(),
        });
    }
    let node_key = ObjectRef::new(ctx.node);
    let mut changes = change_receivers(ctx);
    loop {
        mark_seen(&mut changes);
        let node = ctx.node_watch.store.get(&node_key);
        let attached = still_attached(node.as_deref(), &store.state(), ctx.node, volumes);
        if attached.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PodFailure::VolumeDetachTimeout {
                volumes: attached.iter().map(ToString::to_string).collect(),
                waited: start.elapsed(),
            });
        }
        wait_for_change(&mut changes, STORE_POLL_INTERVAL, deadline).await;
    }
}

/// Waits until every volume is attached to another node, for at most the PV reattach timeout
/// (capped by the deadline). Returns the volumes that did not reattach.
async fn wait_until_reattached(ctx: &Ctx<'_>, volumes: &[TrackedVolume]) -> Vec<TrackedVolume> {
    let deadline = ctx
        .deadline
        .min(Instant::now() + ctx.options.pv_reattach_timeout);
    let store = &ctx.stores.volume_attachments;
    let mut changes = change_receivers(ctx);
    loop {
        mark_seen(&mut changes);
        let pending = not_reattached(&store.state(), ctx.node, volumes);
        if pending.is_empty() || Instant::now() >= deadline {
            if !pending.is_empty() {
                tracing::warn!(node = ctx.node, volumes = ?pending, "volumes did not reattach to another node in time");
            }
            return pending;
        }
        wait_for_change(&mut changes, STORE_POLL_INTERVAL, deadline).await;
    }
}
