//! The deletion drain's decisions from one pass (pure): where the drain stands, what the
//! Machine records and which Events tell of it, which progress is written, and when the
//! next pass comes ([`verdict`]); and for a finished drain, what is recorded and told
//! ([`Drained`]). The pass itself runs in [`act`](super::act), which carries the verdict
//! out: the pass's report is the outcome that decides what follows.

use std::time::Duration;

use mcm_api::MachineOperationType;
use mcm_api::constants::annotations::progress;

use super::announcement::{Announcement, Note, Target};
use super::status::Operation;

/// Longest pause between drain passes while pods terminate or volumes detach.
pub(crate) const DRAIN_WAIT_RECHECK: Duration = Duration::from_secs(5);

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

/// What a pass was told, and of its machine and node, for its verdict.
#[derive(Debug, Clone)]
pub(crate) struct PassFacts<'a> {
    /// The Machine's name.
    pub machine: String,
    /// The Node's name.
    pub node: String,
    /// The first pass of the drain.
    pub first: bool,
    /// Why the node's pods run nowhere (its VM is dead), if they do.
    pub vm_dead: Option<&'a str>,
    /// Why the drain is forced, if it is.
    pub force_reason: Option<&'a str>,
    /// Time since no pod was left, if so.
    pub pods_gone_for: Option<Duration>,
    /// `--machine-eviction-retry-interval` (the pace of a drain a budget blocks).
    pub eviction_retry_interval: Duration,
}

/// Where a pass of a deletion's drain leaves the machine.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one value per drain pass, carried out at once"
)]
pub(crate) enum DrainVerdict {
    /// The node is drained (or gone); nothing is recorded yet.
    Drained(Drained),
    /// Pods or volumes are left: write the progress, tell the start, record where the drain
    /// stands, come back after `requeue`.
    Wait {
        /// Progress annotations to set to now.
        progress_keys: Vec<&'static str>,
        /// The node's `DrainStarted` Event (first pass).
        started: Option<Announcement>,
        /// The pass's record and its Events (new ones only).
        record: Announcement,
        /// A PodDisruptionBudget refused an eviction.
        blocked: bool,
        /// When the next pass comes.
        requeue: Duration,
    },
}

/// A finished drain, as the pass that finished it saw it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Drained {
    machine: String,
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

/// The verdict on a pass of a deletion's drain from its `report`. Pure.
pub(crate) fn verdict(f: &PassFacts<'_>, report: &mcm_drain::PassReport) -> DrainVerdict {
    let mut summary = report.summary();
    let without_eviction = f.vm_dead.is_some()
        && report
            .deleted
            .iter()
            .any(|d| d.reason == mcm_drain::DeleteReason::VmDead);
    if let Some(why) = f.vm_dead {
        summary.push_str(&format!(
            " (pods deleted, not evicted: {why}, so they run nowhere; a PodDisruptionBudget \
             guards running pods only)"
        ));
    } else if let Some(why) = f.force_reason {
        summary.push_str(&format!(" (forced: {why})"));
    }
    let description = format!("Drain of node {}: {summary}", f.node);
    let state = report.state();
    let blocked = !report.blocked.is_empty() || !report.misconfigured.is_empty();
    // An unknown drain rule value is in the summary; a Warning per pod and value goes to the
    // node with the pass's record (when that is new, not at every pass).
    let on_node = Target::Node(f.node.clone());
    let invalid: Vec<Note> = report
        .invalid_rules
        .iter()
        .map(|bad| Note::warning("DrainRuleInvalid", "Delete", bad.to_string()).on(on_node.clone()))
        .collect();
    use mcm_drain::PassState;
    if let PassState::Done | PassState::NodeGone = state {
        let acted =
            !report.evicted.is_empty() || !report.deleted.is_empty() || !report.released.is_empty();
        return DrainVerdict::Drained(Drained {
            machine: f.machine.clone(),
            node: f.node.clone(),
            first: f.first,
            acted,
            node_drained: state == PassState::Done,
            without_eviction,
            description,
            summary,
            invalid,
        });
    }
    // The progress this pass makes, written in one patch: the start of the drain (first
    // pass), all pods gone (the volume wait counts from there).
    let mut progress_keys = Vec::new();
    if f.first {
        progress_keys.push(progress::DRAIN_STARTED);
    }
    if state == PassState::Volumes && f.pods_gone_for.is_none() {
        progress_keys.push(progress::PODS_DRAINED);
    }
    // One Event on the node says why it is cordoned and pods leave it; the Machine's
    // lastOperation has every step.
    let started = f.first.then(|| {
        let note = format!(
            "cordoned; draining for the deletion of machine {}",
            f.machine
        );
        Announcement::events(vec![
            Note::normal("DrainStarted", "Delete", note).on(on_node.clone()),
        ])
    });
    let blocked = state == PassState::Pods && blocked;
    let mut notes = invalid;
    if blocked {
        notes.push(Note::warning(
            "DrainBlockedByPDB",
            "Drain",
            description.clone(),
        ));
        notes.push(Note::warning("DrainBlockedByPDB", "Delete", summary).on(on_node));
    }
    let requeue = if blocked {
        f.eviction_retry_interval
    } else {
        f.eviction_retry_interval.min(DRAIN_WAIT_RECHECK)
    };
    DrainVerdict::Wait {
        progress_keys,
        started,
        record: deletion_step(description, notes),
        blocked,
        requeue,
    }
}

