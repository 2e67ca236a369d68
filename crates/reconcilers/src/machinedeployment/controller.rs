//! The MachineDeployment reconciler: observes the deployment, its sets and their machines,
//! asks [`super::decide::decide`] what to do and applies it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::intstr::RollingUpdateError;
use mcm_api::owner::{controller_of, controller_reference};
use mcm_api::{
    Machine, MachineDeployment, MachineDeploymentStatus, MachinePhase, MachineSet, MachineSetSpec,
    MachineTemplateSpec,
};
use serde_json::json;

/// The finalizer of the manager's controllers.
const FINALIZER: &str = finalizers::MACHINE_CONTROLLER_MANAGER;

use super::decide::{self, Action as RolloutAction, Rollout, SetState, Snapshot, Strategy};
use super::hash::{template_hash, templates_equal};
use super::nodes::apply_markers;
use super::status::{
    Counters, StatusInput, compute_status, invalid_strategy_status, is_invalid_strategy, reasons,
};
use crate::events::EventPublisher;
use crate::kube_api::{
    self, ApiCallError, ApiErrorExt, Outcome, ReconcileError, RetryPolicy, add_finalizer,
    merge_patch_status, remove_finalizer,
};
use crate::machineset::controller::status_patch;
use crate::machineset::decide::{MachineView, count_machines, is_frozen};

/// How often a deployment is reconciled without any event (MCM: 10 minutes).
pub const RESYNC_PERIOD: Duration = Duration::from_secs(600);
/// Old sets kept when `revisionHistoryLimit` is unset (the apps/v1 Deployment default).
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// Errors of the MachineDeployment reconciler. Each keeps the underlying error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] ApiCallError),
    /// A MachineSet with the new set's name exists with another template.
    #[error("hash collision for MachineSet {0}")]
    HashCollision(String),
}

impl Error {
    fn kube(action: &'static str, kind: &'static str, name: &str, source: kube::Error) -> Self {
        ApiCallError::new(action, kind, name, source).into()
    }
}

impl ReconcileError for Error {
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if e.source.is_conflict())
    }
}

/// Shared state of the MachineDeployment reconciler.
pub struct Context {
    /// Client of the control cluster (machine objects).
    pub client: Client,
    /// Client of the target cluster (Nodes).
    pub target: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// Store of the MachineSets.
    pub sets: Store<MachineSet>,
    /// Store of the target cluster's Nodes.
    pub nodes: Store<Node>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Annotate nodes against cluster-autoscaler scale-down during rollouts.
    pub autoscaler_annotations: bool,
}

/// The deployment owning a set, for watches.
pub fn deployment_for_set(set: &MachineSet) -> Option<ObjectRef<MachineDeployment>> {
    let owner = controller_of(&set.metadata)?;
    (owner.kind == MachineDeployment::KIND)
        .then(|| ObjectRef::new(&owner.name).within(&set.namespace().unwrap_or_default()))
}

/// The deployment owning a machine's set, for watches.
pub fn deployment_for_machine(
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

fn reference(d: &MachineDeployment) -> ObjectReference {
    d.object_ref(&())
}

/// The deployment's strategy with resolved limits
/// ([`MachineDeployment::resolved_rolling_update`]); an error names the field and the value
/// that cannot be used.
fn strategy_of(d: &MachineDeployment) -> Result<Strategy, RollingUpdateError> {
    if d.is_recreate() {
        return Ok(Strategy::Recreate);
    }
    let (max_surge, max_unavailable) = d.resolved_rolling_update()?;
    Ok(Strategy::RollingUpdate {
        max_surge,
        max_unavailable,
    })
}

fn annotation_i64<K: Resource>(obj: &K, key: &str) -> Option<i64> {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse().ok())
}

fn is_terminating(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_some() || m.phase() == Some(&MachinePhase::Terminating)
}

/// Observed sets of a deployment with their machines.
struct Observed {
    sets: Vec<Arc<MachineSet>>,
    machines: BTreeMap<String, Vec<Arc<Machine>>>,
    new_set: Option<Arc<MachineSet>>,
}

