//! The steps of an in-place rollout as pure decisions, in upstream's order: label the old
//! sets ([`sets_to_disable_scale_up`]), mark candidates ([`nodes_to_mark_candidate`]),
//! [`sync_machine_sets`], [`reconcile_new_machine_set`] (the moves) and, unless that scaled,
//! [`reconcile_old_machine_sets`] (the selection).

use super::super::model::{Orchestration, SetState};
use super::model::{
    InPlaceSet, InPlaceSnapshot, MachineFacts, Move, NewSetPlan, OldSetsPlan, SyncPlan,
};

/// Whether the old sets are scaled to zero (upstream's `machineSetsScaledToZero`): no set
/// has replicas, available, ready and existing machines at once.
pub(crate) fn machine_sets_scaled_to_zero(sets: &[&SetState]) -> bool {
    !sets
        .iter()
        .any(|s| s.replicas != 0 && s.available != 0 && s.ready != 0 && s.machines != 0)
}

/// The old sets that must get `scale-up-disabled` now: all that lack it while some old set
/// is not scaled to zero.
pub(crate) fn sets_to_disable_scale_up(s: &InPlaceSnapshot) -> Vec<String> {
    let states: Vec<&SetState> = s.old_sets.iter().map(|o| &o.state).collect();
    if states.is_empty() || machine_sets_scaled_to_zero(&states) {
        return Vec::new();
    }
    s.old_sets
        .iter()
        .filter(|o| !o.scale_up_disabled)
        .map(|o| o.state.name.clone())
        .collect()
}

