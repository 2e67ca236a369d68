//! Typed builders for the project's kinds (instead of `json!` literals), a MachineClass with
//! its Secret, and a Ready Node for tests without a kubelet.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Secret, SecretReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use mcm_api::{
    ClassSpec, Machine, MachineClass, MachineDeployment, MachineDeploymentSpec,
    MachineDeploymentStrategy, MachineDeploymentStrategyType, MachineSet, MachineSetSpec,
    MachineSpec, MachineTemplateSpec, NodeTemplateSpec, RollingUpdateMachineDeployment,
};
use serde_json::json;

/// A test's corner of the shared control plane: the control plane, a client of its own and
/// a fresh namespace.
#[derive(Clone)]
pub struct TestNamespace {
    /// The control plane shared by the tests of this process.
    pub env: std::sync::Arc<crate::ControlPlane>,
    /// An admin client (for this test's runtime).
    pub client: kube::Client,
    /// The namespace, `<prefix>-<random>`.
    pub ns: String,
}

impl TestNamespace {
    /// Starts (or reuses) the shared control plane with `components`, and creates a
    /// namespace named after `prefix`; panics when either fails.
    pub async fn new(components: crate::Components, prefix: &str) -> TestNamespace {
        let env = crate::shared(components)
            .await
            .unwrap_or_else(|e| panic!("the test control plane: {e}"));
        let client = env.client().await.expect("a client of the control plane");
        let ns = env
            .namespace(prefix)
            .await
            .unwrap_or_else(|e| panic!("a namespace for {prefix}: {e}"));
        TestNamespace { env, client, ns }
    }
}

fn labels_of(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    pairs.iter().cloned().collect()
}

/// A `MachineClass` reference (`kind: MachineClass`).
pub fn class_ref(class: &str) -> ClassSpec {
    ClassSpec {
        kind: Some("MachineClass".into()),
        name: Some(class.into()),
        ..ClassSpec::default()
    }
}

/// A controller owner reference to `owner` (no `blockOwnerDeletion`).
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        ..OwnerReference::default()
    }
}

/// A machine template: `labels` on its metadata, a spec naming the class `class`.
pub fn template(class: &str, labels: BTreeMap<String, String>) -> MachineTemplateSpec {
    MachineTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            ..ObjectMeta::default()
        }),
        spec: Some(MachineSpec {
            class: Some(class_ref(class)),
            ..MachineSpec::default()
        }),
    }
}

/// Metadata common to the builders: name, labels, finalizers, owner references.
#[derive(Debug, Clone, Default)]
struct Meta {
    name: String,
    labels: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
    finalizers: Vec<String>,
    owners: Vec<OwnerReference>,
}

impl Meta {
    fn new(name: &str) -> Self {
        Meta {
            name: name.into(),
            ..Meta::default()
        }
    }

    fn build(self) -> ObjectMeta {
        let some_map = |v: Vec<(String, String)>| (!v.is_empty()).then(|| labels_of(&v));
        ObjectMeta {
            name: Some(self.name),
            labels: some_map(self.labels),
            annotations: some_map(self.annotations),
            finalizers: (!self.finalizers.is_empty()).then_some(self.finalizers),
            owner_references: (!self.owners.is_empty()).then_some(self.owners),
            ..ObjectMeta::default()
        }
    }
}

macro_rules! meta_setters {
    () => {
        /// Adds a label to the object's own metadata.
        pub fn label(mut self, key: &str, value: &str) -> Self {
            self.meta.labels.push((key.into(), value.into()));
            self
        }

        /// Adds an annotation to the object's metadata.
        pub fn annotation(mut self, key: &str, value: &str) -> Self {
            self.meta.annotations.push((key.into(), value.into()));
            self
        }

        /// Adds a finalizer.
        pub fn finalizer(mut self, finalizer: &str) -> Self {
            self.meta.finalizers.push(finalizer.into());
            self
        }

        /// Makes `owner` the controller of the object (see [`controller_ref`]).
        pub fn owner<K: Resource<DynamicType = ()>>(mut self, owner: &K) -> Self {
            self.meta.owners.push(controller_ref(owner));
            self
        }
    };
}

/// Builds a [`Machine`]: `MachineBuilder::new("m1").class("local").label("app", "w").build()`.
#[derive(Debug, Clone)]
#[must_use]
pub struct MachineBuilder {
    meta: Meta,
    spec: MachineSpec,
}

