//! Turning a MachineDeployment, its MachineSets and their Machines into the facts the
//! decisions are made from: the contents of the stores come in as slices or are read from
//! the stores, the facts go out as plain data. Also the deployments a set, machine or Node
//! event concerns (the watch mappers).

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use mcm_api::constants::{annotations, labels};
use mcm_api::owner::controller_of;
use mcm_api::{
    Machine, MachineDeployment, MachineDeploymentStrategyType, MachinePhase, MachineSet,
    MachineSummary,
};

use super::hash::templates_equal;
use super::model::{RollbackCandidate, Rollout, SetState, Snapshot, Strategy};
#[cfg(test)]
use super::status::StatusInput;
use super::trigger::TriggerMachine;
use crate::machine::remediation::Member;
use crate::machineset::decide::{count_machines, is_frozen};
use crate::machineset::model::MachineView;

/// The sets a deployment controls, with their machines.
#[derive(Debug, Clone, Default)]
pub(crate) struct Observed {
    /// The deployment's sets, oldest first (then by name).
    pub sets: Vec<Arc<MachineSet>>,
    /// The machines of each set (by set name).
    pub machines: BTreeMap<String, Vec<Arc<Machine>>>,
    /// The set whose template equals the deployment's and that is not being deleted.
    pub new_set: Option<Arc<MachineSet>>,
}

/// The deployment's sets (controlled by its uid, in its namespace) and their machines, from
/// the contents of the set and machine stores.
pub(crate) fn observe(
    d: &MachineDeployment,
    sets: &[Arc<MachineSet>],
    machines: &[Arc<Machine>],
) -> Observed {
    let ns = d.namespace();
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let mut sets: Vec<Arc<MachineSet>> = sets
        .iter()
        .filter(|s| s.namespace() == ns)
        .filter(|s| controller_of(&s.metadata).is_some_and(|o| o.uid == uid))
        .cloned()
        .collect();
    sets.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let set_uids: BTreeMap<String, String> = sets
        .iter()
        .map(|s| (s.metadata.uid.clone().unwrap_or_default(), s.name_any()))
        .collect();
    let mut by_set: BTreeMap<String, Vec<Arc<Machine>>> = BTreeMap::new();
    for m in machines.iter().filter(|m| m.namespace() == ns) {
        if let Some(set) = controller_of(&m.metadata).and_then(|o| set_uids.get(&o.uid)) {
            by_set.entry(set.clone()).or_default().push(m.clone());
        }
    }
    let new_set = sets
        .iter()
        .find(|s| {
            s.metadata.deletion_timestamp.is_none()
                && s.spec
                    .template
                    .as_ref()
                    .is_some_and(|t| templates_equal(t, &d.spec.template))
        })
        .cloned();
    Observed {
        sets,
        machines: by_set,
        new_set,
    }
}

impl Observed {
    /// The machines of `set`.
    pub(crate) fn machines_of(&self, set: &MachineSet) -> &[Arc<Machine>] {
        self.machines
            .get(&set.name_any())
            .map_or(&[], Vec::as_slice)
    }

    /// The sets other than the new one.
    pub(crate) fn old_sets(&self) -> impl Iterator<Item = &Arc<MachineSet>> {
        let new_name = self.new_set.as_ref().map(|s| s.name_any());
        self.sets
            .iter()
            .filter(move |s| Some(s.name_any()) != new_name)
    }

    /// The machines of all sets.
    pub(crate) fn all_machines(&self) -> Vec<&Machine> {
        self.machines
            .values()
            .flatten()
            .map(AsRef::as_ref)
            .collect()
    }

    /// The highest revision among the old sets (0 without any).
    pub(crate) fn max_old_revision(&self) -> i64 {
        self.old_sets()
            .filter_map(|s| annotation_i64(s.as_ref(), annotations::REVISION))
            .max()
            .unwrap_or(0)
    }

    /// The machines of all sets by name, as the trigger-deletion plan sees them.
    pub(crate) fn trigger_machines(&self) -> BTreeMap<String, TriggerMachine> {
        self.all_machines()
            .into_iter()
            .map(|m| (m.name_any(), trigger_machine(m)))
            .collect()
    }
}

/// The facts of a deployment besides its strategy: the sets as the decision sees them and
/// the failed machines (preserved Failed machines not among them, as upstream's sets leave
/// them out of their `failedMachines`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Facts {
    /// The new set, if it exists.
    pub new_set: Option<SetState>,
    /// The other sets.
    pub old_sets: Vec<SetState>,
    /// Summaries of the machines whose last operation failed.
    pub failed: Vec<MachineSummary>,
}

