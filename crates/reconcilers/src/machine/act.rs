//! The async half of the machine controller: one small action per [`Step`](super::decide::Step). Every action is
//! idempotent: it may run again after a crash at any point.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use mcm_api::constants::annotations::progress;
use mcm_api::constants::{annotations, labels, node_conditions};
use mcm_api::{Machine, MachineClass, MachineOperationType, MachinePhase};
use mcm_driver::{
    Code, CreateMachineRequest, DeleteMachineRequest, DriverError, GetMachineStatusRequest,
    GetMachineStatusResponse, IdempotencyKey, InitializeMachineRequest, RequestId, SecretData,
    USER_DATA_KEY,
};
use serde_json::json;

use super::decide::{ClassProblem, MachineConfig, VmReport};
use super::hooks::HookStage;
use super::metrics::{DeploymentLabels, PlacementLabels, Timed};
use super::status::{self, Operation};
use super::{Ctx, Error, FINALIZER, LEGACY_FINALIZERS, token};
use crate::kube_api::{self, ApiErrorExt};

const RECHECK: Duration = Duration::from_secs(30);

fn machine_api(ctx: &Ctx) -> Api<Machine> {
    Api::namespaced(ctx.control.clone(), &ctx.settings.namespace)
}

fn name(m: &Machine) -> String {
    m.name_any()
}

/// The labels of upstream's duration metrics for `m`; `None` without its deployment's `name`
/// label (upstream records nothing then).
fn placement_labels(ctx: &Ctx, m: &Machine) -> Option<PlacementLabels> {
    let deployment = deployment_labels(m)?;
    let instance_type = m
        .class_name()
        .and_then(|c| ctx.class(c))
        .and_then(|c| c.node_template)
        .map(|t| t.instance_type)
        .unwrap_or_default();
    let zone = m
        .spec
        .node_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|meta| meta.labels.as_ref())
        .and_then(|l| l.get("topology.kubernetes.io/zone").cloned())
        .unwrap_or_default();
    Some(PlacementLabels {
        namespace: deployment.namespace,
        machine_deployment: deployment.machine_deployment,
        instance_type,
        zone,
    })
}

fn deployment_labels(m: &Machine) -> Option<DeploymentLabels> {
    let deployment = m.labels().get(labels::NAME).filter(|n| !n.is_empty())?;
    Some(DeploymentLabels {
        namespace: m.namespace().unwrap_or_default(),
        machine_deployment: deployment.clone(),
    })
}

/// Time since `since` (zero for a time in the future).
fn since(since: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Duration {
    since
        .and_then(|t| Timestamp::now().duration_since(t.0).try_into().ok())
        .unwrap_or(Duration::ZERO)
}

fn record_duration(ctx: &Ctx, m: &Machine, step: Timed, took: Duration) {
    if let Some(labels) = placement_labels(ctx, m) {
        ctx.metrics.timed(step, &labels, took);
    }
}

pub(crate) async fn patch_status(
    ctx: &Ctx,
    m: &Machine,
    patch: serde_json::Value,
) -> Result<(), Error> {
    patch_status_for(ctx, m, patch).await.map(drop)
}

/// [`patch_status`], returning the Machine as written.
async fn patch_status_for(
    ctx: &Ctx,
    m: &Machine,
    patch: serde_json::Value,
) -> Result<Machine, Error> {
    machine_api(ctx)
        .patch_status(&name(m), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .inspect(|written| ctx.note_own_write(written))
        .map_err(|e| Error::kube("update machine status", e))
}

/// Writes `op` (and `phase`) unless the Machine already shows exactly that: every status
/// write triggers another reconcile through the watch, so rewriting an unchanged failure
/// (with a new timestamp) would turn a retry backoff into a hot loop.
async fn record(
    ctx: &Ctx,
    m: &Machine,
    phase: Option<&MachinePhase>,
    op: &Operation,
) -> Result<(), Error> {
    if status::already_recorded(m, phase, op) {
        return Ok(());
    }
    patch_status(ctx, m, status::status_patch(m, phase, op, Timestamp::now())).await
}

/// The Event that announces a recorded operation: its type, reason and action.
#[derive(Debug, Clone, Copy)]
struct Notice {
    event: EventType,
    reason: &'static str,
    action: &'static str,
}

impl Notice {
    const fn normal(reason: &'static str, action: &'static str) -> Self {
        Notice {
            event: EventType::Normal,
            reason,
            action,
        }
    }

    const fn warning(reason: &'static str, action: &'static str) -> Self {
        Notice {
            event: EventType::Warning,
            reason,
            action,
        }
    }
}

/// Records `op` (and `phase`) on the Machine and publishes the same text as an Event.
async fn announce(
    ctx: &Ctx,
    m: &Machine,
    phase: Option<&MachinePhase>,
    op: Operation,
    notice: Notice,
) -> Result<(), Error> {
    record(ctx, m, phase, &op).await?;
    let Notice {
        event,
        reason,
        action,
    } = notice;
    let reference = m.object_ref(&());
    ctx.events
        .publish(&reference, event, reason, action, op.description)
        .await;
    Ok(())
}

/// Records a step of the deletion (the phase stays) as `description`.
async fn record_deletion_step(ctx: &Ctx, m: &Machine, description: String) -> Result<(), Error> {
    let op = Operation::processing(MachineOperationType::Delete, description);
    record(ctx, m, None, &op).await
}

/// Records a step of the deletion (the phase stays) and announces it with `notice`.
async fn announce_deletion_step(
    ctx: &Ctx,
    m: &Machine,
    description: String,
    notice: Notice,
) -> Result<(), Error> {
    let op = Operation::processing(MachineOperationType::Delete, description);
    announce(ctx, m, None, op, notice).await
}

/// Adds our finalizer (replacing a legacy name), guarded by the resource version. A Machine
/// gone meanwhile needs nothing more.
pub async fn add_finalizer(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let api = machine_api(ctx);
    let _ = kube_api::set_finalizer_as(&api, m, FINALIZER, LEGACY_FINALIZERS, true)
        .await
        .map_err(|e| Error::kube("add the machine finalizer", e))?;
    Ok(Action::await_change())
}

/// Removes our finalizer, under either name (the last step of deletion).
///
/// The deletion wrote the Machine's status on the way (Terminating, drain results), so the
/// resourceVersion of `m` is stale by now: guarding the patch with it failed with a conflict
/// on every deletion and cost a second full deletion pass. The finalizers are read again and
/// the patch is guarded by the fresh version (someone else may be editing finalizers).
async fn remove_finalizer(ctx: &Ctx, m: &Machine) -> Result<(), Error> {
    let api = machine_api(ctx);
    // With the reconciled copy first (its resourceVersion guards the patch); a conflict
    // means it was stale: read the Machine and try again.
    match kube_api::set_finalizer_as(&api, m, FINALIZER, LEGACY_FINALIZERS, false).await {
        Ok(_) => return Ok(()),
        Err(e) if e.is_conflict() => {}
        Err(e) => return Err(Error::kube("remove the machine finalizer", e)),
    }
    let current = match api.get_opt(&name(m)).await {
        Ok(Some(c)) if c.uid() == m.uid() => c,
        // Gone, or a new Machine of the same name: nothing of ours to remove.
        Ok(_) => return Ok(()),
        Err(e) => return Err(Error::kube("read the machine", e)),
    };
    // Gone meanwhile: nothing left to remove.
    let _ = kube_api::set_finalizer_as(&api, &current, FINALIZER, LEGACY_FINALIZERS, false)
        .await
        .map_err(|e| Error::kube("remove the machine finalizer", e))?;
    Ok(())
}

/// Records why the class cannot be used; retries with backoff (class changes also wake us).
pub async fn report_class_problem(
    ctx: &Ctx,
    m: &Machine,
    problem: &ClassProblem,
) -> Result<Action, Error> {
    let kind = if m.metadata.deletion_timestamp.is_some() {
        MachineOperationType::Delete
    } else {
        MachineOperationType::Create
    };
    let description = format!("cannot use the machine class: {problem}");
    let unchanged = last_description(m) == Some(description.as_str());
    record(
        ctx,
        m,
        None,
        &Operation::failed(kind, description.clone(), None),
    )
    .await?;
    if !unchanged {
        ctx.events
            .warning(
                &m.object_ref(&()),
                "MachineClassProblem",
                "Validate",
                description,
            )
            .await;
    }
    Ok(Action::requeue(ctx.backoff(m, None)))
}

fn last_description(m: &Machine) -> Option<&str> {
    m.status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.as_deref())
}

/// Reads the class and its secrets for a driver call.
pub async fn class_and_secret(ctx: &Ctx, m: &Machine) -> Result<(MachineClass, SecretData), Error> {
    let class_name = super::observe::class_name(m).map_err(Error::Class)?;
    let class = ctx.class(class_name).ok_or_else(|| {
        Error::Class(ClassProblem::ClassMissing {
            name: class_name.into(),
        })
    })?;
    let [secret_ref, credentials] = super::observe::class_secret_refs(&class);
    let mut fetched = Vec::new();
    for r in [secret_ref, credentials].into_iter().flatten() {
        let secret = ctx.class_secret(&r).await?.ok_or_else(|| {
            Error::Class(ClassProblem::SecretMissing {
                class: class_name.into(),
                secret: r.name.clone(),
            })
        })?;
        fetched.push(secret);
    }
    let data = SecretData::merge(
        fetched.first().map(AsRef::as_ref),
        fetched.get(1).map(AsRef::as_ref),
    );
    Ok((class, data))
}

/// Ensures the machine's bootstrap token exists in the target cluster and returns it.
async fn ensure_bootstrap_token(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
) -> Result<String, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.target.clone(), token::TOKEN_NAMESPACE);
    let id = token::token_id(&ctx.settings.namespace, &name(m));
    let secret_name = token::secret_name(&id);
    // Created first (a retry after a crash finds it with a conflict and reads it).
    let secret = token::token_secret(
        &id,
        &token::random_secret(),
        &name(m),
        token::expiry(Timestamp::now(), cfg.creation_timeout),
        &ctx.settings.bootstrap_token_auth_extra_groups,
    );
    let created = match api.create(&PostParams::default(), &secret).await {
        Ok(s) => s,
        Err(e) if e.is_conflict() => api
            .get(&secret_name)
            .await
            .map_err(|e| Error::kube("read the bootstrap token", e))?,
        Err(e) => return Err(Error::kube("create the bootstrap token", e)),
    };
    token::token_of(&created)
        .or_else(|| token::token_of(&secret))
        .ok_or_else(|| Error::Invariant("bootstrap token secret without token data".into()))
}

