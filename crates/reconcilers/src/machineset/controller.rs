//! The MachineSet reconciler: applies the decisions of [`super::decide`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use mcm_api::constants::annotations::preserve_values;
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::owner::{controller_of, controller_reference};
use mcm_api::{
    ConditionStatus, DisruptionReason, Machine, MachineDeployment, MachineDisruptionBudget,
    MachineSet, MachineSetCondition, MachineSetConditionType, MachineSetStatus,
};
use serde_json::{Value, json};

/// The finalizer of the manager's controllers.
const FINALIZER: &str = finalizers::MACHINE_CONTROLLER_MANAGER;

use super::decide::{
    AutoPreservePlan, Claim, MachineView, ReplicaPlan, SLOW_START_INITIAL_BATCH_SIZE, SetCounts,
    SetInput, claim, count_machines, is_frozen, plan_auto_preservation, plan_replicas,
    slow_start_batches,
};
use crate::disruptionbudget::{self, BudgetGate, Refusal};
use crate::events::EventPublisher;
use crate::kube_api::{
    self, ApiCallError, ApiErrorExt, ApiResultExt, Outcome, Part, ReconcileFailure, RetryPolicy,
    merge_patch, status_patch,
};
use crate::selector::selector_matches;

/// How often a set is reconciled without any event (MCM: 10 minutes).
pub const RESYNC_PERIOD: Duration = Duration::from_secs(600);
/// How long creations/deletions are awaited in the machine store before acting again.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(60);

/// Problems of a MachineSet that are no API failures.
#[derive(Debug, thiserror::Error)]
pub enum SetProblem {
    /// The template of the set has no labels: machines created from it could never be
    /// selected.
    #[error("MachineSet {0} has a template without labels")]
    TemplateWithoutLabels(String),
}

/// Errors of the MachineSet reconciler. Each keeps the underlying error.
pub type Error = ReconcileFailure<SetProblem>;

/// Creations and deletions a set is waiting to see in the machine store (Kubernetes'
/// controller expectations): until they are observed, the set does not act again, so a
/// stale cache never causes duplicate creations or deletions.
#[derive(Debug, Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Expected>>,
}

#[derive(Debug)]
struct Expected {
    created: HashSet<String>,
    deleted: HashSet<String>,
    since: Instant,
}

impl Expectations {
    fn record(&self, key: &str, created: Vec<String>, deleted: Vec<String>) {
        if let Ok(mut map) = self.inner.lock() {
            map.insert(
                key.to_owned(),
                Expected {
                    created: created.into_iter().collect(),
                    deleted: deleted.into_iter().collect(),
                    since: Instant::now(),
                },
            );
        }
    }

    fn satisfied(&self, key: &str, machines: &[Arc<Machine>]) -> bool {
        let Ok(mut map) = self.inner.lock() else {
            return true;
        };
        let Some(exp) = map.get(key) else {
            return true;
        };
        let by_name: HashMap<&str, &Machine> = machines
            .iter()
            .map(|m| (m.metadata.name.as_deref().unwrap_or(""), m.as_ref()))
            .collect();
        let created_seen = exp.created.iter().all(|n| by_name.contains_key(n.as_str()));
        let deleted_seen = exp.deleted.iter().all(|n| {
            by_name
                .get(n.as_str())
                .is_none_or(|m| m.metadata.deletion_timestamp.is_some())
        });
        if (created_seen && deleted_seen) || exp.since.elapsed() > EXPECTATIONS_TIMEOUT {
            map.remove(key);
            return true;
        }
        false
    }
}

/// Shared state of the MachineSet reconciler.
pub struct Context {
    /// Client of the control cluster.
    pub client: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// Store of the MachineSets.
    pub sets: Store<MachineSet>,
    /// Store of the target cluster's Nodes (read only: a Node's preserve annotation decides
    /// whether its Failed machine is kept).
    pub nodes: Store<Node>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Pending creations/deletions per set.
    pub expectations: Expectations,
    /// The selector-overlap warning announced per set (uid) by this process, so that it is
    /// published once per change, not on every reconcile.
    pub overlaps: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Paces status writes that change only counters.
    pub status_pacer: crate::pacer::StatusPacer,
    /// Store of the MachineDeployments (is a set an old set of a rolling deployment?).
    pub deployments: Store<MachineDeployment>,
    /// The MachineDisruptionBudget gate voluntary deletions ask first.
    pub budget_gate: BudgetGate,
    /// The budget refusals announced per set (uid) by this process, so that the Warning is
    /// published when they change, not on every reconcile.
    pub announced_blocks: Mutex<HashMap<String, String>>,
}

