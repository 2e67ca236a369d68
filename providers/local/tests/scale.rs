//! Twenty local VMs at once against a real control plane: all Nodes Ready at the same time
//! and still Ready after ~20s, with per-VM CPU and RSS printed for the record.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use mcm_driver::ResourceState;
use mcm_provider_local::state::read_proc_stat;
use mcm_testenv::Components;
use mcm_testenv::kit::{TestNamespace, is_ready};
use serde_json::json;

const VMS: usize = 20;
/// How long the VMs run before they are measured.
const RUN: Duration = Duration::from_secs(20);
/// Linux's USER_HZ: the unit of utime/stime in /proc/<pid>/stat.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[tokio::test]
async fn twenty_vms_stay_healthy_together() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "scale").await;
    let cloud = Cloud::on(
        &env,
        json!({"labels": {"scale-test": ns}, "heartbeatInterval": "2s"}),
    );
    let names: Vec<String> = (0..VMS).map(|i| format!("{ns}-vm-{i:02}")).collect();
    let began = Instant::now();
    let creates = names.iter().map(|n| cloud.create(n));
    for result in futures::future::join_all(creates).await {
        result.expect("create");
    }
    let selector = format!("scale-test={ns}");
    await_all_ready(&client, &selector, VMS).await;
    let boot = began.elapsed();
    eprintln!("{VMS} VMs created and all Nodes Ready in {boot:?}");

    // Let them run, then measure CPU over the run and RSS at its end.
    let pids: Vec<i32> = names.iter().map(|n| cloud.pid(n)).collect();
    let cpu_before: Vec<u64> = pids
        .iter()
        .map(|p| read_proc_stat(*p).map_or(0, |s| s.utime + s.stime))
        .collect();
    let window = Instant::now();
    // Deliberate: this is the measurement period, not a synchronization.
    tokio::time::sleep(RUN).await;
    let elapsed = window.elapsed().as_secs_f64();

    // Still all Ready, with fresh heartbeats, at the same time.
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list nodes");
    assert_eq!(list.items.len(), VMS);
    let now = jiff::Timestamp::now();
    for node in &list.items {
        assert!(is_ready(node), "{:?} not Ready", node.metadata.name);
        let beat = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| t.0)
            .expect("a heartbeat");
        let age = now.duration_since(beat);
        assert!(
            age < jiff::SignedDuration::from_secs(10),
            "{:?}: last heartbeat {age:?} ago",
            node.metadata.name
        );
    }
    for name in &names {
        let status = cloud.status(name).await.expect("status");
        assert_eq!(status.resources[0].state, ResourceState::Running, "{name}");
    }

    eprintln!("per-VM figures after {elapsed:.1}s of running (heartbeat 2s, no pods):");
    eprintln!("{:<28} {:>7} {:>9} {:>9}", "vm", "pid", "cpu %", "rss MiB");
    let (mut cpu_sum, mut rss_sum, mut rss_max) = (0.0, 0u64, 0u64);
    for ((name, pid), before) in names.iter().zip(&pids).zip(&cpu_before) {
        let after = read_proc_stat(*pid).map_or(0, |s| s.utime + s.stime);
        let cpu = (after.saturating_sub(*before)) as f64 / CLOCK_TICKS_PER_SECOND / elapsed * 100.0;
        let rss = rss_kib(*pid).unwrap_or(0);
        cpu_sum += cpu;
        rss_sum += rss;
        rss_max = rss_max.max(rss);
        eprintln!(
            "{name:<28} {pid:>7} {cpu:>9.2} {:>9.1}",
            rss as f64 / 1024.0
        );
    }
    eprintln!(
        "total: cpu {cpu_sum:.2}% of one core; rss {:.1} MiB (mean {:.1} MiB, max {:.1} MiB)",
        rss_sum as f64 / 1024.0,
        rss_sum as f64 / 1024.0 / VMS as f64,
        rss_max as f64 / 1024.0
    );

    let deletes = names.iter().map(|n| cloud.delete(n));
    for result in futures::future::join_all(deletes).await {
        result.expect("delete");
    }
    assert!(cloud.list().await.machines.is_empty());
    delete_nodes(&client, &names).await;
    eprintln!("total test time {:?}", began.elapsed());
}