/// Warns (an Event on the Machine) that the class's userData has no bootstrap-token
/// placeholder: the VM is still created, as the Go MCM does, but its Node can only join
/// with credentials of its own.
async fn warn_no_token_placeholder(ctx: &Ctx, m: &Machine, class: &MachineClass) {
    let secret = class
        .secret_ref
        .as_ref()
        .and_then(|r| r.name.clone())
        .unwrap_or_default();
    let note = format!(
        "the userData of Secret {secret:?} (MachineClass {:?}) has no {} placeholder: the VM gets no bootstrap token, so its Node joins only if the userData brings credentials of its own",
        class.metadata.name.as_deref().unwrap_or_default(),
        mcm_api::constants::placeholders::BOOTSTRAP_TOKEN,
    );
    ctx.events
        .publish(
            &m.object_ref(&()),
            EventType::Warning,
            NO_TOKEN_PLACEHOLDER,
            "Create",
            note,
        )
        .await;
}

/// Reason of the Event of an adopted VM (one found by `get_machine_status` before any
/// `create_machine`, e.g. after a crash between the request and recording its providerID).
pub const ADOPTED: &str = "Adopted";

/// Reason of the Event of `warn_no_token_placeholder`.
pub const NO_TOKEN_PLACEHOLDER: &str = "NoBootstrapTokenPlaceholder";

/// Deletes the machine's bootstrap token (the Node joined, or the machine goes away).
async fn delete_bootstrap_token(ctx: &Ctx, m: &Machine) -> Result<(), Error> {
    let api: Api<Secret> = Api::namespaced(ctx.target.clone(), token::TOKEN_NAMESPACE);
    let id = token::token_id(&ctx.settings.namespace, &name(m));
    // Gone already is as good as deleted.
    let _ = kube_api::delete(&api, &token::secret_name(&id), &DeleteParams::default())
        .await
        .map_err(|e| Error::kube("delete the bootstrap token", e))?;
    Ok(())
}

/// Finds the VM (adoption after a crash) or creates it, initializes it when the driver asks
/// for it, and records providerID and the `node` label. Pending is the next step.
pub async fn create_vm(ctx: &Ctx, m: &Machine, cfg: &MachineConfig) -> Result<Action, Error> {
    // A wake-up by the status write of the last failed attempt is not a reason to retry
    // before the backoff is over (that would be a hot loop against the cloud).
    if let Some(left) = ctx.backoff_left(m) {
        return Ok(Action::requeue(left));
    }
    match try_create_vm(ctx, m, cfg).await {
        Ok(action) => {
            ctx.reset_backoff(m);
            Ok(action)
        }
        // A failed attempt leaves the machine with our finalizer all the same.
        Err(Error::Driver { op, source }) => {
            finalizer_after_failure(ctx, m).await;
            creation_failed(ctx, m, op, source).await
        }
        Err(Error::Class(problem)) => {
            finalizer_after_failure(ctx, m).await;
            report_class_problem(ctx, m, &problem).await
        }
        Err(e) => Err(e),
    }
}