/// Reason of the Warning Event when a MachineDisruptionBudget holds back a deletion.
pub const DISRUPTION_BLOCKED: &str =
    mcm_api::disruption_budget::condition_reasons::DISRUPTION_BLOCKED;
/// How soon a set whose deletions a budget holds back looks again at the latest (a change
/// of the budget's status wakes it sooner).
pub const BUDGET_RECHECK: Duration = Duration::from_secs(10);

/// Reason of the Warning Event about a selector that matches others' machines.
pub const SELECTOR_OVERLAP: &str = "SelectorOverlap";

/// Publishes one Warning Event when the set's selector matches machines that other
/// controllers own (and again when the list of owners changes).
async fn warn_overlap(ctx: &Context, set: &MachineSet, all: &[Arc<Machine>]) {
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let owners = super::decide::overlapping_owners(
        &uid,
        set.spec.selector.as_ref(),
        all.iter().map(AsRef::as_ref),
    );
    let note = if owners.is_empty() {
        String::new()
    } else {
        format!(
            "spec.selector also matches machines controlled by {}; this MachineSet leaves them alone and never owns them (make the selectors disjoint)",
            owners.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    let changed = {
        let mut overlaps = ctx.overlaps.lock().unwrap_or_else(|e| e.into_inner());
        overlaps.insert(uid, note.clone()).unwrap_or_default() != note
    };
    if changed && !note.is_empty() {
        ctx.events
            .warning(&set_reference(set), SELECTOR_OVERLAP, "Claim", note)
            .await;
    }
}

/// The object reference of a set for events.
pub fn set_reference(set: &MachineSet) -> ObjectReference {
    set.object_ref(&())
}

/// The sets a machine event concerns: its controlling set, or every set selecting it when
/// it is an orphan (so that one can adopt it).
pub fn sets_for_machine(machine: &Machine, sets: &Store<MachineSet>) -> Vec<ObjectRef<MachineSet>> {
    let ns = machine.namespace().unwrap_or_default();
    if let Some(owner) = controller_of(&machine.metadata) {
        if owner.kind == MachineSet::KIND {
            return vec![ObjectRef::new(&owner.name).within(&ns)];
        }
        return Vec::new();
    }
    sets.state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
        .filter(|s| selector_matches(s.spec.selector.as_ref(), machine.metadata.labels.as_ref()))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machineset";

/// Reconciles one MachineSet.
pub async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ns);
    let machines_api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = set.metadata.deletion_timestamp.is_some();
    let has_finalizer = set.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer && set_finalizer(&sets, &set, true).await?.is_gone() {
        return Ok(Action::await_change());
    }
    let key = format!("{ns}/{name}");
    let all: Vec<Arc<Machine>> = ctx
        .machines
        .state()
        .into_iter()
        .filter(|m| m.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    if !ctx.expectations.satisfied(&key, &all) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }

    let uid = set.metadata.uid.clone().unwrap_or_default();
    if !deleting {
        warn_overlap(&ctx, &set, &all).await;
    }
    let mut claimed: Vec<Arc<Machine>> = Vec::new();
    for m in all {
        match claim(&uid, deleting, set.spec.selector.as_ref(), &m) {
            Claim::Owned => claimed.push(m),
            Claim::Adopt => {
                if set_controller(&machines_api, &m, Some(controller_reference(set.as_ref())))
                    .await?
                {
                    claimed.push(m);
                }
            }
            Claim::Release => {
                set_controller(&machines_api, &m, None).await?;
            }
            Claim::Ignore => {}
        }
    }
    if !deleting {
        sync_machine_specs(&machines_api, &set, &claimed).await?;
    }

    if deleting && claimed.is_empty() {
        // Gone already is as good as released.
        let _ = set_finalizer(&sets, &set, false).await?;
        return Ok(Action::await_change());
    }

    if !deleting {
        // Before the replicas: a Failed machine annotated now is kept in this very pass.
        let max = set.spec.auto_preserve_failed_machine_max.unwrap_or(0);
        let plan = plan_auto_preservation(max, claimed.iter().map(AsRef::as_ref));
        manage_auto_preservation(&machines_api, &plan, &mut claimed).await?;
    }

    let now = Timestamp::now();
    let template_labels = set.template_labels();
    let views: Vec<MachineView> = claimed
        .iter()
        .map(|m| {
            let node = node_preserve_annotation(&ctx.nodes, m);
            MachineView::from_machine(m, template_labels, node.as_deref(), now)
        })
        .collect();
    let input = SetInput {
        replicas: set.spec.replicas(),
        frozen: is_frozen(set.metadata.labels.as_ref()),
        scale_up_disabled: set
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(labels::MACHINE_SET_SCALE_UP_DISABLED)),
        deleting,
        replica_change_time: set
            .annotations()
            .get(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
            .and_then(|t| t.parse().ok()),
    };
    let plan = plan_replicas(&input, &views);
    let manage = manage_replicas(&ctx, &machines_api, &set, &plan, &key, &claimed).await;
    let held_by_budget = matches!(manage, Ok(true));
    let manage = manage.map(|_| ());

    let counts = count_machines(&views, set.spec.min_ready_seconds.unwrap_or(0), now);
    let held_back = update_status(&ctx, &sets, &set, &counts, manage.as_ref().err()).await?;
    manage?;
    // A Machine that disappears (also the last one of a deleting set) triggers this set
    // through the manager's deletion tap; no polling is needed for it.
    let recheck = counts
        .recheck_after
        .map_or(RESYNC_PERIOD, |after| after + Duration::from_secs(1));
    let recheck = if held_by_budget {
        recheck.min(BUDGET_RECHECK)
    } else {
        recheck
    };
    Ok(Action::requeue(
        held_back.map_or(recheck, |w| w.min(recheck)),
    ))
}

/// The sets a budget event concerns: the sets of the machines it selects.
pub fn sets_for_budget(
    budget: &MachineDisruptionBudget,
    machines: &Store<Machine>,
    sets: &Store<MachineSet>,
) -> Vec<ObjectRef<MachineSet>> {
    let mut out: Vec<ObjectRef<MachineSet>> = machines
        .state()
        .iter()
        .filter(|m| disruptionbudget::decide::selects(budget, m))
        .flat_map(|m| sets_for_machine(m, sets))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup();
    out
}

/// Whether `set` is an old set of a MachineDeployment whose template differs from it (its
/// surplus deletions are a rolling update's).
fn is_old_set_of_rollout(set: &MachineSet, deployments: &Store<MachineDeployment>) -> bool {
    let Some(owner) = controller_of(&set.metadata) else {
        return false;
    };
    if owner.kind != MachineDeployment::KIND {
        return false;
    }
    let key = ObjectRef::new(&owner.name).within(&set.namespace().unwrap_or_default());
    let Some(deployment) = deployments.get(&key) else {
        return false;
    };
    set.spec.template.as_ref().is_none_or(|t| {
        !crate::machinedeployment::hash::templates_equal(&deployment.spec.template, t)
    })
}

/// Whether the Node of `machine` carries the `Preserved` condition (it was preserved).
fn node_was_preserved(nodes: &Store<Node>, machine: &Machine) -> bool {
    machine
        .node_name()
        .and_then(|n| nodes.get(&ObjectRef::new(n)))
        .and_then(|n| n.status.as_ref()?.conditions.clone())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == disruptionbudget::decide::NODE_PRESERVED_CONDITION)
        })
}

