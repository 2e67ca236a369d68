//! The manager side of mcm-rs (`machine-controller-manager`): the MachineSet,
//! MachineDeployment and overshooting-safety controllers over the process's shared informers
//! ([`crate::informers`]), plus MCM's `mcm_machine_set_*` / `mcm_machine_deployment_*`
//! metrics read from those stores ([`metrics`]), and the MachineDisruptionBudget controller
//! with the gate the MachineSet controller asks before a voluntary deletion
//! (the `disruptionbudget` module).
//!
//! Deleted Machines and MachineSets reach the controllers through the informers' deletion
//! taps (shared-store subscribers never see deletions), mapped like the subscribed objects.

pub mod metrics;

/// The settings of the effective-creation-timeout adaptation ([`ManagerConfig::creation_timeouts`]).
pub use crate::machinedeployment::creation_timeout::TimeoutAdaptation;
pub use metrics::StoreMetrics;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use mcm_api::{Machine, MachineDeployment, MachineDisruptionBudget, MachineSet};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::disruptionbudget::{self as mdb, BudgetGate};
use crate::events::EventPublisher;
use crate::informers::{Informer, Informers, throttled_per_key};
use crate::kube_api::ApiErrorExt;
use crate::machinedeployment as md;
use crate::machineset as ms;
use crate::metrics::ReconcileMetrics;
use crate::runtime::Runner;
use crate::safety::overshoot::{self, SafetyContext, SafetyLimits};

/// How often a MachineSet, MachineDeployment or MachineDisruptionBudget is reconciled at most
/// for changes of its machines (its own changes trigger it at once). The first two reconciles
/// read every machine of the namespace, a budget's every machine it selects; during a rollout
/// of 1000 machines, a reconcile per machine change made the MachineSet controller the
/// largest consumer of CPU. A change within the gap is not lost:
/// it triggers one reconcile when the gap has passed ([`throttled_per_key`]). The sets'
/// and deployments' status writes are paced to one a second anyway.
pub const MACHINE_TRIGGER_GAP: Duration = Duration::from_millis(500);

/// Settings of the manager (MCM's flags of the same meaning).
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Namespace of the machine objects in the control cluster (`--namespace`).
    pub namespace: String,
    /// Reconciles running at once per controller (`--concurrent-syncs`, default 10).
    pub concurrent_syncs: u16,
    /// `--safety-up` (default 2).
    pub safety_up: i32,
    /// `--safety-down` (default 1).
    pub safety_down: i32,
    /// `--machine-safety-overshooting-period` (default 1m).
    pub overshooting_period: Duration,
    /// Turns true once all stores have synced (for `/readyz`); clone it before passing the
    /// config.
    pub ready: Arc<AtomicBool>,
    /// `--autoscaler-scaledown-annotation-during-rollout` (default true): annotate the nodes
    /// of a rolling deployment so the cluster-autoscaler does not scale them down.
    pub autoscaler_annotations: bool,
    /// Reconcile metrics shared with the other controllers of the process; `None`: the
    /// manager registers its own in the registry [`run_manager`] is given.
    pub reconciles: Option<ReconcileMetrics>,
    /// There is a target cluster (`--target-kubeconfig` is not `none`); without one
    /// [`run_manager`] watches no Nodes.
    pub target_cluster: bool,
    /// The declared creation timeout of deployments that set none
    /// (`--machine-creation-timeout`) and the adaptation of their effective creation timeout
    /// (`--machine-creation-timeout-growth-percent`, `--machine-replace-cycle-count-threshold`,
    /// `--machine-creation-timeout-max`).
    pub creation_timeouts: TimeoutAdaptation,
    /// When a zone counts as partitioned (`--machine-zone-partition-*`): the
    /// MachineDeployments' `ZonePartition` condition counts as the machine controller does.
    pub zone_partition: crate::machine::partition::PartitionRule,
    /// Where the manager's controllers take time from (the system's clocks unless a test
    /// steps a [`ManualClock`](crate::clock::ManualClock)).
    pub clock: crate::clock::SharedClock,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            namespace: "default".to_owned(),
            concurrent_syncs: 10,
            safety_up: 2,
            safety_down: 1,
            overshooting_period: Duration::from_secs(60),
            ready: Arc::new(AtomicBool::new(false)),
            autoscaler_annotations: true,
            reconciles: None,
            target_cluster: true,
            creation_timeouts: Default::default(),
            zone_partition: Default::default(),
            clock: crate::clock::system(),
        }
    }
}