impl MachineBuilder {
    /// A Machine named `name` without a class.
    pub fn new(name: &str) -> Self {
        MachineBuilder {
            meta: Meta::new(name),
            spec: MachineSpec::default(),
        }
    }

    meta_setters!();

    /// The MachineClass of the machine.
    pub fn class(mut self, class: &str) -> Self {
        self.spec.class = Some(class_ref(class));
        self
    }

    /// `spec.providerID`.
    pub fn provider_id(mut self, id: &str) -> Self {
        self.spec.provider_id = Some(id.into());
        self
    }

    /// `spec.nodeTemplate`: what the machine controller applies to the Node.
    pub fn node_template(mut self, template: NodeTemplateSpec) -> Self {
        self.spec.node_template = Some(template);
        self
    }

    /// The whole spec (replaces class and providerID set before).
    pub fn spec(mut self, spec: MachineSpec) -> Self {
        self.spec = spec;
        self
    }

    /// The Machine.
    pub fn build(self) -> Machine {
        Machine {
            metadata: self.meta.build(),
            spec: self.spec,
            ..Machine::default()
        }
    }
}

/// Selector, template and replicas shared by sets and deployments.
#[derive(Debug, Clone)]
struct Pool {
    replicas: i32,
    class: String,
    match_labels: Vec<(String, String)>,
}

impl Pool {
    fn new(name: &str) -> Self {
        Pool {
            replicas: 1,
            class: "class".into(),
            match_labels: vec![("name".into(), name.into())],
        }
    }

    fn selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels_of(&self.match_labels)),
            ..LabelSelector::default()
        }
    }

    fn template(&self) -> MachineTemplateSpec {
        template(&self.class, labels_of(&self.match_labels))
    }
}

macro_rules! pool_setters {
    () => {
        /// Desired replicas (default 1).
        pub fn replicas(mut self, replicas: i32) -> Self {
            self.pool.replicas = replicas;
            self
        }

        /// The MachineClass of the template (default `class`).
        pub fn class(mut self, class: &str) -> Self {
            self.pool.class = class.into();
            self
        }

        /// Selects and labels machines with `key=value` instead of the default
        /// `name=<name>` (call again for more labels).
        pub fn match_label(mut self, key: &str, value: &str) -> Self {
            if self.custom_labels {
                self.pool.match_labels.push((key.into(), value.into()));
            } else {
                self.pool.match_labels = vec![(key.into(), value.into())];
                self.custom_labels = true;
            }
            self
        }
    };
}

/// Builds a [`MachineSet`]: selector and template labels `name=<name>` unless
/// [`MachineSetBuilder::match_label`] says otherwise.
#[derive(Debug, Clone)]
#[must_use]
pub struct MachineSetBuilder {
    meta: Meta,
    pool: Pool,
    custom_labels: bool,
}

impl MachineSetBuilder {
    /// A set named `name` of 1 replica of class `class`.
    pub fn new(name: &str) -> Self {
        MachineSetBuilder {
            meta: Meta::new(name),
            pool: Pool::new(name),
            custom_labels: false,
        }
    }

    meta_setters!();
    pool_setters!();

    /// The MachineSet.
    pub fn build(self) -> MachineSet {
        MachineSet {
            spec: MachineSetSpec {
                replicas: Some(self.pool.replicas),
                selector: Some(self.pool.selector()),
                template: Some(self.pool.template()),
                ..MachineSetSpec::default()
            },
            metadata: self.meta.build(),
            ..MachineSet::default()
        }
    }
}

/// Builds a [`MachineDeployment`]:
/// `MachineDeploymentBuilder::new("web").replicas(3).class("c").rolling(1, 0).build()`.
/// Without a strategy call the spec has none (the controller's default applies).
#[derive(Debug, Clone)]
#[must_use]
pub struct MachineDeploymentBuilder {
    meta: Meta,
    pool: Pool,
    custom_labels: bool,
    strategy: Option<MachineDeploymentStrategy>,
    paused: Option<bool>,
}

impl MachineDeploymentBuilder {
    /// A deployment named `name` of 1 replica of class `class`.
    pub fn new(name: &str) -> Self {
        MachineDeploymentBuilder {
            meta: Meta::new(name),
            pool: Pool::new(name),
            custom_labels: false,
            strategy: None,
            paused: None,
        }
    }

    meta_setters!();
    pool_setters!();

