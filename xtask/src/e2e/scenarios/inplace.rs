//! The `in-place-update` scenario: strategy `InPlaceUpdate` with the local VMs as node agents.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use mcm_api::{Machine, MachinePhase, MachineSet};
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT, phases, record_phases};
use crate::e2e::env::{Check, wait_for};

const SELECTED: &str = "node.machine.sapcloud.io/selected-for-update";

/// An in-place deployment of `replicas` machines of `class`, `Auto`, maxUnavailable 1.
fn deployment(name: &str, replicas: i32, class: &str) -> serde_json::Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "deployment": name } },
            "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": {
                "maxSurge": 0, "maxUnavailable": 1, "orchestrationType": "Auto" } },
            "template": {
                "metadata": { "labels": { "deployment": name } },
                "spec": { "class": { "kind": "MachineClass", "name": class } },
            },
        },
    })
}

/// The most Nodes of the scenario selected for update at the same time, from every watch
/// event.
fn watch_selected(api: Api<Node>) -> (tokio::task::JoinHandle<()>, Arc<Mutex<usize>>) {
    let most = Arc::new(Mutex::new(0usize));
    let seen = most.clone();
    let task = tokio::spawn(async move {
        let mut selected: BTreeSet<String> = BTreeSet::new();
        let stream = watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev {
                if n.labels().contains_key(SELECTED) {
                    selected.insert(n.name_any());
                } else {
                    selected.remove(&n.name_any());
                }
                let mut m = seen.lock().unwrap_or_else(|e| e.into_inner());
                *m = (*m).max(selected.len());
            }
        }
    });
    (task, most)
}

fn owner(m: &Machine) -> String {
    mcm_api::owner::controller_of(&m.metadata)
        .map(|o| o.name.clone())
        .unwrap_or_default()
}

