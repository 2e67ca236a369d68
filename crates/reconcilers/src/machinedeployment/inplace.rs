//! The MachineDeployment controller's part of an in-place update (strategy `InPlaceUpdate`,
//! upstream's `rolloutInPlace`), as pure decisions; [`super::inplace_act`] carries them out.
//!
//! Machines are not replaced: the nodes of the old sets' machines are labelled
//! `candidate-for-update`, some of them `selected-for-update` (by this controller within
//! `maxUnavailable` under [`Orchestration::Auto`], by a user under
//! [`Orchestration::Manual`]); the machine controller drains a selected node and the node
//! agent updates it. Once the node reports `update-result: successful` and its
//! `InPlaceUpdate` condition says `UpdateSuccessful`, its machine **moves** to the new set
//! (one patch of its controller reference and labels; same name, same VM), the old set is
//! scaled down and the new one up by the number moved, and the node is cleaned up
//! (labels removed, uncordoned, the old-set taint replaced by Gardener's
//! critical-components-not-ready taint). The old sets carry `scale-up-disabled`, so that
//! they never replace a machine that just left them.
//!
//! One reconcile runs the steps of upstream in order: label the old sets
//! ([`sets_to_disable_scale_up`]), mark candidates ([`nodes_to_mark_candidate`]),
//! [`sync_machine_sets`], [`reconcile_new_machine_set`] (the moves) and, unless that
//! scaled, [`reconcile_old_machine_sets`] (the selection). Each step decides from the state
//! the previous ones left ([`InPlaceSnapshot::scale`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use mcm_api::constants::{annotations, labels, node_conditions, taints};
use mcm_api::intstr::{IntOrPercentError, scaled_value};
use mcm_api::{Machine, MachineDeployment, MachinePhase, MachineSet, OrchestrationType};
use serde_json::{Value, json};

use super::decide::{Orchestration, SetState, Strategy};

/// One of the two limits of an in-place update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlaceLimit {
    /// `spec.strategy.inPlaceUpdate.maxSurge`.
    MaxSurge,
    /// `spec.strategy.inPlaceUpdate.maxUnavailable`.
    MaxUnavailable,
}

impl InPlaceLimit {
    /// The field path of the limit in a MachineDeployment.
    pub fn path(self) -> &'static str {
        match self {
            InPlaceLimit::MaxSurge => "spec.strategy.inPlaceUpdate.maxSurge",
            InPlaceLimit::MaxUnavailable => "spec.strategy.inPlaceUpdate.maxUnavailable",
        }
    }
}

impl std::fmt::Display for InPlaceLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// Why an `InPlaceUpdate` strategy cannot be used (upstream's validation of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InPlaceStrategyError {
    /// `spec.strategy.inPlaceUpdate` is missing.
    #[error(
        "spec.strategy.inPlaceUpdate: InPlaceUpdate parameter cannot be nil for in-place update strategy"
    )]
    Missing,
    /// `orchestrationType` is neither `Auto` nor `Manual` (`None`: unset).
    #[error(
        "spec.strategy.inPlaceUpdate.orchestrationType: {}orchestrationType must be either Auto or Manual",
        written(.0.as_deref())
    )]
    Orchestration(Option<String>),
    /// A limit is unset: an in-place update has no defaults (upstream requires both).
    #[error("{0}: required for the InPlaceUpdate strategy")]
    LimitMissing(InPlaceLimit),
    /// A limit is no non-negative integer or percentage.
    #[error("{field}: {source}")]
    Limit {
        /// The limit.
        field: InPlaceLimit,
        /// Why its value cannot be used.
        #[source]
        source: IntOrPercentError,
    },
}

fn written(value: Option<&str>) -> String {
    value.map_or_else(|| "unset: ".to_owned(), |v| format!("{v:?}: "))
}

