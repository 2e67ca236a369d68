//! Pure decisions about the pods on a node: which to drain, which to leave, in which order.
//!
//! # Drain rules per pod
//!
//! A pod chooses how the drain treats it with the label or annotation
//! [`DRAIN_BEHAVIOR_KEY`] (`drain.machine.sapcloud.io/behavior`), or Cluster API's label
//! [`CAPI_DRAIN_LABEL`] (`cluster.x-k8s.io/drain`), with one of the [`DrainBehavior`] values:
//! `drain` (the default), `skip` or `wait-completed` ([`DrainBehavior::parse`]).
//!
//! Precedence: the first of these that is set decides, in this order: the label
//! [`DRAIN_BEHAVIOR_KEY`], the annotation [`DRAIN_BEHAVIOR_KEY`], the label
//! [`CAPI_DRAIN_LABEL`] (so a pod's own label wins over its annotation when they disagree, and
//! the MCM keys win over Cluster API's). An unknown value in the deciding key means `drain`
//! (the safe default); every unknown value on the pod, deciding or not, is reported
//! ([`invalid_drain_rules`]) so the caller can emit a Warning.
//!
//! Mirror and DaemonSet pods are skipped whatever their rule says. A `wait-completed` pod is
//! never evicted: the drain waits until it finished (phase `Succeeded`/`Failed`) or is gone;
//! what happens in force mode or on an unreachable node is [`wait_completed_step`]'s rule.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;

use crate::outcome::{DeleteReason, SkipReason};

/// Annotation the kubelet puts on the mirror pod of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Pod label or annotation choosing how the drain treats the pod (see [`DrainBehavior`]):
/// `drain` (default), `skip` or `wait-completed`.
pub const DRAIN_BEHAVIOR_KEY: &str = "drain.machine.sapcloud.io/behavior";

/// Cluster API's pod label (`skip` or `wait-completed`), honoured for compatibility.
pub const CAPI_DRAIN_LABEL: &str = "cluster.x-k8s.io/drain";

/// How the drain treats a pod, as chosen by its drain rule (Cluster API's MachineDrainRule
/// behaviours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainBehavior {
    /// Evict it (the default).
    Drain,
    /// Leave it on the node: never evicted or deleted, not waited for.
    Skip,
    /// Never evict or delete it; the drain is not finished until it has finished (phase
    /// `Succeeded` or `Failed`) or is gone. See [`wait_completed_step`] for force mode.
    WaitCompleted,
}

impl DrainBehavior {
    /// Parses a rule value: `drain`, `skip`, `wait-completed`, ASCII case-insensitively
    /// (Cluster API's spellings `Drain`, `Skip`, `WaitCompleted` are accepted too). `None`
    /// for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "drain" => Some(DrainBehavior::Drain),
            "skip" => Some(DrainBehavior::Skip),
            "wait-completed" | "waitcompleted" => Some(DrainBehavior::WaitCompleted),
            _ => None,
        }
    }
}

impl fmt::Display for DrainBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DrainBehavior::Drain => "drain",
            DrainBehavior::Skip => "skip",
            DrainBehavior::WaitCompleted => "wait-completed",
        })
    }
}

/// Where a pod's drain rule comes from, in order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleSource {
    /// The label [`DRAIN_BEHAVIOR_KEY`].
    Label,
    /// The annotation [`DRAIN_BEHAVIOR_KEY`].
    Annotation,
    /// Cluster API's label [`CAPI_DRAIN_LABEL`].
    ClusterApiLabel,
}

impl fmt::Display for RuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleSource::Label => write!(f, "label {DRAIN_BEHAVIOR_KEY}"),
            RuleSource::Annotation => write!(f, "annotation {DRAIN_BEHAVIOR_KEY}"),
            RuleSource::ClusterApiLabel => write!(f, "label {CAPI_DRAIN_LABEL}"),
        }
    }
}

/// The drain rule that decides for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainRule {
    /// The behaviour (`Drain` when the value is unknown).
    pub behavior: DrainBehavior,
    /// Where it was set.
    pub source: RuleSource,
}

/// A drain rule value the drain does not know (the pod is drained as usual).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDrainRule {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Where the value was set.
    pub source: RuleSource,
    /// The value.
    pub value: String,
}

