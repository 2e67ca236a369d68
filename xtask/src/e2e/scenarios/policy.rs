//! Health and disruption policy scenarios: `zone-outage` (the remediation short-circuit, then
//! the driver's fast path) and `lifecycle-hooks`.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use mcm_api::constants::annotations::{hooks, policy};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT};
use crate::e2e::env::{Check, wait_for};

fn description(m: &Machine) -> &str {
    m.status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.as_deref())
        .unwrap_or_default()
}

/// The `RemediationAllowed` condition of the deployment: `(status, reason)`.
async fn remediation_allowed(ctx: &Ctx<'_>, name: &str) -> Result<Option<(String, String)>> {
    let d = Api::<MachineDeployment>::namespaced(ctx.client.clone(), &ctx.ns)
        .get(name)
        .await?;
    Ok(d.status
        .and_then(|s| s.conditions)
        .and_then(|c| {
            c.into_iter()
                .find(|c| c.type_.as_str() == "RemediationAllowed")
        })
        .map(|c| (c.status.as_str().to_string(), c.reason.unwrap_or_default())))
}

/// Three of four VMs of a deployment are killed at once (a zone outage). With
/// `remediation.mcm-rs.io/max-unhealthy: "1"` none is replaced: the machines stay Unknown and
/// say why, the deployment's `RemediationAllowed` condition is False. Once the operator lifts
/// the short-circuit, the driver reports the VMs stopped and all three are replaced at once,
/// long before the (10 minute) health timeout.
pub async fn zone_outage(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    let timings = Timings {
        health_timeout: "10m",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    ctx.create_deployment("zone", 4, "local").await?;
    ctx.patch_deployment(
        "zone",
        json!({ "metadata": { "annotations": {
            policy::MAX_UNHEALTHY: "1",
            policy::MAX_IN_FLIGHT: "3",
        } } }),
    )
    .await?;
    let fleet = ctx.await_fleet(4, None).await?;
    let victims: Vec<String> = fleet.iter().take(3).map(|m| m.name_any()).collect();
    for v in &victims {
        let record = ctx
            .state
            .read(v)?
            .with_context(|| format!("no VM record for {v}"))?;
        kill(Pid::from_raw(record.pid), Signal::SIGKILL)
            .with_context(|| format!("kill -9 {}", record.pid))?;
    }
    let outage = Instant::now();

    wait_for(
        "the three machines to be held by the short-circuit",
        WAIT,
        || async {
            let machines = ctx.machines().await?;
            let held: Vec<&Machine> = machines
                .iter()
                .filter(|m| victims.contains(&m.name_any()))
                .filter(|m| {
                    m.phase() == Some(&MachinePhase::Unknown)
                        && description(m).contains("remediation short-circuited")
                })
                .collect();
            if let Some(m) = machines
                .iter()
                .find(|m| m.phase() == Some(&MachinePhase::Failed))
            {
                bail!(
                    "{} was marked Failed during the outage: {}",
                    m.name_any(),
                    description(m)
                );
            }
            Ok(if held.len() == 3 {
                Check::Done(())
            } else {
                Check::Pending(format!("{} of 3 held", held.len()))
            })
        },
    )
    .await?;
    wait_for("RemediationAllowed=False", WAIT, || async {
        Ok(match remediation_allowed(ctx, "zone").await? {
            Some((s, r)) if s == "False" && r == "TooManyUnhealthy" => Check::Done(()),
            other => Check::Pending(format!("{other:?}")),
        })
    })
    .await?;
    let held_after = outage.elapsed();
    let machines = ctx.machines().await?;
    ensure!(
        machines.len() == 4,
        "{} machines during the outage: nothing may be replaced",
        machines.len()
    );

    // The operator lifts the short-circuit: the fast path fails all three at once (the budget
    // is 3), and they are replaced.
    let lifted = Instant::now();
    ctx.patch_deployment(
        "zone",
        json!({ "metadata": { "annotations": { policy::MAX_UNHEALTHY: "100%" } } }),
    )
    .await?;
    wait_for("the three crashed machines to be gone", WAIT, || async {
        let machines = ctx.machines().await?;
        let left: Vec<String> = machines
            .iter()
            .map(|m| m.name_any())
            .filter(|n| victims.contains(n))
            .collect();
        Ok(if left.is_empty() {
            Check::Done(())
        } else {
            Check::Pending(format!("left: {left:?}"))
        })
    })
    .await?;
    ctx.await_fleet(4, None).await?;
    let replaced_after = lifted.elapsed();
    wait_for("RemediationAllowed=True", WAIT, || async {
        Ok(match remediation_allowed(ctx, "zone").await? {
            Some((s, _)) if s == "True" => Check::Done(()),
            other => Check::Pending(format!("{other:?}")),
        })
    })
    .await?;
    Ok(format!(
        "3 of 4 VMs killed: held by the short-circuit {:.0}s after the kill, none replaced; \
         once lifted, all 3 replaced in {:.0}s (health timeout 10m)",
        held_after.as_secs_f64(),
        replaced_after.as_secs_f64()
    ))
}

fn cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// A machine with a pre-drain and a pre-terminate hook is deleted: nothing is drained until
/// the pre-drain hook is removed, the VM is kept until the pre-terminate hook is removed, and
/// the workload moves in between.
pub async fn lifecycle_hooks(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.create_deployment("hooked", 2, "local").await?;
    ctx.await_fleet(2, None).await?;
    ctx.create_workload(2, None).await?;
    ctx.await_workload(2).await?;
    let victim = ctx
        .pods()
        .await?
        .into_iter()
        .find_map(|p| p.spec.and_then(|s| s.node_name))
        .context("no workload pod is bound")?;
    let pre_drain = format!("{}drain-gate", hooks::PRE_DRAIN_PREFIX);
    let pre_terminate = format!("{}terminate-gate", hooks::PRE_TERMINATE_PREFIX);
    let machines = ctx.machines_api();
    let patch = |value: serde_json::Value| {
        let machines = machines.clone();
        let victim = victim.clone();
        async move {
            machines
                .patch(&victim, &PatchParams::default(), &Patch::Merge(&value))
                .await
                .with_context(|| format!("patch {victim}"))
        }
    };
    patch(json!({ "metadata": { "annotations": {
        pre_drain.clone(): "e2e", pre_terminate.clone(): "e2e",
    } } }))
    .await?;
    let began = Instant::now();
    machines
        .delete(&victim, &Default::default())
        .await
        .with_context(|| format!("delete {victim}"))?;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let wait_description = |needle: &'static str| {
        let machines = machines.clone();
        let victim = victim.clone();
        async move {
            wait_for(&format!("{victim} to say {needle:?}"), WAIT, || async {
                let m = machines.get(&victim).await?;
                Ok(if description(&m).contains(needle) {
                    Check::Done(())
                } else {
                    Check::Pending(description(&m).to_string())
                })
            })
            .await
        }
    };
    wait_description("waits for pre-drain hook(s) drain-gate").await?;
    ensure!(
        !cordoned(&nodes.get(&victim).await?),
        "{victim} was cordoned while its pre-drain hook held"
    );
    let bound = ctx
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&victim))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    ensure!(
        bound > 0,
        "the workload left {victim} before its pre-drain hook was removed"
    );

    patch(json!({ "metadata": { "annotations": { pre_drain.clone(): null } } })).await?;
    wait_description("waits for pre-terminate hook(s) terminate-gate").await?;
    ensure!(
        cordoned(&nodes.get(&victim).await?),
        "{victim} is not cordoned after its drain"
    );
    ensure!(
        ctx.vm_records().contains(&victim),
        "the VM of {victim} was deleted while its pre-terminate hook held"
    );
    ctx.await_workload(2).await?;

    patch(json!({ "metadata": { "annotations": { pre_terminate.clone(): null } } })).await?;
    wait_for(&format!("{victim} to be gone"), WAIT, || async {
        Ok(match machines.get_opt(&victim).await? {
            None => Check::Done(()),
            Some(m) => Check::Pending(description(&m).to_string()),
        })
    })
    .await?;
    ctx.await_fleet(2, None).await?;
    ensure!(
        !ctx.vm_records().contains(&victim),
        "the VM of {victim} outlived its machine"
    );
    Ok(format!(
        "{victim} held before the drain and before the VM, then gone; fleet of 2 again {:.0}s after the delete",
        began.elapsed().as_secs_f64()
    ))
}