/// The resolved limits of an in-place update for `replicas` (upstream's `MaxUnavailable`):
/// `Manual` allows no surge; when both limits are 0, one machine may be unavailable; never
/// more unavailable than `replicas`.
pub fn fenceposts(
    max_surge: i32,
    max_unavailable: i32,
    orchestration: Orchestration,
    replicas: i32,
) -> (i32, i32) {
    let surge = match orchestration {
        Orchestration::Auto => max_surge,
        Orchestration::Manual => 0,
    };
    let unavailable = if surge == 0 && max_unavailable == 0 {
        1
    } else {
        max_unavailable
    };
    (surge, unavailable.min(replicas.max(0)))
}

/// The deployment's `InPlaceUpdate` strategy, checked as upstream validates it and resolved
/// for its replicas ([`fenceposts`]; surge rounds up, unavailability down).
pub fn resolve_strategy(d: &MachineDeployment) -> Result<Strategy, InPlaceStrategyError> {
    let spec = d
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.in_place_update.as_ref())
        .ok_or(InPlaceStrategyError::Missing)?;
    let orchestration = match &spec.orchestration_type {
        Some(OrchestrationType::Auto) => Orchestration::Auto,
        Some(OrchestrationType::Manual) => Orchestration::Manual,
        other => {
            let value = other.as_ref().map(|o| o.as_str().to_owned());
            return Err(InPlaceStrategyError::Orchestration(value));
        }
    };
    let replicas = d.spec.replicas();
    let limit = |field: InPlaceLimit, value: Option<&IntOrString>| {
        let value = value.ok_or(InPlaceStrategyError::LimitMissing(field))?;
        let round_up = field == InPlaceLimit::MaxSurge;
        scaled_value(value, replicas, round_up)
            .map_err(|source| InPlaceStrategyError::Limit { field, source })
    };
    let limits = &spec.update_configuration;
    let surge = limit(InPlaceLimit::MaxSurge, limits.max_surge.as_ref())?;
    let unavailable = limit(
        InPlaceLimit::MaxUnavailable,
        limits.max_unavailable.as_ref(),
    )?;
    let (max_surge, max_unavailable) = fenceposts(surge, unavailable, orchestration, replicas);
    Ok(Strategy::InPlaceUpdate {
        max_surge,
        max_unavailable,
        orchestration,
    })
}

/// Replicas of a new set created for an in-place update (upstream's `NewISNewReplicas`):
/// none under `Manual` (machines only arrive by moving); under `Auto` as many fresh machines
/// as `replicas + max_surge` leaves room for beside the old sets' machines, at most
/// `replicas`.
pub fn initial_new_replicas(
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

/// What the node agent reported (Node label `node.machine.sapcloud.io/update-result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateResult {
    /// `successful`.
    Successful,
    /// `failed`.
    Failed,
    /// Any other value.
    Unknown,
}

impl UpdateResult {
    /// The result a label value stands for.
    pub fn parse(value: &str) -> Self {
        match value {
            labels::update_result::SUCCESSFUL => UpdateResult::Successful,
            labels::update_result::FAILED => UpdateResult::Failed,
            _ => UpdateResult::Unknown,
        }
    }
}

fn in_place_condition(conditions: &[NodeCondition]) -> Option<&NodeCondition> {
    conditions
        .iter()
        .find(|c| c.type_ == node_conditions::IN_PLACE_UPDATE)
}

fn says_successful(condition: Option<&NodeCondition>) -> bool {
    condition.and_then(|c| c.reason.as_deref())
        == Some(node_conditions::in_place::UPDATE_SUCCESSFUL)
}

/// A Node as the in-place rollout sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// The Node's name.
    pub name: String,
    /// It carries `candidate-for-update`.
    pub candidate: bool,
    /// It carries `selected-for-update`.
    pub selected: bool,
    /// Its `update-result` label.
    pub result: Option<UpdateResult>,
    /// Its `InPlaceUpdate` condition has the reason `UpdateSuccessful`.
    pub condition_successful: bool,
}

impl NodeFacts {
    /// The facts of `node`.
    pub fn of(node: &Node) -> Self {
        let node_labels = node.labels();
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or(&[]);
        NodeFacts {
            name: node.name_any(),
            candidate: node_labels.contains_key(labels::CANDIDATE_FOR_UPDATE),
            selected: node_labels.contains_key(labels::SELECTED_FOR_UPDATE),
            result: node_labels
                .get(labels::UPDATE_RESULT)
                .map(|v| UpdateResult::parse(v)),
            condition_successful: says_successful(in_place_condition(conditions)),
        }
    }
}

