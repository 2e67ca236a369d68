//! The `InPlaceUpdate` strategy: the replicas of a new set created for it
//! ([`initial_new_replicas`]). Its validation and its limits resolved for the deployment's
//! replicas are `mcm_api::policy::strategy`'s.

use super::super::model::{Orchestration, SetState};

/// Replicas of a new set created for an in-place update (upstream's `NewISNewReplicas`):
/// none under `Manual` (machines only arrive by moving); under `Auto` as many fresh machines
/// as `replicas + max_surge` leaves room for beside the old sets' machines, at most
/// `replicas`.
pub(crate) fn initial_new_replicas(
    replicas: i32,
    max_surge: i32,
    orchestration: Orchestration,
    old_sets: &[SetState],
) -> i32 {
    match orchestration {
        Orchestration::Manual => 0,
        Orchestration::Auto => {
            let current: i32 = old_sets.iter().map(SetState::footprint).sum();
            (replicas + max_surge - current).clamp(0, replicas.max(0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_set_starts_empty_under_manual_and_within_surge_under_auto() {
        let old = [SetState {
            machines: 3,
            ..SetState::new("old", 3)
        }];
        assert_eq!(initial_new_replicas(3, 1, Orchestration::Auto, &old), 1);
        assert_eq!(initial_new_replicas(3, 0, Orchestration::Auto, &old), 0);
        assert_eq!(initial_new_replicas(3, 5, Orchestration::Auto, &old), 3);
        assert_eq!(initial_new_replicas(3, 1, Orchestration::Manual, &old), 0);
        // The first set of a deployment.
        assert_eq!(initial_new_replicas(3, 0, Orchestration::Auto, &[]), 3);
    }
}
