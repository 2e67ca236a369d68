//! What a drain did: the outcome returned to the caller, and the pure bookkeeping that folds
//! the per-pod reports into it (or into the error that ends the drain).

use std::fmt;
use std::time::{Duration, Instant};

use crate::classify::{InvalidDrainRule, RuleSource};
use crate::cordon::CordonChange;
use crate::error::{DrainError, MisconfiguredReason};

/// The phases of a drain, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Marking the node unschedulable and tainting it.
    Cordon,
    /// Listing the pods and resolving their volumes.
    Prepare,
    /// Evicting (or deleting) pods.
    Evict,
    /// Waiting for evicted pods to disappear.
    WaitForDeletion,
    /// Waiting for the volumes of evicted pods to detach from the node.
    VolumeDetach,
    /// Waiting for those volumes to attach to another node.
    VolumeReattach,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Cordon => "cordoning the node",
            Phase::Prepare => "listing pods and their volumes",
            Phase::Evict => "evicting pods",
            Phase::WaitForDeletion => "waiting for pods to disappear",
            Phase::VolumeDetach => "waiting for volumes to detach",
            Phase::VolumeReattach => "waiting for volumes to reattach to another node",
        })
    }
}

/// Why a pod on the node was left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A mirror pod (static pod of the kubelet): the API cannot remove it.
    MirrorPod,
    /// Managed by a DaemonSet: the DaemonSet controller would recreate it on the node.
    DaemonSet,
    /// Already finished (`Succeeded` or `Failed`): it holds no resources.
    Finished,
    /// Its drain rule says `skip` (see [`crate::DRAIN_BEHAVIOR_KEY`]), set there.
    DrainRule(RuleSource),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::MirrorPod => "mirror pod",
            SkipReason::DaemonSet => "managed by a DaemonSet",
            SkipReason::Finished => "finished",
            SkipReason::DrainRule(source) => return write!(f, "drain rule skip ({source})"),
        })
    }
}

/// A pod left on the node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedPod {
    /// `namespace/name`.
    pub pod: String,
    /// Why it was skipped.
    pub reason: SkipReason,
}

/// Why a pod was deleted instead of evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// The drain runs in force mode.
    Force,
    /// The eviction was refused `max_evict_retries` times.
    MaxEvictRetries,
    /// The drain timeout ran out while the eviction was still refused.
    Timeout,
    /// The driver reports the node's VM gone or stopped: the pod runs nowhere, so it is
    /// deleted without an eviction (a PodDisruptionBudget guards running pods only, and counts
    /// this one among its unhealthy pods, so an eviction would be refused) and without waiting
    /// for a kubelet that is not there.
    VmDead,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::Force => "force mode",
            DeleteReason::MaxEvictRetries => "eviction retries exhausted",
            DeleteReason::Timeout => "drain timeout reached",
            DeleteReason::VmDead => "its VM is gone or stopped",
        })
    }
}

/// A pod deleted instead of evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedPod {
    /// `namespace/name`.
    pub pod: String,
    /// Why it was deleted.
    pub reason: DeleteReason,
}

/// A pod whose eviction a PodDisruptionBudget refused (HTTP 429) at least once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbBlock {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// `namespace/name` of the budget selecting the pod, when one was found.
    pub pdb: Option<String>,
    /// From the first refusal to the last one (or to the end of the retries).
    pub blocked_for: Duration,
    /// How many evictions were refused.
    pub refusals: u32,
    /// Whether the budget was found misconfigured (the pod was then given up on).
    pub misconfigured: bool,
}

/// Wall-clock time spent in each phase. Pods go through the phases in parallel, so a phase's
/// time is the length of the union of the intervals during which any pod was in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseDurations {
    /// Cordoning the node.
    pub cordon: Duration,
    /// Evicting or deleting pods (PDB retries included).
    pub evict: Duration,
    /// Waiting for evicted pods to disappear.
    pub wait_for_deletion: Duration,
    /// Waiting for volumes to detach from the node.
    pub volume_detach: Duration,
    /// Waiting for volumes to attach to another node.
    pub volume_reattach: Duration,
}

