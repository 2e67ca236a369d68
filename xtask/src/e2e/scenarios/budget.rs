//! The `disruption-budget` scenario: a rollout whose strategy would replace two machines at
//! once is held to one at a time by a MachineDisruptionBudget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Result, ensure};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use mcm_api::{Machine, MachineDisruptionBudget};
use serde_json::json;

use crate::e2e::ctx::{Ctx, WAIT, is_running};
use crate::e2e::env::{Check, wait_for};

/// Replicas of the MachineDeployment.
const REPLICAS: usize = 3;

/// What the watches saw during the rollout.
#[derive(Debug, Default, Clone)]
struct Observed {
    /// The most selected Machines being deleted at once.
    max_deleting: usize,
    /// The fewest Running Machines not being deleted (once the rollout began).
    min_running: Option<usize>,
    /// Machine events seen.
    events: usize,
    /// The budget was seen exhausted (`disruptionsAllowed: 0`, reason `BudgetExhausted`).
    exhausted_seen: bool,
}

/// Tracks deleting and running Machines on every watch event.
async fn watch_machines(api: Api<Machine>, seen: Arc<Mutex<Observed>>) {
    let mut state: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut listed = false;
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            // Counts are taken on complete states only, not while the first list arrives.
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                let deleting = m.metadata.deletion_timestamp.is_some();
                let running = is_running(&m) && !deleting;
                state.insert(
                    m.metadata.name.clone().unwrap_or_default(),
                    (deleting, running),
                );
            }
            Ok(watcher::Event::Delete(m)) => {
                state.remove(&m.metadata.name.unwrap_or_default());
            }
            _ => continue,
        }
        if !listed {
            continue;
        }
        let deleting = state.values().filter(|(d, _)| *d).count();
        let running = state.values().filter(|(_, r)| *r).count();
        let mut o = seen.lock().unwrap_or_else(|e| e.into_inner());
        o.events += 1;
        o.max_deleting = o.max_deleting.max(deleting);
        o.min_running = Some(o.min_running.map_or(running, |m| m.min(running)));
    }
}

/// Notes whether the budget is ever seen exhausted.
async fn watch_budget(api: Api<MachineDisruptionBudget>, seen: Arc<Mutex<Observed>>) {
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if let Ok(watcher::Event::Apply(b) | watcher::Event::InitApply(b)) = ev {
            let st = b.status.unwrap_or_default();
            let exhausted = st.disruptions_allowed == Some(0)
                && st.conditions.iter().flatten().any(|c| {
                    c.reason.as_deref()
                        == Some(mcm_api::disruption_budget::condition_reasons::BUDGET_EXHAUSTED)
                });
            if exhausted {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .exhausted_seen = true;
            }
        }
    }
}

/// A MachineDeployment of 3 machines with maxSurge 3 / maxUnavailable 2 and a budget
/// `maxUnavailable: 1` over its machines; a template change: at most one machine is deleted
/// at a time, at least 2 keep running, and the rollout finishes.
pub async fn disruption_budget(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("old", json!({ "pool": "old" })).await?;
    ctx.create_class("new", json!({ "pool": "new" })).await?;
    ctx.start_controllers(&Default::default(), None).await?;
    ctx.apply(&json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": { "name": "workers" },
        "spec": {
            "replicas": REPLICAS,
            "selector": { "matchLabels": { "deployment": "workers" } },
            "strategy": { "type": "RollingUpdate",
                          "rollingUpdate": { "maxSurge": 3, "maxUnavailable": 2 } },
            "template": {
                "metadata": { "labels": { "deployment": "workers" } },
                "spec": { "class": { "kind": "MachineClass", "name": "old" } },
            },
        },
    }))
    .await?;
    ctx.await_fleet(REPLICAS, None).await?;
    ctx.apply(&json!({
        "apiVersion": "policy.mcm-rs.io/v1alpha1", "kind": "MachineDisruptionBudget",
        "metadata": { "name": "workers" },
        "spec": {
            "selector": { "matchLabels": { "deployment": "workers" } },
            "maxUnavailable": 1,
        },
    }))
    .await?;
    let budgets: Api<MachineDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for("the budget to allow 1 disruption", WAIT, || async {
        let st = budgets.get("workers").await?.status.unwrap_or_default();
        Ok(
            if st.disruptions_allowed == Some(1) && st.expected_machines == Some(3) {
                Check::Done(())
            } else {
                Check::Pending(format!("status {st:?}"))
            },
        )
    })
    .await?;

    let seen: Arc<Mutex<Observed>> = Default::default();
    let tasks = [
        tokio::spawn(watch_machines(ctx.machines_api(), seen.clone())),
        tokio::spawn(watch_budget(budgets.clone(), seen.clone())),
    ];
    let began = Instant::now();
    ctx.patch_deployment(
        "workers",
        json!({ "spec": { "template": { "spec": { "class": { "name": "new" } } } } }),
    )
    .await?;
    let finished = ctx.await_fleet(REPLICAS, Some("new")).await;
    let took = began.elapsed();
    tasks.iter().for_each(|t| t.abort());
    finished?;
    let o = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();

    ensure!(o.events > 0, "no Machine event was seen");
    ensure!(
        o.max_deleting <= 1,
        "{} machines were being deleted at once under maxUnavailable: 1",
        o.max_deleting
    );
    let min_running = o.min_running.unwrap_or(0);
    ensure!(
        min_running + 1 >= REPLICAS,
        "only {min_running} machines kept running during the rollout"
    );
    ensure!(
        o.exhausted_seen,
        "the budget was never seen exhausted: it did not hold the rollout back"
    );
    let running = ctx
        .machines()
        .await?
        .iter()
        .filter(|m| is_running(m))
        .count();
    Ok(format!(
        "rolled in {:.0}s; at most {} machine deleting at once, >= {min_running} running, budget exhausted while it held the rollout; {running} running after",
        took.as_secs_f64(),
        o.max_deleting,
    ))
}