async fn try_create_vm(ctx: &Ctx, m: &Machine, cfg: &MachineConfig) -> Result<Action, Error> {
    let (class, mut secret) = class_and_secret(ctx, m).await?;
    let machine_name = name(m);
    // Without a target cluster there is no cluster to join: no bootstrap token, and its
    // placeholder is left as it is (upstream's behaviour).
    let token = if ctx.settings.target_cluster {
        Some(ensure_bootstrap_token(ctx, m, cfg).await?)
    } else {
        None
    };
    if let Some(user_data) = secret.get_str(USER_DATA_KEY) {
        let rendered = match &token {
            Some(token) => {
                let first_attempt = super::observe::progress(m, progress::VM_REQUESTED).is_none();
                if first_attempt && !token::has_token_placeholder(user_data) {
                    warn_no_token_placeholder(ctx, m, &class).await;
                }
                token::render_user_data(user_data, token, &machine_name)
            }
            None => token::render_machine_name(user_data, &machine_name),
        };
        secret.0.insert(USER_DATA_KEY.into(), rendered.into_bytes());
    }
    // Recorded before any request to the cloud: from now on a VM may exist, even if this
    // process dies before it learns the providerID, so deletion will need the class. Our
    // finalizer goes with it when it is missing. Its value identifies this creation attempt:
    // every retry of it, also after a restart, sends the cloud the same idempotency key.
    let recorded_request = m.annotations().get(progress::VM_REQUESTED).cloned();
    let first_request = recorded_request.is_none();
    let requested_at = recorded_request.unwrap_or_else(|| Timestamp::now().to_string());
    let key = creation_key(m, &requested_at);
    let request_id = RequestId::generate();
    tracing::info!(%request_id, "looking for the machine's VM");
    let found = vm_status(ctx, m, &class, &secret, &request_id).await;
    let (vm, adopted, initialized) = match found {
        Ok(s) => {
            record_vm_request(ctx, m, None).await?;
            (FoundVm::from(s), true, true)
        }
        Err(e) if matches!(e.code, Code::NotFound | Code::Unimplemented) => {
            record_vm_request(ctx, m, first_request.then_some(requested_at.as_str())).await?;
            tracing::info!(%request_id, idempotency_key = %key, "creating the VM");
            let created = match ctx
                .driver
                .create_machine(CreateMachineRequest {
                    machine: m.clone(),
                    machine_class: class.clone(),
                    secret: secret.clone(),
                    request_id: request_id.clone(),
                    idempotency_key: key,
                })
                .await
            {
                Ok(created) => created,
                Err(source) => {
                    // `InvalidArgument`: the driver refused the request, nothing was created
                    // (the SPI's contract). Only the record this request wrote is taken back:
                    // an earlier request may have made a VM.
                    if first_request && source.code == Code::InvalidArgument {
                        clear_progress(ctx, m, progress::VM_REQUESTED).await?;
                    }
                    return Err(Error::driver("create_machine", source));
                }
            };
            let created_after = since(m.metadata.creation_timestamp.as_ref());
            record_duration(ctx, m, Timed::Create, created_after);
            (FoundVm::from(created), false, false)
        }
        Err(e) if e.code == Code::Uninitialized => {
            // A VM found by the driver's own lookup (no providerID yet) that still needs its
            // initialization, which also tells its providerID.
            record_vm_request(ctx, m, None).await?;
            initialize(ctx, m, &class, &secret, &request_id).await?;
            let s = vm_status(ctx, m, &class, &secret, &request_id)
                .await
                .map_err(|source| Error::driver("get_machine_status", source))?;
            (FoundVm::from(s), true, true)
        }
        Err(e) => return Err(Error::driver("get_machine_status", e)),
    };

    // The providerID is recorded before the VM is initialized: from here on the driver finds
    // the VM by its id, and a crash or a failed initialization leaves a machine whose
    // creation is finished by `finish_creation`.
    let recorded = record_vm(ctx, m, &vm).await?;
    if !initialized {
        initialize(ctx, &recorded, &class, &secret, &request_id).await?;
    }
    // A created VM is announced by the Running Event that names it (an Event of its own
    // would cost a request per machine under the same QPS budget and say what `Running`
    // says); an adopted one has an Event: it tells of an earlier attempt.
    if adopted {
        ctx.events
            .normal(
                &m.object_ref(&()),
                ADOPTED,
                "Create",
                format!(
                    "Adopted existing VM {} for node {}",
                    vm.provider_id, vm.node_name
                ),
            )
            .await;
    }
    ctx.metrics.created(adopted);
    settle_created(ctx, &recorded, cfg).await
}

/// The creation attempt's idempotency key: the Machine's UID and its `vm-requested` record.
fn creation_key(m: &Machine, requested_at: &str) -> IdempotencyKey {
    let uid = m.uid().unwrap_or_else(|| name(m));
    IdempotencyKey::for_creation(&uid, requested_at)
}

/// What the driver said of a created or found VM.
struct FoundVm {
    provider_id: String,
    node_name: String,
    last_known_state: Option<String>,
    addresses: Vec<k8s_openapi::api::core::v1::NodeAddress>,
}

impl From<GetMachineStatusResponse> for FoundVm {
    fn from(s: GetMachineStatusResponse) -> Self {
        FoundVm {
            provider_id: s.provider_id,
            node_name: s.node_name,
            last_known_state: None,
            addresses: s.addresses,
        }
    }
}

impl From<mcm_driver::CreateMachineResponse> for FoundVm {
    fn from(c: mcm_driver::CreateMachineResponse) -> Self {
        FoundVm {
            provider_id: c.provider_id,
            node_name: c.node_name,
            last_known_state: c.last_known_state,
            addresses: c.addresses,
        }
    }
}

/// Records the VM on the Machine (providerID, `node` label, default priority; then what the
/// driver reported in the status) and returns the Machine as written.
async fn record_vm(ctx: &Ctx, m: &Machine, vm: &FoundVm) -> Result<Machine, Error> {
    let patch = record_vm_patch(
        m,
        &vm.provider_id,
        &vm.node_name,
        ctx.settings.target_cluster,
    );
    let recorded = patch_machine_for(ctx, m, &patch, "record the machine's providerID").await?;
    // Without a target cluster the addresses come from the driver.
    let addresses = (!ctx.settings.target_cluster)
        .then(|| status::address_status(&vm.addresses, &vm.node_name));
    match status::driver_state_patch(
        &recorded,
        vm.last_known_state.as_deref(),
        addresses.as_deref(),
    ) {
        Some(p) => patch_status_for(ctx, &recorded, p).await,
        None => Ok(recorded),
    }
}

/// The phase of a machine whose VM is recorded and initialized: Available without a target
/// cluster, Running when its Node joined already (Pending would be a write nobody sees),
/// else Pending (the creation timeout runs).
async fn settle_created(ctx: &Ctx, m: &Machine, cfg: &MachineConfig) -> Result<Action, Error> {
    if !ctx.settings.target_cluster {
        return mark_available(ctx, m).await;
    }
    let node = super::observe::node_name(m)
        .and_then(|n| ctx.node(n))
        .filter(|n| !super::observe::node_not_managed(n));
    match node {
        Some(node) if super::observe::node_health(&node, &cfg.bad_conditions).healthy() => {
            mark_running(ctx, m, Some(&node)).await
        }
        _ => mark_pending(ctx, m).await,
    }
}

/// [`super::decide::Step::FinishCreation`]: the VM is recorded but its creation did not
/// finish. The driver is asked for it; one that needs initialization is initialized; then the
/// machine moves on as creation does. A failure is a creation failure (CrashLoopBackOff, an
/// Event, a backoff retry; Failed after the creation timeout).
pub async fn finish_creation(ctx: &Ctx, m: &Machine, cfg: &MachineConfig) -> Result<Action, Error> {
    if let Some(left) = ctx.backoff_left(m) {
        return Ok(Action::requeue(left));
    }
    match try_finish_creation(ctx, m, cfg).await {
        Ok(action) => {
            ctx.reset_backoff(m);
            Ok(action)
        }
        Err(Error::Driver { op, source }) => creation_failed(ctx, m, op, source).await,
        Err(Error::Class(problem)) => report_class_problem(ctx, m, &problem).await,
        Err(e) => Err(e),
    }
}

