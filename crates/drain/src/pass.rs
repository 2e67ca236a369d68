//! One pass of a drain, for callers that requeue between passes instead of holding a task open
//! for the whole drain (the machine controller: each reconcile runs one pass and comes back).
//!
//! A pass never waits: it cordons the node, lists the pods bound to it, issues this round's
//! evictions or deletions, and reports where the drain stands ([`PassState`]). Everything it
//! decides comes from the cluster and from the caller's durable record of when the drain
//! started ([`PassInput`]), so a pass may run in another process after a crash.
//!
//! The rules, per pod ([`plan_pods`], pure):
//! - mirror, DaemonSet and finished pods stay, and so do pods with a `skip` drain rule
//!   ([`classify_pod`], [`crate::DRAIN_BEHAVIOR_KEY`]);
//! - a pod with a `wait-completed` drain rule is never evicted and takes no part in the
//!   priority waves: the drain waits until it finished or is gone; on an unreachable node it is
//!   not waited for, and once the drain timeout has passed it is deleted like any other pod
//!   ([`wait_completed_step`]);
//! - force mode deletes every other pod with grace period 0, terminating ones included, and
//!   does not wait;
//! - otherwise the lowest-priority wave still on the node is evicted (higher waves are held
//!   back until it is gone); an eviction refused by a PodDisruptionBudget is retried next
//!   pass; once `max_evict_retries` retry intervals or the drain timeout have passed since the
//!   drain started, the pod is deleted instead;
//! - on an **unreachable** node (its `Ready` condition is `Unknown`: the kubelet stopped
//!   reporting), pods can never finish terminating, so every wave is acted on at once and pods
//!   whose deletion was requested are not waited for (as Cluster API does for unreachable
//!   nodes); neither are volumes. Its pods are still **evicted**: the VM may run behind a
//!   partition, and its pods with it, so their budgets hold (the caller forces the drain after
//!   the node has been NotReady long enough, MCM's 5 minutes);
//! - on a node whose **VM is dead** (the caller's driver reports it gone or stopped,
//!   [`PassInput::vm_dead`]), the pods run nowhere: every pod the drain would move, terminating
//!   ones and `wait-completed` ones included, is deleted with grace period 0 and not waited for
//!   ([`DeleteReason::VmDead`]). An eviction would be refused by any budget they count against
//!   (they are its unhealthy pods) and a graceful deletion would wait for a kubelet that is not
//!   there; a StatefulSet can only recreate a replica once its pod is gone.
//!
//! Once no pod is left to wait for, the pass waits (across passes) for the volumes still
//! attached to the node to detach, for at most `pv_detach_timeout` from when the pods were
//! first seen gone (the caller records that moment, see [`PassInput::pods_gone_for`]).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

use crate::Options;
use crate::classify::{
    DrainMode, InvalidDrainRule, PodAction, WaitCompletedStep, classify_pod, invalid_drain_rules,
    pod_key, priority_waves, wait_completed_step,
};
use crate::cordon;
use crate::error::{DrainError, MisconfiguredReason};
use crate::outcome::{DeleteReason, DeletedPod, PdbBlock, SkippedPod};
use crate::pdb::{Refusal, assess_refusal};
use crate::pod::{Evicted, attempt_timeout, delete_pod, evict_pod, list_budgets};
use crate::volumes::{self, TrackedVolume, attached_name_matches, unshared_claims};
use crate::watch::Stores;

/// What a pass needs to know beyond the cluster: the caller's durable record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassInput {
    /// Time since the drain started (recorded by the caller when it first cordoned the node).
    pub elapsed: Duration,
    /// Time since the caller first saw a pass report [`PassState::Volumes`] (all pods gone),
    /// if it did: the volume wait is bounded by `pv_detach_timeout` from then.
    pub pods_gone_for: Option<Duration>,
    /// The node is unreachable: pods whose deletion was requested are not waited for, and
    /// neither are volumes.
    pub unreachable: bool,
    /// The driver reports the node's VM gone or stopped (and the node is not Ready): its pods
    /// run nowhere. Every pod the drain would move is deleted (grace period 0, terminating
    /// ones too) instead of evicted, and nothing is waited for.
    pub vm_dead: bool,
}

