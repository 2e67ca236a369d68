//! Pure decisions about PodDisruptionBudgets refusing evictions.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};

use crate::error::MisconfiguredReason;

/// What a refused eviction means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The budget does not allow a disruption right now: retry later.
    Blocked {
        /// `namespace/name` of the budget selecting the pod, if one was found.
        pdb: Option<String>,
    },
    /// The budget will never allow the eviction: give up on this pod.
    Misconfigured {
        /// `namespace/name` of the budget (comma separated when several).
        pdb: String,
        /// What is wrong.
        reason: MisconfiguredReason,
    },
}

/// MCM's misconfigured-budget rule. A budget is misconfigured when its status is current
/// (`metadata.generation == status.observedGeneration`), it expects at least one pod, all of
/// them are healthy (`currentHealthy >= expectedPods`: during a scale-down it can be larger),
/// no pod is being disrupted right now (`disruptedPods` empty: `currentHealthy` may lag behind
/// evictions that just passed), and still `disruptionsAllowed == 0`. Such a budget (e.g.
/// `maxUnavailable: 0`, or `minAvailable` equal to the replicas) never lets an eviction through,
/// however long the drain retries.
pub fn misconfigured_reason(pdb: &PodDisruptionBudget) -> Option<MisconfiguredReason> {
    let status = pdb.status.as_ref()?;
    if pdb.metadata.generation != status.observed_generation {
        return None;
    }
    let expected_pods = status.expected_pods.unwrap_or(0);
    let current_healthy = status.current_healthy.unwrap_or(0);
    let no_disrupted_pods = status.disrupted_pods.as_ref().is_none_or(|d| d.is_empty());
    let misconfigured = expected_pods > 0
        && current_healthy >= expected_pods
        && no_disrupted_pods
        && status.disruptions_allowed.unwrap_or(0) == 0;
    misconfigured.then_some(MisconfiguredReason::ZeroDisruptionsAllowed {
        expected_pods,
        current_healthy,
    })
}

/// Whether a budget selects a pod: same namespace, and its selector matches the pod's labels
/// (policy/v1: an empty selector selects every pod of the namespace, a missing one none).
pub fn pdb_selects_pod(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    if pdb.metadata.namespace != pod.metadata.namespace {
        return false;
    }
    let Some(label_selector) = pdb.spec.as_ref().and_then(|s| s.selector.clone()) else {
        return false;
    };
    let Ok(selector) = Selector::try_from(label_selector) else {
        return false;
    };
    let empty = Default::default();
    selector.matches(pod.metadata.labels.as_ref().unwrap_or(&empty))
}

