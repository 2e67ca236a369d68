//! Objects as a Go client writes them, accepted by our CRDs through server-side apply as
//! well as a POST, and read back by our types with what matters.
//!
//! The fixture `fixtures/go-marshalled.json` is what Go's `json.Marshal` writes for the Go
//! MCM's own `v1alpha1` types (gardener/machine-controller-manager at 54caf546,
//! `pkg/apis/machine/v1alpha1`), built with k8s.io/apimachinery v0.33.0, whose
//! `ObjectMeta.creationTimestamp` has no `omitzero` and is written as `null` (v0.34 and later
//! omit it; the other `null`s, `lastUpdateTime` in a status, remain with any version):
//! - `gardener-md`, as Gardener's worker actuator builds a MachineDeployment (rolling update,
//!   node template with labels, annotations and taints, the inlined machine configuration);
//! - `go-set` and `go-machine`, as the Go MCM builds a set and a machine from the template;
//! - `zero-md`, `zero-set`, `zero-machine`: only a name, a selector and a class; every other
//!   field is Go's zero value (`strategy: {}`, `nodeTemplate: {metadata:
//!   {creationTimestamp: null}, spec: {}}`, `status: {lastOperation: {lastUpdateTime:
//!   null}}`, a MachineSet's deprecated `machineClass: {}`);
//! - `gardener-class`, a MachineClass as Gardener's provider extensions write one (node
//!   template with capacity, instance type, region, zone and architecture, both Secret
//!   references); `sparse-class`, one whose node template has only an instance type (Go
//!   writes `capacity: null`, `region: ""`, `zone: ""`).

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use mcm_api::{Machine, MachineClass, MachineDeployment, MachineSet};
use mcm_testenv::Components;
use mcm_testenv::kit::TestNamespace;
use serde_json::Value;

const GO_MARSHALLED: &str = include_str!("fixtures/go-marshalled.json");

/// The fixture's object the Go MCM's own CRD refuses as well: a node template without a
/// capacity (`capacity` is required there, and `null` is not an object).
const REFUSED_BY_GO_TOO: &str = "sparse-class";

fn corpus() -> Vec<Value> {
    serde_json::from_str(GO_MARSHALLED).expect("the fixture is JSON")
}

/// The fixture's objects that the Go MCM's CRDs accept.
fn accepted_by_go() -> Vec<Value> {
    corpus()
        .into_iter()
        .filter(|d| d["metadata"]["name"] != REFUSED_BY_GO_TOO)
        .collect()
}

/// The refusal of the object the Go MCM's CRD refuses too: it names the field.
fn assert_refused_as_go_refuses(result: Result<DynamicObject, kube::Error>) {
    match result {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422 && s.message.contains("nodeTemplate.capacity"),
            "{s:?}"
        ),
        other => panic!("{REFUSED_BY_GO_TOO}: {other:?}"),
    }
}

fn sparse_class() -> Value {
    corpus()
        .into_iter()
        .find(|d| d["metadata"]["name"] == REFUSED_BY_GO_TOO)
        .expect("the sparse class")
}

