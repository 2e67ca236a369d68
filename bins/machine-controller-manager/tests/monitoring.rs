//! The monitoring files of `deploy/monitoring`: the Grafana dashboard and the alert rules name
//! only metrics the binaries export (checked against the code that registers them, so a renamed
//! metric fails here), and the plain rules file and the PrometheusRule carry the same alerts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// How a metric is registered, which decides the names Prometheus scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Scraped under its registered name.
    Gauge,
    /// prometheus-client appends `_total`.
    Counter,
    /// Scraped as `_bucket`, `_sum` and `_count`.
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

const MACHINE: &str = "crates/reconcilers/src/machine/metrics.rs";
const RECONCILES: &str = "crates/reconcilers/src/metrics.rs";
const MANAGER: &str = "crates/reconcilers/src/manager/metrics.rs";
const DRIVER: &str = "crates/driver/src/instrumented.rs";
const CLIENTS: &str = "crates/core/src/clients.rs";

/// Every metric the two binaries export: the name as registered (a string literal in the
/// file), how it is registered, and the file (relative to the workspace root).
const EXPORTED: &[(&str, Kind, &str)] = &[
    // The machine controller.
    ("mcm_machine_controller_frozen", Gauge, MACHINE),
    ("mcm_machine_items_total", Gauge, MACHINE),
    ("mcm_machine_controller_tracked_entries", Gauge, MACHINE),
    ("mcm_machine_vm_creations", Counter, MACHINE),
    ("mcm_machine_vm_adoptions", Counter, MACHINE),
    ("mcm_machine_failed", Counter, MACHINE),
    ("mcm_machine_deletions", Counter, MACHINE),
    ("mcm_machine_drain_blocked_by_pdb", Counter, MACHINE),
    ("mcm_machine_zone_partition_held_machines", Gauge, MACHINE),
    ("mcm_machine_lifecycle_hook_waits", Counter, MACHINE),
    ("mcm_machine_remediation_held", Counter, MACHINE),
    ("mcm_machine_create_duration_seconds", Gauge, MACHINE),
    ("mcm_machine_initialize_duration_seconds", Gauge, MACHINE),
    ("mcm_machine_join_duration_seconds", Gauge, MACHINE),
    ("mcm_machine_delete_duration_seconds", Gauge, MACHINE),
    ("mcm_machine_drain_duration_seconds", Gauge, MACHINE),
    // A gauge by design (a counter would get `_total`).
    ("mcm_machine_num_failed_join", Gauge, MACHINE),
    (
        "mcm_machine_controller_apiservers_reachable_timestamp_seconds",
        Gauge,
        MACHINE,
    ),
    // Every controller.
    (
        "mcm_controller_reconcile_duration_seconds",
        Histogram,
        RECONCILES,
    ),
    ("mcm_controller_reconcile_errors", Counter, RECONCILES),
    (
        "mcm_controller_reconcile_longest_seconds",
        Gauge,
        RECONCILES,
    ),
    // The driver.
    (
        "mcm_cloud_api_driver_request_duration_seconds",
        Histogram,
        DRIVER,
    ),
    ("mcm_cloud_api_driver_requests_failed", Counter, DRIVER),
    // The Kubernetes clients.
    ("mcm_kube_client_requests", Counter, CLIENTS),
    // The manager's store metrics (gauges encoded at scrape time).
    ("mcm_machineset_items_total", Gauge, MANAGER),
    ("mcm_machine_set_info", Gauge, MANAGER),
    ("mcm_machine_set_info_spec_replicas", Gauge, MANAGER),
    (
        "mcm_machine_set_info_spec_min_ready_seconds",
        Gauge,
        MANAGER,
    ),
    ("mcm_machine_set_status_availabla_replicas", Gauge, MANAGER),
    (
        "mcm_machine_set_status_fully_labelled_replicas",
        Gauge,
        MANAGER,
    ),
    ("mcm_machine_set_status_ready_replicas", Gauge, MANAGER),
    ("mcm_machine_set_status_replicas", Gauge, MANAGER),
    ("mcm_machine_set_status_condition", Gauge, MANAGER),
    ("mcm_machine_set_failed_machines", Gauge, MANAGER),
    ("mcm_machinedeployment_items_total", Gauge, MANAGER),
    ("mcm_machine_deployment_info", Gauge, MANAGER),
    ("mcm_machine_deployment_info_spec_paused", Gauge, MANAGER),
    ("mcm_machine_deployment_info_spec_replicas", Gauge, MANAGER),
    (
        "mcm_machine_deployment_info_spec_min_ready_seconds",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_info_spec_rolling_update_max_surge",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_info_spec_rolling_update_max_unavailable",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_info_spec_revision_history_limit",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_info_spec_rollback_to_revision",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_info_spec_progress_deadline_seconds",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_status_available_replicas",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_status_unavailable_replicas",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_status_ready_replicas",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_status_updated_replicas",
        Gauge,
        MANAGER,
    ),
    (
        "mcm_machine_deployment_status_collision_count",
        Gauge,
        MANAGER,
    ),
    ("mcm_machine_deployment_status_replicas", Gauge, MANAGER),
    ("mcm_machine_deployment_status_condition", Gauge, MANAGER),
    ("mcm_machine_deployment_failed_machines", Gauge, MANAGER),
    (
        "mcm_machine_deployment_effective_creation_timeout_seconds",
        Gauge,
        MANAGER,
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
}

/// Every `mcm_...` metric name in a PromQL expression (or a Grafana variable query).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("mcm_") {
        let starts_word = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_name_char(c)).unwrap_or(tail.len());
        if starts_word {
            names.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The metric names as string literals (`"mcm_..."`) in a source file.
fn literal_names(source: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find("\"mcm_") {
        let tail = &rest[at + 1..];
        let end = tail.find(|c: char| !is_name_char(c)).unwrap_or(tail.len());
        if tail[end..].starts_with('"') {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The series names Prometheus scrapes for the exported metrics, each with the metric it
/// belongs to.
fn scraped() -> BTreeMap<String, &'static str> {
    let mut names = BTreeMap::new();
    for &(name, kind, _) in EXPORTED {
        let suffixes: &[&str] = match kind {
            Gauge => &[""],
            Counter => &["_total"],
            Histogram => &["_bucket", "_sum", "_count"],
        };
        for suffix in suffixes {
            names.insert(format!("{name}{suffix}"), name);
        }
    }
    names
}

fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/monitoring/dashboard.json")).expect("dashboard.json parses")
}

fn yaml(relative: &str) -> Value {
    serde_saphyr::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The panels of the dashboard, those nested in collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            all.extend(nested);
        }
    }
    all
}

