//! MachineDeployment controller against a real control plane; the test plays the machine
//! controller (machines become Running as soon as they appear) and, for in-place updates,
//! the machine controller's in-place part and the node agent.

mod common_manager;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common_manager::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use mcm_api::constants::{annotations, labels, taints};
use mcm_api::{
    ConditionStatus, InPlaceUpdateMachineDeployment, Machine, MachineDeployment,
    MachineDeploymentCondition, MachineDeploymentConditionType, MachineDeploymentStatus,
    MachineDeploymentStrategy, MachineDeploymentStrategyType, MachineSet, OrchestrationType,
    UpdateConfiguration,
};
use mcm_reconcilers::in_place as mc_inplace;
use mcm_testenv::kit::{
    MachineDeploymentBuilder, await_list, consistently, create_ready_node, eventually,
};
use serde_json::json;

/// Bound for reactions to a deletion: far below the 600 s resync, so a deployment that only
/// notices at the resync fails.
const PROMPT: Duration = Duration::from_secs(15);

/// A rolling-update deployment `md` of class `c1` (`maxSurge` 1, `maxUnavailable` 0).
fn md(replicas: i32) -> MachineDeploymentBuilder {
    MachineDeploymentBuilder::new("md")
        .replicas(replicas)
        .class("c1")
        .rolling(1, 0)
}

/// Creates `md` with 3 machines of class `c1` and waits until they run.
async fn start_with_3_c1(h: &Harness) {
    create_deployment(h, &md(3).build()).await;
    wait_machines(h, "3 running c1", |m| running_of_class(m, "c1") == 3).await;
}

/// Rolls `md` out to the class `class`.
async fn roll_to(h: &Harness, class: &str) {
    patch_deployment(
        h,
        "md",
        json!({"spec": {"template": {"spec": {"class": {"name": class}}}}}),
    )
    .await;
}

/// Waits until exactly `n` machines exist, all running and of class `class`.
async fn wait_only(h: &Harness, n: usize, class: &str) {
    wait_machines(h, &format!("{n} running {class} only"), |m| {
        running_of_class(m, class) == n && m.len() == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_0_1_6_2_then_delete_removes_every_machine() {
    let h = Harness::start("md-scale").await;
    create_deployment(&h, &md(0).build()).await;
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
    create_deployment(&h, &md(4).build()).await;
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
    roll_to(&h, "c2").await;
    wait_only(&h, 4, "c2").await;
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
    let recreate = MachineDeploymentBuilder::new("md")
        .replicas(3)
        .class("c1")
        .recreate()
        .build();
    create_deployment(&h, &recreate).await;
    wait_machines(&h, "3 running c1", |m| running_of_class(m, "c1") == 3).await;
    roll_to(&h, "c2").await;
    wait_only(&h, 3, "c2").await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_and_resume_finishes_a_rollout() {
    let h = Harness::start("md-pause").await;
    start_with_3_c1(&h).await;
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
    wait_only(&h, 3, "c2").await;
    h.stop().await;
}

/// Paused with a template of an earlier set (the set exists, so a resume would roll back to
/// it at once): as in the Go MCM, which only scales a paused deployment, no Node gets the
/// old-set taint or the autoscaler's scale-down-disabled annotation until it is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_deployment_marks_no_node() {
    let h = Harness::start("md-pause-marks").await;
    start_with_3_c1(&h).await;
    roll_to(&h, "c2").await;
    wait_only(&h, 3, "c2").await;
    let ms = h
        .machines()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let nodes = give_nodes(&h, &ms).await;
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"paused": true, "template": {"spec": {"class": {"name": "c1"}}}}}),
    )
    .await;
    // The reconcile that records the observation has applied its markers before.
    wait_list(h.deployments(), "paused observed", |d| {
        d.first().is_some_and(|d| {
            d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
        })
    })
    .await;
    for node in nodes.values() {
        let n = nodes_api(&h).get(node).await.expect("node");
        let taints: Vec<&str> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .map(|t| t.key.as_str())
            .collect();
        assert!(
            !taints.contains(&taints::PREFER_NO_SCHEDULE),
            "{node}: {taints:?}"
        );
        assert!(
            !n.annotations()
                .contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED),
            "{node}: {:?}",
            n.annotations()
        );
    }
    // Resumed, the rollback to c1 runs and marks the Nodes of the old set meanwhile.
    patch_deployment(&h, "md", json!({"spec": {"paused": false}})).await;
    wait_only(&h, 3, "c1").await;
    delete_nodes(&h).await;
    h.stop().await;
}

/// The Events Go clients filter on, with the Go MCM's reasons and texts: on the deployment
/// `ScalingMachineSet` for each set it scales (a new set created with machines included),
/// on the sets `SuccessfulCreate`/`SuccessfulDelete`; no other reason for the same change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_events_carry_the_go_reasons() {
    let h = Harness::start("md-events").await;
    start_with_3_c1(&h).await;
    roll_to(&h, "c2").await;
    wait_only(&h, 3, "c2").await;
    let sets = h
        .sets()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let old = set_of_class(&sets, "c1").expect("the c1 set").name_any();
    let new = set_of_class(&sets, "c2").expect("the c2 set").name_any();
    // One Event per change; the recorder counts repeats of a reason in the Event's series
    // (3 changes: the first set up to 3, the new set up to 1, the old set down, by steps).
    let scaling = eventually(WAIT, "the deployment's scaling Events", || async {
        let events = events_of(&h, "ScalingMachineSet").await;
        let count: i32 = events.iter().map(occurrences).sum();
        if count >= 3 {
            Ok(Some(events))
        } else {
            Err(format!("{count} ScalingMachineSet Events: {events:#?}"))
        }
    })
    .await;
    let first = scaling[0].note.clone().unwrap_or_default();
    assert_eq!(first, format!("Scaled up machine set {old} to 3"));
    let all = Api::<Event>::namespaced(h.client.clone(), &h.ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items;
    let reasons_on = |name: &str| -> BTreeSet<String> {
        all.iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reason.clone())
            .collect()
    };
    assert_eq!(
        reasons_on("md"),
        BTreeSet::from(["ScalingMachineSet".to_string()]),
        "{all:#?}"
    );
    assert_eq!(
        reasons_on(&old),
        BTreeSet::from([
            "SuccessfulCreate".to_string(),
            "SuccessfulDelete".to_string()
        ])
    );
    assert_eq!(
        reasons_on(&new),
        BTreeSet::from(["SuccessfulCreate".to_string()])
    );
    h.stop().await;
}

/// How many times an Event happened: an Event written as client-go writes it (`core/v1`)
/// counts in `count` (`deprecatedCount` here), one of `events.k8s.io` in its series.
fn occurrences(e: &Event) -> i32 {
    e.series
        .as_ref()
        .map(|s| s.count)
        .or(e.deprecated_count)
        .unwrap_or(1)
}

/// The notes of `events`, oldest first (an Event's name ends in the time of its first
/// occurrence in nanoseconds, in hexadecimal: finer than its timestamps).
fn notes_in_order(mut events: Vec<Event>) -> Vec<String> {
    let created = |e: &Event| {
        let name = e.metadata.name.as_deref().unwrap_or_default();
        i128::from_str_radix(name.rsplit('.').next().unwrap_or_default(), 16).unwrap_or(0)
    };
    events.sort_by_key(created);
    events.into_iter().filter_map(|e| e.note).collect()
}

