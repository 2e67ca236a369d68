//! The manager side of mcm-rs (`machine-controller-manager`): the MachineSet,
//! MachineDeployment and overshooting-safety controllers over shared reflector stores, plus
//! MCM's `mcm_machine_set_*` / `mcm_machine_deployment_*` metrics read from those stores.
//!
//! One watch per kind feeds each store. kube-runtime's shared-store subscribers only receive
//! the objects of `Apply` events (and of a completed re-list), never deletions, so each watch
//! of a kind whose deletion matters to a controller also runs through a [`DeletionTap`]: the
//! objects that disappeared are handed to the controllers as extra triggers, mapped like the
//! subscriber's objects (a Machine to its MachineSet and MachineDeployment, a MachineSet to
//! its MachineDeployment).

use std::borrow::Cow;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::metrics::ReconcileMetrics;
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use mcm_api::{ConditionStatus, Machine, MachineDeployment, MachineSet, MachineSummary};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::events::EventPublisher;
use crate::machinedeployment::controller as md;
use crate::machineset::controller as ms;
use crate::machineset::safety::{SafetyContext, SafetyLimits, run_overshooting};

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
        }
    }
}

/// Why the manager stopped.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A shared store refused a subscriber (it was not created as a shared store).
    #[error("the {0} store does not support subscribers")]
    NoSubscriber(&'static str),
    /// A store was dropped before it synced.
    #[error("the {kind} store stopped before it synced")]
    StoreDropped {
        /// The kind of the store.
        kind: &'static str,
        /// The cause.
        #[source]
        source: reflector::store::WriterDropped,
    },
}

const STORE_BUFFER: usize = 1024;

/// Hands the objects that disappeared from a store to the controllers that must react.
///
/// kube-runtime 5's `Writer::dispatch_event` broadcasts `Apply` and `InitDone` to shared-store
/// subscribers but drops `Delete`, so a controller built with `watches_shared_stream` never
/// hears that a Machine or MachineSet is gone. A tap observes the events of the one watch of a
/// kind *after* the reflector applied them (the store no longer holds a deleted object when
/// its controllers are woken) and sends every deleted object to each subscriber:
/// - `Delete` events;
/// - objects that vanished while the watch was re-listing (after a `410 Gone` or a broken
///   connection the re-list replaces the store wholesale at `InitDone`, without a `Delete`
///   for what is missing): the store's contents at `Init` minus the objects listed again.
///
/// Subscribers get unbounded channels: deletions are rare and bounded by the number of
/// objects, and a tap must never block the watch that also feeds the store.
pub struct DeletionTap<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    subscribers: Vec<mpsc::UnboundedSender<Arc<K>>>,
    relist: Option<Relist<K>>,
}

/// A re-list in progress: the store before it and the objects listed so far.
struct Relist<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    before: Vec<Arc<K>>,
    listed: HashSet<ObjectRef<K>>,
}

impl<K> std::fmt::Debug for DeletionTap<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeletionTap")
            .field("subscribers", &self.subscribers.len())
            .field("relisting", &self.relist.is_some())
            .finish_non_exhaustive()
    }
}

impl<K> DeletionTap<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    /// A tap for the watch that feeds `store`.
    pub fn new(store: Store<K>) -> Self {
        DeletionTap {
            store,
            subscribers: Vec::new(),
            relist: None,
        }
    }

    /// A stream of the objects deleted from now on, for `watches_shared_stream`.
    pub fn subscribe(&mut self) -> mpsc::UnboundedReceiver<Arc<K>> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.push(tx);
        rx
    }

    /// Observes one watch event that the reflector has already applied to the store.
    pub fn observe(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Delete(obj) => self.send(&Arc::new(obj.clone())),
            // `Init` leaves the store alone until `InitDone` swaps the new list in.
            watcher::Event::Init => {
                self.relist = Some(Relist {
                    before: self.store.state(),
                    listed: HashSet::new(),
                });
            }
            watcher::Event::InitApply(obj) => {
                if let Some(relist) = &mut self.relist {
                    relist.listed.insert(ObjectRef::from_obj(obj));
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    for gone in relist
                        .before
                        .iter()
                        .filter(|o| !relist.listed.contains(&ObjectRef::from_obj(o.as_ref())))
                    {
                        self.send(gone);
                    }
                }
            }
            watcher::Event::Apply(_) => {}
        }
    }

    fn send(&mut self, obj: &Arc<K>) {
        // A subscriber whose controller stopped is dropped.
        self.subscribers
            .retain(|tx| tx.unbounded_send(obj.clone()).is_ok());
    }
}