async fn try_finish_creation(ctx: &Ctx, m: &Machine, cfg: &MachineConfig) -> Result<Action, Error> {
    let (class, secret) = class_and_secret(ctx, m).await?;
    let request_id = RequestId::generate();
    match vm_status(ctx, m, &class, &secret, &request_id).await {
        Ok(_) => {}
        Err(e) if e.code == Code::Unimplemented => {}
        Err(e) if e.code == Code::Uninitialized => {
            tracing::info!(%request_id, "initializing the recorded VM");
            initialize(ctx, m, &class, &secret, &request_id).await?;
        }
        Err(e) => return Err(Error::driver("get_machine_status", e)),
    }
    settle_created(ctx, m, cfg).await
}

/// Writes the `vm-requested` progress (`requested_at`, when this is the attempt's first
/// request) and our finalizer (when it is missing) in one patch, guarded by the resource
/// version; nothing when both are there. The guard matters for the record: a stale copy of
/// the Machine must not record a second attempt (it would get another idempotency key).
async fn record_vm_request(
    ctx: &Ctx,
    m: &Machine,
    requested_at: Option<&str>,
) -> Result<(), Error> {
    let mut patch = kube_api::finalizer_patch_as(m, FINALIZER, LEGACY_FINALIZERS, true)
        .unwrap_or_else(|| json!({ "metadata": {} }));
    if let Some(at) = requested_at {
        patch["metadata"]["annotations"] = json!({ progress::VM_REQUESTED: at });
        patch["metadata"]["resourceVersion"] = json!(m.resource_version());
    } else if patch["metadata"].get("finalizers").is_none() {
        return Ok(());
    }
    patch_machine(ctx, m, &patch, "record the VM request").await
}

/// Adds our finalizer after a failed creation attempt, best effort: a conflict means this
/// attempt wrote it with the VM request already (the copy is stale), and any other failure is
/// retried by the next attempt. Without a VM request there is nothing a missing finalizer
/// could leak.
async fn finalizer_after_failure(ctx: &Ctx, m: &Machine) {
    if let Err(e) = record_vm_request(ctx, m, None).await {
        tracing::debug!(error = %e, "finalizer not added this round; the next attempt adds it");
    }
}

/// Asks the driver for the machine's VM.
async fn vm_status(
    ctx: &Ctx,
    m: &Machine,
    class: &MachineClass,
    secret: &SecretData,
    request_id: &RequestId,
) -> Result<GetMachineStatusResponse, DriverError> {
    let request = GetMachineStatusRequest {
        machine: m.clone(),
        machine_class: class.clone(),
        secret: secret.clone(),
        request_id: request_id.clone(),
    };
    ctx.driver.get_machine_status(request).await
}

async fn initialize(
    ctx: &Ctx,
    m: &Machine,
    class: &MachineClass,
    secret: &SecretData,
    request_id: &RequestId,
) -> Result<(), Error> {
    let started = std::time::Instant::now();
    match ctx
        .driver
        .initialize_machine(InitializeMachineRequest {
            machine: m.clone(),
            machine_class: class.clone(),
            secret: secret.clone(),
            request_id: request_id.clone(),
        })
        .await
    {
        Ok(_) => {
            record_duration(ctx, m, Timed::Initialize, started.elapsed());
            Ok(())
        }
        Err(e) if e.code == Code::Unimplemented => Ok(()),
        Err(e) => Err(Error::driver("initialize_machine", e)),
    }
}

/// A failed creation: CrashLoopBackOff with the error, an Event, and a backoff retry.
async fn creation_failed(
    ctx: &Ctx,
    m: &Machine,
    op: &'static str,
    err: DriverError,
) -> Result<Action, Error> {
    let description = format!("{op} failed: {}", err.full_message());
    tracing::warn!(error = %description, "VM creation failed");
    let op = Operation::failed(
        MachineOperationType::Create,
        description,
        Some(err.code.as_str().to_string()),
    );
    let notice = Notice::warning("CreationFailed", "Create");
    announce(ctx, m, Some(&MachinePhase::CrashLoopBackOff), op, notice).await?;
    Ok(Action::requeue(ctx.backoff(m, Some(&err))))
}

/// The patch that records a Machine's VM, as the Go machine controller writes it: the
/// providerID, the `node` label (not without a target cluster: there is no Node, upstream's
/// rule) and, unless set, the default deletion priority `machinepriority.machine.sapcloud.io:
/// "3"`. Pure.
pub fn record_vm_patch(
    m: &Machine,
    provider_id: &str,
    node_name: &str,
    target_cluster: bool,
) -> serde_json::Value {
    let mut patch = json!({ "spec": { "providerID": provider_id } });
    if target_cluster {
        patch["metadata"]["labels"] = json!({ labels::NODE: node_name });
    }
    if !m.annotations().contains_key(annotations::MACHINE_PRIORITY) {
        patch["metadata"]["annotations"] = json!({
            annotations::MACHINE_PRIORITY: mcm_api::constants::DEFAULT_MACHINE_PRIORITY,
        });
    }
    patch
}

/// The VM is recorded (providerID, `node` label): Pending, the creation timeout runs.
async fn mark_pending(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let vm = m.spec.provider_id.as_deref().unwrap_or_default();
    let node = m.node_name().unwrap_or_default();
    record(
        ctx,
        m,
        Some(&MachinePhase::Pending),
        &Operation::processing(
            MachineOperationType::Create,
            format!("VM {vm} exists; waiting for node {node} to join"),
        ),
    )
    .await?;
    Ok(Action::requeue(RECHECK))
}

/// The VM exists and there is no target cluster to join: `Available` (upstream's phase for
/// this mode), announced once.
pub async fn mark_available(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let op = Operation::successful(
        MachineOperationType::Create,
        "Created machine on cloud provider".to_string(),
    );
    record(ctx, m, Some(&MachinePhase::Available), &op).await?;
    let note = format!(
        "VM {} created; there is no target cluster (--target-kubeconfig=none), so the machine \
         is Available without a Node",
        m.spec.provider_id.as_deref().unwrap_or_default()
    );
    ctx.events
        .normal(&m.object_ref(&()), "Available", "Create", note)
        .await;
    Ok(Action::await_change())
}

