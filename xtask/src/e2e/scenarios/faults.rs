//! Fault scenarios: `vm-crash`, `vm-crash-budget`, `orphan-vm`, `apiserver-outage`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mcm_api::MachinePhase;
use mcm_driver::{CreateMachineRequest, Driver, IdempotencyKey, RequestId, SecretData};
use mcm_provider_local::{LocalDriver, LocalDriverConfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT, phases, record_phases};
use crate::e2e::env::{Check, wait_for};

/// `kill -9` of a VM: its Machine goes Unknown, then Failed, and is replaced; the workload
/// moves to the other nodes.
pub async fn vm_crash(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    // The drain timeout is far longer than the bound asserted below: only not waiting for
    // the pods of the dead (unreachable) node can meet it.
    let health_timeout = Duration::from_secs(20);
    let timings = Timings {
        health_timeout: "20s",
        drain_timeout: "10m",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    ctx.create_deployment("workers", 3, "local").await?;
    ctx.await_fleet(3, None).await?;
    ctx.create_workload(3, None).await?;
    ctx.await_workload(3).await?;

    let victim = busiest_node(ctx).await?;
    let record = ctx
        .state
        .read(&victim)?
        .with_context(|| format!("no VM record for {victim}"))?;
    let (recorder, log) = record_phases(ctx.machines_api());
    let began = Instant::now();
    kill(Pid::from_raw(record.pid), Signal::SIGKILL)
        .with_context(|| format!("kill -9 {}", record.pid))?;

    // The health timeout starts when the machine turns Unknown (the node lifecycle controller
    // marks the node first).
    await_unknown(ctx, &victim).await?;
    let unknown_at = Instant::now();
    wait_for(&format!("{victim} to be replaced"), WAIT * 2, || async {
        Ok(match ctx.machines_api().get_opt(&victim).await? {
            None => Check::Done(()),
            Some(m) => Check::Pending(format!(
                "{victim} is {}",
                m.phase().map_or("(none)", |p| p.as_str())
            )),
        })
    })
    .await?;
    ctx.await_fleet(3, None).await?;
    let replaced_after = unknown_at.elapsed();
    let bound = health_timeout + Duration::from_secs(30);
    ensure!(
        replaced_after <= bound,
        "{victim} was replaced {:.0}s after it turned Unknown; the bound is the health timeout + 30s ({:.0}s)",
        replaced_after.as_secs_f64(),
        bound.as_secs_f64()
    );
    ctx.await_workload(3).await?;
    // The workload moved: no live pod is bound to the crashed node any more.
    let (terminating, live): (Vec<_>, Vec<_>) = ctx
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&victim))
        .partition(|p| p.metadata.deletion_timestamp.is_some());
    ensure!(
        live.is_empty(),
        "{} live pods still bound to {victim}",
        live.len()
    );
    recorder.abort();
    let seen = phases(&log).remove(&victim).unwrap_or_default();
    let unknown = seen.iter().position(|p| p == "Unknown");
    let failed = seen.iter().position(|p| p == "Failed");
    match (unknown, failed) {
        (Some(u), Some(f)) if u < f => {}
        _ => bail!("{victim} went through {seen:?}, expected Unknown then Failed"),
    }
    let leftover = if terminating.is_empty() {
        String::new()
    } else {
        format!(
            "; {} evicted pod(s) left Terminating on the deleted node",
            terminating.len()
        )
    };
    Ok(format!(
        "{victim} (pid {}): {} -> replaced {:.0}s after turning Unknown (health timeout 20s), workload back to 3 in {:.0}s{leftover}",
        record.pid,
        seen.join(" -> "),
        replaced_after.as_secs_f64(),
        began.elapsed().as_secs_f64()
    ))
}