/// A Machine of the deployment as the in-place rollout sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MachineFacts {
    /// The Machine's name.
    pub name: String,
    /// Its Node (`node` label) from the Node store; `None` without the label or the Node.
    pub node: Option<NodeFacts>,
    /// The `InPlaceUpdate` condition says `UpdateSuccessful`: the Node's condition when the
    /// Node is known, else the copy in the Machine's `status.conditions`.
    pub condition_successful: bool,
    /// The Machine carries `update-result: successful` (it was just moved to its set).
    pub labeled_successful: bool,
    /// In phase `InPlaceUpdating`.
    pub updating: bool,
    /// Being deleted (deletion timestamp or phase `Terminating`): neither selected nor moved.
    pub terminating: bool,
}

impl MachineFacts {
    /// The facts of `machine` with its Node (`None` when it has none or it is unknown).
    pub fn of(machine: &Machine, node: Option<&Node>) -> Self {
        let node = node.map(NodeFacts::of);
        let own = machine
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or(&[]);
        let condition_successful = node.as_ref().map_or_else(
            || says_successful(in_place_condition(own)),
            |n| n.condition_successful,
        );
        MachineFacts {
            name: machine.name_any(),
            node,
            condition_successful,
            labeled_successful: machine
                .labels()
                .get(labels::UPDATE_RESULT)
                .is_some_and(|v| v == labels::update_result::SUCCESSFUL),
            updating: machine.phase() == Some(&MachinePhase::InPlaceUpdating),
            terminating: machine.metadata.deletion_timestamp.is_some()
                || machine.phase() == Some(&MachinePhase::Terminating),
        }
    }

    /// The node's update succeeded: the condition says `UpdateSuccessful` and the node
    /// carries `update-result: successful` (upstream's `!isUpdateNotSuccessful`). A machine
    /// whose Node is unknown never did.
    pub fn update_successful(&self) -> bool {
        self.condition_successful
            && self
                .node
                .as_ref()
                .is_some_and(|n| n.result == Some(UpdateResult::Successful))
    }
}

/// A set of the deployment with its machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlaceSet {
    /// The set's counts (`replicas` follows the scalings of this reconcile).
    pub state: SetState,
    /// The set carries `scale-up-disabled`.
    pub scale_up_disabled: bool,
    /// All its machines, terminating ones too (upstream lists them by selector).
    pub machines: Vec<MachineFacts>,
}

/// The deployment's in-place rollout as one reconcile sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlaceSnapshot {
    /// The deployment's `spec.replicas`.
    pub replicas: i32,
    /// The resolved `maxUnavailable`.
    pub max_unavailable: i32,
    /// Who selects the machines.
    pub orchestration: Orchestration,
    /// The deployment is frozen: no set is scaled up for fresh machines.
    pub frozen: bool,
    /// The new set.
    pub new_set: InPlaceSet,
    /// The old sets, oldest first.
    pub old_sets: Vec<InPlaceSet>,
}

impl InPlaceSnapshot {
    /// Records that the set `name` now has `replicas`, for the steps that follow.
    pub fn scale(&mut self, name: &str, replicas: i32) {
        for set in std::iter::once(&mut self.new_set).chain(self.old_sets.iter_mut()) {
            if set.state.name == name {
                set.state.replicas = replicas;
            }
        }
    }

    fn all(&self) -> impl Iterator<Item = &InPlaceSet> {
        std::iter::once(&self.new_set).chain(self.old_sets.iter())
    }
}

/// Whether the old sets are scaled to zero (upstream's `machineSetsScaledToZero`): no set
/// has replicas, available, ready and existing machines at once.
pub fn machine_sets_scaled_to_zero(sets: &[&SetState]) -> bool {
    !sets
        .iter()
        .any(|s| s.replicas != 0 && s.available != 0 && s.ready != 0 && s.machines != 0)
}

