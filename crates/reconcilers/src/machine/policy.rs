//! Pure policies of the machine controller: rollout protection, the replacement budget,
//! retry backoff.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use mcm_api::{MachineDeployment, MachineSet};

pub(crate) fn controller_owner<'a>(
    refs: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    kind: &str,
) -> Option<&'a str> {
    refs.iter()
        .find(|r| r.controller == Some(true) && r.kind == kind)
        .map(|r| r.name.as_str())
}

/// Why a machine of `set` is protected from being failed: `set` is an old set of
/// `deployment` (its template differs from the deployment's) while the deployment rolls out
/// (a new set with the current template exists and has not all its replicas ready). Pure.
pub(crate) fn rollout_protection(
    set: &MachineSet,
    deployment: &MachineDeployment,
    owned_sets: &[Arc<MachineSet>],
) -> Option<String> {
    let current = &deployment.spec.template;
    let is_new = |s: &MachineSet| {
        s.spec
            .template
            .as_ref()
            .is_some_and(|t| mcm_api::canonical::same_set_template(t, current))
    };
    if is_new(set) {
        return None;
    }
    let new_set = owned_sets.iter().find(|s| is_new(s))?;
    let ready = new_set
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let rolling = ready < deployment.spec.replicas().max(1);
    rolling.then(|| {
        format!(
            "machine belongs to old MachineSet {} while MachineDeployment {} rolls out to {}",
            set.name_any(),
            deployment.name_any(),
            new_set.name_any()
        )
    })
}

/// The replacement budget of a deployment: its resolved maxSurge, at least 1 (1 when the
/// strategy is unusable).
pub(crate) fn max_replacements(d: &MachineDeployment) -> usize {
    let surge = d.resolved_rolling_update().map_or(1, |(surge, _)| surge);
    usize::try_from(surge.max(1)).unwrap_or(1)
}

/// `initial * 2^(failures-1)`, capped at `max`.
pub(crate) fn backoff_delay(initial: Duration, max: Duration, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    initial.saturating_mul(1u32 << exp).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, labels: serde_json::Value, ready: i32) -> Arc<MachineSet> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
                "metadata": { "name": name },
                "spec": { "replicas": 2, "template": { "metadata": { "labels": labels },
                    "spec": { "class": { "kind": "MachineClass", "name": "c" } } } },
                "status": { "readyReplicas": ready }
            }))
            .unwrap(),
        )
    }

    #[test]
    fn old_sets_are_protected_only_while_the_new_set_is_not_ready() {
        let d: MachineDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": { "name": "md" },
            "spec": { "replicas": 2, "template": { "metadata": { "labels": { "v": "2" } },
                "spec": { "class": { "kind": "MachineClass", "name": "c" } } } }
        }))
        .unwrap();
        let old = set("old", serde_json::json!({ "v": "1" }), 2);
        let new_not_ready = set(
            "new",
            serde_json::json!({ "v": "2", "machine-template-hash": "abc" }),
            1,
        );
        let new_ready = set(
            "new",
            serde_json::json!({ "v": "2", "machine-template-hash": "abc" }),
            2,
        );
        assert!(rollout_protection(&old, &d, &[old.clone(), new_not_ready.clone()]).is_some());
        assert!(
            rollout_protection(&new_not_ready, &d, &[old.clone(), new_not_ready.clone()]).is_none()
        );
        assert!(rollout_protection(&old, &d, &[old.clone(), new_ready]).is_none());
        // No new set yet: nothing rolls out.
        assert!(rollout_protection(&old, &d, std::slice::from_ref(&old)).is_none());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let s = Duration::from_secs(5);
        let max = Duration::from_secs(60);
        let delays: Vec<u64> = (1..=6)
            .map(|n| backoff_delay(s, max, n).as_secs())
            .collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 60, 60]);
        assert_eq!(backoff_delay(s, max, 10_000), max);
    }
}
