//! MachineSet controller and overshooting safety against a real control plane.

mod common_manager;

use std::time::Duration;

use common_manager::*;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::{Machine, MachineSet, MachineSetConditionType};
use mcm_testenv::kit::{MachineBuilder, MachineSetBuilder, await_list};
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
