//! The machine controller: the lifecycle of each Machine, its VM and its Node.
//!
//! Each reconcile observes ([`observe`]), decides ([`decide::next_step`], pure) and acts
//! ([`act`], one idempotent action per step).

pub mod act;
pub mod decide;
pub mod nodetemplate;
pub mod observe;
pub mod status;
pub mod token;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use mcm_api::{Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet};
use mcm_driver::{Code, Driver, DriverError};
use mcm_permits::PermitGiver;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::events::EventPublisher;
use crate::metrics::ReconcileMetrics;
use decide::{ClassProblem, Step};

/// Errors of a machine reconcile. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("failed to {action}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A driver call failed.
    #[error("driver call {op} failed")]
    Driver {
        /// The driver operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: DriverError,
    },
    /// A drain pass failed.
    #[error("drain pass failed")]
    Drain(#[source] mcm_drain::DrainError),
    /// The class or its secrets cannot be used.
    #[error("{0}")]
    Class(ClassProblem),
    /// Something that should not happen did.
    #[error("internal error: {0}")]
    Invariant(String),
}

impl Error {
    pub(crate) fn kube(action: &'static str, source: kube::Error) -> Self {
        Error::Kube { action, source }
    }

    pub(crate) fn driver(op: &'static str, source: DriverError) -> Self {
        Error::Driver { op, source }
    }
}

/// Settings of the machine controller (the flags of Gardener's machine-controller).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--namespace`: where Machines, MachineClasses and their Secrets live.
    pub namespace: String,
    /// Timeouts and health rules that a Machine's spec may override.
    pub defaults: observe::Defaults,
    /// `--machine-pv-detach-timeout`
    pub pv_detach_timeout: Duration,
    /// `--machine-pv-reattach-timeout`
    pub pv_reattach_timeout: Duration,
    /// `--bootstrap-token-auth-extra-groups`
    pub bootstrap_token_auth_extra_groups: String,
    /// Retry period after `ResourceExhausted` from the driver.
    pub resource_exhausted_retry: Duration,
    /// First retry after a failure; doubles per consecutive failure.
    pub backoff_initial: Duration,
    /// Longest retry period after failures.
    pub backoff_max: Duration,
    /// Pause between evictions refused by a PodDisruptionBudget.
    pub eviction_retry_interval: Duration,
    /// Pods drained at the same time.
    pub drain_parallelism: usize,
    /// Re-check period of healthy machines.
    pub resync: Duration,
}

/// Metrics of the machine controller.
#[derive(Clone, Default)]
pub struct MachineMetrics {
    created: Counter,
    adopted: Counter,
    failed: Counter,
    deleted: Counter,
    /// `mcm_machine_controller_frozen`: 1 while the safety controller froze the controller.
    pub frozen: Gauge,
    /// `mcm_machine_items_total`: Machines in the namespace.
    pub items: Gauge,
    /// Reconcile metrics of every controller of the process (`controller="machine"` here).
    pub reconciles: ReconcileMetrics,
}

impl std::fmt::Debug for MachineMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineMetrics").finish_non_exhaustive()
    }
}

impl MachineMetrics {
    /// Creates and registers the metrics; reconciles are recorded in `reconciles` (registered
    /// once per process, see [`ReconcileMetrics::register`]).
    pub fn register(registry: &mut Registry, reconciles: ReconcileMetrics) -> Self {
        let m = MachineMetrics {
            reconciles,
            ..MachineMetrics::default()
        };
        registry.register(
            "mcm_machine_controller_frozen",
            "1 when the machine controller is frozen by the safety controller",
            m.frozen.clone(),
        );
        registry.register(
            "mcm_machine_items_total",
            "Number of Machines",
            m.items.clone(),
        );
        registry.register("mcm_machine_vm_creations", "VMs created", m.created.clone());
        registry.register(
            "mcm_machine_vm_adoptions",
            "Existing VMs adopted",
            m.adopted.clone(),
        );
        registry.register(
            "mcm_machine_failed",
            "Machines marked Failed",
            m.failed.clone(),
        );
        registry.register(
            "mcm_machine_deletions",
            "Machines deleted",
            m.deleted.clone(),
        );
        m
    }

    fn created(&self, adopted: bool) {
        if adopted {
            self.adopted.inc();
        } else {
            self.created.inc();
        }
    }

