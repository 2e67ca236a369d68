//! The second part of a reconcile, pure: from a [`Snapshot`], which of the machine's
//! deciders acts and with which step. The order between them is this file's:
//!
//! 1. the deletion of its Node deletes the Machine ([`node_gone`]);
//! 2. preservation ([`preserve::next`]), unless frozen;
//! 3. an in-place update ([`inplace::next`]), unless frozen, for a live machine with a Node;
//! 4. the lifecycle ([`decide::next_step`]).
//!
//! One of them acts per reconcile; each converges, so the next reconcile goes on where this
//! one stopped.

use mcm_api::{Machine, MachinePhase};

use super::announcement::{Announcement, Note};
use super::decide::{self, Probe, Step};
use super::inplace::{self, InPlaceStep};
use super::model::{NodeState, Snapshot};
use super::model::{Replacement, Topic};
use super::nodetemplate::{self, NodeWrite};
use super::preserve::{self, PreserveStep};
use super::{Settings, nodefinalizer, observe};

/// What one reconcile does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// The machine's Node was deleted: delete the Machine (which then drains what is left
    /// and deletes the VM).
    DeleteMachine,
    /// A preservation step.
    Preserve(PreserveStep),
    /// An in-place update step.
    InPlace(InPlaceStep),
    /// A lifecycle step.
    Lifecycle {
        /// The step.
        step: Step,
        /// The node template (and the Node finalizer, when the Node misses it) to write to
        /// the Node first.
        node_write: Option<NodeWrite>,
        /// What follows a drain pass that finishes the drain (a [`Step::DrainPass`] only).
        when_drained: WhenDrained,
    },
}

/// What follows a drain pass that finishes the drain, as the plan saw the deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhenDrained {
    /// The deletion's next step needs no wait: the VM is deleted in the same reconcile.
    DeleteVm,
    /// The next step waits (VolumeAttachments, hooks, a class to fix): record the drain.
    Record,
}

impl WhenDrained {
    /// What follows given how the drain ended: a drain that deleted pods without evicting
    /// them (their VM is dead) is recorded and announced before the VM goes, so that the
    /// Machine says why no budget was asked. Pure.
    pub(crate) fn after(self, without_eviction: bool) -> WhenDrained {
        if without_eviction {
            WhenDrained::Record
        } else {
            self
        }
    }
}

/// The machine's place among those a zone partition holds
/// (`mcm_machine_zone_partition_held_machines`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PartitionHold {
    /// Not a lifecycle decision: as it was.
    Unchanged,
    /// Held by the partition of this zone.
    Held(String),
    /// Not held.
    Released,
}

/// A [`Plan`] and the warnings announced whatever it is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// The warnings, one per [`Topic`], each announced once per machine and problem (a
    /// fixed problem is forgotten): a health annotation that does not parse; a preserve value
    /// on the Node that upstream does not allow (preservation is left as it is; the other
    /// deciders go on).
    pub announcements: Vec<Announcement>,
    /// Whether a zone partition holds the machine.
    pub partition_hold: PartitionHold,
    /// What to do.
    pub plan: Plan,
}

/// Decides one reconcile. Pure.
pub(crate) fn plan(s: &Snapshot, settings: &Settings) -> Decision {
    let (early, warn_preserve_value) = early_decider(s, settings);
    let plan = early.unwrap_or_else(|| {
        let observed = observed(s, settings);
        let step = replacement_step(decide::next_step(&observed, &s.cfg, s.now), &s.replacement);
        let when_drained = match step {
            Step::DrainPass { .. } if after_drain(s, settings) == Step::DeleteVm => {
                WhenDrained::DeleteVm
            }
            _ => WhenDrained::Record,
        };
        Plan::Lifecycle {
            node_write: node_write(s, &step),
            when_drained,
            step,
        }
    });
    let partition_hold = match &plan {
        Plan::Lifecycle {
            step: Step::HeldByPartition { partition, .. },
            ..
        } => PartitionHold::Held(partition.zone.clone()),
        Plan::Lifecycle { .. } => PartitionHold::Released,
        _ => PartitionHold::Unchanged,
    };
    Decision {
        announcements: vec![
            health_policy_warning(s.policy_problem.as_deref()),
            preserve_value_warning(&s.machine, warn_preserve_value.as_deref()),
        ],
        partition_hold,
        plan,
    }
}