/// What a successful drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainOutcome {
    /// The node.
    pub node: String,
    /// `false` when the node does not exist (nothing to drain: the outcome is otherwise empty).
    pub node_found: bool,
    /// What cordoning changed on the node (nothing when it was cordoned already).
    pub cordon: CordonChange,
    /// Pods removed through the eviction API (`namespace/name`).
    pub evicted: Vec<String>,
    /// Pods deleted instead of evicted.
    pub deleted: Vec<DeletedPod>,
    /// Pods that disappeared (or were already terminating) before the drain acted on them.
    pub already_gone: Vec<String>,
    /// Pods left on the node.
    pub skipped: Vec<SkippedPod>,
    /// Pods with a `wait-completed` drain rule the drain waited for until they finished or
    /// disappeared (never evicted or deleted).
    pub waited_for_completion: Vec<String>,
    /// Unknown drain rule values on the node's pods (those pods were drained as usual): for a
    /// Warning naming the pod and the value.
    pub invalid_rules: Vec<InvalidDrainRule>,
    /// Evictions refused by PodDisruptionBudgets, and for how long.
    pub pdb_blocks: Vec<PdbBlock>,
    /// Volumes waited for until they detached from the node.
    pub detached_volumes: Vec<String>,
    /// Volumes seen attached to another node afterwards (only when waiting for reattachment).
    pub reattached_volumes: Vec<String>,
    /// Volumes that did not reattach elsewhere within the reattach timeout (a warning, as in
    /// MCM: nothing guarantees another node wants them).
    pub reattach_timeouts: Vec<String>,
    /// Time per phase.
    pub phases: PhaseDurations,
    /// Total time of the drain.
    pub total: Duration,
}

impl DrainOutcome {
    /// A one-line summary for logs and `lastOperation.description`.
    pub fn summary(&self) -> String {
        if !self.node_found {
            return format!("node {} not found, nothing to drain", self.node);
        }
        let mut s = format!(
            "drained node {} in {}: {} evicted, {} deleted, {} already gone, {} skipped",
            self.node,
            human_duration(self.total),
            self.evicted.len(),
            self.deleted.len(),
            self.already_gone.len(),
            self.skipped.len()
        );
        if !self.waited_for_completion.is_empty() {
            s.push_str(&format!(
                ", {} waited for to complete (drain rule wait-completed)",
                self.waited_for_completion.len()
            ));
        }
        if let Some(longest) = self.pdb_blocks.iter().max_by_key(|b| b.blocked_for) {
            s.push_str(&format!(
                "; longest PodDisruptionBudget block: {} on pod {} for {}",
                longest.pdb.as_deref().unwrap_or("(unknown budget)"),
                longest.pod,
                human_duration(longest.blocked_for)
            ));
        }
        s
    }
}

/// How a pod left the node (or did not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// Evicted through the eviction API.
    Evicted,
    /// Deleted directly.
    Deleted(DeleteReason),
    /// Gone (or terminating already) before the drain acted on it.
    AlreadyGone,
    /// A `wait-completed` pod that finished (or disappeared) while the drain waited.
    Completed,
    /// Not removed (the pod failed before).
    NotRemoved,
}

/// Why a pod could not be drained.
#[derive(Debug)]
pub(crate) enum PodFailure {
    /// An API call failed.
    Kube { action: String, source: kube::Error },
    /// A misconfigured budget refuses the eviction for good.
    Misconfigured {
        pdb: String,
        reason: MisconfiguredReason,
    },
    /// A wait or the drain timeout ran out in this phase.
    Timeout { phase: Phase },
    /// These volumes stayed attached.
    VolumeDetachTimeout {
        volumes: Vec<String>,
        waited: Duration,
    },
}