impl fmt::Display for InvalidDrainRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pod {} has {} with unknown value {:?} (drained as usual; valid: drain, skip, wait-completed)",
            self.pod, self.source, self.value
        )
    }
}

/// The rule values set on a pod, in order of precedence.
fn rule_values(pod: &Pod) -> impl Iterator<Item = (RuleSource, &str)> {
    let label = |key: &str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
    };
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAIN_BEHAVIOR_KEY))
        .map(String::as_str);
    [
        (RuleSource::Label, label(DRAIN_BEHAVIOR_KEY)),
        (RuleSource::Annotation, annotation),
        (RuleSource::ClusterApiLabel, label(CAPI_DRAIN_LABEL)),
    ]
    .into_iter()
    .filter_map(|(source, value)| value.map(|v| (source, v)))
}

/// The rule deciding for the pod: the first key set (label, annotation, Cluster API label);
/// an unknown value there means [`DrainBehavior::Drain`]. `None` when no key is set.
pub fn drain_rule(pod: &Pod) -> Option<DrainRule> {
    rule_values(pod).next().map(|(source, value)| DrainRule {
        behavior: DrainBehavior::parse(value).unwrap_or(DrainBehavior::Drain),
        source,
    })
}

/// Every unknown rule value on the pod, the deciding one and those it overrides.
pub fn invalid_drain_rules(pod: &Pod) -> Vec<InvalidDrainRule> {
    rule_values(pod)
        .filter(|(_, value)| DrainBehavior::parse(value).is_none())
        .map(|(source, value)| InvalidDrainRule {
            pod: pod_key(pod),
            source,
            value: value.to_string(),
        })
        .collect()
}

/// Where the drain stands, for the rules that depend on it ([`wait_completed_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DrainMode {
    /// Force mode: pods are deleted instead of evicted.
    pub force: bool,
    /// The node is unreachable (its kubelet stopped reporting).
    pub unreachable: bool,
    /// The drain timeout has passed.
    pub timed_out: bool,
    /// The driver reports the node's VM gone or stopped.
    pub vm_dead: bool,
}

/// What a drain pass does with a running pod under a `wait-completed` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCompletedStep {
    /// Leave it alone and wait for it to finish.
    Wait,
    /// Leave it alone and do not wait: it can never finish.
    Release,
    /// Delete it like any other pod (grace period 0).
    Delete(DeleteReason),
}

/// The rule for `wait-completed` pods (pure):
/// - when the driver reports the node's VM gone or stopped, it is deleted
///   ([`DeleteReason::VmDead`]): nothing runs it, it can never finish;
/// - once the drain timeout has passed, the pod is deleted like any other pod (reason
///   [`DeleteReason::Force`] in force mode, else [`DeleteReason::Timeout`]): the drain timeout
///   bounds every wait, as Cluster API's `nodeDrainTimeout` does;
/// - before that, on an unreachable node it is not waited for (its kubelet cannot report it
///   finished) and left to the pod garbage collector;
/// - otherwise it is waited for, in force mode too (the force-deletion label, a node NotReady
///   for 5 minutes): force mode does not override a `wait-completed` rule before the timeout.
pub fn wait_completed_step(mode: DrainMode) -> WaitCompletedStep {
    if mode.vm_dead {
        // It can never finish: nothing runs it any more.
        WaitCompletedStep::Delete(DeleteReason::VmDead)
    } else if mode.timed_out {
        WaitCompletedStep::Delete(if mode.force {
            DeleteReason::Force
        } else {
            DeleteReason::Timeout
        })
    } else if mode.unreachable {
        WaitCompletedStep::Release
    } else {
        WaitCompletedStep::Wait
    }
}

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    /// Leave it on the node.
    Skip(SkipReason),
    /// Evict it (or delete it), then wait for it to disappear.
    Drain,
    /// It is terminating already (e.g. a previous drain evicted it): only wait for it.
    WaitOnly,
    /// A `wait-completed` rule: never evict it, wait until it finished or is gone (see
    /// [`wait_completed_step`] for force mode and unreachable nodes).
    WaitCompleted,
}

