//! Pure rollout arithmetic of the MachineDeployment controller (Kubernetes Deployment
//! semantics): which MachineSet to create, how to scale the new and old sets for
//! RollingUpdate and Recreate, proportional scaling, history pruning, revisions and
//! rollbacks.
//!
//! Decisions take a [`Snapshot`] (the deployment and its sets with machine counts taken from
//! the machines themselves) and return [`Action`]s; the controller applies them and reconciles
//! again when the world changes. Applying the actions of one call and deciding again must
//! converge: every function here is idempotent on its own output.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

#[cfg(test)]
use jiff::Timestamp;

pub(crate) use super::model::{
    Action, RevisionPlan, RollbackCandidate, RollbackPlan, SetState, Snapshot, Strategy,
};

fn sum(sets: &[&SetState], f: impl Fn(&SetState) -> i32) -> i32 {
    sets.iter().map(|s| f(s)).sum()
}

/// The next actions for the deployment.
///
/// Order of concerns: (1) the new set is created first when it is missing, even while
/// scaling (fixes MCM #816, where a scale-up during a template change kept the rollout from
/// ever creating its new set); (2) a scaling event (a set's desired-replicas annotation
/// differs from the deployment) is handled by proportional scaling; (3) otherwise the
/// strategy advances the rollout. Paused deployments only scale. Frozen deployments only
/// scale down.
pub(crate) fn decide(s: &Snapshot) -> Vec<Action> {
    let mut actions = if s.rollout.paused {
        if is_scaling_event(s) {
            proportional_scale(s)
        } else {
            Vec::new()
        }
    } else if s.new_set.is_none() {
        vec![Action::CreateNewSet {
            replicas: initial_new_replicas(s),
        }]
    } else if is_scaling_event(s) {
        proportional_scale(s)
    } else {
        match s.rollout.strategy {
            Strategy::RollingUpdate { .. } => rolling(s),
            Strategy::Recreate => recreate(s),
            // Advanced from the machines' nodes by `super::inplace`, not from counts.
            Strategy::InPlaceUpdate { .. } => Vec::new(),
        }
    };
    if s.rollout.frozen {
        let current: BTreeMap<&str, i32> = s
            .all()
            .into_iter()
            .map(|x| (x.name.as_str(), x.replicas))
            .collect();
        actions.retain(|a| match a {
            Action::CreateNewSet { .. } => false,
            Action::Scale { set, replicas } => {
                current.get(set.as_str()).is_none_or(|c| *replicas <= *c)
            }
        });
    }
    actions
}

fn initial_new_replicas(s: &Snapshot) -> i32 {
    match s.rollout.strategy {
        Strategy::Recreate => {
            if s.old_sets
                .iter()
                .any(|o| o.replicas > 0 || o.machines > 0 || o.terminating > 0)
            {
                0
            } else {
                s.rollout.replicas
            }
        }
        Strategy::RollingUpdate { max_surge, .. } => {
            let current = sum(&s.old_sets.iter().collect::<Vec<_>>(), SetState::footprint);
            let max_total = s.rollout.replicas + max_surge;
            (max_total - current).clamp(0, s.rollout.replicas.max(0))
        }
        Strategy::InPlaceUpdate {
            max_surge,
            orchestration,
            ..
        } => super::inplace::strategy::initial_new_replicas(
            s.rollout.replicas,
            max_surge,
            orchestration,
            &s.old_sets,
        ),
    }
}

/// Kubernetes' `isScalingEvent`: an active set whose desired-replicas annotation differs from
/// the deployment's replicas.
pub(crate) fn is_scaling_event(s: &Snapshot) -> bool {
    s.all().iter().any(|set| {
        set.replicas > 0
            && set
                .desired_annotation
                .is_some_and(|d| d != s.rollout.replicas)
    })
}

/// Replicas the new set may have now under RollingUpdate (Kubernetes' `NewRSNewReplicas`),
/// counting machines that still exist (`max(replicas, machines)` per set) so that machines
/// still waiting for deletion never let the total exceed `replicas + maxSurge`.
pub(crate) fn new_set_replicas(s: &Snapshot) -> i32 {
    let Some(new) = &s.new_set else {
        return 0;
    };
    match s.rollout.strategy {
        Strategy::Recreate => s.rollout.replicas,
        // Only raised when machines move to it (`super::inplace`).
        Strategy::InPlaceUpdate { .. } => new.replicas,
        Strategy::RollingUpdate { max_surge, .. } => {
            let current = sum(&s.all(), SetState::footprint);
            let max_total = s.rollout.replicas + max_surge;
            if current >= max_total {
                return new.replicas;
            }
            let up = (max_total - current).min(s.rollout.replicas - new.replicas);
            new.replicas + up.max(0)
        }
    }
}

