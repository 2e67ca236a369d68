//! MachineSet controller and overshooting safety against a real control plane.

mod common_manager;

use std::time::Duration;

use common_manager::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use mcm_api::constants::annotations::preserve_values;
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::{Machine, MachineSet, MachineSetConditionType};
use mcm_testenv::kit::{MachineBuilder, MachineSetBuilder, await_list, consistently, eventually};
use serde_json::json;

/// Bound for reactions to a deletion: far below the 600 s resync, so a set that only
/// notices at the resync fails.
const PROMPT: Duration = Duration::from_secs(15);

/// The first set's status counts `n` machines, all ready, available and fully labelled.
fn counted(n: i32) -> impl Fn(&[MachineSet]) -> bool {
    move |s| {
        s.first().and_then(|s| s.status.as_ref()).is_some_and(|st| {
            st.replicas == Some(n)
                && st.ready_replicas == Some(n)
                && st.available_replicas == Some(n)
                && st.fully_labeled_replicas == Some(n)
        })
    }
}

fn set(name: &str, replicas: i32) -> MachineSet {
    MachineSetBuilder::new(name)
        .replicas(replicas)
        .class("c1")
        .build()
}

/// Creates the set `ms` of 3 machines and waits until they run and are counted.
async fn start_set_of_3(h: &Harness) -> Vec<Machine> {
    h.sets()
        .create(&PostParams::default(), &set("ms", 3))
        .await
        .expect("create set");
    let ms = wait_machines(h, "3 running", |m| {
        m.len() == 3 && running_of_class(m, "c1") == 3
    })
    .await;
    wait_list(h.sets(), "3 machines counted", counted(3)).await;
    ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_one_machine_goes_first_and_deleting_the_set_deletes_its_machines() {
    let h = Harness::start("ms-priority").await;
    h.sets()
        .create(&PostParams::default(), &set("ms", 3))
        .await
        .expect("create set");
    let ms = wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    for m in &ms {
        assert!(
            m.finalizers().is_empty(),
            "machines are created without finalizers"
        );
        assert!(m.name_any().starts_with("ms-"));
        assert_eq!(m.owner_references()[0].controller, Some(true));
    }
    let s = h.sets().get("ms").await.expect("get");
    assert!(
        s.finalizers()
            .iter()
            .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
    );
    // Mark the newest machine (MCM would delete the oldest otherwise).
    let mut sorted = ms.clone();
    sorted.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let victim = sorted[2].name_any();
    h.machines()
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {annotations::MACHINE_PRIORITY: "1"}}}),
            ),
        )
        .await
        .expect("annotate");
    h.sets()
        .patch(
            "ms",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale");
    let left = wait_machines(&h, "2 machines", |m| m.len() == 2).await;
    assert!(left.iter().all(|m: &Machine| m.name_any() != victim));
    wait_list(h.sets(), "status counters", |s| {
        s.first().and_then(|s| s.status.as_ref()).is_some_and(|st| {
            st.replicas == Some(2)
                && st.ready_replicas == Some(2)
                && st.available_replicas == Some(2)
                && st.fully_labeled_replicas == Some(2)
        })
    })
    .await;
    h.sets()
        .delete("ms", &Default::default())
        .await
        .expect("delete set");
    wait_machines(&h, "no machines", |m| m.is_empty()).await;
    wait_list(h.sets(), "set gone", |s| s.is_empty()).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overshoot_freezes_and_unfreezes() {
    let h = Harness::start("ms-overshoot").await;
    h.sets()
        .create(&PostParams::default(), &set("ms", 1))
        .await
        .expect("create set");
    wait_machines(&h, "1 running", |m| running_of_class(m, "c1") == 1).await;
    // Four orphans the set adopts; a test finalizer keeps the surplus alive while the set
    // deletes it, so the set has 5 >= 2*1 + 2 machines.
    for i in 0..4 {
        let m = MachineBuilder::new(&format!("orphan-{i}"))
            .label("name", "ms")
            .finalizer("test/hold")
            .class("c1")
            .build();
        h.machines()
            .create(&PostParams::default(), &m)
            .await
            .expect("create orphan");
    }
    wait_list(h.sets(), "frozen", |s| {
        s.first().is_some_and(|s| {
            s.labels().get(labels::FREEZE).map(String::as_str) == Some("True")
                && s.status
                    .as_ref()
                    .and_then(|st| st.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == MachineSetConditionType::Frozen))
        })
    })
    .await;
    // Release the held machines: the count drops and the set is unfrozen.
    for i in 0..4 {
        let _ = h
            .machines()
            .patch(
                &format!("orphan-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    wait_list(h.sets(), "unfrozen", |s| {
        s.first().is_some_and(|s| {
            !s.labels().contains_key(labels::FREEZE)
                && s.status
                    .as_ref()
                    .and_then(|st| st.conditions.as_ref())
                    .is_none_or(|c| c.iter().all(|c| c.type_ != MachineSetConditionType::Frozen))
        })
    })
    .await;
    wait_machines(&h, "1 machine again", |m| m.len() == 1).await;
    h.stop().await;
}

/// A Machine deleted behind the set's back (no finalizer: it is gone at once, with nothing
/// but a watch `Delete` event) is replaced and counted within seconds, not at the resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deleted_directly_is_replaced_and_counted_promptly() {
    let h = Harness::start("ms-gone").await;
    let ms = start_set_of_3(&h).await;
    let victim = ms[0].name_any();
    h.machines()
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete machine");
    await_list(h.machines(), PROMPT, "a running replacement", |m| {
        m.len() == 3 && running_of_class(m, "c1") == 3 && m.iter().all(|m| m.name_any() != victim)
    })
    .await;
    await_list(h.sets(), PROMPT, "3 machines counted again", counted(3)).await;
    h.stop().await;
}