/// The Node is Ready and healthy: Running (and the bootstrap token is no longer needed).
pub async fn mark_running(ctx: &Ctx, m: &Machine, node: Option<&Node>) -> Result<Action, Error> {
    // Unknown, or a preserved Failed machine whose node recovered.
    let from_unknown = matches!(
        m.phase(),
        Some(MachinePhase::Unknown | MachinePhase::Failed)
    );
    let joined_after = since(m.metadata.creation_timestamp.as_ref());
    let (kind, description) = if from_unknown {
        (
            MachineOperationType::HealthCheck,
            format!("Machine {} is healthy again", name(m)),
        )
    } else {
        (
            MachineOperationType::Create,
            format!(
                "Machine {} successfully joined the cluster in {}",
                name(m),
                mcm_api::duration::format_go_duration(Duration::from_secs(joined_after.as_secs()))
            ),
        )
    };
    // The token goes before Running is recorded, so a crash in between cannot skip it.
    delete_bootstrap_token(ctx, m).await?;
    if !from_unknown {
        record_join_duration(ctx, m, joined_after).await?;
    }
    let op = Operation::successful(kind, description);
    // Running, the operation and the node's conditions and addresses in one status write.
    let mut patch = status::status_patch(m, Some(&MachinePhase::Running), &op, Timestamp::now());
    if let Some(node) = node {
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default();
        status::merge_into(
            &mut patch,
            status::node_status_patch(super::observe::node_conditions_of(node), &addresses),
        );
    }
    patch_status(ctx, m, patch).await?;
    let note = if from_unknown {
        op.description
    } else {
        // The first Running Event also tells of the VM's creation.
        format!(
            "{} as node {} (VM {})",
            op.description,
            m.node_name().unwrap_or_default(),
            m.spec.provider_id.as_deref().unwrap_or_default()
        )
    };
    ctx.events
        .normal(&m.object_ref(&()), "Running", "HealthCheck", note)
        .await;
    Ok(Action::requeue(ctx.settings.resync))
}

/// Records on the Machine how long it took to join (the annotation
/// `node.machine.sapcloud.io/machine-join-duration`, once) and in the join metric.
async fn record_join_duration(ctx: &Ctx, m: &Machine, took: Duration) -> Result<(), Error> {
    if m.annotations()
        .contains_key(annotations::MACHINE_JOIN_DURATION)
    {
        return Ok(());
    }
    let value = mcm_api::duration::format_go_duration(Duration::from_secs(took.as_secs()));
    let patch = json!({"metadata": {"annotations": {annotations::MACHINE_JOIN_DURATION: value}}});
    patch_machine(ctx, m, &patch, "record the join duration").await?;
    record_duration(ctx, m, Timed::Join, took);
    Ok(())
}

/// Healthy and Running: copy Node conditions when they changed and apply the node template.
/// No API call unless something changed: this runs on every relevant Node update.
pub async fn keep_running(ctx: &Ctx, m: &Machine, node: Option<&Node>) -> Result<Action, Error> {
    if let Some(node) = node {
        copy_node_status(ctx, m, node, false).await?;
        super::nodetemplate::sync(ctx, m, node).await?;
    }
    Ok(Action::requeue(ctx.settings.resync))
}

async fn copy_node_status(ctx: &Ctx, m: &Machine, node: &Node, always: bool) -> Result<(), Error> {
    let conditions = super::observe::node_conditions_of(node);
    let current = m.status.as_ref().and_then(|s| s.conditions.as_deref());
    if always || status::conditions_differ(current, conditions) {
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default();
        patch_status(ctx, m, status::node_status_patch(conditions, &addresses)).await?;
    }
    Ok(())
}

/// The Node is missing or unhealthy: Unknown.
pub async fn mark_unknown(
    ctx: &Ctx,
    m: &Machine,
    reason: &str,
    node: Option<&Node>,
) -> Result<Action, Error> {
    if let Some(node) = node {
        copy_node_status(ctx, m, node, true).await?;
    }
    let description = format!(
        "Machine {} is unhealthy - changing phase to Unknown: {reason}",
        name(m)
    );
    let op = Operation::processing(MachineOperationType::HealthCheck, description);
    let notice = Notice::warning("Unhealthy", "HealthCheck");
    announce(ctx, m, Some(&MachinePhase::Unknown), op, notice).await?;
    Ok(Action::requeue(RECHECK))
}

/// The machine would fail, but the replacement budget of its deployment is used up:
/// record why (once, with an Event) and check again later.
pub async fn throttle_replacement(
    ctx: &Ctx,
    m: &Machine,
    throttled: &str,
    reason: &str,
) -> Result<Action, Error> {
    let description = format!("replacement throttled: {throttled}; {reason}");
    if last_description(m) != Some(description.as_str()) {
        ctx.metrics.remediation_held();
        let op = Operation::processing(MachineOperationType::HealthCheck, description);
        let notice = Notice::warning("ReplacementThrottled", "HealthCheck");
        announce(ctx, m, None, op, notice).await?;
    }
    Ok(Action::requeue(RECHECK))
}

/// How soon a machine whose failure lost the race for its deployment's permit looks again.
const PERMIT_BUSY_RECHECK: Duration = Duration::from_secs(1);

/// The machine is beyond repair: Failed. The decision saw room in the replacement budget;
/// the deployment's permit (taken without waiting) serialises concurrent failures of its
/// machines, and the budget is counted again under it.
pub async fn mark_failed(ctx: &Ctx, m: &Machine, reason: &str) -> Result<Action, Error> {
    let _permit = match ctx.replacement_permit(m) {
        Ok(permit) => permit,
        Err(busy) => {
            tracing::debug!(%busy, "replacement permit busy");
            return Ok(Action::requeue(PERMIT_BUSY_RECHECK));
        }
    };
    if let Some(throttled) = ctx.replacement_throttle(m) {
        return throttle_replacement(ctx, m, &throttled, reason).await;
    }
    let kind = match m.phase() {
        Some(MachinePhase::Unknown) | Some(MachinePhase::Running) => {
            MachineOperationType::HealthCheck
        }
        _ => MachineOperationType::Create,
    };
    let description = format!("Machine {} failed: {reason}", name(m));
    let op = Operation::failed(kind, description, None);
    let notice = Notice::warning("Failed", "HealthCheck");
    announce(ctx, m, Some(&MachinePhase::Failed), op, notice).await?;
    ctx.metrics.failed();
    // A VM that never joined within the creation timeout.
    if m.node_name().is_some()
        && matches!(
            m.phase(),
            Some(MachinePhase::Pending | MachinePhase::Available)
        )
        && let Some(labels) = placement_labels(ctx, m)
    {
        ctx.metrics.failed_join(&labels);
    }
    Ok(Action::await_change())
}

/// Records that a step is held back (frozen, protected) without changing the phase.
pub async fn hold(ctx: &Ctx, m: &Machine, why: &str) -> Result<Action, Error> {
    if last_description(m) != Some(why) {
        let kind = if m.metadata.deletion_timestamp.is_some() {
            MachineOperationType::Delete
        } else {
            MachineOperationType::HealthCheck
        };
        record(ctx, m, None, &Operation::processing(kind, why)).await?;
    }
    Ok(Action::requeue(RECHECK))
}

/// Deletion requested: Terminating. The description says what comes next, from what was
/// observed (a node to drain, a VM to delete, or nothing at all).
pub async fn mark_terminating(
    ctx: &Ctx,
    m: &Machine,
    node: Option<&Node>,
    vm_requested: bool,
) -> Result<Action, Error> {
    let next = match (node, vm_requested) {
        (Some(n), _) => format!("draining node {} next", n.name_any()),
        (None, true) => "no node; deleting the VM next".to_string(),
        (None, false) => "no VM was ever requested; nothing to delete".to_string(),
    };
    let description = format!("Deleting machine {}: {next}", name(m));
    let op = Operation::processing(MachineOperationType::Delete, description);
    let notice = Notice::normal("Terminating", "Delete");
    announce(ctx, m, Some(&MachinePhase::Terminating), op, notice).await?;
    Ok(Action::await_change())
}

