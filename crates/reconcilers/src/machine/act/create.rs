//! Creation: the class and its secret, the bootstrap token, the idempotent `create_machine`
//! call with its durable `vm-requested` record, the providerID recorded before
//! `initialize_machine`, and the first phase of the new machine.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use mcm_api::constants::annotations::progress;
use mcm_api::constants::{annotations, labels};
use mcm_api::{Machine, MachineClass, MachineOperationType, MachinePhase};
use mcm_driver::{
    Code, CreateMachineRequest, DriverError, GetMachineStatusResponse, IdempotencyKey,
    InitializeMachineRequest, RequestId, SecretData, USER_DATA_KEY,
};
use serde_json::json;

use crate::kube_api::{self, ApiErrorExt};
use crate::machine::decide::{ClassProblem, MachineConfig};
use crate::machine::metrics::Timed;
use crate::machine::status::{self, Operation};
use crate::machine::{Ctx, Error, FINALIZER, LEGACY_FINALIZERS, token};

use super::announce::announce;
use super::records::{
    RECHECK, class_and_secret, clear_progress, name, patch_machine, patch_machine_for,
    patch_status_for, record, record_duration, since, vm_status,
};
use super::running::{mark_available, mark_running};
use crate::machine::announcement::{Announcement, Note};
use crate::machine::observe;
use crate::machine::outcome::{self, Lookup, Settled, takes_back_request};

/// Records why the class cannot be used; retries with backoff (class changes also wake us).
pub(crate) async fn report_class_problem(
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
    let note = Note::warning("MachineClassProblem", "Validate", description.clone());
    let op = Operation::failed(kind, description, None);
    announce(ctx, m, Announcement::record(None, op, vec![note])).await?;
    Ok(Action::requeue(ctx.backoff(m, None)))
}

