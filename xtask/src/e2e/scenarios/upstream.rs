//! Scenarios of upstream's newer features: `creation-timeout`, `no-target`, `rollback`,
//! `slow-cloud`.

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

const ECT_LAST_APPLIED_AT: &str =
    "node.machine.sapcloud.io/effective-creation-timeout-last-applied-at";
const REPLACE_CYCLE_COUNT: &str = "node.machine.sapcloud.io/replace-cycle-count";
const REPLACE_CYCLE_COUNT_LAST_APPLIED_AT: &str =
    "node.machine.sapcloud.io/replace-cycle-count-last-applied-at";
const ECT_GAUGE: &str = "mcm_machine_deployment_effective_creation_timeout_seconds";
/// The slow cloud's boot: longer than the declared 20s, within 30s (20s grown by 50 %).
const SLOW_BOOT: &str = "24s";
/// How long the two pools are watched after the adaptive one converged.
const HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// The pool of the `slow-cloud` scenario: 2 machines of `class`, declared creation timeout
/// 20s (the template's `creationTimeout`).
fn slow_pool(class: &str) -> serde_json::Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": {"name": "pool"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"deployment": "pool"}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"deployment": "pool"}},
                "spec": {"class": {"kind": "MachineClass", "name": class},
                         "creationTimeout": "20s"},
            },
        },
    })
}

/// Machines ever created, per replica.
fn attempts(log: &crate::e2e::ctx::PhaseLog, replicas: usize) -> f64 {
    crate::e2e::ctx::phases(log).len() as f64 / replicas as f64
}

/// Whether the deployment `pool` of `ns` has an Event with `reason`; its note.
async fn pool_event(ctx: &Ctx<'_>, reason: &str) -> Result<Option<String>> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(ctx.client.clone(), &ctx.ns);
    let list = events.list(&ListParams::default()).await?;
    Ok(list.items.into_iter().find_map(|e| {
        let about = e.regarding.as_ref()?.name.as_deref()? == "pool";
        (about && e.reason.as_deref() == Some(reason)).then_some(e.note.unwrap_or_default())
    }))
}

/// The new MachineSet of `pool` (the one with its replicas) and its
/// effective-creation-timeout annotation.
async fn new_set_timeout(ctx: &Ctx<'_>, class: &str) -> Result<Option<String>> {
    let sets: Api<mcm_api::MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let list = sets.list(&ListParams::default()).await?;
    let set = list
        .items
        .into_iter()
        .find(|s| {
            s.metadata.deletion_timestamp.is_none()
                && s.spec
                    .template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .and_then(|t| t.class.as_ref())
                    .and_then(|c| c.name.as_deref())
                    == Some(class)
        })
        .context("no MachineSet of the class")?;
    Ok(set.annotations().get(EFFECTIVE_CREATION_TIMEOUT).cloned())
}

/// A slow cloud (upstream issue #1155): VMs that take ~25s to join a pool whose declared
/// creation timeout is 20s. With the adaptation (the manager's defaults: threshold 2, growth
/// 50 %) the effective creation timeout goes to 30s after two replace cycles and the pool
/// converges to Running machines; the same pool beside it with
/// `--machine-creation-timeout-growth-percent=0` (a namespace and manager of its own)
/// replaces its machines every 20s, for the same period. Then the pool rolls out to a class
/// without the boot delay: its machines join fast and the effective timeout comes back to
/// the declared value (the annotations removed). Reports the creation attempts per machine
/// of both pools.
pub async fn slow_cloud(ctx: &mut Ctx<'_>) -> Result<String> {
    let timings = Timings::default();
    let logs_root = ctx
        .dir
        .parent()
        .context("the scenario directory has no parent")?
        .to_path_buf();
    let mut fixed = Ctx::new(ctx.cp, ctx.bins(), "slow-cloud-fixed", &logs_root).await?;
    let fixed_manager = fixed.spawn_with(
        crate::e2e::env::ControllerKind::Manager,
        "manager",
        None,
        &timings,
        &["--machine-creation-timeout-growth-percent=0".to_string()],
    );
    let compared = match fixed_manager {
        Ok(manager) => {
            let compared = compare_slow_pools(ctx, &mut fixed, &manager).await;
            drop(manager);
            compared
        }
        Err(e) => Err(e),
    };
    fixed.cleanup().await;
    let compared = compared?;

    // The pool moves to a class without the boot delay: fast joins bring the timeout down.
    let began = Instant::now();
    ctx.patch_deployment(
        "pool",
        json!({"spec": {"template": {"spec": {"class": {"name": "fast"}}}}}),
    )
    .await?;
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for(
        "the effective creation timeout back at the declared 20s, its keys removed",
        WAIT,
        || async {
            let md = mds.get("pool").await?;
            let anns = md.annotations();
            let left: Vec<&str> = [
                EFFECTIVE_CREATION_TIMEOUT,
                ECT_LAST_APPLIED_AT,
                REPLACE_CYCLE_COUNT,
                REPLACE_CYCLE_COUNT_LAST_APPLIED_AT,
            ]
            .into_iter()
            .filter(|k| anns.contains_key(*k))
            .collect();
            Ok(if left.is_empty() {
                Check::Done(())
            } else {
                let machines = ctx.machines().await?;
                Check::Pending(format!(
                    "still {left:?}; machines {}",
                    crate::e2e::ctx::phase_summary(&machines)
                ))
            })
        },
    )
    .await?;
    let lowered = began.elapsed();
    ctx.await_fleet(2, Some("fast")).await?;
    let note = pool_event(ctx, "EffectiveCreationTimeoutLowered")
        .await?
        .context("no EffectiveCreationTimeoutLowered Event on the deployment")?;
    let set_value = new_set_timeout(ctx, "fast").await?;
    ensure!(
        set_value.is_none(),
        "the new MachineSet still has effective-creation-timeout {set_value:?}"
    );
    let gauge = wait_for("the gauge at 20s", WAIT, || async {
        Ok(match ctx.manager()?.metric(ECT_GAUGE).await {
            Some(v) if (v - 20.0).abs() < 0.5 => Check::Done(v),
            other => Check::Pending(format!("{ECT_GAUGE} {other:?}")),
        })
    })
    .await?;
    Ok(format!(
        "{compared}; rollout to a fast class: back to the declared {gauge}s (keys removed) {:.0}s after the template change ({note})",
        lowered.as_secs_f64()
    ))
}