/// `(where, expression)` of every panel target and query variable of the dashboard.
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target has an expr");
            exprs.push((format!("panel {title:?}"), expr.to_string()));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if var["type"] == "query" {
            let name = var["name"].as_str().unwrap_or_default();
            let query = var["query"]["query"].as_str().or(var["query"].as_str());
            exprs.push((
                format!("variable {name}"),
                query.expect("a query variable has a query").to_string(),
            ));
        }
    }
    exprs
}

/// The rules of a `groups:` list.
fn rules(groups: &Value) -> Vec<&Value> {
    groups
        .as_array()
        .expect("groups is a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a group has rules"))
        .collect()
}

/// `(alert, expr)` of every alerting rule.
fn alerts(groups: &Value) -> Vec<(String, String)> {
    rules(groups)
        .into_iter()
        .map(|r| {
            let alert = r["alert"].as_str().expect("an alerting rule").to_string();
            let expr = r["expr"].as_str().expect("a rule has an expr");
            (alert, expr.trim().to_string())
        })
        .collect()
}

fn alerts_file() -> Value {
    yaml("deploy/monitoring/alerts.yaml")
}

fn prometheus_rule() -> Value {
    yaml("deploy/monitoring/prometheusrule.yaml")
}

#[test]
fn the_exported_metrics_are_registered_in_the_code_under_these_names() {
    let mut in_sources: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for file in [MACHINE, RECONCILES, MANAGER, DRIVER, CLIENTS] {
        in_sources.insert(file, literal_names(&read(file)));
    }
    for &(name, _, file) in EXPORTED {
        assert!(
            in_sources[file].contains(name),
            "{name} is not registered in {file}: renamed? update EXPORTED and deploy/monitoring"
        );
    }
    // The other way round: a new metric is listed here (and so may be used on the dashboard).
    let listed: BTreeSet<&str> = EXPORTED.iter().map(|(n, _, _)| *n).collect();
    for (file, names) in &in_sources {
        for name in names {
            assert!(
                listed.contains(name.as_str()),
                "{file} registers {name}, which EXPORTED does not list"
            );
        }
    }
    // The counters' and histograms' scraped names are what docs/operations.md tells.
    let docs = read("docs/operations.md");
    for name in [
        "mcm_cloud_api_driver_request_duration_seconds",
        "mcm_cloud_api_driver_requests_failed_total",
        "mcm_machine_controller_frozen",
        "mcm_machine_items_total",
        "mcm_controller_reconcile_duration_seconds",
        "mcm_controller_reconcile_errors_total",
        "mcm_controller_reconcile_longest_seconds",
    ] {
        assert!(
            scraped().contains_key(name) || listed.contains(name),
            "{name}"
        );
        assert!(
            docs.contains(name),
            "docs/operations.md does not name {name}"
        );
    }
}