/// Scaling 3 → 5 → 4 → 6: each step is an Event of its own with its own target, as the Go
/// MCM's recorder writes them, not a count on the first step's Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scaling_step_is_an_event_with_its_target() {
    let h = Harness::start("md-scale-events").await;
    start_with_3_c1(&h).await;
    for replicas in [5, 4, 6] {
        patch_deployment(&h, "md", json!({"spec": {"replicas": replicas}})).await;
        wait_only(&h, replicas as usize, "c1").await;
    }
    let set = h
        .sets()
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .next()
        .expect("the set")
        .name_any();
    let expected = [
        format!("Scaled up machine set {set} to 3"),
        format!("Scaled up machine set {set} to 5"),
        format!("Scaled down machine set {set} to 4"),
        format!("Scaled up machine set {set} to 6"),
    ];
    let seen = eventually(WAIT, "an Event per scaling step", || async {
        let events = events_of(&h, "ScalingMachineSet").await;
        let counts: Vec<i32> = events.iter().map(occurrences).collect();
        let notes = notes_in_order(events);
        if notes == expected && counts.iter().all(|c| *c == 1) {
            Ok(Some(notes))
        } else {
            Err(format!(
                "ScalingMachineSet notes {notes:?}, counts {counts:?}"
            ))
        }
    })
    .await;
    assert_eq!(seen, expected);
    // On the set: an Event per batch of creations, naming its machines, and one for the
    // deletion.
    let machines = h
        .machines()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let on_set = |reason: &'static str| {
        let h = &h;
        let set = set.clone();
        async move { notes_in_order(events_about(h, &set, reason).await) }
    };
    let created = eventually(WAIT, "the set's creation Events", || async {
        let notes = on_set("SuccessfulCreate").await;
        let named = machines
            .iter()
            .all(|m| notes.iter().any(|n| n.contains(&m.name_any())));
        if notes.len() >= 3 && named {
            Ok(Some(notes))
        } else {
            Err(format!("SuccessfulCreate notes {notes:?}"))
        }
    })
    .await;
    assert!(created.len() >= 3, "{created:?}");
    let deleted = eventually(WAIT, "the set's deletion Event", || async {
        let notes = on_set("SuccessfulDelete").await;
        if notes.len() == 1 {
            Ok(Some(notes))
        } else {
            Err(format!("SuccessfulDelete notes {notes:?}"))
        }
    })
    .await;
    assert!(deleted[0].starts_with("Deleted machine"), "{deleted:?}");
    h.stop().await;
}

/// A deployment whose set the Go MCM created (named `<deployment>-<5 characters>` after Go's
/// decimal template hash, which the label carries) and whose machines run, taken over by a
/// manager that starts on them: the set is the deployment's new set, no set is created and
/// no machine replaced. A manager that reconciled before its set store had listed created a
/// set of its own name, and rolled the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_the_go_mcm_named_is_taken_over_without_a_rollout() {
    let (client, ns) = Harness::namespace("md-go-set").await;
    let mds: Api<MachineDeployment> = Api::namespaced(client.clone(), &ns);
    let created = mds
        .create(&PostParams::default(), &md(2).build())
        .await
        .expect("create md");
    let hash = "2736514098";
    let mut template = serde_json::to_value(&created.spec.template).expect("template");
    template["metadata"]["labels"][labels::MACHINE_TEMPLATE_HASH] = json!(hash);
    let mut selector = serde_json::to_value(&created.spec.selector).expect("selector");
    selector["matchLabels"][labels::MACHINE_TEMPLATE_HASH] = json!(hash);
    let owner = |kind: &str, name: &str, uid: Option<String>| {
        json!([{ "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": kind, "name": name,
                 "uid": uid, "controller": true, "blockOwnerDeletion": true }])
    };
    let set: MachineSet = serde_json::from_value(json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
        "metadata": {
            "name": "md-6c7b9",
            "labels": template["metadata"]["labels"],
            "annotations": { annotations::REVISION: "1" },
            "ownerReferences": owner("MachineDeployment", "md", created.uid()),
        },
        "spec": { "replicas": 2, "selector": selector, "template": template },
    }))
    .expect("set");
    let sets: Api<MachineSet> = Api::namespaced(client.clone(), &ns);
    let set = sets
        .create(&PostParams::default(), &set)
        .await
        .expect("create set");
    let machines: Api<Machine> = Api::namespaced(client.clone(), &ns);
    for name in ["md-6c7b9-fq8zx", "md-6c7b9-r2b6c"] {
        let m: Machine = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {
                "name": name,
                "labels": template["metadata"]["labels"],
                "ownerReferences": owner("MachineSet", "md-6c7b9", set.uid()),
            },
            "spec": template["spec"],
        }))
        .expect("machine");
        machines
            .create(&PostParams::default(), &m)
            .await
            .expect("create machine");
        machines
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"currentStatus": {
                    "phase": "Running", "lastUpdateTime": Time(jiff::Timestamp::now()),
                }}})),
            )
            .await
            .expect("running");
    }

    let h = Harness::start_in(client, ns).await;
    // The reconcile that records the observation has decided about the sets.
    wait_list(
        h.deployments(),
        "the deployment observed with 2 available",
        |d| {
            d.first().is_some_and(|d| {
                let s = d.status.as_ref();
                s.and_then(|s| s.observed_generation) == d.metadata.generation
                    && s.and_then(|s| s.available_replicas) == Some(2)
            })
        },
    )
    .await;
    let names: Vec<String> = h
        .sets()
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert_eq!(names, ["md-6c7b9"]);
    let ms = h
        .machines()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let mut names: Vec<String> = ms.iter().map(|m| m.name_any()).collect();
    names.sort();
    assert_eq!(names, ["md-6c7b9-fq8zx", "md-6c7b9-r2b6c"]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_during_rollout_finishes_both() {
    let h = Harness::start("md-scale-roll").await;
    start_with_3_c1(&h).await;
    roll_to(&h, "c2").await;
    wait_machines(&h, "a c2 machine", |m| running_of_class(m, "c2") >= 1).await;
    // Template change and scale-up together while two sets are active (MCM #816).
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"replicas": 5, "template": {"spec": {"class": {"name": "c3"}}}}}),
    )
    .await;
    wait_only(&h, 5, "c3").await;
    h.stop().await;
}

/// A bare name in `trigger-deletion-by-mcm` (the autoscaler before 2026 writes them) with
/// the replicas unchanged: the machine is marked with the replica-change time, deleted and
/// replaced; the replicas stay what the scaler wrote (upstream never changes them for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_named_for_deletion_goes_and_the_replicas_stay() {
    let h = Harness::start("md-trigger").await;
    create_deployment(&h, &md(3).build()).await;
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
    let left = wait_machines(&h, "the named machine replaced", |m| {
        m.len() == 3
            && running_of_class(m, "c1") == 3
            && m.iter().all(|m: &Machine| m.name_any() != victim)
    })
    .await;
    assert_eq!(left.len(), 3);
    let d = wait_list(h.deployments(), "the annotation handled", |d| {
        d.first().is_some_and(|d| {
            !d.annotations()
                .contains_key("node.machine.sapcloud.io/trigger-deletion-by-mcm")
        })
    })
    .await;
    assert_eq!(d[0].spec.replicas, Some(3));
    h.stop().await;
}

/// A rollout of machines that boot slowly, while the old ones are deleted: every machine
/// turning Running reaches its set at once (no set misses it and stalls the rollout until
/// something else touches the set). Each step is bounded by [`PROMPT`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_rollout_never_misses_a_machine_turning_running() {
    let boot = Duration::from_secs(2);
    let h = Harness::start_slow("md-slow", boot).await;
    create_deployment(&h, &md(4).build()).await;
    wait_machines(&h, "4 running c1", |m| running_of_class(m, "c1") == 4).await;
    roll_to(&h, "c2").await;
    for n in 1..=4usize {
        await_list(
            h.machines(),
            PROMPT + boot,
            &format!("{n} running c2"),
            |m| running_of_class(m, "c2") >= n,
        )
        .await;
    }
    await_list(h.machines(), PROMPT + boot, "only c2", |m| {
        m.len() == 4 && running_of_class(m, "c2") == 4
    })
    .await;
    await_list(h.deployments(), PROMPT, "the rollout complete", |d| {
        observed_status(d).is_some_and(|s| {
            s.updated_replicas == Some(4)
                && s.available_replicas == Some(4)
                && s.replicas == Some(4)
        })
    })
    .await;
    h.stop().await;
}

