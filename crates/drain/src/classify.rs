//! Pure decisions about the pods on a node: which to drain, which to leave, in which order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::outcome::SkipReason;

/// Annotation the kubelet puts on the mirror pod of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    /// Leave it on the node.
    Skip(SkipReason),
    /// Evict it (or delete it), then wait for it to disappear.
    Drain,
    /// It is terminating already (e.g. a previous drain evicted it): only wait for it.
    WaitOnly,
}

/// Decides what to do with a pod bound to the node being drained.
pub fn classify_pod(pod: &Pod) -> PodAction {
    if is_mirror_pod(pod) {
        return PodAction::Skip(SkipReason::MirrorPod);
    }
    if is_daemonset_pod(pod) {
        return PodAction::Skip(SkipReason::DaemonSet);
    }
    if is_finished(pod) {
        return PodAction::Skip(SkipReason::Finished);
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
