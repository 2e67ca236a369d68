//! The cluster-autoscaler's protocol (Gardener's `cloudprovider/mcm`) against a real control
//! plane: the test plays the autoscaler as it writes, a full-object `Update` of the
//! MachineDeployment serialized from its Go types (replicas, and for a scale-down the chosen
//! machines in `trigger-deletion-by-mcm`, in one update), and the machine controller
//! (machines become Running as soon as they appear).

mod common_manager;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common_manager::*;
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use mcm_api::constants::annotations;
use mcm_api::{ConditionStatus, Machine, MachineDeployment, MachineDeploymentConditionType};
use mcm_testenv::kit::{MachineDeploymentBuilder, eventually};
use serde_json::{Value, json};

/// A rolling deployment `md` of `replicas` machines of class `c1`, without a node template
/// (the autoscaler's Go types add an empty one) and without a progress deadline (as Gardener
/// writes them).
fn md(replicas: i32) -> MachineDeployment {
    MachineDeploymentBuilder::new("md")
        .replicas(replicas)
        .class("c1")
        .rolling(1, 0)
        .build()
}

/// The deployment as the autoscaler's Go types (MCM v0.53) encode it after decoding what
/// the API server returned: `creationTimestamp: null` in the template's metadata, an empty
/// node template `{"metadata": {"creationTimestamp": null}, "spec": {}}` where there was
/// none, empty maps and strings left out. Checked against the Go round trips of
/// `tests/fixtures/go-roundtrip` ([`the_go_shape_matches_the_go_round_trips`]).
fn go_shape(mut d: Value) -> Value {
    let template = &mut d["spec"]["template"];
    drop_empty(&mut template["metadata"]);
    template["metadata"]["creationTimestamp"] = Value::Null;
    let spec = &mut template["spec"];
    if let Some(class) = spec.get_mut("class") {
        drop_empty(class);
    }
    let node_template = &mut spec["nodeTemplate"];
    drop_empty(&mut node_template["metadata"]);
    node_template["metadata"]["creationTimestamp"] = Value::Null;
    if node_template.get("spec").is_none_or(Value::is_null) {
        node_template["spec"] = json!({});
    }
    d
}

/// Removes the empty strings and empty maps of an object (Go's `omitempty`).
fn drop_empty(v: &mut Value) {
    if let Some(map) = v.as_object_mut() {
        map.retain(|_, x| {
            !(x.as_str() == Some("") || x.as_object().is_some_and(serde_json::Map::is_empty))
        });
    }
}

#[test]
fn the_go_shape_matches_the_go_round_trips() {
    let cases = [
        (
            include_str!("fixtures/go-roundtrip/minimal.in.json"),
            include_str!("fixtures/go-roundtrip/minimal.go.json"),
        ),
        (
            include_str!("fixtures/go-roundtrip/node-template.in.json"),
            include_str!("fixtures/go-roundtrip/node-template.go.json"),
        ),
        (
            include_str!("fixtures/go-roundtrip/explicit-empties.in.json"),
            include_str!("fixtures/go-roundtrip/explicit-empties.go.json"),
        ),
        (
            include_str!("fixtures/go-roundtrip/gardener-like.in.json"),
            include_str!("fixtures/go-roundtrip/gardener-like.go.json"),
        ),
    ];
    for (ours, go) in cases {
        let ours: Value = serde_json::from_str(ours).expect("json");
        let go: Value = serde_json::from_str(go).expect("json");
        assert_eq!(
            go_shape(ours)["spec"]["template"],
            go["spec"]["template"],
            "the test's Go shape differs from Go's"
        );
    }
}

/// The API of MachineDeployments as raw objects (what a Go client reads and writes).
fn raw_deployments(h: &Harness) -> Api<DynamicObject> {
    Api::namespaced_with(
        h.client.clone(),
        &h.ns,
        &ApiResource::erase::<MachineDeployment>(&()),
    )
}

/// Plays one autoscaler `Update` of `md`: reads the object, brings it into the Go shape,
/// lets `change` edit it, replaces it; a conflict is retried (as the autoscaler does).
async fn autoscaler_update(h: &Harness, change: impl Fn(&mut Value)) {
    let api = raw_deployments(h);
    for _ in 0..20 {
        let current = api.get("md").await.expect("get md");
        let mut d = go_shape(serde_json::to_value(&current).expect("json"));
        change(&mut d);
        let d: DynamicObject = serde_json::from_value(d).expect("object");
        match api.replace("md", &PostParams::default(), &d).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("update md: {e}"),
        }
    }
    panic!("update md: conflicts did not stop");
}