fn observe(d: &MachineDeployment, ctx: &Context) -> Observed {
    let ns = d.namespace();
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let mut sets: Vec<Arc<MachineSet>> = ctx
        .sets
        .state()
        .into_iter()
        .filter(|s| s.namespace() == ns)
        .filter(|s| controller_of(&s.metadata).is_some_and(|o| o.uid == uid))
        .collect();
    sets.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let mut machines: BTreeMap<String, Vec<Arc<Machine>>> = BTreeMap::new();
    let set_uids: BTreeMap<String, String> = sets
        .iter()
        .map(|s| (s.metadata.uid.clone().unwrap_or_default(), s.name_any()))
        .collect();
    for m in ctx
        .machines
        .state()
        .into_iter()
        .filter(|m| m.namespace() == ns)
    {
        if let Some(owner) = controller_of(&m.metadata)
            && let Some(set) = set_uids.get(&owner.uid)
        {
            machines.entry(set.clone()).or_default().push(m);
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
        machines,
        new_set,
    }
}

fn set_state(set: &MachineSet, machines: &[Arc<Machine>], now: Timestamp) -> SetState {
    let views: Vec<MachineView> = machines
        .iter()
        .map(|m| MachineView::from_machine(m, None, now))
        .collect();
    let counts = count_machines(&views, set.spec.min_ready_seconds.unwrap_or(0), now);
    let terminating = machines.iter().filter(|m| is_terminating(m)).count();
    SetState {
        name: set.name_any(),
        replicas: set.spec.replicas(),
        machines: i32::try_from(machines.len() - terminating).unwrap_or(i32::MAX),
        terminating: i32::try_from(terminating).unwrap_or(i32::MAX),
        ready: counts.ready,
        available: counts.available,
        created: set.metadata.creation_timestamp.as_ref().map(|t| t.0),
        desired_annotation: annotation_i64(set, annotations::DESIRED_REPLICAS)
            .and_then(|v| i32::try_from(v).ok()),
        max_annotation: annotation_i64(set, annotations::MAX_REPLICAS)
            .and_then(|v| i32::try_from(v).ok()),
    }
}

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machinedeployment";

/// Reconciles one MachineDeployment.
pub async fn reconcile(d: Arc<MachineDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = d.namespace().unwrap_or_default();
    let api: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let sets_api: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = d.finalizers().iter().any(|f| f == FINALIZER);
    let observed = observe(&d, &ctx);

    if d.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        if observed.sets.is_empty() {
            // Gone already is as good as released.
            let _ = remove_finalizer(&api, &d, FINALIZER)
                .await
                .map_err(finalizer_error(&d))?;
            return Ok(Action::await_change());
        }
        for s in observed
            .sets
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
        {
            match kube_api::delete(&sets_api, &s.name_any(), &DeleteParams::background()).await {
                Ok(Outcome::Gone) => {}
                Ok(Outcome::Done) => {
                    ctx.events
                        .normal(
                            &reference(&d),
                            "DeletingMachineSet",
                            "Delete",
                            format!("Deleting MachineSet {}", s.name_any()),
                        )
                        .await;
                }
                Err(e) => return Err(Error::kube("delete", "MachineSet", &s.name_any(), e)),
            }
        }
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    if !has_finalizer
        && add_finalizer(&api, &d, FINALIZER)
            .await
            .map_err(finalizer_error(&d))?
            .is_gone()
    {
        return Ok(Action::await_change());
    }
    if d.spec
        .selector
        .as_ref()
        .is_none_or(|s| s == &LabelSelector::default())
    {
        ctx.events
            .warning(
                &reference(&d),
                "SelectingAll",
                "Sync",
                "This deployment is selecting all machines. A non-empty selector is required."
                    .into(),
            )
            .await;
        return Ok(Action::await_change());
    }
    if handle_trigger_deletion(&d, &ctx, &observed).await? {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    let now = Timestamp::now();
    let replicas = d.spec.replicas();
    let empty = Vec::new();
    let state_of = |s: &MachineSet| {
        set_state(
            s,
            observed.machines.get(&s.name_any()).unwrap_or(&empty),
            now,
        )
    };
    let new_name = observed.new_set.as_ref().map(|s| s.name_any());
    let new_set = observed.new_set.as_deref().map(state_of);
    let old_sets: Vec<SetState> = observed
        .sets
        .iter()
        .filter(|s| Some(s.name_any()) != new_name)
        .map(|s| state_of(s))
        .collect();
    let failed: Vec<_> = observed
        .machines
        .values()
        .flatten()
        .map(|m| MachineView::from_machine(m, None, now))
        .filter_map(|v| v.failure)
        .collect();
    let strategy = match strategy_of(&d) {
        Ok(s) => s,
        Err(invalid) => {
            let input = StatusInput {
                generation: d.metadata.generation,
                progress_deadline_seconds: d.spec.progress_deadline_seconds,
                previous: d.status.as_ref(),
                failed_machines: failed,
                progressed: false,
                now,
            };
            let status = invalid_strategy_status(
                replicas,
                Counters::of(new_set.as_ref(), &old_sets),
                &input,
                &invalid.to_string(),
            );
            report_invalid_strategy(&d, &ctx, &api, status).await?;
            // Nothing is rolled out or scaled until the strategy changes (an event).
            return Ok(Action::await_change());
        }
    };
    let snapshot = Snapshot {
        rollout: Rollout {
            replicas,
            strategy,
            paused: d.spec.paused.unwrap_or(false),
            frozen: is_frozen(d.metadata.labels.as_ref()),
        },
        new_set,
        old_sets,
    };

    sync_revision(&d, &ctx, &observed).await?;
    let actions = decide::decide(&snapshot);
    for action in &actions {
        apply_action(&d, &ctx, &observed, &snapshot, action).await?;
    }
    if actions.is_empty() && !snapshot.rollout.paused && snapshot.is_complete() {
        let limit = d
            .spec
            .revision_history_limit
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT);
        for set in decide::sets_to_prune(&snapshot.old_sets, limit) {
            // A set gone meanwhile is pruned.
            let _ = kube_api::delete(&sets_api, &set, &DeleteParams::background())
                .await
                .map_err(ApiCallError::on::<Error>("prune", "MachineSet", &set))?;
        }
    }

    // Rollout markers on the target cluster's nodes.
    let rollout = snapshot.new_set.is_some()
        && snapshot
            .old_sets
            .iter()
            .any(|o| o.machines > 0 || o.replicas > 0);
    let old_machines: Vec<&Machine> = observed
        .sets
        .iter()
        .filter(|s| Some(s.name_any()) != new_name)
        .flat_map(|s| observed.machines.get(&s.name_any()).into_iter().flatten())
        .map(|m| m.as_ref())
        .collect();
    let all_machines: Vec<&Machine> = observed
        .machines
        .values()
        .flatten()
        .map(|m| m.as_ref())
        .collect();
    apply_markers(
        &ctx.target,
        &ctx.nodes,
        &old_machines,
        &all_machines,
        rollout,
        ctx.autoscaler_annotations,
    )
    .await;

    // Status.
    let (status, recheck) = compute_status(
        &snapshot,
        &StatusInput {
            generation: d.metadata.generation,
            progress_deadline_seconds: d.spec.progress_deadline_seconds,
            previous: d.status.as_ref(),
            failed_machines: failed,
            progressed: !actions.is_empty(),
            now,
        },
    );
    update_status(&api, &d, &status).await?;
    let min_ready = d.spec.min_ready_seconds.unwrap_or(0);
    let mut next = recheck.unwrap_or(RESYNC_PERIOD);
    if min_ready > 0 && !snapshot.is_complete() {
        next = next.min(Duration::from_secs(u64::try_from(min_ready).unwrap_or(1)));
    }
    Ok(Action::requeue(next + Duration::from_millis(500)))
}

/// Writes `status` unless the deployment already has it.
async fn update_status(
    api: &Api<MachineDeployment>,
    d: &MachineDeployment,
    status: &MachineDeploymentStatus,
) -> Result<(), Error> {
    if d.status.as_ref() == Some(status) {
        return Ok(());
    }
    let patch = status_patch(status, &["conditions", "failedMachines"]);
    // A deployment gone meanwhile needs no status.
    let _ = merge_patch_status(api, &d.name_any(), &patch)
        .await
        .map_err(ApiCallError::on::<Error>(
            "update status of",
            "MachineDeployment",
            &d.name_any(),
        ))?;
    Ok(())
}

/// Records an unusable strategy: writes `status` (with its `Progressing=False,
/// InvalidStrategy` condition) and, only when that condition is new or its message changed,
/// publishes one Warning Event. The condition is stored, so neither later reconciles nor a
/// restarted controller repeat the Event.
async fn report_invalid_strategy(
    d: &MachineDeployment,
    ctx: &Context,
    api: &Api<MachineDeployment>,
    status: MachineDeploymentStatus,
) -> Result<(), Error> {
    let invalid = |s: Option<&MachineDeploymentStatus>| {
        s.and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| is_invalid_strategy(c)))
            .and_then(|c| c.message.clone())
    };
    let before = invalid(d.status.as_ref());
    let message = invalid(Some(&status)).unwrap_or_default();
    tracing::debug!(deployment = %d.name_any(), %message, "invalid strategy");
    update_status(api, d, &status).await?;
    if before.as_deref() != Some(message.as_str()) {
        ctx.events
            .warning(&reference(d), reasons::INVALID_STRATEGY, "Sync", message)
            .await;
    }
    Ok(())
}