/// A failure the deployment's replacement budget does not allow is held: throttled, or
/// waiting for the permit another reconcile holds. Pure.
fn replacement_step(step: Step, replacement: &Replacement) -> Step {
    match (step, replacement) {
        (Step::MarkFailed { .. }, Replacement::Busy) => Step::AwaitReplacementPermit,
        (Step::MarkFailed { reason }, Replacement::Throttled(throttled)) => {
            Step::ThrottleReplacement {
                throttled: throttled.clone(),
                reason,
            }
        }
        (step, _) => step,
    }
}

/// The node template (and the Node finalizer) to write before `step`: a Running machine
/// keeps its Node in line; any other step puts the finalizer on a Node that misses it
/// (unless frozen), with the template in the same write. Nothing while the store's copy of
/// the Node predates our own last write of it. Pure.
fn node_write(s: &Snapshot, step: &Step) -> Option<NodeWrite> {
    let node = s.node.as_deref().filter(|_| !s.node_copy_behind)?;
    let due = *step == Step::KeepRunning || (!s.frozen && nodefinalizer::to_add(&s.machine, node));
    due.then(|| nodetemplate::planned_write(&s.machine, node))
        .flatten()
}

/// Whether gather must ask the machine's deployment about a replacement: the lifecycle is
/// about to mark the machine Failed. `s` is taken without the verdict. Pure.
pub(crate) fn asks_replacement(s: &Snapshot, settings: &Settings) -> bool {
    match early_decider(s, settings) {
        (Some(_), _) => false,
        (None, _) => matches!(
            decide::next_step(&observed(s, settings), &s.cfg, s.now),
            Step::MarkFailed { .. }
        ),
    }
}

/// The warning about a health annotation that does not parse (none: forgotten). Pure.
fn health_policy_warning(problem: Option<&str>) -> Announcement {
    let note = problem.map(|p| {
        Note::warning(
            "InvalidHealthPolicy",
            "HealthCheck",
            format!("{p}; the flags' health rules apply instead"),
        )
    });
    Announcement::remembered(Topic::HealthPolicy, note)
}

/// The warning about a preserve value on the Node of `m` that upstream does not allow (none:
/// forgotten). Pure.
fn preserve_value_warning(m: &Machine, value: Option<&str>) -> Announcement {
    let note = value.map(|value| {
        Note::warning(
            "InvalidPreserveValue",
            "Preserve",
            format!(
                "annotation {}={value:?} on node {} is not one of now, when-failed, \
                 auto-preserved, false: preservation is left as it is",
                mcm_api::constants::annotations::PRESERVE,
                m.node_name().unwrap_or_default()
            ),
        )
    });
    Announcement::remembered(Topic::PreserveValue, note)
}

/// The driver question the plan of `s` depends on: none when a decider before the lifecycle
/// acts, else the lifecycle's ([`decide::probe_for`]). `s` is taken without answers. Pure.
pub(crate) fn probe(s: &Snapshot, settings: &Settings) -> Probe {
    match early_decider(s, settings) {
        (Some(_), _) => Probe::None,
        (None, _) => decide::probe_for(&observed(s, settings), &s.cfg),
    }
}

/// The lifecycle step that follows a drain of the machine of `s` that has just finished
/// (`s` was gathered before it): the deletion's next step as if the drain were recorded.
/// Pure.
fn after_drain(s: &Snapshot, settings: &Settings) -> Step {
    let mut observed = observed(s, settings);
    observed.deletion.drained = true;
    observed.deletion.drained_at = Some(s.now);
    decide::next_step(&observed, &s.cfg, s.now)
}

