//! Plain data of an in-place rollout: the Nodes and Machines as it sees them
//! ([`NodeFacts`], [`MachineFacts`]), the deployment's sets with their machines
//! ([`InPlaceSnapshot`]) and the plans of its steps.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::ResourceExt;
use mcm_api::constants::{labels, node_conditions};
use mcm_api::{Machine, MachinePhase};

use super::super::model::{Orchestration, SetState};

/// What the node agent reported (Node label `node.machine.sapcloud.io/update-result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpdateResult {
    /// `successful`.
    Successful,
    /// `failed`.
    Failed,
    /// Any other value.
    Unknown,
}

impl UpdateResult {
    /// The result a label value stands for.
    pub(crate) fn parse(value: &str) -> Self {
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
pub(crate) struct NodeFacts {
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
    pub(crate) fn of(node: &Node) -> Self {
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
pub(crate) struct MachineFacts {
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
    pub(crate) fn of(machine: &Machine, node: Option<&Node>) -> Self {
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
            terminating: machine.is_terminating(),
        }
    }

    /// The node's update succeeded: the condition says `UpdateSuccessful` and the node
    /// carries `update-result: successful` (upstream's `!isUpdateNotSuccessful`). A machine
    /// whose Node is unknown never did.
    pub(crate) fn update_successful(&self) -> bool {
        self.condition_successful
            && self
                .node
                .as_ref()
                .is_some_and(|n| n.result == Some(UpdateResult::Successful))
    }
}

/// A set of the deployment with its machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InPlaceSet {
    /// The set's counts (`replicas` follows the scalings of this reconcile).
    pub state: SetState,
    /// The set carries `scale-up-disabled`.
    pub scale_up_disabled: bool,
    /// All its machines, terminating ones too (upstream lists them by selector).
    pub machines: Vec<MachineFacts>,
}

/// The deployment's in-place rollout as one reconcile sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InPlaceSnapshot {
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
    pub(crate) fn scale(&mut self, name: &str, replicas: i32) {
        for set in std::iter::once(&mut self.new_set).chain(self.old_sets.iter_mut()) {
            if set.state.name == name {
                set.state.replicas = replicas;
            }
        }
    }

    /// The new set and the old sets.
    pub(crate) fn all(&self) -> impl Iterator<Item = &InPlaceSet> {
        std::iter::once(&self.new_set).chain(self.old_sets.iter())
    }
}

/// What [`sync_machine_sets`](super::decide::sync_machine_sets) changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SyncPlan {
    /// New replicas of the new set, accounting for machines moved to it.
    pub new_replicas: Option<i32>,
    /// Machines of the new set whose `update-result` label goes (the move is accounted).
    pub unlabel: Vec<String>,
    /// Nodes of the new set's machines to clean up
    /// ([`cleanup_patch`](super::patch::cleanup_patch), uncordon).
    pub clean: Vec<String>,
    /// Old sets scaled down to the machines they still have.
    pub old_replicas: Vec<(String, i32)>,
}

impl SyncPlan {
    /// Whether nothing changes.
    pub(crate) fn is_empty(&self) -> bool {
        *self == SyncPlan::default()
    }
}

/// A machine moving from an old set to the new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    /// The machine.
    pub machine: String,
    /// Its old set.
    pub from: String,
    /// Its Node (uncordoned after the move).
    pub node: String,
}

/// What [`reconcile_new_machine_set`](super::decide::reconcile_new_machine_set) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NewSetPlan {
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

/// What [`reconcile_old_machine_sets`](super::decide::reconcile_old_machine_sets) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OldSetsPlan {
    /// Nothing.
    Nothing,
    /// The new set is complete: scale these old sets to 0 (machines left over after a
    /// surge).
    ScaleToZero(Vec<String>),
    /// Label these Nodes `selected-for-update`.
    Select(Vec<String>),
}
