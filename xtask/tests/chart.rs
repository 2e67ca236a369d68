//! The Helm chart in `deploy/chart` against a real kube-apiserver: for every provider and both
//! container layouts (and cert-manager mode), the chart is rendered with `helm template` and
//! every rendered object is applied: the CRDs for real (and they must become Established),
//! everything else with server-side apply and `dryRun=All`, so the API server validates each
//! object in full without keeping it. Then the pieces that matter are checked: the webhook
//! configuration, the containers' arguments (parsed with the binaries' own options), the
//! RBAC and the monitoring objects.
//!
//! `helm` comes from `mcm_testenv::binaries::helm_binary` (`$HELM`, or the build of `cargo
//! xtask chart`, which `cargo xtask test` makes sure of); without it the tests fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{ApiResource, Scope, pinned_kind};
use kube::runtime::wait::{await_condition, conditions};
use mcm_core::clap::Parser;
use mcm_core::options::{MachineControllerOptions, ManagerOptions};
use mcm_testenv::kit::{eventually, within};
use mcm_testenv::{ControlPlane, Options};
use serde_json::{Value, json};
use tokio::sync::Mutex;

const FIELD_MANAGER: &str = "mcm-rs-chart-test";
const RELEASE: &str = "mcm-rs";
const PROVIDERS: [&str; 4] = ["local", "aws", "gcp", "azure"];
const WEBHOOK_RESOURCES: [&str; 4] = [
    "machineclasses",
    "machines",
    "machinesets",
    "machinedeployments",
];
const WAIT: Duration = Duration::from_secs(60);

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// One control plane for this test process, started without the project's CRDs: the chart's
/// own CRDs install them.
async fn plane() -> Arc<ControlPlane> {
    static PLANE: Mutex<Option<Arc<ControlPlane>>> = Mutex::const_new(None);
    let mut slot = PLANE.lock().await;
    if let Some(p) = slot.as_ref() {
        return p.clone();
    }
    let p = Arc::new(
        ControlPlane::start(Options {
            install_crds: false,
            ..Options::default()
        })
        .await
        .unwrap_or_else(|e| panic!("the test control plane: {e}")),
    );
    *slot = Some(p.clone());
    p
}

/// The rendered manifests of the chart (CRDs included) as release `mcm-rs` in `namespace`.
fn render(namespace: &str, set: &[&str]) -> Vec<Value> {
    let helm = mcm_testenv::binaries::helm_binary().unwrap_or_else(|e| panic!("{e}"));
    let chart = workspace_root().join("deploy").join("chart");
    let mut cmd = Command::new(&helm);
    cmd.args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", namespace, "--include-crds"]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
    assert!(
        out.status.success(),
        "helm template {set:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout))
        .expect("the rendered manifests are YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// What `helm template` says when rendering fails.
fn render_error(set: &[&str]) -> String {
    let helm = mcm_testenv::binaries::helm_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(&helm)
        .args(["template", RELEASE])
        .arg(workspace_root().join("deploy").join("chart"))
        .args(set.iter().flat_map(|s| ["--set", s]))
        .output()
        .expect("running helm");
    assert!(!out.status.success(), "helm template {set:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Minimal CRDs of the kinds the chart renders from other projects (cert-manager's Issuer and
/// Certificate, the Prometheus Operator's ServiceMonitor and PrometheusRule): the right
/// group, kind, version and scope, with `x-kubernetes-preserve-unknown-fields`, so that the
/// API server accepts the objects without their real schemas. The real CRDs are theirs to
/// install; these only let the dry-run apply reach those kinds.
fn foreign_crds() -> Vec<CustomResourceDefinition> {
    [
        ("cert-manager.io", "Issuer", "issuers"),
        ("cert-manager.io", "Certificate", "certificates"),
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ]
    .into_iter()
    .map(|(group, kind, plural)| {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "names": {
                    "kind": kind,
                    "listKind": format!("{kind}List"),
                    "plural": plural,
                    "singular": kind.to_lowercase(),
                },
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                    }},
                }],
            },
        }))
        .expect("a CRD")
    })
    .collect()
}

/// Applies CRDs for real and waits until they are Established.
async fn install_crds(client: &kube::Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().expect("a CRD name");
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    }
    for crd in crds {
        let name = crd.metadata.name.clone().expect("a CRD name");
        within(
            WAIT,
            &format!("CRD {name} to be Established"),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|e| panic!("watching CRD {name}: {e}"));
    }
}

fn gvk_of(doc: &Value) -> GroupVersionKind {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().expect("metadata.name")
}