/// Everything that happened to one pod.
#[derive(Debug)]
pub(crate) struct PodReport {
    /// `namespace/name`.
    pub pod: String,
    pub removal: Removal,
    pub pdb_block: Option<PdbBlock>,
    /// Intervals spent per phase.
    pub spans: Vec<(Phase, Instant, Instant)>,
    pub detached_volumes: Vec<String>,
    pub reattached_volumes: Vec<String>,
    pub reattach_timeouts: Vec<String>,
    pub failure: Option<PodFailure>,
}

impl PodReport {
    pub(crate) fn new(pod: String) -> Self {
        PodReport {
            pod,
            removal: Removal::NotRemoved,
            pdb_block: None,
            spans: Vec::new(),
            detached_volumes: Vec::new(),
            reattached_volumes: Vec::new(),
            reattach_timeouts: Vec::new(),
            failure: None,
        }
    }

    /// Records that the pod spent `[start, now)` in `phase`.
    pub(crate) fn span(&mut self, phase: Phase, start: Instant) {
        self.spans.push((phase, start, Instant::now()));
    }

    pub(crate) fn fail(mut self, failure: PodFailure) -> Self {
        self.failure = Some(failure);
        self
    }
}

/// Folds per-pod reports into `outcome` (lists and phase times) and returns the error that
/// ends the drain, if any pod failed. Precedence: API errors, misconfigured budgets, budgets
/// blocking until the timeout, volumes that did not detach, other timeouts.
pub(crate) fn fold_reports(
    outcome: &mut DrainOutcome,
    reports: Vec<PodReport>,
    elapsed: Duration,
) -> Option<DrainError> {
    let mut spans: Vec<(Phase, Instant, Instant)> = Vec::new();
    let mut kube_error = None;
    let mut misconfigured = None;
    let mut blocked: Vec<PdbBlock> = Vec::new();
    let mut detach_volumes: Vec<String> = Vec::new();
    let mut detach_waited = Duration::ZERO;
    let mut timeouts: Vec<(Phase, String)> = Vec::new();

    for report in reports {
        match report.removal {
            Removal::Evicted => outcome.evicted.push(report.pod.clone()),
            Removal::Deleted(reason) => outcome.deleted.push(DeletedPod {
                pod: report.pod.clone(),
                reason,
            }),
            Removal::AlreadyGone => outcome.already_gone.push(report.pod.clone()),
            Removal::Completed => outcome.waited_for_completion.push(report.pod.clone()),
            Removal::NotRemoved => {}
        }
        if let Some(block) = &report.pdb_block {
            outcome.pdb_blocks.push(block.clone());
        }
        spans.extend(report.spans);
        outcome.detached_volumes.extend(report.detached_volumes);
        outcome.reattached_volumes.extend(report.reattached_volumes);
        outcome.reattach_timeouts.extend(report.reattach_timeouts);
        match report.failure {
            None => {}
            Some(PodFailure::Kube { action, source }) => {
                kube_error.get_or_insert(DrainError::Kube { action, source });
            }
            Some(PodFailure::Misconfigured { pdb, reason }) => {
                misconfigured.get_or_insert(DrainError::MisconfiguredPdb {
                    node: outcome.node.clone(),
                    pdb,
                    pod: report.pod,
                    reason,
                });
            }
            Some(PodFailure::Timeout { phase }) => {
                if let (Some(block), Removal::Deleted(DeleteReason::Timeout)) =
                    (report.pdb_block, report.removal)
                {
                    blocked.push(block);
                }
                timeouts.push((phase, report.pod));
            }
            Some(PodFailure::VolumeDetachTimeout { volumes, waited }) => {
                detach_volumes.extend(volumes);
                detach_waited = detach_waited.max(waited);
            }
        }
    }

    outcome.phases.evict += phase_time(&spans, Phase::Evict);
    outcome.phases.wait_for_deletion += phase_time(&spans, Phase::WaitForDeletion);
    outcome.phases.volume_detach += phase_time(&spans, Phase::VolumeDetach);
    outcome.phases.volume_reattach += phase_time(&spans, Phase::VolumeReattach);

    if let Some(e) = kube_error.or(misconfigured) {
        return Some(e);
    }
    if let Some(longest) = blocked.iter().max_by_key(|b| b.blocked_for) {
        return Some(DrainError::BlockedByPdb {
            node: outcome.node.clone(),
            pdb: longest.pdb.clone(),
            pod: longest.pod.clone(),
            since: longest.blocked_for,
            other_blocked_pods: blocked.len() - 1,
        });
    }
    if !detach_volumes.is_empty() {
        detach_volumes.sort();
        return Some(DrainError::VolumeDetachTimeout {
            node: outcome.node.clone(),
            volumes: detach_volumes,
            waited: detach_waited,
        });
    }
    let phase = timeouts.iter().map(|(p, _)| *p).min()?;
    let mut remaining_pods: Vec<String> = timeouts.into_iter().map(|(_, pod)| pod).collect();
    remaining_pods.sort();
    Some(DrainError::Timeout {
        node: outcome.node.clone(),
        phase,
        elapsed,
        remaining_pods,
    })
}