/// Runs the manager's controllers on informers of its own until `shutdown` resolves; then
/// lets in-flight reconciles finish and returns.
///
/// The metrics collector is registered in `registry` when this function is called (before
/// the returned future is awaited), so the registry is free again for the HTTP endpoint
/// while the manager runs: `run_manager(...)` borrows it only synchronously.
pub fn run_manager<S>(
    control: Client,
    target: Client,
    config: ManagerConfig,
    registry: &mut Registry,
    shutdown: S,
) -> impl Future<Output = ()> + Send + 'static + use<S>
where
    S: Future<Output = ()> + Send + 'static,
{
    let cancel = CancellationToken::new();
    let mut informers = if config.target_cluster {
        Informers::new(&control, &target, &config.namespace)
    } else {
        Informers::without_target(&control, &config.namespace)
    };
    let work = prepare(
        &mut informers,
        control,
        target,
        config,
        registry,
        cancel.clone(),
    );
    informers.start(cancel.clone());
    async move {
        let stop = cancel.clone();
        let on_shutdown = tokio::spawn(async move {
            shutdown.await;
            stop.cancel();
        });
        work.await;
        on_shutdown.abort();
        cancel.cancel();
    }
}

/// Builds the manager's controllers (MachineSet, MachineDeployment, overshooting guard) over
/// the process's `informers`, taking their subscriptions, and registers the store metrics in
/// `registry`; the returned future runs them until `cancel` fires. Start the informers after
/// every half of the process is prepared.
pub fn prepare(
    informers: &mut Informers,
    control: Client,
    target: Client,
    config: ManagerConfig,
    registry: &mut Registry,
    cancel: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static + use<> {
    let machines = informers.machines.store();
    let sets = informers.sets.store();
    let deployments = informers.deployments.store();
    let nodes = informers.nodes.store();
    registry.register_collector(Box::new(StoreMetrics {
        sets: sets.clone(),
        deployments: deployments.clone(),
        default_creation_timeout: config.creation_timeouts.default_timeout,
    }));
    let reconciles = config
        .reconciles
        .clone()
        .unwrap_or_else(|| ReconcileMetrics::register(registry));
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let runner = Runner {
        reconciles,
        config: ControllerConfig::default().concurrency(config.concurrent_syncs),
        cancel: cancel.clone(),
        synced: synced_rx,
    };
    let clock = config.clock.clone();
    let events = EventPublisher::new(control.clone(), "machine-controller-manager")
        .with_clock(clock.clone());

    let mut budget_informer = Informer::disruption_budgets(&control, &config.namespace);
    let budgets = budget_informer.store();
    let (budget_gate, budget_wake) = BudgetGate::new(budgets.clone());

    let ms_ctx = Arc::new(ms::Context {
        client: control.clone(),
        machines: machines.clone(),
        nodes: nodes.clone(),
        events: events.clone(),
        expectations: ms::Expectations::default(),
        overlaps: Default::default(),
        status_pacer: Default::default(),
        deployments: deployments.clone(),
        budget_gate: budget_gate.clone(),
        announced_blocks: Default::default(),
        clock: clock.clone(),
    });
    let sets_for_machines = sets.clone();
    let (machines_for_budgets, sets_for_budgets) = (machines.clone(), sets.clone());
    let ms_controller = runner.run(
        Controller::for_shared_stream(informers.sets.subscribe(), sets.clone())
            .reconcile_on(machine_triggers(&mut informers.machines, move |m| {
                ms::sets_for_machine(m, &sets_for_machines)
            }))
            // A budget's status changes when a disruption it held back may go.
            .watches_shared_stream(
                budget_informer.subscribe(),
                move |b: Arc<MachineDisruptionBudget>| {
                    ms::sets_for_budget(&b, &machines_for_budgets, &sets_for_budgets)
                },
            ),
        (ms::CONTROLLER, ms::reconcile, ms::error_policy),
        ms_ctx,
    );

    let md_ctx = Arc::new(md::Context {
        client: control.clone(),
        target,
        machines: machines.clone(),
        sets: sets.clone(),
        nodes,
        events: events.clone(),
        autoscaler_annotations: config.autoscaler_annotations,
        target_cluster: config.target_cluster,
        announced: Default::default(),
        status_pacer: Default::default(),
        creation_timeouts: config.creation_timeouts,
        zone_partition: config.zone_partition,
        clock: clock.clone(),
    });
    let sets_for_md = sets.clone();
    let mut md_controller =
        Controller::for_shared_stream(informers.deployments.subscribe(), deployments.clone())
            .watches_shared_stream(informers.sets.changes(), |s: Arc<MachineSet>| {
                md::deployment_for_set(&s)
            })
            .reconcile_on(machine_triggers(&mut informers.machines, move |m| {
                md::deployment_for_machine(m, &sets_for_md)
            }));
    if config.target_cluster {
        // In-place updates: the node agent's result and the Node's condition.
        let (machines_for_md, sets_for_md) = (machines.clone(), sets.clone());
        md_controller = md_controller.watches_shared_stream(
            // Not on every heartbeat: only a change the deployment could act on.
            crate::informers::changed_only(
                informers.nodes.subscribe(),
                crate::machine_controller::node_fingerprint,
                informers.nodes.store(),
            ),
            move |n: Arc<Node>| md::deployments_for_node(&n, &machines_for_md, &sets_for_md),
        );
    }
    let md_controller = runner.run(
        md_controller,
        (md::CONTROLLER, md::reconcile, md::error_policy),
        md_ctx,
    );

    let mdb_ctx = Arc::new(mdb::Context {
        client: control.clone(),
        machines: machines.clone(),
        gate: budget_gate.clone(),
        events: events.clone(),
        announced: Default::default(),
        clock: clock.clone(),
    });
    let budgets_for_machines = budgets.clone();
    let mdb_controller = runner.run(
        Controller::for_shared_stream(budget_informer.subscribe(), budgets)
            .reconcile_on(machine_triggers(&mut informers.machines, move |m| {
                mdb::budgets_for_machine(m, &budgets_for_machines)
            }))
            .reconcile_on(budget_wake),
        (mdb::CONTROLLER, mdb::reconcile, mdb::error_policy),
        mdb_ctx,
    );
    let budget_start = start_budgets(
        budget_informer,
        kube::Api::namespaced(control.clone(), &config.namespace),
        budget_gate,
        cancel.clone(),
    );

    let safety_ctx = Arc::new(SafetyContext {
        client: control,
        machines,
        sets: sets.clone(),
        deployments: deployments.clone(),
        events,
        limits: SafetyLimits {
            safety_up: config.safety_up,
            safety_down: config.safety_down,
        },
        period: config.overshooting_period,
        clock,
    });
    let (sets_for_guard, deployments_for_guard) = (sets.clone(), deployments.clone());
    let overshoot_guard = runner.run(
        Controller::for_shared_stream(informers.sets.subscribe(), sets).watches_shared_stream(
            informers.deployments.subscribe(),
            move |d: Arc<MachineDeployment>| {
                overshoot::sets_of_deployment(&d, &sets_for_guard, &deployments_for_guard)
            },
        ),
        (
            overshoot::CONTROLLER,
            overshoot::reconcile,
            overshoot::error_policy,
        ),
        safety_ctx,
    );

    let synced = informers.synced();
    let ready = config.ready;
    async move {
        let readiness = async {
            tokio::select! {
                _ = synced => {
                    ready.store(true, Ordering::SeqCst);
                    synced_tx.send_replace(true);
                }
                () = cancel.cancelled() => {}
            }
        };
        let controllers = async {
            tokio::join!(
                ms_controller,
                md_controller,
                overshoot_guard,
                mdb_controller,
                budget_start
            );
            cancel.cancel();
        };
        tokio::join!(readiness, controllers);
        ready.store(false, Ordering::SeqCst);
    }
}

/// The objects `to` maps each change of a machine to (applied or deleted), each passed at
/// most once per [`MACHINE_TRIGGER_GAP`]: the triggers of a controller whose reconcile reads
/// every machine of the namespace.
fn machine_triggers<K, I, F>(
    machines: &mut Informer<Machine>,
    to: F,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + use<K, I, F>
where
    F: Fn(&Machine) -> I + Send + 'static,
    K: kube::Resource + 'static,
    ObjectRef<K>: Eq + std::hash::Hash + Clone + Send,
    I: IntoIterator<Item = ObjectRef<K>>,
    I::IntoIter: Send + 'static,
{
    let refs = machines
        .changes()
        .flat_map(move |m: Arc<Machine>| futures::stream::iter(to(&m)));
    throttled_per_key(refs, MACHINE_TRIGGER_GAP)
}

/// How long the manager waits before asking again whether the cluster serves
/// MachineDisruptionBudgets, after an answer that was neither yes nor no.
const BUDGET_PROBE_RETRY: Duration = Duration::from_secs(2);

/// Starts the MachineDisruptionBudget watch once the cluster is known to serve the kind, and
/// opens the gate when the budgets are listed. When the kind is not served (404: the CRD is
/// not installed) or may not be listed (403: the RBAC predates it), budgets are not enforced
/// and the manager behaves like MCM; the log says so. Other errors are retried.
async fn start_budgets(
    mut informer: Informer<MachineDisruptionBudget>,
    api: kube::Api<MachineDisruptionBudget>,
    gate: BudgetGate,
    cancel: CancellationToken,
) {
    loop {
        match api.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => break,
            Err(e) if e.is_not_found() || e.api_code() == Some(403) => {
                tracing::warn!(
                    error = %e,
                    "MachineDisruptionBudgets are not served or not readable; budgets are not enforced (install the CRD and the RBAC, then restart)"
                );
                gate.set_absent();
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list MachineDisruptionBudgets; retrying");
                tokio::select! {
                    () = tokio::time::sleep(BUDGET_PROBE_RETRY) => {}
                    () = cancel.cancelled() => return,
                }
            }
        }
    }
    let synced = informer.synced();
    informer.spawn(cancel.clone());
    tokio::select! {
        () = synced => gate.set_enforced(),
        () = cancel.cancelled() => {}
    }
}