/// A step of the deletion (the phase stays) told by `notes` when it is new.
pub(crate) fn deletion_step(description: String, notes: Vec<Note>) -> Announcement {
    let op = Operation::processing(MachineOperationType::Delete, description);
    Announcement::record(None, op, notes)
}

impl Drained {
    /// Whether the drain has something to tell: pods were moved (in this pass, or in earlier
    /// ones: a drain that took more than one pass). An empty node's drain tells nothing the
    /// deletion's own Event does not.
    fn tells(&self) -> bool {
        self.acted || !self.first
    }

    /// The Events of the finished drain: `Drained` on the Machine when it tells, the
    /// warnings about drain rules, and when it tells, `Drained` on the node, and when it
    /// finished in its first pass after moving pods, the node's `DrainStarted` (which a drain
    /// that waits publishes with its first pass).
    fn notes(&self) -> Vec<Note> {
        let on_node = Target::Node(self.node.clone());
        let mut notes = Vec::new();
        if self.tells() {
            notes.push(Note::normal("Drained", "Drain", self.description.clone()));
        }
        notes.extend(self.invalid.iter().cloned());
        if !self.tells() {
            return notes;
        }
        if self.first && self.acted {
            let note = format!(
                "cordoned and drained for the deletion of machine {}: {}",
                self.machine, self.summary
            );
            notes.push(Note::normal("DrainStarted", "Delete", note).on(on_node.clone()));
        }
        if self.node_drained {
            notes.push(Note::normal("Drained", "Delete", self.summary.clone()).on(on_node));
        }
        notes
    }

    /// The deletion goes on in this reconcile: nothing is recorded (a crash before the VM is
    /// deleted repeats a pass that finds the node drained), the Events are told.
    pub(crate) fn going_on(&self) -> Announcement {
        Announcement::events(self.notes())
    }

    /// The deletion's next step waits: the drain is recorded (and told when new).
    pub(crate) fn recorded(&self) -> Announcement {
        deletion_step(self.description.clone(), self.notes())
    }

    /// The progress a recorded drain writes: drained, and its start when it finished in its
    /// first pass.
    pub(crate) fn recorded_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.first {
            keys.push(progress::DRAIN_STARTED);
        }
        keys.push(progress::DRAINED);
        keys
    }
}

#[cfg(test)]
mod tests {
    use mcm_drain::{
        DeleteReason, DeletedPod, MisconfiguredBudget, MisconfiguredReason, PassReport, PassState,
    };

    use super::*;