fn by_age(a: &SetState, b: &SetState) -> Ordering {
    a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name))
}

fn rolling(s: &Snapshot) -> Vec<Action> {
    let Some(new) = &s.new_set else {
        return Vec::new();
    };
    let d = s.rollout.replicas;
    // Reconcile the new set.
    if new.replicas > d {
        return vec![Action::Scale {
            set: new.name.clone(),
            replicas: d,
        }];
    }
    let wanted = new_set_replicas(s);
    if wanted != new.replicas {
        return vec![Action::Scale {
            set: new.name.clone(),
            replicas: wanted,
        }];
    }
    // Reconcile the old sets.
    let mut old: Vec<SetState> = s
        .old_sets
        .iter()
        .filter(|o| o.replicas > 0)
        .cloned()
        .collect();
    if old.is_empty() {
        return Vec::new();
    }
    old.sort_by(by_age);
    let all_count: i32 = new.replicas + old.iter().map(|o| o.replicas).sum::<i32>();
    let min_available = d - s.rollout.strategy.max_unavailable();
    let new_unavailable = (new.replicas - new.effective_available()).max(0);
    let max_scaled_down = all_count - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    let mut target: BTreeMap<String, i32> = BTreeMap::new();
    // Clean up unhealthy replicas first: removing them does not reduce availability.
    let mut cleaned = 0;
    for o in &mut old {
        if cleaned >= max_scaled_down {
            break;
        }
        let unhealthy = o.replicas - o.effective_available();
        if unhealthy <= 0 {
            continue;
        }
        let down = (max_scaled_down - cleaned).min(unhealthy);
        o.replicas -= down;
        cleaned += down;
        target.insert(o.name.clone(), o.replicas);
    }
    // Then scale down available old machines as far as maxUnavailable allows.
    let available: i32 =
        new.effective_available() + old.iter().map(SetState::effective_available).sum::<i32>();
    if available > min_available {
        let total = available - min_available;
        let mut done = 0;
        for o in &mut old {
            if done >= total {
                break;
            }
            if o.replicas == 0 {
                continue;
            }
            let down = o.replicas.min(total - done);
            o.replicas -= down;
            done += down;
            target.insert(o.name.clone(), o.replicas);
        }
    }
    target
        .into_iter()
        .map(|(set, replicas)| Action::Scale { set, replicas })
        .collect()
}

/// Scales every old set that still has replicas to 0.
fn scale_down_old_sets(s: &Snapshot) -> Vec<Action> {
    s.old_sets
        .iter()
        .filter(|o| o.replicas > 0)
        .map(|o| Action::scale(&o.name, 0))
        .collect()
}

fn recreate(s: &Snapshot) -> Vec<Action> {
    let Some(new) = &s.new_set else {
        return Vec::new();
    };
    let active = scale_down_old_sets(s);
    if !active.is_empty() {
        return active;
    }
    if s.old_sets
        .iter()
        .any(|o| o.machines > 0 || o.terminating > 0)
    {
        return Vec::new();
    }
    if new.replicas != s.rollout.replicas {
        return vec![Action::scale(&new.name, s.rollout.replicas)];
    }
    Vec::new()
}

