//! The Node of a local VM: registration, Lease renewal and Ready heartbeats.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::driver::vm_addresses;
use crate::spec::ProviderSpec;

/// The kubelet version the agent reports.
pub const KUBELET_VERSION: &str = "v1.36.3-local";
/// The instance type label value of every local VM.
pub const INSTANCE_TYPE: &str = "local";
/// Namespace of the Node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// `leaseDurationSeconds` of the Node Lease (the kubelet's default).
pub const LEASE_DURATION_SECONDS: i32 = 40;

/// Who a VM is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The Node name.
    pub node_name: String,
    /// `spec.providerID`, e.g. `local:///worker-1`.
    pub provider_id: String,
}

/// The Go name of this machine's CPU architecture (`amd64`, `arm64`, ...).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The Node labels: well-known ones (`kubernetes.io/os`, `kubernetes.io/arch`,
/// `node.kubernetes.io/instance-type: local`), overridden by the spec's labels, and
/// `kubernetes.io/hostname` (always the node name).
pub fn node_labels(node_name: &str, spec: &ProviderSpec) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", go_arch()),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", go_arch()),
        ("node.kubernetes.io/instance-type", INSTANCE_TYPE),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    labels.extend(spec.labels.clone());
    labels.insert("kubernetes.io/hostname".into(), node_name.into());
    labels
}

/// The conditions of a healthy VM: Ready=True since `ready_since`, no pressure.
pub fn node_conditions(now: Timestamp, ready_since: Timestamp) -> Vec<NodeCondition> {
    let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(ready_since)),
    };
    vec![
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        cond(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        cond(
            "Ready",
            "True",
            "KubeletReady",
            "local-node is posting ready status",
        ),
    ]
}

/// The full Node status of a VM.
pub fn node_status(
    id: &NodeIdentity,
    spec: &ProviderSpec,
    now: Timestamp,
    ready_since: Timestamp,
) -> NodeStatus {
    let capacity = spec.capacity_map();
    NodeStatus {
        capacity: Some(capacity.clone()),
        allocatable: Some(capacity),
        addresses: Some(vm_addresses(&id.node_name)),
        conditions: Some(node_conditions(now, ready_since)),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: 0 }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: go_arch().into(),
            boot_id: format!("local-{}", std::process::id()),
            container_runtime_version: "local://0.1.0".into(),
            kernel_version: "local".into(),
            kube_proxy_version: String::new(),
            kubelet_version: KUBELET_VERSION.into(),
            machine_id: id.node_name.clone(),
            operating_system: "linux".into(),
            os_image: "mcm-rs local VM".into(),
            swap: None,
            system_uuid: id.node_name.clone(),
        }),
        ..Default::default()
    }
}

/// The Node a VM registers (metadata, spec and status).
pub fn build_node(
    id: &NodeIdentity,
    spec: &ProviderSpec,
    now: Timestamp,
    ready_since: Timestamp,
) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(id.node_name.clone()),
            labels: Some(node_labels(&id.node_name, spec)),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(id.provider_id.clone()),
            taints: (!spec.taints.is_empty()).then(|| spec.taints.clone()),
            ..Default::default()
        }),
        status: Some(node_status(id, spec, now, ready_since)),
    }
}

/// Re-registration over an existing Node: our labels are set, our taints added (taints
/// others put there, such as a cordon, stay), and the providerID set when it is empty.
pub fn merge_registration(existing: &Node, desired: &Node) -> Node {
    let mut node = existing.clone();
    node.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(desired.metadata.labels.clone().unwrap_or_default());
    let desired_spec = desired.spec.clone().unwrap_or_default();
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    if spec.provider_id.as_deref().unwrap_or_default().is_empty() {
        spec.provider_id = desired_spec.provider_id;
    }
    for taint in desired_spec.taints.unwrap_or_default() {
        let taints = spec.taints.get_or_insert_with(Vec::new);
        if !taints
            .iter()
            .any(|t| t.key == taint.key && t.effect == taint.effect)
        {
            taints.push(taint);
        }
    }
    node
}

/// Creates the Node, or updates it when it exists (see [`merge_registration`]), then sets
/// its status. Returns the Node as the API server has it.
pub async fn register(
    client: &kube::Client,
    id: &NodeIdentity,
    spec: &ProviderSpec,
    ready_since: Timestamp,
) -> Result<Node, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let desired = build_node(id, spec, Timestamp::now(), ready_since);
    match api.create(&PostParams::default(), &desired).await {
        Ok(_) => info!(node = %id.node_name, "Node created"),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api.get(&id.node_name).await?;
            let merged = merge_registration(&existing, &desired);
            api.replace(&id.node_name, &PostParams::default(), &merged)
                .await?;
            info!(node = %id.node_name, "Node existed: labels, taints and providerID updated");
        }
        Err(e) => return Err(e),
    }
    let status = node_status(id, spec, Timestamp::now(), ready_since);
    api.patch_status(
        &id.node_name,
        &PatchParams::default(),
        &Patch::Strategic(json!({ "status": status })),
    )
    .await
}