/// What one pod gets this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodStep {
    /// Evict it through the eviction API.
    Evict,
    /// Delete it (grace period 0), for this reason.
    Delete(DeleteReason),
    /// It is terminating: wait for it.
    Wait,
    /// It is terminating on an unreachable node: it will never finish, do not wait.
    Release,
    /// A higher-priority pod held back until the lower waves are gone.
    Hold,
    /// A `wait-completed` drain rule: not evicted; wait until it finished or is gone.
    AwaitCompletion,
}

/// Decides what each pod on the node gets this pass (pure). Pods that stay on the node are
/// returned separately with the reason.
pub fn plan_pods(
    pods: Vec<Pod>,
    options: &Options,
    input: &PassInput,
) -> (Vec<(Pod, PodStep)>, Vec<SkippedPod>) {
    let mut skipped = Vec::new();
    let mut drainable = Vec::new();
    let mut wait_completed = Vec::new();
    for pod in pods {
        match classify_pod(&pod) {
            PodAction::Skip(reason) => skipped.push(SkippedPod {
                pod: pod_key(&pod),
                reason,
            }),
            PodAction::WaitCompleted => wait_completed.push(pod),
            PodAction::Drain | PodAction::WaitOnly => drainable.push(pod),
        }
    }
    skipped.sort_by(|a, b| a.pod.cmp(&b.pod));
    wait_completed.sort_by_key(pod_key);
    let mode = DrainMode {
        force: options.force,
        unreachable: input.unreachable,
        timed_out: input.elapsed >= options.timeout,
        vm_dead: input.vm_dead,
    };
    let delete_reason = if input.vm_dead {
        Some(DeleteReason::VmDead)
    } else if options.force {
        Some(DeleteReason::Force)
    } else if input.elapsed >= options.timeout {
        Some(DeleteReason::Timeout)
    } else if input.elapsed
        >= options
            .eviction_retry_interval
            .saturating_mul(options.max_evict_retries)
    {
        Some(DeleteReason::MaxEvictRetries)
    } else {
        None
    };
    let mut planned = Vec::new();
    for (i, wave) in priority_waves(drainable).into_iter().enumerate() {
        let acted_on = i == 0 || options.force || input.unreachable || input.vm_dead;
        for pod in wave {
            let terminating = pod.metadata.deletion_timestamp.is_some();
            let step = match (acted_on, terminating) {
                (false, _) => PodStep::Hold,
                // Nothing will ever finish terminating it.
                (true, true) if input.vm_dead => PodStep::Delete(DeleteReason::VmDead),
                // Force mode deletes pods stuck terminating too (they would stay bound to a
                // Node that is about to be deleted).
                (true, true) if options.force => PodStep::Delete(DeleteReason::Force),
                (true, true) if input.unreachable => PodStep::Release,
                (true, true) => PodStep::Wait,
                (true, false) => delete_reason.map_or(PodStep::Evict, PodStep::Delete),
            };
            planned.push((pod, step));
        }
    }
    let rule_step = match wait_completed_step(mode) {
        WaitCompletedStep::Wait => PodStep::AwaitCompletion,
        WaitCompletedStep::Release => PodStep::Release,
        WaitCompletedStep::Delete(reason) => PodStep::Delete(reason),
    };
    planned.extend(wait_completed.into_iter().map(|pod| (pod, rule_step)));
    (planned, skipped)
}

/// Where a drain stands after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassState {
    /// The node does not exist: nothing to drain.
    NodeGone,
    /// Pods are still to be evicted or waited for.
    Pods,
    /// No pod is left to wait for; volumes are still attached to the node.
    Volumes,
    /// Drained: nothing left to wait for.
    Done,
}

/// A pod a misconfigured PodDisruptionBudget keeps on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MisconfiguredBudget {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// `namespace/name` of the budget (or budgets).
    pub pdb: String,
    /// What is wrong with it.
    pub reason: MisconfiguredReason,
}