fn api(client: &kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let plural = match kind {
        "MachineDeployment" => "machinedeployments",
        "MachineSet" => "machinesets",
        "Machine" => "machines",
        "MachineClass" => "machineclasses",
        other => panic!("no such kind in the fixture: {other}"),
    };
    let gvk = GroupVersionKind::gvk("machine.sapcloud.io", "v1alpha1", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

fn kind_and_name(doc: &Value) -> (String, String) {
    (
        doc["kind"].as_str().unwrap_or_default().to_string(),
        doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// Server-side apply of every object of the fixture, as a GitOps tool applies a manifest a Go
/// program wrote; applied twice (the second apply changes nothing). Each is then read back by
/// our types with its labels, class, node template and timeouts.
#[tokio::test]
async fn go_marshalled_objects_are_server_side_applied() {
    let t = TestNamespace::new(Components::API_SERVER, "go-ssa").await;
    let mut refused = Vec::new();
    for doc in accepted_by_go() {
        let (kind, name) = kind_and_name(&doc);
        let api = api(&t.client, &t.ns, &kind);
        let params = PatchParams::apply("go-client").force();
        let mut generations = Vec::new();
        for _ in 0..2 {
            match api.patch(&name, &params, &Patch::Apply(&doc)).await {
                Ok(o) => generations.push(o.metadata.generation),
                Err(e) => {
                    refused.push(format!("{kind} {name}: {e}"));
                    break;
                }
            }
        }
        if generations.len() == 2 {
            assert_eq!(
                generations[0], generations[1],
                "{kind} {name}: the same apply again changed the object"
            );
        }
    }
    assert!(refused.is_empty(), "refused: {refused:#?}");
    read_back(&t).await;
    assert_refused_as_go_refuses(
        api(&t.client, &t.ns, "MachineClass")
            .patch(
                REFUSED_BY_GO_TOO,
                &PatchParams::apply("go-client").force(),
                &Patch::Apply(sparse_class()),
            )
            .await,
    );
}

/// A POST of every object of the fixture, as a Go client creates them.
#[tokio::test]
async fn go_marshalled_objects_are_created() {
    let t = TestNamespace::new(Components::API_SERVER, "go-post").await;
    let mut refused = Vec::new();
    for doc in accepted_by_go() {
        let (kind, name) = kind_and_name(&doc);
        let obj: DynamicObject = serde_json::from_value(doc).expect("an object");
        if let Err(e) = api(&t.client, &t.ns, &kind)
            .create(&PostParams::default(), &obj)
            .await
        {
            refused.push(format!("{kind} {name}: {e}"));
        }
    }
    assert!(refused.is_empty(), "refused: {refused:#?}");
    read_back(&t).await;
    let sparse: DynamicObject = serde_json::from_value(sparse_class()).expect("an object");
    assert_refused_as_go_refuses(
        api(&t.client, &t.ns, "MachineClass")
            .create(&PostParams::default(), &sparse)
            .await,
    );
}

/// A Go client's status writes of a machine it created: `UpdateStatus` (a PUT of the whole
/// object, Go's zero times as `null`, as the Go MCM writes a status) is accepted. A
/// server-side apply of that status is refused, naming the time, as the Go MCM's CRD refuses
/// it (`lastUpdateTime` is a date-time string there too).
#[tokio::test]
async fn go_marshalled_statuses_are_written() {
    let t = TestNamespace::new(Components::API_SERVER, "go-status").await;
    let doc = corpus()
        .into_iter()
        .find(|d| d["metadata"]["name"] == "zero-machine")
        .expect("zero-machine");
    let api = api(&t.client, &t.ns, "Machine");
    let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
    let created = api
        .create(&PostParams::default(), &obj)
        .await
        .expect("create");
    let mut put = doc.clone();
    put["metadata"]["resourceVersion"] = created.metadata.resource_version.clone().into();
    let put: DynamicObject = serde_json::from_value(put).expect("an object");
    api.replace_status("zero-machine", &PostParams::default(), &put)
        .await
        .expect("a PUT of the status with Go's null times");
    match api
        .patch_status(
            "zero-machine",
            &PatchParams::apply("go-client").force(),
            &Patch::Apply(&doc),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422 && s.message.contains("lastOperation.lastUpdateTime"),
            "{s:?}"
        ),
        other => panic!("a server-side apply of Go's null times in a status: {other:?}"),
    }
}

/// The fixture's objects, read by our types: what a controller needs from each.
async fn read_back(t: &TestNamespace) {
    let md = Api::<MachineDeployment>::namespaced(t.client.clone(), &t.ns)
        .get("gardener-md")
        .await
        .expect("our type reads the deployment");
    assert_eq!(md.spec.replicas, Some(2));
    let template = &md.spec.template;
    assert_eq!(
        template
            .labels()
            .and_then(|l| l.get("name"))
            .map(String::as_str),
        Some("shoot--p--s-worker-a-z1")
    );
    let spec = template.spec.as_ref().expect("the template's spec");
    assert_eq!(
        spec.class.as_ref().and_then(|c| c.name.as_deref()),
        Some("shoot--p--s-worker-a-z1-5a3b1")
    );
    let node_template = spec.node_template.as_ref().expect("the node template");
    let node_meta = node_template.metadata.as_ref().expect("its metadata");
    assert_eq!(
        node_meta
            .labels
            .as_ref()
            .and_then(|l| l.get("worker.gardener.cloud/pool"))
            .map(String::as_str),
        Some("worker-a")
    );
    assert_eq!(
        node_meta
            .annotations
            .as_ref()
            .and_then(|a| a.get("example.com/a"))
            .map(String::as_str),
        Some("b")
    );
    let taints = node_template
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .expect("the taints");
    assert_eq!(taints[0].key, "dedicated");
    assert_eq!(
        spec.configuration
            .drain_timeout
            .as_ref()
            .map(ToString::to_string),
        Some("2h0m0s".to_string())
    );
    for name in ["go-set", "zero-set"] {
        Api::<MachineSet>::namespaced(t.client.clone(), &t.ns)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("our type reads the set {name}: {e}"));
    }
    for name in ["go-machine", "zero-machine"] {
        Api::<Machine>::namespaced(t.client.clone(), &t.ns)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("our type reads the machine {name}: {e}"));
    }
    Api::<MachineDeployment>::namespaced(t.client.clone(), &t.ns)
        .get("zero-md")
        .await
        .expect("our type reads the zero deployment");
    let classes = Api::<MachineClass>::namespaced(t.client.clone(), &t.ns);
    let class = classes
        .get("gardener-class")
        .await
        .expect("our type reads the class");
    let node_template = class.node_template.as_ref().expect("its node template");
    assert_eq!(node_template.instance_type, "m5.xlarge");
    assert_eq!(
        node_template.capacity.get("memory").map(|q| q.0.as_str()),
        Some("16Gi")
    );
    assert_eq!(class.provider_spec["ami"], serde_json::json!("ami-0123"));
}

/// What the template's metadata still refuses: a label that is not a string (the
/// deployment's selector rule reads the labels, and the machines get them), and a selector
/// that the template's labels do not match.
#[tokio::test]
async fn a_template_label_that_is_not_a_string_is_refused() {
    let t = TestNamespace::new(Components::API_SERVER, "go-bad").await;
    let mut doc = corpus()
        .into_iter()
        .find(|d| d["metadata"]["name"] == "zero-md")
        .expect("zero-md");
    let api = api(&t.client, &t.ns, "MachineDeployment");
    let params = PatchParams::apply("go-client").force();
    let refusal = |r: Result<DynamicObject, kube::Error>| match r {
        Err(kube::Error::Api(s)) => s.message,
        other => panic!("accepted: {other:?}"),
    };
    doc["spec"]["template"]["metadata"]["labels"]["size"] = serde_json::json!(3);
    let message = refusal(api.patch("zero-md", &params, &Patch::Apply(&doc)).await);
    assert!(
        message.contains("spec.template.metadata.labels.size"),
        "{message}"
    );
    doc["spec"]["template"]["metadata"]["labels"] = serde_json::json!({"name": "other"});
    let message = refusal(api.patch("zero-md", &params, &Patch::Apply(&doc)).await);
    assert!(message.contains("selector"), "{message}");
}
