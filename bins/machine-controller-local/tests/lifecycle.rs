//! The machine controller end to end in one process tree: real control plane, the
//! `machine-controller-local` binary, VMs as `local-node` processes.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, PostParams};
use mcm_api::MachinePhase;
use mcm_driver::{CreateMachineRequest, Driver, IdempotencyKey, RequestId, SecretData};
use mcm_provider_local::{LocalDriver, LocalDriverConfig};
use mcm_testenv::kit::{
    MachineBuilder, MachineDeploymentBuilder, MachineSetBuilder, await_event, await_object, create,
    events_for, eventually, metric_with, node_events_for,
};
use serde_json::json;

fn token_secret_name(h: &Harness, machine: &str) -> String {
    mcm_reconcilers::bootstrap_token::secret_name(&mcm_reconcilers::bootstrap_token::token_id(
        &h.ns, machine,
    ))
}

#[tokio::test]
async fn a_machine_runs_with_its_bootstrap_token_consumed_and_is_deleted_cleanly() {
    let h = Harness::new("create", json!({ "labels": { "pool": "a" } })).await;
    let mc = h.spawn_controller("mc", &[]);
    // The `name` label names the machine's deployment in the duration metrics.
    let m1 = MachineBuilder::new("m1")
        .class("local")
        .label("name", "md1");
    create(&h.machines(), &m1.build()).await;

    let running = h.await_phase("m1", MachinePhase::Running, WAIT).await;
    // How long it took to join: in its lastOperation and in the metrics.
    let description = running
        .status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.clone())
        .unwrap_or_default();
    let joined = description
        .strip_prefix("Machine m1 successfully joined the cluster in ")
        .unwrap_or_else(|| panic!("{description:?}"));
    mcm_api::duration::parse_go_duration(joined).expect("a Go duration");
    let text = mc.metrics().await;
    for name in [
        "mcm_machine_create_duration_seconds",
        "mcm_machine_join_duration_seconds",
    ] {
        let sample = format!(
            "{name}{{namespace=\"{}\",machine_deployment=\"md1\",instance_type=\"\",zone=\"\"}}",
            h.ns
        );
        assert!(
            text.contains(&format!("# TYPE {name} gauge")) && text.contains(&sample),
            "{sample} in:\n{text}"
        );
    }
    assert_eq!(running.spec.provider_id.as_deref(), Some("local:///m1"));
    assert_eq!(
        running
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("node"))
            .map(String::as_str),
        Some("m1")
    );
    assert!(
        running
            .finalizers()
            .iter()
            .any(|f| f == "machine.sapcloud.io/machine-controller-manager"),
        "finalizer"
    );
    // The VM booted with the token (it refuses to boot with a bad one), and the token is
    // gone once the node joined.
    let tokens: Api<Secret> = Api::namespaced(h.client.clone(), "kube-system");
    let token = token_secret_name(&h, "m1");
    await_object(
        tokens,
        &token,
        WAIT,
        "the bootstrap token to be deleted",
        |s: Option<&Secret>| s.is_none(),
    )
    .await;
    let conditions = running
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .cloned()
        .unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conditions:?}"
    );
    let running_notes = await_event(&h.client, &h.ns, "m1", "Running", "local:///m1", WAIT).await;
    assert!(
        running_notes
            .iter()
            .any(|n| n.contains("node m1") && n.contains("local:///m1")),
        "a Running event naming the node and the VM: {running_notes:?}"
    );
    assert!(
        events_for(&h.client, &h.ns, "m1", "Adopted")
            .await
            .is_empty(),
        "a created VM is not announced as adopted"
    );

    // Deletion: the VM, the Node and the finalizer go.
    h.delete_machine("m1").await;
    h.await_gone("m1", WAIT).await;
    assert!(
        h.vm_records().is_empty(),
        "VM record left: {:?}",
        h.vm_records()
    );
    assert!(
        h.nodes().get_opt("m1").await.unwrap().is_none(),
        "node left"
    );
    let text = mc.metrics().await;
    for name in [
        "mcm_machine_drain_duration_seconds",
        "mcm_machine_delete_duration_seconds",
    ] {
        assert!(
            text.contains(&format!(
                "{name}{{namespace=\"{}\",machine_deployment=\"md1\"",
                h.ns
            )),
            "{name} in:\n{text}"
        );
    }
}

