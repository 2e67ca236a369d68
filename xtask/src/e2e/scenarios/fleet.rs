//! Scenarios about the size of a fleet: `scale`, `delete-deployment`, `bad-class`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use mcm_api::{MachineDeployment, MachinePhase, MachineSet};
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT};
use crate::e2e::env::{Check, wait_for};

/// A MachineDeployment 0 -> 3 -> 6 -> 2: Machines, Nodes and VM processes follow.
pub async fn scale(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.create_deployment("scale", 0, "local").await?;
    await_observed(ctx, "scale").await?;
    ctx.await_fleet(0, None).await?;
    let mut steps = Vec::new();
    for n in [3, 6, 2] {
        let began = Instant::now();
        ctx.patch_deployment("scale", json!({ "spec": { "replicas": n } }))
            .await?;
        ctx.await_fleet(n as usize, None).await?;
        steps.push(format!("{n} in {:.0}s", began.elapsed().as_secs_f64()));
    }
    Ok(format!("0 -> {}", steps.join(" -> ")))
}

/// Waits until the manager has seen the current generation of a MachineDeployment.
async fn await_observed(ctx: &Ctx<'_>, name: &str) -> Result<()> {
    let api: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for("the MachineDeployment to be observed", WAIT, || async {
        let md = api
            .get(name)
            .await
            .context("reading the MachineDeployment")?;
        let observed = md.status.and_then(|s| s.observed_generation);
        Ok(
            if observed.is_some() && observed >= md.metadata.generation {
                Check::Done(())
            } else {
                Check::Pending(format!("observedGeneration {observed:?}"))
            },
        )
    })
    .await
}

/// Deleting a MachineDeployment of 3 leaves no MachineSet, Machine, Node or VM process.
pub async fn delete_deployment(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.create_deployment("doomed", 3, "local").await?;
    ctx.await_fleet(3, None).await?;
    let began = Instant::now();
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    mds.delete("doomed", &DeleteParams::default())
        .await
        .context("deleting the MachineDeployment")?;
    wait_for("everything to be gone", WAIT, || async {
        let left = [
            (
                "MachineDeployments",
                mds.list(&ListParams::default()).await?.items.len(),
            ),
            (
                "MachineSets",
                sets.list(&ListParams::default()).await?.items.len(),
            ),
            ("Machines", ctx.machines().await?.len()),
            ("Nodes", ctx.nodes().await?.len()),
            ("VM records", ctx.vm_records().len()),
            ("VM processes", ctx.vm_process_count()),
        ];
        Ok(if left.iter().all(|(_, n)| *n == 0) {
            Check::Done(())
        } else {
            Check::Pending(
                left.iter()
                    .map(|(what, n)| format!("{n} {what}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
    })
    .await?;
    Ok(format!(
        "3 machines, nodes and VMs gone {:.0}s after the delete",
        began.elapsed().as_secs_f64()
    ))
}

/// A class with an invalid providerSpec: the Machine says which field is wrong (status and
/// Event), and no VM is created.
pub async fn bad_class(ctx: &mut Ctx<'_>) -> Result<String> {
    let mut class = ctx.class_body("bad", json!({}));
    class["providerSpec"]["capacity"] = json!({ "cpu": "lots" });
    ctx.apply(&class).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.create_deployment("bad", 1, "bad").await?;
    let (machine, description) = wait_for("the Machine to name the bad field", WAIT, || async {
        let machines = ctx.machines().await?;
        let found = machines.iter().find_map(|m| {
            let op = m.status.as_ref()?.last_operation.as_ref()?;
            let d = op.description.as_deref()?;
            d.contains("providerSpec.capacity.cpu")
                .then(|| (m.metadata.name.clone().unwrap_or_default(), d.to_string()))
        });
        Ok(match found {
            Some(f) => Check::Done(f),
            None => Check::Pending(format!("{} machines, none names the field", machines.len())),
        })
    })
    .await?;
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let note = wait_for("a Warning Event on the Machine", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        let note = list.items.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref()? == machine;
            let warning = e.type_.as_deref() == Some("Warning");
            let note = e.note?;
            (about && warning && note.contains("capacity.cpu")).then_some(note)
        });
        Ok(note.map_or_else(|| Check::Pending("no such Event".into()), Check::Done))
    })
    .await?;
    // A measurement window: the controller retries with backoff; nothing may be created
    // meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        ctx.vm_records().is_empty(),
        "VM records for a bad class: {:?}",
        ctx.vm_records()
    );
    ensure!(ctx.vm_process_count() == 0, "a VM process runs");
    ensure!(ctx.nodes().await?.is_empty(), "a Node registered");
    let phase = ctx.machines_api().get(&machine).await?.phase().cloned();
    ensure!(
        phase != Some(MachinePhase::Running),
        "the machine of a bad class is Running"
    );
    ensure!(
        !note.is_empty(),
        "the Event has no note (description was {description:?})"
    );
    Ok(format!("lastOperation: {description}"))
}