/// What a Node carried at some moment while watched: the old-set taint, and the autoscaler's
/// scale-down-disabled annotation (with MCM's marker of having set it).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Markers {
    tainted: bool,
    annotated: bool,
}

fn markers_of(n: &Node) -> Markers {
    let anns = n.annotations();
    Markers {
        tainted: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == taints::PREFER_NO_SCHEDULE)),
        annotated: anns.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED)
            && anns.contains_key(annotations::CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM),
    }
}

/// During a rollout, the Nodes of the old set get the old-set taint and the autoscaler's
/// scale-down-disabled annotation, a new machine's Node the annotation only (as the Go MCM
/// marks the Nodes of every set), and once the rollout is over the annotations go again. The
/// new Node is written to just after it appears, so the manager's copy of it is likely behind
/// when it annotates it (the annotation is merged without a resourceVersion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_marks_the_nodes_and_takes_the_annotations_off_after() {
    let boot = Duration::from_secs(4);
    let h = Harness::start_slow("md-markers", boot).await;
    create_deployment(&h, &md(2).build()).await;
    let old = wait_machines(&h, "2 running c1", |m| running_of_class(m, "c1") == 2).await;
    let old_nodes = give_nodes(&h, &old).await;
    // Every marker each Node was ever seen with.
    let seen: Arc<std::sync::Mutex<BTreeMap<String, Markers>>> = Arc::default();
    let recorder = tokio::spawn({
        let seen = seen.clone();
        let config = watcher::Config::default().labels(&format!("{TEST_NODE_LABEL}={}", h.ns));
        let mut stream = watcher(nodes_api(&h), config).default_backoff().boxed();
        async move {
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev {
                    let now = markers_of(&n);
                    let mut seen = seen.lock().expect("seen");
                    let was = seen.entry(n.name_any()).or_default();
                    was.tainted |= now.tainted;
                    was.annotated |= now.annotated;
                }
            }
        }
    });
    roll_to(&h, "c2").await;
    // Each new machine gets its Node as soon as it exists, while it still boots.
    let mut new_nodes = BTreeMap::new();
    while new_nodes.len() < 2 {
        let ms = wait_machines(&h, "a new c2 machine without a Node", |m| {
            m.iter().any(|m| {
                class_of(m).as_deref() == Some("c2") && !new_nodes.contains_key(&m.name_any())
            })
        })
        .await;
        let fresh: Vec<Machine> = ms
            .into_iter()
            .filter(|m| {
                class_of(m).as_deref() == Some("c2") && !new_nodes.contains_key(&m.name_any())
            })
            .collect();
        for (machine, node) in give_nodes(&h, &fresh).await {
            let bump = json!({"metadata": {"labels": {"test.mcm-rs.io/bumped": "true"}}});
            nodes_api(&h)
                .patch(&node, &PatchParams::default(), &Patch::Merge(&bump))
                .await
                .expect("write to the new node");
            new_nodes.insert(machine, node);
        }
    }
    wait_only(&h, 2, "c2").await;
    await_list(h.deployments(), PROMPT, "the rollout complete", |d| {
        observed_status(d).is_some_and(|s| s.updated_replicas == Some(2) && s.replicas == Some(2))
    })
    .await;
    // The new Nodes lose MCM's annotations once the rollout is over.
    for node in new_nodes.values() {
        eventually(
            PROMPT,
            &format!("{node} without the annotations"),
            || async {
                let n = nodes_api(&h).get(node).await.expect("node");
                (!markers_of(&n).annotated).then_some(())
            },
        )
        .await;
    }
    recorder.abort();
    let seen = seen.lock().expect("seen").clone();
    for node in old_nodes.values() {
        let markers = seen.get(node).copied().unwrap_or_default();
        assert_eq!(
            markers,
            Markers {
                tainted: true,
                annotated: true
            },
            "old node {node}: {seen:?}"
        );
    }
    for node in new_nodes.values() {
        let markers = seen.get(node).copied().unwrap_or_default();
        assert_eq!(
            markers,
            Markers {
                tainted: false,
                annotated: true
            },
            "new node {node}: {seen:?}"
        );
    }
    delete_nodes(&h).await;
    h.stop().await;
}

/// The node-template labels of a machine or set template spec.
fn node_labels(spec: Option<&mcm_api::MachineSpec>) -> BTreeMap<String, String> {
    spec.and_then(|s| s.node_template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// As upstream: a change of the node template, the machine configuration or the class kind
/// is written into the existing set and its machines, not rolled out; a label removed from
/// the node template is removed from them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_template_change_is_applied_in_place_not_rolled_out() {
    let h = Harness::start("md-nodetemplate").await;
    let mut d = md(2).build();
    if let Some(spec) = d.spec.template.spec.as_mut() {
        spec.node_template = Some(mcm_api::NodeTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([
                    ("a".to_owned(), "1".to_owned()),
                    ("b".to_owned(), "2".to_owned()),
                ])),
                ..ObjectMeta::default()
            }),
            spec: None,
        });
    }
    create_deployment(&h, &d).await;
    let before = wait_machines(&h, "2 running", |m| running_of_class(m, "c1") == 2).await;
    let set = wait_list(h.sets(), "one set", |s| s.len() == 1).await;
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"template": {"spec": {
            "nodeTemplate": {"metadata": {"labels": {"b": null, "c": "3"}}},
            "drainTimeout": "1h",
        }}}}),
    )
    .await;
    let want = BTreeMap::from([
        ("a".to_owned(), "1".to_owned()),
        ("c".to_owned(), "3".to_owned()),
    ]);
    let sets = wait_list(h.sets(), "the set's node template updated", |s| {
        s.len() == 1
            && node_labels(s[0].spec.template.as_ref().and_then(|t| t.spec.as_ref())) == want
    })
    .await;
    assert_eq!(sets[0].name_any(), set[0].name_any(), "no new set");
    let drain = sets[0]
        .spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.configuration.drain_timeout);
    assert_eq!(drain.map(|d| d.0), Some(Duration::from_secs(3600)));
    let after = wait_machines(&h, "the machines' node templates updated", |m| {
        m.len() == 2 && m.iter().all(|m| node_labels(Some(&m.spec)) == want)
    })
    .await;
    let names = |ms: &[Machine]| {
        ms.iter()
            .map(ResourceExt::name_any)
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(names(&after), names(&before), "no machine replaced");
    h.stop().await;
}

/// The first deployment's status, when its generation is observed.
fn observed_status(d: &[MachineDeployment]) -> Option<&MachineDeploymentStatus> {
    let d = d.first()?;
    let status = d.status.as_ref()?;
    (status.observed_generation == d.metadata.generation).then_some(status)
}

fn counts(s: &MachineDeploymentStatus) -> [Option<i32>; 5] {
    [
        s.replicas,
        s.updated_replicas,
        s.ready_replicas,
        s.available_replicas,
        s.unavailable_replicas,
    ]
}