/// The voluntary reason of deleting `machine` of `set` (`None`: involuntary or not gated).
fn voluntary_reason(
    ctx: &Context,
    set: &MachineSet,
    machine: &Machine,
    now: Timestamp,
) -> Option<DisruptionReason> {
    if set.metadata.deletion_timestamp.is_some() || machine.metadata.deletion_timestamp.is_some() {
        // Deleting a set is a user's direct deletion, like deleting a Deployment's pods by
        // deleting the Deployment: no budget is asked.
        return None;
    }
    let failed_to_replace = machine.phase() == Some(&mcm_api::MachinePhase::Failed)
        && mcm_api::preservation::failed_machine_to_terminate(
            machine,
            node_preserve_annotation(&ctx.nodes, machine).as_deref(),
            now,
        );
    disruptionbudget::decide::deletion_reason(
        failed_to_replace,
        disruptionbudget::decide::was_preserved(machine, node_was_preserved(&ctx.nodes, machine)),
        is_old_set_of_rollout(set, &ctx.deployments),
    )
}

/// Asks the budget gate about each planned deletion: returns the names to delete now and
/// the refusals. Involuntary deletions are never asked about.
fn gate_deletions(
    ctx: &Context,
    set: &MachineSet,
    names: &[String],
    claimed: &[Arc<Machine>],
) -> (Vec<String>, Vec<String>, Vec<Refusal>) {
    let now = Timestamp::now();
    let all = ctx.machines.state();
    let mut issue = Vec::new();
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for name in names {
        let Some(machine) = claimed.iter().find(|m| m.name_any() == *name) else {
            issue.push(name.clone());
            continue;
        };
        let Some(reason) = voluntary_reason(ctx, set, machine, now) else {
            issue.push(name.clone());
            continue;
        };
        match ctx.budget_gate.admit(&all, machine, &reason, now) {
            Ok(()) => {
                issue.push(name.clone());
                admitted.push(name.clone());
            }
            Err(refusal) => refused.push(refusal),
        }
    }
    (issue, admitted, refused)
}

