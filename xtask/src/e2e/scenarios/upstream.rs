//! Scenarios of upstream's newer features: `creation-timeout`, `no-target`, `rollback`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use serde_json::json;

use crate::e2e::ctx::{Ctx, RUN_LABEL, Timings, WAIT, class_of};
use crate::e2e::env::{Check, wait_for};

const EFFECTIVE_CREATION_TIMEOUT: &str = "node.machine.sapcloud.io/effective-creation-timeout";

/// A deployment annotated `effective-creation-timeout: 15s` whose VMs never join (boot delay
/// of 10m): each machine carries the annotation and `spec.creationTimeout: 15s`, fails after
/// 15 s instead of the flag's 90 s, and is replaced by a machine with the same timeout.
pub async fn creation_timeout(ctx: &mut Ctx<'_>) -> Result<String> {
    let mut class = ctx.class_body("slow", json!({}));
    class["providerSpec"]["bootDelay"] = json!("10m");
    ctx.apply(&class).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.apply(&json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": {"name": "slow", "annotations": {EFFECTIVE_CREATION_TIMEOUT: "15s"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"deployment": "slow"}},
            "template": {
                "metadata": {"labels": {"deployment": "slow"}},
                "spec": {"class": {"kind": "MachineClass", "name": "slow"}},
            },
        },
    }))
    .await?;
    let first = wait_for(
        "a machine with the effective creation timeout",
        WAIT,
        || async {
            let machines = ctx.machines().await?;
            Ok(
                match machines
                    .into_iter()
                    .find(|m| m.annotations().contains_key(EFFECTIVE_CREATION_TIMEOUT))
                {
                    Some(m) => Check::Done(m),
                    None => Check::Pending("no machine carries the annotation yet".into()),
                },
            )
        },
    )
    .await?;
    let name = first.name_any();
    let timeout = first.spec.configuration.creation_timeout.map(|g| g.0);
    ensure!(
        timeout == Some(std::time::Duration::from_secs(15)),
        "{name} has spec.creationTimeout {timeout:?}"
    );
    let created = first
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .context("creationTimestamp")?;
    let failed_at = wait_for(&format!("{name} to fail or be replaced"), WAIT, || async {
        Ok(match ctx.machines_api().get_opt(&name).await? {
            Some(m) if m.phase() == Some(&MachinePhase::Failed) => {
                Check::Done(jiff::Timestamp::now())
            }
            None => Check::Done(jiff::Timestamp::now()),
            Some(m) => Check::Pending(format!(
                "{name} is {}",
                m.phase().map_or("(none)", |p| p.as_str())
            )),
        })
    })
    .await?;
    let after = failed_at.duration_since(created).as_secs_f64();
    ensure!(
        after < 60.0,
        "{name} failed {after:.0}s after its creation: the 90s flag, not the 15s annotation"
    );
    // Replaced by a machine with the same timeout.
    let next = wait_for("the replacement", WAIT, || async {
        let machines = ctx.machines().await?;
        Ok(
            match machines
                .into_iter()
                .find(|m| m.name_any() != name && m.metadata.deletion_timestamp.is_none())
            {
                Some(m) => Check::Done(m),
                None => Check::Pending("no replacement yet".into()),
            },
        )
    })
    .await?;
    let timeout = next.spec.configuration.creation_timeout.map(|g| g.0);
    ensure!(
        timeout == Some(std::time::Duration::from_secs(15)),
        "the replacement has spec.creationTimeout {timeout:?}"
    );
    Ok(format!(
        "{name} (creationTimeout 15s from the annotation; flag 90s) failed {after:.0}s after its creation; replaced by {} with the same timeout",
        next.name_any()
    ))
}

/// Both controllers with `--target-kubeconfig=none`: a deployment of 2 becomes 2 `Available`
/// machines with the driver's addresses, counted available by the deployment; deleting the
/// deployment deletes every VM.
pub async fn no_target(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("local", json!({})).await?;
    let timings = Timings::default();
    let none = PathBuf::from("none");
    // Each controller is started with `--target-kubeconfig=none`.
    ctx.start_manager_with_target(&timings, none.clone())
        .await?;
    ctx.start_machine_controller(&timings, Some(none)).await?;
    let began = Instant::now();
    ctx.create_deployment("plain", 2, "local").await?;
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for("2 Available machines, counted available", WAIT, || async {
        let machines = ctx.machines().await?;
        let available = machines
            .iter()
            .filter(|m| m.phase() == Some(&MachinePhase::Available) && has_addresses(m))
            .count();
        let md = mds.get("plain").await?;
        let counted = md.status.as_ref().and_then(|s| s.available_replicas);
        Ok(if available == 2 && machines.len() == 2 && counted == Some(2) {
            Check::Done(())
        } else {
            Check::Pending(format!(
                "{} machines, {available} Available with addresses, availableReplicas {counted:?}",
                machines.len()
            ))
        })
    })
    .await?;
    let ready = began.elapsed();
    let machines = ctx.machines().await?;
    ensure!(
        machines.iter().all(|m| !m.labels().contains_key("node")),
        "a machine has a node label without a target cluster"
    );
    mds.delete("plain", &DeleteParams::default()).await?;
    wait_for("no machine and no VM left", WAIT, || async {
        let left = ctx.machines().await?.len();
        let records = ctx.vm_records().len();
        Ok(if left == 0 && records == 0 {
            Check::Done(())
        } else {
            Check::Pending(format!("{left} machines, {records} VM records"))
        })
    })
    .await?;
    // The local VMs registered Nodes through their own kubeconfig; without a target cluster
    // they are nobody's: the scenario removes them.
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let selector = format!("{RUN_LABEL}={}", ctx.ns);
    for n in nodes
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
    {
        let _ = nodes.delete(&n.name_any(), &DeleteParams::default()).await;
    }
    Ok(format!(
        "2 machines Available with addresses {:.0}s after the deployment was created, no node label, no VM left after its deletion",
        ready.as_secs_f64()
    ))
}

fn has_addresses(m: &Machine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"))
}

/// A rollout from class `blue` to `green`, then `rollbackTo: {revision: 0}`: the deployment's
/// template is `blue` again, `rollbackTo` is cleared, and the fleet is `blue` again.
pub async fn rollback(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class("blue", json!({"color": "blue"})).await?;
    ctx.create_class("green", json!({"color": "green"})).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    ctx.create_deployment("web", 2, "blue").await?;
    ctx.await_fleet(2, Some("blue")).await?;
    ctx.patch_deployment(
        "web",
        json!({"spec": {"template": {"spec": {"class": {"name": "green"}}}}}),
    )
    .await?;
    ctx.await_fleet(2, Some("green")).await?;
    let began = Instant::now();
    ctx.patch_deployment("web", json!({"spec": {"rollbackTo": {"revision": 0}}}))
        .await?;
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for(
        "rollbackTo cleared with the blue template",
        WAIT,
        || async {
            let md = mds.get("web").await?;
            let class = md
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.class.as_ref())
                .and_then(|c| c.name.clone());
            Ok(
                if md.spec.rollback_to.is_none() && class.as_deref() == Some("blue") {
                    Check::Done(())
                } else {
                    Check::Pending(format!(
                        "rollbackTo {:?}, class {class:?}",
                        md.spec.rollback_to
                    ))
                },
            )
        },
    )
    .await?;
    let machines = ctx.await_fleet(2, Some("blue")).await?;
    ensure!(machines.iter().all(|m| class_of(m) == "blue"));
    Ok(format!(
        "blue -> green -> rollbackTo 0: 2 blue machines again {:.0}s after the request",
        began.elapsed().as_secs_f64()
    ))
}