    /// The whole strategy.
    pub fn strategy(mut self, strategy: Option<MachineDeploymentStrategy>) -> Self {
        self.strategy = strategy;
        self
    }

    /// `Recreate`.
    pub fn recreate(self) -> Self {
        self.strategy(Some(MachineDeploymentStrategy {
            type_: Some(MachineDeploymentStrategyType::Recreate),
            ..MachineDeploymentStrategy::default()
        }))
    }

    fn rolling_update(&mut self) -> &mut RollingUpdateMachineDeployment {
        let s = self.strategy.get_or_insert_with(Default::default);
        s.type_ = Some(MachineDeploymentStrategyType::RollingUpdate);
        s.rolling_update.get_or_insert_with(Default::default)
    }

    /// `RollingUpdate` with `maxSurge` (keeps a `maxUnavailable` set before).
    pub fn max_surge(mut self, surge: IntOrString) -> Self {
        self.rolling_update().update_configuration.max_surge = Some(surge);
        self
    }

    /// `RollingUpdate` with `maxUnavailable` (keeps a `maxSurge` set before).
    pub fn max_unavailable(mut self, unavailable: IntOrString) -> Self {
        self.rolling_update().update_configuration.max_unavailable = Some(unavailable);
        self
    }

    /// `RollingUpdate` with integer `maxSurge` and `maxUnavailable`.
    pub fn rolling(self, surge: i32, unavailable: i32) -> Self {
        self.max_surge(IntOrString::Int(surge))
            .max_unavailable(IntOrString::Int(unavailable))
    }

    /// `spec.paused`.
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = Some(paused);
        self
    }

    /// The MachineDeployment.
    pub fn build(self) -> MachineDeployment {
        MachineDeployment {
            spec: MachineDeploymentSpec {
                replicas: Some(self.pool.replicas),
                selector: Some(self.pool.selector()),
                template: self.pool.template(),
                strategy: self.strategy,
                paused: self.paused,
                ..MachineDeploymentSpec::default()
            },
            metadata: self.meta.build(),
            ..MachineDeployment::default()
        }
    }
}

/// Builds a [`MachineClass`]:
/// `MachineClassBuilder::new("local").provider("local").spec(json!({..})).secret(ns, "s").build()`.
#[derive(Debug, Clone)]
#[must_use]
pub struct MachineClassBuilder {
    class: MachineClass,
}

impl MachineClassBuilder {
    /// A class named `name` with an empty providerSpec and no secret.
    pub fn new(name: &str) -> Self {
        let mut class = MachineClass::default();
        class.metadata.name = Some(name.into());
        MachineClassBuilder { class }
    }

    /// `provider`.
    pub fn provider(mut self, provider: &str) -> Self {
        self.class.provider = Some(provider.into());
        self
    }

    /// `providerSpec`.
    pub fn spec(mut self, spec: serde_json::Value) -> Self {
        self.class.provider_spec = spec;
        self
    }

    /// `secretRef`: the Secret `name` in `namespace`.
    pub fn secret(mut self, namespace: &str, name: &str) -> Self {
        self.class.secret_ref = Some(SecretReference {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
        });
        self
    }

    /// The MachineClass.
    pub fn build(self) -> MachineClass {
        self.class
    }
}

/// A Secret named `name` with `stringData` `pairs`.
pub fn secret(name: &str, pairs: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        string_data: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Creates `obj` through `api`; panics naming the kind, the name and the error.
pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::Serialize,
    K: serde::de::DeserializeOwned,
{
    api.create(&PostParams::default(), obj)
        .await
        .unwrap_or_else(|e| panic!("create {} {}: {e}", K::kind(&()), obj.name_any()))
}

/// Creates `secret` and then `class` in namespace `ns` (a class's secret first, so the class
/// is usable as soon as it exists).
pub async fn create_class_with_secret(
    client: &kube::Client,
    ns: &str,
    class: &MachineClass,
    secret: &Secret,
) -> MachineClass {
    create(&Api::<Secret>::namespaced(client.clone(), ns), secret).await;
    create(&Api::<MachineClass>::namespaced(client.clone(), ns), class).await
}

/// The text of the control plane's admin kubeconfig (for a Secret or a process).
pub fn kubeconfig_text(env: &crate::ControlPlane) -> String {
    std::fs::read_to_string(env.kubeconfig_path()).expect("the admin kubeconfig is readable")
}

/// The status of a Node's Ready condition, if it has one.
pub fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// Whether a Node's Ready condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    ready_status(node).as_deref() == Some("True")
}