/// Runs the manager's controllers until `shutdown` resolves; then lets in-flight reconciles
/// finish and returns.
///
/// The metrics collector is registered in `registry` when this function is called (before
/// the returned future is awaited), so the registry is free again for the HTTP endpoint
/// while the manager runs: `run_manager(...)` borrows it only synchronously.
pub fn run_manager(
    control: Client,
    target: Client,
    config: ManagerConfig,
    registry: &mut Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = Result<(), ManagerError>> + Send + 'static {
    let (machines, machine_writer) = reflector::store_shared::<Machine>(STORE_BUFFER);
    let (sets, set_writer) = reflector::store_shared::<MachineSet>(STORE_BUFFER);
    let (deployments, deployment_writer) =
        reflector::store_shared::<MachineDeployment>(STORE_BUFFER);
    registry.register_collector(Box::new(StoreMetrics {
        sets: sets.clone(),
        deployments: deployments.clone(),
    }));
    let reconciles = config
        .reconciles
        .clone()
        .unwrap_or_else(|| ReconcileMetrics::register(registry));
    async move {
        let ns = config.namespace.clone();
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };

        // Shared stores (control cluster, one namespace) and the target cluster's Nodes.
        let machine_sub_ms = machine_writer
            .subscribe()
            .ok_or(ManagerError::NoSubscriber("Machine"))?;
        let machine_sub_md = machine_writer
            .subscribe()
            .ok_or(ManagerError::NoSubscriber("Machine"))?;
        let set_sub_ms = set_writer
            .subscribe()
            .ok_or(ManagerError::NoSubscriber("MachineSet"))?;
        let set_sub_md = set_writer
            .subscribe()
            .ok_or(ManagerError::NoSubscriber("MachineSet"))?;
        let deployment_sub = deployment_writer
            .subscribe()
            .ok_or(ManagerError::NoSubscriber("MachineDeployment"))?;
        let (nodes, node_writer) = reflector::store::<Node>();
        // Deletions, which the subscribers above never see.
        let mut machine_tap = DeletionTap::new(machines.clone());
        let machine_gone_ms = machine_tap.subscribe();
        let machine_gone_md = machine_tap.subscribe();
        let mut set_tap = DeletionTap::new(sets.clone());
        let set_gone_md = set_tap.subscribe();

        let wc = watcher::Config::default;
        let machine_watch = watcher(Api::<Machine>::namespaced(control.clone(), &ns), wc())
            .default_backoff()
            .reflect_shared(machine_writer)
            .inspect_ok(move |event| machine_tap.observe(event))
            .for_each(|_| futures::future::ready(()));
        let set_watch = watcher(Api::<MachineSet>::namespaced(control.clone(), &ns), wc())
            .default_backoff()
            .reflect_shared(set_writer)
            .inspect_ok(move |event| set_tap.observe(event))
            .for_each(|_| futures::future::ready(()));
        let deployment_watch = watcher(
            Api::<MachineDeployment>::namespaced(control.clone(), &ns),
            wc(),
        )
        .default_backoff()
        .reflect_shared(deployment_writer)
        .for_each(|_| futures::future::ready(()));
        let node_watch = reflector::reflector(
            node_writer,
            watcher(Api::<Node>::all(target.clone()), wc()).default_backoff(),
        )
        .for_each(|_| futures::future::ready(()));
        let watches = tokio::spawn(async move {
            tokio::join!(machine_watch, set_watch, deployment_watch, node_watch);
        });

        // Readiness.
        {
            let (m, s, d, n) = (
                machines.clone(),
                sets.clone(),
                deployments.clone(),
                nodes.clone(),
            );
            let ready = config.ready.clone();
            tokio::spawn(async move {
                let synced = async {
                    synced_or_dropped(&m, "Machine").await?;
                    synced_or_dropped(&s, "MachineSet").await?;
                    synced_or_dropped(&d, "MachineDeployment").await?;
                    synced_or_dropped(&n, "Node").await
                };
                match synced.await {
                    Ok(()) => ready.store(true, Ordering::SeqCst),
                    Err(error) => tracing::error!(%error, "stores did not sync"),
                }
            });
        }

        let controller_config = ControllerConfig::default().concurrency(config.concurrent_syncs);

        let ms_ctx = Arc::new(ms::Context {
            client: control.clone(),
            machines: machines.clone(),
            sets: sets.clone(),
            events: EventPublisher::new(control.clone(), "machine-controller-manager"),
            expectations: ms::Expectations::default(),
        });
        let sets_for_mapper = sets.clone();
        let ms_controller = Controller::for_shared_stream(set_sub_ms, sets.clone())
            .watches_shared_stream(
                futures::stream::select(machine_sub_ms, machine_gone_ms),
                move |m: Arc<Machine>| ms::sets_for_machine(&m, &sets_for_mapper),
            )
            .with_config(controller_config.clone())
            .graceful_shutdown_on(stopped())
            .run(
                {
                    let reconciles = reconciles.clone();
                    move |set, ctx| {
                        let reconciles = reconciles.clone();
                        async move {
                            reconciles
                                .time(ms::CONTROLLER, ms::reconcile(set, ctx))
                                .await
                        }
                    }
                },
                ms::error_policy,
                ms_ctx,
            )
            .for_each(|r| async move {
                if let Err(error) = r {
                    tracing::debug!(%error, "MachineSet controller");
                }
            });

        let md_ctx = Arc::new(md::Context {
            client: control.clone(),
            target: target.clone(),
            machines: machines.clone(),
            sets: sets.clone(),
            nodes: nodes.clone(),
            events: EventPublisher::new(control.clone(), "machine-controller-manager"),
            autoscaler_annotations: config.autoscaler_annotations,
        });
        let sets_for_md = sets.clone();
        let md_controller = Controller::for_shared_stream(deployment_sub, deployments.clone())
            .watches_shared_stream(
                futures::stream::select(set_sub_md, set_gone_md),
                |s: Arc<MachineSet>| md::deployment_for_set(&s),
            )
            .watches_shared_stream(
                futures::stream::select(machine_sub_md, machine_gone_md),
                move |m: Arc<Machine>| md::deployment_for_machine(&m, &sets_for_md),
            )
            .with_config(controller_config)
            .graceful_shutdown_on(stopped())
            .run(
                move |deployment, ctx| {
                    let reconciles = reconciles.clone();
                    async move {
                        reconciles
                            .time(md::CONTROLLER, md::reconcile(deployment, ctx))
                            .await
                    }
                },
                md::error_policy,
                md_ctx,
            )
            .for_each(|r| async move {
                if let Err(error) = r {
                    tracing::debug!(%error, "MachineDeployment controller");
                }
            });

        let safety = run_overshooting(
            SafetyContext {
                client: control.clone(),
                machines,
                sets,
                deployments,
                events: EventPublisher::new(control.clone(), "machine-controller-manager"),
                limits: SafetyLimits {
                    safety_up: config.safety_up,
                    safety_down: config.safety_down,
                },
            },
            config.overshooting_period,
            stopped(),
        );

        tokio::join!(ms_controller, md_controller, safety);
        watches.abort();
        config.ready.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// Collects MCM's MachineSet and MachineDeployment metrics from the stores at scrape time.
#[derive(Clone)]
pub struct StoreMetrics {
    /// The MachineSets.
    pub sets: Store<MachineSet>,
    /// The MachineDeployments.
    pub deployments: Store<MachineDeployment>,
}

impl std::fmt::Debug for StoreMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreMetrics").finish_non_exhaustive()
    }
}