/// Records `f` of every object a watch of `api` ever reports, from its initial list on
/// (returns once that list is recorded).
async fn record_ever<K, T>(
    api: Api<K>,
    f: fn(&K) -> Option<T>,
) -> (Arc<Mutex<Vec<T>>>, tokio::task::JoinHandle<()>)
where
    K: Watched,
    T: PartialEq + Send + 'static,
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let (listed, synced) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        // An error (a dropped watch on a loaded machine) is followed by the watcher's own
        // resume: the recording goes on. Ending here left the record silently incomplete.
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(e) => {
                    eprintln!("recording watch: {e}; resuming");
                    continue;
                }
            };
            match event {
                watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                    if let Some(v) = f(&obj) {
                        let mut all = record.lock().expect("lock");
                        if all.last() != Some(&v) {
                            all.push(v);
                        }
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(WAIT, synced)
        .await
        .expect("the watch listed")
        .expect("the watch runs");
    (seen, task)
}

/// Every name a watch of `api` ever reports.
async fn names_ever<K: Watched>(
    api: Api<K>,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    record_ever(api, |o: &K| Some(o.name_any())).await
}

fn set_of(seen: &Mutex<Vec<String>>) -> BTreeSet<String> {
    seen.lock().expect("lock").iter().cloned().collect()
}

fn progressing_reason(d: &MachineDeployment) -> Option<String> {
    d.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == MachineDeploymentConditionType::Progressing)
        })
        .and_then(|c| c.reason.clone())
}

/// Waits until `md` is complete as the autoscaler reads it: `Progressing` is
/// `True/NewMachineSetAvailable`.
async fn wait_rollout_finished(h: &Harness) {
    wait_list(h.deployments(), "Progressing NewMachineSetAvailable", |d| {
        d.first().is_some_and(|d| {
            let c = d
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| {
                    c.iter()
                        .find(|c| c.type_ == MachineDeploymentConditionType::Progressing)
                });
            c.is_some_and(|c| {
                c.status == ConditionStatus::True
                    && c.reason.as_deref() == Some("NewMachineSetAvailable")
            })
        })
    })
    .await;
}