use kube::ResourceExt;

#[tokio::test]
async fn a_missing_secret_and_an_invalid_class_are_reported_and_heal_when_corrected() {
    let h = Harness::new("badclass", json!({})).await;
    // A class whose secret does not exist yet, and a class with an invalid providerSpec.
    h.create_class("nosecret", json!({}), "later-secret").await;
    h.create_class(
        "invalid",
        json!({ "capacity": { "cpu": "lots" } }),
        "local-secret",
    )
    .await;
    let mc = h.spawn_controller("mc", &[]);
    h.create_machine("m-nosecret", "nosecret").await;
    h.create_machine("m-invalid", "invalid").await;

    let m = h
        .await_description(
            "m-nosecret",
            WAIT,
            "the missing secret to be reported",
            |d| d.contains("later-secret") && d.contains("not found"),
        )
        .await;
    let op = m.status.unwrap().last_operation.unwrap();
    assert_eq!(op.state.unwrap().as_str(), "Failed");
    let m = h
        .await_description(
            "m-invalid",
            WAIT,
            "the invalid providerSpec to be reported",
            |d| d.contains("capacity.cpu"),
        )
        .await;
    let op = m.status.unwrap().last_operation.unwrap();
    assert_eq!(op.error_code.as_deref(), Some("InvalidArgument"));
    assert!(
        h.vm_records().is_empty(),
        "nothing may be created for a bad class"
    );
    // Each Event follows its status write (the announcement writes the status first).
    for (machine, reason) in [
        ("m-nosecret", "MachineClassProblem"),
        ("m-invalid", "CreationFailed"),
    ] {
        eventually(WAIT, &format!("a {reason} Event on {machine}"), || async {
            !events_for(&h.client, &h.ns, machine, reason)
                .await
                .is_empty()
        })
        .await;
    }

    // No hot loop: with the backoff capped at 2s, a 6s window sees a handful of attempts
    // (each a status lookup and maybe a create), not hundreds.
    let failed_creates = |text: &str| {
        metric_with(
            text,
            "mcm_cloud_api_driver_requests_failed_total",
            "error_code=\"InvalidArgument\"",
        )
    };
    let before = failed_creates(&mc.metrics().await);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = failed_creates(&mc.metrics().await);
    assert!(before >= 1.0, "the failure is counted");
    assert!(
        after - before <= 12.0,
        "hot loop: {} failed creates in 6s",
        after - before
    );

    // Correct both: they heal without a restart.
    h.create_secret("later-secret").await;
    let fixed = h.class_body(
        "invalid",
        json!({ "capacity": { "cpu": "2" } }),
        "local-secret",
    );
    let mut current = h.classes().get("invalid").await.unwrap();
    current.provider_spec = fixed.provider_spec;
    h.classes()
        .replace("invalid", &PostParams::default(), &current)
        .await
        .unwrap();
    h.await_phase("m-nosecret", MachinePhase::Running, WAIT)
        .await;
    h.await_phase("m-invalid", MachinePhase::Running, WAIT)
        .await;
    for m in ["m-nosecret", "m-invalid"] {
        h.delete_machine(m).await;
    }
    for m in ["m-nosecret", "m-invalid"] {
        h.await_gone(m, WAIT).await;
    }
}