/// The first part of [`slow_cloud`]: both pools from their creation until the adaptive one
/// converged, and [`HOLD`] longer.
async fn compare_slow_pools(
    ctx: &mut Ctx<'_>,
    fixed: &mut Ctx<'_>,
    fixed_manager: &crate::e2e::env::Controller,
) -> Result<String> {
    let timings = Timings::default();
    for c in [&*ctx, &*fixed] {
        let mut slow = c.class_body("slow", json!({}));
        slow["providerSpec"]["bootDelay"] = json!(SLOW_BOOT);
        c.apply(&slow).await?;
        c.create_class("fast", json!({})).await?;
    }
    ctx.start_controllers(&timings, None).await?;
    fixed_manager.await_ready(WAIT).await?;
    fixed.start_machine_controller(&timings, None).await?;
    let (adaptive_watch, adaptive_log) = crate::e2e::ctx::record_phases(ctx.machines_api());
    let (fixed_watch, fixed_log) = crate::e2e::ctx::record_phases(fixed.machines_api());
    let began = Instant::now();
    fixed.apply(&slow_pool("slow")).await?;
    ctx.apply(&slow_pool("slow")).await?;

    let converged = wait_for(
        "2 Running machines in the adaptive pool",
        std::time::Duration::from_secs(200),
        || async {
            let machines = ctx.machines().await?;
            let running = machines
                .iter()
                .filter(|m| crate::e2e::ctx::is_running(m))
                .count();
            Ok(if running == 2 {
                Check::Done(began.elapsed())
            } else {
                Check::Pending(format!(
                    "{}; {} created so far",
                    crate::e2e::ctx::phase_summary(&machines),
                    crate::e2e::ctx::phases(&adaptive_log).len()
                ))
            })
        },
    )
    .await?;
    let adaptive_at_convergence = attempts(&adaptive_log, 2);
    tokio::time::sleep(HOLD).await;
    let period = began.elapsed();
    let adaptive = attempts(&adaptive_log, 2);
    let fixed_attempts = attempts(&fixed_log, 2);
    adaptive_watch.abort();
    fixed_watch.abort();

    // The adaptive pool: 30s on the deployment, its new set and its Running machines.
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let md = mds.get("pool").await?;
    let value = md.annotations().get(EFFECTIVE_CREATION_TIMEOUT).cloned();
    ensure!(
        value.as_deref() == Some("30s"),
        "the adaptive pool's effective-creation-timeout is {value:?}"
    );
    ensure!(
        md.annotations().contains_key(ECT_LAST_APPLIED_AT),
        "no {ECT_LAST_APPLIED_AT}"
    );
    for m in ctx
        .machines()
        .await?
        .iter()
        .filter(|m| crate::e2e::ctx::is_running(m))
    {
        let timeout = m.spec.configuration.creation_timeout.map(|g| g.0);
        ensure!(
            timeout == Some(std::time::Duration::from_secs(30)),
            "Running machine {} has spec.creationTimeout {timeout:?}",
            m.name_any()
        );
    }
    let set_value = new_set_timeout(ctx, "slow").await?;
    ensure!(
        set_value.as_deref() == Some("30s"),
        "the new MachineSet has effective-creation-timeout {set_value:?}"
    );
    let raised = pool_event(ctx, "EffectiveCreationTimeoutRaised")
        .await?
        .context("no EffectiveCreationTimeoutRaised Event on the deployment")?;
    let gauge = ctx.manager()?.metric(ECT_GAUGE).await;
    ensure!(
        gauge.is_some_and(|v| (v - 30.0).abs() < 0.5),
        "{ECT_GAUGE} is {gauge:?}"
    );
    ensure!(
        adaptive < fixed_attempts,
        "{adaptive} attempts per machine with the adaptation, {fixed_attempts} without"
    );

    // The fixed pool: nothing adapted, nothing Running.
    let fixed_mds: Api<MachineDeployment> = Api::namespaced(fixed.client.clone(), &fixed.ns);
    let fixed_md = fixed_mds.get("pool").await?;
    ensure!(
        !fixed_md
            .annotations()
            .contains_key(EFFECTIVE_CREATION_TIMEOUT),
        "growth 0 adapted the fixed pool"
    );
    let fixed_running = fixed
        .machines()
        .await?
        .iter()
        .filter(|m| crate::e2e::ctx::is_running(m))
        .count();
    ensure!(
        fixed_running == 0,
        "{fixed_running} machines of the fixed pool joined"
    );
    Ok(format!(
        "declared 20s, boot {SLOW_BOOT}: raised to 30s ({raised}), 2 Running {:.0}s after creation \
         with {adaptive_at_convergence:.1} creation attempts per machine; over {:.0}s: \
         {adaptive:.1} attempts per machine with the adaptation, {fixed_attempts:.1} and none \
         Running with growth 0",
        converged.as_secs_f64(),
        period.as_secs_f64()
    ))
}