/// The VM-crash flow of the bug report: a Machine held by a finalizer is deleted, replaced
/// while it terminates (the set counts 4), then its last finalizer goes and it disappears.
/// The counters must drop to the 3 machines left within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_drop_when_the_last_finalizer_of_a_machine_goes() {
    let h = Harness::start("ms-finalizer").await;
    let ms = start_set_of_3(&h).await;
    let victim = ms[0].name_any();
    h.machines()
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["test/hold"]}})),
        )
        .await
        .expect("hold");
    h.machines()
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete machine");
    wait_machines(&h, "a replacement while the victim terminates", |m| {
        m.len() == 4 && running_of_class(m, "c1") == 3
    })
    .await;
    wait_list(h.sets(), "the terminating machine counted", |s| {
        s.first()
            .and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.replicas == Some(4))
    })
    .await;
    h.machines()
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
    wait_machines(&h, "the victim gone", |m| {
        m.len() == 3 && m.iter().all(|m| m.name_any() != victim)
    })
    .await;
    await_list(h.sets(), PROMPT, "the 3 machines left counted", counted(3)).await;
    h.stop().await;
}

/// `now` moved by `secs` seconds, as a Kubernetes time.
fn time_in(secs: i64) -> Time {
    Time(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(secs))
}

/// Sets (`Some`) or removes the preserve annotation of a machine, as a user would.
async fn set_preserve_annotation(h: &Harness, name: &str, value: Option<&str>) {
    h.machines()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::PRESERVE: value}}})),
        )
        .await
        .expect("annotate machine");
}

/// Patches the status of a machine, as the machine controller would.
async fn patch_machine_status(h: &Harness, name: &str, status: serde_json::Value) {
    h.machines()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("patch machine status");
}

/// Turns a machine Failed (with a failed health check), with a preservation expiry when
/// given.
async fn fail_machine(h: &Harness, name: &str, expiry: Option<Time>) {
    patch_machine_status(
        h,
        name,
        json!({
            "currentStatus": {
                "phase": "Failed",
                "lastUpdateTime": time_in(0),
                "preserveExpiryTime": expiry,
            },
            "lastOperation": {
                "description": "machine is unhealthy",
                "state": "Failed",
                "type": "HealthCheck",
                "lastUpdateTime": time_in(0),
            },
        }),
    )
    .await;
}

fn status_of(sets: &[MachineSet]) -> Option<&mcm_api::MachineSetStatus> {
    sets.first().and_then(|s| s.status.as_ref())
}