/// A deployment counts a machine that disappears at once (deleted without finalizers: a
/// watch `Delete` event is all there is) within seconds. Scale-up is disabled on its set
/// (through the template's labels), so nothing replaces the machine and the counters must
/// drop from 2 to 1; the test makes the machines and the set adopts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_follow_a_machine_that_disappears() {
    let h = Harness::start("md-machine-gone").await;
    let mut d = md(2).build();
    d.spec
        .template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(labels::MACHINE_SET_SCALE_UP_DISABLED.into(), "true".into());
    create_deployment(&h, &d).await;
    let sets = wait_list(h.sets(), "one set", |s| s.len() == 1).await;
    let template = sets[0].spec.template.clone().expect("template");
    for i in 0..2 {
        let m = Machine {
            metadata: ObjectMeta {
                name: Some(format!("m{i}")),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: template.spec.clone().unwrap_or_default(),
            ..Machine::default()
        };
        h.machines()
            .create(&PostParams::default(), &m)
            .await
            .expect("create machine");
    }
    let set_uid = sets[0].metadata.uid.clone().expect("uid");
    wait_machines(&h, "2 adopted and running", |m| {
        running_of_class(m, "c1") == 2
            && m.iter()
                .all(|m| m.owner_references().iter().any(|o| o.uid == set_uid))
    })
    .await;
    wait_list(h.deployments(), "2 machines counted", |d| {
        observed_status(d)
            .is_some_and(|s| counts(s) == [Some(2), Some(2), Some(2), Some(2), Some(0)])
    })
    .await;
    h.machines()
        .delete("m0", &DeleteParams::default())
        .await
        .expect("delete machine");
    await_list(h.deployments(), PROMPT, "1 machine counted", |d| {
        observed_status(d)
            .is_some_and(|s| counts(s) == [Some(1), Some(1), Some(1), Some(1), Some(1)])
    })
    .await;
    h.stop().await;
}

/// A deployment notices within seconds that one of its MachineSets is gone. The set is held
/// by a test finalizer until its machines are gone and the deployment counts 0 machines (it
/// cannot create its new set while the old one of the same name still exists); then the
/// last finalizer goes and the set disappears with nothing but a watch `Delete` event. The
/// deployment must create a new set and count its machines, not wait for the resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_machine_set_is_replaced_and_counted_promptly() {
    let h = Harness::start("md-set-gone").await;
    create_deployment(&h, &md(2).build()).await;
    wait_machines(&h, "2 running", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2
    })
    .await;
    let sets = wait_list(h.sets(), "one set", |s| s.len() == 1).await;
    wait_list(h.deployments(), "2 machines counted", |d| {
        observed_status(d)
            .is_some_and(|s| counts(s) == [Some(2), Some(2), Some(2), Some(2), Some(0)])
    })
    .await;
    let (set, old_uid) = (sets[0].name_any(), sets[0].metadata.uid.clone());
    let mut finalizers = sets[0].finalizers().to_vec();
    finalizers.push("test/hold".into());
    h.sets()
        .patch(
            &set,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .expect("hold the set");
    h.sets()
        .delete(&set, &DeleteParams::default())
        .await
        .expect("delete set");
    wait_machines(&h, "no machines", |m| m.is_empty()).await;
    wait_list(h.sets(), "only the test finalizer left", |s| {
        s.len() == 1 && s[0].finalizers() == ["test/hold"]
    })
    .await;
    wait_list(h.deployments(), "no machine counted", |d| {
        observed_status(d)
            .is_some_and(|s| counts(s) == [Some(0), Some(0), Some(0), Some(0), Some(2)])
    })
    .await;
    h.sets()
        .patch(
            &set,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the set");
    let sets = await_list(h.sets(), PROMPT, "a new set", |s| {
        s.len() == 1 && s[0].metadata.uid != old_uid
    })
    .await;
    assert_eq!(sets[0].name_any(), set, "same template, same name");
    await_list(h.deployments(), PROMPT, "2 new machines counted", |d| {
        observed_status(d)
            .is_some_and(|s| counts(s) == [Some(2), Some(2), Some(2), Some(2), Some(0)])
    })
    .await;
    h.stop().await;
}

fn progressing(d: &MachineDeployment) -> Option<&MachineDeploymentCondition> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == MachineDeploymentConditionType::Progressing)
}

fn is_invalid_strategy(c: &MachineDeploymentCondition, message: &str) -> bool {
    c.status == ConditionStatus::False
        && c.reason.as_deref() == Some("InvalidStrategy")
        && c.message.as_deref() == Some(message)
}

/// `maxSurge: "abc"` stops the deployment with a `Progressing=False, InvalidStrategy`
/// condition naming field and value (kept through spec changes, with one Warning Event);
/// fixing the strategy replaces the condition and the rollout proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_strategy_is_a_condition_until_fixed() {
    let h = Harness::start("md-invalid").await;
    // Malformed limits are refused at admission now; a strategy type the controller does
    // not implement can only be reported.
    let mut d = MachineDeploymentBuilder::new("md")
        .replicas(2)
        .class("c1")
        .max_surge(IntOrString::Int(1))
        .max_unavailable(IntOrString::Int(0))
        .build();
    d.spec.progress_deadline_seconds = Some(600);
    if let Some(strategy) = d.spec.strategy.as_mut() {
        strategy.type_ = Some("BlueGreen".into());
    }
    create_deployment(&h, &d).await;
    let message = r#"spec.strategy.type: "BlueGreen" is not supported by this controller (use Recreate, RollingUpdate or InPlaceUpdate)"#;
    wait_list(h.deployments(), "the InvalidStrategy condition", |d| {
        observed_status(d).is_some()
            && progressing(&d[0]).is_some_and(|c| is_invalid_strategy(c, message))
    })
    .await;
    let sets = h
        .sets()
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    assert!(sets.is_empty(), "no set for an invalid strategy: {sets:#?}");

    // Still invalid after a spec change: the status follows the generation.
    patch_deployment(&h, "md", json!({"spec": {"replicas": 3}})).await;
    wait_list(
        h.deployments(),
        "generation 2 observed, still invalid",
        |d| {
            observed_status(d).is_some()
                && d[0].metadata.generation == Some(2)
                && progressing(&d[0]).is_some_and(|c| is_invalid_strategy(c, message))
        },
    )
    .await;

    // Fixed: the condition is replaced and the machines come.
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"strategy": {"type": "RollingUpdate"}}}),
    )
    .await;
    wait_machines(&h, "3 running", |m| {
        m.len() == 3 && running_of_class(m, "c1") == 3
    })
    .await;
    wait_list(h.deployments(), "the condition replaced", |d| {
        observed_status(d).is_some_and(|s| s.available_replicas == Some(3))
            && progressing(&d[0]).is_some_and(|c| {
                c.status == ConditionStatus::True && c.reason.as_deref() != Some("InvalidStrategy")
            })
    })
    .await;

    // One Warning Event for the whole episode (the generation-2 reconcile is long over).
    let events = events_of(&h, "InvalidStrategy").await;
    assert_eq!(events.len(), 1, "one InvalidStrategy event: {events:#?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(events[0].note.as_deref(), Some(message));
    assert_eq!(
        occurrences(&events[0]),
        1,
        "published once, not repeated: {:#?}",
        events[0]
    );
    h.stop().await;
}

/// The Events of `reason` about the deployment `md`.
async fn events_of(h: &Harness, reason: &str) -> Vec<Event> {
    events_about(h, "md", reason).await
}

