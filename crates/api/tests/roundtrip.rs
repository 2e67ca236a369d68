//! Serde round trips of the MCM-style examples (seed 001) and of unknown providerSpec keys.

use mcm_api::{Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet};
use pretty_assertions::assert_eq;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// `null` means "absent" in Kubernetes JSON (Go writes `creationTimestamp: null` for zero
/// times); the typed model drops such keys, so they are removed from the expectation too.
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(yaml: &str) -> (Value, T) {
    let mut input: Value = serde_saphyr::from_str(yaml).expect("fixture is valid YAML");
    let typed: T =
        serde_json::from_value(input.clone()).expect("deserializes into the typed model");
    let output = serde_json::to_value(&typed).expect("serializes");
    strip_nulls(&mut input);
    assert_eq!(output, input, "round trip must neither lose nor add fields");
    // YAML text in, typed value, YAML text out, parsed again: same value.
    let yaml_out = serde_saphyr::to_string(&typed).expect("serializes to YAML");
    let reparsed: Value = serde_saphyr::from_str(&yaml_out).expect("our YAML parses");
    assert_eq!(reparsed, input);
    (input, typed)
}

#[test]
fn aws_machine_class_round_trips() {
    let (_, class) = round_trip::<MachineClass>(&fixture("aws-machineclass.yaml"));
    assert_eq!(class.provider.as_deref(), Some("AWS"));
    let template = class.node_template.expect("node template");
    assert_eq!(template.instance_type, "p2.xlarge");
    assert_eq!(template.capacity["memory"].0, "61Gi");
    assert_eq!(class.provider_spec["machineType"], "p2.xlarge");
}

#[test]
fn aws_machine_set_round_trips() {
    let (_, set) = round_trip::<MachineSet>(&fixture("aws-machineset.yaml"));
    assert_eq!(set.spec.replicas(), 1);
    assert_eq!(set.spec.min_ready_seconds, Some(500));
    let class = set
        .spec
        .template
        .and_then(|t| t.spec)
        .and_then(|s| s.class)
        .and_then(|c| c.name);
    assert_eq!(
        class.as_deref(),
        Some("shoot--i034796--tre-worker-q3rb4-z1-30c4a")
    );
}

#[test]
fn aws_machine_deployment_round_trips() {
    let (_, md) = round_trip::<MachineDeployment>(&fixture("aws-machinedeployment.yaml"));
    let rolling = md
        .spec
        .strategy
        .and_then(|s| s.rolling_update)
        .expect("rolling update");
    let (surge, unavailable) = mcm_api::intstr::resolve_fenceposts(
        rolling.update_configuration.max_surge.as_ref(),
        rolling.update_configuration.max_unavailable.as_ref(),
        md.spec.replicas.unwrap_or_default(),
    )
    .expect("valid fenceposts");
    assert_eq!((surge, unavailable), (1, 0));
}

#[test]
fn unknown_provider_spec_keys_survive() {
    let json = serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": {"name": "c", "namespace": "default"},
        "provider": "local",
        "providerSpec": {
            "someFutureField": {"nested": [1, 2, {"deep": true}]},
            "bootDelay": "5s",
            "weird key/with.dots": null
        }
    });
    let class: MachineClass = serde_json::from_value(json.clone()).expect("deserializes");
    assert_eq!(serde_json::to_value(&class).expect("serializes"), json);
}

#[test]
fn full_machine_round_trips_with_new_fields() {
    let json = serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": "m", "namespace": "default", "labels": {"node": "n1"}},
        "spec": {
            "class": {"apiGroup": "machine.sapcloud.io", "kind": "MachineClass", "name": "c"},
            "providerID": "local:///m",
            "nodeTemplate": {"metadata": {"labels": {"a": "b"}}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
            "drainTimeout": "2h0m0s",
            "healthTimeout": "10m0s",
            "creationTimeout": "20m0s",
            "inPlaceUpdateTimeout": "15m0s",
            "machinePreserveTimeout": "72h0m0s",
            "disableHealthTimeout": false,
            "maxEvictRetries": 10,
            "nodeConditions": "KernelDeadlock,ReadonlyFilesystem"
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "currentStatus": {
                "phase": "InPlaceUpdating",
                "timeoutActive": true,
                "lastUpdateTime": "2024-01-01T00:00:00Z",
                "preserveExpiryTime": "2024-01-04T00:00:00Z"
            },
            "lastOperation": {
                "description": "Creating machine",
                "errorCode": "ResourceExhausted",
                "lastUpdateTime": "2024-01-01T00:00:00Z",
                "state": "Failed",
                "type": "Create"
            },
            "lastKnownState": "opaque"
        }
    });
    let machine: Machine = serde_json::from_value(json.clone()).expect("deserializes");
    assert_eq!(machine.phase(), Some(&MachinePhase::InPlaceUpdating));
    assert_eq!(
        machine
            .spec
            .configuration
            .drain_timeout
            .map(|d| d.as_duration()),
        Some(std::time::Duration::from_secs(7200))
    );
    assert_eq!(
        machine.spec.configuration.node_condition_types(),
        vec!["KernelDeadlock", "ReadonlyFilesystem"]
    );
    assert_eq!(serde_json::to_value(&machine).expect("serializes"), json);
}

#[test]
fn unknown_enum_values_do_not_break_objects() {
    let json = serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": {"name": "d"},
        "spec": {
            "template": {},
            "strategy": {"type": "BlueGreen", "inPlaceUpdate": {"maxSurge": "10%", "maxUnavailable": 0, "orchestrationType": "Manual"}}
        },
        "status": {"conditions": [{"type": "SomethingNew", "status": "Maybe"}], "preservedFailedReplicas": 1}
    });
    let md: MachineDeployment = serde_json::from_value(json.clone()).expect("deserializes");
    assert_eq!(serde_json::to_value(&md).expect("serializes"), json);
}

#[test]
fn defaults_carry_api_version_and_kind() {
    let m = Machine::new("m", Default::default());
    let v = serde_json::to_value(&m).expect("serializes");
    assert_eq!(v["apiVersion"], "machine.sapcloud.io/v1alpha1");
    assert_eq!(v["kind"], "Machine");
    let set: MachineSet = serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}}))
        .expect("apiVersion/kind are optional on input");
    assert_eq!(set.kind, "MachineSet");
}