/// Length of the union of the intervals recorded for `phase`.
pub(crate) fn phase_time(spans: &[(Phase, Instant, Instant)], phase: Phase) -> Duration {
    let mut intervals: Vec<(Instant, Instant)> = spans
        .iter()
        .filter(|(p, s, e)| *p == phase && e > s)
        .map(|(_, s, e)| (*s, *e))
        .collect();
    intervals.sort();
    let mut total = Duration::ZERO;
    let mut current: Option<(Instant, Instant)> = None;
    for (s, e) in intervals {
        current = match current {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
    }
    total
}

/// A short human form of a duration: `250ms`, `2.5s`, `1m5s`, `2h0m3s`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        let tenths = (ms % 1000) / 100;
        return if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        };
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pod: &str, removal: Removal) -> PodReport {
        let mut r = PodReport::new(pod.into());
        r.removal = removal;
        r
    }

    fn outcome() -> DrainOutcome {
        DrainOutcome {
            node: "n1".into(),
            node_found: true,
            ..Default::default()
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(human_duration(Duration::from_millis(2500)), "2.5s");
        assert_eq!(human_duration(Duration::from_secs(3)), "3s");
        assert_eq!(human_duration(Duration::from_secs(65)), "1m5s");
        assert_eq!(human_duration(Duration::from_secs(7203)), "2h0m3s");
    }

    #[test]
    fn phase_time_is_the_union_of_overlapping_spans() {
        let t = Instant::now();
        let s = |a: u64, b: u64| (t + Duration::from_secs(a), t + Duration::from_secs(b));
        let spans = vec![
            (Phase::Evict, s(0, 2).0, s(0, 2).1),
            (Phase::Evict, s(1, 3).0, s(1, 3).1),
            (Phase::Evict, s(5, 6).0, s(5, 6).1),
            (Phase::VolumeDetach, s(0, 10).0, s(0, 10).1),
        ];
        assert_eq!(phase_time(&spans, Phase::Evict), Duration::from_secs(4));
        assert_eq!(
            phase_time(&spans, Phase::VolumeDetach),
            Duration::from_secs(10)
        );
        assert_eq!(phase_time(&spans, Phase::WaitForDeletion), Duration::ZERO);
    }

    #[test]
    fn reports_fold_into_lists() {
        let mut o = outcome();
        let mut blocked = report("ns/b", Removal::Evicted);
        blocked.pdb_block = Some(PdbBlock {
            pod: "ns/b".into(),
            pdb: Some("ns/budget".into()),
            blocked_for: Duration::from_secs(3),
            refusals: 2,
            misconfigured: false,
        });
        let err = fold_reports(
            &mut o,
            vec![
                report("ns/a", Removal::Evicted),
                blocked,
                report("ns/c", Removal::Deleted(DeleteReason::MaxEvictRetries)),
                report("ns/d", Removal::AlreadyGone),
            ],
            Duration::from_secs(5),
        );
        assert!(err.is_none());
        assert_eq!(o.evicted, vec!["ns/a", "ns/b"]);
        assert_eq!(o.deleted.len(), 1);
        assert_eq!(o.deleted[0].reason, DeleteReason::MaxEvictRetries);
        assert_eq!(o.already_gone, vec!["ns/d"]);
        assert_eq!(o.pdb_blocks.len(), 1);
        assert!(
            o.summary()
                .contains("longest PodDisruptionBudget block: ns/budget")
        );
    }

    #[test]
    fn timeouts_list_every_remaining_pod() {
        let mut o = outcome();
        let err = fold_reports(
            &mut o,
            vec![
                report("ns/b", Removal::Evicted).fail(PodFailure::Timeout {
                    phase: Phase::WaitForDeletion,
                }),
                report("ns/a", Removal::NotRemoved).fail(PodFailure::Timeout {
                    phase: Phase::Evict,
                }),
            ],
            Duration::from_secs(5),
        );
        match err {
            Some(DrainError::Timeout {
                phase,
                remaining_pods,
                ..
            }) => {
                assert_eq!(phase, Phase::Evict);
                assert_eq!(remaining_pods, vec!["ns/a", "ns/b"]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_budget_blocking_until_the_timeout_is_named() {
        let mut o = outcome();
        let mut r = report("ns/a", Removal::Deleted(DeleteReason::Timeout));
        r.pdb_block = Some(PdbBlock {
            pod: "ns/a".into(),
            pdb: Some("ns/budget".into()),
            blocked_for: Duration::from_secs(9),
            refusals: 5,
            misconfigured: false,
        });
        let err = fold_reports(
            &mut o,
            vec![r.fail(PodFailure::Timeout {
                phase: Phase::WaitForDeletion,
            })],
            Duration::from_secs(10),
        );
        match err {
            Some(DrainError::BlockedByPdb {
                pdb, pod, since, ..
            }) => {
                assert_eq!(pdb.as_deref(), Some("ns/budget"));
                assert_eq!(pod, "ns/a");
                assert_eq!(since, Duration::from_secs(9));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(o.deleted[0].reason, DeleteReason::Timeout);
    }

    #[test]
    fn misconfigured_budgets_win_over_timeouts_and_volumes_are_merged() {
        let mut o = outcome();
        let err = fold_reports(
            &mut o,
            vec![
                report("ns/a", Removal::Evicted).fail(PodFailure::VolumeDetachTimeout {
                    volumes: vec!["vol-2".into()],
                    waited: Duration::from_secs(2),
                }),
                report("ns/b", Removal::NotRemoved).fail(PodFailure::Misconfigured {
                    pdb: "ns/budget".into(),
                    reason: MisconfiguredReason::MultipleBudgets,
                }),
            ],
            Duration::from_secs(5),
        );
        assert!(matches!(err, Some(DrainError::MisconfiguredPdb { .. })));

        let mut o = outcome();
        let err = fold_reports(
            &mut o,
            vec![
                report("ns/a", Removal::Evicted).fail(PodFailure::VolumeDetachTimeout {
                    volumes: vec!["vol-2".into()],
                    waited: Duration::from_secs(2),
                }),
                report("ns/c", Removal::Evicted).fail(PodFailure::VolumeDetachTimeout {
                    volumes: vec!["vol-1".into()],
                    waited: Duration::from_secs(3),
                }),
            ],
            Duration::from_secs(5),
        );
        match err {
            Some(DrainError::VolumeDetachTimeout {
                volumes, waited, ..
            }) => {
                assert_eq!(volumes, vec!["vol-1", "vol-2"]);
                assert_eq!(waited, Duration::from_secs(3));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
