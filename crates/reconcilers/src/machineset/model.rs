//! Plain data of the MachineSet controller: what it knows of one machine
//! ([`MachineView`]), of the set ([`SetInput`]), and what it plans ([`ReplicaPlan`],
//! [`AutoPreservePlan`], [`Claim`]) and counts ([`SetCounts`]); what one reconcile decides
//! from ([`Snapshot`]) and the changes a set waits to see ([`PendingChanges`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use mcm_api::constants::{annotations, labels};
use mcm_api::preservation;
use mcm_api::{
    Machine, MachineDisruptionBudget, MachinePhase, MachineSet, MachineState, MachineSummary,
};

use crate::disruptionbudget::gate::GateView;

use crate::selector::labels_contain;

/// Priority of machines without (or with an unparsable) priority annotation.
pub(crate) const DEFAULT_PRIORITY: i32 = 3;

/// What the set controller needs to know about one of its machines.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MachineView {
    /// Name of the machine.
    pub name: String,
    /// Current phase (`None` for a machine the machine controller has not processed yet).
    pub phase: Option<MachinePhase>,
    /// Deletion priority (annotation `machinepriority.machine.sapcloud.io`, default 3).
    pub priority: i32,
    /// When the machine was marked for deletion (annotation
    /// `machine.sapcloud.io/marked-for-deletion-time`, RFC 3339).
    pub marked_for_deletion: Option<Timestamp>,
    /// Creation time.
    pub created: Option<Timestamp>,
    /// Whether the machine has a deletion timestamp.
    pub deleting: bool,
    /// When the current phase was entered (`status.currentStatus.lastUpdateTime`).
    pub phase_since: Option<Timestamp>,
    /// Whether the machine carries all labels of the set's template.
    pub fully_labeled: bool,
    /// Preserved now: `status.currentStatus.preserveExpiryTime` is in the future
    /// ([`preservation::is_preserved`]). Such machines are deleted last on a scale-down.
    pub preserved: bool,
    /// The Machine carries `node.machine.sapcloud.io/preserve: auto-preserved`.
    pub auto_preserved: bool,
    /// `status.currentStatus.preserveExpiryTime`.
    pub preserve_expiry: Option<Timestamp>,
    /// When Failed, the set keeps the machine instead of replacing it: it is preserved or
    /// its preservation is starting ([`preservation::failed_machine_to_terminate`] is false).
    pub keep_if_failed: bool,
    /// Summary of the machine when its last operation failed (`status.failedMachines` takes
    /// it through [`MachineView::failed_summary`], which leaves preserved Failed machines out).
    pub failure: Option<MachineSummary>,
    /// The Machine carries the label `node.machine.sapcloud.io/update-result: successful`: an
    /// in-place rollout just moved it to this set
    /// ([`plan_replicas`](super::decide::plan_replicas) never deletes it as surplus, the
    /// set's replicas are raised right after the move).
    pub update_successful: bool,
}