/// Ensures the machine's bootstrap token exists in the target cluster and returns it.
pub(super) async fn ensure_bootstrap_token(
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
        token::expiry(ctx.clock.now(), cfg.creation_timeout),
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
pub(super) async fn warn_no_token_placeholder(ctx: &Ctx, m: &Machine, class: &MachineClass) {
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
    let note = Note::warning(NO_TOKEN_PLACEHOLDER, "Create", note);
    // Events only: it cannot fail.
    let _ = announce(ctx, m, Announcement::events(vec![note])).await;
}

/// Reason of the Event of an adopted VM (one found by `get_machine_status` before any
/// `create_machine`, e.g. after a crash between the request and recording its providerID).
pub(super) const ADOPTED: &str = "Adopted";

/// Reason of the Event of `warn_no_token_placeholder`.
pub(super) const NO_TOKEN_PLACEHOLDER: &str = "NoBootstrapTokenPlaceholder";

/// Finds the VM (adoption after a crash) or creates it, initializes it when the driver asks
/// for it, and records providerID and the `node` label. Pending is the next step.
pub(crate) async fn create_vm(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
) -> Result<Action, Error> {
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

pub(super) async fn try_create_vm(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
) -> Result<Action, Error> {
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
                let first_attempt =
                    crate::machine::observe::progress(m, progress::VM_REQUESTED).is_none();
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
    let requested_at = recorded_request.unwrap_or_else(|| ctx.clock.now().to_string());
    let key = creation_key(m, &requested_at);
    let request_id = RequestId::generate();
    tracing::info!(%request_id, "looking for the machine's VM");
    let found = vm_status(ctx, m, &class, &secret, &request_id).await;
    let (vm, adopted, initialized) = match (Lookup::of(&found), found) {
        (Lookup::Found, Ok(s)) => {
            record_vm_request(ctx, m, None).await?;
            (FoundVm::from(s), true, true)
        }
        (Lookup::Absent, _) => {
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
                    if takes_back_request(first_request, &source) {
                        clear_progress(ctx, m, progress::VM_REQUESTED).await?;
                    }
                    return Err(Error::driver("create_machine", source));
                }
            };
            let created_after = since(ctx, m.metadata.creation_timestamp.as_ref());
            record_duration(ctx, m, Timed::Create, created_after);
            (FoundVm::from(created), false, false)
        }
        (Lookup::Uninitialized, _) => {
            // A VM found by the driver's own lookup (no providerID yet) that still needs its
            // initialization, which also tells its providerID.
            record_vm_request(ctx, m, None).await?;
            initialize(ctx, m, &class, &secret, &request_id).await?;
            let s = vm_status(ctx, m, &class, &secret, &request_id)
                .await
                .map_err(|source| Error::driver("get_machine_status", source))?;
            (FoundVm::from(s), true, true)
        }
        (_, Err(e)) => return Err(Error::driver("get_machine_status", e)),
        (_, Ok(_)) => {
            return Err(Error::Invariant(
                "a lookup answered Ok read as failed".into(),
            ));
        }
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
pub(super) fn creation_key(m: &Machine, requested_at: &str) -> IdempotencyKey {
    let uid = m.uid().unwrap_or_else(|| name(m));
    IdempotencyKey::for_creation(&uid, requested_at)
}

/// What the driver said of a created or found VM.
pub(super) struct FoundVm {
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
pub(super) async fn record_vm(ctx: &Ctx, m: &Machine, vm: &FoundVm) -> Result<Machine, Error> {
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
pub(super) async fn settle_created(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
) -> Result<Action, Error> {
    // The Node of the name the driver just reported, if it joined already.
    let node = crate::machine::observe::node_name(m)
        .and_then(|n| ctx.node(n))
        .filter(|n| !crate::machine::observe::node_not_managed(n));
    let health = node.as_deref().map(|n| observe::health(n, cfg));
    match outcome::settled(ctx.settings.target_cluster, health.as_ref()) {
        Settled::Available => mark_available(ctx, m).await,
        Settled::Running => mark_running(ctx, m, node.as_deref()).await,
        Settled::Pending => mark_pending(ctx, m).await,
    }
}

/// [`crate::machine::decide::Step::FinishCreation`]: the VM is recorded but its creation did not
/// finish. The driver is asked for it; one that needs initialization is initialized; then the
/// machine moves on as creation does. A failure is a creation failure (CrashLoopBackOff, an
/// Event, a backoff retry; Failed after the creation timeout).
pub(crate) async fn finish_creation(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
) -> Result<Action, Error> {
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

pub(super) async fn try_finish_creation(
    ctx: &Ctx,
    m: &Machine,
    cfg: &MachineConfig,
) -> Result<Action, Error> {
    let (class, secret) = class_and_secret(ctx, m).await?;
    let request_id = RequestId::generate();
    let found = vm_status(ctx, m, &class, &secret, &request_id).await;
    match (Lookup::of(&found), found) {
        // Found, or a driver that cannot look (the VM is recorded: it was made).
        (Lookup::Found | Lookup::Absent, Ok(_)) => {}
        (Lookup::Absent, Err(e)) if e.code == Code::Unimplemented => {}
        (Lookup::Uninitialized, _) => {
            tracing::info!(%request_id, "initializing the recorded VM");
            initialize(ctx, m, &class, &secret, &request_id).await?;
        }
        (_, Err(e)) => return Err(Error::driver("get_machine_status", e)),
        (Lookup::Failed, Ok(_)) => {
            return Err(Error::Invariant(
                "a lookup answered Ok read as failed".into(),
            ));
        }
    }
    settle_created(ctx, m, cfg).await
}

/// Writes the `vm-requested` progress (`requested_at`, when this is the attempt's first
/// request) and our finalizer (when it is missing) in one patch, guarded by the resource
/// version; nothing when both are there. The guard matters for the record: a stale copy of
/// the Machine must not record a second attempt (it would get another idempotency key).
pub(super) async fn record_vm_request(
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
pub(super) async fn finalizer_after_failure(ctx: &Ctx, m: &Machine) {
    if let Err(e) = record_vm_request(ctx, m, None).await {
        tracing::debug!(error = %e, "finalizer not added this round; the next attempt adds it");
    }
}

pub(super) async fn initialize(
    ctx: &Ctx,
    m: &Machine,
    class: &MachineClass,
    secret: &SecretData,
    request_id: &RequestId,
) -> Result<(), Error> {
    let started = ctx.clock.instant();
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
            record_duration(
                ctx,
                m,
                Timed::Initialize,
                ctx.clock.instant().saturating_duration_since(started),
            );
            Ok(())
        }
        Err(e) if e.code == Code::Unimplemented => Ok(()),
        Err(e) => Err(Error::driver("initialize_machine", e)),
    }
}

/// A failed creation: CrashLoopBackOff with the error, an Event, and a backoff retry.
pub(super) async fn creation_failed(
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
    let note = Note::warning("CreationFailed", "Create", op.description.clone());
    let failure = Announcement::every(Some(MachinePhase::CrashLoopBackOff), op, vec![note]);
    announce(ctx, m, failure).await?;
    Ok(Action::requeue(ctx.backoff(m, Some(&err))))
}

/// The patch that records a Machine's VM, as the Go machine controller writes it: the
/// providerID, the `node` label (not without a target cluster: there is no Node, upstream's
/// rule) and, unless set, the default deletion priority `machinepriority.machine.sapcloud.io:
/// "3"`. Pure.
pub(super) fn record_vm_patch(
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
pub(super) async fn mark_pending(ctx: &Ctx, m: &Machine) -> Result<Action, Error> {
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