/// Publishes the Warning Events of budget refusals (on the set and on each budget) when
/// they differ from those announced last for the set.
async fn announce_refusals(ctx: &Context, set: &MachineSet, refused: &[Refusal]) {
    let blocked: Vec<&disruptionbudget::Blocked> = refused
        .iter()
        .filter_map(|r| match r {
            Refusal::Blocked(b) => Some(b),
            Refusal::NotSynced => None,
        })
        .collect();
    let note = blocked
        .iter()
        .map(|b| format!("{}/{}", b.budget, b.machine))
        .collect::<Vec<_>>()
        .join(",");
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let changed = {
        let mut announced = ctx
            .announced_blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        announced.insert(uid, note.clone()).unwrap_or_default() != note
    };
    if !changed {
        return;
    }
    let ns = set.namespace().unwrap_or_default();
    for b in blocked {
        let text = format!(
            "Not deleting machine {} ({}) of MachineSet {}: MachineDisruptionBudget {} allows no disruption now ({})",
            b.machine,
            b.reason,
            set.name_any(),
            b.budget,
            b.message
        );
        ctx.events
            .warning(
                &set_reference(set),
                DISRUPTION_BLOCKED,
                "Delete",
                text.clone(),
            )
            .await;
        if let Some(budget) = ctx
            .budget_gate
            .budgets
            .get(&ObjectRef::new(&b.budget).within(&ns))
        {
            ctx.events
                .warning(
                    &crate::disruptionbudget::act::budget_reference(&budget),
                    DISRUPTION_BLOCKED,
                    "Delete",
                    text,
                )
                .await;
        }
    }
}

/// The preserve annotation of the Node of `machine` (named by its `node` label), from the
/// Node store; `None` without a node label, without a Node in the store, or without the
/// annotation (the machine's own annotation then decides, as in the machine controller).
pub fn node_preserve_annotation(nodes: &Store<Node>, machine: &Machine) -> Option<String> {
    let node = nodes.get(&ObjectRef::new(machine.node_name()?))?;
    node.annotations().get(annotations::PRESERVE).cloned()
}

/// Carries out an [`AutoPreservePlan`]: sets or removes `node.machine.sapcloud.io/preserve:
/// auto-preserved` on the machines it names (each patch guarded by the resourceVersion the
/// plan was made from, so that a user's annotation set meanwhile is never overwritten: the
/// conflict retries the reconcile), and puts the patched machines into `machines`, so that
/// the rest of the reconcile sees the annotations. A machine gone meanwhile is skipped.
async fn manage_auto_preservation(
    api: &Api<Machine>,
    plan: &AutoPreservePlan,
    machines: &mut [Arc<Machine>],
) -> Result<(), Error> {
    let changes = plan
        .annotate
        .iter()
        .map(|n| (n, Value::from(preserve_values::AUTO_PRESERVED)))
        .chain(plan.release.iter().map(|n| (n, Value::Null)));
    for (name, value) in changes {
        let Some(slot) = machines.iter_mut().find(|m| m.name_any() == *name) else {
            continue;
        };
        let patch = json!({"metadata": {
            "resourceVersion": slot.resource_version(),
            "annotations": {annotations::PRESERVE: value},
        }});
        let patched = kube_api::patch_existing(api, Part::Object, name, &patch).await;
        match patched {
            Ok(m) => {
                tracing::info!(
                    machine = %name,
                    auto_preserved = !value.is_null(),
                    "updated the auto-preservation of a machine"
                );
                *slot = Arc::new(m);
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                return Err(
                    ApiCallError::new("update auto-preservation of", "Machine", name, e).into(),
                );
            }
        }
    }
    Ok(())
}

/// What to do after a failed reconcile: conflicts are retried quickly, the rest after a
/// few seconds ([`kube_api::error_policy`]).
pub fn error_policy(set: Arc<MachineSet>, error: &Error, _ctx: Arc<Context>) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineSet::KIND,
        &set.name_any(),
        error,
    )
}