#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let dashboard = dashboard();
    let scraped = scraped();
    let exprs = dashboard_exprs(&dashboard);
    assert!(exprs.len() > 20, "{} expressions", exprs.len());
    let mut used = BTreeSet::new();
    for (place, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{place}: no mcm metric in {expr}");
        for name in names {
            assert!(
                scraped.contains_key(&name),
                "{place}: {name} is not a series the binaries export ({expr})"
            );
            used.insert(scraped[&name]);
        }
    }
    // What the dashboard is for.
    for name in [
        "mcm_machine_items_total",
        "mcm_machine_set_failed_machines",
        "mcm_machine_deployment_failed_machines",
        "mcm_machine_deployment_status_updated_replicas",
        "mcm_machine_deployment_status_available_replicas",
        "mcm_machine_deployment_status_unavailable_replicas",
        "mcm_controller_reconcile_duration_seconds",
        "mcm_controller_reconcile_errors",
        "mcm_controller_reconcile_longest_seconds",
        "mcm_machine_controller_frozen",
        "mcm_cloud_api_driver_request_duration_seconds",
        "mcm_cloud_api_driver_requests_failed",
        "mcm_kube_client_requests",
        "mcm_machine_create_duration_seconds",
        "mcm_machine_join_duration_seconds",
        "mcm_machine_drain_duration_seconds",
        "mcm_machine_delete_duration_seconds",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_with_its_rows_and_variables() {
    let dashboard = dashboard();
    let schema = dashboard["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let vars = dashboard["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    assert_eq!(var("namespace")["type"], "query");

    let all = panels(&dashboard);
    let rows: Vec<&str> = all
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        rows,
        [
            "Machines",
            "Rollouts",
            "Controller health",
            "Cloud API",
            "Kubernetes API",
            "Machine durations"
        ]
    );
    let mut ids = BTreeSet::new();
    for panel in &all {
        let id = panel["id"].as_u64().expect("a panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().unwrap();
            assert!(
                expr.contains("namespace=~\"$namespace\""),
                "{title}: not filtered by $namespace: {expr}"
            );
        }
    }
}

#[test]
fn the_alerts_use_only_exported_metrics_and_are_complete() {
    let file = alerts_file();
    let scraped = scraped();
    let all = rules(&file["groups"]);
    for rule in &all {
        let alert = rule["alert"].as_str().expect("only alerting rules");
        let expr = rule["expr"].as_str().unwrap();
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{alert}: no mcm metric");
        for name in names {
            assert!(
                scraped.contains_key(&name),
                "{alert}: {name} is not a series the binaries export ({expr})"
            );
        }
        assert!(rule["for"].as_str().is_some(), "{alert}: no `for`");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{alert}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            let text = rule["annotations"][key].as_str().unwrap_or_default();
            assert!(!text.trim().is_empty(), "{alert}: no {key}");
        }
    }
    let expr_of = |alert: &str| {
        let rule = all
            .iter()
            .find(|r| r["alert"] == alert)
            .unwrap_or_else(|| panic!("no alert {alert}"));
        (
            rule["expr"].as_str().unwrap().to_string(),
            rule["for"].as_str().unwrap().to_string(),
        )
    };
    let watched = [
        (
            "MCMMachineControllerFrozen",
            "mcm_machine_controller_frozen",
        ),
        (
            "MCMMachinesFailed",
            "mcm_machine_deployment_failed_machines",
        ),
        (
            "MCMMachineDeletionNotProgressing",
            "mcm_machine_set_status_replicas",
        ),
        (
            "MCMCloudAPIErrors",
            "mcm_cloud_api_driver_requests_failed_total",
        ),
        (
            "MCMReconcileErrors",
            "mcm_controller_reconcile_errors_total",
        ),
        (
            "MCMRolloutStuck",
            "mcm_machine_deployment_status_unavailable_replicas",
        ),
        (
            "MCMMachineControllerNotReconciling",
            "mcm_controller_reconcile_duration_seconds_count",
        ),
        (
            "MCMManagerNotReconciling",
            "mcm_controller_reconcile_duration_seconds_count",
        ),
    ];
    for (alert, metric) in watched {
        let (expr, _) = expr_of(alert);
        assert!(metric_names(&expr).iter().any(|n| n == metric), "{alert}");
    }
    assert_eq!(expr_of("MCMMachineControllerFrozen").1, "5m");
    assert_eq!(expr_of("MCMMachinesFailed").1, "15m");
    assert_eq!(expr_of("MCMRolloutStuck").1, "30m");
    assert!(
        expr_of("MCMCloudAPIErrors")
            .0
            .contains("by (namespace, provider, operation, error_code)")
    );
}