/// Applies every rendered object: the CRDs for real, the rest with `dryRun=All`. Namespaced
/// objects must name their namespace (helm template does not add it), cluster-scoped ones
/// must not.
async fn apply_rendered(client: &kube::Client, docs: &[Value]) {
    let crds: Vec<CustomResourceDefinition> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| serde_json::from_value(d.clone()).expect("a rendered CRD"))
        .collect();
    assert_eq!(
        crds.len(),
        5,
        "the chart carries the four machine CRDs and the MachineDisruptionBudget CRD"
    );
    install_crds(client, &crds).await;

    let mut resources: BTreeMap<String, (ApiResource, Scope)> = BTreeMap::new();
    let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
    for doc in docs
        .iter()
        .filter(|d| d["kind"] != "CustomResourceDefinition")
    {
        let gvk = gvk_of(doc);
        let key = format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind);
        if !resources.contains_key(&key) {
            // A kind whose CRD was just established may take a moment to appear in discovery.
            let found = eventually(WAIT, &format!("discovery of {key}"), || {
                let gvk = gvk.clone();
                async move { pinned_kind(client, &gvk).await.map(Some) }
            })
            .await;
            resources.insert(key.clone(), (found.0, found.1.scope));
        }
        let (resource, scope) = &resources[&key];
        let name = name_of(doc);
        let namespace = doc["metadata"]["namespace"].as_str();
        let api: Api<DynamicObject> = match scope {
            Scope::Namespaced => {
                let ns = namespace.unwrap_or_else(|| panic!("{key} {name} names no namespace"));
                Api::namespaced_with(client.clone(), ns, resource)
            }
            Scope::Cluster => {
                assert!(
                    namespace.is_none(),
                    "cluster-scoped {key} {name} has a namespace"
                );
                Api::all_with(client.clone(), resource)
            }
        };
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
        api.patch(name, &params, &Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| panic!("dry-run apply of {key} {name}: {e}\n{doc:#}"));
    }
}

/// The one rendered object of `kind` named `name`.
fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && name_of(d) == name)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name}");
    found[0]
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// What one rendering is expected to be.
struct Expect<'a> {
    namespace: &'a str,
    provider: &'a str,
    two_containers: bool,
    cert_manager: bool,
    failure_policy: &'a str,
}