/// Creates and deletes machines as `plan` says; voluntary deletions ask the budget gate
/// first. `Ok(true)`: a budget (or budgets not listed yet) held back some deletion.
async fn manage_replicas(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    plan: &ReplicaPlan,
    key: &str,
    claimed: &[Arc<Machine>],
) -> Result<bool, Error> {
    if let Some(reason) = plan.scale_up_blocked {
        tracing::debug!(reason, "not creating machines");
    }
    let mut created = Vec::new();
    let mut result = Ok(());
    if plan.create > 0 {
        result = create_machines(ctx, api, set, plan.create, &mut created).await;
    }
    let mut deleted = Vec::new();
    let mut held = false;
    if !plan.delete.is_empty() && result.is_ok() {
        let (issue, admitted, refused) = gate_deletions(ctx, set, &plan.delete, claimed);
        held = !refused.is_empty();
        announce_refusals(ctx, set, &refused).await;
        if !issue.is_empty() {
            result = delete_machines(ctx, api, set, &issue, &mut deleted).await;
        }
        let ns = set.namespace().unwrap_or_default();
        for name in admitted.iter().filter(|n| !deleted.contains(n)) {
            ctx.budget_gate.forget(&ns, name);
        }
    }
    // The Events are the Go MCM's, one per batch: `SuccessfulCreate` and `SuccessfulDelete`
    // (no summary besides them).
    if !created.is_empty() || !deleted.is_empty() {
        ctx.expectations
            .record(key, created.clone(), deleted.clone());
    }
    result.map(|()| held)
}

/// The set's `node.machine.sapcloud.io/effective-creation-timeout` annotation, parsed
/// (`None` without one).
pub fn effective_creation_timeout(
    set: &MachineSet,
) -> Option<Result<Duration, mcm_api::duration::DurationError>> {
    let value = set
        .annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)?;
    Some(mcm_api::duration::parse_go_duration(value))
}

/// The Machine a set creates: template labels, annotations and spec, `generateName:
/// <set>-`, the set as controller, no finalizers (the machine controller adds its own).
/// The set's effective-creation-timeout annotation goes onto the Machine, and when it parses
/// it is the Machine's `spec.creationTimeout` too (upstream's rule).
pub fn machine_from_template(set: &MachineSet) -> Machine {
    let template = set.spec.template.clone().unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut machine_annotations = meta.annotations;
    let mut spec = template.spec.unwrap_or_default();
    if let Some(value) = set
        .annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
    {
        machine_annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                annotations::EFFECTIVE_CREATION_TIMEOUT.into(),
                value.clone(),
            );
        if let Some(Ok(timeout)) = effective_creation_timeout(set) {
            spec.configuration.creation_timeout = Some(mcm_api::GoDuration(timeout));
        }
    }
    Machine {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", set.name_any())),
            namespace: set.namespace(),
            labels: meta.labels,
            annotations: machine_annotations,
            owner_references: Some(vec![controller_reference(set)]),
            ..ObjectMeta::default()
        },
        spec,
        ..Machine::default()
    }
}