#[test]
fn the_prometheus_rule_carries_the_alerts_of_the_rules_file() {
    let file = alerts_file();
    let object = prometheus_rule();
    assert_eq!(object["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(object["kind"], "PrometheusRule");
    assert!(object["metadata"]["name"].as_str().is_some());
    let plain = alerts(&file["groups"]);
    let wrapped = alerts(&object["spec"]["groups"]);
    assert!(!plain.is_empty());
    assert_eq!(plain, wrapped, "alert names and exprs differ");
    let names: BTreeSet<&String> = plain.iter().map(|(a, _)| a).collect();
    assert_eq!(names.len(), plain.len(), "an alert name twice");
    // Everything else too: `for`, labels, annotations, group names.
    assert_eq!(file["groups"], object["spec"]["groups"]);
}

#[test]
fn metric_names_are_found_in_expressions() {
    assert_eq!(
        metric_names("sum by (le) (rate(mcm_a_bucket{x=\"y\"}[5m])) / on () xmcm_b + mcm_c_total"),
        ["mcm_a_bucket", "mcm_c_total"]
    );
    assert_eq!(
        literal_names("(\"mcm_a\", \"x\"), \"mcm_b_total{x}\", \"mcm_c\""),
        BTreeSet::from(["mcm_a".to_string(), "mcm_c".to_string()])
    );
}
