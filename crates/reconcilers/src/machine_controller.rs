//! Running the machine-controller side: reflectors, the machine and machineclass controllers,
//! the node-deletion watcher and the safety loops, until a cancellation token fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use mcm_api::constants::labels;
use mcm_api::{Machine, MachineClass, MachineDeployment, MachineSet};
use mcm_driver::Driver;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::machine::{self, Ctx, Freeze, MachineMetrics, Settings, Stores};
use crate::machineclass::{self, ClassCtx};
use crate::safety::{self, SafetySettings};

/// Handles to a running machine controller.
#[derive(Clone, Debug, Default)]
pub struct Handles {
    /// True once every store has synced (readiness).
    pub ready: Arc<AtomicBool>,
    /// Notify to run an orphan-collection pass now.
    pub orphan_trigger: Arc<Notify>,
    /// The freeze flag of the safety controller.
    pub freeze: Freeze,
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

fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    (reader, stream)
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

/// Runs everything until `cancel` fires. `metrics` come from [`MachineMetrics::register`].
pub async fn run(
    control: kube::Client,
    target: kube::Client,
    driver: Arc<dyn Driver>,
    config: MachineControllerConfig,
    metrics: MachineMetrics,
    handles: Handles,
    cancel: CancellationToken,
) {
    let ns = config.machine.namespace.clone();

    let (machines, machine_stream) = watched(
        Api::<Machine>::namespaced(control.clone(), &ns),
        watcher::Config::default(),
    );
    let (classes, class_stream) = watched(
        Api::<MachineClass>::namespaced(control.clone(), &ns),
        watcher::Config::default(),
    );
    let (nodes, node_stream) =
        watched(Api::<Node>::all(target.clone()), watcher::Config::default());
    let (machine_sets, set_stream) = watched(
        Api::<MachineSet>::namespaced(control.clone(), &ns),
        watcher::Config::default(),
    );
    let (machine_deployments, deployment_stream) = watched(
        Api::<MachineDeployment>::namespaced(control.clone(), &ns),
        watcher::Config::default(),
    );
    let va = mcm_drain::start_volume_attachment_reflector(target.clone());

    // Streams that only feed stores.
    let mut tasks = tokio::task::JoinSet::new();
    for s in [
        set_stream.map_ok(|_| ()).boxed(),
        deployment_stream.map_ok(|_| ()).boxed(),
    ] {
        let cancel = cancel.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = s.for_each(|_| futures::future::ready(())) => {}
                _ = cancel.cancelled() => {}
            }
        });
    }

    let mut ctx = Ctx::new(
        control.clone(),
        target.clone(),
        driver,
        config.machine.clone(),
        Stores {
            machines: machines.clone(),
            classes: classes.clone(),
            nodes: nodes.clone(),
            machine_sets: machine_sets.clone(),
            machine_deployments: machine_deployments.clone(),
        },
        va.stores(),
        handles.freeze.clone(),
        metrics,
    );
    ctx.orphan_trigger = handles.orphan_trigger.clone();
    let ctx = Arc::new(ctx);

    // Readiness: every store synced; then the orphan collector starts.
    {
        let (m, c, n, s, d) = (
            machines.clone(),
            classes.clone(),
            nodes.clone(),
            machine_sets.clone(),
            machine_deployments.clone(),
        );
        let va_stores = va.stores();
        let ready = handles.ready.clone();
        let cancel = cancel.clone();
        let orphan_ctx = ctx.clone();
        let orphan_period = config.safety.orphan_vms_period;
        let orphan_trigger = handles.orphan_trigger.clone();
        tasks.spawn(async move {
            let synced = async {
                let _ = futures::join!(
                    crate::store_ready(&m),
                    crate::store_ready(&c),
                    crate::store_ready(&n),
                    crate::store_ready(&s),
                    crate::store_ready(&d),
                    crate::store_ready(&va_stores.volume_attachments),
                );
            };
            tokio::select! {
                _ = synced => {
                    ready.store(true, Ordering::SeqCst);
                    orphan_ctx.synced.send_replace(true);
                }
                _ = cancel.cancelled() => return,
            }
            // Orphan collection needs synced stores: it starts only now.
            safety::run_orphan_collector(
                orphan_ctx,
                orphan_period,
                orphan_trigger,
                cancel.cancelled_owned(),
            )
            .await
        });
    }

    // Node deletions delete their Machine.
    {
        let ctx = ctx.clone();
        let cancel = cancel.clone();
        let ns = ns.clone();
        tasks.spawn(async move {
            let deletions = watcher(Api::<Node>::all(ctx.target.clone()), watcher::Config::default())
                .default_backoff()
                .try_filter_map(|e| async move {
                    Ok(match e {
                        watcher::Event::Delete(n) => Some(n),
                        _ => None,
                    })
                });
            let work = deletions.for_each(|node| {
                let ctx = ctx.clone();
                let ns = ns.clone();
                async move {
                    let Ok(node) = node else { return };
                    if machine::observe::node_not_managed(&node) {
                        return;
                    }
                    let Some(r) = machine_of_node(&node, &ctx.machines, &ns) else { return };
                    let Some(m) = ctx.machines.get(&r) else { return };
                    if m.metadata.deletion_timestamp.is_some() || ctx.freeze.is_frozen() {
                        return;
                    }
                    tracing::info!(node = %node.name_any(), machine = %m.name_any(), "node deleted: deleting its machine");
                    let api: Api<Machine> = Api::namespaced(ctx.control.clone(), &ns);
                    if let Err(e) = api.delete(&m.name_any(), &DeleteParams::default()).await {
                        tracing::warn!(machine = %m.name_any(), error = %e, "failed to delete the machine of a deleted node");
                    }
                }
            });
            tokio::select! {
                _ = work => {}
                _ = cancel.cancelled() => {}
            }
        });
    }

    // API-server reachability (the orphan collector starts with readiness, above).
    tasks.spawn(safety::run_apiserver_check(
        ctx.clone(),
        config.safety.clone(),
        cancel.clone().cancelled_owned(),
    ));

    // The machineclass controller.
    let class_ctx = Arc::new(ClassCtx::new(
        control.clone(),
        ns.clone(),
        classes.clone(),
        machines.clone(),
    ));
    let class_controller = {
        let class_reconciles = ctx.metrics.reconciles.clone();
        let (class_reader, class_writer) = reflector::store::<MachineClass>();
        let class_trigger = watcher(
            Api::<MachineClass>::namespaced(control.clone(), &ns),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(class_writer)
        .applied_objects();
        let machine_trigger = watcher(
            Api::<Machine>::namespaced(control.clone(), &ns),
            watcher::Config::default(),
        )
        .default_backoff()
        .touched_objects();
        let ns2 = ns.clone();
        Controller::for_stream(class_trigger, class_reader)
            .watches_stream(machine_trigger, move |m: Machine| {
                machine::observe::class_name(&m)
                    .ok()
                    .map(|c| ObjectRef::new(c).within(&ns2))
            })
            .graceful_shutdown_on(cancel.clone().cancelled_owned())
            .run(
                move |class, ctx| {
                    let reconciles = class_reconciles.clone();
                    async move {
                        reconciles
                            .time(
                                machineclass::CONTROLLER,
                                machineclass::reconcile(class, ctx),
                            )
                            .await
                    }
                },
                machineclass::error_policy,
                class_ctx,
            )
            .for_each(|_| futures::future::ready(()))
    };

    // The machine controller.
    let machine_controller = {
        let machines_for_nodes = machines.clone();
        let ns_nodes = ns.clone();
        let machines_for_classes = machines.clone();
        Controller::for_stream(machine_stream, machines.clone())
            .watches_stream(
                node_stream.predicate_filter(node_fingerprint, Default::default()),
                move |node: Node| machine_of_node(&node, &machines_for_nodes, &ns_nodes),
            )
            .watches_stream(class_stream, move |class: MachineClass| {
                let name = class.name_any();
                machines_for_classes
                    .state()
                    .iter()
                    .filter(|m| machine::observe::class_name(m).ok() == Some(name.as_str()))
                    .map(|m| ObjectRef::from_obj(m.as_ref()))
                    .collect::<Vec<_>>()
            })
            .with_config(controller::Config::default().concurrency(config.concurrent_syncs))
            .graceful_shutdown_on(cancel.clone().cancelled_owned())
            .run(machine::reconcile, machine::error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()))
    };

    futures::join!(machine_controller, class_controller);
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
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