/// Kubernetes' proportional scaling (`scale`): spread a change of the deployment's replicas
/// over all active sets in proportion to their size, within `replicas + maxSurge`.
///
/// Every active set whose annotations are stale gets a [`Action::Scale`], even when its
/// replicas do not change, so that the annotations are refreshed and the scaling event ends
/// (MCM #815).
pub(crate) fn proportional_scale(s: &Snapshot) -> Vec<Action> {
    let d = s.rollout.replicas;
    let all = s.all();
    let active: Vec<&SetState> = all.iter().copied().filter(|x| x.replicas > 0).collect();
    if active.len() <= 1 {
        let target = active
            .first()
            .copied()
            .or(s.new_set.as_ref())
            .or_else(|| s.old_sets.iter().max_by(|a, b| by_age(a, b)));
        return target
            .map(|t| vec![Action::scale(&t.name, d)])
            .unwrap_or_default();
    }
    if let Some(new) = &s.new_set
        && new.replicas == d
        && new.effective_available() >= d
    {
        return scale_down_old_sets(s);
    }
    let surge = s.rollout.strategy.max_surge();
    let allowed = d + surge;
    let current = sum(&active, |x| x.replicas);
    let to_add = allowed - current;
    let mut ordered = active.clone();
    // Largest first; newer first when growing, older first when shrinking.
    ordered.sort_by(|a, b| {
        b.replicas.cmp(&a.replicas).then_with(|| {
            if to_add > 0 {
                by_age(b, a)
            } else {
                by_age(a, b)
            }
        })
    });
    let fallback_annotated = current.max(1);
    let mut added = 0;
    let mut sizes: Vec<(String, i32)> = Vec::new();
    for set in &ordered {
        let mut proportion = 0;
        if to_add != 0 {
            let fraction = if d == 0 {
                -set.replicas
            } else {
                let annotated = set
                    .max_annotation
                    .filter(|m| *m > 0)
                    .unwrap_or(fallback_annotated);
                let scaled = f64::from(set.replicas) * f64::from(allowed) / f64::from(annotated);
                // Rounds half away from zero, like Go's integer.RoundToInt32.
                (scaled.round() as i32) - set.replicas
            };
            let remaining = to_add - added;
            proportion = if to_add > 0 {
                fraction.min(remaining)
            } else {
                fraction.max(remaining)
            };
        }
        added += proportion;
        sizes.push((set.name.clone(), set.replicas + proportion));
    }
    if let Some(first) = sizes.first_mut() {
        first.1 = (first.1 + to_add - added).max(0);
    }
    sizes
        .into_iter()
        .map(|(set, replicas)| Action::Scale {
            set,
            replicas: replicas.max(0),
        })
        .collect()
}

/// Old sets to delete so that at most `limit` old sets without machines remain (oldest go
/// first). Only called once the rollout is complete.
pub(crate) fn sets_to_prune(old_sets: &[SetState], limit: i32) -> Vec<String> {
    let mut empty: Vec<&SetState> = old_sets
        .iter()
        .filter(|o| o.replicas == 0 && o.machines == 0 && o.terminating == 0)
        .collect();
    let keep = usize::try_from(limit.max(0)).unwrap_or(0);
    if empty.len() <= keep {
        return Vec::new();
    }
    empty.sort_by(|a, b| by_age(a, b));
    let n = empty.len() - keep;
    empty.into_iter().take(n).map(|o| o.name.clone()).collect()
}

/// Applies actions to a snapshot as the MachineDeployment controller would (for
/// simulations and tests): scaled sets get the deployment's desired/max annotations, a
/// created new set is named `new_name` and created at `now`.
#[cfg(test)]
pub(crate) fn apply(s: &mut Snapshot, actions: &[Action], new_name: &str, now: Option<Timestamp>) {
    let desired = s.rollout.replicas;
    let max = desired + s.rollout.strategy.max_surge();
    for a in actions {
        match a {
            Action::CreateNewSet { replicas } => {
                let mut set = SetState::new(new_name, *replicas);
                set.created = now;
                set.desired_annotation = Some(desired);
                set.max_annotation = Some(max);
                s.new_set = Some(set);
            }
            Action::Scale { set, replicas } => {
                for x in s.new_set.iter_mut().chain(s.old_sets.iter_mut()) {
                    if &x.name == set {
                        x.replicas = *replicas;
                        x.desired_annotation = Some(desired);
                        x.max_annotation = Some(max);
                    }
                }
            }
        }
    }
}

/// Whether the rollout markers belong on the nodes: a new set exists while an old set still
/// has machines or replicas.
pub(crate) fn is_rolling_out(s: &Snapshot) -> bool {
    s.new_set.is_some() && s.old_sets.iter().any(|o| o.machines > 0 || o.replicas > 0)
}

/// Whether the Nodes get the rollout markers (the old-set taint and the autoscaler's
/// scale-down-disabled annotation) added (`Some(true)`) or removed (`Some(false)`); `None`
/// while paused, when they are left as they are. Pure.
pub(crate) fn markers_wanted(s: &Snapshot) -> Option<bool> {
    (!s.rollout.paused).then(|| is_rolling_out(s))
}

/// When to reconcile again after a successful pass: at the status's recheck time (else
/// `resync`), while incomplete no later than `minReadySeconds`, plus a margin of 500 ms.
pub(crate) fn requeue_after(
    recheck: Option<Duration>,
    resync: Duration,
    min_ready_seconds: i32,
    complete: bool,
) -> Duration {
    let mut next = recheck.unwrap_or(resync);
    if min_ready_seconds > 0 && !complete {
        next = next.min(Duration::from_secs(
            u64::try_from(min_ready_seconds).unwrap_or(1),
        ));
    }
    next + Duration::from_millis(500)
}