/// The deciders before the lifecycle, in their order: the plan if one of them acts, and the
/// invalid preserve value to warn about.
fn early_decider(s: &Snapshot, settings: &Settings) -> (Option<Plan>, Option<String>) {
    let m = &*s.machine;
    if node_gone(m, s.node_state, s.frozen) {
        return (Some(Plan::DeleteMachine), None);
    }
    // Not while frozen: the API servers may be unreachable.
    if s.frozen {
        return (None, None);
    }
    let node = s.node.as_deref();
    let health = node.map(|n| observe::health(n, &s.cfg));
    let facts = preserve::facts(
        m,
        node,
        health.as_ref(),
        &s.cfg,
        settings.defaults.preserve_timeout,
    );
    let mut warn = None;
    match preserve::next(&facts, s.now) {
        PreserveStep::Nothing => {}
        PreserveStep::InvalidNodeValue(value) => warn = Some(value),
        step => return (Some(Plan::Preserve(step)), None),
    }
    // An in-place update needs a Node (none without a target cluster).
    if let (Some(node), Some(health)) = (node, health)
        && m.metadata.deletion_timestamp.is_none()
        && m.phase().is_some()
    {
        let facts = inplace::facts(
            m,
            node,
            health.healthy(),
            &s.cfg,
            settings.defaults.inplace_timeout,
        );
        match inplace::next(&facts, s.now) {
            InPlaceStep::Nothing => {}
            step => return (Some(Plan::InPlace(step)), warn),
        }
    }
    (None, warn)
}

/// What the lifecycle decides from.
fn observed(s: &Snapshot, settings: &Settings) -> decide::Observed {
    observe::observe(
        &s.machine,
        &s.cfg,
        observe::Context {
            class: &s.class,
            node: s.node.as_deref(),
            frozen: s.frozen,
            failure_protected: s.protection.as_deref(),
            zone_partition: s.zone_partition.as_ref(),
            vm: &s.vm,
            attachments_left: s.attachments_left,
            target_cluster: settings.target_cluster,
        },
    )
}