impl MachineView {
    /// Builds the view of `machine` for a set with the given template labels;
    /// `node_preserve` is the preserve annotation of the machine's Node (`None` when the Node
    /// has none or is not known).
    pub(crate) fn from_machine(
        machine: &Machine,
        template_labels: Option<&BTreeMap<String, String>>,
        node_preserve: Option<&str>,
        now: Timestamp,
    ) -> Self {
        let meta = &machine.metadata;
        let anns = meta.annotations.as_ref();
        let current = machine
            .status
            .as_ref()
            .and_then(|s| s.current_status.as_ref());
        let last_op = machine
            .status
            .as_ref()
            .and_then(|s| s.last_operation.as_ref());
        let failure = last_op
            .filter(|op| op.state == Some(MachineState::Failed))
            .map(|op| MachineSummary {
                name: meta.name.clone(),
                provider_id: machine.spec.provider_id.clone(),
                last_operation: Some(op.clone()),
                owner_ref: mcm_api::owner::controller_of(meta).map(|r| r.name.clone()),
            });
        MachineView {
            name: meta.name.clone().unwrap_or_default(),
            phase: machine.phase().cloned(),
            priority: priority_of(machine),
            marked_for_deletion: anns
                .and_then(|a| a.get(annotations::MARKED_FOR_DELETION_TIME))
                .and_then(|v| v.parse().ok()),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            deleting: meta.deletion_timestamp.is_some(),
            phase_since: current
                .and_then(|c| c.last_update_time.as_ref())
                .map(|t| t.0),
            fully_labeled: labels_contain(meta.labels.as_ref(), template_labels),
            preserved: preservation::is_preserved(machine, now),
            auto_preserved: preservation::is_auto_preserved(machine),
            preserve_expiry: preservation::expiry(machine),
            keep_if_failed: !preservation::failed_machine_to_terminate(machine, node_preserve, now),
            failure,
            update_successful: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::UPDATE_RESULT))
                .is_some_and(|v| v == labels::update_result::SUCCESSFUL),
        }
    }

    /// Failed with a preservation expiry set (upstream's `isMachinePreservedAndFailed`):
    /// counted in `status.preservedFailedReplicas`, not among the failed machines.
    pub(crate) fn is_preserved_failed(&self) -> bool {
        self.is_failed() && self.preserve_expiry.is_some()
    }

    /// The summary for `status.failedMachines`: the last operation failed and the machine
    /// is not a preserved Failed one.
    pub(crate) fn failed_summary(&self) -> Option<&MachineSummary> {
        self.failure
            .as_ref()
            .filter(|_| !self.is_preserved_failed())
    }

    /// A Failed machine the set deletes (and replaces).
    pub(crate) fn is_failed_to_replace(&self) -> bool {
        self.is_failed() && !self.keep_if_failed
    }

    /// Deleted or being deleted: no longer counts towards the set's replicas.
    pub(crate) fn is_terminating(&self) -> bool {
        self.deleting || self.phase == Some(MachinePhase::Terminating)
    }

    /// In phase `Failed`.
    pub(crate) fn is_failed(&self) -> bool {
        self.phase == Some(MachinePhase::Failed)
    }

    /// Ready: in phase `Running` and not terminating (upstream's `isMachineReady`).
    pub(crate) fn is_ready(&self) -> bool {
        !self.is_terminating() && self.phase == Some(MachinePhase::Running)
    }

    /// In a phase that counts as available: `Running`, or `Available` (a machine whose VM
    /// exists; without a target cluster machines stay there), and not terminating (upstream's
    /// `isMachineAvailable`).
    pub(crate) fn is_available_phase(&self) -> bool {
        !self.is_terminating()
            && matches!(
                self.phase,
                Some(MachinePhase::Running | MachinePhase::Available)
            )
    }

    /// Time until the machine becomes available, `Some(ZERO)` when it already is, `None` when
    /// it is in no available phase ([`MachineView::is_available_phase`]).
    pub(crate) fn until_available(
        &self,
        min_ready_seconds: i32,
        now: Timestamp,
    ) -> Option<Duration> {
        if !self.is_available_phase() {
            return None;
        }
        if min_ready_seconds <= 0 {
            return Some(Duration::ZERO);
        }
        let Some(since) = self.phase_since else {
            return Some(Duration::ZERO);
        };
        let ready_at = since.as_second() + i64::from(min_ready_seconds);
        let left = ready_at - now.as_second();
        Some(Duration::from_secs(u64::try_from(left.max(0)).unwrap_or(0)))
    }
}

/// The deletion priority of a machine: the priority annotation, 3 when absent or invalid.
pub(crate) fn priority_of(machine: &Machine) -> i32 {
    machine
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::MACHINE_PRIORITY))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_PRIORITY)
}