async fn create_machines(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    count: usize,
    created: &mut Vec<String>,
) -> Result<(), Error> {
    let name = set.name_any();
    if set.template_labels().is_none_or(BTreeMap::is_empty) {
        return Err(Error::Problem(SetProblem::TemplateWithoutLabels(name)));
    }
    let reference = set_reference(set);
    let template = machine_from_template(set);
    if let Some(Err(e)) = effective_creation_timeout(set) {
        let note = format!(
            "annotation {} is not a duration ({e}); new machines keep the creation timeout of \
             their template",
            annotations::EFFECTIVE_CREATION_TIMEOUT
        );
        ctx.events
            .warning(
                &reference,
                "InvalidEffectiveCreationTimeout",
                "Create",
                note,
            )
            .await;
    }
    for batch in slow_start_batches(count, SLOW_START_INITIAL_BATCH_SIZE) {
        let results = join_all(
            (0..batch).map(|_| async { api.create(&PostParams::default(), &template).await }),
        )
        .await;
        let mut first_error = None;
        let mut batch_created = Vec::new();
        for r in results {
            match r {
                Ok(m) => batch_created.push(m.name_any()),
                Err(e) => {
                    ctx.events
                        .warning(
                            &reference,
                            "FailedCreate",
                            "Create",
                            format!("Error creating: {e}"),
                        )
                        .await;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(note) = batch_note("Created", "Machine", &batch_created) {
            ctx.events
                .normal(&reference, "SuccessfulCreate", "Create", note)
                .await;
        }
        created.append(&mut batch_created);
        if let Some(e) = first_error {
            // Slow start: skip the remaining batches; the next reconcile retries.
            return Err(ApiCallError::new("create", "Machine", &name, e).into());
        }
    }
    Ok(())
}

async fn delete_machines(
    ctx: &Context,
    api: &Api<Machine>,
    set: &MachineSet,
    names: &[String],
    deleted: &mut Vec<String>,
) -> Result<(), Error> {
    let reference = set_reference(set);
    let uids: HashMap<String, Option<String>> = ctx
        .machines
        .state()
        .iter()
        .map(|m| (m.name_any(), m.metadata.uid.clone()))
        .collect();
    let results = join_all(names.iter().map(|n| {
        let dp = DeleteParams {
            preconditions: uids.get(n).cloned().flatten().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        async move { (n, kube_api::delete(api, n, &dp).await) }
    }))
    .await;
    let mut first_error = None;
    let mut now_deleted = Vec::new();
    for (n, r) in results {
        match r {
            Ok(Outcome::Gone) => {}
            Ok(Outcome::Done) => now_deleted.push(n.clone()),
            Err(e) => {
                ctx.events
                    .warning(
                        &reference,
                        "FailedDelete",
                        "Delete",
                        format!("Error deleting {n}: {e}"),
                    )
                    .await;
                first_error.get_or_insert(ApiCallError::new("delete", "Machine", n, e).into());
            }
        }
    }
    if let Some(note) = batch_note("Deleted", "machine", &now_deleted) {
        ctx.events
            .normal(&reference, "SuccessfulDelete", "Delete", note)
            .await;
    }
    deleted.append(&mut now_deleted);
    first_error.map_or(Ok(()), Err)
}

/// The most names one batch Event lists (an Event's note holds 1 KiB).
const NAMES_PER_EVENT: usize = 10;

/// The note of one Event for a batch of machines created or deleted together: MCM's text
/// (`Created Machine: a`) for one, the count and the first names for more (`Created 12
/// Machines: a, b, ... and 2 more`). One Event per batch instead of one per machine: at 20
/// QPS, an Event per machine is a twentieth of a second of the budget each.
fn batch_note(verb: &str, noun: &str, names: &[String]) -> Option<String> {
    match names {
        [] => None,
        [one] => Some(format!("{verb} {noun}: {one}")),
        _ => {
            let listed = names[..names.len().min(NAMES_PER_EVENT)].join(", ");
            let more = names.len().saturating_sub(NAMES_PER_EVENT);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            Some(format!("{verb} {} {noun}s: {listed}{tail}", names.len()))
        }
    }
}

/// Adds (`present`) or removes the finalizer of `set`; [`Outcome::Gone`] when the set no
/// longer exists.
async fn set_finalizer(
    api: &Api<MachineSet>,
    set: &MachineSet,
    present: bool,
) -> Result<Outcome, Error> {
    let outcome = kube_api::set_finalizer(api, set, FINALIZER, present)
        .await
        .context("update finalizers of", MachineSet::KIND, &set.name_any())?;
    Ok(outcome)
}

/// Sets (adopt) or removes (release) the controller reference of a machine. Returns false
/// when the machine is gone.
async fn set_controller(
    api: &Api<Machine>,
    machine: &Machine,
    owner: Option<OwnerReference>,
) -> Result<bool, Error> {
    let mut refs: Vec<OwnerReference> = machine
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.controller != Some(true))
        .collect();
    refs.extend(owner);
    let patch = json!({"metadata": {
        "ownerReferences": refs,
        "uid": machine.metadata.uid,
    }});
    let name = machine.name_any();
    let outcome = merge_patch(api, Part::Object, &name, &patch)
        .await
        .context("update owner of", "Machine", &name)?;
    Ok(!outcome.is_gone())
}

/// The patch that brings a machine's node template, configuration and class kind in line
/// with its set's template (MCM's `syncMachinesNodeTemplates`, `syncMachinesConfig`,
/// `syncMachinesClassKind`), or `None` when nothing differs.
pub fn machine_spec_patch(set: &MachineSet, machine: &Machine) -> Option<Value> {
    let template = set.spec.template.as_ref()?.spec.as_ref()?;
    let mut spec = serde_json::Map::new();
    let want = serde_json::to_value(&template.node_template).unwrap_or(Value::Null);
    let have = serde_json::to_value(&machine.spec.node_template).unwrap_or(Value::Null);
    if mcm_api::canonical::canonical(&want, &[]) != mcm_api::canonical::canonical(&have, &[]) {
        // A merge patch that also removes the labels, annotations and taints the set no
        // longer has.
        let patch = mcm_api::canonical::merge_patch_to(&have, &want).unwrap_or(Value::Null);
        spec.insert("nodeTemplate".into(), patch);
    }
    // A machine created under an effective creation timeout keeps it.
    let mut configuration = template.configuration.clone();
    if let Some(timeout) = machine
        .annotations()
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
        .and_then(|v| mcm_api::duration::parse_go_duration(v).ok())
    {
        configuration.creation_timeout = Some(mcm_api::GoDuration(timeout));
    }
    if configuration != machine.spec.configuration {
        let want = serde_json::to_value(&configuration).unwrap_or(Value::Null);
        let have = serde_json::to_value(&machine.spec.configuration).unwrap_or(Value::Null);
        if let (Value::Object(want), Value::Object(have)) = (want, have) {
            for k in have.keys() {
                if !want.contains_key(k) {
                    spec.insert(k.clone(), Value::Null);
                }
            }
            spec.extend(want);
        }
    }
    let want_kind = template.class.as_ref().and_then(|c| c.kind.as_ref());
    let have_kind = machine.spec.class.as_ref().and_then(|c| c.kind.as_ref());
    if want_kind.is_some() && want_kind != have_kind {
        spec.insert("class".into(), json!({"kind": want_kind}));
    }
    (!spec.is_empty()).then(|| json!({"spec": spec}))
}

async fn sync_machine_specs(
    api: &Api<Machine>,
    set: &MachineSet,
    machines: &[Arc<Machine>],
) -> Result<(), Error> {
    for m in machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
    {
        if let Some(patch) = machine_spec_patch(set, m) {
            // A machine gone meanwhile needs no sync.
            let name = m.name_any();
            let _ = merge_patch(api, Part::Object, &name, &patch)
                .await
                .context("sync spec of", "Machine", &name)?;
        }
    }
    Ok(())
}

/// The status a set should have.
pub fn desired_status(
    set: &MachineSet,
    counts: &SetCounts,
    failure: Option<&Error>,
) -> MachineSetStatus {
    let prev = set.status.clone().unwrap_or_default();
    let mut conditions = prev.conditions.clone().unwrap_or_default();
    match failure {
        Some(e) => {
            let message = e.to_string();
            let now = Some(Time(Timestamp::now()));
            match conditions
                .iter_mut()
                .find(|c| c.type_ == MachineSetConditionType::ReplicaFailure)
            {
                Some(c) if c.message.as_deref() == Some(message.as_str()) => {}
                Some(c) => c.message = Some(message),
                None => conditions.push(MachineSetCondition {
                    type_: MachineSetConditionType::ReplicaFailure,
                    status: ConditionStatus::True,
                    last_transition_time: now,
                    reason: Some(
                        if matches!(
                            e,
                            Error::Kube(ApiCallError {
                                action: "delete",
                                ..
                            })
                        ) {
                            "FailedDelete"
                        } else {
                            "FailedCreate"
                        }
                        .into(),
                    ),
                    message: Some(message),
                }),
            }
        }
        None => conditions.retain(|c| c.type_ != MachineSetConditionType::ReplicaFailure),
    }
    MachineSetStatus {
        replicas: Some(counts.replicas),
        fully_labeled_replicas: Some(counts.fully_labeled),
        ready_replicas: Some(counts.ready),
        available_replicas: Some(counts.available),
        observed_generation: set.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        last_operation: prev.last_operation,
        failed_machines: (!counts.failed.is_empty()).then(|| counts.failed.clone()),
        // Both `omitempty` upstream.
        auto_preserve_failed_machine_count: (counts.auto_preserved > 0)
            .then_some(counts.auto_preserved),
        preserved_failed_replicas: (counts.preserved_failed > 0).then_some(counts.preserved_failed),
    }
}

/// `status` without what changes as machines come and go: the replica counters, and the
/// times and messages of conditions. Two statuses that differ only there differ only in
/// counters ([`crate::pacer`]). Pure.
pub fn without_counters(status: &MachineSetStatus) -> MachineSetStatus {
    let mut s = status.clone();
    s.replicas = None;
    s.fully_labeled_replicas = None;
    s.ready_replicas = None;
    s.available_replicas = None;
    for c in s.conditions.iter_mut().flatten() {
        c.last_transition_time = None;
        c.message = None;
    }
    s
}

/// Writes the set's status when it changed; a change of counters only waits for the pacer
/// (`Some`: how long; the reconcile comes back then).
async fn update_status(
    ctx: &Context,
    api: &Api<MachineSet>,
    set: &MachineSet,
    counts: &SetCounts,
    failure: Option<&Error>,
) -> Result<Option<Duration>, Error> {
    let status = desired_status(set, counts, failure);
    if set.status.as_ref() == Some(&status) {
        return Ok(None);
    }
    let significant = set
        .status
        .as_ref()
        .is_none_or(|current| without_counters(current) != without_counters(&status));
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    if let Some(wait) = ctx.status_pacer.hold_back(uid, significant) {
        return Ok(Some(wait));
    }
    write_status(api, set, &status).await.map(|()| None)
}

async fn write_status(
    api: &Api<MachineSet>,
    set: &MachineSet,
    status: &MachineSetStatus,
) -> Result<(), Error> {
    let patch = status_patch(
        status,
        &[
            "machineSetCondition",
            "failedMachines",
            "autoPreserveFailedMachineCount",
            "preservedFailedReplicas",
        ],
    );
    // A set gone meanwhile needs no status.
    let name = set.name_any();
    let _ = merge_patch(api, Part::Status, &name, &patch)
        .await
        .context("update status of", "MachineSet", &name)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_is_told_in_one_note() {
        let names = |n: usize| (0..n).map(|i| format!("m-{i}")).collect::<Vec<_>>();
        assert_eq!(super::batch_note("Created", "Machine", &[]), None);
        assert_eq!(
            super::batch_note("Created", "Machine", &names(1)).as_deref(),
            Some("Created Machine: m-0")
        );
        assert_eq!(
            super::batch_note("Deleted", "machine", &names(3)).as_deref(),
            Some("Deleted 3 machines: m-0, m-1, m-2")
        );
        let many = super::batch_note("Created", "Machine", &names(64)).unwrap();
        assert!(many.starts_with("Created 64 Machines: m-0, m-1,"), "{many}");
        assert!(many.ends_with("m-9 and 54 more"), "{many}");
        assert!(many.len() < 1024);
    }

    use super::*;

    fn status(ready: i32, failure: Option<&str>) -> MachineSetStatus {
        MachineSetStatus {
            replicas: Some(3),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            observed_generation: Some(1),
            conditions: failure.map(|m| {
                vec![MachineSetCondition {
                    type_: MachineSetConditionType::ReplicaFailure,
                    status: ConditionStatus::True,
                    last_transition_time: None,
                    reason: Some("FailedCreate".into()),
                    message: Some(m.into()),
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn counters_and_messages_are_not_significant_a_new_failure_is() {
        assert_eq!(
            without_counters(&status(1, None)),
            without_counters(&status(2, None))
        );
        assert_eq!(
            without_counters(&status(1, Some("quota"))),
            without_counters(&status(2, Some("quota again")))
        );
        assert_ne!(
            without_counters(&status(1, None)),
            without_counters(&status(1, Some("quota")))
        );
    }

    #[test]
    fn a_set_passes_its_effective_creation_timeout_to_new_machines() {
        let mut set = MachineSet::default();
        set.metadata.name = Some("s".into());
        let mut template = mcm_api::MachineTemplateSpec::default();
        let mut spec = mcm_api::MachineSpec::default();
        spec.configuration.creation_timeout = Some(mcm_api::GoDuration(Duration::from_secs(60)));
        template.spec = Some(spec);
        set.spec.template = Some(template);
        let m = machine_from_template(&set);
        assert_eq!(
            m.spec.configuration.creation_timeout,
            Some(mcm_api::GoDuration(Duration::from_secs(60)))
        );
        set.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "7m".to_owned(),
        )]));
        let m = machine_from_template(&set);
        assert_eq!(
            m.spec.configuration.creation_timeout,
            Some(mcm_api::GoDuration(Duration::from_secs(420)))
        );
        assert_eq!(
            m.annotations()[annotations::EFFECTIVE_CREATION_TIMEOUT],
            "7m"
        );
        // The spec sync of the set keeps it.
        assert_eq!(machine_spec_patch(&set, &m), None);
        // A value that is no duration is copied but sets nothing.
        set.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "7 minutes".to_owned(),
        )]));
        let m = machine_from_template(&set);
        assert_eq!(
            m.spec.configuration.creation_timeout.map(|g| g.0.as_secs()),
            Some(60)
        );
        assert!(matches!(effective_creation_timeout(&set), Some(Err(_))));
    }
}