/// The checks of a rendering with the webhook on and the control cluster as target.
fn check(docs: &[Value], e: &Expect) {
    let full = RELEASE;
    let cluster_name = format!("{full}-{}", e.namespace);
    let webhook_service = format!("{full}-webhook");

    // The webhook configuration covers the four kinds, for CREATE and UPDATE, in the machine
    // namespace, through the chart's Service.
    let vwc = object(docs, "ValidatingWebhookConfiguration", &cluster_name);
    let hooks = vwc["webhooks"].as_array().expect("webhooks");
    assert_eq!(hooks.len(), 1);
    let hook = &hooks[0];
    assert_eq!(hook["failurePolicy"], e.failure_policy);
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(strings(&hook["admissionReviewVersions"]), ["v1"]);
    assert!(
        hook["timeoutSeconds"]
            .as_i64()
            .is_some_and(|t| (1..=30).contains(&t))
    );
    assert_eq!(
        hook["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        e.namespace
    );
    let rules = hook["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(strings(&rule["apiGroups"]), ["machine.sapcloud.io"]);
    assert_eq!(strings(&rule["apiVersions"]), ["v1alpha1"]);
    assert_eq!(
        strings(&rule["operations"])
            .into_iter()
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["CREATE".to_string(), "UPDATE".to_string()])
    );
    assert_eq!(
        strings(&rule["resources"])
            .into_iter()
            .collect::<BTreeSet<_>>(),
        WEBHOOK_RESOURCES.iter().map(|r| r.to_string()).collect()
    );
    let svc_ref = &hook["clientConfig"]["service"];
    assert_eq!(svc_ref["name"], webhook_service.as_str());
    assert_eq!(svc_ref["namespace"], e.namespace);
    assert_eq!(svc_ref["path"], "/validate");
    let svc = object(docs, "Service", &webhook_service);
    assert_eq!(svc["spec"]["ports"][0]["port"], svc_ref["port"]);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");

    // The containers: images, --controllers per layout, the webhook flags on the provider
    // container only, and every argument accepted by the binary's own options.
    let deployment = object(docs, "Deployment", full);
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), if e.two_containers { 2 } else { 1 });
    let provider = containers
        .iter()
        .find(|c| c["name"] == format!("machine-controller-{}", e.provider).as_str())
        .expect("the provider container");
    assert!(
        provider["image"]
            .as_str()
            .expect("image")
            .starts_with(&format!("machine-controller-{}:", e.provider))
    );
    let args = strings(&provider["args"]);
    let binary = format!("machine-controller-{}", e.provider);
    let parsed = MachineControllerOptions::try_parse_from(
        std::iter::once(binary.clone()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|err| panic!("{binary} rejects the chart's arguments {args:?}: {err}"));
    let controllers = if e.two_containers {
        vec!["machine"]
    } else {
        vec!["machine", "manager"]
    };
    assert_eq!(parsed.controllers, controllers);
    assert_eq!(parsed.common.namespace, e.namespace);
    assert_eq!(parsed.common.target_kubeconfig, "inClusterConfig");
    assert!(parsed.common.leader_elect);
    assert!(
        args.contains(&"--webhook-port=9443".to_string()),
        "{args:?}"
    );
    let ports = provider["ports"].as_array().expect("ports");
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "webhook" && p["containerPort"] == 9443)
    );
    let has_flag = |flag: &str| args.iter().any(|a| a.starts_with(&format!("{flag}=")));
    if e.cert_manager {
        let dir = "/var/run/secrets/mcm-rs/webhook";
        assert!(
            args.contains(&format!("--webhook-cert-dir={dir}")),
            "{args:?}"
        );
        assert!(!has_flag("--webhook-configuration-name"), "{args:?}");
        let mount = provider["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["mountPath"] == dir)
            .expect("the certificate is mounted");
        let volume = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("the certificate's volume");
        let secret = volume["secret"]["secretName"].as_str().expect("a Secret");
        let cert = of_kind(docs, "Certificate");
        assert_eq!(cert.len(), 1);
        let cert = cert[0];
        assert_eq!(cert["spec"]["secretName"], secret);
        assert!(
            strings(&cert["spec"]["dnsNames"])
                .contains(&format!("{webhook_service}.{}.svc", e.namespace))
        );
        assert_eq!(
            vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{}/{}", e.namespace, name_of(cert)).as_str()
        );
        let issuer = object(
            docs,
            "Issuer",
            cert["spec"]["issuerRef"]["name"].as_str().unwrap(),
        );
        assert!(issuer["spec"]["selfSigned"].is_object());
    } else {
        for (flag, value) in [
            ("--webhook-service-name", webhook_service.as_str()),
            ("--webhook-service-namespace", e.namespace),
            ("--webhook-configuration-name", cluster_name.as_str()),
        ] {
            assert!(
                args.contains(&format!("{flag}={value}")),
                "{flag}: {args:?}"
            );
        }
        assert!(!has_flag("--webhook-cert-dir"), "{args:?}");
        assert!(of_kind(docs, "Certificate").is_empty());
        assert!(vwc["metadata"]["annotations"].is_null());
    }
    if e.two_containers {
        let manager = containers
            .iter()
            .find(|c| c["name"] == "machine-controller-manager")
            .expect("the manager container");
        assert!(
            manager["image"]
                .as_str()
                .expect("image")
                .starts_with("machine-controller-manager:")
        );
        let margs = strings(&manager["args"]);
        assert!(
            !margs.iter().any(|a| a.starts_with("--controllers")),
            "{margs:?}"
        );
        assert!(
            !margs.iter().any(|a| a.starts_with("--webhook")),
            "{margs:?}"
        );
        let parsed = ManagerOptions::try_parse_from(
            std::iter::once("machine-controller-manager".to_string()).chain(margs.iter().cloned()),
        )
        .unwrap_or_else(|err| panic!("the manager rejects {margs:?}: {err}"));
        assert_eq!(parsed.port, 10258);
        assert_eq!(parsed.common.namespace, e.namespace);
    }

    // The pods run as non-root on a read-only root file system without capabilities.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    }

    // RBAC: no wildcard anywhere; cluster-wide only what is cluster-scoped; the webhook
    // configuration only by name, and only when the binary patches it.
    check_no_wildcards(docs);
    let cluster_role = object(docs, "ClusterRole", &cluster_name);
    let cluster_rules = cluster_role["rules"].as_array().expect("rules");
    let webhook_rule = cluster_rules
        .iter()
        .find(|r| strings(&r["resources"]).contains(&"validatingwebhookconfigurations".into()));
    if e.cert_manager {
        assert!(
            webhook_rule.is_none(),
            "cert-manager mode patches no webhook configuration"
        );
    } else {
        let rule = webhook_rule.expect("the caBundle patch permission");
        assert_eq!(strings(&rule["resourceNames"]), [cluster_name.as_str()]);
        assert_eq!(strings(&rule["verbs"]), ["get", "patch"]);
    }
    for rule in cluster_rules {
        for resource in strings(&rule["resources"]) {
            assert!(
                [
                    "nodes",
                    "nodes/status",
                    "pods",
                    "pods/eviction",
                    "poddisruptionbudgets",
                    "persistentvolumeclaims",
                    "persistentvolumes",
                    "volumeattachments",
                    "validatingwebhookconfigurations",
                ]
                .contains(&resource.as_str()),
                "the ClusterRole grants {resource}"
            );
        }
    }
    let role = object(docs, "Role", full);
    assert_eq!(role["metadata"]["namespace"], e.namespace);
    let machine_resources: BTreeSet<String> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| strings(&r["apiGroups"]) == ["machine.sapcloud.io"])
        .flat_map(|r| strings(&r["resources"]))
        .collect();
    for r in WEBHOOK_RESOURCES {
        assert!(machine_resources.contains(r), "the Role grants {r}");
    }
    for r in [
        "machines/status",
        "machinesets/status",
        "machinedeployments/status",
    ] {
        assert!(machine_resources.contains(r), "the Role grants {r}");
    }
    // MachineDisruptionBudgets: watched, and their status merge-patched, by the manager
    // (nothing reads one by name or replaces its status: the chart scenario's audit check).
    let budget_rules: Vec<(Vec<String>, Vec<String>)> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| strings(&r["apiGroups"]) == ["policy.mcm-rs.io"])
        .map(|r| (strings(&r["resources"]), strings(&r["verbs"])))
        .collect();
    for (resource, verbs) in [
        ("machinedisruptionbudgets", &["list", "watch"][..]),
        ("machinedisruptionbudgets/status", &["patch"][..]),
    ] {
        assert!(
            budget_rules
                .iter()
                .any(|(rs, vs)| rs.iter().any(|r| r == resource)
                    && verbs.iter().all(|v| vs.iter().any(|x| x == v))),
            "the Role grants {verbs:?} on {resource}"
        );
    }

    // Metrics and monitoring.
    let metrics = object(docs, "Service", &format!("{full}-metrics"));
    let mut metric_ports: Vec<i64> = metrics["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| p["port"].as_i64().expect("a port"))
        .collect();
    metric_ports.sort();
    let want: Vec<i64> = if e.two_containers {
        vec![10258, 10259]
    } else {
        vec![10259]
    };
    assert_eq!(metric_ports, want);
    let monitor = object(docs, "ServiceMonitor", full);
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("a selector")
    {
        assert_eq!(
            &metrics["metadata"]["labels"][k], v,
            "the ServiceMonitor selects {k}"
        );
    }
    assert_eq!(
        monitor["spec"]["endpoints"]
            .as_array()
            .expect("endpoints")
            .len(),
        want.len()
    );
    let dashboard = object(docs, "ConfigMap", &format!("{full}-dashboard"));
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("deploy/monitoring/dashboard.json"))
            .expect("the dashboard"),
    )
    .expect("dashboard JSON");
    let in_chart: Value = serde_json::from_str(
        dashboard["data"]["mcm-rs.json"]
            .as_str()
            .expect("the dashboard data"),
    )
    .expect("the ConfigMap holds JSON");
    assert_eq!(in_chart, shipped);
    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(workspace_root().join("deploy/monitoring/alerts.yaml"))
            .expect("the alert rules"),
    )
    .expect("alert rules YAML");
    let prometheus_rule = object(docs, "PrometheusRule", full);
    assert_eq!(prometheus_rule["spec"]["groups"], rules["groups"]);
}