/// The facts of the observed sets at `now`.
pub(crate) fn facts(observed: &Observed, now: Timestamp) -> Facts {
    let state_of = |s: &MachineSet| set_state(s, observed.machines_of(s), now);
    Facts {
        new_set: observed.new_set.as_deref().map(state_of),
        old_sets: observed.old_sets().map(|s| state_of(s)).collect(),
        failed: observed
            .all_machines()
            .into_iter()
            .filter_map(|m| {
                MachineView::from_machine(m, None, None, now)
                    .failed_summary()
                    .cloned()
            })
            .collect(),
    }
}

/// One set as the decision sees it: counts from its machines, its replica annotations.
pub(crate) fn set_state(set: &MachineSet, machines: &[Arc<Machine>], now: Timestamp) -> SetState {
    let views: Vec<MachineView> = machines
        .iter()
        .map(|m| MachineView::from_machine(m, None, None, now))
        .collect();
    let counts = count_machines(&views, set.spec.min_ready_seconds.unwrap_or(0), now);
    let terminating = machines.iter().filter(|m| m.is_terminating()).count();
    let annotation_i32 = |key: &str| annotation_i64(set, key).and_then(|v| i32::try_from(v).ok());
    SetState {
        name: set.name_any(),
        replicas: set.spec.replicas(),
        machines: i32::try_from(machines.len() - terminating).unwrap_or(i32::MAX),
        terminating: i32::try_from(terminating).unwrap_or(i32::MAX),
        ready: counts.ready,
        available: counts.available,
        preserved_failed: counts.preserved_failed,
        created: set.metadata.creation_timestamp.as_ref().map(|t| t.0),
        desired_annotation: annotation_i32(annotations::DESIRED_REPLICAS),
        max_annotation: annotation_i32(annotations::MAX_REPLICAS),
    }
}

pub(crate) use mcm_api::policy::strategy::strategy_of;

/// The snapshot the rollout is decided from.
pub(crate) fn snapshot(d: &MachineDeployment, strategy: Strategy, facts: Facts) -> Snapshot {
    Snapshot {
        rollout: Rollout {
            replicas: d.spec.replicas(),
            strategy,
            paused: d.spec.paused.unwrap_or(false),
            frozen: is_frozen(d.metadata.labels.as_ref()),
        },
        new_set: facts.new_set,
        old_sets: facts.old_sets,
    }
}

/// The inputs of the status computation besides the snapshot (the plan's own builds them
/// from what it gathered).
#[cfg(test)]
pub(crate) fn status_input(
    d: &MachineDeployment,
    failed: Vec<MachineSummary>,
    progressed: bool,
    now: Timestamp,
) -> StatusInput<'_> {
    StatusInput {
        generation: d.metadata.generation,
        progress_deadline_seconds: d.spec.progress_deadline_seconds,
        previous: d.status.as_ref(),
        failed_machines: failed,
        progressed,
        now,
        max_unavailable: availability_max_unavailable(d),
    }
}

/// The machines that may be unavailable while the deployment still counts as `Available`:
/// the Go MCM's rule (`MaxUnavailable`), read from the spec as written. It is 0 unless the
/// strategy is explicitly `RollingUpdate` or `InPlaceUpdate` with both limits set (an unset
/// or unusable limit makes upstream's resolution fail, which counts as 0), and when there
/// are no replicas; a `Manual` in-place update has no surge; both resolving to 0 gives 1;
/// never more than the replicas. So a deployment without a strategy, none of whose machines
/// is available, is not `Available`. (The rollout itself uses [`strategy_of`], which
/// defaults unset limits to 1.) Pure.
pub(crate) fn availability_max_unavailable(d: &MachineDeployment) -> i32 {
    use mcm_api::intstr::scaled_value;
    let replicas = d.spec.replicas();
    let Some(strategy) = d.spec.strategy.as_ref() else {
        return 0;
    };
    let (limits, manual) = match strategy.type_ {
        Some(MachineDeploymentStrategyType::RollingUpdate) => (
            strategy
                .rolling_update
                .as_ref()
                .map(|r| &r.update_configuration),
            false,
        ),
        Some(MachineDeploymentStrategyType::InPlaceUpdate) => {
            let in_place = strategy.in_place_update.as_ref();
            (
                in_place.map(|i| &i.update_configuration),
                in_place.and_then(|i| i.orchestration_type.as_ref())
                    == Some(&mcm_api::OrchestrationType::Manual),
            )
        }
        _ => return 0,
    };
    if replicas == 0 {
        return 0;
    }
    let Some(limits) = limits else {
        return 0;
    };
    let zero = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0);
    let surge = if manual {
        Some(&zero)
    } else {
        limits.max_surge.as_ref()
    };
    let resolved = surge
        .zip(limits.max_unavailable.as_ref())
        .and_then(|(s, u)| {
            let surge = scaled_value(s, replicas, true).ok()?;
            let unavailable = scaled_value(u, replicas, false).ok()?;
            Some(if surge == 0 && unavailable == 0 {
                1
            } else {
                unavailable
            })
        });
    resolved.unwrap_or(0).min(replicas)
}

