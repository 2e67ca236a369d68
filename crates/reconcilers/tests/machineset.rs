//! MachineSet controller and overshooting safety against a real control plane.

mod common_manager;

use std::collections::BTreeMap;

use common_manager::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use mcm_api::constants::{annotations, finalizers, labels};
use mcm_api::{Machine, MachineSet, MachineSetConditionType, MachineSetSpec};
use serde_json::json;

fn set(name: &str, replicas: i32) -> MachineSet {
    MachineSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: MachineSetSpec {
            replicas: Some(replicas),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("name".to_owned(), name.to_owned())])),
                ..LabelSelector::default()
            }),
            template: Some(template("c1", name)),
            ..MachineSetSpec::default()
        },
        ..MachineSet::default()
    }
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
        let m = Machine {
            metadata: ObjectMeta {
                name: Some(format!("orphan-{i}")),
                labels: Some(BTreeMap::from([("name".to_owned(), "ms".to_owned())])),
                finalizers: Some(vec!["test/hold".into()]),
                ..ObjectMeta::default()
            },
            spec: template("c1", "ms").spec.unwrap_or_default(),
            ..Machine::default()
        };
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