/// No rule of any Role or ClusterRole grants `*` (verbs, resources or API groups).
fn check_no_wildcards(docs: &[Value]) {
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in doc["rules"].as_array().expect("rules") {
            for field in ["verbs", "resources", "apiGroups"] {
                assert!(
                    !strings(&rule[field]).iter().any(|s| s.contains('*')),
                    "{} {} grants * in {field}: {rule}",
                    doc["kind"],
                    name_of(doc)
                );
            }
        }
    }
}

/// Renders with `set` (plus the monitoring objects) into a fresh namespace, applies
/// everything, and checks it against `expect`.
async fn render_apply_check(
    two_containers: bool,
    provider: &str,
    cert_manager: bool,
    failure_policy: &str,
) {
    let plane = plane().await;
    let client = plane.client().await.expect("a client");
    install_crds(&client, &foreign_crds()).await;
    let ns = plane
        .namespace(&format!("chart-{provider}"))
        .await
        .expect("a namespace");
    let set = [
        format!("provider={provider}"),
        format!("containers={}", if two_containers { "two" } else { "one" }),
        format!("webhook.certManager.enabled={cert_manager}"),
        format!("webhook.failurePolicy={failure_policy}"),
        "metrics.serviceMonitor.enabled=true".to_string(),
        "monitoring.dashboard.enabled=true".to_string(),
        "monitoring.prometheusRule.enabled=true".to_string(),
        "podDisruptionBudget.enabled=true".to_string(),
    ];
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    let docs = render(&ns, &set);
    apply_rendered(&client, &docs).await;
    check(
        &docs,
        &Expect {
            namespace: &ns,
            provider,
            two_containers,
            cert_manager,
            failure_policy,
        },
    );
}

