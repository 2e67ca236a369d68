//! Drain of a node with 50 pods with volumes, serially (parallelism 1, how MCM drains pods
//! with volumes) and with parallelism 10. Starts its own control plane; prints wall times.
//!
//! Run with `cargo bench -p mcm-drain --bench drain`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcm_drain::{Options, drain, start_volume_attachment_reflector};
use mcm_driver::FakeDriver;
use mcm_testenv::{Components, ControlPlane};
use support::*;

const PODS: usize = 50;

async fn run(cp: &ControlPlane, parallelism: usize) -> anyhow::Result<Duration> {
    let client = cp.client().await?;
    let ns = cp.namespace(&format!("bench-p{parallelism}")).await?;
    let node = node_name("bench", &ns);
    // Each pod takes 200ms to terminate, and its volume 300ms to detach afterwards.
    let _kubelet = FakeKubelet::start(
        client.clone(),
        &node,
        KubeletOptions {
            termination_delay: Duration::from_millis(200),
            attach_volumes: true,
            detach_delay: Some(Duration::from_millis(300)),
            ..Default::default()
        },
    )
    .await?;
    for i in 0..PODS {
        let (claim, _pv) = create_volume(&client, &ns, &format!("data-{i}")).await?;
        create_pod(
            &client,
            &ns,
            &format!("pod-{i}"),
            &node,
            &[("app", "bench")],
            Some(&claim),
        )
        .await?;
    }
    wait_ready(&client, &ns, PODS).await?;

    let reflector = start_volume_attachment_reflector(client.clone());
    let mut options = Options::new(Arc::new(FakeDriver::new()));
    options.timeout = Duration::from_secs(600);
    options.parallelism = parallelism;
    let started = Instant::now();
    let outcome = drain(client, &node, &options, &reflector.stores()).await?;
    let took = started.elapsed();
    anyhow::ensure!(
        outcome.evicted.len() == PODS,
        "evicted {}",
        outcome.evicted.len()
    );
    anyhow::ensure!(
        outcome.detached_volumes.len() == PODS,
        "detached {}",
        outcome.detached_volumes.len()
    );
    println!(
        "parallelism {parallelism:>2}: {PODS} pods with volumes drained in {took:.2?} (evict {:.2?}, wait for deletion {:.2?}, volume detach {:.2?})",
        outcome.phases.evict, outcome.phases.wait_for_deletion, outcome.phases.volume_detach
    );
    Ok(took)
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let cp = ControlPlane::start(mcm_testenv::Options {
            components: Components::API_SERVER,
            ..Default::default()
        })
        .await?;
        let serial = run(&cp, 1).await?;
        let parallel = run(&cp, 10).await?;
        println!(
            "serial {serial:.2?} vs parallel {parallel:.2?}: {:.1}x faster",
            serial.as_secs_f64() / parallel.as_secs_f64().max(f64::EPSILON)
        );
        anyhow::Ok(())
    })
}