/// Whether the deployment's selector is missing or empty (it would select every machine).
pub(crate) fn selects_all(d: &MachineDeployment) -> bool {
    d.spec
        .selector
        .as_ref()
        .is_none_or(|s| s == &LabelSelector::default())
}

/// An integer annotation of an object.
pub(crate) fn annotation_i64<K: Resource>(obj: &K, key: &str) -> Option<i64> {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse().ok())
}

/// A machine as the trigger-deletion plan sees it.
pub(crate) fn trigger_machine(m: &Machine) -> TriggerMachine {
    let anns = m.annotations();
    TriggerMachine {
        gone_or_failed: m.is_terminating() || m.phase() == Some(&MachinePhase::Failed),
        priority_one: anns.get(annotations::MACHINE_PRIORITY).map(String::as_str) == Some("1"),
        marked: anns
            .get(annotations::MARKED_FOR_DELETION_TIME)
            .is_some_and(|t| !t.is_empty()),
    }
}

/// The sets of the deployment `d` as rollback candidates.
pub(crate) fn rollback_candidates(
    d: &MachineDeployment,
    observed: &Observed,
) -> Vec<RollbackCandidate> {
    observed
        .sets
        .iter()
        .map(|s| RollbackCandidate {
            name: s.name_any(),
            revision: annotation_i64(s.as_ref(), annotations::REVISION).unwrap_or(0),
            same_template: s
                .spec
                .template
                .as_ref()
                .is_some_and(|t| templates_equal(t, &d.spec.template)),
        })
        .collect()
}

/// The deployment's machines with their Nodes from the store, as the remediation census
/// counts them.
pub(crate) fn remediation_members(observed: &Observed, nodes: &Store<Node>) -> Vec<Member> {
    observed
        .all_machines()
        .into_iter()
        .map(|m| {
            let node =
                crate::machine::observe::node_name(m).and_then(|n| nodes.get(&ObjectRef::new(n)));
            Member::of(m, node.as_deref())
        })
        .collect()
}

/// What the `ZonePartition` condition of a deployment counts: every machine of the namespace
/// that is not being deleted, as the machine controller counts it
/// ([`crate::machine::partition::member`]), and the zones of the deployment's own machines.
pub(crate) fn zone_census(
    observed: &Observed,
    machines: &Store<Machine>,
    nodes: &Store<Node>,
) -> (
    Vec<crate::machine::partition::ZoneMember>,
    std::collections::BTreeSet<String>,
) {
    let node_of = |m: &Machine| {
        crate::machine::observe::node_name(m).and_then(|n| nodes.get(&ObjectRef::new(n)))
    };
    let members = machines
        .state()
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| crate::machine::partition::member(m, node_of(m).as_deref()))
        .collect();
    let zones = observed
        .all_machines()
        .into_iter()
        .filter_map(|m| crate::machine::partition::member(m, node_of(m).as_deref()).zone)
        .collect();
    (members, zones)
}

/// The deployment owning a set, for watches.
pub(crate) fn deployment_for_set(set: &MachineSet) -> Option<ObjectRef<MachineDeployment>> {
    let owner = controller_of(&set.metadata)?;
    (owner.kind == MachineDeployment::KIND)
        .then(|| ObjectRef::new(&owner.name).within(&set.namespace().unwrap_or_default()))
}

/// The deployment owning a machine's set, for watches.
pub(crate) fn deployment_for_machine(
    machine: &Machine,
    sets: &Store<MachineSet>,
) -> Option<ObjectRef<MachineDeployment>> {
    let owner = controller_of(&machine.metadata)?;
    if owner.kind != MachineSet::KIND {
        return None;
    }
    let set =
        sets.get(&ObjectRef::new(&owner.name).within(&machine.namespace().unwrap_or_default()))?;
    deployment_for_set(&set)
}