    fn failed(&self) {
        self.failed.inc();
    }

    fn deleted(&self) {
        self.deleted.inc();
    }
}

/// Whether the safety controller froze the machine controller.
#[derive(Debug, Clone, Default)]
pub struct Freeze(Arc<AtomicBool>);

impl Freeze {
    /// Whether frozen now.
    pub fn is_frozen(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Sets the state; returns the previous one.
    pub fn set(&self, frozen: bool) -> bool {
        self.0.swap(frozen, Ordering::SeqCst)
    }
}

/// Everything a machine reconcile needs.
pub struct Ctx {
    /// Client of the control cluster (Machines, classes, secrets).
    pub control: kube::Client,
    /// Client of the target cluster (Nodes, pods, bootstrap tokens).
    pub target: kube::Client,
    /// The provider driver.
    pub driver: Arc<dyn Driver>,
    /// Settings.
    pub settings: Settings,
    /// Machines of the namespace.
    pub machines: Store<Machine>,
    /// MachineClasses of the namespace.
    pub classes: Store<MachineClass>,
    /// Nodes of the target cluster.
    pub nodes: Store<Node>,
    /// MachineSets of the namespace (rollout protection, replacement budget).
    pub machine_sets: Store<MachineSet>,
    /// MachineDeployments of the namespace (rollout protection, replacement budget).
    pub machine_deployments: Store<MachineDeployment>,
    /// VolumeAttachments of the target cluster, shared with drain.
    pub drain_stores: mcm_drain::Stores,
    /// Events on Machines (control cluster).
    pub events: EventPublisher,
    /// Events on Nodes (target cluster).
    pub node_events: EventPublisher,
    /// Replacement budget per MachineDeployment (meltdown protection).
    pub permits: PermitGiver,
    /// Set by the safety controller.
    pub freeze: Freeze,
    /// Metrics.
    pub metrics: MachineMetrics,
    /// Wakes the orphan collector (after a deletion, leftovers of the VM are looked for).
    pub orphan_trigger: Arc<tokio::sync::Notify>,
    /// Set to `true` once every store above has synced: until then a missing Node or
    /// VolumeAttachment in a store is no evidence that it does not exist, so no reconcile
    /// decides before (a restarted controller would otherwise skip the drain of a node it
    /// has not listed yet).
    pub synced: tokio::sync::watch::Sender<bool>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Ctx {
    /// Builds a context.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        control: kube::Client,
        target: kube::Client,
        driver: Arc<dyn Driver>,
        settings: Settings,
        stores: Stores,
        drain_stores: mcm_drain::Stores,
        freeze: Freeze,
        metrics: MachineMetrics,
    ) -> Self {
        Ctx {
            events: EventPublisher::new(control.clone(), "machine-controller"),
            node_events: EventPublisher::new(target.clone(), "machine-controller"),
            control,
            target,
            driver,
            settings,
            machines: stores.machines,
            classes: stores.classes,
            nodes: stores.nodes,
            machine_sets: stores.machine_sets,
            machine_deployments: stores.machine_deployments,
            drain_stores,
            permits: PermitGiver::new(),
            freeze,
            metrics,
            orphan_trigger: Arc::new(tokio::sync::Notify::new()),
            synced: tokio::sync::watch::Sender::new(false),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// A class of the namespace from the store.
    pub fn class(&self, name: &str) -> Option<MachineClass> {
        self.classes
            .get(&ObjectRef::new(name).within(&self.settings.namespace))
            .map(|c| (*c).clone())
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The retry delay after a failure of `m`: exponential per consecutive failure, or the
    /// resource-exhausted period, or what the cloud asked for.
    pub(crate) fn backoff(&self, m: &Machine, err: Option<&DriverError>) -> Duration {
        if let Some(after) = err.and_then(|e| e.retry_after) {
            return after;
        }
        if err.is_some_and(|e| e.code == Code::ResourceExhausted) {
            return self.settings.resource_exhausted_retry;
        }
        let n = {
            let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let n = f.entry(m.uid().unwrap_or_default()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        backoff_delay(self.settings.backoff_initial, self.settings.backoff_max, n)
    }

    pub(crate) fn reset_backoff(&self, m: &Machine) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.remove(&m.uid().unwrap_or_default());
    }

    /// The MachineSet and MachineDeployment that own a Machine, from the stores.
    fn owners(&self, m: &Machine) -> (Option<Arc<MachineSet>>, Option<Arc<MachineDeployment>>) {
        let ns = &self.settings.namespace;
        let set = controller_owner(m.owner_references(), "MachineSet")
            .and_then(|n| self.machine_sets.get(&ObjectRef::new(n).within(ns)));
        let deployment = set.as_ref().and_then(|s| {
            controller_owner(s.owner_references(), "MachineDeployment")
                .and_then(|n| self.machine_deployments.get(&ObjectRef::new(n).within(ns)))
        });
        (set, deployment)
    }

    /// Why `m` must not be marked Failed now: it belongs to an old MachineSet of a
    /// MachineDeployment that is rolling out (failing it would leave pods unschedulable
    /// while the new machines are not ready yet).
    fn failure_protection(&self, m: &Machine) -> Option<String> {
        let (set, deployment) = self.owners(m);
        let (set, deployment) = (set?, deployment?);
        let owned: Vec<Arc<MachineSet>> = self
            .machine_sets
            .state()
            .into_iter()
            .filter(|s| {
                controller_owner(s.owner_references(), "MachineDeployment")
                    == Some(deployment.name_any().as_str())
            })
            .collect();
        rollout_protection(&set, &deployment, &owned)
    }

    /// Whether the replacement budget of the machine's deployment is used up: at most
    /// maxSurge (at least 1) of its machines may be Failed or terminating at a time. `Some`
    /// says why; machines without a deployment are not limited. Reads the stores only.
    pub fn replacement_throttle(&self, m: &Machine) -> Option<String> {
        let (_, Some(deployment)) = self.owners(m) else {
            return None;
        };
        let budget = max_replacements(&deployment);
        let being_replaced = self
            .machines
            .state()
            .iter()
            .filter(|other| other.uid() != m.uid())
            .filter(|other| observe::is_being_replaced(other))
            .filter(|other| {
                self.owners(other)
                    .1
                    .is_some_and(|d| d.uid() == deployment.uid())
            })
            .count();
        (being_replaced >= budget).then(|| {
            format!(
                "{being_replaced} machine(s) of MachineDeployment {} are already being replaced (budget {budget})",
                deployment.name_any()
            )
        })
    }

    /// The permit of the machine's deployment, taken without waiting (`Err` when another
    /// reconcile holds it). `None` for machines without a deployment.
    fn replacement_permit(&self, m: &Machine) -> Result<Option<mcm_permits::Permit>, String> {
        let (_, Some(deployment)) = self.owners(m) else {
            return Ok(None);
        };
        let key = format!("{}/{}", self.settings.namespace, deployment.name_any());
        self.permits.register(&key, 1);
        self.permits
            .try_acquire_now(&key)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// The stores a machine reconcile reads.
#[derive(Clone)]
pub struct Stores {
    /// Machines.
    pub machines: Store<Machine>,
    /// MachineClasses.
    pub classes: Store<MachineClass>,
    /// Nodes (target).
    pub nodes: Store<Node>,
    /// MachineSets.
    pub machine_sets: Store<MachineSet>,
    /// MachineDeployments.
    pub machine_deployments: Store<MachineDeployment>,
}

fn controller_owner<'a>(
    refs: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    kind: &str,
) -> Option<&'a str> {
    refs.iter()
        .find(|r| r.controller == Some(true) && r.kind == kind)
        .map(|r| r.name.as_str())
}

/// Why a machine of `set` is protected from being failed: `set` is an old set of
/// `deployment` (its template differs from the deployment's) while the deployment rolls out
/// (a new set with the current template exists and has not all its replicas ready). Pure.
pub fn rollout_protection(
    set: &MachineSet,
    deployment: &MachineDeployment,
    owned_sets: &[Arc<MachineSet>],
) -> Option<String> {
    use crate::machinedeployment::hash::templates_equal;
    let current = &deployment.spec.template;
    let is_new = |s: &MachineSet| {
        s.spec
            .template
            .as_ref()
            .is_some_and(|t| templates_equal(t, current))
    };
    if is_new(set) {
        return None;
    }
    let new_set = owned_sets.iter().find(|s| is_new(s))?;
    let ready = new_set
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let rolling = ready < deployment.spec.replicas().max(1);
    rolling.then(|| {
        format!(
            "machine belongs to old MachineSet {} while MachineDeployment {} rolls out to {}",
            set.name_any(),
            deployment.name_any(),
            new_set.name_any()
        )
    })
}

/// The replacement budget of a deployment: its resolved maxSurge, at least 1.
pub fn max_replacements(d: &MachineDeployment) -> usize {
    let replicas = d.spec.replicas();
    let surge = d
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.update_configuration.max_surge.as_ref());
    let resolved = match surge {
        Some(s) => mcm_api::intstr::scaled_value(s, replicas, true).unwrap_or(1),
        None => 1,
    };
    usize::try_from(resolved.max(1)).unwrap_or(1)
}

/// `initial * 2^(failures-1)`, capped at `max`.
pub fn backoff_delay(initial: Duration, max: Duration, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    initial.saturating_mul(1u32 << exp).min(max)
}

/// One reconcile of a Machine: observe, decide, act.
pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.metrics
        .reconciles
        .time(CONTROLLER, reconcile_once(&machine, &ctx))
        .await
}

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machine";

async fn reconcile_once(m: &Machine, ctx: &Ctx) -> Result<Action, Error> {
    // Decisions read the stores: wait for them to have synced (once, at start-up).
    if ctx
        .synced
        .subscribe()
        .wait_for(|synced| *synced)
        .await
        .is_err()
    {
        return Err(Error::Invariant(
            "the store readiness signal was dropped".into(),
        ));
    }
    let cfg = observe::machine_config(m, &ctx.settings.defaults);
    let class = match observe::class_name(m) {
        Err(p) => Err(p),
        Ok(name) => match ctx.class(name) {
            None => Err(ClassProblem::ClassMissing { name: name.into() }),
            Some(_) => Ok(()),
        },
    };
    let node = observe::node_name(m)
        .and_then(|n| ctx.node(n))
        .filter(|n| !observe::node_not_managed(n));
    let protection = ctx.failure_protection(m);
    let deleting = m.metadata.deletion_timestamp.is_some();
    // The replacement budget is counted only where a failure can be decided.
    let may_fail = !deleting
        && matches!(
            m.phase(),
            Some(
                MachinePhase::Unknown
                    | MachinePhase::Pending
                    | MachinePhase::Available
                    | MachinePhase::CrashLoopBackOff
            )
        );
    let throttled = may_fail.then(|| ctx.replacement_throttle(m)).flatten();
    let attachments_left = match observe::node_name(m) {
        Some(n) if deleting => act::attachments_of(ctx, n).len(),
        _ => 0,
    };
    // Before a drain starts, ask the driver whether the VM still exists: a vanished VM has
    // nothing left to drain.
    let vm_gone = deleting
        && node.is_some()
        && observe::vm_requested(m)
        && class.is_ok()
        && m.phase() == Some(&MachinePhase::Terminating)
        && observe::progress(m, mcm_api::constants::annotations::progress::DRAIN_STARTED).is_none()
        && act::vm_is_gone(ctx, m).await;
    let observed = observe::observe(
        m,
        &cfg,
        observe::Context {
            class: &class,
            node: node.as_deref(),
            frozen: ctx.freeze.is_frozen(),
            failure_protected: protection.as_deref(),
            replacement_throttled: throttled.as_deref(),
            vm_gone,
            attachments_left,
        },
    );
    let step = decide::next_step(&observed, &cfg, Timestamp::now());
    tracing::debug!(machine = %m.name_any(), ?step, "next step");
    let node = node.as_deref();
    match step {
        Step::AddFinalizer => act::add_finalizer(ctx, m).await,
        Step::ReportClassProblem(p) => act::report_class_problem(ctx, m, &p).await,
        Step::CreateVm => act::create_vm(ctx, m, &cfg).await,
        Step::MarkPending => act::mark_pending(ctx, m).await,
        Step::AwaitNode { remaining } => Ok(Action::requeue(remaining.min(ctx.settings.resync))),
        Step::MarkRunning => act::mark_running(ctx, m, node).await,
        Step::MarkUnknown { reason } => act::mark_unknown(ctx, m, &reason, node).await,
        Step::AwaitRecovery { remaining } => Ok(Action::requeue(
            remaining
                .unwrap_or(ctx.settings.resync)
                .min(ctx.settings.resync),
        )),
        Step::MarkFailed { reason } => act::mark_failed(ctx, m, &reason).await,
        Step::ReplacementThrottled { throttled, reason } => {
            act::throttle_replacement(ctx, m, &throttled, &reason).await
        }
        Step::Frozen => {
            act::hold(
                ctx,
                m,
                "machine controller is frozen by the safety controller",
            )
            .await
        }
        Step::Protected { reason } => {
            act::hold(ctx, m, &format!("not marked Failed: {reason}")).await
        }
        Step::KeepRunning => act::keep_running(ctx, m, node).await,
        Step::Nothing => Ok(Action::await_change()),
        Step::MarkTerminating => act::mark_terminating(ctx, m, node, observed.vm_requested).await,
        Step::StartDrain => match node {
            Some(node) => act::start_drain(ctx, m, node).await,
            None => Err(Error::Invariant("StartDrain without a node".into())),
        },
        Step::DrainPass {
            force,
            force_reason,
            unreachable,
            elapsed,
            pods_gone_for,
        } => {
            let Some(node_name) = observe::node_name(m) else {
                return Err(Error::Invariant("DrainPass without a node name".into()));
            };
            let plan = act::PassPlan {
                force,
                force_reason: force_reason.as_deref(),
                unreachable,
                elapsed,
                pods_gone_for,
            };
            act::drain_pass(ctx, m, &cfg, node_name, plan).await
        }
        Step::DeleteVolumeAttachments => act::delete_volume_attachments(ctx, m).await,
        Step::DeleteVm => act::delete_vm(ctx, m).await,
        Step::DeletionBlocked(problem) => act::deletion_blocked(ctx, m, &problem).await,
        Step::DeleteNode => act::delete_node(ctx, m).await,
        Step::RemoveFinalizer => act::finish_deletion(ctx, m).await,
    }
}

/// Retry policy of failed reconciles: exponential backoff per machine.
pub fn error_policy(machine: Arc<Machine>, err: &Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(machine = %machine.name_any(), error = %err, cause = ?std::error::Error::source(err), "reconcile failed");
    let driver_err = match err {
        Error::Driver { source, .. } => Some(source),
        _ => None,
    };
    Action::requeue(ctx.backoff(&machine, driver_err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, labels: serde_json::Value, ready: i32) -> Arc<MachineSet> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
                "metadata": { "name": name },
                "spec": { "replicas": 2, "template": { "metadata": { "labels": labels },
                    "spec": { "class": { "kind": "MachineClass", "name": "c" } } } },
                "status": { "readyReplicas": ready }
            }))
            .unwrap(),
        )
    }

    #[test]
    fn old_sets_are_protected_only_while_the_new_set_is_not_ready() {
        let d: MachineDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": { "name": "md" },
            "spec": { "replicas": 2, "template": { "metadata": { "labels": { "v": "2" } },
                "spec": { "class": { "kind": "MachineClass", "name": "c" } } } }
        }))
        .unwrap();
        let old = set("old", serde_json::json!({ "v": "1" }), 2);
        let new_not_ready = set(
            "new",
            serde_json::json!({ "v": "2", "machine-template-hash": "abc" }),
            1,
        );
        let new_ready = set(
            "new",
            serde_json::json!({ "v": "2", "machine-template-hash": "abc" }),
            2,
        );
        assert!(rollout_protection(&old, &d, &[old.clone(), new_not_ready.clone()]).is_some());
        assert!(
            rollout_protection(&new_not_ready, &d, &[old.clone(), new_not_ready.clone()]).is_none()
        );
        assert!(rollout_protection(&old, &d, &[old.clone(), new_ready]).is_none());
        // No new set yet: nothing rolls out.
        assert!(rollout_protection(&old, &d, std::slice::from_ref(&old)).is_none());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let s = Duration::from_secs(5);
        let max = Duration::from_secs(60);
        let delays: Vec<u64> = (1..=6)
            .map(|n| backoff_delay(s, max, n).as_secs())
            .collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 60, 60]);
        assert_eq!(backoff_delay(s, max, 10_000), max);
    }
}
