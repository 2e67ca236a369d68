//! Checks of the generated CRDs and of the committed files in `deploy/crds`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use mcm_api::crds;
use pretty_assertions::assert_eq;
use serde_json::Value;

fn deploy_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

fn by_plural(plural: &str) -> CustomResourceDefinition {
    crds::all()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .unwrap_or_else(|| panic!("no CRD {plural}"))
}

fn schema(plural: &str) -> Value {
    let crd = by_plural(plural);
    serde_json::to_value(&crd.spec.versions[0].schema).expect("serializes")["openAPIV3Schema"]
        .clone()
}

/// Regenerates the committed files when `MCM_UPDATE_CRDS=1`, otherwise checks them.
#[test]
fn committed_crds_are_up_to_date() {
    let update = std::env::var("MCM_UPDATE_CRDS").is_ok_and(|v| v == "1");
    for crd in crds::all() {
        let path = deploy_dir().join(crds::file_name(&crd));
        let rendered = crds::render(&crd).expect("renders");
        if update {
            std::fs::create_dir_all(deploy_dir()).expect("create deploy/crds");
            std::fs::write(&path, &rendered).expect("write CRD");
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{} is missing ({e}); run `cargo xtask crds`",
                path.display()
            )
        });
        let committed: Value = serde_saphyr::from_str(&committed).expect("committed CRD parses");
        let generated: Value = serde_saphyr::from_str(&rendered).expect("generated CRD parses");
        assert!(
            committed == generated,
            "{} differs from the generated CRD; run `cargo xtask crds` (or MCM_UPDATE_CRDS=1 cargo test -p mcm-api --test crds)",
            path.display()
        );
    }
}

#[test]
fn names_and_short_names() {
    let names: Vec<(String, String, Vec<String>)> = crds::all()
        .into_iter()
        .map(|c| {
            (
                crds::file_name(&c),
                c.spec.names.kind.clone(),
                c.spec.names.short_names.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            (
                "machine.sapcloud.io_machines.yaml".into(),
                "Machine".into(),
                vec!["mc".into()]
            ),
            (
                "machine.sapcloud.io_machineclasses.yaml".into(),
                "MachineClass".into(),
                vec!["mcc".into()]
            ),
            (
                "machine.sapcloud.io_machinesets.yaml".into(),
                "MachineSet".into(),
                vec!["mcs".into()]
            ),
            (
                "machine.sapcloud.io_machinedeployments.yaml".into(),
                "MachineDeployment".into(),
                vec!["mcd".into()]
            ),
            (
                "policy.mcm-rs.io_machinedisruptionbudgets.yaml".into(),
                "MachineDisruptionBudget".into(),
                vec!["mdb".into()]
            ),
        ]
    );
    for crd in crds::all() {
        assert_eq!(crd.spec.scope, "Namespaced");
        // MCM's kinds keep MCM's group; mcm-rs's own kinds live in their own group.
        let group = if crd.spec.names.kind == "MachineDisruptionBudget" {
            "policy.mcm-rs.io"
        } else {
            "machine.sapcloud.io"
        };
        assert_eq!(crd.spec.group, group);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{}.{group}", crd.spec.names.plural).as_str())
        );
    }
}

#[test]
fn subresources() {
    for (plural, status, scale) in [
        ("machines", true, false),
        ("machineclasses", false, false),
        ("machinesets", true, true),
        ("machinedeployments", true, true),
    ] {
        let sub = by_plural(plural).spec.versions[0].subresources.clone();
        assert_eq!(
            sub.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            status,
            "{plural} status"
        );
        let sc = sub.and_then(|s| s.scale);
        assert_eq!(sc.is_some(), scale, "{plural} scale");
        if let Some(sc) = sc {
            assert_eq!(sc.spec_replicas_path, ".spec.replicas");
            assert_eq!(sc.status_replicas_path, ".status.replicas");
        }
    }
}