/// The Events of `reason` about the object `name` of the harness's namespace.
async fn events_about(h: &Harness, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(h.client.clone(), &h.ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

/// Waits until `md` has no `rollbackTo` and its template names `class`.
async fn wait_rollback_done(h: &Harness, class: &str) {
    wait_list(h.deployments(), "rollbackTo cleared", |d| {
        d.first().is_some_and(|d| {
            d.spec.rollback_to.is_none()
                && d.spec
                    .template
                    .spec
                    .as_ref()
                    .and_then(|s| s.class.as_ref())
                    .and_then(|c| c.name.as_deref())
                    == Some(class)
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_restores_a_revision_and_is_cleared() {
    let h = Harness::start("md-rollback").await;
    start_with_3_c1(&h).await;
    roll_to(&h, "c2").await;
    wait_only(&h, 3, "c2").await;

    // Revision 0: the previous one (c1), rolled out again with its old set.
    patch_deployment(&h, "md", json!({"spec": {"rollbackTo": {"revision": 0}}})).await;
    wait_rollback_done(&h, "c1").await;
    wait_only(&h, 3, "c1").await;
    let sets = h
        .sets()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    assert_eq!(sets.len(), 2, "the c1 set was reused, no third set");
    let done = events_of(&h, "DeploymentRollback").await;
    assert_eq!(done.len(), 1, "{done:#?}");
    assert_eq!(
        done[0].note.as_deref(),
        Some("Rolled back deployment \"md\" to revision 1")
    );

    // A revision that does not exist: a Warning, the template stays.
    patch_deployment(&h, "md", json!({"spec": {"rollbackTo": {"revision": 42}}})).await;
    wait_rollback_done(&h, "c1").await;
    let missing = events_of(&h, "DeploymentRollbackRevisionNotFound").await;
    assert_eq!(missing.len(), 1, "{missing:#?}");
    assert_eq!(missing[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        missing[0].note.as_deref(),
        Some("Unable to find the revision to rollback to.")
    );

    // The current revision: unchanged, said so.
    let d = h.deployments().get("md").await.expect("get");
    let current: i64 = d.annotations()["deployment.kubernetes.io/revision"]
        .parse()
        .expect("revision");
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"rollbackTo": {"revision": current}}}),
    )
    .await;
    wait_rollback_done(&h, "c1").await;
    let unchanged = events_of(&h, "DeploymentRollbackTemplateUnchanged").await;
    assert_eq!(unchanged.len(), 1, "{unchanged:#?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effective_creation_timeout_reaches_new_machines() {
    let h = Harness::start("md-creation-timeout").await;
    let mut d = md(1).build();
    d.metadata.annotations = Some(BTreeMap::from([(
        "node.machine.sapcloud.io/effective-creation-timeout".to_owned(),
        "7m".to_owned(),
    )]));
    create_deployment(&h, &d).await;
    let ms = wait_machines(&h, "1 running", |m| running_of_class(m, "c1") == 1).await;
    let timeout = ms[0].spec.configuration.creation_timeout.map(|g| g.0);
    assert_eq!(timeout, Some(Duration::from_secs(420)));
    assert_eq!(
        ms[0].annotations()["node.machine.sapcloud.io/effective-creation-timeout"],
        "7m"
    );
    // A changed value reaches the set and the machines created from then on.
    patch_deployment(
        &h,
        "md",
        json!({"metadata": {"annotations": {
            "node.machine.sapcloud.io/effective-creation-timeout": "9m"
        }}, "spec": {"replicas": 2}}),
    )
    .await;
    let ms = wait_machines(&h, "2 running", |m| running_of_class(m, "c1") == 2).await;
    let mut timeouts: Vec<_> = ms
        .iter()
        .map(|m| m.spec.configuration.creation_timeout.map(|g| g.0.as_secs()))
        .collect();
    timeouts.sort();
    assert_eq!(timeouts, vec![Some(420), Some(540)]);

    // A value that is no duration: copied, sets nothing, and the set says so.
    patch_deployment(
        &h,
        "md",
        json!({"metadata": {"annotations": {
            "node.machine.sapcloud.io/effective-creation-timeout": "a while"
        }}, "spec": {"replicas": 3}}),
    )
    .await;
    let ms = wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    let newest = ms
        .iter()
        .find(|m| {
            m.annotations()["node.machine.sapcloud.io/effective-creation-timeout"] == "a while"
        })
        .expect("the machine created after the change");
    assert_eq!(newest.spec.configuration.creation_timeout, None);
    let warnings: Vec<Event> = Api::<Event>::namespaced(h.client.clone(), &h.ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InvalidEffectiveCreationTimeout"))
        .collect();
    assert!(
        warnings.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains("is not a duration"))),
        "{warnings:#?}"
    );
    h.stop().await;
}

/// A machine that did not join within the creation timeout (as the machine controller records
/// it) raises the deployment's effective creation timeout (threshold 1): the annotations, the
/// Event and the existing new set; a declared timeout raised above that value takes it back,
/// from the deployment and from the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_did_not_join_raises_the_effective_creation_timeout() {
    let h = Harness::start_with("md-adapt-timeout", |c| {
        c.creation_timeouts.cycle_threshold = 1;
    })
    .await;
    create_deployment(&h, &md(1).build()).await;
    let ms = wait_machines(&h, "1 running", |m| running_of_class(m, "c1") == 1).await;
    let name = ms[0].name_any();
    // Held by a finalizer of the test, so that its Failed state stays readable while its
    // set replaces it (the machine controller holds its own until the VM is gone).
    let hold = json!({"metadata": {"finalizers": ["test.mcm-rs.io/hold"]}});
    h.machines()
        .patch(&name, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold the machine");
    let now = Time(jiff::Timestamp::now());
    let failed = json!({"status": {
        "currentStatus": {"phase": "Failed", "lastUpdateTime": now},
        "lastOperation": {
            "type": "Create", "state": "Failed", "lastUpdateTime": now,
            "description": format!(
                "Machine {name} failed: {} (20m0s)",
                mcm_api::constants::operations::NOT_JOINED_WITHIN_CREATION_TIMEOUT
            ),
        },
    }});
    h.machines()
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&failed))
        .await
        .expect("fail the machine");
    let ds = wait_list(
        h.deployments(),
        "the effective creation timeout raised",
        |ds| {
            ds.iter().any(|d| {
                d.annotations()
                    .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
                    .is_some_and(|v| v == "30m0s")
            })
        },
    )
    .await;
    let anns = ds[0].annotations();
    assert_eq!(anns[annotations::REPLACE_CYCLE_COUNT], "0");
    assert!(anns.contains_key(annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT));
    assert!(anns.contains_key(annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT));
    wait_list(h.sets(), "the new set with 30m0s", |sets| {
        sets.iter().any(|s| {
            s.annotations()
                .get(annotations::EFFECTIVE_CREATION_TIMEOUT)
                .is_some_and(|v| v == "30m0s")
                && !s
                    .annotations()
                    .contains_key(annotations::REPLACE_CYCLE_COUNT)
        })
    })
    .await;
    eventually(WAIT, "an EffectiveCreationTimeoutRaised Event", || async {
        !events_of(&h, "EffectiveCreationTimeoutRaised")
            .await
            .is_empty()
    })
    .await;

    // The template declares more than the adapted value: the adaptation's keys go, from the
    // set too (its machine configuration is written in place: no rollout).
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"template": {"spec": {"creationTimeout": "40m"}}}}),
    )
    .await;
    wait_list(h.deployments(), "the adaptation's keys removed", |ds| {
        ds.iter().all(|d| {
            let a = d.annotations();
            !a.contains_key(annotations::EFFECTIVE_CREATION_TIMEOUT)
                && !a.contains_key(annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT)
                && !a.contains_key(annotations::REPLACE_CYCLE_COUNT)
        })
    })
    .await;
    let sets = wait_list(h.sets(), "the set without the value", |sets| {
        sets.iter().all(|s| {
            !s.annotations()
                .contains_key(annotations::EFFECTIVE_CREATION_TIMEOUT)
        })
    })
    .await;
    assert_eq!(sets.len(), 1, "{sets:#?}");
    let release = json!({"metadata": {"finalizers": null}});
    let _ = h
        .machines()
        .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
        .await;
    h.stop().await;
}

// ---------------------------------------------------------------------------------------
// In-place updates. The test plays the machine controller's in-place part with its own
// decision function (`machine::inplace::next`: the Node's `InPlaceUpdate` condition follows
// the labels, a selected node is cordoned, its machine goes `InPlaceUpdating`, then
// `InPlaceUpdateSuccessful` and `Running`) and the node agent (on `ReadyForUpdate` it labels
// the node `update-result`, `failed` for the nodes it is told to fail).
// ---------------------------------------------------------------------------------------

