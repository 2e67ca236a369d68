//! Running the machine-controller side over the process's shared informers: the machine,
//! machineclass and orphan-collection controllers and the API-server check, until one
//! cancellation token fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use mcm_api::constants::labels;
use mcm_api::{Machine, MachineClass};
use mcm_driver::Driver;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::informers::{Informers, changed_only, notifications};
use crate::machine::{self, Ctx, Freeze, MachineMetrics, Settings};
use crate::machineclass::{self, ClassCtx};
use crate::runtime::Runner;
use crate::safety::orphans::{self, OrphanCtx};
use crate::safety::{SafetySettings, apiserver};

/// Handles to a running machine controller.
#[derive(Clone, Debug)]
pub struct Handles {
    /// True once every store has synced (readiness).
    pub ready: Arc<AtomicBool>,
    /// Notify to run an orphan-collection pass now.
    pub orphan_trigger: Arc<Notify>,
    /// The freeze flag of the safety controller.
    pub freeze: Freeze,
    /// Where every controller of the side takes time from (the system's clocks unless a
    /// test steps a [`ManualClock`](crate::clock::ManualClock)).
    pub clock: SharedClock,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            ready: Arc::default(),
            orphan_trigger: Arc::default(),
            freeze: Freeze::default(),
            clock: crate::clock::system(),
        }
    }
}

/// Settings of the whole machine-controller side.
#[derive(Debug, Clone)]
pub struct MachineControllerConfig {
    /// The machine controller.
    pub machine: Settings,
    /// The safety controller.
    pub safety: SafetySettings,
    /// `--concurrent-syncs`: machines reconciled at the same time.
    pub concurrent_syncs: u16,
}

/// What about a Node matters to its Machine: conditions without heartbeat times, labels,
/// annotations, taints, unschedulable. Node heartbeats alone change none of it, so they do not
/// trigger machine reconciles (the store still sees every update).
pub fn node_fingerprint(node: &Node) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.name.hash(&mut h);
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    node.metadata.labels.hash(&mut h);
    node.metadata.annotations.hash(&mut h);
    if let Some(spec) = &node.spec {
        spec.unschedulable.hash(&mut h);
        spec.provider_id.hash(&mut h);
        for t in spec.taints.iter().flatten() {
            (&t.key, &t.value, &t.effect).hash(&mut h);
        }
    }
    for c in machine::observe::node_conditions_of(node) {
        (&c.type_, &c.status, &c.reason, &c.message).hash(&mut h);
    }
    Some(h.finish())
}

/// Maps a Node to the Machine it belongs to: the node's `node.gardener.cloud/machine-name`
/// label, else the Machine whose `node` label names it.
fn machine_of_node(
    node: &Node,
    machines: &Store<Machine>,
    namespace: &str,
) -> Option<ObjectRef<Machine>> {
    if let Some(name) = node.labels().get(labels::NODE_MACHINE_NAME) {
        return Some(ObjectRef::new(name).within(namespace));
    }
    let node_name = node.name_any();
    machines
        .state()
        .iter()
        .find(|m| machine::observe::node_name(m) == Some(node_name.as_str()))
        .map(|m| ObjectRef::from_obj(m.as_ref()))
}

/// What the machine-controller side is made of, besides the informers.
pub struct MachineSide {
    /// Client of the control cluster.
    pub control: kube::Client,
    /// Client of the target cluster.
    pub target: kube::Client,
    /// Client of the target cluster for evictions: built with
    /// [`kube::Config::default_retry`] off, so that a PodDisruptionBudget's refusal (`429`)
    /// comes back at once instead of holding a reconcile through the client's retries.
    pub evictions: kube::Client,
    /// The provider's driver.
    pub driver: Arc<dyn Driver>,
    /// Settings.
    pub config: MachineControllerConfig,
    /// Metrics, from [`MachineMetrics::register`].
    pub metrics: MachineMetrics,
    /// Readiness, orphan trigger and freeze flag shared with the process.
    pub handles: Handles,
}

impl MachineSide {
    /// Runs the machine-controller side on informers of its own until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let ns = &self.config.machine.namespace;
        let mut informers = if self.config.machine.target_cluster {
            Informers::new(&self.control, &self.target, ns)
        } else {
            Informers::without_target(&self.control, ns)
        };
        let work = prepare(&mut informers, self, cancel.clone());
        informers.start(cancel);
        work.await
    }
}