/// The Nodes of the old sets' machines that lack `candidate-for-update` (upstream's
/// `labelNodesBackingMachineSets`; machines without a known Node are skipped).
pub(crate) fn nodes_to_mark_candidate(s: &InPlaceSnapshot) -> Vec<String> {
    let mut nodes: Vec<String> = s
        .old_sets
        .iter()
        .flat_map(|o| &o.machines)
        .filter_map(|m| m.node.as_ref())
        .filter(|n| !n.candidate)
        .map(|n| n.name.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Upstream's `syncMachineSets`: raise the new set's replicas for machines moved to it but
/// not yet counted (labelled `update-result: successful` with the condition
/// `UpdateSuccessful`), drop that label from them, clean up the Nodes of the new set's
/// machines whose update succeeded, and scale each old set down to the machines it has.
///
/// Unlike upstream, the label is dropped only once the new set's replicas *as the store
/// has them* cover its machines: the MachineSet controller reads the same store, so it never
/// sees the label gone before the replicas raised for the machine (it would delete a
/// machine as surplus); the reconcile that raises them leaves the label to the next one.
pub(crate) fn sync_machine_sets(s: &InPlaceSnapshot) -> SyncPlan {
    let new = &s.new_set;
    let moved: Vec<&MachineFacts> = new
        .machines
        .iter()
        .filter(|m| m.labeled_successful && m.condition_successful)
        .collect();
    let machines = count(new.machines.len());
    let new_replicas = (machines > new.state.replicas && !moved.is_empty()).then(|| {
        let up = count(moved.len()).min(machines - new.state.replicas);
        new.state.replicas + up
    });
    let accounted = machines <= new.state.replicas;
    SyncPlan {
        new_replicas,
        unlabel: if accounted {
            moved.iter().map(|m| m.name.clone()).collect()
        } else {
            Vec::new()
        },
        clean: new
            .machines
            .iter()
            .filter(|m| m.update_successful())
            .filter_map(|m| m.node.as_ref().map(|n| n.name.clone()))
            .collect(),
        old_replicas: s
            .old_sets
            .iter()
            .filter(|o| count(o.machines.len()) < o.state.replicas)
            .map(|o| (o.state.name.clone(), count(o.machines.len())))
            .collect(),
    }
}

/// Upstream's `reconcileNewMachineSetInPlace`: the new set never has more than `replicas`;
/// without old replicas it gets all of them (fresh machines); when old and new replicas
/// together fall short (machines were lost), it gets the difference; otherwise the old
/// sets' machines whose update succeeded (and that are neither `InPlaceUpdating` nor being
/// deleted) move to it
/// (upstream's `transferMachinesFromOldToNewMachineSet`, [`NewSetPlan::Moves`]). A frozen
/// deployment gets no fresh machines.
pub(crate) fn reconcile_new_machine_set(s: &InPlaceSnapshot) -> NewSetPlan {
    let d = s.replicas;
    let new = &s.new_set.state;
    if new.replicas == d {
        return NewSetPlan::Nothing;
    }
    if new.replicas > d {
        return NewSetPlan::Scale(d);
    }
    let old_count: i32 = s.old_sets.iter().map(|o| o.state.replicas).sum();
    if old_count == 0 {
        return if s.frozen {
            NewSetPlan::Nothing
        } else {
            NewSetPlan::Scale(d)
        };
    }
    if old_count + new.replicas < d {
        return if s.frozen {
            NewSetPlan::Nothing
        } else {
            NewSetPlan::Scale(d - old_count)
        };
    }
    let mut moves = Vec::new();
    let mut old_replicas = Vec::new();
    for old in &s.old_sets {
        let before = moves.len();
        for m in &old.machines {
            let Some(node) = m.node.as_ref() else {
                continue;
            };
            if !m.update_successful() || m.updating || m.terminating {
                continue;
            }
            moves.push(Move {
                machine: m.name.clone(),
                from: old.state.name.clone(),
                node: node.name.clone(),
            });
        }
        let moved = count(moves.len() - before);
        if moved > 0 {
            old_replicas.push((old.state.name.clone(), old.state.replicas - moved));
        }
    }
    if moves.is_empty() {
        return NewSetPlan::Nothing;
    }
    let new_replicas = new.replicas + count(moves.len());
    NewSetPlan::Moves {
        moves,
        old_replicas,
        new_replicas,
    }
}

/// The old sets' machines whose Node carries `selected-for-update` (upstream's
/// `getMachinesUndergoingUpdate`).
pub(crate) fn machines_undergoing_update<'a>(
    sets: impl IntoIterator<Item = &'a InPlaceSet>,
) -> i32 {
    count(
        sets.into_iter()
            .flat_map(|o| &o.machines)
            .filter(|m| m.node.as_ref().is_some_and(|n| n.selected))
            .count(),
    )
}

/// Upstream's `reconcileOldMachineSetsInPlace` over the active old sets (replicas > 0):
/// once the new set has all replicas, the rest of the old sets goes to 0; under `Manual`
/// nothing is selected; under `Auto` Nodes are selected as long as the machines being
/// updated and the new set's replicas stay below `replicas` and `maxUnavailable` allows
/// ([`select_for_update`]).
pub(crate) fn reconcile_old_machine_sets(s: &InPlaceSnapshot) -> OldSetsPlan {
    let d = s.replicas;
    let active: Vec<&InPlaceSet> = s.old_sets.iter().filter(|o| o.state.replicas > 0).collect();
    let old_count: i32 = active.iter().map(|o| o.state.replicas).sum();
    if old_count == 0 {
        return OldSetsPlan::Nothing;
    }
    let new = &s.new_set.state;
    if new.replicas == d {
        return OldSetsPlan::ScaleToZero(active.iter().map(|o| o.state.name.clone()).collect());
    }
    if s.orchestration == Orchestration::Manual {
        return OldSetsPlan::Nothing;
    }
    let undergoing = machines_undergoing_update(active.iter().copied());
    if undergoing + new.replicas >= d {
        return OldSetsPlan::Nothing;
    }
    let all_count: i32 = s.all().map(|x| x.state.replicas).sum();
    let min_available = d - s.max_unavailable;
    let new_unavailable = (new.replicas - new.available).max(0);
    let max_update_possible = all_count - min_available - new_unavailable - undergoing;
    if max_update_possible <= 0 {
        return OldSetsPlan::Nothing;
    }
    let nodes = select_for_update(s, &active, undergoing);
    if nodes.is_empty() {
        OldSetsPlan::Nothing
    } else {
        OldSetsPlan::Select(nodes)
    }
}

/// Upstream's `selectNumOfMachineForUpdate`: as many Nodes as the available machines above
/// `replicas - maxUnavailable` allow (machines being updated do not count as available), at
/// most the replicas the new set still lacks; from the oldest active set first, its
/// candidates that are not selected yet ([`machines_for_drain`]).
pub(crate) fn select_for_update(
    s: &InPlaceSnapshot,
    active: &[&InPlaceSet],
    undergoing: i32,
) -> Vec<String> {
    let d = s.replicas;
    let min_available = d - s.max_unavailable;
    let available = s.all().map(|x| x.state.available).sum::<i32>() - undergoing;
    if available <= min_available {
        return Vec::new();
    }
    let max_selectable = (available - min_available).min((d - s.new_set.state.replicas).max(0));
    let mut oldest_first: Vec<&InPlaceSet> = active.to_vec();
    oldest_first.sort_by(|a, b| {
        a.state
            .created
            .cmp(&b.state.created)
            .then_with(|| a.state.name.cmp(&b.state.name))
    });
    let mut selected = Vec::new();
    for set in oldest_first {
        let total = count(selected.len());
        if total >= max_selectable {
            break;
        }
        if set.state.replicas == 0 {
            continue;
        }
        let n = set.state.replicas.min(max_selectable - total);
        selected.extend(machines_for_drain(set, n));
    }
    selected
}

/// The first `n` Nodes of `set`'s machines that are candidates and not selected yet
/// (upstream's `getMachinesForDrain`; machines being deleted are left out).
pub(crate) fn machines_for_drain(set: &InPlaceSet, n: i32) -> Vec<String> {
    set.machines
        .iter()
        .filter(|m| !m.terminating)
        .filter_map(|m| m.node.as_ref())
        .filter(|node| node.candidate && !node.selected)
        .take(usize::try_from(n).unwrap_or(0))
        .map(|node| node.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::model::{NodeFacts, UpdateResult};
    use super::*;
    use jiff::Timestamp;

    fn node(name: &str, candidate: bool, selected: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            candidate,
            selected,
            result: None,
            condition_successful: false,
        }
    }

    /// A Running machine `name` on Node `name`.
    fn machine(name: &str, candidate: bool, selected: bool) -> MachineFacts {
        MachineFacts {
            name: name.into(),
            node: Some(node(name, candidate, selected)),
            ..MachineFacts::default()
        }
    }

    /// `m` after its node agent reported success (and the condition followed).
    fn updated(mut m: MachineFacts) -> MachineFacts {
        if let Some(n) = m.node.as_mut() {
            n.result = Some(UpdateResult::Successful);
            n.condition_successful = true;
        }
        m.condition_successful = true;
        m
    }

    fn set(
        name: &str,
        replicas: i32,
        available: i32,
        created: i64,
        machines: Vec<MachineFacts>,
    ) -> InPlaceSet {
        InPlaceSet {
            state: SetState {
                machines: count(machines.len()),
                ready: available,
                available,
                created: Timestamp::from_second(created).ok(),
                ..SetState::new(name, replicas)
            },
            scale_up_disabled: false,
            machines,
        }
    }

    /// 3 replicas rolling from `old` (3 available candidates a, b, c) to an empty `new`.
    fn rollout(max_unavailable: i32, orchestration: Orchestration) -> InPlaceSnapshot {
        InPlaceSnapshot {
            replicas: 3,
            max_unavailable,
            orchestration,
            frozen: false,
            new_set: set("new", 0, 0, 2, Vec::new()),
            old_sets: vec![set(
                "old",
                3,
                3,
                1,
                vec![
                    machine("a", true, false),
                    machine("b", true, false),
                    machine("c", true, false),
                ],
            )],
        }
    }

    fn selected(plan: &OldSetsPlan) -> Vec<&str> {
        match plan {
            OldSetsPlan::Select(nodes) => nodes.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn auto_selects_within_max_unavailable() {
        let s = rollout(1, Orchestration::Auto);
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["a"]);
        let s = rollout(2, Orchestration::Auto);
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["a", "b"]);
        // One selected already: it counts as unavailable, nothing more with 1 ...
        let mut s = rollout(1, Orchestration::Auto);
        s.old_sets[0].machines[0] = machine("a", true, true);
        assert_eq!(reconcile_old_machine_sets(&s), OldSetsPlan::Nothing);
        // ... and one more with 2.
        s.max_unavailable = 2;
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["b"]);
        // A machine that is not available (being drained, say) counts too.
        let mut s = rollout(2, Orchestration::Auto);
        s.old_sets[0].state.available = 2;
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["a"]);
        // Nodes that are no candidates (yet) are not selected.
        let mut s = rollout(1, Orchestration::Auto);
        s.old_sets[0].machines[0] = machine("a", false, false);
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["b"]);
    }

    #[test]
    fn with_surge_the_fresh_machines_of_the_new_set_make_room() {
        // maxSurge 1: the new set started with 1 fresh machine (available); 4 machines in
        // all, 2 must stay available, the new set lacks 2: two nodes are selected.
        let mut s = rollout(1, Orchestration::Auto);
        s.new_set = set("new", 1, 1, 2, vec![machine("fresh", false, false)]);
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["a", "b"]);
        // The fresh machine not available yet: only its unavailability is left for updates.
        s.new_set.state.available = 0;
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["a"]);
        // Both moved: the new set is complete, the last old machine is not updated but the
        // old set goes to 0.
        s.new_set.state.replicas = 3;
        s.new_set.state.available = 3;
        s.old_sets[0].state.replicas = 1;
        assert_eq!(
            reconcile_old_machine_sets(&s),
            OldSetsPlan::ScaleToZero(vec!["old".into()])
        );
    }

    #[test]
    fn after_a_move_the_next_machine_is_selected() {
        // "a" moved: old 2, new 1 (available).
        let mut s = rollout(1, Orchestration::Auto);
        s.old_sets[0] = set(
            "old",
            2,
            2,
            1,
            vec![machine("b", true, false), machine("c", true, false)],
        );
        s.new_set = set("new", 1, 1, 2, vec![machine("a", false, false)]);
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["b"]);
        // The moved machine not available yet: the new set's unavailability counts.
        s.new_set.state.available = 0;
        assert_eq!(reconcile_old_machine_sets(&s), OldSetsPlan::Nothing);
        // The machines being updated and the new set's replicas reach the replicas: stop.
        s.new_set.state.available = 1;
        s.max_unavailable = 2;
        s.old_sets[0].machines = vec![machine("b", true, true), machine("c", true, true)];
        assert_eq!(reconcile_old_machine_sets(&s), OldSetsPlan::Nothing);
    }

    #[test]
    fn manual_never_selects_and_a_complete_new_set_ends_the_old_ones() {
        let s = rollout(3, Orchestration::Manual);
        assert_eq!(reconcile_old_machine_sets(&s), OldSetsPlan::Nothing);
        // With surge the new set may be complete before every old machine moved.
        let mut s = rollout(1, Orchestration::Auto);
        s.new_set.state.replicas = 3;
        assert_eq!(
            reconcile_old_machine_sets(&s),
            OldSetsPlan::ScaleToZero(vec!["old".into()])
        );
        s.old_sets[0].state.replicas = 0;
        assert_eq!(reconcile_old_machine_sets(&s), OldSetsPlan::Nothing);
    }

    #[test]
    fn the_oldest_set_is_selected_from_first() {
        let mut s = rollout(2, Orchestration::Auto);
        s.old_sets = vec![
            set("younger", 1, 1, 5, vec![machine("y", true, false)]),
            set(
                "older",
                2,
                2,
                1,
                vec![machine("o1", true, false), machine("o2", true, false)],
            ),
        ];
        assert_eq!(selected(&reconcile_old_machine_sets(&s)), vec!["o1", "o2"]);
    }

    #[test]
    fn machines_whose_update_succeeded_move_others_stay() {
        let mut s = rollout(2, Orchestration::Auto);
        let failed = {
            let mut m = machine("b", true, true);
            m.node.as_mut().unwrap().result = Some(UpdateResult::Failed);
            m
        };
        let mut updating = updated(machine("c", true, true));
        updating.updating = true;
        s.old_sets[0].machines = vec![updated(machine("a", true, true)), failed, updating];
        assert_eq!(
            reconcile_new_machine_set(&s),
            NewSetPlan::Moves {
                moves: vec![Move {
                    machine: "a".into(),
                    from: "old".into(),
                    node: "a".into()
                }],
                old_replicas: vec![("old".into(), 2)],
                new_replicas: 1,
            }
        );
        // The label alone is not enough: the condition must say so too (and vice versa).
        let mut label_only = updated(machine("a", true, true));
        label_only.condition_successful = false;
        s.old_sets[0].machines = vec![label_only];
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Nothing);
        let mut condition_only = machine("a", true, true);
        condition_only.condition_successful = true;
        s.old_sets[0].machines = vec![condition_only];
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Nothing);
        // Nor does a machine being deleted.
        let mut deleting = updated(machine("a", true, true));
        deleting.terminating = true;
        s.old_sets[0].machines = vec![deleting];
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Nothing);
        // A machine whose Node is unknown never moves.
        let mut unknown = updated(machine("a", true, true));
        unknown.node = None;
        s.old_sets[0].machines = vec![unknown];
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Nothing);
    }

    #[test]
    fn the_new_set_is_scaled_for_lost_machines_and_never_beyond_the_replicas() {
        let mut s = rollout(1, Orchestration::Auto);
        s.new_set.state.replicas = 4;
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Scale(3));
        s.new_set.state.replicas = 1;
        s.old_sets[0].state.replicas = 1;
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Scale(2));
        s.old_sets[0].state.replicas = 0;
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Scale(3));
        s.frozen = true;
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Nothing);
        s.new_set.state.replicas = 3;
        assert_eq!(reconcile_new_machine_set(&s), NewSetPlan::Nothing);
    }

    #[test]
    fn sync_accounts_for_moved_machines_and_cleans_their_nodes() {
        let mut s = rollout(1, Orchestration::Auto);
        let mut moved = updated(machine("a", true, true));
        moved.labeled_successful = true;
        s.new_set.machines = vec![moved.clone()];
        s.old_sets[0].machines.remove(0);
        let plan = sync_machine_sets(&s);
        assert_eq!(
            plan,
            SyncPlan {
                new_replicas: Some(1),
                // Only once the raised replicas are seen.
                unlabel: Vec::new(),
                clean: vec!["a".into()],
                old_replicas: vec![("old".into(), 2)],
            }
        );
        // Accounted: the label goes.
        s.new_set.state.replicas = 1;
        s.old_sets[0].state.replicas = 2;
        let plan = sync_machine_sets(&s);
        assert_eq!(plan.new_replicas, None);
        assert_eq!(plan.unlabel, vec!["a"]);
        assert!(plan.old_replicas.is_empty());
        // Cleaned up: nothing left to do.
        moved.labeled_successful = false;
        moved.node.as_mut().unwrap().result = None;
        s.new_set.machines = vec![moved];
        assert!(sync_machine_sets(&s).is_empty());
    }

    #[test]
    fn old_sets_get_scale_up_disabled_and_their_nodes_become_candidates() {
        let mut s = rollout(1, Orchestration::Auto);
        s.old_sets[0].machines[1] = machine("b", false, false);
        s.old_sets[0].machines[2].node = None;
        assert_eq!(sets_to_disable_scale_up(&s), vec!["old"]);
        assert_eq!(nodes_to_mark_candidate(&s), vec!["b"]);
        s.old_sets[0].scale_up_disabled = true;
        assert!(sets_to_disable_scale_up(&s).is_empty());
        // Scaled to zero: not labelled (upstream leaves them alone).
        s.old_sets[0].scale_up_disabled = false;
        s.old_sets[0].state.replicas = 0;
        assert!(sets_to_disable_scale_up(&s).is_empty());
    }
}