fn preserve_annotation(m: &Machine) -> Option<&str> {
    m.annotations()
        .get(annotations::PRESERVE)
        .map(String::as_str)
}

/// A Failed machine preserved until a time in the future is kept (and counted, so not
/// replaced), reported in `preservedFailedReplicas` rather than `failedMachines`; once its
/// expiry has passed, the set deletes and replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preserved_failed_machine_is_kept_until_its_expiry() {
    let h = Harness::start("ms-preserved").await;
    h.sets()
        .create(&PostParams::default(), &set("ms", 2))
        .await
        .expect("create set");
    let ms = wait_machines(&h, "2 running", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2
    })
    .await;
    let victim = ms[0].name_any();
    set_preserve_annotation(&h, &victim, Some(preserve_values::WHEN_FAILED)).await;
    fail_machine(&h, &victim, Some(time_in(3600))).await;
    wait_list(h.sets(), "one preserved Failed machine", |s| {
        status_of(s).is_some_and(|st| {
            st.preserved_failed_replicas == Some(1)
                && st.failed_machines.is_none()
                && st.replicas == Some(2)
                && st.ready_replicas == Some(1)
        })
    })
    .await;
    // Kept, and no replacement.
    consistently(
        Duration::from_secs(2),
        "the preserved machine kept and not replaced",
        || async {
            let ms = list_machines(&h).await?;
            let kept = ms
                .iter()
                .any(|m| m.name_any() == victim && m.metadata.deletion_timestamp.is_none());
            if ms.len() == 2 && kept {
                Ok(())
            } else {
                Err(overview(&ms))
            }
        },
    )
    .await;

    // The preservation expires: the set deletes the machine and replaces it.
    patch_machine_status(
        &h,
        &victim,
        json!({"currentStatus": {"preserveExpiryTime": time_in(-60)}}),
    )
    .await;
    await_list(h.machines(), PROMPT, "the expired machine replaced", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2 && m.iter().all(|m| m.name_any() != victim)
    })
    .await;
    wait_list(h.sets(), "nothing preserved any more", |s| {
        counted(2)(s) && status_of(s).is_some_and(|st| st.preserved_failed_replicas.is_none())
    })
    .await;
    h.stop().await;
}

/// With `autoPreserveFailedMachineMax: 1` and two machines failing, the newest one is
/// annotated `auto-preserved` and kept, the other one is replaced; lowering the maximum to 0
/// takes the annotation away again, and the machine is replaced too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_preservation_keeps_the_newest_failed_machines_up_to_the_maximum() {
    let h = Harness::start("ms-autopreserve").await;
    let mut s = set("ms", 1);
    s.spec.auto_preserve_failed_machine_max = Some(1);
    h.sets()
        .create(&PostParams::default(), &s)
        .await
        .expect("create set");
    let first = wait_machines(&h, "1 running", |m| running_of_class(m, "c1") == 1).await;
    // Creation times have a resolution of a second: the second machine is newer once the
    // second of the first one's creation is over.
    let created = first
        .iter()
        .find_map(|m| m.metadata.creation_timestamp.as_ref())
        .expect("a creation time")
        .0;
    eventually(
        WAIT,
        "the second of the first creation to pass",
        || async move { jiff::Timestamp::now().as_second() > created.as_second() },
    )
    .await;
    h.sets()
        .patch(
            "ms",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale");
    let mut ms = wait_machines(&h, "2 running", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2
    })
    .await;
    ms.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let (older, newer) = (ms[0].name_any(), ms[1].name_any());
    assert_ne!(
        ms[0].metadata.creation_timestamp,
        ms[1].metadata.creation_timestamp
    );
    fail_machine(&h, &newer, None).await;
    fail_machine(&h, &older, None).await;
    wait_machines(&h, "the newer auto-preserved, the older replaced", |m| {
        m.len() == 2
            && running_of_class(m, "c1") == 1
            && m.iter().all(|m| m.name_any() != older)
            && m.iter().any(|m| {
                m.name_any() == newer
                    && m.metadata.deletion_timestamp.is_none()
                    && preserve_annotation(m) == Some(preserve_values::AUTO_PRESERVED)
            })
    })
    .await;
    wait_list(h.sets(), "one auto-preserved machine counted", |s| {
        status_of(s).is_some_and(|st| {
            st.auto_preserve_failed_machine_count == Some(1) && st.replicas == Some(2)
        })
    })
    .await;
    let left = h.machines().list(&Default::default()).await.expect("list");
    assert_eq!(
        left.items
            .iter()
            .filter(|m| preserve_annotation(m).is_some())
            .count(),
        1,
        "exactly one machine is auto-preserved"
    );

    // Lowered maximum: the annotation goes, and the Failed machine is replaced.
    h.sets()
        .patch(
            "ms",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoPreserveFailedMachineMax": 0}})),
        )
        .await
        .expect("lower the maximum");
    wait_machines(&h, "the released machine replaced", |m| {
        m.len() == 2 && running_of_class(m, "c1") == 2 && m.iter().all(|m| m.name_any() != newer)
    })
    .await;
    wait_list(h.sets(), "no auto-preserved machine counted", |s| {
        counted(2)(s)
            && status_of(s).is_some_and(|st| st.auto_preserve_failed_machine_count.is_none())
    })
    .await;
    h.stop().await;
}

