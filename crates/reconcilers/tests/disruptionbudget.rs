//! MachineDisruptionBudgets against a real control plane: a scale-down goes one machine at a
//! time under `maxUnavailable: 1`, the budget says so, and a Failed machine is still
//! replaced.

mod common_manager;

use std::collections::HashSet;
use std::time::Duration;

use common_manager::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use mcm_api::disruption_budget::condition_reasons;
use mcm_api::{
    Machine, MachineDisruptionBudget, MachineDisruptionBudgetSpec, MachineDisruptionBudgetStatus,
};
use mcm_testenv::kit::{MachineBuilder, MachineSetBuilder, await_list, eventually};
use serde_json::json;

const HOLD: &str = "test/hold";

fn budget(max_unavailable: i32) -> MachineDisruptionBudget {
    MachineDisruptionBudget::new(
        "budget",
        MachineDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("name".to_string(), "ms".to_string())].into()),
                ..LabelSelector::default()
            }),
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            ..MachineDisruptionBudgetSpec::default()
        },
    )
}

fn status_of(bs: &[MachineDisruptionBudget]) -> Option<&MachineDisruptionBudgetStatus> {
    bs.first().and_then(|b| b.status.as_ref())
}

fn condition_reason(st: &MachineDisruptionBudgetStatus) -> Option<&str> {
    st.conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionAllowed")?
        .reason
        .as_deref()
}

async fn patch_machine(api: &Api<Machine>, name: &str, patch: serde_json::Value, status: bool) {
    let pp = PatchParams::default();
    let r = if status {
        api.patch_status(name, &pp, &Patch::Merge(&patch)).await
    } else {
        api.patch(name, &pp, &Patch::Merge(&patch)).await
    };
    r.unwrap_or_else(|e| panic!("patch machine {name}: {e}"));
}