/// The Node Lease of a VM, owned by its Node (so it goes when the Node goes).
pub fn build_lease(node: &Node, now: Timestamp) -> Lease {
    let name = node.metadata.name.clone().unwrap_or_default();
    Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(LEASE_NAMESPACE.into()),
            owner_references: node.metadata.uid.clone().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: name.clone(),
                    uid,
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Renews the Node Lease, creating it when it does not exist.
pub async fn renew_lease(client: &kube::Client, node: &Node) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let name = node.metadata.name.clone().unwrap_or_default();
    let lease = build_lease(node, Timestamp::now());
    let patch = json!({ "spec": lease.spec });
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            api.create(&PostParams::default(), &lease).await?;
            debug!(node = %name, "Lease created");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Refreshes the heartbeat times of the Node's conditions.
pub async fn post_heartbeat(
    client: &kube::Client,
    node_name: &str,
    ready_since: Timestamp,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let patch =
        json!({ "status": { "conditions": node_conditions(Timestamp::now(), ready_since) } });
    api.patch_status(node_name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(drop)
}

/// Renews the Lease and the Ready heartbeat every `interval`, forever. Failures are logged
/// and retried at the next tick.
pub async fn heartbeat_loop(
    client: kube::Client,
    node: Node,
    interval: Duration,
    ready_since: Timestamp,
) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(e) = renew_lease(&client, &node).await {
            warn!(node = %name, error = %e, "failed to renew the Node Lease");
        }
        if let Err(e) = post_heartbeat(&client, &name, ready_since).await {
            warn!(node = %name, error = %e, "failed to post the Ready heartbeat");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn id() -> NodeIdentity {
        NodeIdentity {
            node_name: "n1".into(),
            provider_id: "local:///n1".into(),
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    #[test]
    fn node_from_spec() {
        let spec = ProviderSpec::from_value(&json!({
            "capacity": {"cpu": "3"},
            "labels": {"role": "w", "kubernetes.io/hostname": "spoof", "node.kubernetes.io/instance-type": "big"},
            "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
        }))
        .expect("valid");
        let t = Timestamp::UNIX_EPOCH;
        let node = build_node(&id(), &spec, t, t);
        let labels = node.metadata.labels.clone().expect("labels");
        assert_eq!(labels["role"], "w");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["node.kubernetes.io/instance-type"], "big");
        let nspec = node.spec.clone().expect("spec");
        assert_eq!(nspec.provider_id.as_deref(), Some("local:///n1"));
        assert_eq!(nspec.taints.expect("taints")[0].key, "k");
        let status = node.status.expect("status");
        assert_eq!(status.capacity, status.allocatable);
        let cap = status.capacity.expect("capacity");
        assert_eq!(cap["cpu"], Quantity("3".into()));
        assert_eq!(cap["pods"], Quantity("110".into()));
        let ready = status
            .conditions
            .expect("conditions")
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        let info = status.node_info.expect("nodeInfo");
        assert_eq!(info.kubelet_version, KUBELET_VERSION);
        assert_eq!(info.operating_system, "linux");
        assert_eq!(
            status
                .daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|e| e.port),
            Some(0)
        );
    }

    #[test]
    fn no_taints_means_none() {
        let t = Timestamp::UNIX_EPOCH;
        let node = build_node(&id(), &ProviderSpec::default(), t, t);
        assert_eq!(node.spec.expect("spec").taints, None);
    }

    #[test]
    fn re_registration_keeps_foreign_taints_and_provider_id() {
        let t = Timestamp::UNIX_EPOCH;
        let spec = ProviderSpec {
            taints: vec![taint("mine", "NoSchedule")],
            ..Default::default()
        };
        let desired = build_node(&id(), &spec, t, t);
        let mut existing = Node::default();
        existing.metadata.name = Some("n1".into());
        existing.metadata.labels = Some([("foreign".to_string(), "x".to_string())].into());
        existing.spec = Some(NodeSpec {
            provider_id: Some("local:///older".into()),
            taints: Some(vec![
                taint("node.kubernetes.io/unschedulable", "NoSchedule"),
                taint("mine", "NoSchedule"),
            ]),
            ..Default::default()
        });
        let merged = merge_registration(&existing, &desired);
        let labels = merged.metadata.labels.expect("labels");
        assert_eq!(labels["foreign"], "x");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        let spec = merged.spec.expect("spec");
        assert_eq!(spec.provider_id.as_deref(), Some("local:///older"));
        assert_eq!(spec.taints.expect("taints").len(), 2);

        let merged = merge_registration(&Node::default(), &desired);
        assert_eq!(
            merged.spec.expect("spec").provider_id.as_deref(),
            Some("local:///n1")
        );
    }

    #[test]
    fn lease_is_owned_by_the_node() {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.uid = Some("u1".into());
        let lease = build_lease(&node, Timestamp::UNIX_EPOCH);
        assert_eq!(lease.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        let spec = lease.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        let owner = &lease.metadata.owner_references.expect("owners")[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "u1"));
    }
}