/// `namespace/name` of a budget.
pub fn pdb_key(pdb: &PodDisruptionBudget) -> String {
    format!(
        "{}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Interprets a refused eviction of `pod`, given the budgets of its namespace.
/// `multiple_budgets` is set when the API server refused because more than one budget selects
/// the pod (it answers 500 in that case, not 429).
pub fn assess_refusal(pod: &Pod, pdbs: &[PodDisruptionBudget], multiple_budgets: bool) -> Refusal {
    let selecting: Vec<&PodDisruptionBudget> =
        pdbs.iter().filter(|p| pdb_selects_pod(p, pod)).collect();
    if multiple_budgets || selecting.len() > 1 {
        let mut names: Vec<String> = selecting.iter().map(|p| pdb_key(p)).collect();
        names.sort();
        return Refusal::Misconfigured {
            pdb: if names.is_empty() {
                "(several)".into()
            } else {
                names.join(", ")
            },
            reason: MisconfiguredReason::MultipleBudgets,
        };
    }
    if let Some((pdb, reason)) = selecting
        .iter()
        .find_map(|p| misconfigured_reason(p).map(|r| (*p, r)))
    {
        return Refusal::Misconfigured {
            pdb: pdb_key(pdb),
            reason,
        };
    }
    Refusal::Blocked {
        pdb: selecting.first().map(|p| pdb_key(p)),
    }
}

/// Whether an API error is the eviction API's refusal of a pod selected by several budgets.
pub fn is_multiple_budgets_error(status: &kube::core::Status) -> bool {
    status.code == 500 && status.message.contains("more than one PodDisruptionBudget")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

    fn budget(name: &str, expected: i32, healthy: i32, allowed: i32) -> PodDisruptionBudget {
        let mut p = PodDisruptionBudget::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.generation = Some(1);
        p.spec = Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        p.status = Some(PodDisruptionBudgetStatus {
            observed_generation: Some(1),
            expected_pods: Some(expected),
            current_healthy: Some(healthy),
            desired_healthy: Some(expected),
            disruptions_allowed: Some(allowed),
            ..Default::default()
        });
        p
    }

    fn pod(labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn zero_disruptions_with_all_pods_healthy_is_misconfigured() {
        assert_eq!(
            misconfigured_reason(&budget("b", 2, 2, 0)),
            Some(MisconfiguredReason::ZeroDisruptionsAllowed {
                expected_pods: 2,
                current_healthy: 2
            })
        );
        // Scale-down in progress: more healthy than expected.
        assert!(misconfigured_reason(&budget("b", 2, 3, 0)).is_some());
    }

    #[test]
    fn budgets_that_may_allow_disruptions_later_are_not_misconfigured() {
        // An unhealthy pod: a replacement may become ready.
        assert!(misconfigured_reason(&budget("b", 2, 1, 0)).is_none());
        // Disruptions allowed.
        assert!(misconfigured_reason(&budget("b", 2, 2, 1)).is_none());
        // No pods.
        assert!(misconfigured_reason(&budget("b", 0, 0, 0)).is_none());
        // Status not observed yet for the current generation.
        let mut stale = budget("b", 2, 2, 0);
        stale.metadata.generation = Some(2);
        assert!(misconfigured_reason(&stale).is_none());
        // A disruption in flight: currentHealthy may be outdated.
        let mut disrupting = budget("b", 2, 2, 0);
        if let Some(s) = disrupting.status.as_mut() {
            s.disrupted_pods = Some([("p".to_string(), Time(jiff::Timestamp::UNIX_EPOCH))].into());
        }
        assert!(misconfigured_reason(&disrupting).is_none());
        // No status at all.
        let mut fresh = budget("b", 2, 2, 0);
        fresh.status = None;
        assert!(misconfigured_reason(&fresh).is_none());
    }

    #[test]
    fn selection_follows_namespace_and_labels() {
        let b = budget("b", 1, 1, 1);
        assert!(pdb_selects_pod(&b, &pod(&[("app", "web")])));
        assert!(!pdb_selects_pod(&b, &pod(&[("app", "db")])));
        let mut other_ns = pod(&[("app", "web")]);
        other_ns.metadata.namespace = Some("other".into());
        assert!(!pdb_selects_pod(&b, &other_ns));
        let mut everything = budget("all", 1, 1, 1);
        if let Some(s) = everything.spec.as_mut() {
            s.selector = Some(LabelSelector::default());
        }
        assert!(pdb_selects_pod(&everything, &pod(&[])));
        let mut nothing = budget("none", 1, 1, 1);
        if let Some(s) = nothing.spec.as_mut() {
            s.selector = None;
        }
        assert!(!pdb_selects_pod(&nothing, &pod(&[("app", "web")])));
    }

    #[test]
    fn refusals_name_the_budget() {
        let p = pod(&[("app", "web")]);
        assert_eq!(
            assess_refusal(&p, &[budget("b", 2, 1, 0)], false),
            Refusal::Blocked {
                pdb: Some("ns/b".into())
            }
        );
        assert_eq!(
            assess_refusal(&p, &[], false),
            Refusal::Blocked { pdb: None }
        );
        assert!(matches!(
            assess_refusal(&p, &[budget("b", 2, 2, 0)], false),
            Refusal::Misconfigured { pdb, .. } if pdb == "ns/b"
        ));
        assert_eq!(
            assess_refusal(&p, &[budget("y", 2, 1, 0), budget("x", 2, 1, 0)], true),
            Refusal::Misconfigured {
                pdb: "ns/x, ns/y".into(),
                reason: MisconfiguredReason::MultipleBudgets
            }
        );
    }
}