fn owned(ms: &[Machine]) -> Vec<&Machine> {
    ms.iter()
        .filter(|m| m.owner_references().iter().any(|o| o.kind == "MachineSet"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_lets_one_machine_go_at_a_time_and_never_blocks_a_failed_replacement() {
    let h = Harness::start("mdb").await;
    let budgets: Api<MachineDisruptionBudget> = Api::namespaced(h.client.clone(), &h.ns);
    let machines = h.machines();
    h.sets()
        .create(
            &PostParams::default(),
            &MachineSetBuilder::new("ms").replicas(3).class("c1").build(),
        )
        .await
        .expect("create set");
    let ms = wait_machines(&h, "3 running", |m| running_of_class(m, "c1") == 3).await;
    // The test plays the drain: a deleted machine stays until the test lets it go.
    for m in &ms {
        patch_machine(
            &machines,
            &m.name_any(),
            json!({"metadata": {"finalizers": [HOLD]}}),
            false,
        )
        .await;
    }
    budgets
        .create(&PostParams::default(), &budget(1))
        .await
        .expect("create budget");
    wait_list(budgets.clone(), "1 disruption allowed of 3", |bs| {
        status_of(bs).is_some_and(|st| {
            st.expected_machines == Some(3)
                && st.disruptions_allowed == Some(1)
                && condition_reason(st) == Some(condition_reasons::SUFFICIENT_MACHINES)
        })
    })
    .await;

    // An outsider the budget selects but the set does not own, Failed: counted as
    // involuntarily unavailable, and it uses up the budget.
    let owner = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("owner".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let owner = Api::<ConfigMap>::namespaced(h.client.clone(), &h.ns)
        .create(&PostParams::default(), &owner)
        .await
        .expect("create owner");
    let mut outsider = MachineBuilder::new("outsider")
        .label("name", "ms")
        .class("c1")
        .build();
    outsider.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().expect("uid"),
        controller: Some(true),
        ..Default::default()
    }]);
    machines
        .create(&PostParams::default(), &outsider)
        .await
        .expect("create outsider");
    wait_machines(&h, "the outsider running", |m| {
        m.iter()
            .any(|m| m.name_any() == "outsider" && is_running(m))
    })
    .await;
    patch_machine(
        &machines,
        "outsider",
        json!({"status": {"currentStatus": {"phase": "Failed"}}}),
        true,
    )
    .await;
    wait_list(
        budgets.clone(),
        "the outsider counted involuntarily",
        |bs| {
            status_of(bs).is_some_and(|st| {
                st.expected_machines == Some(4)
                    && st.unavailable_involuntary == Some(1)
                    && st.disruptions_allowed == Some(0)
            })
        },
    )
    .await;

    // A Failed machine of the set is replaced although the budget allows no disruption.
    let failed = ms[0].name_any();
    patch_machine(
        &machines,
        &failed,
        json!({"status": {"currentStatus": {"phase": "Failed"}}}),
        true,
    )
    .await;
    wait_machines(&h, "the Failed machine deleted and replaced", |m| {
        m.iter()
            .any(|m| m.name_any() == failed && m.metadata.deletion_timestamp.is_some())
            && running_of_class(&owned(m).into_iter().cloned().collect::<Vec<_>>(), "c1") == 3
    })
    .await;
    patch_machine(
        &machines,
        &failed,
        json!({"metadata": {"finalizers": null}}),
        false,
    )
    .await;
    machines
        .delete("outsider", &Default::default())
        .await
        .expect("delete outsider");
    let ms = wait_machines(&h, "3 running machines of the set", |m| {
        m.len() == 3 && running_of_class(m, "c1") == 3
    })
    .await;
    for m in ms.iter().filter(|m| m.finalizers().is_empty()) {
        patch_machine(
            &machines,
            &m.name_any(),
            json!({"metadata": {"finalizers": [HOLD]}}),
            false,
        )
        .await;
    }
    wait_list(budgets.clone(), "1 disruption allowed again", |bs| {
        status_of(bs)
            .is_some_and(|st| st.expected_machines == Some(3) && st.disruptions_allowed == Some(1))
    })
    .await;

    // Scale to 0: one machine deleting at a time, checked on every state the watch shows.
    h.sets()
        .patch(
            "ms",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale to 0");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let releaser = {
        let (machines, budgets, client, ns) = (
            machines.clone(),
            budgets.clone(),
            h.client.clone(),
            h.ns.clone(),
        );
        tokio::spawn(async move {
            let mut released = HashSet::new();
            let mut first = true;
            while let Some(name) = rx.recv().await {
                if !released.insert(name.clone()) {
                    continue;
                }
                if first {
                    first = false;
                    // While the first machine is held, the budget says it is exhausted
                    // and that a disruption waits, and the set says why it waits.
                    await_list(budgets.clone(), WAIT, "the budget exhausted", |bs| {
                        status_of(bs).is_some_and(|st| {
                            st.disruptions_allowed == Some(0)
                                && condition_reason(st) == Some(condition_reasons::BUDGET_EXHAUSTED)
                                && st.conditions.iter().flatten().any(|c| {
                                    c.message.as_deref().is_some_and(|m| {
                                        m.contains("waiting: ScaleDown of machine")
                                    })
                                })
                        })
                    })
                    .await;
                    let notes = eventually(WAIT, "a DisruptionBlocked Event on the set", || {
                        let client = client.clone();
                        let ns = ns.clone();
                        async move {
                            let notes = mcm_testenv::kit::events_for(
                                &client,
                                &ns,
                                "ms",
                                condition_reasons::DISRUPTION_BLOCKED,
                            )
                            .await;
                            (!notes.is_empty()).then_some(notes)
                        }
                    })
                    .await;
                    assert!(
                        notes[0].contains("MachineDisruptionBudget budget"),
                        "{notes:?}"
                    );
                }
                let _ = machines
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
            released.len()
        })
    };
    await_list(
        machines.clone(),
        Duration::from_secs(180),
        "all machines gone, one at a time",
        |ms| {
            let deleting: Vec<&Machine> = ms
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_some())
                .collect();
            assert!(
                deleting.len() <= 1,
                "more than one machine deleting at once: {:?}",
                deleting.iter().map(|m| m.name_any()).collect::<Vec<_>>()
            );
            for m in deleting {
                let _ = tx.send(m.name_any());
            }
            ms.is_empty()
        },
    )
    .await;
    drop(tx);
    let released = releaser.await.expect("releaser");
    assert_eq!(released, 3);
    h.stop().await;
}