/// Creates a Node as a kubelet would register it (with `labels` and `providerID`), and
/// reports it Ready once — no heartbeats follow, so it stays Ready only without a node
/// lifecycle controller or for its grace period.
pub async fn create_ready_node(
    client: &kube::Client,
    name: &str,
    provider_id: &str,
    labels: &[(&str, &str)],
) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut all = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]);
    all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(all),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(provider_id.into()),
            ..Default::default()
        }),
        ..Node::default()
    };
    create(&nodes, &node).await;
    let now = jiff::Timestamp::now().to_string();
    let status = json!({ "status": {
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "registered by the test", "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" }],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("report Node {name} Ready: {e}"))
}

/// A ValidatingWebhookConfiguration `name` sending CREATE and UPDATE of the four machine
/// kinds of namespace `ns` to the webhook at `https://127.0.0.1:<port>/validate` (no
/// `caBundle`: the binary publishes its CA), with `failure_policy` (`Fail` or `Ignore`).
pub fn webhook_configuration(
    name: &str,
    ns: &str,
    port: u16,
    failure_policy: &str,
) -> serde_json::Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
            "rules": [{
                "apiGroups": ["machine.sapcloud.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["machineclasses", "machines", "machinesets", "machinedeployments"],
                "scope": "Namespaced",
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    })
}

/// The webhook name of [`webhook_configuration`] (the API server quotes it in refusals).
pub const WEBHOOK_NAME: &str = "validate.machine.sapcloud.io";

/// The flags that make a machine controller serve the webhook on 127.0.0.1:`port` and
/// publish its CA into the configuration `configuration`.
pub fn webhook_args(port: u16, configuration: &str) -> Vec<String> {
    vec![
        format!("--webhook-port={port}"),
        "--webhook-bind-address=127.0.0.1".into(),
        "--webhook-cert-hosts=127.0.0.1".into(),
        format!("--webhook-configuration-name={configuration}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_builder_gives_what_the_json_literal_gave() {
        let built = MachineDeploymentBuilder::new("workers")
            .replicas(3)
            .class("aws")
            .match_label("pool", "workers")
            .rolling(1, 0)
            .build();
        let literal: MachineDeployment = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": { "name": "workers" },
            "spec": {
                "replicas": 3,
                "selector": { "matchLabels": { "pool": "workers" } },
                "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } },
                "template": { "metadata": { "labels": { "pool": "workers" } },
                              "spec": { "class": { "kind": "MachineClass", "name": "aws" } } }
            }
        }))
        .unwrap();
        assert_eq!(built, literal);
    }

    #[test]
    fn a_set_builder_defaults_to_name_labels_and_takes_owner_and_labels() {
        let mut owner = MachineDeploymentBuilder::new("db").build();
        owner.metadata.uid = Some("uid-1".into());
        let ms = MachineSetBuilder::new("db-1")
            .owner(&owner)
            .match_label("tier", "db")
            .match_label("zone", "a")
            .label("tier", "db")
            .class("c2")
            .replicas(5)
            .build();
        let literal: MachineSet = serde_json::from_value(json!({
            "metadata": { "name": "db-1", "labels": { "tier": "db" },
                "ownerReferences": [{ "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
                    "name": "db", "uid": "uid-1", "controller": true }] },
            "spec": {
                "replicas": 5,
                "selector": { "matchLabels": { "tier": "db", "zone": "a" } },
                "template": { "metadata": { "labels": { "tier": "db", "zone": "a" } },
                              "spec": { "class": { "kind": "MachineClass", "name": "c2" } } }
            }
        }))
        .unwrap();
        assert_eq!(ms, literal);
        let default = MachineSetBuilder::new("s").build();
        assert_eq!(
            default.spec.selector.unwrap().match_labels.unwrap()["name"],
            "s"
        );
    }

    #[test]
    fn a_machine_builder_sets_class_labels_and_finalizers() {
        let m = MachineBuilder::new("m1")
            .class("local")
            .label("app", "w")
            .finalizer("test/hold")
            .build();
        let literal: Machine = serde_json::from_value(json!({
            "metadata": { "name": "m1", "labels": { "app": "w" }, "finalizers": ["test/hold"] },
            "spec": { "class": { "kind": "MachineClass", "name": "local" } },
        }))
        .unwrap();
        assert_eq!(m, literal);
    }
}
