//! The skeleton provider end to end: its binary with both controllers against the real
//! control plane turns a MachineDeployment into Running machines with Ready Nodes, scales
//! down and deletes everything it made.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use mcm_testenv::Components;
use mcm_testenv::kit::{
    MachineClassBuilder, MachineDeploymentBuilder, ProviderController, TestNamespace, create, create_class_with_secret,
    eventually, kubeconfig_text, secret,
};

const WAIT: Duration = Duration::from_secs(120);

/// The machines, waiting until `pred` holds for them.
async fn machines_when(api: &Api<Machine>, what: &str, pred: impl Fn(&[Machine]) -> bool) -> Vec<Machine> {
    eventually(WAIT, what, || async {
        let list = api.list(&Default::default()).await.ok()?.items;
        pred(&list).then_some(list)
    })
    .await
}

#[tokio::test]
async fn a_deployment_runs_scales_down_and_goes_away() {
    let TestNamespace { env, client, ns } = TestNamespace::new(Components::ALL, "skeleton").await;
    let class = MachineClassBuilder::new("skeleton")
        .provider("skeleton")
        .spec(serde_json::json!({}))
        .secret(&ns, "skeleton")
        .build();
    let kubeconfig = kubeconfig_text(&env);
    create_class_with_secret(&client, &ns, &class, &secret("skeleton", &[("kubeconfig", &kubeconfig)])).await;
    let logs = tempfile::tempdir().unwrap();
    let _controller = ProviderController::spawn(
        "machine-controller-skeleton",
        env!("CARGO_BIN_EXE_machine-controller-skeleton"),
        &[],
        env.kubeconfig_path(),
        &ns,
        logs.path(),
    );
    let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), &ns);
    let md = MachineDeploymentBuilder::new("skeleton").replicas(2).class("skeleton").build();
    create(&deployments, &md).await;

    let machines: Api<Machine> = Api::namespaced(client.clone(), &ns);
    let running =
        |n: usize| move |ms: &[Machine]| ms.len() == n && ms.iter().all(|m| m.phase() == Some(&MachinePhase::Running));
    let two = machines_when(&machines, "2 Running machines", running(2)).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for m in &two {
        let name = m.metadata.name.clone().unwrap_or_default();
        let node = nodes.get(&name).await.expect("the machine's Node");
        let id = node.spec.and_then(|s| s.provider_id);
        assert_eq!(id, Some(format!("skeleton:///{name}")));
        assert_eq!(m.spec.provider_id, id);
    }

    let patch = serde_json::json!({"spec": {"replicas": 1}});
    deployments.patch("skeleton", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("scale down");
    let one = machines_when(&machines, "1 Running machine", running(1)).await;
    let kept = one[0].metadata.name.clone().unwrap_or_default();
    let gone: Vec<String> = two.iter().filter_map(|m| m.metadata.name.clone()).filter(|n| *n != kept).collect();
    eventually(WAIT, "the deleted machine's Node to go", || async {
        nodes.get_opt(&gone[0]).await.ok()?.is_none().then_some(())
    })
    .await;

    deployments.delete("skeleton", &DeleteParams::default()).await.expect("delete");
    machines_when(&machines, "no machine", |ms| ms.is_empty()).await;
    eventually(WAIT, "no Node of the deployment", || async {
        nodes.get_opt(&kept).await.ok()?.is_none().then_some(())
    })
    .await;
}