/// Keeps the new set's revision above all old revisions (the replaced revision joins its
/// history) and the deployment's revision equal to the new set's.
pub(crate) fn plan_revision(
    current: Option<i64>,
    history: Option<&str>,
    max_old: i64,
    deployment_revision: Option<i64>,
) -> RevisionPlan {
    let mut revision = current.unwrap_or(0);
    let mut bump = None;
    if revision <= max_old {
        revision = max_old + 1;
        let mut entries: Vec<String> = history
            .map(|h| h.split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        entries.extend(current.map(|c| c.to_string()));
        bump = Some((!entries.is_empty()).then(|| entries.join(",")));
    }
    RevisionPlan {
        revision,
        bump,
        update_deployment: deployment_revision != Some(revision),
    }
}

/// The revision before the newest one (upstream's `LastRevision`: the second highest
/// revision among the sets, 0 when there is none).
pub(crate) fn last_revision(revisions: impl IntoIterator<Item = i64>) -> i64 {
    let (mut max, mut second) = (0, 0);
    for v in revisions {
        if v >= max {
            second = max;
            max = v;
        } else if v > second {
            second = v;
        }
    }
    second
}

/// Decides a rollback to `requested` (0: the previous revision) among the deployment's sets.
pub(crate) fn plan_rollback(requested: i64, sets: &[RollbackCandidate]) -> RollbackPlan {
    let revision = if requested == 0 {
        match last_revision(sets.iter().map(|s| s.revision)) {
            0 => {
                return RollbackPlan::NotFound {
                    message: "Unable to find last revision.",
                };
            }
            r => r,
        }
    } else {
        requested
    };
    match sets.iter().find(|s| s.revision == revision) {
        None => RollbackPlan::NotFound {
            message: "Unable to find the revision to rollback to.",
        },
        Some(s) if s.same_template => RollbackPlan::Unchanged {
            set: s.name.clone(),
            revision,
        },
        Some(s) => RollbackPlan::To {
            set: s.name.clone(),
            revision,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinedeployment::model::Rollout;

    fn rolling_snapshot(d: i32, surge: i32, unavailable: i32) -> Snapshot {
        Snapshot {
            rollout: Rollout {
                replicas: d,
                strategy: Strategy::RollingUpdate {
                    max_surge: surge,
                    max_unavailable: unavailable,
                },
                paused: false,
                frozen: false,
            },
            new_set: None,
            old_sets: Vec::new(),
        }
    }

    fn set(name: &str, replicas: i32, available: i32, created: i64) -> SetState {
        SetState {
            machines: replicas,
            ready: available,
            available,
            created: Timestamp::from_second(created).ok(),
            desired_annotation: None,
            ..SetState::new(name, replicas)
        }
    }

    #[test]
    fn markers_follow_the_rollout_and_are_left_alone_while_paused() {
        let mut s = rolling_snapshot(3, 1, 0);
        s.old_sets.push(set("old", 3, 3, 1));
        // No new set: not rolling out, markers are removed.
        assert_eq!(markers_wanted(&s), Some(false));
        s.new_set = Some(set("new", 0, 0, 2));
        assert_eq!(markers_wanted(&s), Some(true));
        s.rollout.paused = true;
        assert_eq!(markers_wanted(&s), None);
        s.new_set = None;
        assert_eq!(markers_wanted(&s), None);
    }

    #[test]
    fn creates_new_set_within_surge() {
        let mut s = rolling_snapshot(4, 1, 0);
        s.old_sets.push(set("old", 4, 4, 1));
        assert_eq!(decide(&s), vec![Action::CreateNewSet { replicas: 1 }]);
        let mut s = rolling_snapshot(4, 0, 1);
        s.old_sets.push(set("old", 4, 4, 1));
        assert_eq!(decide(&s), vec![Action::CreateNewSet { replicas: 0 }]);
    }

    #[test]
    fn scales_down_old_only_within_unavailability() {
        let mut s = rolling_snapshot(4, 1, 0);
        s.old_sets.push(set("old", 4, 4, 1));
        s.new_set = Some(set("new", 1, 0, 2));
        // New machine not available yet: nothing to do.
        assert_eq!(decide(&s), vec![]);
        s.new_set = Some(set("new", 1, 1, 2));
        assert_eq!(decide(&s), vec![Action::scale("old", 3)]);
    }

    #[test]
    fn recreate_waits_for_old_machines() {
        let mut s = rolling_snapshot(3, 0, 1);
        s.rollout.strategy = Strategy::Recreate;
        s.old_sets.push(set("old", 3, 3, 1));
        s.new_set = Some(set("new", 0, 0, 2));
        assert_eq!(decide(&s), vec![Action::scale("old", 0)]);
        s.old_sets[0].replicas = 0;
        assert_eq!(decide(&s), vec![]);
        s.old_sets[0].machines = 0;
        assert_eq!(decide(&s), vec![Action::scale("new", 3)]);
    }

    #[test]
    fn proportional_scaling_during_rollout() {
        // 10 replicas, surge 3: old 8, new 5 (13 total); scale to 20 -> allowed 23.
        let mut s = rolling_snapshot(20, 3, 2);
        let mut old = set("old", 8, 8, 1);
        old.desired_annotation = Some(10);
        old.max_annotation = Some(13);
        let mut new = set("new", 5, 0, 2);
        new.desired_annotation = Some(10);
        new.max_annotation = Some(13);
        s.old_sets.push(old);
        s.new_set = Some(new);
        let actions = decide(&s);
        let total: i32 = actions
            .iter()
            .map(|a| match a {
                Action::Scale { replicas, .. } => *replicas,
                Action::CreateNewSet { replicas } => *replicas,
            })
            .sum();
        assert_eq!(total, 23);
        assert!(actions.contains(&Action::scale("old", 14)));
    }

    #[test]
    fn prunes_oldest_empty_sets() {
        let olds = vec![
            SetState {
                machines: 0,
                ..set("a", 0, 0, 1)
            },
            SetState {
                machines: 0,
                ..set("b", 0, 0, 2)
            },
            SetState {
                machines: 0,
                ..set("c", 0, 0, 3)
            },
            set("d", 1, 1, 4),
        ];
        assert_eq!(
            sets_to_prune(&olds, 1),
            vec!["a".to_owned(), "b".to_owned()]
        );
        assert!(sets_to_prune(&olds, 5).is_empty());
    }

    #[test]
    fn revisions_stay_above_old_sets() {
        // Fine as it is: only the deployment follows.
        assert_eq!(
            plan_revision(Some(3), None, 2, None),
            RevisionPlan {
                revision: 3,
                bump: None,
                update_deployment: true
            }
        );
        assert!(!plan_revision(Some(3), None, 2, Some(3)).update_deployment);
        // Raised above the old sets; the replaced revision joins the history.
        assert_eq!(
            plan_revision(Some(1), Some("0"), 2, Some(1)),
            RevisionPlan {
                revision: 3,
                bump: Some(Some("0,1".into())),
                update_deployment: true
            }
        );
        assert_eq!(plan_revision(None, None, 0, None).bump, Some(None));
    }

    #[test]
    fn requeues_by_min_ready_while_incomplete() {
        let resync = Duration::from_secs(600);
        let margin = Duration::from_millis(500);
        assert_eq!(requeue_after(None, resync, 0, false), resync + margin);
        assert_eq!(
            requeue_after(None, resync, 30, false),
            Duration::from_secs(30) + margin
        );
        assert_eq!(requeue_after(None, resync, 30, true), resync + margin);
        let soon = Some(Duration::from_secs(5));
        assert_eq!(
            requeue_after(soon, resync, 30, false),
            Duration::from_secs(5) + margin
        );
    }

    fn candidate(name: &str, revision: i64, same_template: bool) -> RollbackCandidate {
        RollbackCandidate {
            name: name.into(),
            revision,
            same_template,
        }
    }

    #[test]
    fn rollback_zero_means_the_second_highest_revision() {
        assert_eq!(last_revision([3, 1, 2]), 2);
        assert_eq!(last_revision([5, 5]), 5);
        assert_eq!(last_revision([4]), 0);
        assert_eq!(last_revision([]), 0);
        let sets = [
            candidate("d-a", 1, false),
            candidate("d-b", 2, false),
            candidate("d-c", 3, true),
        ];
        assert_eq!(
            plan_rollback(0, &sets),
            RollbackPlan::To {
                set: "d-b".into(),
                revision: 2
            }
        );
        assert_eq!(
            plan_rollback(1, &sets),
            RollbackPlan::To {
                set: "d-a".into(),
                revision: 1
            }
        );
    }

    #[test]
    fn rollback_gives_up_or_reports_an_unchanged_template() {
        let sets = [candidate("d-a", 1, true)];
        assert_eq!(
            plan_rollback(0, &sets),
            RollbackPlan::NotFound {
                message: "Unable to find last revision."
            }
        );
        assert_eq!(
            plan_rollback(7, &sets),
            RollbackPlan::NotFound {
                message: "Unable to find the revision to rollback to."
            }
        );
        assert_eq!(
            plan_rollback(1, &sets),
            RollbackPlan::Unchanged {
                set: "d-a".into(),
                revision: 1
            }
        );
    }
}