/// Retry periods of failed deployment reconciles.
const RETRY: RetryPolicy = RetryPolicy {
    conflict: Duration::from_millis(200),
    backoff: Duration::from_secs(5),
};

/// What to do after a failed reconcile: conflicts are retried quickly, the rest after a
/// few seconds ([`kube_api::error_policy`]).
pub fn error_policy(d: Arc<MachineDeployment>, error: &Error, _ctx: Arc<Context>) -> Action {
    kube_api::error_policy(&RETRY, MachineDeployment::KIND, &d.name_any(), error)
}

/// The error of a failed finalizer update of `d`.
fn finalizer_error(d: &MachineDeployment) -> impl FnOnce(kube::Error) -> Error + use<> {
    ApiCallError::on(
        "update finalizers of",
        MachineDeployment::KIND,
        &d.name_any(),
    )
}

fn max_old_revision(observed: &Observed) -> i64 {
    let new_name = observed.new_set.as_ref().map(|s| s.name_any());
    observed
        .sets
        .iter()
        .filter(|s| Some(s.name_any()) != new_name)
        .filter_map(|s| annotation_i64(s.as_ref(), annotations::REVISION))
        .max()
        .unwrap_or(0)
}

/// Keeps the new set's revision above all old revisions and copies it to the deployment.
async fn sync_revision(
    d: &MachineDeployment,
    ctx: &Context,
    observed: &Observed,
) -> Result<(), Error> {
    let Some(new) = &observed.new_set else {
        return Ok(());
    };
    let ns = d.namespace().unwrap_or_default();
    let max_old = max_old_revision(observed);
    let current = annotation_i64(new.as_ref(), annotations::REVISION);
    let mut revision = current.unwrap_or(0);
    if revision <= max_old {
        revision = max_old + 1;
        let mut history: Vec<String> = new
            .annotations()
            .get(annotations::REVISION_HISTORY)
            .map(|h| h.split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        if let Some(c) = current {
            history.push(c.to_string());
        }
        let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ns);
        let mut anns = serde_json::Map::new();
        anns.insert(annotations::REVISION.into(), json!(revision.to_string()));
        if !history.is_empty() {
            anns.insert(
                annotations::REVISION_HISTORY.into(),
                json!(history.join(",")),
            );
        }
        let patch = json!({"metadata": {"annotations": anns}});
        sets.patch(
            &new.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube("update revision of", "MachineSet", &new.name_any(), e))?;
    }
    if annotation_i64(d, annotations::REVISION) != Some(revision) {
        let api: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
        let patch =
            json!({"metadata": {"annotations": {annotations::REVISION: revision.to_string()}}});
        api.patch(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube("update revision of", "MachineDeployment", &d.name_any(), e))?;
    }
    Ok(())
}