/// Pause before the next deletion step where no watch event of the Machine will come (after
/// deleting VolumeAttachments or the Node).
const DELETION_STEP_REQUEUE: Duration = Duration::from_millis(200);
/// Longest pause between drain passes while pods terminate or volumes detach.
const DRAIN_WAIT_RECHECK: Duration = Duration::from_secs(5);

/// Writes a progress annotation (`key` = now) on the Machine.
async fn set_progress(ctx: &Ctx, m: &Machine, key: &str) -> Result<(), Error> {
    let patch = json!({ "metadata": { "annotations": { key: Timestamp::now().to_string() } } });
    patch_machine(ctx, m, &patch, "record the machine's progress").await
}

/// Writes the progress annotations `keys` (each = now) on the Machine in one patch; none, no
/// request.
async fn set_progress_keys(ctx: &Ctx, m: &Machine, keys: &[&str]) -> Result<(), Error> {
    if keys.is_empty() {
        return Ok(());
    }
    let now = Timestamp::now().to_string();
    let annotations: serde_json::Map<String, serde_json::Value> =
        keys.iter().map(|k| (k.to_string(), json!(now))).collect();
    let patch = json!({ "metadata": { "annotations": annotations } });
    patch_machine(ctx, m, &patch, "record the machine's progress").await
}

/// Removes a progress annotation from the Machine.
async fn clear_progress(ctx: &Ctx, m: &Machine, key: &str) -> Result<(), Error> {
    let patch = json!({ "metadata": { "annotations": { key: null } } });
    patch_machine(ctx, m, &patch, "clear the machine's progress record").await
}

pub(crate) async fn patch_machine(
    ctx: &Ctx,
    m: &Machine,
    patch: &serde_json::Value,
    action: &'static str,
) -> Result<(), Error> {
    patch_machine_for(ctx, m, patch, action).await.map(drop)
}

/// [`patch_machine`], returning the Machine as written.
async fn patch_machine_for(
    ctx: &Ctx,
    m: &Machine,
    patch: &serde_json::Value,
    action: &'static str,
) -> Result<Machine, Error> {
    machine_api(ctx)
        .patch(&name(m), &PatchParams::default(), &Patch::Merge(patch))
        .await
        .inspect(|written| ctx.note_own_write(written))
        .map_err(|e| Error::kube(action, e))
}

/// Publishes an Event on the Node too: an operator reading `kubectl describe node` sees why
/// the node goes away.
async fn node_event(ctx: &Ctx, node: &str, type_: EventType, reason: &str, note: String) {
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        // Node events are looked up by the node's name as uid (as the kubelet does).
        uid: Some(node.to_string()),
        ..Default::default()
    };
    ctx.node_events
        .publish(&reference, type_, reason, "Delete", note)
        .await;
}

/// Whether the driver reports the machine's VM gone (`NotFound`). Any other answer, or a
/// class that cannot be read, counts as "may exist".
pub async fn vm_is_gone(ctx: &Ctx, m: &Machine) -> bool {
    let Ok((class, secret)) = class_and_secret(ctx, m).await else {
        return false;
    };
    let status = vm_status(ctx, m, &class, &secret, &RequestId::generate()).await;
    matches!(status, Err(e) if e.code == Code::NotFound)
}

/// Asks the driver about the VM of an unhealthy machine (the fast path): gone, stopped (its
/// VM resource reported `Stopped` or `Failed`), present, or `NotAsked` when the driver
/// could not tell (an error other than `NotFound`, or the class is unusable).
pub async fn vm_report(ctx: &Ctx, m: &Machine) -> VmReport {
    let Ok((class, secret)) = class_and_secret(ctx, m).await else {
        return VmReport::NotAsked;
    };
    match vm_status(ctx, m, &class, &secret, &RequestId::generate()).await {
        Err(e) if e.code == Code::NotFound => VmReport::Gone,
        Err(e) => {
            tracing::debug!(error = %e, "the driver could not tell the VM's state");
            VmReport::NotAsked
        }
        Ok(status) => report_of(&status),
    }
}

/// The fast path's reading of a status response. Pure.
pub fn report_of(status: &GetMachineStatusResponse) -> VmReport {
    use mcm_driver::{ResourceKind, ResourceState};
    status
        .resources
        .iter()
        .find(|r| r.kind == ResourceKind::Vm)
        .map_or(VmReport::Present, |vm| match vm.state {
            ResourceState::Stopped | ResourceState::Failed => VmReport::Stopped {
                message: vm
                    .message
                    .clone()
                    .unwrap_or_else(|| format!("{:?}", vm.state).to_lowercase()),
            },
            _ => VmReport::Present,
        })
}

/// A health annotation of the Machine or its deployment does not parse: a Warning Event
/// (the flags apply in its place; the admission webhook refuses such values).
pub async fn warn_policy_problem(ctx: &Ctx, m: &Machine, problem: &str) {
    let reference = m.object_ref(&());
    ctx.events
        .publish(
            &reference,
            EventType::Warning,
            "InvalidHealthPolicy",
            "HealthCheck",
            format!("{problem}; the flags' health rules apply instead"),
        )
        .await;
}

/// Deletion waits for the lifecycle hooks of `stage`: said once in the status and an Event,
/// then looked at again when the Machine changes (the owner removes its annotation) or the
/// hook timeout passes.
pub async fn await_hooks(
    ctx: &Ctx,
    m: &Machine,
    stage: HookStage,
    hooks: &[String],
    remaining: Option<Duration>,
) -> Result<Action, Error> {
    let description = format!(
        "Deletion of machine {} waits for {stage} hook(s) {} to be removed by their owners",
        name(m),
        hooks.join(", ")
    );
    if last_description(m) != Some(description.as_str()) {
        let notice = Notice::normal("WaitingForHook", "Delete");
        announce_deletion_step(ctx, m, description, notice).await?;
        ctx.metrics.hook_wait();
    }
    Ok(remaining.map_or_else(Action::await_change, |r| {
        Action::requeue(r + Duration::from_secs(1))
    }))
}

/// The hook timeout passed: the stage's hooks are given up on (recorded durably, so the
/// deletion goes on past them after a restart too), with a Warning.
pub async fn expire_hooks(
    ctx: &Ctx,
    m: &Machine,
    stage: HookStage,
    hooks: &[String],
    cfg: &MachineConfig,
) -> Result<Action, Error> {
    set_progress(ctx, m, stage.expired_annotation()).await?;
    let description = format!(
        "Deletion of machine {} goes on past its {stage} hook(s) {}: they were not removed within --machine-lifecycle-hook-timeout ({})",
        name(m),
        hooks.join(", "),
        mcm_api::duration::format_go_duration(cfg.hook_timeout.unwrap_or_default())
    );
    let reference = m.object_ref(&());
    ctx.events
        .publish(
            &reference,
            EventType::Warning,
            "HookTimedOut",
            "Delete",
            description,
        )
        .await;
    Ok(Action::await_change())
}

/// What a drain pass is told by the decision.
#[derive(Debug, Clone)]
pub struct PassPlan<'a> {
    /// The first pass: the drain starts now (recorded with this pass's outcome).
    pub first: bool,
    /// Delete pods instead of evicting them.
    pub force: bool,
    /// Why, if forced.
    pub force_reason: Option<&'a str>,
    /// The node is unreachable.
    pub unreachable: bool,
    /// Time since the drain started.
    pub elapsed: Duration,
    /// Time since no pod was left, if so.
    pub pods_gone_for: Option<Duration>,
}

