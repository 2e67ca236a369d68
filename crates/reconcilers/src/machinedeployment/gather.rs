//! The first part of a reconcile of a deployment: every read it decides from, taken once
//! (the stores through [`super::observe`] and [`super::inplace::observe`], the settings of
//! the context, "now" from the context's clock). No writes, no Events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use mcm_api::constants::annotations;
use mcm_api::{Machine, MachineDeployment};

use super::context::Context;
use super::creation_timeout::TimeoutAdaptation;
use super::inplace::model::InPlaceSnapshot;
use super::inplace::observe::in_place_snapshot;
use super::model::{RollbackCandidate, Snapshot};
use super::observe::{self, Facts, Observed, annotation_i64};
use super::trigger::TriggerMachine;
use crate::machine::partition::{PartitionRule, ZoneMember};
use crate::machine::remediation::Member;

/// The revisions a reconcile keeps in line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Revisions {
    /// The new set's revision annotation.
    pub(crate) new_set: Option<i64>,
    /// The new set's revision history annotation.
    pub(crate) new_set_history: Option<String>,
    /// The highest revision among the old sets (0 without any).
    pub(crate) max_old: i64,
    /// The deployment's revision annotation.
    pub(crate) deployment: Option<i64>,
}

/// Everything one reconcile of a deployment decides from.
#[derive(Debug, Clone)]
pub(crate) struct Gathered {
    /// The deployment.
    pub(crate) d: Arc<MachineDeployment>,
    /// The wall clock now.
    pub(crate) now: Timestamp,
    /// Its sets and their machines.
    pub(crate) observed: Observed,
    /// The deployment selects every machine.
    pub(crate) selects_all: bool,
    /// The machines of all its sets.
    pub(crate) all_machines: Vec<Arc<Machine>>,
    /// The machines of its old sets.
    pub(crate) old_machines: Vec<Arc<Machine>>,
    /// The machines of all sets by name, as the trigger-deletion plan sees them.
    pub(crate) trigger_machines: BTreeMap<String, TriggerMachine>,
    /// Its sets as rollback candidates.
    pub(crate) rollback_candidates: Vec<RollbackCandidate>,
    /// The revisions.
    pub(crate) revisions: Revisions,
    /// The facts of its sets at `now`.
    pub(crate) facts: Facts,
    /// Its rollout as decided from (`Err`: the strategy cannot be used, with why).
    pub(crate) rollout: Result<Snapshot, String>,
    /// Its in-place view (an `InPlaceUpdate` strategy with a new set).
    pub(crate) in_place: Option<InPlaceSnapshot>,
    /// The Nodes of its machines, by name.
    pub(crate) nodes: BTreeMap<String, Arc<Node>>,
    /// Its machines as the remediation census counts them.
    pub(crate) remediation_members: Vec<Member>,
    /// Every machine of the namespace as the zone-partition census counts it.
    pub(crate) zone_members: Vec<ZoneMember>,
    /// The zones of its machines.
    pub(crate) zones: BTreeSet<String>,
    /// The machines that may be unavailable for `Available=True`.
    pub(crate) max_unavailable: i32,
    /// The adaptation of the effective creation timeout.
    pub(crate) creation_timeouts: TimeoutAdaptation,
    /// When a zone counts as partitioned.
    pub(crate) zone_partition: PartitionRule,
    /// Annotate Nodes against cluster-autoscaler scale-down during rollouts.
    pub(crate) autoscaler_annotations: bool,
}

/// Reads what a reconcile of `d` decides from.
pub(crate) fn gather(ctx: &Context, d: &Arc<MachineDeployment>) -> Gathered {
    let now = ctx.clock.now();
    let observed = observe::observe(d, &ctx.sets.state(), &ctx.machines.state());
    let all_machines: Vec<Arc<Machine>> = observed.machines.values().flatten().cloned().collect();
    let old_machines: Vec<Arc<Machine>> = observed
        .old_sets()
        .flat_map(|s| observed.machines_of(s))
        .cloned()
        .collect();
    let facts = observe::facts(&observed, now);
    let rollout = observe::strategy_of(d, ctx.target_cluster)
        .map(|strategy| observe::snapshot(d, strategy, facts.clone()))
        .map_err(|invalid| invalid.to_string());
    let in_place = rollout
        .as_ref()
        .ok()
        .and_then(|r| in_place_snapshot(ctx, &observed, r));
    let nodes = all_machines
        .iter()
        .filter_map(|m| m.node_name())
        .filter_map(|n| Some((n.to_owned(), ctx.nodes.get(&ObjectRef::new(n))?)))
        .collect();
    let (zone_members, zones) = observe::zone_census(&observed, &ctx.machines, &ctx.nodes);
    let revisions = Revisions {
        new_set: observed
            .new_set
            .as_deref()
            .and_then(|s| annotation_i64(s, annotations::REVISION)),
        new_set_history: observed
            .new_set
            .as_ref()
            .and_then(|s| s.annotations().get(annotations::REVISION_HISTORY).cloned()),
        max_old: observed.max_old_revision(),
        deployment: annotation_i64(d.as_ref(), annotations::REVISION),
    };
    Gathered {
        d: d.clone(),
        now,
        selects_all: observe::selects_all(d),
        trigger_machines: observed.trigger_machines(),
        rollback_candidates: observe::rollback_candidates(d, &observed),
        remediation_members: observe::remediation_members(&observed, &ctx.nodes),
        max_unavailable: observe::availability_max_unavailable(d),
        all_machines,
        old_machines,
        revisions,
        facts,
        rollout,
        in_place,
        nodes,
        zone_members,
        zones,
        observed,
        creation_timeouts: ctx.creation_timeouts,
        zone_partition: ctx.zone_partition,
        autoscaler_annotations: ctx.autoscaler_annotations,
    }
}
