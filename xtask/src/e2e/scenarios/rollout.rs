//! Rollout scenarios: `rolling-update` (PDB never violated) and `controller-restart`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::watcher;
use mcm_api::Machine;
use mcm_api::constants::{annotations, taints};
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT, class_of};
use crate::e2e::env::{Check, wait_for};

/// Replicas of the MachineDeployment and of the workload.
const REPLICAS: i32 = 3;
/// `minAvailable` of the workload's PodDisruptionBudget.
const MIN_AVAILABLE: i32 = 2;

/// What the watches saw during a rollout.
#[derive(Debug, Default, Clone)]
struct Observed {
    /// PDB events with currentHealthy < desiredHealthy.
    pdb_violations: Vec<String>,
    /// PDB events seen.
    pdb_events: usize,
    /// The lowest availableReplicas of the workload.
    min_available: Option<i32>,
    /// The most Machines not being deleted at once.
    max_machines: usize,
    /// Old nodes seen with the PreferNoSchedule taint of a rollout.
    tainted_old_nodes: BTreeSet<String>,
    /// Nodes seen with the cluster-autoscaler scale-down-disabled annotation of MCM.
    annotated_nodes: BTreeSet<String>,
}

/// Whether a node carries MCM's autoscaler scale-down-disabled annotation.
fn autoscaler_annotated(node: &Node) -> bool {
    node.metadata.annotations.as_ref().is_some_and(|a| {
        a.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM)
            && a.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED)
    })
}

/// Watches the PDB, the workload and the Machines until dropped.
struct Watches {
    seen: Arc<Mutex<Observed>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

impl Watches {
    fn start(ctx: &Ctx<'_>, old_nodes: BTreeSet<String>) -> Watches {
        let seen: Arc<Mutex<Observed>> = Default::default();
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        let tasks = vec![
            tokio::spawn(watch_each(pdbs, seen.clone(), |o, pdb| {
                let s = pdb.status.unwrap_or_default();
                o.pdb_events += 1;
                if let (Some(current), Some(desired)) = (s.current_healthy, s.desired_healthy)
                    && current < desired
                {
                    o.pdb_violations.push(format!(
                        "currentHealthy {current} < desiredHealthy {desired}"
                    ));
                }
            })),
            tokio::spawn(watch_each(deployments, seen.clone(), |o, d| {
                let a = d.status.and_then(|s| s.available_replicas).unwrap_or(0);
                o.min_available = Some(o.min_available.map_or(a, |m| m.min(a)));
            })),
            tokio::spawn(count_machines(ctx.machines_api(), seen.clone())),
            tokio::spawn(watch_each(
                Api::<Node>::all(ctx.client.clone()),
                seen.clone(),
                move |o, n| {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    let tainted =
                        n.spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_some_and(|t| {
                                t.iter().any(|t| {
                                    t.key == taints::PREFER_NO_SCHEDULE
                                        && t.effect == "PreferNoSchedule"
                                })
                            });
                    if tainted && old_nodes.contains(&name) {
                        o.tainted_old_nodes.insert(name.clone());
                    }
                    if autoscaler_annotated(&n) {
                        o.annotated_nodes.insert(name);
                    }
                },
            )),
        ];
        Watches { seen, tasks }
    }

    fn observed(&self) -> Observed {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Calls `f` on every object event of a watch.
async fn watch_each<K, F>(api: Api<K>, seen: Arc<Mutex<Observed>>, f: F)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&mut Observed, K),
{
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if let Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = ev {
            f(&mut seen.lock().unwrap_or_else(|e| e.into_inner()), obj);
        }
    }
}

/// Tracks the number of Machines without a deletion timestamp.
async fn count_machines(api: Api<Machine>, seen: Arc<Mutex<Observed>>) {
    let mut live: BTreeMap<String, bool> = BTreeMap::new();
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                let alive = m.metadata.deletion_timestamp.is_none();
                live.insert(m.metadata.name.unwrap_or_default(), alive);
            }
            Ok(watcher::Event::Delete(m)) => {
                live.remove(&m.metadata.name.unwrap_or_default());
            }
            _ => continue,
        }
        let n = live.values().filter(|a| **a).count();
        let mut o = seen.lock().unwrap_or_else(|e| e.into_inner());
        o.max_machines = o.max_machines.max(n);
    }
}