/// The deployments of the machines on a Node that takes part in an in-place update (carries
/// `candidate-for-update`, `selected-for-update` or `update-result`), for watches: the node
/// agent's result and the machine controller's condition move the rollout on. Other Nodes
/// concern no deployment.
pub(crate) fn deployments_for_node(
    node: &Node,
    machines: &Store<Machine>,
    sets: &Store<MachineSet>,
) -> Vec<ObjectRef<MachineDeployment>> {
    let node_labels = node.labels();
    let in_place = [
        labels::CANDIDATE_FOR_UPDATE,
        labels::SELECTED_FOR_UPDATE,
        labels::UPDATE_RESULT,
    ];
    if !in_place.iter().any(|k| node_labels.contains_key(*k)) {
        return Vec::new();
    }
    let name = node.name_any();
    machines
        .state()
        .iter()
        .filter(|m| m.node_name() == Some(name.as_str()))
        .filter_map(|m| deployment_for_machine(m, sets))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcm_api::policy::strategy::{InPlaceStrategyError, StrategyError};

    #[test]
    fn max_unavailable_for_availability_is_the_go_mcm_s() {
        let d = |replicas: i32, strategy: serde_json::Value| -> MachineDeployment {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
                "metadata": { "name": "md" },
                "spec": { "replicas": replicas, "template": {}, "strategy": strategy }
            }))
            .unwrap()
        };
        let rolling = |surge: serde_json::Value, unavailable: serde_json::Value| {
            serde_json::json!({ "type": "RollingUpdate",
                "rollingUpdate": { "maxSurge": surge, "maxUnavailable": unavailable } })
        };
        use serde_json::json;
        let cases = [
            // No strategy, Recreate, no replicas: 0.
            (d(3, json!(null)), 0),
            (d(3, json!({ "type": "Recreate" })), 0),
            (d(0, rolling(json!(1), json!(1))), 0),
            // Rolling, resolved as upstream: percent rounds down, clamped to replicas.
            (d(3, rolling(json!(1), json!(2))), 2),
            (d(10, rolling(json!("25%"), json!("25%"))), 2),
            (d(2, rolling(json!(1), json!(5))), 2),
            // Both 0 gives 1; an unset limit fails upstream's resolution: 0.
            (d(3, rolling(json!(0), json!(0))), 1),
            (
                d(
                    3,
                    json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1 } }),
                ),
                0,
            ),
            (d(3, json!({ "type": "RollingUpdate" })), 0),
            // In place: a manual one has no surge.
            (
                d(
                    3,
                    json!({ "type": "InPlaceUpdate", "inPlaceUpdate": {
                    "maxSurge": 1, "maxUnavailable": 0, "orchestrationType": "Manual" } }),
                ),
                1,
            ),
            (
                d(
                    3,
                    json!({ "type": "InPlaceUpdate", "inPlaceUpdate": {
                    "maxSurge": 1, "maxUnavailable": 0, "orchestrationType": "Auto" } }),
                ),
                0,
            ),
        ];
        for (deployment, want) in cases {
            assert_eq!(
                availability_max_unavailable(&deployment),
                want,
                "{:?}",
                deployment.spec.strategy
            );
        }
    }
    use mcm_api::machine_deployment::MachineDeploymentStrategy;

    fn with_type(type_: Option<&str>) -> MachineDeployment {
        let mut d = MachineDeployment::default();
        d.spec.replicas = Some(3);
        d.spec.strategy = Some(MachineDeploymentStrategy {
            type_: type_.map(MachineDeploymentStrategyType::from),
            ..Default::default()
        });
        d
    }

    #[test]
    fn an_unknown_strategy_type_is_an_error_not_a_rolling_update() {
        let err = strategy_of(&with_type(Some("BlueGreen")), true).unwrap_err();
        assert!(matches!(&err, StrategyError::Unsupported(t) if t == "BlueGreen"));
        assert!(err.to_string().starts_with("spec.strategy.type:"), "{err}");
        assert_eq!(
            strategy_of(&with_type(Some("Recreate")), true).unwrap(),
            Strategy::Recreate
        );
        for known in [None, Some("RollingUpdate")] {
            assert!(matches!(
                strategy_of(&with_type(known), false),
                Ok(Strategy::RollingUpdate { .. })
            ));
        }
    }

    #[test]
    fn an_in_place_update_needs_its_parameters_and_a_target_cluster() {
        let d = with_type(Some("InPlaceUpdate"));
        assert!(matches!(
            strategy_of(&d, true),
            Err(StrategyError::InPlace(InPlaceStrategyError::Missing))
        ));
        let err = strategy_of(&d, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "in-place updates are not supported if running without a target cluster"
        );
    }
}
