//! `--kube-api-qps` / `--kube-api-burst`: 50 machines created at once make the controller
//! send requests as fast as it may, never faster than qps×t + burst per client, and the limit
//! slows the work down without ever blocking it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kube::api::PostParams;
use mcm_api::MachinePhase;
use mcm_testenv::kit::{MachineBuilder, eventually, metric_with, scrape};
use serde_json::json;

const QPS: f64 = 10.0;
const BURST: f64 = 10.0;
const MACHINES: usize = 50;
const METRIC: &str = "mcm_kube_client_requests_total";

/// One reading of the counters: the request went out at `sent`, the answer came at
/// `received`; the counters were read in between.
#[derive(Debug, Clone, Copy)]
struct Sample {
    sent: Instant,
    received: Instant,
    control: f64,
    target: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_machines_respect_the_client_rate_limit_and_all_run() {
    let h = Harness::new("qps", json!({ "heartbeatInterval": "3s" })).await;
    let mc = h.spawn_controller(
        "mc",
        &[
            format!("--kube-api-qps={QPS}"),
            format!("--kube-api-burst={BURST}"),
        ],
    );
    let port = mc.port;
    mc.await_metric(METRIC, WAIT, |v| v > 0.0).await;

    let samples: Arc<Mutex<Vec<Sample>>> = Default::default();
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                let sent = Instant::now();
                if let Some(text) = scrape(port).await {
                    let received = Instant::now();
                    samples.lock().unwrap().push(Sample {
                        sent,
                        received,
                        control: metric_with(&text, METRIC, "cluster=\"control\""),
                        target: metric_with(&text, METRIC, "cluster=\"target\""),
                    });
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let names: Vec<String> = (0..MACHINES).map(|i| format!("q{i:02}")).collect();
    let started = Instant::now();
    futures::future::join_all(names.iter().map(|n| {
        let api = h.machines();
        let body = MachineBuilder::new(n).class("local").build();
        async move { api.create(&PostParams::default(), &body).await.unwrap() }
    }))
    .await;
    h.await_all_phase(&names, MachinePhase::Running, Duration::from_secs(150))
        .await;
    let took = started.elapsed();
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    let (first, last) = (samples[0], samples[samples.len() - 1]);
    eprintln!(
        "{MACHINES} machines Running after {took:?}; {} samples; requests: control {}, target {}",
        samples.len(),
        last.control - first.control,
        last.target - first.target
    );

    // The bound, for every pair of samples and each client (each has its own bucket, like
    // client-go's per-config limiter). The interval is taken at its widest (first request
    // sent .. second answer received) and one request of slack covers the counter being
    // read at any point in between.
    let mut busiest = 0.0f64;
    for (i, a) in samples.iter().enumerate() {
        for b in &samples[i + 1..] {
            let secs = b.received.duration_since(a.sent).as_secs_f64();
            let allowed = QPS * secs + BURST + 1.0;
            for (cluster, sent) in [
                ("control", b.control - a.control),
                ("target", b.target - a.target),
            ] {
                assert!(
                    sent <= allowed,
                    "{cluster} client sent {sent} requests in {secs:.2}s; at most {allowed:.1} allowed"
                );
            }
            if (5.0..6.0).contains(&secs) {
                busiest = busiest.max((b.control - a.control) / secs);
            }
        }
    }
    eprintln!("busiest 5-6 s window of the control client: {busiest:.1} requests/s");
    // The limit was what paced the work (and the counter counts): the controller pressed
    // against it.
    assert!(
        busiest >= QPS * 0.7,
        "the control client never approached the limit ({busiest:.1}/s): is it counted?"
    );

    // Clean up with an unthrottled controller (deletion is not what is measured here).
    mc.kill().await;
    let _cleaner = h.spawn_controller("cleaner", &[]);
    for n in &names {
        h.delete_machine(n).await;
    }
    eventually(
        Duration::from_secs(150),
        "all machines to be deleted",
        || async {
            let left = h.machines().list(&Default::default()).await.unwrap().items;
            if left.is_empty() {
                Ok(())
            } else {
                Err(left.len())
            }
        },
    )
    .await;
    assert!(h.vm_records().is_empty(), "{:?}", h.vm_records());
}