#[tokio::test]
async fn every_provider_in_one_container_applies() {
    for provider in PROVIDERS {
        render_apply_check(false, provider, false, "Fail").await;
    }
}

#[tokio::test]
async fn every_provider_in_two_containers_applies() {
    for provider in PROVIDERS {
        render_apply_check(true, provider, false, "Ignore").await;
    }
}

#[tokio::test]
async fn cert_manager_mode_applies() {
    render_apply_check(true, "aws", true, "Fail").await;
    render_apply_check(false, "gcp", true, "Ignore").await;
}

/// A target cluster in a Secret: mounted and passed; the chart grants nothing there (no
/// ClusterRole at all with cert-manager), and the machine namespace differs from the release
/// namespace. No target cluster: `--target-kubeconfig=none`, no Node permissions either.
#[tokio::test]
async fn other_target_modes_apply_without_target_rbac() {
    let plane = plane().await;
    let client = plane.client().await.expect("a client");
    install_crds(&client, &foreign_crds()).await;
    let release_ns = plane.namespace("chart-rel").await.expect("a namespace");
    let machine_ns = plane
        .namespace("chart-machines")
        .await
        .expect("a namespace");

    let docs = render(
        &release_ns,
        &[
            "provider=azure",
            &format!("namespace={machine_ns}"),
            "targetKubeconfig.secretName=target-kubeconfig",
            "replicas=2",
            "webhook.certManager.enabled=true",
        ],
    );
    apply_rendered(&client, &docs).await;
    check_no_wildcards(&docs);
    assert!(
        of_kind(&docs, "ClusterRole").is_empty(),
        "nothing cluster-wide"
    );
    for role in of_kind(&docs, "Role") {
        let ns = role["metadata"]["namespace"].as_str().expect("a namespace");
        assert_eq!(
            ns,
            machine_ns,
            "Role {} outside the machine namespace",
            name_of(role)
        );
    }
    let deployment = object(&docs, "Deployment", RELEASE);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    let args = strings(&pod["containers"][0]["args"]);
    assert!(
        args.contains(&"--target-kubeconfig=/var/run/secrets/mcm-rs/target/kubeconfig".into()),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--namespace={machine_ns}")),
        "{args:?}"
    );
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["secret"]["secretName"] == "target-kubeconfig")
    );
    let vwc = object(
        &docs,
        "ValidatingWebhookConfiguration",
        &format!("{RELEASE}-{release_ns}"),
    );
    assert_eq!(
        vwc["webhooks"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        machine_ns.as_str()
    );

    let docs = render(
        &release_ns,
        &["targetKubeconfig.secretName=none", "webhook.enabled=false"],
    );
    apply_rendered(&client, &docs).await;
    check_no_wildcards(&docs);
    assert!(
        of_kind(&docs, "ClusterRole").is_empty(),
        "nothing cluster-wide"
    );
    assert!(of_kind(&docs, "ValidatingWebhookConfiguration").is_empty());
    let args = strings(
        &object(&docs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["args"],
    );
    assert!(
        args.contains(&"--target-kubeconfig=none".into()),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a.starts_with("--webhook")), "{args:?}");
}

#[test]
fn bad_values_are_refused() {
    assert!(render_error(&["provider=openstack"]).contains("provider"));
    assert!(render_error(&["containers=three"]).contains("containers"));
    assert!(render_error(&["webhook.failurePolicy=Sometimes"]).contains("failurePolicy"));
}
