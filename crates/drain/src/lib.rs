//! Node drain for mcm-rs: cordon, PDB-aware parallel eviction, waits for pods to disappear and
//! for their volumes to detach (and optionally reattach elsewhere).
//!
//! Two entry points: [`drain_pass`] runs one non-blocking pass (cordon, this round's
//! evictions, a progress report) for callers that requeue between passes, as the machine
//! controller does (see the `pass` module's rules, including unreachable nodes); [`drain`]
//! runs a whole drain in one bounded call (tests, benchmarks, tools).
//!
//! [`drain`] is one bounded, idempotent call:
//!
//! 1. **Cordon**: `spec.unschedulable` and the `node.kubernetes.io/unschedulable:NoSchedule`
//!    taint, recording what it added in [`CORDON_RECORD_ANNOTATION`] so [`uncordon`] removes
//!    exactly that. The drain never uncordons on its own, not even when it fails.
//! 2. **Classify** the pods bound to the node ([`classify_pod`]): mirror pods, DaemonSet pods,
//!    finished pods and pods with a `skip` drain rule ([`DRAIN_BEHAVIOR_KEY`]) stay; pods
//!    already terminating are only waited for; pods with a `wait-completed` rule are never
//!    evicted or deleted: the drain waits (until its deadline, force mode included) for them to
//!    finish or disappear, and reports them among the remaining pods if it times out.
//! 3. **Resolve volumes**: PVC -> bound PV -> [`mcm_driver::Driver::get_volume_ids`], for
//!    claims no other pod on the node uses.
//! 4. **Evict in waves** of ascending priority ([`priority_waves`]): within a wave, up to
//!    `parallelism` pods at a time go through evict -> wait until gone -> wait for their volumes
//!    to detach -> (optionally) wait for reattachment. Pods with volumes are evicted in parallel
//!    too (MCM evicts them one by one). An eviction refused with 429 is retried every
//!    `eviction_retry_interval`; a misconfigured budget ([`misconfigured_reason`]) fails the pod
//!    at once; after `max_evict_retries`, in force mode, or when the timeout runs out, the pod is
//!    deleted instead.
//!
//! Waits read reflector stores (pods and the Node, watched for the drain's duration; the
//! caller's VolumeAttachment store) and wake up on their change notifications, with a bounded
//! re-check interval; every wait ends at the drain's deadline.
#![warn(missing_docs)]

mod classify;
mod cordon;
mod error;
mod outcome;
mod pass;
mod pdb;
mod pod;
mod volumes;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use mcm_driver::Driver;
use tokio::time::Instant;

pub use classify::{
    CAPI_DRAIN_LABEL, DRAIN_BEHAVIOR_KEY, DrainBehavior, DrainMode, DrainRule, InvalidDrainRule,
    MIRROR_POD_ANNOTATION, PodAction, RuleSource, WaitCompletedStep, classify_pod, drain_rule,
    invalid_drain_rules, is_daemonset_pod, is_finished, is_mirror_pod, pod_key, pod_priority,
    priority_waves, wait_completed_step,
};
pub use cordon::{
    CORDON_RECORD_ANNOTATION, CordonChange, NodePatch, format_record, parse_record, plan_cordon,
    plan_uncordon, uncordon,
};
pub use error::{DrainError, MisconfiguredReason};
pub use outcome::{
    DeleteReason, DeletedPod, DrainOutcome, PdbBlock, Phase, PhaseDurations, SkipReason,
    SkippedPod, human_duration,
};
pub use pass::{
    MisconfiguredBudget, PassInput, PassReport, PassState, PodStep, attached_volumes, drain_pass,
    plan_pods,
};
pub use pdb::{
    Refusal, assess_refusal, is_multiple_budgets_error, misconfigured_reason, pdb_key,
    pdb_selects_pod,
};
pub use volumes::{
    TrackedVolume, attached_name_matches, not_reattached, still_attached, unshared_claims,
};
pub use watch::{
    STORE_POLL_INTERVAL, Stores, VolumeAttachmentReflector, slim_pod,
    start_volume_attachment_reflector,
};