/// An `InPlaceUpdate` deployment `md` of class `c1`.
fn in_place_md(
    replicas: i32,
    orchestration: &str,
    surge: i32,
    unavailable: i32,
) -> MachineDeployment {
    let mut d = MachineDeploymentBuilder::new("md")
        .replicas(replicas)
        .class("c1")
        .build();
    d.spec.strategy = Some(MachineDeploymentStrategy {
        type_: Some(MachineDeploymentStrategyType::InPlaceUpdate),
        in_place_update: Some(InPlaceUpdateMachineDeployment {
            update_configuration: UpdateConfiguration {
                max_surge: Some(IntOrString::Int(surge)),
                max_unavailable: Some(IntOrString::Int(unavailable)),
            },
            orchestration_type: Some(OrchestrationType::from(orchestration)),
        }),
        ..MachineDeploymentStrategy::default()
    });
    d
}

/// The label that marks the Nodes of one test (Nodes are cluster-wide).
const TEST_NODE_LABEL: &str = "test.mcm-rs/namespace";

fn nodes_api(h: &Harness) -> Api<Node> {
    Api::all(h.client.clone())
}

fn node_label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.labels().get(key).map(String::as_str)
}

/// Gives every machine a Ready Node `<namespace>-<machine>` and the machine its `node`
/// label, as a joined machine has; returns the machines by name with their Node.
async fn give_nodes(h: &Harness, machines: &[Machine]) -> BTreeMap<String, String> {
    let mut nodes = BTreeMap::new();
    for m in machines {
        let node = format!("{}-{}", h.ns, m.name_any());
        create_ready_node(
            &h.client,
            &node,
            &format!("local:///{node}"),
            &[(TEST_NODE_LABEL, h.ns.as_str())],
        )
        .await;
        h.machines()
            .patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {labels::NODE: node}}})),
            )
            .await
            .expect("label machine with its node");
        nodes.insert(m.name_any(), node);
    }
    nodes
}

/// Deletes the Nodes of the test.
async fn delete_nodes(h: &Harness) {
    let _ = nodes_api(h)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{TEST_NODE_LABEL}={}", h.ns)),
        )
        .await;
}

/// Plays the machine controller's in-place part and the node agent for the machines of
/// `ns` until aborted; the agent fails the update of the Nodes in `failing`.
async fn play_in_place(client: Client, ns: String, failing: BTreeSet<String>) {
    let machines: Api<Machine> = Api::namespaced(client.clone(), &ns);
    let nodes: Api<Node> = Api::all(client);
    loop {
        if let Ok(list) = machines.list(&ListParams::default()).await {
            for m in &list.items {
                let Some(name) = m.node_name() else { continue };
                let Ok(Some(node)) = nodes.get_opt(name).await else {
                    continue;
                };
                let facts = mc_inplace::Facts {
                    machine: m.metadata.name.as_deref().unwrap_or_default(),
                    phase: m.phase(),
                    phase_since: mc_inplace::phase_since(m),
                    force_drain: false,
                    node: &node,
                    healthy: true,
                    inplace_timeout: Duration::from_secs(3600),
                    health_timeout: Duration::from_secs(3600),
                    disable_health_timeout: false,
                    drain_timeout: Duration::from_secs(3600),
                };
                let step = mc_inplace::next(&facts, jiff::Timestamp::now());
                play_step(&machines, &nodes, m, &node, step, &failing).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn set_phase(machines: &Api<Machine>, m: &Machine, phase: &str) {
    let patch = json!({"status": {"currentStatus": {
        "phase": phase,
        "lastUpdateTime": Time(jiff::Timestamp::now()),
    }}});
    let _ = machines
        .patch_status(
            &m.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
}

/// Sets the Node's `InPlaceUpdate` condition and copies it to the machine, as the machine
/// controller does.
async fn set_condition(
    machines: &Api<Machine>,
    nodes: &Api<Node>,
    m: &Machine,
    node: &str,
    reason: &str,
    message: &str,
) {
    let now = jiff::Timestamp::now().to_string();
    let condition = json!({
        "type": "InPlaceUpdate", "status": "True", "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    });
    let _ = nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [condition.clone()]}})),
        )
        .await;
    let _ = machines
        .patch_status(
            &m.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [condition]}})),
        )
        .await;
}

async fn play_step(
    machines: &Api<Machine>,
    nodes: &Api<Node>,
    m: &Machine,
    node: &Node,
    step: mc_inplace::InPlaceStep,
    failing: &BTreeSet<String>,
) {
    use mc_inplace::InPlaceStep;
    let name = node.name_any();
    match step {
        InPlaceStep::Nothing | InPlaceStep::Fail { .. } => {}
        InPlaceStep::Condition { reason, message } => {
            set_condition(machines, nodes, m, &name, reason, &message).await;
        }
        InPlaceStep::Drain { .. } => {
            // Cordon as the drain does (recorded, so the uncordon removes exactly that).
            if let Some(cordon) = mcm_drain::plan_cordon(node) {
                let _ = nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&cordon.patch))
                    .await;
            }
            set_phase(machines, m, "InPlaceUpdating").await;
            set_condition(
                machines,
                nodes,
                m,
                &name,
                "DrainSuccessful",
                "Node draining successful",
            )
            .await;
        }
        InPlaceStep::Phase { phase, .. } => set_phase(machines, m, phase.as_str()).await,
        InPlaceStep::Await { .. } => {
            // The node agent: the node is ReadyForUpdate.
            let patch = if failing.contains(&name) {
                json!({"metadata": {
                    "labels": {labels::UPDATE_RESULT: "failed"},
                    "annotations": {annotations::UPDATE_FAILED_REASON: "disk full"},
                }})
            } else {
                json!({"metadata": {"labels": {labels::UPDATE_RESULT: "successful"}}})
            };
            let _ = nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
    }
}

/// The deployment's set of class `class`.
fn set_of_class<'a>(sets: &'a [MachineSet], class: &str) -> Option<&'a MachineSet> {
    sets.iter().find(|s| {
        s.spec
            .template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .and_then(|t| t.class.as_ref())
            .and_then(|c| c.name.as_deref())
            == Some(class)
    })
}

fn owner_uid(m: &Machine) -> Option<String> {
    m.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

/// Starts `d` with running machines that have Nodes, and the player of the in-place part;
/// returns the machines' uids by name, their Nodes by machine name and the player.
async fn start_in_place(
    h: &Harness,
    d: &MachineDeployment,
    failing: impl Fn(&BTreeMap<String, String>) -> BTreeSet<String>,
) -> (
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    tokio::task::JoinHandle<()>,
) {
    let n = usize::try_from(d.spec.replicas()).expect("replicas");
    create_deployment(h, d).await;
    let ms = wait_machines(h, &format!("{n} running c1"), |m| {
        running_of_class(m, "c1") == n && m.len() == n
    })
    .await;
    let nodes = give_nodes(h, &ms).await;
    let uids = ms
        .iter()
        .map(|m| (m.name_any(), m.metadata.uid.clone().expect("uid")))
        .collect();
    let player = tokio::spawn(play_in_place(
        h.client.clone(),
        h.ns.clone(),
        failing(&nodes),
    ));
    (uids, nodes, player)
}

/// Watches the test's Nodes and returns the most that carried `selected-for-update` at
/// once so far (shared with the watching task).
fn watch_selected(h: &Harness) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let most = Arc::new(AtomicUsize::new(0));
    let seen = most.clone();
    let api = nodes_api(h);
    let config = watcher::Config::default().labels(&format!("{TEST_NODE_LABEL}={}", h.ns));
    let task = tokio::spawn(async move {
        let mut selected: BTreeMap<String, bool> = BTreeMap::new();
        let mut stream = watcher(api, config).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                    let on = node_label(&n, labels::SELECTED_FOR_UPDATE).is_some();
                    selected.insert(n.name_any(), on);
                }
                Ok(watcher::Event::Delete(n)) => {
                    selected.remove(&n.name_any());
                }
                _ => {}
            }
            let now = selected.values().filter(|s| **s).count();
            seen.fetch_max(now, Ordering::SeqCst);
        }
    });
    (most, task)
}