/// The old sets that must get `scale-up-disabled` now: all that lack it while some old set
/// is not scaled to zero.
pub fn sets_to_disable_scale_up(s: &InPlaceSnapshot) -> Vec<String> {
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
pub fn nodes_to_mark_candidate(s: &InPlaceSnapshot) -> Vec<String> {
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

/// What [`sync_machine_sets`] changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncPlan {
    /// New replicas of the new set, accounting for machines moved to it.
    pub new_replicas: Option<i32>,
    /// Machines of the new set whose `update-result` label goes (the move is accounted).
    pub unlabel: Vec<String>,
    /// Nodes of the new set's machines to clean up ([`cleanup_patch`], uncordon).
    pub clean: Vec<String>,
    /// Old sets scaled down to the machines they still have.
    pub old_replicas: Vec<(String, i32)>,
}

impl SyncPlan {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        *self == SyncPlan::default()
    }
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
pub fn sync_machine_sets(s: &InPlaceSnapshot) -> SyncPlan {
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

/// A machine moving from an old set to the new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The machine.
    pub machine: String,
    /// Its old set.
    pub from: String,
    /// Its Node (uncordoned after the move).
    pub node: String,
}

/// What [`reconcile_new_machine_set`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewSetPlan {
    /// Nothing.
    Nothing,
    /// Scale the new set to this many replicas.
    Scale(i32),
    /// Move machines whose update succeeded to the new set, then scale each old set down
    /// and the new set up by the number moved.
    Moves {
        /// The machines, by old set (oldest set first).
        moves: Vec<Move>,
        /// The old sets' replicas afterwards.
        old_replicas: Vec<(String, i32)>,
        /// The new set's replicas afterwards.
        new_replicas: i32,
    },
}

/// Upstream's `reconcileNewMachineSetInPlace`: the new set never has more than `replicas`;
/// without old replicas it gets all of them (fresh machines); when old and new replicas
/// together fall short (machines were lost), it gets the difference; otherwise the old
/// sets' machines whose update succeeded (and that are neither `InPlaceUpdating` nor being
/// deleted) move to it
/// (upstream's `transferMachinesFromOldToNewMachineSet`, [`NewSetPlan::Moves`]). A frozen
/// deployment gets no fresh machines.
pub fn reconcile_new_machine_set(s: &InPlaceSnapshot) -> NewSetPlan {
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

/// What [`reconcile_old_machine_sets`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldSetsPlan {
    /// Nothing.
    Nothing,
    /// The new set is complete: scale these old sets to 0 (machines left over after a
    /// surge).
    ScaleToZero(Vec<String>),
    /// Label these Nodes `selected-for-update`.
    Select(Vec<String>),
}