/// The new MachineSet of a deployment: template with the hash label (in labels, template
/// labels and selector), revision and replica annotations, the deployment as controller.
pub fn new_machine_set(
    d: &MachineDeployment,
    replicas: i32,
    revision: i64,
    max_surge: i32,
) -> MachineSet {
    let collision = d.status.as_ref().and_then(|s| s.collision_count);
    let hash = template_hash(&d.spec.template, collision);
    let mut template: MachineTemplateSpec = d.spec.template.clone();
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let mut set_labels = meta.labels.clone().unwrap_or_default();
    set_labels.remove(labels::FREEZE);
    let mut selector = d.spec.selector.clone().unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let annotations_map = BTreeMap::from([
        (annotations::REVISION.to_owned(), revision.to_string()),
        (
            annotations::DESIRED_REPLICAS.to_owned(),
            d.spec.replicas().to_string(),
        ),
        (
            annotations::MAX_REPLICAS.to_owned(),
            (d.spec.replicas() + max_surge).to_string(),
        ),
    ]);
    MachineSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", d.name_any(), hash)),
            namespace: d.namespace(),
            labels: Some(set_labels),
            annotations: Some(annotations_map),
            owner_references: Some(vec![controller_reference(d)]),
            ..ObjectMeta::default()
        },
        spec: MachineSetSpec {
            replicas: Some(replicas),
            selector: Some(selector),
            min_ready_seconds: d.spec.min_ready_seconds,
            template: Some(template),
            auto_preserve_failed_machine_max: d.spec.auto_preserve_failed_machine_max,
            ..MachineSetSpec::default()
        },
        ..MachineSet::default()
    }
}