/// With the workload and its PDB running, the MachineDeployment moves to a class with other
/// node labels (maxSurge 1, maxUnavailable 0): the PDB is never violated, the workload keeps
/// its minimum, old machines go and new ones run.
pub async fn rolling_update(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("old", json!({ "pool": "old" })).await?;
    ctx.create_class("new", json!({ "pool": "new" })).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.create_deployment("workers", REPLICAS, "old").await?;
    let old: BTreeSet<String> = names(&ctx.await_fleet(REPLICAS as usize, None).await?);
    ctx.create_workload(REPLICAS, Some(MIN_AVAILABLE)).await?;
    ctx.await_workload(REPLICAS).await?;
    await_pdb_healthy(ctx).await?;

    let watches = Watches::start(ctx, old.clone());
    let began = Instant::now();
    ctx.patch_deployment("workers", class_patch("new")).await?;
    let new = names(&ctx.await_fleet(REPLICAS as usize, Some("new")).await?);
    ctx.await_workload(REPLICAS).await?;
    let took = began.elapsed();
    let o = watches.observed();
    drop(watches);

    ensure!(
        o.pdb_violations.is_empty(),
        "the PDB was violated: {:?}",
        o.pdb_violations
    );
    ensure!(o.pdb_events > 0, "no PDB event was seen");
    let min = o.min_available.context("no workload event was seen")?;
    ensure!(
        min >= MIN_AVAILABLE,
        "the workload fell to {min} available pods (minimum {MIN_AVAILABLE})"
    );
    ensure!(
        old.is_disjoint(&new),
        "old machines survived the rollout: {:?}",
        old.intersection(&new).collect::<Vec<_>>()
    );
    ensure!(
        o.max_machines <= (REPLICAS + 1) as usize,
        "{} machines at once with maxSurge 1",
        o.max_machines
    );
    // During the rollout the old nodes were marked PreferNoSchedule and the nodes protected
    // from the autoscaler; afterwards MCM's annotations are gone from the remaining nodes.
    ensure!(
        !o.tainted_old_nodes.is_empty(),
        "no old node got the {} taint during the rollout",
        taints::PREFER_NO_SCHEDULE
    );
    ensure!(
        !o.annotated_nodes.is_empty(),
        "no node got the cluster-autoscaler scale-down-disabled annotation during the rollout"
    );
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    wait_for(
        "MCM's autoscaler annotations to be removed after the rollout",
        WAIT,
        || {
            let nodes = nodes.clone();
            let new = new.clone();
            async move {
                let mut annotated = Vec::new();
                for name in &new {
                    if let Some(n) = nodes.get_opt(name).await?
                        && autoscaler_annotated(&n)
                    {
                        annotated.push(name.clone());
                    }
                }
                Ok(if annotated.is_empty() {
                    Check::Done(())
                } else {
                    Check::Pending(format!("still annotated: {annotated:?}"))
                })
            }
        },
    )
    .await?;
    Ok(format!(
        "rolled in {:.0}s; {} PDB events, none violated; workload >= {min} available; at most {} machines; {} old node(s) tainted, annotations removed after",
        took.as_secs_f64(),
        o.pdb_events,
        o.max_machines,
        o.tainted_old_nodes.len()
    ))
}

fn class_patch(class: &str) -> serde_json::Value {
    json!({ "spec": { "template": { "spec": { "class": { "name": class } } } } })
}

fn names(machines: &[Machine]) -> BTreeSet<String> {
    machines
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect()
}

/// Waits until the PDB `web` has every pod healthy.
async fn await_pdb_healthy(ctx: &Ctx<'_>) -> Result<()> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for("the PDB to count every pod healthy", WAIT, || async {
        let s = api.get("web").await?.status.unwrap_or_default();
        Ok(
            if s.current_healthy == Some(REPLICAS) && s.desired_healthy == Some(MIN_AVAILABLE) {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "currentHealthy {:?}, desiredHealthy {:?}",
                    s.current_healthy, s.desired_healthy
                ))
            },
        )
    })
    .await
}

/// The machine controller is SIGKILLed right after the rollout created its first new
/// Machine, and restarted: the rollout finishes and no VM leaks.
pub async fn controller_restart(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("a", json!({ "pool": "a" })).await?;
    ctx.create_class("b", json!({ "pool": "b" })).await?;
    let timings = Timings::default();
    ctx.start_controllers(&timings, None).await?;
    ctx.create_deployment("workers", REPLICAS, "a").await?;
    ctx.await_fleet(REPLICAS as usize, None).await?;

    ctx.patch_deployment("workers", class_patch("b")).await?;
    let first_new = wait_for("the rollout to create a Machine", WAIT, || async {
        let machines = ctx.machines().await?;
        Ok(machines
            .iter()
            .find(|m| class_of(m) == "b")
            .and_then(|m| m.metadata.name.clone())
            .map_or_else(|| Check::Pending("no new machine".into()), Check::Done))
    })
    .await?;
    let pid = ctx.kill_machine_controller()?;
    let phase = ctx
        .machines_api()
        .get(&first_new)
        .await?
        .phase()
        .map_or("(none)".to_string(), |p| p.as_str().to_string());
    ctx.start_machine_controller(&timings, None).await?;

    let machines = ctx.await_fleet(REPLICAS as usize, Some("b")).await?;
    let records: BTreeSet<String> = ctx.vm_records().into_iter().collect();
    ensure!(
        records == names(&machines),
        "VM records {records:?} != machines {:?}",
        names(&machines)
    );
    ensure!(
        ctx.vm_process_count() == REPLICAS as usize,
        "{} VM processes for {REPLICAS} machines",
        ctx.vm_process_count()
    );
    Ok(format!(
        "killed pid {pid} when {first_new} was {phase}; rollout finished, {REPLICAS} VMs == {REPLICAS} machines"
    ))
}