/// Asserts that the machines are exactly those of `uids` (same names, same objects).
fn assert_same_machines(ms: &[Machine], uids: &BTreeMap<String, String>) {
    let now: BTreeMap<String, String> = ms
        .iter()
        .map(|m| (m.name_any(), m.metadata.uid.clone().unwrap_or_default()))
        .collect();
    assert_eq!(&now, uids, "no machine deleted, none created");
}

/// Asserts that the Node carries nothing of the in-place update any more.
fn assert_cleaned(n: &Node) {
    for key in [
        labels::CANDIDATE_FOR_UPDATE,
        labels::SELECTED_FOR_UPDATE,
        labels::UPDATE_RESULT,
    ] {
        assert_eq!(node_label(n, key), None, "{key} on {}", n.name_any());
    }
    assert!(
        !n.annotations()
            .contains_key(annotations::UPDATE_FAILED_REASON),
        "{n:#?}"
    );
    let spec = n.spec.clone().unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "uncordoned: {n:#?}");
    let taints = spec.taints.unwrap_or_default();
    let keys: Vec<&str> = taints.iter().map(|t| t.key.as_str()).collect();
    assert!(!keys.contains(&taints::PREFER_NO_SCHEDULE), "{keys:?}");
    assert!(!keys.contains(&taints::UNSCHEDULABLE), "{keys:?}");
    assert!(
        taints
            .iter()
            .any(|t| t.key == taints::CRITICAL_COMPONENTS_NOT_READY && t.effect == "NoSchedule"),
        "{keys:?}"
    );
}

/// Auto, 3 replicas, maxUnavailable 1: every machine is updated where it is and moves to
/// the new set under its name; never more than one node is selected at a time; the old set
/// ends at 0 replicas and the nodes are cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_auto_moves_every_machine_one_at_a_time() {
    let h = Harness::start("md-inplace-auto").await;
    let (uids, nodes, player) =
        start_in_place(&h, &in_place_md(3, "Auto", 0, 1), |_| BTreeSet::new()).await;
    let (most_selected, watch) = watch_selected(&h);
    let old_set = wait_list(h.sets(), "one set", |s| s.len() == 1).await[0].clone();
    roll_to(&h, "c2").await;
    let sets = wait_list(h.sets(), "the new set", |s| set_of_class(s, "c2").is_some()).await;
    let new_set = set_of_class(&sets, "c2").expect("new set").clone();
    let new_uid = new_set.metadata.uid.clone().expect("uid");
    let new_hash = new_set.labels()[labels::MACHINE_TEMPLATE_HASH].clone();

    let ms = wait_machines(&h, "all machines moved to the new set", |ms| {
        ms.len() == 3
            && ms.iter().all(|m| {
                owner_uid(m).as_deref() == Some(new_uid.as_str())
                    && !m.labels().contains_key(labels::UPDATE_RESULT)
                    && is_running(m)
            })
    })
    .await;
    assert_same_machines(&ms, &uids);
    for m in &ms {
        assert_eq!(m.labels()[labels::MACHINE_TEMPLATE_HASH], new_hash);
        assert_eq!(
            class_of(m).as_deref(),
            Some("c1"),
            "the machine keeps its spec"
        );
    }
    wait_list(h.sets(), "old set at 0, new set at 3", |s| {
        let replicas = |name: &str| {
            s.iter()
                .find(|x| x.name_any() == name)
                .map(|x| x.spec.replicas)
        };
        replicas(&old_set.name_any()) == Some(Some(0))
            && replicas(&new_set.name_any()) == Some(Some(3))
    })
    .await;
    let old = h.sets().get(&old_set.name_any()).await.expect("old set");
    assert_eq!(
        old.labels()
            .get(labels::MACHINE_SET_SCALE_UP_DISABLED)
            .map(String::as_str),
        Some("true")
    );
    let cleaned = await_list(
        nodes_api(&h),
        WAIT,
        "the nodes cleaned up",
        |ns: &[Node]| {
            let mine: Vec<&Node> = ns
                .iter()
                .filter(|n| nodes.values().any(|x| *x == n.name_any()))
                .collect();
            mine.len() == 3
                && mine.iter().all(|n| {
                    node_label(n, labels::CANDIDATE_FOR_UPDATE).is_none()
                        && node_label(n, labels::UPDATE_RESULT).is_none()
                })
        },
    )
    .await;
    for n in cleaned
        .iter()
        .filter(|n| nodes.values().any(|x| *x == n.name_any()))
    {
        assert_cleaned(n);
    }
    wait_list(h.deployments(), "rollout complete", |d| {
        observed_status(d).is_some_and(|s| {
            s.updated_replicas == Some(3)
                && s.available_replicas == Some(3)
                && s.replicas == Some(3)
        })
    })
    .await;
    assert_eq!(
        most_selected.load(Ordering::SeqCst),
        1,
        "exactly one node selected at a time"
    );
    assert_same_machines(
        &h.machines()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items,
        &uids,
    );
    player.abort();
    watch.abort();
    delete_nodes(&h).await;
    h.stop().await;
}

/// Manual: the controller marks candidates but selects nothing; a node the test selects is
/// updated and its machine moves, the other stays until it is selected too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_manual_updates_only_what_a_user_selects() {
    let h = Harness::start("md-inplace-manual").await;
    let (uids, nodes, player) =
        start_in_place(&h, &in_place_md(2, "Manual", 1, 1), |_| BTreeSet::new()).await;
    roll_to(&h, "c2").await;
    let sets = wait_list(h.sets(), "the new set", |s| set_of_class(s, "c2").is_some()).await;
    let new_set = set_of_class(&sets, "c2").expect("new set").clone();
    let new_uid = new_set.metadata.uid.clone().expect("uid");
    assert_eq!(
        new_set.spec.replicas,
        Some(0),
        "Manual: the new set starts empty"
    );
    let is_mine = |n: &Node| nodes.values().any(|x| *x == n.name_any());
    await_list(
        nodes_api(&h),
        WAIT,
        "both nodes candidates",
        |ns: &[Node]| {
            ns.iter()
                .filter(|n| {
                    is_mine(n) && node_label(n, labels::CANDIDATE_FOR_UPDATE) == Some("true")
                })
                .count()
                == 2
        },
    )
    .await;
    // Nothing is selected by the controller, and the new set stays empty.
    consistently(
        Duration::from_secs(3),
        "Manual: the controller selects nothing",
        || async {
            let listed = nodes_api(&h)
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("the list failed: {e}"))?
                .items;
            let selected: Vec<String> = listed
                .iter()
                .filter(|n| is_mine(n) && node_label(n, labels::SELECTED_FOR_UPDATE).is_some())
                .map(ResourceExt::name_any)
                .collect();
            let replicas = h
                .sets()
                .get(&new_set.name_any())
                .await
                .map_err(|e| format!("the get failed: {e}"))?
                .spec
                .replicas;
            if selected.is_empty() && replicas == Some(0) {
                Ok(())
            } else {
                Err(format!(
                    "selected {selected:?}, the new set's replicas {replicas:?}"
                ))
            }
        },
    )
    .await;

    // The user selects the first machine's node.
    let (first, first_node) = nodes
        .iter()
        .next()
        .map(|(m, n)| (m.clone(), n.clone()))
        .expect("a node");
    nodes_api(&h)
        .patch(
            &first_node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {labels::SELECTED_FOR_UPDATE: "true"}}})),
        )
        .await
        .expect("select");
    let ms = wait_machines(&h, "the selected machine moved", |ms| {
        ms.iter()
            .any(|m| m.name_any() == first && owner_uid(m).as_deref() == Some(new_uid.as_str()))
    })
    .await;
    let other = ms
        .iter()
        .find(|m| m.name_any() != first)
        .expect("the other machine");
    let other = other.name_any();
    let other_node = &nodes[&other];
    consistently(
        Duration::from_secs(2),
        "the other machine neither selected nor moved",
        || async {
            let node = nodes_api(&h)
                .get(other_node)
                .await
                .map_err(|e| format!("the get failed: {e}"))?;
            let m = h
                .machines()
                .get(&other)
                .await
                .map_err(|e| format!("the get failed: {e}"))?;
            let selected = node_label(&node, labels::SELECTED_FOR_UPDATE);
            let owner = owner_uid(&m);
            if selected.is_none() && owner.as_deref() != Some(new_uid.as_str()) {
                Ok(())
            } else {
                Err(format!(
                    "{other_node} selected-for-update {selected:?}, {other} owned by {owner:?}"
                ))
            }
        },
    )
    .await;

    // Then the other one.
    nodes_api(&h)
        .patch(
            other_node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {labels::SELECTED_FOR_UPDATE: "true"}}})),
        )
        .await
        .expect("select");
    let ms = wait_machines(&h, "both machines moved", |ms| {
        ms.len() == 2
            && ms
                .iter()
                .all(|m| owner_uid(m).as_deref() == Some(new_uid.as_str()))
    })
    .await;
    assert_same_machines(&ms, &uids);
    wait_list(h.deployments(), "rollout complete", |d| {
        observed_status(d)
            .is_some_and(|s| s.updated_replicas == Some(2) && s.available_replicas == Some(2))
    })
    .await;
    player.abort();
    delete_nodes(&h).await;
    h.stop().await;
}

