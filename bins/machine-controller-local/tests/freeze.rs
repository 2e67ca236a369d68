//! The target API server becomes unreachable for longer than
//! `--machine-safety-apiserver-statuscheck-timeout`: the controller freezes, no machine is
//! marked Failed during the outage, and after the path is restored it unfreezes and goes on.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use mcm_api::MachinePhase;
use mcm_testenv::kit::Proxy;
use serde_json::json;

const HEALTH_TIMEOUT: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_freezes_the_controller_and_no_machine_fails_meanwhile() {
    let h = Harness::new("freeze", json!({})).await;
    // The controller reaches the target cluster through a proxy the test controls; the VMs
    // use the direct kubeconfig of the class secret.
    let upstream: std::net::SocketAddr = h
        .env
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let proxy = Proxy::start(upstream).expect("the proxy starts");
    let target = kubeconfig_via(
        &h,
        &format!("https://127.0.0.1:{}", proxy.port),
        "target.kc",
    );
    let mc = h.spawn_controller(
        "mc",
        &[
            format!("--target-kubeconfig={}", target.display()),
            format!("--machine-health-timeout={}s", HEALTH_TIMEOUT.as_secs()),
            "--machine-safety-apiserver-statuscheck-timeout=3s".into(),
            "--machine-safety-apiserver-statuscheck-period=1s".into(),
        ],
    );
    h.create_machine("f1", "local").await;
    h.await_phase("f1", MachinePhase::Running, WAIT).await;
    assert_eq!(mc.metric("mcm_machine_controller_frozen").await, 0.0);
    let (recorder, phases) = record_phases(h.machines());

    // Crash the VM; once the machine is Unknown its health timeout runs.
    h.kill_vm("f1");
    h.await_phase("f1", MachinePhase::Unknown, WAIT).await;
    let unknown_at = Instant::now();
    proxy.cut().await;
    let cut_at = Instant::now();

    mc.await_metric(
        "mcm_machine_controller_frozen",
        Duration::from_secs(15),
        |v| v == 1.0,
    )
    .await;
    let frozen_after = cut_at.elapsed();
    eprintln!("frozen {frozen_after:?} after the cut");
    assert!(
        unknown_at.elapsed() < HEALTH_TIMEOUT,
        "the freeze must come before the health timeout expires"
    );
    // Measurement window: the outage lasts until the health timeout expired 4 s ago.
    // Nothing may become Failed meanwhile.
    let window_end = unknown_at + HEALTH_TIMEOUT + Duration::from_secs(4);
    tokio::time::sleep_until(window_end.into()).await;
    assert_eq!(
        mc.metric("mcm_machine_controller_frozen").await,
        1.0,
        "still frozen while the path is cut"
    );
    let during: Vec<String> = phases
        .lock()
        .unwrap()
        .get("f1")
        .cloned()
        .unwrap_or_default();
    assert!(
        !during.iter().any(|p| p == "Failed"),
        "a machine was marked Failed during the outage: {during:?}"
    );
    assert_eq!(
        h.machines().get("f1").await.unwrap().phase(),
        Some(&MachinePhase::Unknown)
    );

    // Restore: unfrozen, and the machine continues; its health timer restarted, so it fails
    // only after a fresh health timeout.
    proxy.restore().expect("the proxy port can be bound again");
    let restored_at = Instant::now();
    mc.await_metric(
        "mcm_machine_controller_frozen",
        Duration::from_secs(20),
        |v| v == 0.0,
    )
    .await;
    h.await_phase("f1", MachinePhase::Failed, WAIT).await;
    let failed_after = restored_at.elapsed();
    eprintln!("Failed {failed_after:?} after the restore");
    // Phase times are stored with second precision.
    assert!(
        failed_after >= HEALTH_TIMEOUT - Duration::from_secs(2),
        "the health timer was not restarted after the outage: Failed {failed_after:?} after the restore"
    );
    recorder.abort();
    // (The recorder may not have seen the last transition yet.)
    let seen = phases
        .lock()
        .unwrap()
        .get("f1")
        .cloned()
        .unwrap_or_default();
    assert_eq!(seen[..2], ["Running", "Unknown"], "{seen:?}");
    assert!(seen.len() <= 3, "{seen:?}");

    h.delete_machine("f1").await;
    h.await_gone("f1", WAIT).await;
    assert!(h.vm_records().is_empty());
    drop(proxy);
}

/// A kubeconfig like the admin one whose server is `server` (the proxy), written to the
/// harness's log directory; returns its path.
fn kubeconfig_via(h: &Harness, server: &str, file: &str) -> PathBuf {
    let text = h.kubeconfig().replace(h.env.server_url(), server);
    assert!(text.contains(server), "the kubeconfig names the server");
    let path = h.logs.path().join(file);
    std::fs::write(&path, text).unwrap();
    path
}