/// A scale-down deletes a machine that is not preserved, though the preserved one would be
/// first in MCM's order otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_spares_a_preserved_machine() {
    let h = Harness::start("ms-preserved-scale").await;
    let mut ms = start_set_of_3(&h).await;
    // Without preservation the oldest machine (then the first name) goes first.
    ms.sort_by_key(|m| {
        (
            m.metadata.creation_timestamp.as_ref().map(|t| t.0),
            m.name_any(),
        )
    });
    let kept = ms[0].name_any();
    set_preserve_annotation(&h, &kept, Some(preserve_values::NOW)).await;
    patch_machine_status(
        &h,
        &kept,
        json!({"currentStatus": {"preserveExpiryTime": time_in(3600)}}),
    )
    .await;
    wait_machines(&h, "the expiry set", |m| {
        m.iter().any(|m| {
            m.name_any() == kept
                && m.status
                    .as_ref()
                    .and_then(|s| s.current_status.as_ref())
                    .is_some_and(|c| c.preserve_expiry_time.is_some())
        })
    })
    .await;
    // The manager's store must hold it too (a separate watch).
    manager_caught_up(&h, &kept).await;
    h.sets()
        .patch(
            "ms",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale down");
    let left = wait_machines(&h, "2 machines", |m| m.len() == 2).await;
    assert!(
        left.iter().any(|m| m.name_any() == kept),
        "the preserved machine is kept"
    );
    wait_list(h.sets(), "2 machines counted", counted(2)).await;
    h.stop().await;
}

/// Patches the labels of the machine `name`.
async fn label_machine(h: &Harness, name: &str, key: &str, value: Option<&str>) {
    h.machines()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .expect("label machine");
}

/// Sets the replicas (and optionally the scale-up-disabled label) of the set `ms`; returns
/// the set as patched.
async fn scale_set(
    h: &Harness,
    replicas: i32,
    scale_up_disabled: Option<Option<&str>>,
) -> MachineSet {
    let mut patch = json!({"spec": {"replicas": replicas}});
    if let Some(value) = scale_up_disabled {
        patch["metadata"] = json!({"labels": {labels::MACHINE_SET_SCALE_UP_DISABLED: value}});
    }
    h.sets()
        .patch("ms", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("scale set")
}

/// Waits until the set has reconciled the spec of `patched` (its `observedGeneration`).
async fn wait_observed(h: &Harness, patched: &MachineSet) {
    let generation = patched.metadata.generation.expect("a generation");
    wait_list(
        h.sets(),
        &format!("generation {generation} observed"),
        |s| {
            status_of(s)
                .and_then(|st| st.observed_generation)
                .is_some_and(|g| g >= generation)
        },
    )
    .await;
}

/// The machines of the test (a failed list as its error).
async fn list_machines(h: &Harness) -> Result<Vec<Machine>, String> {
    h.machines()
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("the list failed: {e}"))
}