/// What the set looks like to [`plan_replicas`](super::decide::plan_replicas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SetInput {
    /// `spec.replicas`.
    pub replicas: i32,
    /// The set carries the `freeze: True` label.
    pub frozen: bool,
    /// The set carries the scale-up-disabled label.
    pub scale_up_disabled: bool,
    /// The set has a deletion timestamp.
    pub deleting: bool,
    /// The set's `machine.sapcloud.io/last-deployment-replica-change-by-scaler-time`
    /// (copied from its deployment): machines the scaler marked for deletion at or before
    /// it are deleted ([`marked_by_scaler`](super::decide::marked_by_scaler)).
    pub replica_change_time: Option<Timestamp>,
}

/// Machines to create and to delete.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ReplicaPlan {
    /// Number of machines to create (in slow-start batches).
    pub create: usize,
    /// Names of the machines to delete, in deletion order.
    pub delete: Vec<String>,
    /// Why no machine is created although some are missing.
    pub scale_up_blocked: Option<&'static str>,
}

/// The set's relation to one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Controlled by the set and selected by it.
    Owned,
    /// An orphan selected by the set: take a controller reference.
    Adopt,
    /// Controlled by the set but no longer selected: drop the controller reference.
    Release,
    /// Not the set's business.
    Ignore,
}

/// Status counters of a set.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct SetCounts {
    /// All claimed machines (MCM counts terminating ones too).
    pub replicas: i32,
    /// Claimed machines carrying all template labels.
    pub fully_labeled: i32,
    /// Ready (Running) machines.
    pub ready: i32,
    /// Machines in an available phase (Running or Available) for at least
    /// `minReadySeconds`.
    pub available: i32,
    /// Summaries of machines whose last operation failed (preserved Failed machines not
    /// among them).
    pub failed: Vec<MachineSummary>,
    /// Failed machines with a preservation expiry (`status.preservedFailedReplicas`).
    pub preserved_failed: i32,
    /// Machines annotated `auto-preserved`, whatever their phase
    /// (`status.autoPreserveFailedMachineCount`).
    pub auto_preserved: i32,
    /// When to look again because a machine becomes available.
    pub recheck_after: Option<Duration>,
}

/// Annotation changes of upstream's `manageAutoPreservationOfFailedMachines`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct AutoPreservePlan {
    /// Failed machines to annotate `auto-preserved` (newest first).
    pub annotate: Vec<String>,
    /// Machines whose `auto-preserved` annotation is removed (oldest first).
    pub release: Vec<String>,
}

/// Creations and deletions a set issued and waits to see in the machine store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingChanges {
    /// Names of the machines created.
    pub(crate) created: HashSet<String>,
    /// Names of the machines deleted.
    pub(crate) deleted: HashSet<String>,
    /// When they were issued.
    pub(crate) since: Instant,
}

/// Everything one reconcile of a set decides from, read once
/// ([`super::gather::gather`]).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The set.
    pub(crate) set: Arc<MachineSet>,
    /// `namespace/name` of the set (its expectations key).
    pub(crate) key: String,
    /// The wall clock now.
    pub(crate) now: Timestamp,
    /// The monotonic clock now.
    pub(crate) instant: Instant,
    /// The machines of the set's namespace.
    pub(crate) machines: Vec<Arc<Machine>>,
    /// The creations and deletions the set waits to see.
    pub(crate) pending: Option<PendingChanges>,
    /// The preserve annotation of the Node of each Failed machine of the namespace that has
    /// one (by machine name).
    pub(crate) node_preserve: BTreeMap<String, String>,
    /// The machines of the namespace whose Node carries the `Preserved` condition.
    pub(crate) node_preserved: BTreeSet<String>,
    /// The set is an old set of a rolling MachineDeployment.
    pub(crate) old_set_of_rollout: bool,
    /// The MachineDisruptionBudgets.
    pub(crate) budgets: Vec<Arc<MachineDisruptionBudget>>,
    /// The budget gate as this reconcile saw it.
    pub(crate) gate: GateView,
}