/// What one pass did and saw.
#[derive(Debug, Default)]
pub struct PassReport {
    /// The node.
    pub node: String,
    /// Where the drain stands.
    pub state: Option<PassState>,
    /// Pods evicted by this pass.
    pub evicted: Vec<String>,
    /// Pods deleted by this pass instead of evicted.
    pub deleted: Vec<DeletedPod>,
    /// Pods terminating on an unreachable node: not waited for.
    pub released: Vec<String>,
    /// Pods terminating (evicted now or before) that the drain waits for.
    pub terminating: Vec<String>,
    /// Higher-priority pods waiting for the lower waves to go.
    pub held: Vec<String>,
    /// Running pods with a `wait-completed` drain rule: not evicted, the drain waits until
    /// they finished or are gone.
    pub waiting_for_completion: Vec<String>,
    /// Unknown drain rule values on the node's pods (those pods are drained as usual): for a
    /// Warning naming the pod and the value.
    pub invalid_rules: Vec<InvalidDrainRule>,
    /// Evictions refused by a PodDisruptionBudget this pass.
    pub blocked: Vec<PdbBlock>,
    /// Evictions a misconfigured budget can never allow (deleted once the retries or the
    /// drain timeout run out).
    pub misconfigured: Vec<MisconfiguredBudget>,
    /// Requests that failed this pass (retried next pass).
    pub failed: Vec<DrainError>,
    /// Pods left on the node on purpose.
    pub skipped: Vec<SkippedPod>,
    /// Volumes still attached to the node (when no pod is left to wait for).
    pub attached_volumes: Vec<String>,
    /// Volumes that stayed attached beyond `pv_detach_timeout` (not waited for any longer).
    pub detach_timeouts: Vec<String>,
}

impl PassReport {
    /// Where the drain stands ([`PassState::Pods`] if the pass did not get that far).
    pub fn state(&self) -> PassState {
        self.state.unwrap_or(PassState::Pods)
    }

    /// Pods still keeping the drain from finishing.
    pub fn pods_left(&self) -> usize {
        self.terminating.len()
            + self.held.len()
            + self.waiting_for_completion.len()
            + self.blocked.len()
            + self.misconfigured.len()
            + self.failed.len()
    }

    /// One line for `lastOperation.description`: it changes only when the situation does
    /// (no timestamps or durations), so a caller can skip rewriting an unchanged status.
    pub fn summary(&self) -> String {
        let mut s = self.progress();
        if let Some(bad) = self.invalid_rules.first() {
            s.push_str(&format!("; {bad}"));
            if self.invalid_rules.len() > 1 {
                s.push_str(&format!(
                    " (and {} more unknown drain rule value(s))",
                    self.invalid_rules.len() - 1
                ));
            }
        }
        s
    }

    fn progress(&self) -> String {
        let node = &self.node;
        match self.state() {
            PassState::NodeGone => format!("node {node} not found, nothing to drain"),
            PassState::Done => {
                let mut s = format!("node {node} drained");
                let mut parts = Vec::new();
                if !self.evicted.is_empty() {
                    parts.push(format!("{} evicted", self.evicted.len()));
                }
                let dead = self
                    .deleted
                    .iter()
                    .filter(|d| d.reason == DeleteReason::VmDead)
                    .count();
                if self.deleted.len() > dead {
                    parts.push(format!("{} deleted", self.deleted.len() - dead));
                }
                if dead > 0 {
                    parts.push(format!(
                        "{dead} deleted without eviction: their VM is gone or stopped"
                    ));
                }
                if !self.released.is_empty() {
                    parts.push(format!(
                        "{} not waited for (node unreachable)",
                        self.released.len()
                    ));
                }
                if !self.skipped.is_empty() {
                    parts.push(format!("{} left on the node", self.skipped.len()));
                }
                if !parts.is_empty() {
                    s.push_str(&format!(" ({})", parts.join(", ")));
                }
                if !self.detach_timeouts.is_empty() {
                    s.push_str(&format!(
                        "; volumes still attached after the PV detach timeout: {}",
                        self.detach_timeouts.join(", ")
                    ));
                }
                s
            }
            // A volume may show twice (its VolumeAttachment and the node's status): no count.
            PassState::Volumes => format!(
                "draining node {node}: all pods gone, waiting for volumes to detach: {}",
                self.attached_volumes.join(", ")
            ),
            PassState::Pods => {
                let mut parts = Vec::new();
                if let Some(m) = self.misconfigured.first() {
                    parts.push(format!(
                        "pod {} cannot be evicted: PodDisruptionBudget {} is misconfigured: {}",
                        m.pod, m.pdb, m.reason
                    ));
                }
                if let Some(b) = self.blocked.first() {
                    parts.push(format!(
                        "eviction of pod {} blocked by PodDisruptionBudget {}{}",
                        b.pod,
                        b.pdb.as_deref().unwrap_or("(unknown budget)"),
                        match self.blocked.len() {
                            1 => String::new(),
                            n => format!(" (and {} more pod(s) blocked)", n - 1),
                        }
                    ));
                }
                if !self.terminating.is_empty() {
                    parts.push(format!(
                        "waiting for {} pod(s) to terminate",
                        self.terminating.len()
                    ));
                }
                if !self.waiting_for_completion.is_empty() {
                    parts.push(format!(
                        "waiting for {} pod(s) to complete (drain rule wait-completed): {}",
                        self.waiting_for_completion.len(),
                        name_list(&self.waiting_for_completion)
                    ));
                }
                if !self.held.is_empty() {
                    parts.push(format!(
                        "{} higher-priority pod(s) wait their turn",
                        self.held.len()
                    ));
                }
                if let Some(e) = self.failed.first() {
                    parts.push(format!("retrying after: {e}"));
                }
                format!("draining node {node}: {}", parts.join("; "))
            }
        }
    }
}