type Labels = Vec<(Cow<'static, str>, String)>;

fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, i64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if let [(labels, value)] = samples
        && labels.is_empty()
    {
        return ConstGauge::new(*value).encode(metric);
    }
    for (labels, value) in samples {
        let family = metric.encode_family(labels)?;
        ConstGauge::new(*value).encode(family)?;
    }
    Ok(())
}

fn base_labels<K: kube::Resource>(obj: &K) -> Labels {
    let meta = obj.meta();
    vec![
        ("name".into(), meta.name.clone().unwrap_or_default()),
        (
            "namespace".into(),
            meta.namespace.clone().unwrap_or_default(),
        ),
        ("uid".into(), meta.uid.clone().unwrap_or_default()),
    ]
}

fn created<K: kube::Resource>(obj: &K) -> String {
    obj.meta()
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second().to_string())
        .unwrap_or_default()
}

fn failed_samples<K: kube::Resource>(
    obj: &K,
    failed: Option<&Vec<MachineSummary>>,
) -> Vec<(Labels, i64)> {
    failed
        .into_iter()
        .flatten()
        .map(|f| {
            let mut l = base_labels(obj);
            let op = f.last_operation.as_ref();
            l.push((
                "failed_machine_name".into(),
                f.name.clone().unwrap_or_default(),
            ));
            l.push((
                "failed_machine_provider_id".into(),
                f.provider_id.clone().unwrap_or_default(),
            ));
            l.push((
                "failed_machine_owner_ref".into(),
                f.owner_ref.clone().unwrap_or_default(),
            ));
            l.push((
                "failed_machine_last_operation_state".into(),
                op.and_then(|o| o.state.as_ref())
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ));
            l.push((
                "failed_machine_last_operation_machine_operation_type".into(),
                op.and_then(|o| o.type_.as_ref())
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ));
            (l, 1)
        })
        .collect()
}