/// Two in-place deployments get a new class and node template: `good` (3 machines) is updated where
/// its machines stand — the same Machines and VM processes end up in the new MachineSet, one
/// node selected at a time, with the new node labels; `bad` (its VM reports the update as
/// failed) goes InPlaceUpdateFailed, then Failed after the health timeout, and is replaced by
/// a fresh machine of the new set.
pub async fn in_place_update(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("v", json!({})).await?;
    ctx.create_class("v2", json!({})).await?;
    let mut failing = ctx.class_body("failing", json!({}));
    failing["providerSpec"]["failInPlaceUpdate"] = json!(true);
    ctx.apply(&failing).await?;
    let timings = Timings {
        health_timeout: "10s",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    ctx.apply(&deployment("good", 3, "v")).await?;
    ctx.apply(&deployment("bad", 1, "failing")).await?;
    let before = ctx.await_fleet(4, None).await?;
    ctx.create_workload(3, None).await?;
    ctx.await_workload(3).await?;
    let pids: BTreeMap<String, i32> = before
        .iter()
        .map(|m| {
            let pid = ctx
                .state
                .read(&m.name_any())
                .ok()
                .flatten()
                .map_or(0, |r| r.pid);
            (m.name_any(), pid)
        })
        .collect();
    let good: BTreeSet<String> = before
        .iter()
        .filter(|m| m.labels().get("deployment").map(String::as_str) == Some("good"))
        .map(|m| m.name_any())
        .collect();
    let bad = before
        .iter()
        .find(|m| m.labels().get("deployment").map(String::as_str) == Some("bad"))
        .map(|m| m.name_any())
        .context("the bad machine")?;

    let (watch, most_selected) = watch_selected(Api::all(ctx.client.clone()));
    let (recorder, log) = record_phases(ctx.machines_api());
    let began = Instant::now();
    // A new class is a new MachineSet (as upstream, a node template change alone is written
    // into the existing set, not rolled out); the node template comes with it.
    let template = |class: &str| {
        json!({"spec": {"template": {"spec": {
            "class": {"kind": "MachineClass", "name": class},
            "nodeTemplate": {"metadata": {"labels": {"version": "v2"}}}
        }}}})
    };
    ctx.patch_deployment("good", template("v2")).await?;
    ctx.patch_deployment("bad", template("v2")).await?;

    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    wait_for("the good machines updated in place", WAIT * 2, || async {
        let machines = ctx.machines().await?;
        let mine: Vec<&Machine> = machines.iter().filter(|m| good.contains(&m.name_any())).collect();
        let mut new_set = None;
        for s in sets.list(&Default::default()).await?.items {
            let name = s.name_any();
            let of_good = s.labels().get("deployment").map(String::as_str) == Some("good");
            let is_new = s
                .spec
                .template
                .as_ref()
                .and_then(|t| t.spec.as_ref())
                .and_then(|t| t.node_template.as_ref())
                .is_some();
            if of_good && is_new {
                new_set = Some(name);
            }
        }
        let Some(new_set) = new_set else {
            return Ok(Check::Pending("no new set yet".into()));
        };
        let moved = mine.iter().filter(|m| owner(m) == new_set).count();
        let running = mine.iter().filter(|m| m.phase() == Some(&MachinePhase::Running)).count();
        let mut labelled = 0;
        for m in &mine {
            if let Some(n) = nodes.get_opt(&m.name_any()).await?
                && n.labels().get("version").map(String::as_str) == Some("v2")
                && n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
            {
                labelled += 1;
            }
        }
        Ok(if mine.len() == 3 && moved == 3 && running == 3 && labelled == 3 {
            Check::Done(())
        } else {
            Check::Pending(format!(
                "{} of the 3 machines left, {moved} in {new_set}, {running} Running, {labelled} nodes with version=v2 and schedulable",
                mine.len()
            ))
        })
    })
    .await?;
    let updated_after = began.elapsed();
    // The same VMs: no machine of `good` was recreated.
    for name in &good {
        let pid = ctx.state.read(name)?.map_or(0, |r| r.pid);
        ensure!(
            pid == pids[name],
            "the VM of {name} changed: pid {} -> {pid}",
            pids[name]
        );
    }
    // `bad` failed its update and was replaced.
    wait_for(&format!("{bad} to be replaced"), WAIT * 2, || async {
        let machines = ctx.machines().await?;
        let of_bad: Vec<&Machine> = machines
            .iter()
            .filter(|m| m.labels().get("deployment").map(String::as_str) == Some("bad"))
            .collect();
        let replaced = of_bad.len() == 1
            && of_bad[0].name_any() != bad
            && of_bad[0].phase() == Some(&MachinePhase::Running);
        Ok(if replaced {
            Check::Done(())
        } else {
            Check::Pending(format!(
                "bad machines: {:?}",
                of_bad
                    .iter()
                    .map(|m| format!("{} {}", m.name_any(), m.phase().map_or("-", |p| p.as_str())))
                    .collect::<Vec<_>>()
            ))
        })
    })
    .await?;
    ctx.await_workload(3).await?;
    recorder.abort();
    watch.abort();
    let seen = phases(&log);
    let bad_phases = seen.get(&bad).cloned().unwrap_or_default();
    for p in ["InPlaceUpdating", "InPlaceUpdateFailed", "Failed"] {
        ensure!(
            bad_phases.iter().any(|x| x == p),
            "{bad} went through {bad_phases:?}, not {p}"
        );
    }
    let good_phases: Vec<String> = good
        .iter()
        .map(|n| seen.get(n).cloned().unwrap_or_default().join(" -> "))
        .collect();
    ensure!(
        good.iter().all(|n| seen
            .get(n)
            .is_some_and(|p| p.iter().any(|x| x == "InPlaceUpdateSuccessful"))),
        "the good machines went through {good_phases:?}"
    );
    let most = *most_selected.lock().unwrap_or_else(|e| e.into_inner());
    ensure!(
        most <= 2,
        "{most} nodes were selected at once (maxUnavailable 1 per deployment)"
    );
    Ok(format!(
        "3 machines updated in place in {:.0}s (same names and VM processes, now in the new set, nodes labelled version=v2, at most {most} node(s) selected at once over both deployments); {bad}: {} and replaced",
        updated_after.as_secs_f64(),
        bad_phases.join(" -> ")
    ))
}
