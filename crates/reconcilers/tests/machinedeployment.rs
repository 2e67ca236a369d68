//! MachineDeployment controller against a real control plane; the test plays the machine
//! controller (machines become Running as soon as they appear).

mod common_manager;

use std::collections::BTreeMap;

use common_manager::*;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::DeleteParams;
use kube::runtime::{WatchStreamExt, watcher};
use mcm_api::{
    Machine, MachineDeploymentStrategy, MachineDeploymentStrategyType,
    RollingUpdateMachineDeployment, UpdateConfiguration,
};
use serde_json::json;

fn rolling(surge: i32, unavailable: i32) -> Option<MachineDeploymentStrategy> {
    Some(MachineDeploymentStrategy {
        type_: Some(MachineDeploymentStrategyType::RollingUpdate),
        rolling_update: Some(RollingUpdateMachineDeployment {
            update_configuration: UpdateConfiguration {
                max_surge: Some(IntOrString::Int(surge)),
                max_unavailable: Some(IntOrString::Int(unavailable)),
            },
        }),
        in_place_update: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_0_1_6_2_then_delete_removes_every_machine() {
    let h = Harness::start("md-scale").await;
    create_deployment(&h, &deployment("md", 0, "c1", rolling(1, 0))).await;
    wait_list(h.sets(), "a set with 0 replicas", |s| s.len() == 1).await;
    patch_deployment(&h, "md", json!({"spec": {"replicas": 1}})).await;
    wait_machines(&h, "1 running", |m| {
        running_of_class(m, "c1") == 1 && m.len() == 1
    })
    .await;
    patch_deployment(&h, "md", json!({"spec": {"replicas": 6}})).await;
    wait_machines(&h, "6 running", |m| {
        running_of_class(m, "c1") == 6 && m.len() == 6
    })
    .await;
    patch_deployment(&h, "md", json!({"spec": {"replicas": 2}})).await;
    wait_machines(&h, "2 machines", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2
    })
    .await;
    wait_list(h.deployments(), "status 2 available", |d| {
        d.first()
            .and_then(|d| d.status.as_ref())
            .is_some_and(|s| s.available_replicas == Some(2) && s.replicas == Some(2))
    })
    .await;
    h.deployments()
        .delete("md", &DeleteParams::default())
        .await
        .expect("delete");
    wait_machines(&h, "no machines", |m| m.is_empty()).await;
    wait_list(h.sets(), "no sets", |s| s.is_empty()).await;
    wait_list(h.deployments(), "deployment gone", |d| d.is_empty()).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_never_drops_below_replicas() {
    let h = Harness::start("md-rolling").await;
    create_deployment(&h, &deployment("md", 4, "c1", rolling(1, 0))).await;
    wait_machines(&h, "4 running c1", |m| running_of_class(m, "c1") == 4).await;

    // Watch every machine event and check the invariant on each.
    let api = h.machines();
    let checker = tokio::spawn(async move {
        let mut running: BTreeMap<String, bool> = BTreeMap::new();
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut min_seen = usize::MAX;
        let mut ready = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(m)) | Ok(watcher::Event::InitApply(m)) => {
                    running.insert(m.name_any(), is_running(&m));
                }
                Ok(watcher::Event::Delete(m)) => {
                    running.remove(&m.name_any());
                }
                Ok(watcher::Event::InitDone) => ready = true,
                _ => {}
            }
            if ready {
                let n = running.values().filter(|r| **r).count();
                min_seen = min_seen.min(n);
                assert!(n >= 4, "only {n} running machines during the rollout");
                assert!(
                    running.len() <= 5,
                    "{} machines exceed replicas + maxSurge",
                    running.len()
                );
                if n == 4 && running.len() == 4 {
                    // Possibly done; the main task decides.
                }
            }
        }
        min_seen
    });
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"template": {"spec": {"class": {"name": "c2"}}}}}),
    )
    .await;
    wait_machines(&h, "4 running c2 only", |m| {
        running_of_class(m, "c2") == 4 && m.len() == 4
    })
    .await;
    assert!(
        !checker.is_finished(),
        "the invariant checker failed: {:?}",
        checker.await
    );
    checker.abort();
    wait_list(h.deployments(), "rollout complete", |d| {
        d.first()
            .and_then(|d| d.status.as_ref())
            .is_some_and(|s| s.updated_replicas == Some(4) && s.available_replicas == Some(4))
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_replaces_all_machines() {
    let h = Harness::start("md-recreate").await;
    let strategy = Some(MachineDeploymentStrategy {
        type_: Some(MachineDeploymentStrategyType::Recreate),
        ..MachineDeploymentStrategy::default()
    });
    create_deployment(&h, &deployment("md", 3, "c1", strategy)).await;
    wait_machines(&h, "3 running c1", |m| running_of_class(m, "c1") == 3).await;
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"template": {"spec": {"class": {"name": "c2"}}}}}),
    )
    .await;
    wait_machines(&h, "3 running c2 only", |m| {
        running_of_class(m, "c2") == 3 && m.len() == 3
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_and_resume_finishes_a_rollout() {
    let h = Harness::start("md-pause").await;
    create_deployment(&h, &deployment("md", 3, "c1", rolling(1, 0))).await;
    wait_machines(&h, "3 running c1", |m| running_of_class(m, "c1") == 3).await;
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"paused": true, "template": {"spec": {"class": {"name": "c2"}}}}}),
    )
    .await;
    // Paused: the rollout does not even start; the status records the observation.
    wait_list(h.deployments(), "paused observed", |d| {
        d.first().is_some_and(|d| {
            d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
        })
    })
    .await;
    let ms = h
        .machines()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    assert_eq!(running_of_class(&ms, "c1"), 3);
    assert_eq!(running_of_class(&ms, "c2"), 0);
    assert_eq!(
        h.sets()
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    patch_deployment(&h, "md", json!({"spec": {"paused": false}})).await;
    wait_machines(&h, "3 running c2 only", |m| {
        running_of_class(m, "c2") == 3 && m.len() == 3
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_during_rollout_finishes_both() {
    let h = Harness::start("md-scale-roll").await;
    create_deployment(&h, &deployment("md", 3, "c1", rolling(1, 0))).await;
    wait_machines(&h, "3 running c1", |m| running_of_class(m, "c1") == 3).await;
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"template": {"spec": {"class": {"name": "c2"}}}}}),
    )
    .await;
    wait_machines(&h, "a c2 machine", |m| running_of_class(m, "c2") >= 1).await;
    // Template change and scale-up together while two sets are active (MCM #816).
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"replicas": 5, "template": {"spec": {"class": {"name": "c3"}}}}}),
    )
    .await;
    wait_machines(&h, "5 running c3 only", |m| {
        running_of_class(m, "c3") == 5 && m.len() == 5
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_one_machines_go_first_on_trigger_deletion() {
    let h = Harness::start("md-trigger").await;
    create_deployment(&h, &deployment("md", 3, "c1", rolling(1, 0))).await;
    let ms = wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    let victim = ms[1].name_any();
    patch_deployment(
        &h,
        "md",
        json!({"metadata": {"annotations": {
            "node.machine.sapcloud.io/trigger-deletion-by-mcm": victim
        }}}),
    )
    .await;
    let left = wait_machines(&h, "2 machines", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2
    })
    .await;
    assert!(left.iter().all(|m: &Machine| m.name_any() != victim));
    let d = h.deployments().get("md").await.expect("get");
    assert_eq!(d.spec.replicas, Some(2));
    assert!(
        !d.annotations()
            .contains_key("node.machine.sapcloud.io/trigger-deletion-by-mcm")
    );
    h.stop().await;
}