/// Decides what to do with a pod bound to the node being drained, in this order: mirror and
/// DaemonSet pods stay; a `skip` rule keeps the pod ([`SkipReason::DrainRule`]); finished pods
/// stay; a `wait-completed` rule is [`PodAction::WaitCompleted`] (terminating or not);
/// terminating pods are only waited for; every other pod is drained (an unknown rule value
/// included, see [`invalid_drain_rules`]).
pub fn classify_pod(pod: &Pod) -> PodAction {
    if is_mirror_pod(pod) {
        return PodAction::Skip(SkipReason::MirrorPod);
    }
    if is_daemonset_pod(pod) {
        return PodAction::Skip(SkipReason::DaemonSet);
    }
    let rule = drain_rule(pod);
    if let Some(DrainRule {
        behavior: DrainBehavior::Skip,
        source,
    }) = rule
    {
        return PodAction::Skip(SkipReason::DrainRule(source));
    }
    if is_finished(pod) {
        return PodAction::Skip(SkipReason::Finished);
    }
    if rule.is_some_and(|r| r.behavior == DrainBehavior::WaitCompleted) {
        return PodAction::WaitCompleted;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodAction::WaitOnly;
    }
    PodAction::Drain
}

/// A mirror pod carries the kubelet's mirror annotation.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// A DaemonSet pod has a controller owner reference of kind `DaemonSet`.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind == "DaemonSet" && o.api_version.starts_with("apps/")
    })
}

