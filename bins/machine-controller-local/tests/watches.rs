//! One watch per kind per process: with both halves in one process
//! (`--controllers=machine,manager`) the API server holds exactly one more open watch of
//! each kind the controllers read than before the process started. The only test of its
//! binary: another test's controller would open watches of its own meanwhile.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use mcm_testenv::kit::eventually;
use serde_json::json;

/// The kinds the process reads, by the API server's resource name.
const KINDS: [&str; 7] = [
    "machines",
    "machinesets",
    "machinedeployments",
    "machineclasses",
    "secrets",
    "nodes",
    "volumeattachments",
];

/// Open WATCH requests per resource, from the API server's `apiserver_longrunning_requests`.
async fn open_watches(client: &kube::Client) -> BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(request)
        .await
        .expect("apiserver metrics");
    let mut watches = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_longrunning_requests{") else {
            continue;
        };
        if !rest.contains("verb=\"WATCH\"") {
            continue;
        }
        let Some(resource) = rest
            .split("resource=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *watches.entry(resource.to_string()).or_default() += value;
    }
    watches
}

/// The highest count per kind over a few samples: the other clients of the control plane
/// (kube-controller-manager) re-open their watches from time to time, which lowers a count
/// for a moment but never raises it.
async fn settled_watches(client: &kube::Client) -> BTreeMap<String, f64> {
    let mut max = BTreeMap::<String, f64>::new();
    for _ in 0..5 {
        for (kind, n) in open_watches(client).await {
            let e = max.entry(kind).or_default();
            *e = e.max(n);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    max
}

#[tokio::test]
async fn both_halves_in_one_process_open_one_watch_per_kind() {
    let h = Harness::new("watches", json!({})).await;
    let before = settled_watches(&h.client).await;
    let mc = h.spawn_controller("mc", &["--controllers=machine,manager".to_string()]);
    eventually(WAIT, "the controller to be ready", || async {
        mc.status_of("/readyz").await == Some(200)
    })
    .await;
    let after = settled_watches(&h.client).await;
    let added: BTreeMap<&str, f64> = KINDS
        .iter()
        .map(|k| {
            let of = |m: &BTreeMap<String, f64>| m.get(*k).copied().unwrap_or(0.0);
            (*k, of(&after) - of(&before))
        })
        .collect();
    eprintln!("watches opened by the process, per kind: {added:?}");
    for (kind, n) in &added {
        assert_eq!(*n, 1.0, "{kind}: {n} watches ({added:?})");
    }
}