use crate::outcome::fold_reports;
use crate::pod::{Ctx, PodPlan, drain_pod};
use crate::watch::watch_objects;

/// How to drain. [`Options::new`] gives MCM's defaults.
#[derive(Clone)]
pub struct Options {
    /// Upper bound of the whole drain (MCM `--machine-drain-timeout`, default 2h).
    pub timeout: Duration,
    /// Evictions attempted per pod before it is deleted instead (MCM
    /// `--machine-max-evict-retries`, default timeout / retry interval).
    pub max_evict_retries: u32,
    /// Pause between eviction attempts refused by a PodDisruptionBudget (MCM: 20s).
    pub eviction_retry_interval: Duration,
    /// How long the volumes of a pod may take to detach after it is gone, on top of its
    /// termination grace period (MCM `--machine-pv-detach-timeout`, default 2m).
    pub pv_detach_timeout: Duration,
    /// How long to wait for a detached volume to attach to another node (MCM
    /// `--machine-pv-reattach-timeout`, default 90s). Only with `wait_for_reattach`.
    pub pv_reattach_timeout: Duration,
    /// Wait for the volumes to attach elsewhere after they detached (a timeout there is only
    /// reported in [`DrainOutcome::reattach_timeouts`]).
    pub wait_for_reattach: bool,
    /// Delete pods (grace period 0) instead of evicting them, and do not wait for them or
    /// their volumes (MCM's force deletion).
    pub force: bool,
    /// How many pods go through evict -> gone -> volumes detached at the same time (at least 1).
    pub parallelism: usize,
    /// Maps PersistentVolume specs to volume ids.
    pub driver: Arc<dyn Driver>,
    /// Cordon the node first (the default). Without it a pass only checks that the node
    /// exists: for a drain whose caller keeps new pods off the node by other means (a
    /// preserved machine's `NoSchedule` taint), so that a user's cordon stays the user's.
    /// Only [`drain_pass`] honours it.
    pub cordon: bool,
    /// Called after every eviction a PodDisruptionBudget refused, with the block so far, so
    /// a caller can show a long block (e.g. on the Machine) while the drain keeps waiting.
    pub on_pdb_block: Option<PdbBlockHook>,
    /// The client evictions are sent with, when it differs from the drain's client: one
    /// without the client-side retry of `429` answers ([`kube::Config::default_retry`] off).
    /// A budget's refusal is a `429`, which a retrying client repeats with a growing backoff
    /// until the attempt's deadline (the eviction retry interval): the pass, and the
    /// reconcile that runs it, would hold for that long on every blocked pod. `None`: the
    /// drain's client (a refusal is then seen only when the attempt's deadline ends it).
    pub eviction_client: Option<kube::Client>,
}

/// See [`Options::on_pdb_block`].
pub type PdbBlockHook = Arc<dyn Fn(&PdbBlock) + Send + Sync>;

impl Options {
    /// MCM's defaults: 2h timeout, 20s retry interval, 360 evictions, 2m detach and 90s
    /// reattach timeouts, no reattach wait, no force, parallelism 10.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        let timeout = Duration::from_secs(2 * 60 * 60);
        let eviction_retry_interval = Duration::from_secs(20);
        Options {
            timeout,
            max_evict_retries: (timeout.as_secs() / eviction_retry_interval.as_secs()) as u32,
            eviction_retry_interval,
            pv_detach_timeout: Duration::from_secs(2 * 60),
            pv_reattach_timeout: Duration::from_secs(90),
            wait_for_reattach: false,
            force: false,
            parallelism: 10,
            driver,
            cordon: true,
            on_pdb_block: None,
            eviction_client: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("timeout", &self.timeout)
            .field("max_evict_retries", &self.max_evict_retries)
            .field("eviction_retry_interval", &self.eviction_retry_interval)
            .field("pv_detach_timeout", &self.pv_detach_timeout)
            .field("pv_reattach_timeout", &self.pv_reattach_timeout)
            .field("wait_for_reattach", &self.wait_for_reattach)
            .field("force", &self.force)
            .field("parallelism", &self.parallelism)
            .field("cordon", &self.cordon)
            .field("eviction_client", &self.eviction_client.is_some())
            .finish_non_exhaustive()
    }
}