#[tokio::test]
async fn a_crashed_vm_goes_unknown_then_failed_and_replacements_are_throttled() {
    let h = Harness::new("health", json!({})).await;
    // Two machines of one MachineDeployment (maxSurge 1): only one may be replaced at a time.
    let md = MachineDeploymentBuilder::new("md")
        .replicas(2)
        .class("local")
        .match_label("app", "w")
        .rolling(1, 0)
        .build();
    let md = create(
        &Api::<mcm_api::MachineDeployment>::namespaced(h.client.clone(), &h.ns),
        &md,
    )
    .await;
    let ms = MachineSetBuilder::new("ms")
        .replicas(2)
        .class("local")
        .label("app", "w")
        .match_label("app", "w")
        .owner(&md)
        .build();
    let ms = create(
        &Api::<mcm_api::MachineSet>::namespaced(h.client.clone(), &h.ns),
        &ms,
    )
    .await;
    for name in ["w1", "w2"] {
        let machine = MachineBuilder::new(name)
            .class("local")
            .label("app", "w")
            .owner(&ms)
            .build();
        create(&h.machines(), &machine).await;
    }
    let _mc = h.spawn_controller("mc", &["--machine-health-timeout=5s".to_string()]);
    for name in ["w1", "w2"] {
        h.await_phase(name, MachinePhase::Running, WAIT).await;
    }
    let (recorder, phases) = record_phases(h.machines());

    // Crash both VMs (kill -9).
    for name in ["w1", "w2"] {
        let pid = h.state().read(name).unwrap().unwrap().pid;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    // The node lifecycle controller marks the nodes Unknown; the machines follow.
    for name in ["w1", "w2"] {
        h.await_phase(name, MachinePhase::Unknown, WAIT).await;
    }
    // One is marked Failed; the other is throttled because the budget (maxSurge 1) is used.
    let failed = eventually(WAIT, "one machine to fail", || async {
        let list = h.machines().list(&Default::default()).await.unwrap();
        let failed: Vec<String> = list
            .items
            .iter()
            .filter(|m| m.phase() == Some(&MachinePhase::Failed))
            .map(|m| m.name_any())
            .collect();
        (!failed.is_empty()).then_some(failed)
    })
    .await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let other = if failed[0] == "w1" { "w2" } else { "w1" };
    h.await_description(other, WAIT, "the other machine to be throttled", |d| {
        d.contains("replacement throttled")
    })
    .await;
    // Once the failed machine is gone (its owner would delete it), the other may fail.
    h.delete_machine(&failed[0]).await;
    h.await_gone(&failed[0], WAIT).await;
    h.await_phase(other, MachinePhase::Failed, WAIT).await;
    // The recorder has its own watch: let it catch up before reading it.
    eventually(WAIT, "the phase recorder to see both failures", || {
        let seen = phases.lock().unwrap().clone();
        async move {
            let done = ["w1", "w2"].iter().all(|n| {
                seen.get(*n)
                    .is_some_and(|p| p.iter().any(|x| x == "Failed"))
            });
            if done { Ok(()) } else { Err(seen) }
        }
    })
    .await;
    recorder.abort();
    let seen = phases.lock().unwrap().clone();
    for name in ["w1", "w2"] {
        let p = &seen[name];
        let unknown = p.iter().position(|x| x == "Unknown").expect("Unknown seen");
        let failed = p.iter().position(|x| x == "Failed").expect("Failed seen");
        assert!(unknown < failed, "{name}: {p:?}");
    }
    h.delete_machine(other).await;
    h.await_gone(other, WAIT).await;
}

#[tokio::test]
async fn deletion_respects_a_pdb_and_reports_it_then_drains() {
    let h = Harness::new("drain", json!({})).await;
    let mc = h.spawn_controller("mc", &[]);
    h.create_machine("d1", "local").await;
    h.await_phase("d1", MachinePhase::Running, WAIT).await;

    // A workload pod on the node, protected by a PDB that allows no disruption.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client.clone(), &h.ns);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": "web", "labels": { "app": "web" } },
        "spec": { "nodeName": "d1", "containers": [{ "name": "c", "image": "example.invalid/web" }] }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    await_object(
        pods.clone(),
        "web",
        WAIT,
        "the pod to run",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Running")
        },
    )
    .await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), &h.ns);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "web-pdb" },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } }
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    await_object(
        pdbs.clone(),
        "web-pdb",
        WAIT,
        "the PDB status",
        |p: Option<&PodDisruptionBudget>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.current_healthy == Some(1))
        },
    )
    .await;

    h.delete_machine("d1").await;
    let m = h
        .await_description("d1", WAIT, "the blocking PDB to show on the machine", |d| {
            d.contains("web-pdb")
        })
        .await;
    assert_eq!(m.phase(), Some(&MachinePhase::Terminating));
    // The block is also told on the Node, for `kubectl describe node`.
    let on_node = node_events_for(&h.client, "d1", "DrainBlockedByPDB").await;
    assert!(on_node.iter().any(|n| n.contains("web-pdb")), "{on_node:?}");
    // And counted, for the MCMDrainBlockedByPDB alert.
    mc.await_metric("mcm_machine_drain_blocked_by_pdb_total", WAIT, |v| v >= 1.0)
        .await;
    // Keep the budget blocking for a while: the drain comes back every retry interval (1s)
    // instead of holding a reconcile open.
    let reconciles = || async {
        metric_with(
            &mc.metrics().await,
            "mcm_controller_reconcile_duration_seconds_count",
            "controller=\"machine\"",
        )
    };
    let before = reconciles().await;
    eventually(WAIT, "8 more machine reconciles", || async {
        let now = reconciles().await;
        if now >= before + 8.0 {
            Ok(())
        } else {
            Err(now)
        }
    })
    .await;
    assert!(
        h.vm_alive("d1"),
        "the VM must not be deleted while the drain is blocked"
    );
    assert!(
        pods.get_opt("web").await.unwrap().is_some(),
        "the pod must survive while the PDB forbids it"
    );

    // Lift the budget: the drain completes and everything goes.
    pdbs.delete("web-pdb", &DeleteParams::default())
        .await
        .unwrap();
    h.await_gone("d1", WAIT).await;
    // Blocked for 8 passes or more, yet no reconcile held a worker for more than a moment.
    let longest = metric_with(
        &mc.metrics().await,
        "mcm_controller_reconcile_longest_seconds",
        "controller=\"machine\"",
    );
    assert!(longest < 3.0, "a reconcile took {longest}s");
    for reason in ["DrainStarted", "Drained"] {
        assert!(
            !node_events_for(&h.client, "d1", reason).await.is_empty(),
            "no {reason} event on the node"
        );
    }
    assert!(pods.get_opt("web").await.unwrap().is_none(), "pod evicted");
    assert!(h.vm_records().is_empty());
    assert!(h.nodes().get_opt("d1").await.unwrap().is_none());
}