/// A pod in phase `Succeeded` or `Failed`.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The priority used for ordering (`spec.priority`, 0 when unset).
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Groups pods into waves of equal priority, lowest priority first, so the most critical pods
/// are evicted last. Within a wave, pods are ordered by `namespace/name`.
pub fn priority_waves(pods: Vec<Pod>) -> Vec<Vec<Pod>> {
    let mut by_priority: BTreeMap<i32, Vec<Pod>> = BTreeMap::new();
    for pod in pods {
        by_priority.entry(pod_priority(&pod)).or_default().push(pod);
    }
    by_priority
        .into_values()
        .map(|mut wave| {
            wave.sort_by_key(pod_key);
            wave
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        p
    }

    fn owned_by(mut p: Pod, kind: &str, controller: bool) -> Pod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "owner".into(),
            uid: "uid".into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }]);
        p
    }

    fn with_priority(mut p: Pod, priority: Option<i32>) -> Pod {
        p.spec = Some(PodSpec {
            priority,
            ..Default::default()
        });
        p
    }

    #[test]
    fn plain_and_replicaset_pods_are_drained() {
        assert_eq!(classify_pod(&pod("a")), PodAction::Drain);
        assert_eq!(
            classify_pod(&owned_by(pod("a"), "ReplicaSet", true)),
            PodAction::Drain
        );
    }

    #[test]
    fn mirror_pods_are_skipped() {
        let mut p = pod("a");
        p.metadata.annotations = Some([(MIRROR_POD_ANNOTATION.into(), "hash".into())].into());
        assert_eq!(classify_pod(&p), PodAction::Skip(SkipReason::MirrorPod));
    }

    #[test]
    fn daemonset_pods_are_skipped_only_when_controlled() {
        assert_eq!(
            classify_pod(&owned_by(pod("a"), "DaemonSet", true)),
            PodAction::Skip(SkipReason::DaemonSet)
        );
        // A non-controller reference to a DaemonSet does not make it a DaemonSet pod.
        assert_eq!(
            classify_pod(&owned_by(pod("a"), "DaemonSet", false)),
            PodAction::Drain
        );
    }

    #[test]
    fn finished_pods_are_skipped() {
        for phase in ["Succeeded", "Failed"] {
            let mut p = pod("a");
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            assert_eq!(classify_pod(&p), PodAction::Skip(SkipReason::Finished));
        }
        let mut pending = pod("a");
        pending.status = None;
        assert_eq!(classify_pod(&pending), PodAction::Drain);
    }

    #[test]
    fn terminating_pods_are_only_waited_for() {
        let mut p = pod("a");
        p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(classify_pod(&p), PodAction::WaitOnly);
    }

    fn labelled(mut p: Pod, key: &str, value: &str) -> Pod {
        p.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        p
    }

    fn annotated(mut p: Pod, key: &str, value: &str) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        p
    }

    const NORMAL: DrainMode = DrainMode {
        force: false,
        unreachable: false,
        timed_out: false,
        vm_dead: false,
    };
    const FORCE: DrainMode = DrainMode {
        force: true,
        ..NORMAL
    };
    const UNREACHABLE: DrainMode = DrainMode {
        unreachable: true,
        ..NORMAL
    };
    const FORCE_UNREACHABLE: DrainMode = DrainMode {
        force: true,
        unreachable: true,
        ..NORMAL
    };
    const TIMED_OUT: DrainMode = DrainMode {
        timed_out: true,
        ..NORMAL
    };
    const FORCE_TIMED_OUT: DrainMode = DrainMode {
        force: true,
        timed_out: true,
        ..NORMAL
    };
    const VM_DEAD_UNREACHABLE: DrainMode = DrainMode {
        vm_dead: true,
        unreachable: true,
        ..NORMAL
    };

    /// What happens to a running pod in a mode, in words: classification, then the
    /// `wait-completed` rule (the other actions do not depend on the mode here).
    fn handling(pod: &Pod, mode: DrainMode) -> String {
        match classify_pod(pod) {
            PodAction::Skip(reason) => format!("skip: {reason}"),
            PodAction::Drain => "drain".into(),
            PodAction::WaitOnly => "wait-only".into(),
            PodAction::WaitCompleted => match wait_completed_step(mode) {
                WaitCompletedStep::Wait => "wait-completed".into(),
                WaitCompletedStep::Release => "release".into(),
                WaitCompletedStep::Delete(reason) => format!("delete: {reason}"),
            },
        }
    }

    #[test]
    fn behaviours_by_mode() {
        let label = |v| labelled(pod("a"), DRAIN_BEHAVIOR_KEY, v);
        let annotation = |v| annotated(pod("a"), DRAIN_BEHAVIOR_KEY, v);
        let capi = |v| labelled(pod("a"), CAPI_DRAIN_LABEL, v);
        let skip_label = "skip: drain rule skip (label drain.machine.sapcloud.io/behavior)";
        let skip_annotation =
            "skip: drain rule skip (annotation drain.machine.sapcloud.io/behavior)";
        let skip_capi = "skip: drain rule skip (label cluster.x-k8s.io/drain)";
        let modes = [
            NORMAL,
            FORCE,
            UNREACHABLE,
            FORCE_UNREACHABLE,
            TIMED_OUT,
            FORCE_TIMED_OUT,
            VM_DEAD_UNREACHABLE,
        ];
        // (pod, expected per mode in the order of `modes`)
        let table: Vec<(Pod, [&str; 7])> = vec![
            (pod("a"), ["drain"; 7]),
            (label("drain"), ["drain"; 7]),
            (label("skip"), [skip_label; 7]),
            (annotation("skip"), [skip_annotation; 7]),
            (capi("skip"), [skip_capi; 7]),
            (capi("Skip"), [skip_capi; 7]),
            (label("bogus"), ["drain"; 7]),
            (annotation(""), ["drain"; 7]),
        ];
        for (p, expected) in &table {
            for (mode, want) in modes.iter().zip(expected) {
                assert_eq!(&handling(p, *mode), want, "{:?} in {mode:?}", p.metadata);
            }
        }
        let wait = [
            "wait-completed",
            "wait-completed",
            "release",
            "release",
            "delete: drain timeout reached",
            "delete: force mode",
            "delete: its VM is gone or stopped",
        ];
        for p in [
            label("wait-completed"),
            annotation("wait-completed"),
            capi("wait-completed"),
            capi("WaitCompleted"),
            label("Wait-Completed"),
        ] {
            for (mode, want) in modes.iter().zip(wait) {
                assert_eq!(handling(&p, *mode), want, "{:?} in {mode:?}", p.metadata);
            }
        }
    }

    #[test]
    fn mirror_daemonset_and_finished_pods_keep_their_reasons() {
        let skip = |p| labelled(p, DRAIN_BEHAVIOR_KEY, "wait-completed");
        let mut mirror = pod("a");
        mirror.metadata.annotations = Some([(MIRROR_POD_ANNOTATION.into(), "h".into())].into());
        assert_eq!(
            classify_pod(&skip(mirror)),
            PodAction::Skip(SkipReason::MirrorPod)
        );
        assert_eq!(
            classify_pod(&skip(owned_by(pod("a"), "DaemonSet", true))),
            PodAction::Skip(SkipReason::DaemonSet)
        );
        // A wait-completed pod that finished is done: nothing to wait for.
        let mut done = skip(pod("a"));
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(classify_pod(&done), PodAction::Skip(SkipReason::Finished));
        // A skip rule wins over "finished" (it stays either way).
        done.metadata.labels = Some([(DRAIN_BEHAVIOR_KEY.into(), "skip".into())].into());
        assert_eq!(
            classify_pod(&done),
            PodAction::Skip(SkipReason::DrainRule(RuleSource::Label))
        );
        // A terminating wait-completed pod is still only waited for, never deleted.
        let mut terminating = skip(pod("a"));
        terminating.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(classify_pod(&terminating), PodAction::WaitCompleted);
    }

    #[test]
    fn label_wins_over_annotation_which_wins_over_cluster_api() {
        let both = annotated(
            labelled(pod("a"), DRAIN_BEHAVIOR_KEY, "drain"),
            DRAIN_BEHAVIOR_KEY,
            "skip",
        );
        assert_eq!(
            drain_rule(&both),
            Some(DrainRule {
                behavior: DrainBehavior::Drain,
                source: RuleSource::Label
            })
        );
        assert_eq!(classify_pod(&both), PodAction::Drain);

        let annotation_and_capi = labelled(
            annotated(pod("a"), DRAIN_BEHAVIOR_KEY, "wait-completed"),
            CAPI_DRAIN_LABEL,
            "skip",
        );
        assert_eq!(classify_pod(&annotation_and_capi), PodAction::WaitCompleted);
        assert_eq!(drain_rule(&pod("a")), None);
    }

    #[test]
    fn unknown_values_mean_drain_and_are_all_reported() {
        // The label decides (unknown: drain) and the annotation it overrides is reported too.
        let p = annotated(
            labelled(pod("a"), DRAIN_BEHAVIOR_KEY, "never"),
            DRAIN_BEHAVIOR_KEY,
            "sometimes",
        );
        assert_eq!(
            drain_rule(&p),
            Some(DrainRule {
                behavior: DrainBehavior::Drain,
                source: RuleSource::Label
            })
        );
        assert_eq!(classify_pod(&p), PodAction::Drain);
        let bad = invalid_drain_rules(&p);
        assert_eq!(
            bad,
            vec![
                InvalidDrainRule {
                    pod: "ns/a".into(),
                    source: RuleSource::Label,
                    value: "never".into()
                },
                InvalidDrainRule {
                    pod: "ns/a".into(),
                    source: RuleSource::Annotation,
                    value: "sometimes".into()
                },
            ]
        );
        assert_eq!(
            bad[0].to_string(),
            "pod ns/a has label drain.machine.sapcloud.io/behavior with unknown value \"never\" \
             (drained as usual; valid: drain, skip, wait-completed)"
        );
        // An unknown annotation under a valid label: the label decides, the value is reported.
        let p = annotated(
            labelled(pod("a"), DRAIN_BEHAVIOR_KEY, "skip"),
            DRAIN_BEHAVIOR_KEY,
            "skipp",
        );
        assert_eq!(
            classify_pod(&p),
            PodAction::Skip(SkipReason::DrainRule(RuleSource::Label))
        );
        assert_eq!(invalid_drain_rules(&p).len(), 1);
        let capi = labelled(pod("a"), CAPI_DRAIN_LABEL, "later");
        assert_eq!(
            invalid_drain_rules(&capi)[0].source,
            RuleSource::ClusterApiLabel
        );
        for ok in ["drain", "skip", "wait-completed", "Skip", "WaitCompleted"] {
            assert!(invalid_drain_rules(&labelled(pod("a"), DRAIN_BEHAVIOR_KEY, ok)).is_empty());
        }
    }

    #[test]
    fn waves_go_from_low_to_high_priority() {
        let pods = vec![
            with_priority(pod("critical"), Some(2_000_000_000)),
            with_priority(pod("b"), None),
            with_priority(pod("low"), Some(-10)),
            with_priority(pod("a"), Some(0)),
            with_priority(pod("high"), Some(1000)),
        ];
        let names: Vec<Vec<String>> = priority_waves(pods)
            .iter()
            .map(|w| w.iter().map(pod_key).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["ns/low".to_string()],
                vec!["ns/a".into(), "ns/b".into()],
                vec!["ns/high".into()],
                vec!["ns/critical".into()],
            ]
        );
        assert!(priority_waves(vec![]).is_empty());
    }
}