/// Cordons `node_name` (see [`CORDON_RECORD_ANNOTATION`]); `None` when the node does not
/// exist. Idempotent.
pub async fn cordon(
    target_client: kube::Client,
    node_name: &str,
) -> Result<Option<CordonChange>, DrainError> {
    cordon::cordon(&Api::all(target_client), node_name).await
}

/// Drains `node_name` in the target cluster: cordon, evict (or delete) its pods, wait for them
/// to disappear and for their volumes to detach. See the crate documentation for the steps.
///
/// Idempotent: re-running after a crash continues from the cluster's state (a cordoned node,
/// terminating or vanished pods are fine). A missing node is success with
/// `node_found == false`. Returns within `options.timeout` (plus the time of one API call).
pub async fn drain(
    target_client: kube::Client,
    node_name: &str,
    options: &Options,
    stores: &Stores,
) -> Result<DrainOutcome, DrainError> {
    let start = Instant::now();
    let deadline = start + options.timeout;
    let mut outcome = DrainOutcome {
        node: node_name.to_string(),
        ..Default::default()
    };
    let timeout = |phase: Phase, remaining_pods: Vec<String>| DrainError::Timeout {
        node: node_name.to_string(),
        phase,
        elapsed: start.elapsed(),
        remaining_pods,
    };

    // Cordon.
    let nodes: Api<Node> = Api::all(target_client.clone());
    let cordoned = tokio::time::timeout_at(deadline, cordon::cordon(&nodes, node_name))
        .await
        .map_err(|_| timeout(Phase::Cordon, Vec::new()))??;
    outcome.phases.cordon = start.elapsed();
    let Some(change) = cordoned else {
        tracing::info!(node = node_name, "node not found, nothing to drain");
        outcome.total = start.elapsed();
        return Ok(outcome);
    };
    outcome.node_found = true;
    outcome.cordon = change;

    // Watch the node's pods and the node itself for the rest of the drain. The pods are kept
    // as the controllers' pod store keeps them: only what the drain reads.
    let pod_watch = watch_objects(
        Api::<Pod>::all(target_client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
        slim_pod,
    );
    let node_watch = watch_objects(
        nodes,
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
        watch::without_managed_fields,
    );
    tokio::time::timeout_at(deadline, pod_watch.store.wait_until_ready())
        .await
        .map_err(|_| timeout(Phase::Prepare, Vec::new()))?
        .map_err(|_| DrainError::CacheNotReady { what: "Pod" })?;

    // Classify.
    let pods: Vec<Pod> = pod_watch
        .store
        .state()
        .iter()
        .map(|p| (**p).clone())
        .collect();
    let mut to_drain: Vec<(Pod, PodAction)> = Vec::new();
    let mut staying: Vec<&Pod> = Vec::new();
    let mut wait_completed: Vec<Pod> = Vec::new();
    outcome.invalid_rules = pods.iter().flat_map(invalid_drain_rules).collect();
    for bad in &outcome.invalid_rules {
        tracing::warn!(node = node_name, "{bad}");
    }
    for pod in &pods {
        match classify_pod(pod) {
            PodAction::Skip(reason) => {
                outcome.skipped.push(SkippedPod {
                    pod: pod_key(pod),
                    reason,
                });
                staying.push(pod);
            }
            PodAction::WaitCompleted => {
                // Its volumes are not waited for: it keeps them until it finished.
                staying.push(pod);
                wait_completed.push(pod.clone());
            }
            action => to_drain.push((pod.clone(), action)),
        }
    }
    outcome.skipped.sort_by(|a, b| a.pod.cmp(&b.pod));

    // Resolve the volumes to wait for (not in force mode: nothing waits there).
    let volumes = if options.force {
        BTreeMap::new()
    } else {
        let draining: Vec<&Pod> = to_drain.iter().map(|(p, _)| p).collect();
        tokio::time::timeout_at(
            deadline,
            resolve_all(
                &target_client,
                options,
                unshared_claims(&draining, &staying),
            ),
        )
        .await
        .map_err(|_| {
            timeout(
                Phase::Prepare,
                draining.iter().map(|p| pod_key(p)).collect(),
            )
        })??
    };

    // Evict in waves of ascending priority.
    let ctx = Ctx {
        client: target_client,
        node: node_name,
        options,
        deadline,
        pods: &pod_watch,
        node_watch: &node_watch,
        stores,
    };
    let actions: BTreeMap<String, PodAction> =
        to_drain.iter().map(|(p, a)| (pod_key(p), *a)).collect();
    let waves = priority_waves(to_drain.into_iter().map(|(p, _)| p).collect());
    let parallelism = options.parallelism.max(1);
    // Pods under a `wait-completed` rule are waited for alongside the waves, never evicted.
    let completions = futures::stream::iter(wait_completed)
        .map(|pod| {
            drain_pod(
                &ctx,
                PodPlan {
                    pod,
                    wait_only: false,
                    wait_completed: true,
                    volumes: Vec::new(),
                },
            )
        })
        .buffer_unordered(usize::MAX)
        .collect::<Vec<_>>();
    let waves = async {
        let mut reports = Vec::new();
        for wave in waves {
            let plans: Vec<PodPlan> = wave
                .into_iter()
                .map(|pod| {
                    let key = pod_key(&pod);
                    PodPlan {
                        wait_only: actions.get(&key) == Some(&PodAction::WaitOnly),
                        wait_completed: false,
                        volumes: volumes.get(&key).cloned().unwrap_or_default(),
                        pod,
                    }
                })
                .collect();
            let wave_reports: Vec<_> = futures::stream::iter(plans)
                .map(|plan| drain_pod(&ctx, plan))
                .buffer_unordered(parallelism)
                .collect()
                .await;
            let failed = wave_reports.iter().any(|r| r.failure.is_some());
            reports.extend(wave_reports);
            if failed {
                // Keep the more critical pods running: the drain fails anyway.
                break;
            }
        }
        reports
    };
    let (mut reports, completed) = futures::join!(waves, completions);
    reports.extend(completed);

    let elapsed = start.elapsed();
    outcome.total = elapsed;
    match fold_reports(&mut outcome, reports, elapsed) {
        Some(error) => {
            tracing::warn!(node = node_name, %error, "drain failed");
            Err(error)
        }
        None => {
            tracing::info!(node = node_name, summary = %outcome.summary(), "drain finished");
            Ok(outcome)
        }
    }
}

/// Resolves the tracked volumes of every pod (`namespace/name` -> volumes).
async fn resolve_all(
    client: &kube::Client,
    options: &Options,
    claims: BTreeMap<String, Vec<String>>,
) -> Result<BTreeMap<String, Vec<TrackedVolume>>, DrainError> {
    let results: Vec<Result<(String, Vec<TrackedVolume>), DrainError>> =
        futures::stream::iter(claims.into_iter().filter(|(_, c)| !c.is_empty()))
            .map(|(key, claims)| async move {
                let namespace = key.split('/').next().unwrap_or_default().to_string();
                let vols = volumes::resolve(client, &options.driver, &namespace, &claims).await?;
                Ok((key, vols))
            })
            .buffer_unordered(options.parallelism.max(1))
            .collect()
            .await;
    results.into_iter().collect()
}
