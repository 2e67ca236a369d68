//! The `preserve` scenario: machine preservation with `autoPreserveFailedMachineMax`.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use mcm_api::{Machine, MachinePhase};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT};
use crate::e2e::env::{Check, wait_for};

const PRESERVE: &str = "node.machine.sapcloud.io/preserve";

fn kill_vm(ctx: &Ctx<'_>, machine: &str) -> Result<i32> {
    let record = ctx
        .state
        .read(machine)?
        .with_context(|| format!("no VM record for {machine}"))?;
    kill(Pid::from_raw(record.pid), Signal::SIGKILL)
        .with_context(|| format!("kill -9 {}", record.pid))?;
    Ok(record.pid)
}

async fn await_machine(
    ctx: &Ctx<'_>,
    name: &str,
    what: &str,
    pred: impl Fn(&Machine) -> bool,
) -> Result<Machine> {
    wait_for(&format!("{name}: {what}"), WAIT, || async {
        Ok(match ctx.machines_api().get_opt(name).await? {
            Some(m) if pred(&m) => Check::Done(m),
            Some(m) => Check::Pending(format!(
                "{name} is {}, expiry {:?}, annotation {:?}",
                m.phase().map_or("(none)", |p| p.as_str()),
                mcm_api::preservation::expiry(&m),
                m.annotations().get(PRESERVE)
            )),
            None => Check::Pending(format!("{name} is gone")),
        })
    })
    .await
}

async fn await_gone(ctx: &Ctx<'_>, name: &str) -> Result<()> {
    wait_for(&format!("{name} to be replaced"), WAIT, || async {
        Ok(match ctx.machines_api().get_opt(name).await? {
            None => Check::Done(()),
            Some(m) => Check::Pending(format!(
                "{name} is {}",
                m.phase().map_or("(none)", |p| p.as_str())
            )),
        })
    })
    .await
}

/// Two VMs of a deployment with `autoPreserveFailedMachineMax: 1` crash: the first Failed
/// machine is auto-preserved (kept with its tainted, drained Node; no replacement), the second
/// is replaced; `preserve=false` on the first releases it and it is replaced too.
pub async fn preserve(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    let timings = Timings {
        health_timeout: "15s",
        drain_timeout: "10m",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    ctx.create_deployment("workers", 3, "local").await?;
    ctx.patch_deployment(
        "workers",
        json!({"spec": {"autoPreserveFailedMachineMax": 1}}),
    )
    .await?;
    let fleet = ctx.await_fleet(3, None).await?;
    let first = fleet[0].name_any();
    let second = fleet[1].name_any();
    let began = Instant::now();

    // The first crash: Failed, auto-preserved, kept.
    kill_vm(ctx, &first)?;
    let m = await_machine(ctx, &first, "auto-preserved and Failed", |m| {
        m.phase() == Some(&MachinePhase::Failed)
            && mcm_api::preservation::expiry(m).is_some()
            && m.annotations().get(PRESERVE).map(String::as_str) == Some("auto-preserved")
    })
    .await?;
    let preserved_after = began.elapsed();
    let until = mcm_api::preservation::expiry(&m).context("expiry")?;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    wait_for(
        &format!("node {first} tainted and drained"),
        WAIT,
        || async {
            let node = nodes.get(&first).await?;
            let tainted = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == "node.machine.sapcloud.io/preserved")
                });
            let condition = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Preserved").cloned());
            Ok(match condition {
                Some(c) if tainted && c.reason.as_deref() == Some("Preserved by MCM.") => {
                    Check::Done(())
                }
                other => Check::Pending(format!("tainted {tainted}, condition {other:?}")),
            })
        },
    )
    .await?;
    // Kept: still 3 machines, one of them the preserved Failed one, counted as such.
    let deployments: Api<mcm_api::MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for(
        "the deployment to count the preserved machine",
        WAIT,
        || async {
            let d = deployments.get("workers").await?;
            let n = d.status.as_ref().and_then(|s| s.preserved_failed_replicas);
            Ok(if n == Some(1) {
                Check::Done(())
            } else {
                Check::Pending(format!("preservedFailedReplicas {n:?}"))
            })
        },
    )
    .await?;
    let machines = ctx.machines().await?;
    ensure!(
        machines.len() == 3,
        "a preserved machine is not replaced: {} machines",
        machines.len()
    );

    // The second crash: the budget of 1 is used, so it is replaced.
    kill_vm(ctx, &second)?;
    await_gone(ctx, &second).await?;
    let m = ctx
        .machines_api()
        .get(&first)
        .await
        .context("the preserved machine")?;
    if m.phase() != Some(&MachinePhase::Failed) {
        bail!("the preserved machine {first} is {:?}", m.phase());
    }

    // Released: `false` on the Machine, and it is replaced.
    ctx.machines_api()
        .patch(
            &first,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {PRESERVE: "false"}}})),
        )
        .await?;
    await_gone(ctx, &first).await?;
    ctx.await_fleet(3, None).await?;
    let hours = until.duration_since(jiff::Timestamp::now()).as_secs_f64() / 3600.0;
    Ok(format!(
        "{first} auto-preserved {:.0}s after its VM was killed (until {until}, ~{hours:.0}h), its node tainted and drained, not replaced; {second} replaced (budget 1); {first} replaced once released; fleet of 3 after {:.0}s",
        preserved_after.as_secs_f64(),
        began.elapsed().as_secs_f64()
    ))
}
