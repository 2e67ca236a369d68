//! MachineDeployment controller against a real control plane; the test plays the machine
//! controller (machines become Running as soon as they appear).

mod common_manager;

use std::collections::BTreeMap;
use std::time::Duration;

use common_manager::*;
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use mcm_api::constants::labels;
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentCondition,
    MachineDeploymentConditionType, MachineDeploymentStatus,
};
use mcm_testenv::kit::{MachineDeploymentBuilder, await_list};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_one_machines_go_first_on_trigger_deletion() {
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
    let message = r#"spec.strategy.type: "BlueGreen" is not supported by this controller (use Recreate or RollingUpdate)"#;
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
    let events: Vec<Event> = Api::<Event>::namespaced(h.client.clone(), &h.ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("InvalidStrategy")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("md")
        })
        .collect();
    assert_eq!(events.len(), 1, "one InvalidStrategy event: {events:#?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(events[0].note.as_deref(), Some(message));
    assert!(
        events[0].series.is_none(),
        "published once, not repeated: {:#?}",
        events[0]
    );
    h.stop().await;
}

/// The Events of `reason` about the deployment `md`.
async fn events_of(h: &Harness, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(h.client.clone(), &h.ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("md")
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
    h.stop().await;
}
