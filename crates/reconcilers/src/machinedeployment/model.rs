//! Plain data of the MachineDeployment controller: the deployment and its sets as the
//! rollout decisions see them ([`Snapshot`], [`Rollout`], [`SetState`], [`Strategy`]), the
//! actions they return ([`Action`]), and the plans of the revision bookkeeping and of a
//! rollback.

use jiff::Timestamp;

pub(crate) use mcm_api::policy::strategy::{Orchestration, Strategy};

/// The deployment as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rollout {
    /// `spec.replicas`.
    pub replicas: i32,
    /// The strategy with resolved limits.
    pub strategy: Strategy,
    /// `spec.paused`.
    pub paused: bool,
    /// The deployment carries the `freeze` label: only scale-downs are applied.
    pub frozen: bool,
}

/// One MachineSet of the deployment with counts taken from its machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetState {
    /// Name of the set.
    pub name: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Machines of the set that are not terminating.
    pub machines: i32,
    /// Terminating machines of the set.
    pub terminating: i32,
    /// Ready machines.
    pub ready: i32,
    /// Available machines (ready for `minReadySeconds`).
    pub available: i32,
    /// Failed machines kept for their preservation (upstream's MachineSet
    /// `status.preservedFailedReplicas`).
    pub preserved_failed: i32,
    /// Creation time (older sets are scaled down first).
    pub created: Option<Timestamp>,
    /// Annotation `deployment.kubernetes.io/desired-replicas`.
    pub desired_annotation: Option<i32>,
    /// Annotation `deployment.kubernetes.io/max-replicas`.
    pub max_annotation: Option<i32>,
}

impl SetState {
    /// A set with the given name and replicas and nothing else.
    #[cfg(test)]
    pub(crate) fn new(name: &str, replicas: i32) -> Self {
        SetState {
            name: name.to_owned(),
            replicas,
            machines: 0,
            terminating: 0,
            ready: 0,
            available: 0,
            preserved_failed: 0,
            created: None,
            desired_annotation: None,
            max_annotation: None,
        }
    }

    /// Available machines that survive the set's own scale-down: `min(available, replicas)`.
    pub(crate) fn effective_available(&self) -> i32 {
        self.available.min(self.replicas).max(0)
    }

    /// Machines that exist or will exist: `max(replicas, machines)`.
    pub(crate) fn footprint(&self) -> i32 {
        self.replicas.max(self.machines)
    }
}

/// The deployment with its new set (template equal to the deployment's) and old sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// The deployment.
    pub rollout: Rollout,
    /// The set whose template matches the deployment's, if it exists.
    pub new_set: Option<SetState>,
    /// All other sets of the deployment.
    pub old_sets: Vec<SetState>,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Create the new MachineSet with this many replicas.
    CreateNewSet {
        /// Initial replicas of the new set.
        replicas: i32,
    },
    /// Set a MachineSet's replicas (and its desired/max replicas annotations).
    Scale {
        /// Name of the set.
        set: String,
        /// New `spec.replicas`.
        replicas: i32,
    },
}

impl Action {
    /// Scale the set `set` to `replicas`.
    pub(crate) fn scale(set: &str, replicas: i32) -> Self {
        Action::Scale {
            set: set.to_owned(),
            replicas,
        }
    }
}

impl Snapshot {
    /// The new set (if any) and the old sets.
    pub(crate) fn all(&self) -> Vec<&SetState> {
        self.new_set.iter().chain(self.old_sets.iter()).collect()
    }

    /// Whether the rollout is finished: the new set has all desired replicas available and
    /// no old machine is left.
    pub(crate) fn is_complete(&self) -> bool {
        let d = self.rollout.replicas;
        let new_ok = match &self.new_set {
            Some(n) => n.replicas == d && n.machines == d && n.available >= d,
            None => d == 0 && self.old_sets.is_empty(),
        };
        new_ok
            && self
                .old_sets
                .iter()
                .all(|s| s.replicas == 0 && s.machines == 0)
    }
}

/// The revision bookkeeping of a deployment's new set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RevisionPlan {
    /// The revision of the new set (and of the deployment).
    pub revision: i64,
    /// The new set's revision history (comma separated) when its revision must be raised
    /// above the old sets' (`None`: the set's revision is fine).
    pub bump: Option<Option<String>>,
    /// Whether the deployment's revision annotation must be set to `revision`.
    pub update_deployment: bool,
}

/// One set of a deployment as a rollback sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RollbackCandidate {
    /// The set's name.
    pub name: String,
    /// Its revision annotation (0 when absent, as upstream reads it).
    pub revision: i64,
    /// Its template equals the deployment's (the hash label aside).
    pub same_template: bool,
}

/// What `spec.rollbackTo` leads to. Every outcome clears `rollbackTo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RollbackPlan {
    /// No set has the revision: Warning `DeploymentRollbackRevisionNotFound` with `message`.
    NotFound {
        /// Upstream's message.
        message: &'static str,
    },
    /// The set of the revision has the deployment's template already: Warning
    /// `DeploymentRollbackTemplateUnchanged`.
    Unchanged {
        /// The set.
        set: String,
        /// Its revision.
        revision: i64,
    },
    /// Copy the template of `set` into the deployment: Normal `DeploymentRollback`.
    To {
        /// The set.
        set: String,
        /// Its revision.
        revision: i64,
    },
}

/// The value of the in-place labels of Nodes and of `scale-up-disabled`.
pub(crate) const LABEL_TRUE: &str = "true";