/// The old sets' machines whose Node carries `selected-for-update` (upstream's
/// `getMachinesUndergoingUpdate`).
pub fn machines_undergoing_update<'a>(sets: impl IntoIterator<Item = &'a InPlaceSet>) -> i32 {
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
pub fn reconcile_old_machine_sets(s: &InPlaceSnapshot) -> OldSetsPlan {
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
pub fn select_for_update(
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
pub fn machines_for_drain(set: &InPlaceSet, n: i32) -> Vec<String> {
    set.machines
        .iter()
        .filter(|m| !m.terminating)
        .filter_map(|m| m.node.as_ref())
        .filter(|node| node.candidate && !node.selected)
        .take(usize::try_from(n).unwrap_or(0))
        .map(|node| node.name.clone())
        .collect()
}

/// The merge patch that moves `machine` from the set whose selector has `old_selector` to
/// `new_set` (upstream's ownership transfer): its controller reference becomes `new_set`
/// (the only owner reference), its labels become its own without the old selector's keys,
/// plus the new selector's labels (so `machine-template-hash` is the new set's) and
/// `update-result: successful` (until the new set's replicas account for it). Guarded by the
/// machine's uid and resourceVersion: a stale copy (e.g. a machine moved meanwhile) fails
/// with a conflict instead of being moved twice.
pub fn transfer_patch(
    machine: &Machine,
    old_selector: &BTreeMap<String, String>,
    new_set: &MachineSet,
) -> Value {
    let mut new_labels: BTreeMap<String, String> = machine
        .labels()
        .iter()
        .filter(|(k, _)| !old_selector.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(selector) = new_set
        .spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
    {
        new_labels.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    new_labels.insert(
        labels::UPDATE_RESULT.to_owned(),
        labels::update_result::SUCCESSFUL.to_owned(),
    );
    json!({"metadata": {
        "ownerReferences": [{
            "apiVersion": mcm_api::API_VERSION,
            "kind": MachineSet::KIND,
            "name": new_set.name_any(),
            "uid": new_set.metadata.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
        "labels": new_labels,
        "uid": machine.metadata.uid,
        "resourceVersion": machine.metadata.resource_version,
    }})
}

/// Gardener's taint on a Node whose critical components are not ready (again).
pub fn critical_components_not_ready_taint() -> Taint {
    Taint {
        key: taints::CRITICAL_COMPONENTS_NOT_READY.to_owned(),
        effect: "NoSchedule".to_owned(),
        value: None,
        time_added: None,
    }
}

fn is_old_set_taint(t: &Taint) -> bool {
    t.key == taints::PREFER_NO_SCHEDULE
        && t.value.as_deref() == Some("True")
        && t.effect == "PreferNoSchedule"
}

/// The patch that cleans up a Node after its machine's successful in-place update (upstream's
/// `syncMachineSets`): the labels `candidate-for-update`, `selected-for-update`,
/// `update-result` and the annotation `update-failed-reason` go, the old-set
/// `PreferNoSchedule` taint goes, `node.gardener.cloud/critical-components-not-ready:
/// NoSchedule` comes (once). Guarded by the Node's resourceVersion (the taints are a list).
/// `None` unless the Node carries `update-result: successful` (cleaned up already). The
/// uncordon is [`mcm_drain::uncordon`]'s.
pub fn cleanup_patch(node: &Node) -> Option<Value> {
    let result = node.labels().get(labels::UPDATE_RESULT).map(String::as_str);
    if result != Some(labels::update_result::SUCCESSFUL) {
        return None;
    }
    let mut list: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    list.retain(|t| !is_old_set_taint(t));
    if !list
        .iter()
        .any(|t| t.key == taints::CRITICAL_COMPONENTS_NOT_READY && t.effect == "NoSchedule")
    {
        list.push(critical_components_not_ready_taint());
    }
    let mut node_annotations = serde_json::Map::new();
    if node
        .annotations()
        .contains_key(annotations::UPDATE_FAILED_REASON)
    {
        node_annotations.insert(annotations::UPDATE_FAILED_REASON.into(), Value::Null);
    }
    let mut patch = json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "labels": {
                labels::CANDIDATE_FOR_UPDATE: null,
                labels::SELECTED_FOR_UPDATE: null,
                labels::UPDATE_RESULT: null,
            },
        },
        "spec": {"taints": list},
    });
    if !node_annotations.is_empty() {
        patch["metadata"]["annotations"] = Value::Object(node_annotations);
    }
    Some(patch)
}

/// The value of the in-place labels of Nodes and of `scale-up-disabled`.
pub const LABEL_TRUE: &str = "true";

/// The patch that labels a Node `key: "true"`, `None` when it has that already.
pub fn label_patch(node: &Node, key: &str) -> Option<Value> {
    (node.labels().get(key).map(String::as_str) != Some(LABEL_TRUE))
        .then(|| json!({"metadata": {"labels": {key: LABEL_TRUE}}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use mcm_api::machine_deployment::{InPlaceUpdateMachineDeployment, MachineDeploymentStrategy};
    use mcm_api::{MachineDeploymentStrategyType, UpdateConfiguration};

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
    fn strategy_limits_and_surge() {
        let deployment =
            |orchestration: Option<&str>, surge: Option<i32>, unavailable: Option<IntOrString>| {
                let mut d = MachineDeployment::default();
                d.spec.replicas = Some(4);
                d.spec.strategy = Some(MachineDeploymentStrategy {
                    type_: Some(MachineDeploymentStrategyType::InPlaceUpdate),
                    in_place_update: Some(InPlaceUpdateMachineDeployment {
                        update_configuration: UpdateConfiguration {
                            max_surge: surge.map(IntOrString::Int),
                            max_unavailable: unavailable,
                        },
                        orchestration_type: orchestration.map(OrchestrationType::from),
                    }),
                    ..MachineDeploymentStrategy::default()
                });
                d
            };
        let int = |i| Some(IntOrString::Int(i));
        assert_eq!(
            resolve_strategy(&deployment(Some("Auto"), Some(1), int(2))),
            Ok(Strategy::InPlaceUpdate {
                max_surge: 1,
                max_unavailable: 2,
                orchestration: Orchestration::Auto
            })
        );
        // Manual: no surge; both 0: one unavailable; percentages round down; capped.
        assert_eq!(
            resolve_strategy(&deployment(Some("Manual"), Some(2), int(0))),
            Ok(Strategy::InPlaceUpdate {
                max_surge: 0,
                max_unavailable: 1,
                orchestration: Orchestration::Manual
            })
        );
        let pct = |p: &str| Some(IntOrString::String(p.into()));
        assert!(matches!(
            resolve_strategy(&deployment(Some("Auto"), Some(0), pct("30%"))),
            Ok(Strategy::InPlaceUpdate {
                max_unavailable: 1,
                ..
            })
        ));
        assert!(matches!(
            resolve_strategy(&deployment(Some("Auto"), Some(0), int(9))),
            Ok(Strategy::InPlaceUpdate {
                max_unavailable: 4,
                ..
            })
        ));
        // Errors name the field.
        let err = resolve_strategy(&deployment(Some("Sometimes"), Some(1), int(1))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.strategy.inPlaceUpdate.orchestrationType: \"Sometimes\": orchestrationType must be either Auto or Manual"
        );
        assert_eq!(
            resolve_strategy(&deployment(None, Some(1), int(1))),
            Err(InPlaceStrategyError::Orchestration(None))
        );
        assert_eq!(
            resolve_strategy(&deployment(Some("Auto"), None, int(1))),
            Err(InPlaceStrategyError::LimitMissing(InPlaceLimit::MaxSurge))
        );
        let err = resolve_strategy(&deployment(Some("Auto"), Some(1), pct("x"))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.strategy.inPlaceUpdate.maxUnavailable: "),
            "{err}"
        );
        let mut d = deployment(Some("Auto"), Some(1), int(1));
        d.spec.strategy.as_mut().unwrap().in_place_update = None;
        assert_eq!(resolve_strategy(&d), Err(InPlaceStrategyError::Missing));
    }

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

    fn machine_object(labels: &[(&str, &str)]) -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some("m".into());
        m.metadata.uid = Some("m-uid".into());
        m.metadata.resource_version = Some("42".into());
        m.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        m
    }

    #[test]
    fn the_transfer_patch_moves_owner_and_labels_in_one_go() {
        let m = machine_object(&[
            ("name", "md"),
            (labels::MACHINE_TEMPLATE_HASH, "old"),
            (labels::NODE, "n1"),
        ]);
        let old_selector = BTreeMap::from([
            ("name".to_owned(), "md".to_owned()),
            (labels::MACHINE_TEMPLATE_HASH.to_owned(), "old".to_owned()),
        ]);
        let mut new_set = MachineSet {
            metadata: ObjectMeta {
                name: Some("md-new".into()),
                uid: Some("set-uid".into()),
                ..ObjectMeta::default()
            },
            ..MachineSet::default()
        };
        new_set.spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("name".to_owned(), "md".to_owned()),
                (labels::MACHINE_TEMPLATE_HASH.to_owned(), "new".to_owned()),
            ])),
            ..LabelSelector::default()
        });
        let p = transfer_patch(&m, &old_selector, &new_set);
        assert_eq!(
            p,
            json!({"metadata": {
                "ownerReferences": [{
                    "apiVersion": "machine.sapcloud.io/v1alpha1",
                    "kind": "MachineSet",
                    "name": "md-new",
                    "uid": "set-uid",
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
                "labels": {
                    "name": "md",
                    "machine-template-hash": "new",
                    "node": "n1",
                    "node.machine.sapcloud.io/update-result": "successful",
                },
                "uid": "m-uid",
                "resourceVersion": "42",
            }})
        );
    }

    fn node_object(node_labels: &[(&str, &str)], node_taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                resource_version: Some("7".into()),
                labels: Some(
                    node_labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: Some(BTreeMap::from([(
                    annotations::UPDATE_FAILED_REASON.to_owned(),
                    "earlier".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(node_taints),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus::default()),
        }
    }

    #[test]
    fn the_cleanup_removes_the_in_place_marks_and_adds_the_critical_taint_once() {
        let dedicated = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        let old_set = super::super::nodes::prefer_no_schedule_taint();
        let n = node_object(
            &[
                (labels::CANDIDATE_FOR_UPDATE, "true"),
                (labels::SELECTED_FOR_UPDATE, "true"),
                (labels::UPDATE_RESULT, "successful"),
            ],
            vec![dedicated.clone(), old_set],
        );
        let p = cleanup_patch(&n).expect("a patch");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(
            p["metadata"]["labels"][labels::SELECTED_FOR_UPDATE],
            Value::Null
        );
        assert_eq!(
            p["metadata"]["labels"][labels::CANDIDATE_FOR_UPDATE],
            Value::Null
        );
        assert_eq!(p["metadata"]["labels"][labels::UPDATE_RESULT], Value::Null);
        assert_eq!(
            p["metadata"]["annotations"][annotations::UPDATE_FAILED_REASON],
            Value::Null
        );
        let taints: Vec<Taint> = serde_json::from_value(p["spec"]["taints"].clone()).unwrap();
        assert_eq!(
            taints,
            vec![dedicated.clone(), critical_components_not_ready_taint()]
        );
        // The critical taint present already: not added twice.
        let n = node_object(
            &[(labels::UPDATE_RESULT, "successful")],
            vec![critical_components_not_ready_taint()],
        );
        let taints: Vec<Taint> =
            serde_json::from_value(cleanup_patch(&n).unwrap()["spec"]["taints"].clone()).unwrap();
        assert_eq!(taints, vec![critical_components_not_ready_taint()]);
        // Without a successful result nothing is cleaned.
        let n = node_object(&[(labels::UPDATE_RESULT, "failed")], vec![dedicated]);
        assert_eq!(cleanup_patch(&n), None);
    }

    #[test]
    fn node_and_machine_facts() {
        let mut n = node_object(
            &[
                (labels::CANDIDATE_FOR_UPDATE, "true"),
                (labels::UPDATE_RESULT, "successful"),
            ],
            Vec::new(),
        );
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: node_conditions::IN_PLACE_UPDATE.into(),
                status: "True".into(),
                reason: Some(node_conditions::in_place::UPDATE_SUCCESSFUL.into()),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        let facts = NodeFacts::of(&n);
        assert!(facts.candidate && !facts.selected && facts.condition_successful);
        assert_eq!(facts.result, Some(UpdateResult::Successful));
        let m = machine_object(&[(labels::UPDATE_RESULT, "successful")]);
        let with_node = MachineFacts::of(&m, Some(&n));
        assert!(with_node.labeled_successful && with_node.update_successful());
        // Without the Node, the machine's own copy of the condition is read; the update is
        // not known to have succeeded.
        let mut m = m;
        m.status = Some(mcm_api::MachineStatus {
            conditions: n.status.as_ref().and_then(|s| s.conditions.clone()),
            ..Default::default()
        });
        let without = MachineFacts::of(&m, None);
        assert!(without.condition_successful && !without.update_successful());
        assert_eq!(label_patch(&n, labels::CANDIDATE_FOR_UPDATE), None);
        assert!(label_patch(&n, labels::SELECTED_FOR_UPDATE).is_some());
    }
}