async fn apply_action(
    d: &MachineDeployment,
    ctx: &Context,
    observed: &Observed,
    snapshot: &Snapshot,
    action: &RolloutAction,
) -> Result<(), Error> {
    let ns = d.namespace().unwrap_or_default();
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ns);
    let surge = snapshot.rollout.strategy.max_surge();
    match action {
        RolloutAction::CreateNewSet { replicas } => {
            let set = new_machine_set(d, *replicas, max_old_revision(observed) + 1, surge);
            let set_name = set.name_any();
            match sets.create(&PostParams::default(), &set).await {
                Ok(_) => {
                    ctx.events
                        .normal(
                            &reference(d),
                            "NewMachineSetCreated",
                            "Rollout",
                            format!("Created new MachineSet {set_name} with {replicas} replicas"),
                        )
                        .await;
                    Ok(())
                }
                Err(e) if e.is_conflict() => {
                    let existing = sets
                        .get(&set_name)
                        .await
                        .map_err(|e| Error::kube("get", "MachineSet", &set_name, e))?;
                    let same = existing
                        .spec
                        .template
                        .as_ref()
                        .is_some_and(|t| templates_equal(t, &d.spec.template));
                    if same {
                        return Ok(());
                    }
                    // Hash collision: bump the collision count and try again next time.
                    let count = d
                        .status
                        .as_ref()
                        .and_then(|s| s.collision_count)
                        .unwrap_or(0)
                        + 1;
                    let api: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
                    let patch = json!({"status": {"collisionCount": count}});
                    api.patch_status(
                        &d.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .map_err(|e| {
                        Error::kube(
                            "update collision count of",
                            "MachineDeployment",
                            &d.name_any(),
                            e,
                        )
                    })?;
                    Err(Error::HashCollision(set_name))
                }
                Err(e) => Err(Error::kube("create", "MachineSet", &set_name, e)),
            }
        }
        RolloutAction::Scale { set, replicas } => {
            let current = snapshot
                .new_set
                .iter()
                .chain(snapshot.old_sets.iter())
                .find(|s| &s.name == set);
            let patch = json!({
                "metadata": {"annotations": {
                    annotations::DESIRED_REPLICAS: d.spec.replicas().to_string(),
                    annotations::MAX_REPLICAS: (d.spec.replicas() + surge).to_string(),
                }},
                "spec": {"replicas": replicas},
            });
            sets.patch(set, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::kube("scale", "MachineSet", set, e))?;
            if let Some(cur) = current
                && cur.replicas != *replicas
            {
                let direction = if *replicas > cur.replicas {
                    "up"
                } else {
                    "down"
                };
                ctx.events
                    .normal(
                        &reference(d),
                        "ScalingMachineSet",
                        "Scale",
                        format!(
                            "Scaled {direction} MachineSet {set} from {} to {replicas}",
                            cur.replicas
                        ),
                    )
                    .await;
            }
            Ok(())
        }
    }
}

/// One entry of the trigger-deletion annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerEntry {
    /// Machine name.
    pub machine: String,
    /// When the scaler decided to delete it (`name~time`), `None` for a bare name.
    pub time: Option<String>,
}