/// At most three names, then how many more.
fn name_list(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut s = names
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    s
}

/// Runs one pass of the drain of `node_name`: cordon, this round's evictions or deletions,
/// and the volume check once no pod is left. Never waits for pods or volumes; returns within
/// a few API round trips (each eviction request is bounded by the retry interval).
pub async fn drain_pass(
    client: kube::Client,
    node_name: &str,
    options: &Options,
    input: &PassInput,
    stores: &Stores,
) -> Result<PassReport, DrainError> {
    let mut report = PassReport {
        node: node_name.to_string(),
        ..Default::default()
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let known = stores.node(node_name);
    let present = match (&known, options.cordon) {
        (Some(node), true) => cordon::cordon_known(&nodes, node).await?.is_some(),
        (None, true) => cordon::cordon(&nodes, node_name).await?.is_some(),
        (Some(_), false) => true,
        (None, false) => nodes
            .get_opt(node_name)
            .await
            .map_err(|e| DrainError::kube(format!("read node {node_name}"), e))?
            .is_some(),
    };
    if !present {
        report.state = Some(PassState::NodeGone);
        return Ok(report);
    }
    let pods: Vec<Pod> = match stores.pods_of(node_name) {
        Some(pods) => pods,
        None => {
            Api::<Pod>::all(client.clone())
                .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
                .await
                .map_err(|e| DrainError::kube(format!("list the pods of node {node_name}"), e))?
                .items
        }
    };
    let staying: Vec<Pod> = pods
        .iter()
        .filter(|p| matches!(classify_pod(p), PodAction::Skip(_)))
        .cloned()
        .collect();
    report.invalid_rules = pods.iter().flat_map(invalid_drain_rules).collect();
    report
        .invalid_rules
        .sort_by(|a, b| (&a.pod, a.source).cmp(&(&b.pod, b.source)));
    for bad in &report.invalid_rules {
        tracing::warn!(node = node_name, "{bad}");
    }
    let (planned, skipped) = plan_pods(pods, options, input);
    report.skipped = skipped;

    let attempt = attempt_timeout(options.eviction_retry_interval);
    let evictions = options.eviction_client.as_ref().unwrap_or(&client);
    let outcomes: Vec<(String, PodStep, Result<Acted, DrainError>)> =
        futures::stream::iter(planned)
            .map(|(pod, step)| {
                let client = client.clone();
                async move {
                    let key = pod_key(&pod);
                    let acted = act(&client, evictions, &pod, step, attempt, input.elapsed).await;
                    (key, step, acted)
                }
            })
            .buffer_unordered(options.parallelism.max(1))
            .collect()
            .await;
    for (key, step, acted) in outcomes {
        match (step, acted) {
            (_, Err(e)) => report.failed.push(e),
            (PodStep::Hold, _) => report.held.push(key),
            (PodStep::Release, _) => report.released.push(key),
            (PodStep::Wait, _) => report.terminating.push(key),
            (PodStep::AwaitCompletion, _) => report.waiting_for_completion.push(key),
            (_, Ok(Acted::Evicted)) if input.unreachable => {
                report.evicted.push(key.clone());
                report.released.push(key);
            }
            (_, Ok(Acted::Evicted)) => {
                report.evicted.push(key.clone());
                report.terminating.push(key);
            }
            (_, Ok(Acted::Deleted(reason))) => report.deleted.push(DeletedPod { pod: key, reason }),
            (_, Ok(Acted::Gone)) => {}
            (_, Ok(Acted::Blocked(block))) => report.blocked.push(block),
            (_, Ok(Acted::Misconfigured { pdb, reason })) => {
                report.misconfigured.push(MisconfiguredBudget {
                    pod: key,
                    pdb,
                    reason,
                })
            }
        }
    }
    for list in [
        &mut report.evicted,
        &mut report.released,
        &mut report.terminating,
        &mut report.waiting_for_completion,
    ] {
        list.sort();
    }
    report.held.sort();
    report.blocked.sort_by(|a, b| a.pod.cmp(&b.pod));
    report.deleted.sort_by(|a, b| a.pod.cmp(&b.pod));
    if report.pods_left() > 0 {
        report.state = Some(PassState::Pods);
        return Ok(report);
    }
    if options.force || input.unreachable || input.vm_dead {
        report.state = Some(PassState::Done);
        return Ok(report);
    }

    let node = match known {
        Some(node) => Node::clone(&node),
        None => {
            let Some(node) = nodes
                .get_opt(node_name)
                .await
                .map_err(|e| DrainError::kube(format!("get node {node_name}"), e))?
            else {
                report.state = Some(PassState::NodeGone);
                return Ok(report);
            };
            node
        }
    };
    let kept = staying_volumes(&client, options, &staying).await?;
    let attached = attached_volumes(&node, &stores.volume_attachments.state(), node_name, &kept);
    report.state = Some(match input.pods_gone_for {
        _ if attached.is_empty() => PassState::Done,
        Some(waited) if waited >= options.pv_detach_timeout => {
            report.detach_timeouts = attached;
            PassState::Done
        }
        _ => {
            report.attached_volumes = attached;
            PassState::Volumes
        }
    });
    Ok(report)
}

/// What happened to a pod acted on.
enum Acted {
    Evicted,
    Deleted(DeleteReason),
    Gone,
    Blocked(PdbBlock),
    Misconfigured {
        pdb: String,
        reason: MisconfiguredReason,
    },
}

async fn act(
    client: &kube::Client,
    evictions: &kube::Client,
    pod: &Pod,
    step: PodStep,
    attempt: Duration,
    elapsed: Duration,
) -> Result<Acted, DrainError> {
    match step {
        PodStep::Hold | PodStep::Wait | PodStep::Release | PodStep::AwaitCompletion => {
            Ok(Acted::Gone)
        }
        PodStep::Delete(reason) => match delete_pod(client, pod).await {
            Ok(true) => {
                tracing::info!(pod = %pod_key(pod), %reason, "deleted pod instead of evicting it");
                Ok(Acted::Deleted(reason))
            }
            Ok(false) => Ok(Acted::Gone),
            Err(source) => Err(DrainError::kube(
                format!("delete pod {}", pod_key(pod)),
                source,
            )),
        },
        PodStep::Evict => match evict_pod(evictions, pod, Instant::now() + attempt).await {
            Evicted::Yes => Ok(Acted::Evicted),
            Evicted::Gone => Ok(Acted::Gone),
            Evicted::Refused { multiple_budgets } => {
                let budgets = list_budgets(client, pod).await;
                Ok(match assess_refusal(pod, &budgets, multiple_budgets) {
                    Refusal::Misconfigured { pdb, reason } => Acted::Misconfigured { pdb, reason },
                    Refusal::Blocked { pdb } => Acted::Blocked(PdbBlock {
                        pod: pod_key(pod),
                        pdb,
                        blocked_for: elapsed,
                        refusals: 1,
                        misconfigured: false,
                    }),
                })
            }
            Evicted::Failed(source) => Err(DrainError::kube(
                format!("evict pod {}", pod_key(pod)),
                source,
            )),
        },
    }
}

/// The volumes of the pods that stay on the node (they will not detach: not waited for).
async fn staying_volumes(
    client: &kube::Client,
    options: &Options,
    staying: &[Pod],
) -> Result<Vec<TrackedVolume>, DrainError> {
    let refs: Vec<&Pod> = staying.iter().collect();
    let mut kept = Vec::new();
    for (key, claims) in unshared_claims(&refs, &[]) {
        if claims.is_empty() {
            continue;
        }
        let namespace = key.split('/').next().unwrap_or_default();
        kept.extend(volumes::resolve(client, &options.driver, namespace, &claims).await?);
    }
    Ok(kept)
}

/// The volumes attached to `node_name` (its `status.volumesAttached`, and attached
/// VolumeAttachments by PersistentVolume), except those in `kept`. Pure.
pub fn attached_volumes(
    node: &Node,
    attachments: &[std::sync::Arc<VolumeAttachment>],
    node_name: &str,
    kept: &[TrackedVolume],
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for a in node
        .status
        .iter()
        .flat_map(|s| s.volumes_attached.iter().flatten())
    {
        if !kept.iter().any(|k| attached_name_matches(&a.name, &k.id)) {
            out.insert(a.name.clone());
        }
    }
    for va in attachments {
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        let Some(pv) = va.spec.source.persistent_volume_name.as_deref() else {
            continue;
        };
        if va.spec.node_name == node_name && attached && !kept.iter().any(|k| k.pv == pv) {
            out.insert(format!("PersistentVolume {pv}"));
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use mcm_driver::FakeDriver;
    use std::sync::Arc;

    fn pod(name: &str, priority: i32, terminating: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        if terminating {
            p.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        }
        p.spec = Some(PodSpec {
            priority: Some(priority),
            ..Default::default()
        });
        p
    }

    fn daemon(name: &str) -> Pod {
        let mut p = pod(name, 0, false);
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ds".into(),
            uid: "u".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        p
    }

    fn options() -> Options {
        let mut o = Options::new(Arc::new(FakeDriver::new()));
        o.timeout = Duration::from_secs(600);
        o.eviction_retry_interval = Duration::from_secs(20);
        o.max_evict_retries = 3;
        o
    }

    fn steps(planned: &[(Pod, PodStep)]) -> Vec<(String, PodStep)> {
        planned
            .iter()
            .map(|(p, s)| (p.metadata.name.clone().unwrap(), *s))
            .collect()
    }

    fn s(name: &str, step: PodStep) -> (String, PodStep) {
        (name.to_string(), step)
    }

    #[test]
    fn lowest_wave_first_higher_waves_held() {
        let pods = vec![
            pod("critical", 1000, false),
            pod("web", 0, false),
            pod("old", 0, true),
            daemon("agent"),
        ];
        let (planned, skipped) = plan_pods(pods, &options(), &PassInput::default());
        assert_eq!(
            steps(&planned),
            vec![
                s("old", PodStep::Wait),
                s("web", PodStep::Evict),
                s("critical", PodStep::Hold),
            ]
        );
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].pod, "ns/agent");
    }

    #[test]
    fn unreachable_node_acts_on_every_wave_and_waits_for_nothing() {
        let pods = vec![pod("critical", 1000, false), pod("old", 0, true)];
        let input = PassInput {
            unreachable: true,
            ..Default::default()
        };
        let (planned, _) = plan_pods(pods, &options(), &input);
        assert_eq!(
            steps(&planned),
            vec![s("old", PodStep::Release), s("critical", PodStep::Evict)]
        );
    }

    #[test]
    fn a_dead_vm_deletes_every_pod_at_once_and_evicts_none() {
        let pods = vec![
            pod("critical", 1000, false),
            pod("web", 0, false),
            pod("old", 0, true),
            with_rule(pod("job", 0, false), "wait-completed"),
            with_rule(pod("cache", 0, false), "skip"),
            daemon("agent"),
        ];
        let input = PassInput {
            vm_dead: true,
            unreachable: true,
            ..Default::default()
        };
        let (planned, skipped) = plan_pods(pods, &options(), &input);
        let del = PodStep::Delete(DeleteReason::VmDead);
        assert_eq!(
            steps(&planned),
            vec![
                s("old", del),
                s("web", del),
                s("critical", del),
                s("job", del)
            ]
        );
        let skipped: Vec<_> = skipped.iter().map(|s| s.pod.as_str()).collect();
        assert_eq!(skipped, vec!["ns/agent", "ns/cache"]);
        // The same node only unreachable (a partition: the VM may run): evicted, budgets hold.
        let partition = PassInput {
            unreachable: true,
            ..Default::default()
        };
        let (planned, _) = plan_pods(vec![pod("web", 0, false)], &options(), &partition);
        assert_eq!(steps(&planned), vec![s("web", PodStep::Evict)]);
    }

    #[test]
    fn force_deletes_everything_even_terminating_pods() {
        let mut o = options();
        o.force = true;
        let pods = vec![pod("critical", 1000, false), pod("old", 0, true)];
        let (planned, _) = plan_pods(pods, &o, &PassInput::default());
        let del = PodStep::Delete(DeleteReason::Force);
        assert_eq!(steps(&planned), vec![s("old", del), s("critical", del)]);
    }

    #[test]
    fn retries_then_timeout_turn_evictions_into_deletions() {
        let at = |secs| PassInput {
            elapsed: Duration::from_secs(secs),
            ..Default::default()
        };
        let plan =
            |input: PassInput| steps(&plan_pods(vec![pod("web", 0, false)], &options(), &input).0);
        assert_eq!(plan(at(59)), vec![s("web", PodStep::Evict)]);
        assert_eq!(
            plan(at(60)),
            vec![s("web", PodStep::Delete(DeleteReason::MaxEvictRetries))]
        );
        let mut o = options();
        o.max_evict_retries = 1000;
        let planned = plan_pods(vec![pod("web", 0, false)], &o, &at(600)).0;
        assert_eq!(
            steps(&planned),
            vec![s("web", PodStep::Delete(DeleteReason::Timeout))]
        );
    }

    fn with_rule(mut p: Pod, value: &str) -> Pod {
        p.metadata.labels = Some([(crate::DRAIN_BEHAVIOR_KEY.into(), value.into())].into());
        p
    }

    #[test]
    fn drain_rules_keep_pods_out_of_the_waves() {
        let pods = || {
            vec![
                with_rule(pod("job", 0, false), "wait-completed"),
                with_rule(pod("cache", 0, false), "skip"),
                pod("web", 0, false),
                pod("critical", 1000, false),
            ]
        };
        let (planned, skipped) = plan_pods(pods(), &options(), &PassInput::default());
        assert_eq!(
            steps(&planned),
            vec![
                s("web", PodStep::Evict),
                s("critical", PodStep::Hold),
                s("job", PodStep::AwaitCompletion),
            ]
        );
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].pod, "ns/cache");

        // Force mode before the timeout still waits for the wait-completed pod.
        let mut force = options();
        force.force = true;
        let del = PodStep::Delete(DeleteReason::Force);
        let (planned, _) = plan_pods(pods(), &force, &PassInput::default());
        assert_eq!(
            steps(&planned),
            vec![
                s("web", del),
                s("critical", del),
                s("job", PodStep::AwaitCompletion)
            ]
        );
        // Unreachable: not waited for.
        let unreachable = PassInput {
            unreachable: true,
            ..Default::default()
        };
        let (planned, _) = plan_pods(pods(), &force, &unreachable);
        assert_eq!(steps(&planned)[2], s("job", PodStep::Release));
        // Past the drain timeout: deleted like any other pod.
        let late = PassInput {
            elapsed: Duration::from_secs(600),
            ..Default::default()
        };
        let (planned, skipped) = plan_pods(pods(), &force, &late);
        assert_eq!(steps(&planned)[2], s("job", del));
        assert_eq!(skipped.len(), 1, "a skip rule holds in force mode too");
    }

    #[test]
    fn summaries_name_pods_waited_for_by_rule_and_unknown_rules() {
        let report = PassReport {
            node: "n1".into(),
            state: Some(PassState::Pods),
            waiting_for_completion: (1..=5).map(|i| format!("ns/job-{i}")).collect(),
            invalid_rules: vec![crate::InvalidDrainRule {
                pod: "ns/web".into(),
                source: crate::RuleSource::Annotation,
                value: "maybe".into(),
            }],
            ..Default::default()
        };
        assert_eq!(report.pods_left(), 5);
        assert_eq!(
            report.summary(),
            "draining node n1: waiting for 5 pod(s) to complete (drain rule wait-completed): \
             ns/job-1, ns/job-2, ns/job-3 and 2 more; pod ns/web has annotation \
             drain.machine.sapcloud.io/behavior with unknown value \"maybe\" (drained as usual; \
             valid: drain, skip, wait-completed)"
        );
    }

    #[test]
    fn summaries_name_the_budget_and_do_not_change_with_time() {
        let report = |elapsed| PassReport {
            node: "n1".into(),
            state: Some(PassState::Pods),
            blocked: vec![PdbBlock {
                pod: "ns/web".into(),
                pdb: Some("ns/web-pdb".into()),
                blocked_for: elapsed,
                refusals: 1,
                misconfigured: false,
            }],
            ..Default::default()
        };
        let a = report(Duration::from_secs(1)).summary();
        assert_eq!(
            a,
            "draining node n1: eviction of pod ns/web blocked by PodDisruptionBudget ns/web-pdb"
        );
        assert_eq!(a, report(Duration::from_secs(100)).summary());
    }
}
