//! Zone-partition trials of `cargo xtask chaos`: the VMs of one zone stop heartbeating while
//! their processes live (SIGSTOP of their `local-node` processes: the driver still finds them
//! running, as a cloud does in a network partition), for longer than the health timeout. No
//! machine of the zone may be marked Failed, drained, deleted or replaced; each must be held
//! (its `lastOperation` names the partition, the `mcm_machine_zone_partition_held_machines`
//! gauge counts it); after SIGCONT every machine is Running again on the same VM (the same
//! process), and the gauge is back to nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kube::ResourceExt;
use mcm_api::MachinePhase;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT, phases, record_phases};
use crate::e2e::env::{Check, wait_for};

/// The zones of the trial, a MachineDeployment each.
const ZONES: [&str; 2] = ["zone-a", "zone-b"];
/// Machines per zone.
const PER_ZONE: usize = 3;
/// The machine controller's health timeout in the trial.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(20);
/// The gauge of held machines.
const HELD_GAUGE: &str = "mcm_machine_zone_partition_held_machines";

/// What the trials saw.
#[derive(Debug, Default)]
pub struct Figures {
    /// Partitions cut.
    pub partitions: usize,
    /// Machines held (each partition's held machines, summed).
    pub held: usize,
    /// The longest a partition lasted.
    pub longest: Duration,
    /// Machines of a partitioned zone that came back Running on their VM.
    pub recovered: usize,
}

impl Figures {
    /// The rows of the chaos report.
    pub fn print(&self) {
        println!(
            "| zone partitions (VMs of a zone SIGSTOPped) | {} |",
            self.partitions
        );
        println!(
            "| machines held through them (none drained, deleted or replaced) | {} |",
            self.held
        );
        println!(
            "| machines Running again on their own VM afterwards | {} |",
            self.recovered
        );
        println!(
            "| longest partition | {:.0}s (health timeout {}s) |",
            self.longest.as_secs_f64(),
            HEALTH_TIMEOUT.as_secs()
        );
    }
}

/// The value of `HELD_GAUGE` for `zone` in a `/metrics` text (0 when absent).
fn held_in(metrics: &str, zone: &str) -> f64 {
    let series = format!("{HELD_GAUGE}{{zone=\"{zone}\"}}");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&series))
        .filter_map(|v| v.trim().parse().ok())
        .next()
        .unwrap_or(0.0)
}

/// The status of the `ZonePartition` condition of MachineDeployment `name` (`None`: absent).
async fn partition_condition(ctx: &Ctx<'_>, name: &str) -> Result<Option<String>> {
    let api: kube::Api<mcm_api::MachineDeployment> =
        kube::Api::namespaced(ctx.client.clone(), &ctx.ns);
    let d = api.get(name).await?;
    Ok(d.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == mcm_api::MachineDeploymentConditionType::ZonePartition)
        .map(|c| c.status.as_str().to_string()))
}

/// `lastOperation.description` of a machine.
fn description(m: &mcm_api::Machine) -> String {
    m.status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.clone())
        .unwrap_or_default()
}