    fn facts(first: bool, vm_dead: Option<&str>) -> PassFacts<'_> {
        PassFacts {
            machine: "m".into(),
            node: "n".into(),
            first,
            vm_dead,
            force_reason: None,
            pods_gone_for: None,
            eviction_retry_interval: Duration::from_secs(20),
        }
    }

    fn report(state: PassState, f: impl FnOnce(&mut PassReport)) -> PassReport {
        let mut r = PassReport {
            state: Some(state),
            ..Default::default()
        };
        f(&mut r);
        r
    }

    fn budget(r: &mut PassReport) {
        r.misconfigured.push(MisconfiguredBudget {
            pod: "ns/p".into(),
            pdb: "ns/b".into(),
            reason: MisconfiguredReason::MultipleBudgets,
        });
    }

    /// The reasons of the Events of an announcement, `node:` marking the node's.
    fn reasons(a: &Announcement) -> Vec<String> {
        a.notes
            .iter()
            .map(|n| match n.target {
                Target::Node(_) => format!("node:{}", n.reason),
                _ => n.reason.to_string(),
            })
            .collect()
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

    #[test]
    fn a_pass_that_leaves_pods_or_volumes_records_where_it_stands() {
        // (case, first, report) -> (progress keys, DrainStarted, blocked, requeue, Events)
        type Case = (
            &'static str,
            bool,
            PassReport,
            Vec<&'static str>,
            bool,
            bool,
            u64,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "first pass, pods terminating",
                true,
                report(PassState::Pods, |r| r.terminating.push("ns/p".into())),
                vec![progress::DRAIN_STARTED],
                true,
                false,
                5,
                vec![],
            ),
            (
                "a budget refuses",
                false,
                report(PassState::Pods, budget),
                vec![],
                false,
                true,
                20,
                vec!["DrainBlockedByPDB", "node:DrainBlockedByPDB"],
            ),
            (
                "pods gone, volumes attached",
                false,
                report(PassState::Volumes, |r| r.attached_volumes.push("v".into())),
                vec![progress::PODS_DRAINED],
                false,
                false,
                5,
                vec![],
            ),
        ];
        for (case, first, r, keys, started, want_blocked, secs, events) in cases {
            let DrainVerdict::Wait {
                progress_keys,
                started: s,
                record,
                blocked,
                requeue,
            } = verdict(&facts(first, None), &r)
            else {
                panic!("{case}: not waiting");
            };
            assert_eq!(progress_keys, keys, "{case}");
            assert_eq!(s.is_some(), started, "{case}");
            assert_eq!(blocked, want_blocked, "{case}");
            assert_eq!(requeue, Duration::from_secs(secs), "{case}");
            assert_eq!(reasons(&record), events, "{case}");
            assert!(
                record
                    .op
                    .as_ref()
                    .is_some_and(|o| o.description.starts_with("Drain of node n: ")),
                "{case}: {record:?}"
            );
        }
    }

    #[test]
    fn a_finished_drain_tells_what_it_moved_and_why_no_budget_was_asked() {
        let empty = report(PassState::Done, |_| {});
        let DrainVerdict::Drained(d) = verdict(&facts(true, None), &empty) else {
            panic!("not drained");
        };
        assert!(!d.without_eviction);
        assert!(d.going_on().notes.is_empty(), "an empty node tells nothing");
        assert_eq!(
            d.recorded_keys(),
            vec![progress::DRAIN_STARTED, progress::DRAINED]
        );
        let dead = report(PassState::Done, |r| {
            r.deleted.push(DeletedPod {
                pod: "ns/p".into(),
                reason: DeleteReason::VmDead,
            })
        });
        let DrainVerdict::Drained(d) = verdict(&facts(false, Some("its VM is gone")), &dead) else {
            panic!("not drained");
        };
        assert!(d.without_eviction);
        assert_eq!(
            reasons(&d.recorded()),
            vec!["Drained", "node:Drained"],
            "a drain of several passes tells"
        );
        let text = &d.recorded().op.expect("a record").description;
        assert!(
            text.contains("pods deleted, not evicted: its VM is gone"),
            "{text}"
        );
        assert_eq!(d.recorded_keys(), vec![progress::DRAINED]);
    }
}