/// Whether the deletion of its Node deletes `m`, as in the Go MCM: a Node being deleted
/// (held by the Node finalizer) deletes the machine in any phase, which then drains the
/// Node and deletes the VM before the Node object goes; a Node already gone deletes a machine
/// that had joined (Running or Unknown; before that its Node is only missing). Never a
/// machine already being deleted, nor while frozen. Pure.
pub(crate) fn node_gone(m: &Machine, node: NodeState, frozen: bool) -> bool {
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

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use jiff::Timestamp;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use mcm_api::constants::annotations::progress;
    use mcm_api::constants::{annotations, labels};
    use serde_json::json;

    use super::*;
    use crate::machine::announcement::Novelty;
    use crate::machine::decide::{MachineConfig, VmReport};
    use crate::machine::observe::Defaults;

    fn now() -> Timestamp {
        "2026-11-26T10:00:00Z".parse().unwrap()
    }

    /// Settings of these tests.
    pub(crate) fn settings() -> Settings {
        Settings {
            namespace: "ns".into(),
            defaults: Defaults {
                creation_timeout: Duration::from_secs(1200),
                health_timeout: Duration::from_secs(600),
                drain_timeout: Duration::from_secs(7200),
                max_evict_retries: 10,
                bad_conditions: vec![],
                preserve_timeout: Duration::from_secs(3600),
                inplace_timeout: Duration::from_secs(600),
                unhealthy_conditions: vec![],
                node_startup_timeout: None,
                hook_timeout: None,
                zone_partition: Default::default(),
            },
            pv_detach_timeout: Duration::from_secs(5),
            pv_reattach_timeout: Duration::from_secs(5),
            bootstrap_token_auth_extra_groups: String::new(),
            resource_exhausted_retry: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(2),
            eviction_retry_interval: Duration::from_secs(1),
            drain_parallelism: 4,
            resync: Duration::from_secs(600),
            target_cluster: true,
        }
    }

    /// A machine with a VM and Node `n1`, in `phase` for an hour; preserved `now` on request.
    fn machine(phase: &str, deleting: bool, preserve: bool) -> Machine {
        let an_hour_ago = now() - jiff::SignedDuration::from_secs(3600);
        let mut m: Machine = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns", "uid": "u1",
                "finalizers": [crate::machine::FINALIZER],
                "labels": {"node": "n1"},
                "annotations": {
                    "progress.machine.sapcloud.io/vm-requested": an_hour_ago.to_string()
                },
                "creationTimestamp": an_hour_ago.to_string(),
            },
            "spec": {"class": {"kind": "MachineClass", "name": "c"}, "providerID": "fake://m"},
            "status": {"currentStatus": {"phase": phase, "lastUpdateTime": an_hour_ago.to_string()}}
        }))
        .unwrap();
        if preserve {
            m.metadata
                .annotations
                .get_or_insert_default()
                .insert(annotations::PRESERVE.into(), "now".into());
        }
        if deleting {
            m.metadata.deletion_timestamp = Some(Time(now()));
        }
        m
    }

    /// Node `n1`, Ready or not; a candidate for an in-place update on request; with a preserve
    /// value upstream does not allow on request.
    fn node(ready: bool, candidate: bool, bad_preserve_value: bool) -> Node {
        let mut n: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {}, "annotations": {}},
            "status": {"conditions": [{
                "type": "Ready", "status": if ready { "True" } else { "False" },
                "lastTransitionTime": (now() - jiff::SignedDuration::from_secs(60)).to_string(),
            }]}
        }))
        .unwrap();
        if candidate {
            n.metadata
                .labels
                .get_or_insert_default()
                .insert(labels::CANDIDATE_FOR_UPDATE.into(), "true".into());
        }
        if bad_preserve_value {
            n.metadata
                .annotations
                .get_or_insert_default()
                .insert(annotations::PRESERVE.into(), "sometimes".into());
        }
        n
    }

    fn snapshot(m: Machine, node: Option<Node>, node_state: NodeState, frozen: bool) -> Snapshot {
        let cfg: MachineConfig = observe::machine_config_in(&m, None, &settings().defaults).0;
        Snapshot {
            machine: Arc::new(m),
            now: now(),
            frozen,
            node_state,
            cfg,
            policy_problem: None,
            class: Ok(()),
            node: node.map(Arc::new),
            protection: None,
            deployment: None,
            replacement: Replacement::NotAsked,
            permit: None,
            node_copy_behind: false,
            attachments_left: 0,
            vm: VmReport::NotAsked,
            zone_partition: None,
        }
    }

    /// Which decider a plan comes from.
    fn decider(p: &Plan) -> &'static str {
        match p {
            Plan::DeleteMachine => "node deleted",
            Plan::Preserve(_) => "preservation",
            Plan::InPlace(_) => "in-place",
            Plan::Lifecycle { .. } => "lifecycle",
        }
    }

    #[test]
    fn the_deciders_act_in_their_order() {
        use NodeState::*;
        // (case, phase, deleting, preserve due, in-place due, node state, frozen) -> decider
        let cases = [
            (
                "all due, Node deleting",
                "Running",
                false,
                true,
                true,
                Deleting,
                false,
                "node deleted",
            ),
            (
                "all due, Node gone",
                "Running",
                false,
                true,
                true,
                Gone,
                false,
                "node deleted",
            ),
            (
                "preservation and in-place due",
                "Running",
                false,
                true,
                true,
                Present,
                false,
                "preservation",
            ),
            (
                "preservation due",
                "Running",
                false,
                true,
                false,
                Present,
                false,
                "preservation",
            ),
            (
                "in-place due",
                "Running",
                false,
                false,
                true,
                Present,
                false,
                "in-place",
            ),
            (
                "nothing due",
                "Running",
                false,
                false,
                false,
                Present,
                false,
                "lifecycle",
            ),
            (
                "frozen: the node's deletion waits",
                "Running",
                false,
                true,
                true,
                Deleting,
                true,
                "lifecycle",
            ),
            (
                "frozen: preservation and in-place wait",
                "Running",
                false,
                true,
                true,
                Present,
                true,
                "lifecycle",
            ),
            (
                "deleting: no preservation, no in-place",
                "Terminating",
                true,
                true,
                true,
                Present,
                false,
                "lifecycle",
            ),
            (
                "deleting: the node's deletion is not repeated",
                "Terminating",
                true,
                false,
                false,
                Deleting,
                false,
                "lifecycle",
            ),
        ];
        for (case, phase, deleting, preserve, inplace, state, frozen, want) in cases {
            let n = node(true, inplace, false);
            let s = snapshot(machine(phase, deleting, preserve), Some(n), state, frozen);
            let d = plan(&s, &settings());
            assert_eq!(decider(&d.plan), want, "{case}: {:?}", d.plan);
        }
    }

    #[test]
    fn an_invalid_preserve_value_on_the_node_warns_and_the_next_decider_acts() {
        let s = snapshot(
            machine("Running", false, false),
            Some(node(true, true, true)),
            NodeState::Present,
            false,
        );
        let d = plan(&s, &settings());
        assert_eq!(decider(&d.plan), "in-place", "{:?}", d.plan);
        assert_preserve_warning(&d, "sometimes");
        let s = snapshot(
            machine("Running", false, false),
            Some(node(true, false, true)),
            NodeState::Present,
            false,
        );
        let d = plan(&s, &settings());
        assert_eq!(decider(&d.plan), "lifecycle", "{:?}", d.plan);
        assert_preserve_warning(&d, "sometimes");
    }

    /// `d` warns about the preserve value `value`.
    fn assert_preserve_warning(d: &Decision, value: &str) {
        let warning = d
            .announcements
            .iter()
            .find(|a| a.novelty == Novelty::Remembered(Topic::PreserveValue))
            .expect("a preserve value announcement");
        let text = &warning.notes.first().expect("a warning").text;
        assert!(text.contains(&format!("{value:?}")), "{text}");
    }

    #[test]
    fn a_health_problem_is_warned_about_and_no_problem_forgets_the_last() {
        let mut s = snapshot(
            machine("Running", false, false),
            Some(node(true, false, false)),
            NodeState::Present,
            false,
        );
        let warning = |d: &Decision| {
            d.announcements
                .iter()
                .find(|a| a.novelty == Novelty::Remembered(Topic::HealthPolicy))
                .map(|a| a.notes.len())
        };
        assert_eq!(warning(&plan(&s, &settings())), Some(0), "forgets");
        s.policy_problem = Some("bad value".into());
        assert_eq!(warning(&plan(&s, &settings())), Some(1), "warns");
    }

    #[test]
    fn the_driver_is_asked_only_where_its_answer_can_change_the_step() {
        // An Unknown machine whose node is not Ready: the fast path asks for the VM's state.
        let unknown = |preserve| {
            snapshot(
                machine("Unknown", false, preserve),
                Some(node(false, false, false)),
                NodeState::Present,
                false,
            )
        };
        assert_eq!(probe(&unknown(false), &settings()), Probe::VmStatus);
        // Preservation acts first: no question.
        assert_eq!(probe(&unknown(true), &settings()), Probe::None);
        // A Running machine: none.
        let running = snapshot(
            machine("Running", false, false),
            Some(node(true, false, false)),
            NodeState::Present,
            false,
        );
        assert_eq!(probe(&running, &settings()), Probe::None);
        // A machine whose drain is about to start: whether the VM still exists.
        let terminating = snapshot(
            machine("Terminating", true, false),
            Some(node(true, false, false)),
            NodeState::Present,
            false,
        );
        assert_eq!(probe(&terminating, &settings()), Probe::VmStatus);
        // Its Node deleted while Running: the machine is deleted, nothing asked.
        let node_deleted = snapshot(
            machine("Unknown", false, false),
            Some(node(false, false, false)),
            NodeState::Deleting,
            false,
        );
        assert_eq!(probe(&node_deleted, &settings()), Probe::None);
    }

    /// The lifecycle step of a decision.
    fn step(d: &Decision) -> &Step {
        match &d.plan {
            Plan::Lifecycle { step, .. } => step,
            other => panic!("not a lifecycle plan: {other:?}"),
        }
    }

    #[test]
    fn a_failure_waits_for_the_deployments_verdict() {
        // Unknown for an hour on a Node that is not Ready: past the health timeout.
        let failing = || {
            snapshot(
                machine("Unknown", false, false),
                Some(node(false, false, false)),
                NodeState::Present,
                false,
            )
        };
        assert!(asks_replacement(&failing(), &settings()));
        let running = snapshot(
            machine("Running", false, false),
            Some(node(true, false, false)),
            NodeState::Present,
            false,
        );
        assert!(!asks_replacement(&running, &settings()));
        // (verdict) -> step
        let cases = [
            (Replacement::NotAsked, "MarkFailed"),
            (Replacement::Allowed, "MarkFailed"),
            (Replacement::Busy, "AwaitReplacementPermit"),
            (
                Replacement::Throttled("budget used up".into()),
                "ThrottleReplacement",
            ),
        ];
        for (verdict, want) in cases {
            let mut s = failing();
            s.replacement = verdict.clone();
            let d = plan(&s, &settings());
            let got = format!("{:?}", step(&d));
            assert!(got.starts_with(want), "{verdict:?}: {got}");
            if let Step::ThrottleReplacement { throttled, reason } = step(&d) {
                assert_eq!(throttled, "budget used up");
                assert!(!reason.is_empty());
            }
        }
        // Any other step stays as it is.
        let mut s = running;
        s.replacement = Replacement::Throttled("x".into());
        assert_eq!(*step(&plan(&s, &settings())), Step::KeepRunning);
    }

    #[test]
    fn a_finished_drain_goes_on_to_the_vm_unless_pods_went_without_eviction() {
        assert_eq!(WhenDrained::DeleteVm.after(false), WhenDrained::DeleteVm);
        assert_eq!(WhenDrained::DeleteVm.after(true), WhenDrained::Record);
        assert_eq!(WhenDrained::Record.after(false), WhenDrained::Record);
        // A deletion whose drain runs: the VM goes next (no attachments, no hooks).
        let mut m = machine("Terminating", true, false);
        m.metadata.annotations.get_or_insert_default().insert(
            progress::DRAIN_STARTED.into(),
            (now() - jiff::SignedDuration::from_secs(5)).to_string(),
        );
        let mut s = snapshot(m, Some(node(true, false, false)), NodeState::Present, false);
        s.vm = VmReport::Present;
        let d = plan(&s, &settings());
        assert!(matches!(step(&d), Step::DrainPass { .. }), "{:?}", d.plan);
        assert!(
            matches!(
                d.plan,
                Plan::Lifecycle {
                    when_drained: WhenDrained::DeleteVm,
                    ..
                }
            ),
            "{:?}",
            d.plan
        );
        // VolumeAttachments left: the drain is recorded, the attachments go next.
        s.attachments_left = 1;
        let d = plan(&s, &settings());
        assert!(
            matches!(
                d.plan,
                Plan::Lifecycle {
                    when_drained: WhenDrained::Record,
                    ..
                }
            ),
            "{:?}",
            d.plan
        );
    }

    #[test]
    fn the_node_is_written_for_its_template_or_finalizer_unless_its_copy_is_behind() {
        let with_template = || {
            let mut m = machine("Running", false, false);
            m.spec.node_template = Some(
                serde_json::from_value(json!({
                    "metadata": { "labels": { "pool": "a" } }
                }))
                .unwrap(),
            );
            m
        };
        // (case, machine, frozen, copy behind) -> a write
        let cases = [
            (
                "a Running machine's template differs",
                with_template(),
                false,
                false,
                true,
            ),
            (
                "the copy predates our write",
                with_template(),
                false,
                true,
                false,
            ),
            (
                "frozen, Running: its Node is still kept in line",
                with_template(),
                true,
                false,
                true,
            ),
            (
                "frozen, Pending: the finalizer waits",
                machine("Pending", false, false),
                true,
                false,
                false,
            ),
            (
                "nothing differs, the finalizer missing",
                machine("Running", false, false),
                false,
                false,
                true,
            ),
        ];
        for (case, m, frozen, behind, want) in cases {
            let mut s = snapshot(
                m,
                Some(node(true, false, false)),
                NodeState::Present,
                frozen,
            );
            s.node_copy_behind = behind;
            let d = plan(&s, &settings());
            let wrote = matches!(
                d.plan,
                Plan::Lifecycle {
                    node_write: Some(_),
                    ..
                }
            );
            assert_eq!(wrote, want, "{case}: {:?}", d.plan);
        }
    }

    #[test]
    fn a_lifecycle_decision_says_whether_a_partition_holds_the_machine() {
        let s = snapshot(
            machine("Running", false, false),
            Some(node(true, false, false)),
            NodeState::Present,
            false,
        );
        assert_eq!(
            plan(&s, &settings()).partition_hold,
            PartitionHold::Released
        );
        let s = snapshot(
            machine("Running", false, true),
            Some(node(true, false, false)),
            NodeState::Present,
            false,
        );
        assert_eq!(
            plan(&s, &settings()).partition_hold,
            PartitionHold::Unchanged,
            "preservation acts"
        );
    }

    fn bare(phase: Option<&str>, deleting: bool) -> Machine {
        let mut m: Machine = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m", "labels": { "node": "n" } },
            "spec": {},
            "status": { "currentStatus": { "phase": phase } }
        }))
        .unwrap();
        if deleting {
            m.metadata.deletion_timestamp = Some(Time(now()));
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
                node_gone(&bare(phase, deleting), present, frozen),
                want,
                "{phase:?} deleting={deleting} present={present:?} frozen={frozen}"
            );
        }
    }
}