#[test]
fn printer_columns() {
    let cols = |plural: &str| -> Vec<(String, String)> {
        by_plural(plural).spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.json_path))
            .collect()
    };
    let machine = cols("machines");
    for want in [
        ("Status", ".status.currentStatus.phase"),
        ("Node", ".metadata.labels.node"),
        ("ProviderID", ".spec.providerID"),
        ("Age", ".metadata.creationTimestamp"),
    ] {
        assert!(
            machine.contains(&(want.0.into(), want.1.into())),
            "machine column {want:?}"
        );
    }
    for plural in ["machinesets", "machinedeployments"] {
        let c = cols(plural);
        for want in [
            ("Desired", ".spec.replicas"),
            ("Current", ".status.replicas"),
            ("Ready", ".status.readyReplicas"),
            ("Available", ".status.availableReplicas"),
            ("Age", ".metadata.creationTimestamp"),
        ] {
            assert!(
                c.contains(&(want.0.into(), want.1.into())),
                "{plural} column {want:?}"
            );
        }
    }
}

/// `kubectl get` prints the Go CRDs' columns at their positions: the default columns are
/// exactly Go's, in Go's order; Go's wide (`priority: 1`) columns follow in Go's order; ours
/// come last, wide only. A script that reads a column by position reads the same field from
/// either controller manager.
#[test]
fn printer_columns_are_the_go_crds_in_their_order() {
    let path = format!(
        "{}/tests/fixtures/upstream-printer-columns.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let upstream: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).unwrap();
    type Column = (String, String, String, i32);
    let ours = |plural: &str| -> Vec<Column> {
        by_plural(plural).spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.type_, c.json_path, c.priority.unwrap_or(0)))
            .collect()
    };
    let mut wrong = Vec::new();
    for (plural, columns) in upstream["columns"].as_object().expect("columns") {
        let go: Vec<Column> = columns
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["type"].as_str().unwrap().to_string(),
                    c["jsonPath"].as_str().unwrap().to_string(),
                    c["priority"].as_i64().unwrap() as i32,
                )
            })
            .collect();
        let ours = ours(plural);
        let default =
            |cs: &[Column]| -> Vec<Column> { cs.iter().filter(|c| c.3 == 0).cloned().collect() };
        if default(&ours) != default(&go) {
            wrong.push(format!(
                "{plural}: default columns {:?}, Go's {:?}",
                default(&ours),
                default(&go)
            ));
        }
        // Go's columns first, in Go's order (its wide ones after its default ones, as they
        // print); ours after all of them.
        let mut go_printed = default(&go);
        go_printed.extend(go.iter().filter(|c| c.3 != 0).cloned());
        if ours.len() < go_printed.len() || ours[..go_printed.len()] != go_printed[..] {
            wrong.push(format!(
                "{plural}: columns {ours:?} do not start with Go's {go_printed:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn provider_spec_preserves_unknown_fields() {
    let s = schema("machineclasses");
    let ps = &s["properties"]["providerSpec"];
    assert_eq!(ps["type"], "object");
    assert_eq!(ps["x-kubernetes-preserve-unknown-fields"], true);
    assert_eq!(s["required"], serde_json::json!(["providerSpec"]));
}

#[test]
fn cel_rules_present() {
    for plural in ["machinesets", "machinedeployments"] {
        let spec = &schema(plural)["properties"]["spec"];
        assert_eq!(
            spec["properties"]["replicas"]["minimum"].as_f64(),
            Some(0.0),
            "{plural}"
        );
        let rules = spec["x-kubernetes-validations"].as_array().expect("rules");
        assert!(
            rules
                .iter()
                .any(|r| r["message"] == crds::MESSAGE_SELECTOR_MATCHES_TEMPLATE
                    && r["rule"] == crds::RULE_SELECTOR_MATCHES_TEMPLATE),
            "{plural}"
        );
        assert!(
            rules.iter().any(
                |r| r["rule"] == crds::RULE_SELECTOR_NOT_EMPTY && r["fieldPath"] == ".selector"
            ),
            "{plural}"
        );
        assert_eq!(
            spec["properties"]["minReadySeconds"]["minimum"].as_f64(),
            Some(0.0),
            "{plural}"
        );
    }
    let md = schema("machinedeployments");
    let ru = &md["properties"]["spec"]["properties"]["strategy"]["properties"]["rollingUpdate"];
    assert_eq!(
        ru["x-kubernetes-validations"][0]["rule"],
        crds::RULE_ROLLING_UPDATE_NOT_BOTH_ZERO
    );
    assert_eq!(
        ru["x-kubernetes-validations"][1]["rule"],
        crds::RULE_MAX_UNAVAILABLE
    );
    assert_eq!(
        ru["x-kubernetes-validations"][2]["rule"],
        crds::RULE_MAX_SURGE
    );
    assert_eq!(
        ru["properties"]["maxSurge"]["x-kubernetes-int-or-string"],
        true
    );
    assert_eq!(
        ru["properties"]["maxUnavailable"]["x-kubernetes-int-or-string"],
        true
    );
}

/// Walks a schema and reports every violation of the structural-schema rules we rely on.
fn structural_violations(path: &str, s: &Value, out: &mut Vec<String>) {
    let Some(obj) = s.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for banned in [
        "$ref",
        "nullable",
        "default",
        "anyOf",
        "oneOf",
        "allOf",
        "$schema",
        "definitions",
        "$defs",
    ] {
        if obj.contains_key(banned) {
            out.push(format!("{path}: has {banned}"));
        }
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !obj.contains_key("type") && !int_or_string && !preserve {
        out.push(format!("{path}: no type"));
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        if obj.get("type").and_then(Value::as_str) != Some("object") {
            out.push(format!("{path}: properties without type object"));
        }
        for (k, v) in props {
            structural_violations(&format!("{path}.{k}"), v, out);
        }
    }
    if let Some(items) = obj.get("items") {
        structural_violations(&format!("{path}[]"), items, out);
    }
    match obj.get("additionalProperties") {
        Some(Value::Object(_)) => {
            structural_violations(&format!("{path}{{}}"), &obj["additionalProperties"], out);
            if obj.contains_key("properties") {
                out.push(format!("{path}: properties and additionalProperties"));
            }
        }
        Some(other) => out.push(format!("{path}: additionalProperties {other}")),
        None => {}
    }
}

#[test]
fn schemas_are_structural() {
    let mut violations = Vec::new();
    for crd in crds::all() {
        let s = schema(&crd.spec.names.plural);
        structural_violations(&crd.spec.names.plural, &s, &mut violations);
    }
    assert!(
        violations.is_empty(),
        "non-structural schema nodes:\n{}",
        violations.join("\n")
    );
}

#[test]
fn durations_and_quantities_have_the_right_schema() {
    let m = schema("machines");
    assert_eq!(
        m["properties"]["spec"]["properties"]["drainTimeout"]["type"],
        "string"
    );
    assert_eq!(
        m["properties"]["spec"]["properties"]["machinePreserveTimeout"]["type"],
        "string"
    );
    let c = schema("machineclasses");
    assert_eq!(
        c["properties"]["nodeTemplate"]["properties"]["capacity"]["additionalProperties"]["x-kubernetes-int-or-string"],
        true
    );
}

#[test]
fn the_disruption_budget_has_a_status_and_its_columns() {
    let crd = by_plural("machinedisruptionbudgets");
    let version = &crd.spec.versions[0];
    assert!(
        version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some() && s.scale.is_none())
    );
    let columns: Vec<&str> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Min-Available", "Max-Unavailable", "Allowed", "Age"]
    );
    let spec = &schema("machinedisruptionbudgets")["properties"]["spec"]["properties"];
    assert_eq!(spec["maxUnavailable"]["x-kubernetes-int-or-string"], true);
    assert_eq!(spec["minAvailable"]["x-kubernetes-int-or-string"], true);
    assert_eq!(
        spec["windows"]["items"]["required"],
        serde_json::json!(["schedule", "duration"])
    );
}