/// Builds the machine-controller side over the process's `informers` (taking its
/// subscriptions); the returned future runs it until `cancel` fires. Start the informers
/// after every half of the process is prepared.
pub fn prepare(
    informers: &mut Informers,
    side: MachineSide,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static + use<> {
    let MachineSide {
        control,
        target,
        evictions,
        driver,
        config,
        metrics,
        handles,
    } = side;
    let ns = config.machine.namespace.clone();
    let stores = informers.stores();
    let machines = stores.machines.clone();
    let classes = stores.classes.clone();
    let class_driver = driver.clone();
    let mut ctx = Ctx::new(
        control.clone(),
        target.clone(),
        evictions,
        driver,
        config.machine.clone(),
        stores.clone(),
        mcm_drain::Stores::new(stores.volume_attachments.clone())
            .with_nodes(stores.nodes.clone())
            .with_pods(stores.pods.clone()),
        handles.freeze.clone(),
        metrics,
        handles.clock.clone(),
    );
    ctx.orphan_trigger = handles.orphan_trigger.clone();
    let ctx = Arc::new(ctx);
    let runner = Runner {
        reconciles: ctx.metrics.reconciles.clone(),
        config: controller::Config::default().concurrency(config.concurrent_syncs),
        cancel: cancel.clone(),
        synced: ctx.synced.subscribe(),
    };

    // The machine controller: Machines, their Nodes (not heartbeats; deletions too) and
    // their classes; deleted Machines only to forget what it kept for them.
    let machine_controller = {
        let (for_nodes, for_deleted_nodes, for_classes) =
            (machines.clone(), machines.clone(), machines.clone());
        let (ns_nodes, ns_deleted_nodes) = (ns.clone(), ns.clone());
        let (seen_ctx, gone_ctx, forget_ctx) = (ctx.clone(), ctx.clone(), ctx.clone());
        runner.run(
            Controller::for_shared_stream(informers.machines.subscribe(), machines.clone())
                .watches_shared_stream(
                    changed_only(
                        informers
                            .nodes
                            .subscribe()
                            .inspect(move |node| seen_ctx.note_node(node)),
                        node_fingerprint,
                        stores.nodes.clone(),
                    ),
                    move |node: Arc<Node>| machine_of_node(&node, &for_nodes, &ns_nodes),
                )
                .watches_shared_stream(
                    informers
                        .nodes
                        .deletions()
                        .inspect(move |node| gone_ctx.note_node(node)),
                    move |node: Arc<Node>| {
                        machine_of_node(&node, &for_deleted_nodes, &ns_deleted_nodes)
                    },
                )
                .watches_shared_stream(
                    informers.classes.subscribe(),
                    move |class: Arc<MachineClass>| {
                        machines_of_class(&class.name_any(), &for_classes)
                    },
                )
                .watches_shared_stream(
                    informers
                        .machines
                        .deletions()
                        .inspect(move |m| forget_ctx.forget_machine(m)),
                    |_: Arc<Machine>| None::<ObjectRef<Machine>>,
                ),
            (
                machine::CONTROLLER,
                machine::reconcile,
                machine::error_policy,
            ),
            ctx.clone(),
        )
    };

    // The machineclass controller: classes, the Machines using a class that is being
    // deleted, deleted Machines, and the Secrets classes reference.
    let class_ctx = Arc::new(ClassCtx::new(
        control.clone(),
        ns.clone(),
        classes.clone(),
        machines.clone(),
        informers.secrets.store(),
        ctx.synced.subscribe(),
        class_driver,
    ));
    let class_controller = {
        let (classes_for_machines, classes_for_secrets) = (classes.clone(), classes.clone());
        let (ns_m, ns_d) = (ns.clone(), ns.clone());
        runner.run(
            Controller::for_shared_stream(informers.classes.subscribe(), classes.clone())
                .watches_shared_stream(informers.machines.subscribe(), move |m: Arc<Machine>| {
                    class_being_deleted(&m, &classes_for_machines, &ns_m)
                })
                .watches_shared_stream(informers.machines.deletions(), move |m: Arc<Machine>| {
                    class_of_machine(&m, &ns_d)
                })
                .watches_shared_stream(informers.secrets.changes(), move |s: Arc<Secret>| {
                    machineclass::classes_referencing(&s, &classes_for_secrets)
                }),
            (
                machineclass::CONTROLLER,
                machineclass::reconcile,
                machineclass::error_policy,
            ),
            class_ctx.clone(),
        )
    };

    // The secret controller: labelled Secrets that no class references any more are
    // released; any class change may be the one that stopped referencing a Secret.
    let secret_controller = {
        let secrets = informers.secrets.store();
        let all_secrets = secrets.clone();
        runner.run(
            Controller::for_shared_stream(informers.secrets.subscribe(), secrets)
                .watches_shared_stream(informers.classes.changes(), move |_: Arc<MachineClass>| {
                    all_secrets
                        .state()
                        .iter()
                        .map(|s| ObjectRef::from_obj(s.as_ref()))
                        .collect::<Vec<_>>()
                }),
            (
                machineclass::SECRET_CONTROLLER,
                machineclass::reconcile_secret,
                machineclass::secret_error_policy,
            ),
            class_ctx,
        )
    };

    // Orphan collection: per class, every orphan period and on demand.
    let orphan_controller = {
        let orphan_ctx = Arc::new(OrphanCtx {
            machine: ctx.clone(),
            period: config.safety.orphan_vms_period,
        });
        runner.run(
            Controller::for_shared_stream(informers.classes.subscribe(), classes.clone())
                .reconcile_all_on(notifications(
                    handles.orphan_trigger.clone(),
                    orphans::ON_DEMAND_MIN_GAP,
                )),
            (
                orphans::CONTROLLER,
                orphans::reconcile,
                orphans::error_policy,
            ),
            orphan_ctx,
        )
    };

    // Readiness: every store this side reads has listed once.
    let synced = informers.synced();

    let apiserver_check = apiserver::run_apiserver_check(
        ctx.clone(),
        config.safety.clone(),
        cancel.clone().cancelled_owned(),
    );

    async move {
        let readiness = async {
            tokio::select! {
                _ = synced => {
                    handles.ready.store(true, Ordering::SeqCst);
                    ctx.synced.send_replace(true);
                }
                () = cancel.cancelled() => {}
            }
        };
        let controllers = async {
            futures::join!(
                machine_controller,
                class_controller,
                secret_controller,
                orphan_controller
            );
            cancel.cancel();
        };
        futures::join!(readiness, controllers, apiserver_check);
        handles.ready.store(false, Ordering::SeqCst);
    }
}

/// The Machines whose class is `class`.
fn machines_of_class(class: &str, machines: &Store<Machine>) -> Vec<ObjectRef<Machine>> {
    machines
        .state()
        .iter()
        .filter(|m| machine::observe::class_name(m).ok() == Some(class))
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// The class of a Machine.
fn class_of_machine(m: &Machine, namespace: &str) -> Option<ObjectRef<MachineClass>> {
    machine::observe::class_name(m)
        .ok()
        .map(|c| ObjectRef::new(c).within(namespace))
}

/// The class of a Machine when that class is being deleted (its finalizer waits for its
/// Machines); other Machine changes do not concern the class controller.
fn class_being_deleted(
    m: &Machine,
    classes: &Store<MachineClass>,
    namespace: &str,
) -> Option<ObjectRef<MachineClass>> {
    class_of_machine(m, namespace).filter(|r| {
        classes
            .get(r)
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_do_not_change_the_fingerprint_but_conditions_do() {
        let node = |status: &str, hb: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "n", "labels": { "a": "b" } },
                "status": { "conditions": [{ "type": "Ready", "status": status,
                    "lastHeartbeatTime": hb, "lastTransitionTime": "2026-01-01T00:00:00Z" }] }
            }))
            .unwrap()
        };
        let a = node_fingerprint(&node("True", "2026-01-01T00:00:00Z"));
        let b = node_fingerprint(&node("True", "2026-01-01T00:00:10Z"));
        let c = node_fingerprint(&node("Unknown", "2026-01-01T00:00:10Z"));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