/// A node whose agent reports `update-result: failed` keeps its machine in the old set;
/// the other selected node's machine moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_a_failed_update_is_never_moved() {
    let h = Harness::start("md-inplace-failed").await;
    // maxUnavailable 2: the first two machines (by name) are selected together; the first
    // one's update fails.
    let (uids, nodes, player) = start_in_place(&h, &in_place_md(3, "Auto", 0, 2), |nodes| {
        nodes.values().take(1).cloned().collect()
    })
    .await;
    let (failed, failed_node) = nodes
        .iter()
        .next()
        .map(|(m, n)| (m.clone(), n.clone()))
        .expect("a node");
    let old_set = wait_list(h.sets(), "one set", |s| s.len() == 1).await[0].clone();
    let old_uid = old_set.metadata.uid.clone().expect("uid");
    roll_to(&h, "c2").await;
    let sets = wait_list(h.sets(), "the new set", |s| set_of_class(s, "c2").is_some()).await;
    let new_uid = set_of_class(&sets, "c2")
        .and_then(|s| s.metadata.uid.clone())
        .expect("uid");
    wait_machines(
        &h,
        "a machine moved, the failed one InPlaceUpdateFailed",
        |ms| {
            ms.iter()
                .any(|m| owner_uid(m).as_deref() == Some(new_uid.as_str()))
                && ms.iter().any(|m| {
                    m.name_any() == failed
                        && m.phase().map(|p| p.as_str()) == Some("InPlaceUpdateFailed")
                })
        },
    )
    .await;
    // The failed machine is never moved, its node left as it is (selected, labelled
    // failed, cordoned), and only the moved machine left the old set: once that is so, it
    // stays so while the controller has time to do what it should not.
    let left_alone = || async {
        let ms = h
            .machines()
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("the list failed: {e}"))?
            .items;
        let same: BTreeMap<String, String> = ms
            .iter()
            .map(|m| (m.name_any(), m.metadata.uid.clone().unwrap_or_default()))
            .collect();
        if same != uids {
            return Err(format!("machines deleted or created: {same:?}"));
        }
        let m = ms
            .iter()
            .find(|m| m.name_any() == failed)
            .ok_or("the failed machine is gone")?;
        if owner_uid(m).as_deref() != Some(old_uid.as_str()) {
            return Err(format!("{failed} moved to {:?}", owner_uid(m)));
        }
        if let Some(result) = m.labels().get(labels::UPDATE_RESULT) {
            return Err(format!("{failed} labelled update-result {result}"));
        }
        let node = nodes_api(&h)
            .get(&failed_node)
            .await
            .map_err(|e| format!("the get failed: {e}"))?;
        let labelled = (
            node_label(&node, labels::UPDATE_RESULT),
            node_label(&node, labels::SELECTED_FOR_UPDATE),
            node.spec.as_ref().and_then(|s| s.unschedulable),
        );
        if labelled != (Some("failed"), Some("true"), Some(true)) {
            return Err(format!(
                "{failed_node} not left as it was (update-result, selected, unschedulable): \
                 {labelled:?}"
            ));
        }
        let old = h
            .sets()
            .get(&old_set.name_any())
            .await
            .map_err(|e| format!("the get failed: {e}"))?;
        match old.spec.replicas {
            Some(2) => Ok(()),
            n => Err(format!("the old set has {n:?} replicas, not 2")),
        }
    };
    eventually(WAIT, "the failed update left alone", &left_alone).await;
    consistently(
        Duration::from_secs(5),
        "the failed update left alone",
        &left_alone,
    )
    .await;
    player.abort();
    delete_nodes(&h).await;
    h.stop().await;
}

/// Without a target cluster an in-place deployment is refused with upstream's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_without_a_target_cluster_is_refused() {
    let h = Harness::start_with("md-inplace-no-target", |c| c.target_cluster = false).await;
    create_deployment(&h, &in_place_md(2, "Auto", 0, 1)).await;
    let message = "in-place updates are not supported if running without a target cluster";
    wait_list(h.deployments(), "the refusal condition", |d| {
        observed_status(d).is_some()
            && progressing(&d[0]).is_some_and(|c| is_invalid_strategy(c, message))
    })
    .await;
    let sets = h
        .sets()
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    assert!(sets.is_empty(), "nothing rolled out: {sets:#?}");
    // The Event follows the status write.
    eventually(WAIT, "the Warning Event", || async {
        !events_of(&h, "InvalidStrategy").await.is_empty()
    })
    .await;
    // Published once: a repeated Event would be a second one or (the recorder aggregates
    // repeats) a series on the first.
    let events = consistently(Duration::from_secs(2), "a single Event", || async {
        let events = events_of(&h, "InvalidStrategy").await;
        if events.len() == 1 && occurrences(&events[0]) == 1 {
            Ok(Some(events))
        } else {
            let seen: Vec<_> = events
                .iter()
                .map(|e| (&e.metadata.name, &e.note, occurrences(e)))
                .collect();
            Err(format!("Events (name, note, series count): {seen:?}"))
        }
    })
    .await;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(events[0].note.as_deref(), Some(message));
    h.stop().await;
}

/// `minReadySeconds` is counted by the manager's clock (`ManagerConfig::clock`): while a
/// test clock stands still, the deployment's running machines are ready but not available;
/// once it is moved past `minReadySeconds`, the next reconcile counts them available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ready_seconds_are_counted_by_the_managers_clock() {
    use mcm_reconcilers::clock::{ManualClock, SharedClock};
    let clock = Arc::new(ManualClock::starting_now());
    let shared: SharedClock = clock.clone();
    let h = Harness::start_with("md-clock", move |c| c.clock = shared).await;
    let mut d = md(2).build();
    d.spec.min_ready_seconds = Some(600);
    create_deployment(&h, &d).await;
    wait_machines(&h, "2 running", |m| running_of_class(m, "c1") == 2).await;
    let counted = |ready: i32, available: i32| {
        move |ds: &[MachineDeployment]| {
            ds.first().and_then(|d| d.status.as_ref()).is_some_and(|s| {
                s.ready_replicas == Some(ready) && s.available_replicas == Some(available)
            })
        }
    };
    wait_list(h.deployments(), "2 ready, none available", counted(2, 0)).await;
    // The machines have been Running for 600 s by the manager's clock.
    clock.advance(Duration::from_secs(2 * 3600));
    // The deployment's own recheck is 600 s away: a change of it brings the next reconcile.
    patch_deployment(
        &h,
        "md",
        json!({"metadata": {"annotations": {"test/touch": "1"}}}),
    )
    .await;
    wait_list(h.deployments(), "2 available", counted(2, 2)).await;
    h.stop().await;
}