/// `kill -9` of a VM whose Node holds two pods of a workload under a PodDisruptionBudget that
/// the dead pods keep at its limit, with a drain timeout of hours: the drain deletes the dead
/// pods instead of evicting them (the budget would refuse every eviction until the timeout),
/// so the old machine and its pods are gone within the health timeout + 30 s of the machine
/// turning Unknown; every pod that still runs is left alone (the budget is honoured), and the
/// Machine's Event says why the drain did not evict.
pub async fn vm_crash_budget(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    let health_timeout = Duration::from_secs(20);
    let timings = Timings {
        health_timeout: "20s",
        drain_timeout: "2h",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    ctx.create_deployment("workers", 2, "local").await?;
    ctx.await_fleet(2, None).await?;
    // Four pods on two Nodes, at least 3 available: with two pods on the dead Node the budget
    // allows no eviction at all.
    ctx.create_workload(4, Some(3)).await?;
    ctx.await_workload(4).await?;

    let victim = busiest_node(ctx).await?;
    let pods = ctx.pods().await?;
    let on = |node: &str, p: &k8s_openapi::api::core::v1::Pod| {
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
    };
    let dead = pods.iter().filter(|p| on(&victim, p)).count();
    ensure!(
        dead >= 2,
        "{victim} holds {dead} workload pod(s); the scenario needs two under the budget"
    );
    // The pods that keep running: none of them may be evicted or deleted.
    let running: BTreeSet<String> = pods
        .iter()
        .filter(|p| !on(&victim, p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let record = ctx
        .state
        .read(&victim)?
        .with_context(|| format!("no VM record for {victim}"))?;
    kill(Pid::from_raw(record.pid), Signal::SIGKILL)
        .with_context(|| format!("kill -9 {}", record.pid))?;
    await_unknown(ctx, &victim).await?;
    let unknown_at = Instant::now();
    let bound = health_timeout + Duration::from_secs(30);
    // Waited for a little longer than the bound, so that a miss is measured, not cut short.
    wait_for(
        &format!("{victim} and its pods to be gone"),
        bound + Duration::from_secs(60),
        || async {
            let machine = ctx.machines_api().get_opt(&victim).await?;
            let left = ctx
                .pods()
                .await?
                .into_iter()
                .filter(|p| on(&victim, p))
                .count();
            Ok(match (machine, left) {
                (None, 0) => Check::Done(()),
                (m, left) => Check::Pending(format!(
                    "{victim} is {}, {left} pod(s) bound to it; lastOperation: {}",
                    m.as_ref()
                        .and_then(|m| m.phase())
                        .map_or("gone", |p| p.as_str()),
                    m.as_ref()
                        .and_then(|m| m.status.as_ref())
                        .and_then(|s| s.last_operation.as_ref())
                        .and_then(|o| o.description.clone())
                        .unwrap_or_default()
                )),
            })
        },
    )
    .await?;
    let gone_after = unknown_at.elapsed();
    ensure!(
        gone_after <= bound,
        "{victim} and its pods were gone {:.0}s after it turned Unknown; the bound is the \
         health timeout + 30s ({:.0}s)",
        gone_after.as_secs_f64(),
        bound.as_secs_f64()
    );
    // Why the drain did not evict, in the Machine's Events.
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(ctx.client.clone(), &ctx.ns);
    let why = events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(victim.as_str()))
        .filter_map(|e| e.message)
        .find(|m| m.contains("not evicted"))
        .with_context(|| format!("no Event of {victim} says why its pods were not evicted"))?;
    ctx.await_fleet(2, None).await?;
    ctx.await_workload(4).await?;
    // The budget was honoured: every pod that ran elsewhere still runs, never deleted.
    let now: BTreeSet<String> = ctx
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid)
        .collect();
    let disrupted: Vec<&String> = running.difference(&now).collect();
    ensure!(
        disrupted.is_empty(),
        "running pods were disrupted: {disrupted:?}"
    );
    Ok(format!(
        "{victim} with {dead} budgeted pods: machine and pods gone {:.0}s after it turned \
         Unknown (health timeout 20s, drain timeout 2h); {} running pod(s) left alone; \
         Event: {why}",
        gone_after.as_secs_f64(),
        running.len()
    ))
}

/// Waits until the machine `victim` (its VM just killed) turns Unknown.
async fn await_unknown(ctx: &Ctx<'_>, victim: &str) -> Result<()> {
    wait_for(&format!("{victim} to turn Unknown"), WAIT, || async {
        Ok(match ctx.machines_api().get_opt(victim).await? {
            Some(m) if m.phase() == Some(&MachinePhase::Unknown) => Check::Done(()),
            None => bail!("{victim} vanished before it turned Unknown"),
            Some(m) => Check::Pending(format!(
                "{victim} is {}",
                m.phase().map_or("(none)", |p| p.as_str())
            )),
        })
    })
    .await
}

/// The Node (= machine name) with the most workload pods.
async fn busiest_node(ctx: &Ctx<'_>) -> Result<String> {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for p in ctx.pods().await? {
        if let Some(n) = p.spec.and_then(|s| s.node_name) {
            *counts.entry(n).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(node, _)| node)
        .context("no workload pod is bound to a node")
}

/// A VM started behind the controller's back (same class, same state directory) is found and
/// deleted; the VM of the scenario's Machine is kept.
pub async fn orphan_vm(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    let timings = Timings {
        orphan_period: "5s",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    ctx.create_deployment("workers", 1, "local").await?;
    let kept = ctx.await_fleet(1, None).await?;
    let kept = kept[0].metadata.name.clone().unwrap_or_default();

    let stray = format!("stray-{}", ctx.ns);
    let driver = LocalDriver::new(LocalDriverConfig {
        node_binary: ctx.bins().local_node.clone(),
    });
    let class = mcm_api_class(ctx).await?;
    let kubeconfig = ctx.kubeconfig()?;
    driver
        .create_machine(CreateMachineRequest {
            machine: mcm_api::Machine::new(&stray, Default::default()),
            machine_class: class,
            secret: SecretData::from_pairs([("kubeconfig", kubeconfig.as_str())]),
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
        .await
        .map_err(|e| anyhow::anyhow!("starting the stray VM: {}", e.full_message()))?;
    ensure!(
        ctx.vm_records().contains(&stray),
        "the stray VM has no record"
    );
    let began = Instant::now();
    wait_for("the orphan VM to be collected", WAIT, || async {
        let records = ctx.vm_records();
        let procs = ctx.vm_process_count();
        Ok(if !records.contains(&stray) && procs == 1 {
            Check::Done(())
        } else {
            Check::Pending(format!("records {records:?}, {procs} VM processes"))
        })
    })
    .await?;
    ensure!(
        ctx.vm_records() == vec![kept.clone()],
        "the VM of {kept} must be kept: {:?}",
        ctx.vm_records()
    );
    // The Node the stray VM registered goes with it (it would stay NotReady for ever).
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(ctx.client.clone());
    wait_for("the orphan VM's node to be deleted", WAIT, || async {
        Ok(match nodes.get_opt(&stray).await? {
            None => Check::Done(()),
            Some(_) => Check::Pending(format!("node {stray} still exists")),
        })
    })
    .await?;
    ensure!(
        nodes.get_opt(&kept).await?.is_some(),
        "the node of {kept} must be kept"
    );
    Ok(format!(
        "{stray} and its node collected after {:.0}s (orphan period 5s); {kept} kept",
        began.elapsed().as_secs_f64()
    ))
}

async fn mcm_api_class(ctx: &Ctx<'_>) -> Result<mcm_api::MachineClass> {
    kube::Api::<mcm_api::MachineClass>::namespaced(ctx.client.clone(), &ctx.ns)
        .get("local")
        .await
        .context("reading MachineClass local")
}

/// Status-check timeout of the outage scenario.
const STATUSCHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// Health timeout of the outage scenario: shorter than the outage.
const OUTAGE_HEALTH_TIMEOUT: &str = "15s";
/// How long the outage lasts after the freeze: longer than the health timeout.
const OUTAGE_AFTER_FREEZE: Duration = Duration::from_secs(20);

/// The machine controller reaches the target API server through a proxy that is cut past the
/// status-check timeout: it freezes (`mcm_machine_controller_frozen` 1), no machine fails;
/// restored, it unfreezes and the machines are healthy.
pub async fn apiserver_outage(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    let (proxy, via_proxy) = ctx.proxied_kubeconfig("target-via-proxy.kubeconfig")?;
    let timings = Timings {
        health_timeout: OUTAGE_HEALTH_TIMEOUT,
        statuscheck_timeout: "10s",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, Some(via_proxy)).await?;
    ctx.create_deployment("workers", 2, "local").await?;
    let before = names(&ctx.await_fleet(2, None).await?);
    await_frozen(ctx, 0.0).await?;

    let (recorder, log) = record_phases(ctx.machines_api());
    proxy.cut().await;
    let cut_at = Instant::now();
    await_frozen(ctx, 1.0).await?;
    let froze_after = cut_at.elapsed();
    ensure!(
        froze_after >= STATUSCHECK_TIMEOUT,
        "frozen after {froze_after:?}, before the status-check timeout"
    );
    // A measurement window: the outage goes on past the health timeout; nothing may fail.
    tokio::time::sleep(OUTAGE_AFTER_FREEZE).await;
    let failed_during = failed_machines(&log);
    proxy.restore()?;
    let restored_at = Instant::now();
    await_frozen(ctx, 0.0).await?;
    let unfroze_after = restored_at.elapsed();
    let after = names(&ctx.await_fleet(2, None).await?);
    recorder.abort();
    ensure!(
        failed_during.is_empty(),
        "machines Failed during the outage: {failed_during:?}"
    );
    ensure!(
        before == after,
        "machines were replaced: {before:?} -> {after:?}"
    );
    let failed = failed_machines(&log);
    ensure!(failed.is_empty(), "machines Failed: {failed:?}");
    Ok(format!(
        "frozen {:.0}s after the cut, outage {:.0}s, unfrozen {:.0}s after the restore; no machine failed",
        froze_after.as_secs_f64(),
        restored_at.duration_since(cut_at).as_secs_f64(),
        unfroze_after.as_secs_f64()
    ))
}

fn names(machines: &[mcm_api::Machine]) -> BTreeSet<String> {
    machines
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect()
}

fn failed_machines(log: &crate::e2e::ctx::PhaseLog) -> Vec<String> {
    phases(log)
        .into_iter()
        .filter(|(_, p)| p.iter().any(|x| x == "Failed"))
        .map(|(m, _)| m)
        .collect()
}

/// Waits until `mcm_machine_controller_frozen` on the machine controller equals `want`.
async fn await_frozen(ctx: &Ctx<'_>, want: f64) -> Result<()> {
    let mc = ctx.machine_controller()?;
    wait_for(
        &format!("mcm_machine_controller_frozen to be {want}"),
        Duration::from_secs(60),
        || async {
            Ok(match mc.metric("mcm_machine_controller_frozen").await {
                Some(v) if v == want => Check::Done(()),
                v => Check::Pending(format!("{v:?}")),
            })
        },
    )
    .await
}
