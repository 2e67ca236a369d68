//! VMs without a process (`providerSpec.node: kwok`) against a real control plane with the
//! kwok controller: the driver creates the Node, kwok makes it Ready and renews its Lease;
//! create is idempotent, status and list report the VM, delete removes the Node and the
//! record, and a Node of the same name that is not the VM's is neither adopted nor deleted.

mod common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use mcm_driver::{Code, ResourceState};
use mcm_provider_local::NodeKind;
use mcm_testenv::Components;
use mcm_testenv::kit::{TestNamespace, await_object};
use serde_json::json;

#[tokio::test]
async fn kwok_vms_live_as_records_with_nodes_kwok_keeps_ready() {
    let TestNamespace { env, client, ns } =
        TestNamespace::new(Components::API_SERVER, "kwok").await;
    env.start_kwok().await.expect("kwok starts");
    let cloud = Cloud::on(
        &env,
        json!({"node": "kwok", "labels": {"kwok-test": ns}, "capacity": {"cpu": "4"}}),
    );
    let name = format!("{ns}-vm");

    // Create twice (a retry): one record, one Node, no process.
    let created = cloud.create(&name).await.expect("create");
    assert_eq!(created.provider_id, format!("local:///{name}"));
    assert_eq!(cloud.create(&name).await.expect("create again"), created);
    let record = cloud.state().read(&name).unwrap().expect("a record");
    assert_eq!(record.node, NodeKind::Kwok);
    assert_eq!(record.process_pid(), None);
    assert!(
        agent_processes(&name).is_empty(),
        "a kwok VM has no process"
    );

    // kwok makes the Node Ready and renews its Lease.
    let node = await_node(&client, &name, "Ready (by kwok)", |n| {
        n.is_some_and(mcm_testenv::kit::is_ready)
    })
    .await
    .expect("the Node");
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(created.provider_id.as_str())
    );
    assert_eq!(node.metadata.labels.as_ref().unwrap()["kwok-test"], ns);
    assert_eq!(
        node.status.as_ref().unwrap().capacity.as_ref().unwrap()["cpu"].0,
        "4"
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    await_object(
        leases,
        &name,
        WAIT,
        "the Node Lease kwok renews",
        |l: Option<&Lease>| {
            l.is_some_and(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .is_some()
            })
        },
    )
    .await;

    // Status and list report it Running.
    let status = cloud.status(&name).await.expect("status");
    assert_eq!(status.resources[0].state, ResourceState::Running);
    let list = cloud.list().await;
    assert_eq!(list.machines[&created.provider_id], name);

    // Delete: the Node goes with the VM; deleting again is fine; status says NotFound.
    cloud.delete(&name).await.expect("delete");
    await_node(&client, &name, "deleted", |n| n.is_none()).await;
    assert!(cloud.state().read(&name).unwrap().is_none());
    cloud.delete(&name).await.expect("delete again");
    assert_eq!(
        cloud.status(&name).await.expect_err("gone").code,
        Code::NotFound
    );
    assert!(cloud.list().await.machines.is_empty());
}

#[tokio::test]
async fn a_foreign_node_of_the_same_name_is_not_taken_over() {
    let TestNamespace { env, client, ns } =
        TestNamespace::new(Components::API_SERVER, "kwokf").await;
    let cloud = Cloud::on(&env, json!({"node": "kwok"}));
    let name = format!("{ns}-taken");
    let nodes: Api<Node> = Api::all(client.clone());
    let mut foreign = Node::default();
    foreign.metadata.name = Some(name.clone());
    foreign.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some("aws:///eu-west-1/i-123".into()),
        ..Default::default()
    });
    nodes
        .create(&PostParams::default(), &foreign)
        .await
        .expect("a foreign Node");

    let err = cloud.create(&name).await.expect_err("refused");
    assert_eq!(err.code, Code::FailedPrecondition, "{err}");
    assert!(err.message.contains("aws:///eu-west-1/i-123"), "{err}");
    // The VM record exists (the "instance" was made); deleting it leaves the foreign Node.
    cloud.delete(&name).await.expect("delete");
    assert!(nodes.get_opt(&name).await.unwrap().is_some());
    assert!(cloud.state().read(&name).unwrap().is_none());
}

#[tokio::test]
async fn a_bad_kubeconfig_is_an_invalid_argument() {
    let cloud = Cloud::new("not: [a kubeconfig", json!({"node": "kwok"}), None);
    let err = cloud.create("vm-1").await.expect_err("refused");
    assert_eq!(err.code, Code::InvalidArgument, "{err}");
    assert!(err.message.contains("kubeconfig"), "{err}");
    assert!(
        cloud.state().read("vm-1").unwrap().is_none(),
        "nothing was made"
    );
}
