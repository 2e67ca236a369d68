//! Two replicas with leader election: exactly one acts at a time, the standby is healthy and
//! ready, and it takes over when the leader dies.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use mcm_api::MachinePhase;
use mcm_testenv::kit::{await_object, eventually};
use serde_json::json;

const LEASE_DURATION: Duration = Duration::from_secs(4);

fn holder(l: &Lease) -> Option<String> {
    l.spec.as_ref()?.holder_identity.clone()
}

fn holds(identity: &str, c: &ControllerProcess) -> bool {
    identity.ends_with(&format!("_{}", c.pid()))
}

#[tokio::test]
async fn one_replica_leads_the_standby_is_ready_and_takes_over() {
    let h = Harness::new("leader", json!({})).await;
    let flags: Vec<String> = [
        "--leader-elect=true",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ]
    .map(String::from)
    .to_vec();
    let a = h.spawn_controller("replica-a", &flags);
    let b = h.spawn_controller("replica-b", &flags);
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), &h.ns);

    // Every holder the Lease ever had, from a watch.
    let holders: Arc<Mutex<Vec<String>>> = Default::default();
    let recorder = {
        let holders = holders.clone();
        let stream = kube::runtime::watcher(
            leases.clone(),
            kube::runtime::watcher::Config::default().fields("metadata.name=machine-controller"),
        )
        .default_backoff();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            // An error (a dropped watch on a loaded machine) is followed by the watcher's own
            // resume: the recording goes on instead of ending silently incomplete.
            while let Some(item) = stream.next().await {
                let ev = match item {
                    Ok(ev) => ev,
                    Err(e) => {
                        eprintln!("recording watch: {e}; resuming");
                        continue;
                    }
                };
                if let kube::runtime::watcher::Event::Apply(l)
                | kube::runtime::watcher::Event::InitApply(l) = ev
                    && let Some(id) = holder(&l).filter(|id| !id.is_empty())
                {
                    let mut hs = holders.lock().unwrap();
                    if hs.last() != Some(&id) {
                        hs.push(id);
                    }
                }
            }
        })
    };

    let lease = await_object(
        leases.clone(),
        "machine-controller",
        WAIT,
        "a replica to take the lease",
        |l: Option<&Lease>| l.and_then(holder).is_some_and(|h| !h.is_empty()),
    )
    .await
    .unwrap();
    let first = holder(&lease).unwrap();
    let (leader, standby) = if holds(&first, &a) {
        (a, b)
    } else {
        assert!(holds(&first, &b), "unknown holder {first}");
        (b, a)
    };

    // Both are alive; both are ready (a standby is ready: it waits for the lease).
    for c in [&leader, &standby] {
        eventually(WAIT, "/healthz", || async {
            c.status_of("/healthz").await == Some(200)
        })
        .await;
    }
    eventually(WAIT, "the leader to be ready", || async {
        leader.status_of("/readyz").await == Some(200)
    })
    .await;
    assert_eq!(standby.status_of("/readyz").await, Some(200));

    // Only the leader creates VMs.
    let names: Vec<String> = (1..=3).map(|i| format!("l{i}")).collect();
    for n in &names {
        h.create_machine(n, "local").await;
    }
    h.await_all_phase(&names, MachinePhase::Running, WAIT).await;
    assert_eq!(leader.metric("mcm_machine_vm_creations_total").await, 3.0);
    assert_eq!(
        standby.metric("mcm_machine_vm_creations_total").await,
        0.0,
        "the standby acted"
    );
    assert_eq!(standby.status_of("/readyz").await, Some(200));
    assert_eq!(standby.status_of("/healthz").await, Some(200));
    assert_eq!(
        holders.lock().unwrap().clone(),
        vec![first.clone()],
        "the lease changed hands without a reason"
    );

    // The leader dies: the standby takes over within about the lease duration.
    leader.kill().await;
    let killed_at = Instant::now();
    let taken = await_object(
        leases.clone(),
        "machine-controller",
        WAIT,
        "the standby to take the lease",
        {
            let pid = standby.pid();
            move |l: Option<&Lease>| {
                l.and_then(holder)
                    .is_some_and(|h| h.ends_with(&format!("_{pid}")))
            }
        },
    )
    .await
    .unwrap();
    let takeover = killed_at.elapsed();
    eprintln!("takeover after {takeover:?}");
    assert!(
        takeover <= LEASE_DURATION * 2 + Duration::from_secs(2),
        "the standby took {takeover:?} to take a {LEASE_DURATION:?} lease"
    );
    let second = holder(&taken).unwrap();

    // The new leader reconciles new machines (and the old ones).
    h.create_machine("l4", "local").await;
    h.await_phase("l4", MachinePhase::Running, WAIT).await;
    assert_eq!(standby.metric("mcm_machine_vm_creations_total").await, 1.0);
    let seen: BTreeSet<String> = holders.lock().unwrap().iter().cloned().collect();
    assert_eq!(seen, BTreeSet::from([first, second]));

    let all: Vec<String> = names.iter().cloned().chain(["l4".to_string()]).collect();
    for n in &all {
        h.delete_machine(n).await;
    }
    for n in &all {
        h.await_gone(n, WAIT).await;
    }
    assert!(h.vm_records().is_empty());
    recorder.abort();
}