#[tokio::test]
async fn an_orphan_vm_is_collected() {
    let h = Harness::new("orphan", json!({})).await;
    let _mc = h.spawn_controller("mc", &[]);
    h.create_machine("kept", "local").await;
    h.await_phase("kept", MachinePhase::Running, WAIT).await;

    // A VM started behind the controller's back, recorded for the class "local".
    let driver = LocalDriver::new(LocalDriverConfig {
        node_binary: node_binary(),
    });
    let class = h.classes().get("local").await.unwrap();
    let kubeconfig = h.kubeconfig();
    driver
        .create_machine(CreateMachineRequest {
            machine: mcm_api::Machine::new("stray", Default::default()),
            machine_class: class,
            secret: SecretData::from_pairs([("kubeconfig", kubeconfig.as_str())]),
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
        .await
        .unwrap();
    assert!(h.vm_alive("stray"));
    eventually(WAIT, "the orphan VM to be deleted", || async {
        let records = h.vm_records();
        if records.contains(&"stray".to_string()) {
            Err(records)
        } else {
            Ok(())
        }
    })
    .await;
    assert!(h.vm_alive("kept"), "a VM with a Machine is never collected");
    let _ = h.nodes().delete("stray", &DeleteParams::default()).await;
    h.delete_machine("kept").await;
    h.await_gone("kept", WAIT).await;
}