fn condition_value(status: &ConditionStatus) -> i64 {
    match status {
        ConditionStatus::True => 1,
        _ => 0,
    }
}

impl Collector for StoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sets = self.sets.state();
        let per_set = |f: &dyn Fn(&MachineSet) -> i64| -> Vec<(Labels, i64)> {
            sets.iter()
                .map(|s| (base_labels(s.as_ref()), f(s)))
                .collect()
        };
        gauge_family(
            &mut encoder,
            "mcm_machineset_items_total",
            "Count of machinesets currently managed by the mcm.",
            &[(Vec::new(), i64::try_from(sets.len()).unwrap_or(i64::MAX))],
        )?;
        let info: Vec<(Labels, i64)> = sets
            .iter()
            .map(|s| {
                let class = s
                    .spec
                    .template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .and_then(|sp| sp.class.as_ref());
                let mut l = base_labels(s.as_ref());
                l.push(("created".into(), created(s.as_ref())));
                l.push((
                    "spec_machine_class_api_group".into(),
                    class.and_then(|c| c.api_group.clone()).unwrap_or_default(),
                ));
                l.push((
                    "spec_machine_class_kind".into(),
                    class.and_then(|c| c.kind.clone()).unwrap_or_default(),
                ));
                l.push((
                    "spec_machine_class_name".into(),
                    class.and_then(|c| c.name.clone()).unwrap_or_default(),
                ));
                (l, 1)
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_info",
            "Information of the Machinesets currently managed by the mcm.",
            &info,
        )?;
        let status = |s: &MachineSet| s.status.clone().unwrap_or_default();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_info_spec_replicas",
            "Count of the Machinesets' spec replicas.",
            &per_set(&|s| i64::from(s.spec.replicas())),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_info_spec_min_ready_seconds",
            "Information of the Machinesets currently managed by the mcm.",
            &per_set(&|s| i64::from(s.spec.min_ready_seconds.unwrap_or(0))),
        )?;
        // The misspelt name is MCM's.
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_availabla_replicas",
            "Information of the mcm managed Machinesets' status for available replicas.",
            &per_set(&|s| i64::from(status(s).available_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_fully_labelled_replicas",
            "Information of the mcm managed Machinesets' status for fully labelled replicas.",
            &per_set(&|s| i64::from(status(s).fully_labeled_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_ready_replicas",
            "Information of the mcm managed Machinesets' status for ready replicas.",
            &per_set(&|s| i64::from(status(s).ready_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_replicas",
            "Information of the mcm managed Machinesets' status for replicas.",
            &per_set(&|s| i64::from(status(s).replicas.unwrap_or(0))),
        )?;
        let conditions: Vec<(Labels, i64)> = sets
            .iter()
            .flat_map(|s| {
                s.status
                    .iter()
                    .flat_map(|st| st.conditions.iter().flatten())
                    .map(|c| {
                        let mut l = base_labels(s.as_ref());
                        l.push(("condition".into(), c.type_.to_string()));
                        (l, condition_value(&c.status))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_condition",
            "Information of the mcm managed Machinesets' status conditions.",
            &conditions,
        )?;
        let failed: Vec<(Labels, i64)> = sets
            .iter()
            .flat_map(|s| {
                failed_samples(
                    s.as_ref(),
                    s.status.as_ref().and_then(|st| st.failed_machines.as_ref()),
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_failed_machines",
            "Information of the mcm managed Machinesets' failed machines.",
            &failed,
        )?;

        let ds = self.deployments.state();
        let per_d = |f: &dyn Fn(&MachineDeployment) -> i64| -> Vec<(Labels, i64)> {
            ds.iter().map(|d| (base_labels(d.as_ref()), f(d))).collect()
        };
        gauge_family(
            &mut encoder,
            "mcm_machinedeployment_items_total",
            "Count of machinedeployments currently managed by the mcm.",
            &[(Vec::new(), i64::try_from(ds.len()).unwrap_or(i64::MAX))],
        )?;
        let info: Vec<(Labels, i64)> = ds
            .iter()
            .map(|d| {
                let mut l = base_labels(d.as_ref());
                l.push(("created".into(), created(d.as_ref())));
                l.push((
                    "spec_strategy_type".into(),
                    d.spec
                        .strategy
                        .as_ref()
                        .and_then(|s| s.type_.as_ref())
                        .map(|t| t.to_string())
                        .unwrap_or_default(),
                ));
                (l, 1)
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info",
            "Information of the Machinedeployments currently managed by the mcm.",
            &info,
        )?;
        let dstatus = |d: &MachineDeployment| d.status.clone().unwrap_or_default();
        let limit = |d: &MachineDeployment, surge: bool| -> i64 {
            let u = d
                .spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref())
                .map(|r| &r.update_configuration);
            let v = u.and_then(|u| {
                if surge {
                    u.max_surge.as_ref()
                } else {
                    u.max_unavailable.as_ref()
                }
            });
            v.and_then(|v| mcm_api::intstr::scaled_value(v, d.spec.replicas(), surge).ok())
                .map_or(0, i64::from)
        };
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_paused",
            "Information of the Machinedeployments paused status.",
            &per_d(&|d| i64::from(d.spec.paused.unwrap_or(false))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_replicas",
            "Information of the Machinedeployments spec replicas.",
            &per_d(&|d| i64::from(d.spec.replicas())),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_min_ready_seconds",
            "Information of the Machinedeployments spec min ready seconds.",
            &per_d(&|d| i64::from(d.spec.min_ready_seconds.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_rolling_update_max_surge",
            "Information of the Machinedeployments spec rolling update max surge.",
            &per_d(&|d| limit(d, true)),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_rolling_update_max_unavailable",
            "Information of the Machinedeployments spec rolling update max unavailable.",
            &per_d(&|d| limit(d, false)),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_revision_history_limit",
            "Information of the Machinedeployments spec revision history limit.",
            &per_d(&|d| i64::from(d.spec.revision_history_limit.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_progress_deadline_seconds",
            "Information of the Machinedeployments spec deadline seconds.",
            &per_d(&|d| i64::from(d.spec.progress_deadline_seconds.unwrap_or(0))),
        )?;
        let conditions: Vec<(Labels, i64)> = ds
            .iter()
            .flat_map(|d| {
                d.status
                    .iter()
                    .flat_map(|st| st.conditions.iter().flatten())
                    .map(|c| {
                        let mut l = base_labels(d.as_ref());
                        l.push(("condition".into(), c.type_.to_string()));
                        (l, condition_value(&c.status))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_condition",
            "Information of the mcm managed Machinedeployments' status conditions.",
            &conditions,
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_available_replicas",
            "Count of the mcm managed Machinedeployments available replicas.",
            &per_d(&|d| i64::from(dstatus(d).available_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_unavailable_replicas",
            "Count of the mcm managed Machinedeployments unavailable replicas.",
            &per_d(&|d| i64::from(dstatus(d).unavailable_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_ready_replicas",
            "Count of the mcm managed Machinedeployments ready replicas.",
            &per_d(&|d| i64::from(dstatus(d).ready_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_updated_replicas",
            "Count of the mcm managed Machinedeployments updated replicas.",
            &per_d(&|d| i64::from(dstatus(d).updated_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_collision_count",
            "Mcm managed Machinedeployments collision count.",
            &per_d(&|d| i64::from(dstatus(d).collision_count.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_replicas",
            "Count of the mcm managed Machinedeployments replicas.",
            &per_d(&|d| i64::from(dstatus(d).replicas.unwrap_or(0))),
        )?;
        let failed: Vec<(Labels, i64)> = ds
            .iter()
            .flat_map(|d| {
                failed_samples(
                    d.as_ref(),
                    d.status.as_ref().and_then(|st| st.failed_machines.as_ref()),
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_failed_machines",
            "Information of the mcm managed Machinedeployments' failed machines.",
            &failed,
        )?;
        Ok(())
    }
}

/// Waits until `store` synced; a dropped writer is [`ManagerError::StoreDropped`] of `kind`.
async fn synced_or_dropped<K>(
    store: &kube::runtime::reflector::Store<K>,
    kind: &'static str,
) -> Result<(), ManagerError>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    crate::store_ready(store)
        .await
        .map_err(|source| ManagerError::StoreDropped { kind, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn machine(name: &str) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..Machine::default()
        }
    }

    /// Applies `event` to the store as the reflector does, then lets the tap see it.
    fn feed(
        writer: &mut reflector::store::Writer<Machine>,
        tap: &mut DeletionTap<Machine>,
        event: watcher::Event<Machine>,
    ) {
        writer.apply_watcher_event(&event);
        tap.observe(&event);
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Arc<Machine>>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(m) = rx.try_recv() {
            names.push(m.metadata.name.clone().unwrap_or_default());
        }
        names.sort();
        names
    }

    #[test]
    fn deletions_and_objects_lost_in_a_relist_reach_every_subscriber() {
        let (store, mut writer) = reflector::store::<Machine>();
        let mut tap = DeletionTap::new(store);
        let mut first = tap.subscribe();
        let mut second = tap.subscribe();

        // Initial list: nothing was known before, nothing is reported.
        feed(&mut writer, &mut tap, watcher::Event::Init);
        for n in ["a", "b", "c", "d"] {
            feed(&mut writer, &mut tap, watcher::Event::InitApply(machine(n)));
        }
        feed(&mut writer, &mut tap, watcher::Event::InitDone);
        feed(&mut writer, &mut tap, watcher::Event::Apply(machine("e")));
        assert_eq!(drain(&mut first), Vec::<String>::new());

        feed(&mut writer, &mut tap, watcher::Event::Delete(machine("a")));
        assert_eq!(drain(&mut first), ["a"]);
        assert_eq!(drain(&mut second), ["a"]);

        // A re-list after a broken watch: `c` and `e` went away meanwhile, `f` is new.
        feed(&mut writer, &mut tap, watcher::Event::Init);
        for n in ["b", "d", "f"] {
            feed(&mut writer, &mut tap, watcher::Event::InitApply(machine(n)));
        }
        assert_eq!(
            drain(&mut first),
            Vec::<String>::new(),
            "not before InitDone"
        );
        feed(&mut writer, &mut tap, watcher::Event::InitDone);
        assert_eq!(drain(&mut first), ["c", "e"]);
        assert_eq!(drain(&mut second), ["c", "e"]);

        // A subscriber that went away does not stop the others.
        drop(first);
        feed(&mut writer, &mut tap, watcher::Event::Delete(machine("b")));
        assert_eq!(drain(&mut second), ["b"]);
        assert_eq!(tap.subscribers.len(), 1);
    }
}