/// Runs `partitions` zone partitions, recording what they saw in `figures` and the violations
/// found in `violations` (kept when the harness stops on an error).
pub async fn trials(
    ctx: &mut Ctx<'_>,
    seed: u64,
    partitions: usize,
    figures: &mut Figures,
    violations: &mut Vec<String>,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0020_0e5a);
    for zone in ZONES {
        ctx.create_class(zone, json!({ "topology.kubernetes.io/zone": zone }))
            .await?;
    }
    let timings = Timings {
        health_timeout: "20s",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, None).await?;
    for zone in ZONES {
        ctx.create_deployment(zone, PER_ZONE as i32, zone).await?;
    }
    let before = ctx.await_fleet(ZONES.len() * PER_ZONE, None).await?;
    let names: BTreeSet<String> = before.iter().map(|m| m.name_any()).collect();
    let (recorder, log) = record_phases(ctx.machines_api());
    for i in 0..partitions {
        let zone = ZONES[rng.random_range(0..ZONES.len())];
        let length = HEALTH_TIMEOUT + Duration::from_millis(rng.random_range(15_000..40_000));
        let victims: Vec<String> = ctx
            .machines()
            .await?
            .iter()
            .filter(|m| {
                m.spec
                    .class
                    .as_ref()
                    .is_some_and(|c| c.name.as_deref() == Some(zone))
            })
            .map(|m| m.name_any())
            .collect();
        let mut pids = BTreeMap::new();
        for v in &victims {
            let record = ctx
                .state
                .read(v)?
                .with_context(|| format!("no VM record for {v}"))?;
            pids.insert(v.clone(), record.pid);
        }
        let started = jiff::Timestamp::now();
        println!(
            "zone partition {:>2}: {zone} ({} machines) for {:.1}s, from {started}",
            i + 1,
            victims.len(),
            length.as_secs_f64()
        );
        for pid in pids.values() {
            kill(Pid::from_raw(*pid), Signal::SIGSTOP).with_context(|| format!("SIGSTOP {pid}"))?;
        }
        let cut = Instant::now();
        // Every machine of the zone is held once past its health timeout.
        let mc = ctx.machine_controller()?;
        let held = wait_for(
            &format!("the machines of {zone} to be held"),
            WAIT,
            || async {
                let machines = ctx.machines().await?;
                let held = machines
                    .iter()
                    .filter(|m| victims.contains(&m.name_any()))
                    .filter(|m| {
                        m.phase() == Some(&MachinePhase::Unknown)
                            && description(m).contains(&format!("zone {zone} is partitioned"))
                    })
                    .count();
                let gauge = held_in(&mc.metrics_text().await.unwrap_or_default(), zone);
                Ok(if held == victims.len() && gauge == held as f64 {
                    Check::Done(held)
                } else {
                    Check::Pending(format!("{held} of {} held, gauge {gauge}", victims.len()))
                })
            },
        )
        .await;
        match held {
            Ok(n) => figures.held += n,
            Err(e) => violations.push(format!("zone partition {} ({zone}): {e:#}", i + 1)),
        }
        // The zone's MachineDeployment shows it; the other zone's does not.
        let shown = wait_for(
            &format!("MachineDeployment {zone} to show the partition"),
            WAIT,
            || async {
                Ok(match partition_condition(ctx, zone).await?.as_deref() {
                    Some("True") => Check::Done(()),
                    other => Check::Pending(format!("ZonePartition {other:?}")),
                })
            },
        )
        .await;
        if let Err(e) = shown {
            violations.push(format!("zone partition {} ({zone}): {e:#}", i + 1));
        }
        for other in ZONES.iter().filter(|z| **z != zone) {
            if partition_condition(ctx, other).await?.as_deref() == Some("True") {
                violations.push(format!(
                    "zone partition {} ({zone}): MachineDeployment {other} shows a partition too",
                    i + 1
                ));
            }
        }
        // The fault lasts `length` (from the cut), whatever the waits above took.
        tokio::time::sleep(length.saturating_sub(cut.elapsed())).await;
        for (v, pid) in &pids {
            // A VM whose process is gone was deleted: its machine was replaced.
            if let Err(e) = kill(Pid::from_raw(*pid), Signal::SIGCONT) {
                violations.push(format!(
                    "zone partition {} ({zone}): the VM of {v} (pid {pid}) is gone: {e}",
                    i + 1
                ));
            }
        }
        let lasted = cut.elapsed();
        figures.longest = figures.longest.max(lasted);
        figures.partitions += 1;
        println!(
            "zone partition {:>2}: {zone} restored after {:.1}s, at {}",
            i + 1,
            lasted.as_secs_f64(),
            jiff::Timestamp::now()
        );
        // Back: the same machines, Running on the same VM processes, nothing held.
        let after = ctx.await_fleet(ZONES.len() * PER_ZONE, None).await?;
        let now: BTreeSet<String> = after.iter().map(|m| m.name_any()).collect();
        if now != names {
            violations.push(format!(
                "zone partition {} ({zone}): machines replaced: {names:?} -> {now:?}",
                i + 1
            ));
        }
        for (v, pid) in &pids {
            match ctx.state.read(v)? {
                Some(r) if r.pid == *pid => figures.recovered += 1,
                other => violations.push(format!(
                    "zone partition {} ({zone}): {v} is not on its VM (pid {pid}) any more: {:?}",
                    i + 1,
                    other.map(|r| r.pid)
                )),
            }
        }
        let cleared = wait_for("the held gauge to clear", WAIT, || async {
            let gauge = held_in(&mc.metrics_text().await.unwrap_or_default(), zone);
            Ok(if gauge == 0.0 {
                Check::Done(())
            } else {
                Check::Pending(format!("{HELD_GAUGE}{{zone={zone}}} {gauge}"))
            })
        })
        .await;
        if let Err(e) = cleared {
            violations.push(format!("zone partition {} ({zone}): {e:#}", i + 1));
        }
        let lifted = wait_for(
            &format!("MachineDeployment {zone} to show the partition lifted"),
            WAIT,
            || async {
                Ok(match partition_condition(ctx, zone).await?.as_deref() {
                    Some("False") => Check::Done(()),
                    other => Check::Pending(format!("ZonePartition {other:?}")),
                })
            },
        )
        .await;
        if let Err(e) = lifted {
            violations.push(format!("zone partition {} ({zone}): {e:#}", i + 1));
        }
    }
    recorder.abort();
    // No machine was ever marked Failed or began its deletion.
    for (machine, seen) in phases(&log) {
        if seen.iter().any(|p| p == "Failed" || p == "Terminating") {
            violations.push(format!(
                "{machine} went through {seen:?} during the zone partitions"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_gauge_is_read_per_zone() {
        let text = "# HELP x\nmcm_machine_zone_partition_held_machines{zone=\"zone-a\"} 3\n\
                    mcm_machine_zone_partition_held_machines{zone=\"zone-b\"} 1\n";
        assert_eq!(held_in(text, "zone-a"), 3.0);
        assert_eq!(held_in(text, "zone-b"), 1.0);
        assert_eq!(held_in(text, "zone-c"), 0.0);
    }
}