/// Parses `node.machine.sapcloud.io/trigger-deletion-by-mcm`: comma-separated machine names,
/// each optionally followed by `~<RFC 3339 time>` (the cluster-autoscaler's current format,
/// written together with the reduced replicas). Blank entries are dropped.
pub fn parse_trigger_deletion(value: &str) -> Vec<TriggerEntry> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('~') {
            Some((name, time)) => TriggerEntry {
                machine: name.trim().to_owned(),
                time: Some(time.trim().to_owned()),
            },
            None => TriggerEntry {
                machine: e.to_owned(),
                time: None,
            },
        })
        .collect()
}

/// Handles the trigger-deletion annotation. Named machines of this deployment get priority
/// 1 and a marked-for-deletion time, so the next scale-down removes them first. Bare names
/// (legacy format) also reduce `spec.replicas` by one each and are removed from the
/// annotation in the same update; `name~time` entries (the scaler already reduced the
/// replicas) stay until their machine is terminating or gone. Returns whether the
/// deployment was updated.
async fn handle_trigger_deletion(
    d: &MachineDeployment,
    ctx: &Context,
    observed: &Observed,
) -> Result<bool, Error> {
    let Some(value) = d.annotations().get(annotations::TRIGGER_DELETION_BY_MCM) else {
        return Ok(false);
    };
    let ns = d.namespace().unwrap_or_default();
    let machines_api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ns);
    let ours: BTreeMap<String, &Arc<Machine>> = observed
        .machines
        .values()
        .flatten()
        .map(|m| (m.name_any(), m))
        .collect();
    let mut keep = Vec::new();
    let mut scale_down = 0;
    for entry in parse_trigger_deletion(value) {
        let Some(m) = ours.get(&entry.machine) else {
            continue;
        };
        if is_terminating(m) || m.phase() == Some(&MachinePhase::Failed) {
            continue;
        }
        let anns = m.annotations();
        let marked = anns.get(annotations::MACHINE_PRIORITY).map(String::as_str) == Some("1")
            && anns.contains_key(annotations::MARKED_FOR_DELETION_TIME);
        if !marked {
            let time = entry
                .time
                .clone()
                .unwrap_or_else(|| Timestamp::now().to_string());
            let patch = json!({"metadata": {"annotations": {
                annotations::MACHINE_PRIORITY: "1",
                annotations::MARKED_FOR_DELETION_TIME: time,
            }}});
            machines_api
                .patch(
                    &entry.machine,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| Error::kube("mark for deletion", "Machine", &entry.machine, e))?;
            ctx.events
                .normal(
                    &reference(d),
                    "MachineMarkedForDeletion",
                    "TriggerDeletion",
                    format!(
                        "Machine {} marked with priority 1 for deletion",
                        entry.machine
                    ),
                )
                .await;
        }
        match &entry.time {
            Some(t) => keep.push(format!("{}~{t}", entry.machine)),
            None => scale_down += 1,
        }
    }
    let new_value = keep.join(",");
    if new_value == *value && scale_down == 0 {
        return Ok(false);
    }
    let api: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let annotation = if new_value.is_empty() {
        serde_json::Value::Null
    } else {
        json!(new_value)
    };
    let mut patch = json!({"metadata": {
        "resourceVersion": d.resource_version(),
        "annotations": {annotations::TRIGGER_DELETION_BY_MCM: annotation},
    }});
    if scale_down > 0 {
        patch["spec"] = json!({"replicas": (d.spec.replicas() - scale_down).max(0)});
        ctx.events
            .normal(
                &reference(d),
                "ScaledDownForTriggeredDeletion",
                "Scale",
                format!("Scaled down by {scale_down} for machines triggered for deletion"),
            )
            .await;
    }
    api.patch(
        &d.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| {
        Error::kube(
            "update trigger-deletion of",
            "MachineDeployment",
            &d.name_any(),
            e,
        )
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_trigger_deletion() {
        assert_eq!(
            parse_trigger_deletion(" a, b~2024-01-01T00:00:00Z ,,"),
            vec![
                TriggerEntry {
                    machine: "a".into(),
                    time: None
                },
                TriggerEntry {
                    machine: "b".into(),
                    time: Some("2024-01-01T00:00:00Z".into())
                },
            ]
        );
    }
}