/// One pass of the drain of `node` (deletion, preservation and in-place updates drain through
/// it).
pub(crate) async fn drain_node_pass(
    ctx: &Ctx,
    node: &str,
    options: &mcm_drain::Options,
    input: &mcm_drain::PassInput,
) -> Result<mcm_drain::PassReport, Error> {
    mcm_drain::drain_pass(ctx.target.clone(), node, options, input, &ctx.drain_stores)
        .await
        .map_err(Error::Drain)
}

pub(crate) fn drain_options(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    force: bool,
) -> mcm_drain::Options {
    let mut options = mcm_drain::Options::new(ctx.driver.clone());
    options.force = force;
    options.timeout = cfg.drain_timeout;
    options.max_evict_retries = u32::try_from(
        m.spec
            .configuration
            .max_evict_retries
            .unwrap_or(ctx.settings.defaults.max_evict_retries)
            .max(0),
    )
    .unwrap_or(0);
    options.eviction_retry_interval = ctx.settings.eviction_retry_interval;
    options.pv_detach_timeout = ctx.settings.pv_detach_timeout;
    options.pv_reattach_timeout = ctx.settings.pv_reattach_timeout;
    options.parallelism = ctx.settings.drain_parallelism;
    options
}

/// One pass of the drain: this round's evictions (or deletions), then record where it
/// stands and come back. Never waits for pods or volumes inside the reconcile.
pub async fn drain_pass(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
    node_name: &str,
    plan: PassPlan<'_>,
) -> Result<Action, Error> {
    let pass_started = std::time::Instant::now();
    let options = drain_options(ctx, m, cfg, plan.force);
    if let Some(why) = plan.force_reason {
        tracing::info!(node = node_name, why, "force-draining");
    }
    let input = mcm_drain::PassInput {
        elapsed: plan.elapsed,
        pods_gone_for: plan.pods_gone_for,
        unreachable: plan.unreachable,
    };
    let report = drain_node_pass(ctx, node_name, &options, &input).await?;
    let mut summary = report.summary();
    if let Some(why) = plan.force_reason {
        summary.push_str(&format!(" (forced: {why})"));
    }
    let description = format!("Drain of node {node_name}: {summary}");
    let state = report.state();
    let blocked = !report.blocked.is_empty() || !report.misconfigured.is_empty();
    // An unknown drain rule value is in the summary; a Warning per pod and value goes to the
    // node when the description changes (not at every pass).
    if last_description(m) != Some(description.as_str()) {
        for bad in &report.invalid_rules {
            node_event(
                ctx,
                node_name,
                EventType::Warning,
                "DrainRuleInvalid",
                bad.to_string(),
            )
            .await;
        }
    }
    // The progress this pass makes, written in one patch: the start of the drain (first
    // pass), all pods gone (the volume wait counts from there), drained.
    let mut progress_keys = Vec::new();
    if plan.first {
        progress_keys.push(progress::DRAIN_STARTED);
    }
    match state {
        mcm_drain::PassState::Done | mcm_drain::PassState::NodeGone => {
            progress_keys.push(progress::DRAINED);
        }
        mcm_drain::PassState::Volumes if plan.pods_gone_for.is_none() => {
            progress_keys.push(progress::PODS_DRAINED);
        }
        _ => {}
    }
    set_progress_keys(ctx, m, &progress_keys).await?;
    if progress_keys.contains(&progress::DRAINED)
        && let Some(labels) = deployment_labels(m)
    {
        ctx.metrics
            .drained(&labels, plan.elapsed + pass_started.elapsed());
    }
    if plan.first {
        // One Event on the node says why it is cordoned; the Machine's lastOperation has
        // every step.
        let note = match state {
            mcm_drain::PassState::Done => format!(
                "cordoned and drained for the deletion of machine {}: {summary}",
                name(m)
            ),
            _ => format!("cordoned; draining for the deletion of machine {}", name(m)),
        };
        node_event(ctx, node_name, EventType::Normal, "DrainStarted", note).await;
    }
    match state {
        mcm_drain::PassState::Done | mcm_drain::PassState::NodeGone => {
            // A drain done in its first pass with no pod to act on had nothing to tell
            // beyond the node's DrainStarted above; otherwise it ends with Drained on both.
            let acted = !report.evicted.is_empty()
                || !report.deleted.is_empty()
                || !report.released.is_empty();
            if plan.first && !acted {
                record_deletion_step(ctx, m, description).await?;
            } else {
                announce_deletion_step(
                    ctx,
                    m,
                    description.clone(),
                    Notice::normal("Drained", "Drain"),
                )
                .await?;
                if state == mcm_drain::PassState::Done {
                    node_event(ctx, node_name, EventType::Normal, "Drained", summary).await;
                }
            }
            Ok(Action::requeue(RECHECK))
        }
        mcm_drain::PassState::Volumes => {
            record_deletion_step(ctx, m, description).await?;
            Ok(Action::requeue(
                ctx.settings.eviction_retry_interval.min(DRAIN_WAIT_RECHECK),
            ))
        }
        mcm_drain::PassState::Pods => {
            if blocked {
                ctx.metrics.drain_blocked();
            }
            let changed = last_description(m) != Some(description.as_str());
            if blocked && changed {
                let notice = Notice::warning("DrainBlockedByPDB", "Drain");
                announce_deletion_step(ctx, m, description, notice).await?;
                node_event(
                    ctx,
                    node_name,
                    EventType::Warning,
                    "DrainBlockedByPDB",
                    summary,
                )
                .await;
            } else {
                record_deletion_step(ctx, m, description).await?;
            }
            let recheck = if blocked {
                ctx.settings.eviction_retry_interval
            } else {
                ctx.settings.eviction_retry_interval.min(DRAIN_WAIT_RECHECK)
            };
            Ok(Action::requeue(recheck))
        }
    }
}

/// Drained: delete the VolumeAttachments still pointing at the node (those already being
/// deleted are left to their attacher).
pub async fn delete_volume_attachments(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let Some(node_name) = m.node_name() else {
        return Ok(Action::requeue(DELETION_STEP_REQUEUE));
    };
    let api: Api<VolumeAttachment> = Api::all(ctx.target.clone());
    for va in attachments_of(ctx, node_name) {
        let _ = kube_api::delete(&api, &va, &DeleteParams::default())
            .await
            .map_err(|e| Error::kube("delete a VolumeAttachment of the node", e))?;
    }
    Ok(Action::requeue(DELETION_STEP_REQUEUE))
}

/// The VolumeAttachments to `node_name` that are not being deleted yet.
pub fn attachments_of(ctx: &Ctx, node_name: &str) -> Vec<String> {
    ctx.drain_stores
        .volume_attachments
        .state()
        .iter()
        .filter(|va| va.spec.node_name == node_name && va.metadata.deletion_timestamp.is_none())
        .map(|va| va.name_any())
        .collect()
}