/// Name, phase and deletion of each machine, for a failure message.
fn overview(ms: &[Machine]) -> String {
    let each: Vec<String> = ms
        .iter()
        .map(|m| {
            let deleting = if m.metadata.deletion_timestamp.is_some() {
                ", deleting"
            } else {
                ""
            };
            format!("{} ({:?}{deleting})", m.name_any(), m.phase())
        })
        .collect();
    format!("{} machines: {}", ms.len(), each.join(", "))
}

/// In-place updates, the MachineSet's part: a machine labelled `update-result: successful`
/// (just moved to the set) is never surplus, and a set labelled `scale-up-disabled` creates
/// no machines until the label goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_machine_is_kept_and_scale_up_disabled_creates_nothing() {
    let h = Harness::start("ms-inplace").await;
    let ms = start_set_of_3(&h).await;
    let moved = ms[0].name_any();
    label_machine(&h, &moved, labels::UPDATE_RESULT, Some("successful")).await;
    wait_machines(&h, "the label seen", |m| {
        m.iter().any(|m| {
            m.labels().get(labels::UPDATE_RESULT).map(String::as_str) == Some("successful")
        })
    })
    .await;
    manager_caught_up(&h, &moved).await;
    // 2 replicas and 2 machines without the label: nothing is surplus.
    let scaled = scale_set(&h, 2, None).await;
    wait_observed(&h, &scaled).await;
    consistently(Duration::from_secs(3), "no machine deleted", || async {
        let ms = list_machines(&h).await?;
        if ms.len() == 3 && ms.iter().all(|m| m.metadata.deletion_timestamp.is_none()) {
            Ok(())
        } else {
            Err(overview(&ms))
        }
    })
    .await;
    // 1 replica: one of the other two goes, the moved one stays.
    scale_set(&h, 1, None).await;
    let left = wait_machines(&h, "2 machines", |m| m.len() == 2).await;
    assert!(left.iter().any(|m| m.name_any() == moved));
    label_machine(&h, &moved, labels::UPDATE_RESULT, None).await;
    wait_machines(&h, "1 machine", |m| m.len() == 1).await;

    // Scale-up disabled: 3 replicas, still 1 machine.
    let scaled = scale_set(&h, 3, Some(Some("true"))).await;
    wait_observed(&h, &scaled).await;
    consistently(Duration::from_secs(3), "no machine created", || async {
        let ms = list_machines(&h).await?;
        if ms.len() == 1 {
            Ok(())
        } else {
            Err(overview(&ms))
        }
    })
    .await;
    scale_set(&h, 3, Some(None)).await;
    wait_machines(&h, "3 running", |m| {
        m.len() == 3 && running_of_class(m, "c1") == 3
    })
    .await;
    h.stop().await;
}

/// `minReadySeconds` is counted by the manager's clock (`ManagerConfig::clock`): while a
/// test clock stands still, running machines are ready but not available; once it is moved
/// past `minReadySeconds`, the next reconcile counts them available. No waiting for the
/// real 10 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ready_seconds_are_counted_by_the_managers_clock() {
    use mcm_reconcilers::clock::{ManualClock, SharedClock};
    let clock = std::sync::Arc::new(ManualClock::starting_now());
    let shared: SharedClock = clock.clone();
    let h = Harness::start_with("ms-clock", move |c| c.clock = shared).await;
    let mut s = set("ms", 3);
    s.spec.min_ready_seconds = Some(600);
    h.sets()
        .create(&PostParams::default(), &s)
        .await
        .expect("create set");
    wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    let ready_not_available = |s: &[MachineSet]| {
        s.first()
            .and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.ready_replicas == Some(3) && st.available_replicas == Some(0))
    };
    wait_list(h.sets(), "3 ready, none available", ready_not_available).await;
    // The machines have been Running for 600 s by the manager's clock.
    clock.advance(Duration::from_secs(2 * 3600));
    // The set's own recheck is 600 s away: a change of the set brings the next reconcile.
    h.sets()
        .patch(
            "ms",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"test/touch": "1"}}})),
        )
        .await
        .expect("touch the set");
    wait_list(h.sets(), "3 machines available", counted(3)).await;
    h.stop().await;
}