fn names(ms: &[Machine]) -> BTreeSet<String> {
    ms.iter().map(ResourceExt::name_any).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaler_scale_up_never_creates_a_machine_set() {
    let h = Harness::start("ca-up").await;
    let (sets, sets_task) = names_ever(h.sets()).await;
    create_deployment(&h, &md(3)).await;
    wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    wait_rollout_finished(&h).await;
    let first = wait_machines(&h, "3 machines", |m| m.len() == 3).await;

    // "setting group md size to 5": a full Update from the Go types.
    autoscaler_update(&h, |d| d["spec"]["replicas"] = json!(5)).await;
    let five = wait_machines(&h, "5 running", |m| {
        m.len() == 5 && running_of_class(m, "c1") == 5
    })
    .await;
    assert!(
        names(&first).is_subset(&names(&five)),
        "a scale-up replaced machines"
    );
    // And once more, now that the stored template is the Go client's.
    autoscaler_update(&h, |d| d["spec"]["replicas"] = json!(6)).await;
    wait_machines(&h, "6 running", |m| {
        m.len() == 6 && running_of_class(m, "c1") == 6
    })
    .await;
    wait_rollout_finished(&h).await;
    let seen = set_of(&sets);
    assert_eq!(seen.len(), 1, "MachineSets seen: {seen:?}");
    sets_task.abort();
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaler_scale_down_deletes_exactly_the_machines_it_names() {
    let h = Harness::start("ca-down").await;
    let (sets, sets_task) = names_ever(h.sets()).await;
    create_deployment(&h, &md(5)).await;
    let all = wait_machines(&h, "5 running", |m| running_of_class(m, "c1") == 5).await;
    wait_rollout_finished(&h).await;
    let (replicas, replicas_task) =
        record_ever(h.deployments(), |d: &MachineDeployment| d.spec.replicas).await;
    let (machines, machines_task) = names_ever(h.machines()).await;
    let chosen: Vec<String> = all.iter().take(2).map(ResourceExt::name_any).collect();
    let kept: BTreeSet<String> = all.iter().skip(2).map(ResourceExt::name_any).collect();

    // The autoscaler's scale-down: replicas and bare names in one Update.
    let value = chosen.join(",");
    autoscaler_update(&h, |d| {
        d["spec"]["replicas"] = json!(3);
        d["metadata"]["annotations"][annotations::TRIGGER_DELETION_BY_MCM] = json!(value);
    })
    .await;
    let left = wait_machines(&h, "the 3 machines it kept", |m| names(m) == kept).await;
    assert!(left.iter().all(is_running));
    let d = wait_list(h.deployments(), "the annotation handled", |d| {
        d.first().is_some_and(|d| {
            !d.annotations()
                .contains_key(annotations::TRIGGER_DELETION_BY_MCM)
        })
    })
    .await;
    assert_eq!(d[0].spec.replicas, Some(3), "replicas are the autoscaler's");
    assert!(
        d[0].annotations()
            .contains_key(annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME),
        "the replica-change time is recorded"
    );

    // A second scale-down: one more machine, named together with nothing else.
    let third = kept.iter().next().cloned().expect("a machine");
    autoscaler_update(&h, |d| {
        d["spec"]["replicas"] = json!(2);
        d["metadata"]["annotations"][annotations::TRIGGER_DELETION_BY_MCM] = json!(third);
    })
    .await;
    let kept: BTreeSet<String> = kept.into_iter().filter(|n| *n != third).collect();
    wait_machines(&h, "the 2 machines it kept", |m| names(m) == kept).await;
    wait_list(h.deployments(), "the annotation handled", |d| {
        d.first().is_some_and(|d| {
            !d.annotations()
                .contains_key(annotations::TRIGGER_DELETION_BY_MCM)
        })
    })
    .await;

    // Never fewer replicas than the autoscaler set, never a machine it did not name
    // deleted (no machine created either: nothing was replaced).
    let seen = replicas.lock().expect("lock").clone();
    assert_eq!(seen, [5, 3, 2], "replicas seen");
    assert_eq!(
        set_of(&machines),
        names(&all),
        "machines seen besides the first 5"
    );
    assert_eq!(set_of(&sets).len(), 1);
    for t in [sets_task, replicas_task, machines_task] {
        t.abort();
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_machine_goes_even_when_the_replicas_do_not_change() {
    // Upstream #1078 and #1085: the autoscaler named a machine and lowered the replicas, then
    // scaled up again before the machine went (its node stays cordoned by the autoscaler):
    // the named machine is still replaced, and the replicas are the autoscaler's last.
    let h = Harness::start("ca-stale").await;
    create_deployment(&h, &md(3)).await;
    let all = wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    wait_rollout_finished(&h).await;
    let victim = all[0].name_any();
    let time = "2026-01-01T00:00:00Z";
    // Named in the current format with the replicas unchanged (the scale-down and the
    // scale-up met in one object).
    let (sets, sets_task) = names_ever(h.sets()).await;
    patch_deployment(
        &h,
        "md",
        json!({"metadata": {"annotations": {
            annotations::TRIGGER_DELETION_BY_MCM: format!("{victim}~{time}"),
            annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME: time,
        }}}),
    )
    .await;
    wait_list(h.deployments(), "the annotation handled", |d| {
        d.first().is_some_and(|d| {
            !d.annotations()
                .contains_key(annotations::TRIGGER_DELETION_BY_MCM)
        })
    })
    .await;
    let after = wait_machines(&h, "the named machine replaced", |m| {
        m.len() == 3 && running_of_class(m, "c1") == 3 && !names(m).contains(&victim)
    })
    .await;
    assert_eq!(
        names(&after).intersection(&names(&all)).count(),
        2,
        "only the named machine was replaced"
    );
    assert_eq!(set_of(&sets).len(), 1);
    sets_task.abort();
    let d = h.deployments().get("md").await.expect("md");
    assert_eq!(d.spec.replicas, Some(3));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progressing_carries_the_reasons_the_autoscaler_gates_on_without_a_deadline() {
    let h = Harness::start("ca-progress").await;
    let (reasons, recorder) = record_ever(h.deployments(), progressing_reason).await;
    let mut d = md(3);
    d.spec.progress_deadline_seconds = None;
    create_deployment(&h, &d).await;
    wait_rollout_finished(&h).await;
    // A rollout: the reason leaves NewMachineSetAvailable while it runs and comes back.
    patch_deployment(
        &h,
        "md",
        json!({"spec": {"template": {"spec": {"class": {"name": "c2"}}}}}),
    )
    .await;
    wait_machines(&h, "3 running c2 only", |m| {
        m.len() == 3 && running_of_class(m, "c2") == 3
    })
    .await;
    wait_rollout_finished(&h).await;
    // Paused: DeploymentPaused.
    patch_deployment(&h, "md", json!({"spec": {"paused": true}})).await;
    wait_list(h.deployments(), "Progressing DeploymentPaused", |d| {
        d.first()
            .and_then(progressing_reason)
            .is_some_and(|r| r == "DeploymentPaused")
    })
    .await;
    // The recorder's own watch delivers that write too (it may lag behind the wait's watch).
    eventually(WAIT, "the recorder to see DeploymentPaused", || async {
        reasons.lock().expect("lock").last().map(String::as_str) == Some("DeploymentPaused")
    })
    .await;
    recorder.abort();
    let seen = reasons.lock().expect("lock").clone();
    let rolled = seen.windows(3).any(|w| {
        w == [
            "NewMachineSetAvailable",
            "MachineSetUpdated",
            "NewMachineSetAvailable",
        ]
    });
    assert!(rolled, "Progressing reasons seen: {seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("DeploymentPaused"));
    h.stop().await;
}