/// Deletes the VM (NotFound is success) and records that it did. A class that cannot be
/// used, or a driver that calls the request invalid, blocks the deletion (the finalizer
/// stays) until the class is fixed.
pub async fn delete_vm(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    let (class, secret) = match class_and_secret(ctx, m).await {
        Ok(x) => x,
        Err(Error::Class(problem)) => return deletion_blocked(ctx, m, &problem).await,
        Err(e) => return Err(e),
    };
    let request_id = RequestId::generate();
    let class_name = class.name_any();
    let deleted = ctx
        .driver
        .delete_machine(DeleteMachineRequest {
            machine: m.clone(),
            machine_class: class,
            secret,
            request_id: request_id.clone(),
        })
        .await;
    match deleted {
        Ok(response) => {
            let state = response.last_known_state.as_deref();
            if let Some(p) = status::driver_state_patch(m, state, None) {
                patch_status(ctx, m, p).await?;
            }
        }
        Err(e) if e.is_not_found() => {}
        Err(e) if e.code == Code::InvalidArgument => {
            let problem = ClassProblem::Invalid {
                class: class_name,
                message: e.full_message(),
            };
            return deletion_blocked(ctx, m, &problem).await;
        }
        Err(source) => return Err(Error::driver("delete_machine", source)),
    }
    tracing::info!(%request_id, "VM deleted");
    record_duration(
        ctx,
        m,
        Timed::Delete,
        since(m.metadata.deletion_timestamp.as_ref()),
    );
    ctx.reset_backoff(m);
    set_progress(ctx, m, progress::VM_DELETED).await?;
    let what = vm_description(m);
    let description = format!("Deleted {what}");
    // The Machine's Event comes when its deletion is complete ("Deleted"); the node's
    // says now why it goes away.
    record_deletion_step(ctx, m, description.clone()).await?;
    if let Some(node) = m.node_name() {
        node_event(ctx, node, EventType::Normal, "VMDeleted", description).await;
    }
    Ok(Action::requeue(RECHECK))
}

/// The VM as a Machine knows it: its providerID, or when its creation was requested.
fn vm_description(m: &Machine) -> String {
    match m.spec.provider_id.as_deref().filter(|p| !p.is_empty()) {
        Some(id) => format!("VM {id}"),
        None => match super::observe::progress(m, progress::VM_REQUESTED) {
            Some(t) => format!("the VM requested at {t}"),
            None => "the VM".to_string(),
        },
    }
}

/// A VM may exist but cannot be deleted with the class as it is: keep the finalizer, say
/// exactly that (lastOperation and one Event), and retry (a class change wakes us too).
pub async fn deletion_blocked(
    ctx: &Ctx,
    m: &Machine,
    problem: &ClassProblem,
) -> Result<Action, Error> {
    let description = format!(
        "{} may still exist and cannot be deleted: {problem}; the machine keeps its finalizer \
         until the class is fixed",
        vm_description(m)
    );
    let unchanged = last_description(m) == Some(description.as_str());
    record(
        ctx,
        m,
        None,
        &Operation::failed(MachineOperationType::Delete, description.clone(), None),
    )
    .await?;
    if !unchanged {
        ctx.events
            .warning(&m.object_ref(&()), "DeletionBlocked", "Delete", description)
            .await;
    }
    Ok(Action::requeue(ctx.backoff(m, None)))
}

/// The VM is gone: delete the Node, after releasing its finalizer (the Go MCM's order: the
/// Node object goes at once).
pub async fn delete_node(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    if let Some(node_name) = m.node_name() {
        let known = ctx.node(node_name);
        if known.as_deref().is_none_or(super::nodefinalizer::held) {
            super::nodefinalizer::release(ctx, node_name, known.as_deref()).await?;
        }
        let nodes: Api<Node> = Api::all(ctx.target.clone());
        let _ = kube_api::delete(&nodes, node_name, &DeleteParams::default())
            .await
            .map_err(|e| Error::kube("delete the machine's node", e))?;
    }
    Ok(Action::requeue(DELETION_STEP_REQUEUE))
}

/// Everything is gone: delete the bootstrap token and remove the finalizer.
pub async fn finish_deletion(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
    if ctx.settings.target_cluster {
        delete_bootstrap_token(ctx, m).await?;
    }
    let note = if super::observe::vm_requested(m) {
        format!("Machine {}: VM and node deleted", name(m))
    } else {
        format!("Machine {}: deleted (no VM was ever requested)", name(m))
    };
    ctx.events
        .normal(&m.object_ref(&()), "Deleted", "Delete", note)
        .await;
    remove_finalizer(ctx, m).await?;
    ctx.metrics.deleted();
    ctx.reset_backoff(m);
    // Look for leftovers (e.g. of an earlier failed creation) right away.
    ctx.orphan_trigger.notify_one();
    Ok(Action::await_change())
}

/// Sets the node's `Terminating` condition (unless it is set), before its drain starts.
pub async fn set_node_terminating(ctx: &Ctx, node: &Node, m: &Machine) -> Result<(), Error> {
    let already = super::observe::node_conditions_of(node)
        .iter()
        .any(|c| c.type_ == node_conditions::TERMINATING && c.status == "True");
    if already {
        return Ok(());
    }
    let reason = if m.phase() == Some(&MachinePhase::Failed) {
        node_conditions::REASON_UNHEALTHY
    } else {
        node_conditions::REASON_SCALE_DOWN
    };
    let now = Timestamp::now().to_string();
    let condition = json!({
        "type": node_conditions::TERMINATING,
        "status": "True",
        "reason": reason,
        "message": format!("machine {} is being deleted", name(m)),
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    });
    patch_node_condition(
        ctx,
        &node.name_any(),
        condition,
        "set the node's Terminating condition",
    )
    .await
}

/// Adds or replaces one condition of a Node (a strategic merge patch keyed by the condition
/// type: the kubelet's and the node lifecycle controller's conditions are left as they are,
/// never rewritten from a possibly stale copy). A node gone meanwhile needs no condition.
pub(crate) async fn patch_node_condition(
    ctx: &Ctx,
    node: &str,
    condition: serde_json::Value,
    what: &'static str,
) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.target.clone());
    let patch = json!({ "status": { "conditions": [condition] } });
    match nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(what, e)),
    }
}

/// Whether a Machine of this name exists, read from the API server (used where the store
/// could be stale, e.g. before deleting a VM as an orphan).
pub async fn machine_exists(ctx: &Ctx, name: &str) -> Result<bool, Error> {
    Ok(machine_api(ctx)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube("read the machine", e))?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_is_recorded_as_the_go_machine_controller_records_it() {
        let m: Machine = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m" }, "spec": {}
        }))
        .unwrap();
        assert_eq!(
            record_vm_patch(&m, "aws:///eu/i-1", "ip-10-0-0-1", true),
            json!({
                "metadata": {
                    "labels": { "node": "ip-10-0-0-1" },
                    "annotations": { "machinepriority.machine.sapcloud.io": "3" },
                },
                "spec": { "providerID": "aws:///eu/i-1" },
            })
        );
        // A priority set already (the autoscaler's 1) is kept; no node label without a
        // target cluster.
        let mut marked = m.clone();
        marked.metadata.annotations =
            Some([(annotations::MACHINE_PRIORITY.to_string(), "1".to_string())].into());
        assert_eq!(
            record_vm_patch(&marked, "aws:///eu/i-1", "ip-10-0-0-1", false),
            json!({ "spec": { "providerID": "aws:///eu/i-1" } })
        );
    }
}
