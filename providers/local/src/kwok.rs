//! VMs without a process, for scale (`providerSpec.node: kwok`).
//!
//! Such a VM is its record in the state directory. Its "boot" is the Node the driver creates
//! in the target cluster, annotated [`KWOK_NODE_ANNOTATION`]`: fake`, so that the kwok
//! controller (sigs.k8s.io/kwok) makes it Ready, renews its Lease and runs its Pods, as a
//! kubelet would. Deleting the VM deletes that Node (as a cloud-controller-manager deletes the
//! Node of a deleted instance): a kwok Node whose VM is gone would otherwise stay Ready.
//!
//! The driver's requests to the target cluster carry the User-Agent [`USER_AGENT`], so they can
//! be told from the controllers' own (they stand for the kubelet and the cloud).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::agent::node::{KUBELET_VERSION, go_arch, node_labels};
use crate::driver::vm_addresses;
use crate::spec::ProviderSpec;

/// The annotation that hands a Node to kwok (value `fake`).
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// The User-Agent of the driver's requests to the target cluster.
pub const USER_AGENT: &str = concat!("mcm-local-cloud/", env!("CARGO_PKG_VERSION"));

/// Errors of the kwok side of the local cloud. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum KwokError {
    /// The kubeconfig of the class secret cannot be used.
    #[error("the kubeconfig of the class secret cannot be used to reach the target cluster")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// No client can be built from it.
    #[error("cannot build a client of the target cluster from the class secret's kubeconfig")]
    Client(#[source] kube::Error),
    /// A request to the target cluster failed.
    #[error("failed to {action} Node {node} in the target cluster")]
    Api {
        /// What was being done.
        action: &'static str,
        /// The Node.
        node: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A Node of that name exists but belongs to another VM.
    #[error("Node {node} exists with providerID {found:?}, not {expected:?}: it is not this VM's")]
    ForeignNode {
        /// The Node.
        node: String,
        /// Its providerID.
        found: Option<String>,
        /// The VM's providerID.
        expected: String,
    },
}

/// The Node of a kwok VM, as its "kubelet" registers it: labels, taints and providerID as a
/// process VM's, capacity and node info in the status, and no conditions (kwok sets them).
pub fn kwok_node(node_name: &str, provider_id: &str, spec: &ProviderSpec) -> Node {
    let capacity = spec.capacity_map();
    Node {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            labels: Some(node_labels(node_name, spec)),
            annotations: Some(BTreeMap::from([(
                KWOK_NODE_ANNOTATION.to_string(),
                "fake".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.to_string()),
            taints: (!spec.taints.is_empty()).then(|| spec.taints.clone()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(capacity.clone()),
            allocatable: Some(capacity),
            addresses: Some(vm_addresses(node_name)),
            node_info: Some(NodeSystemInfo {
                architecture: go_arch().into(),
                kubelet_version: KUBELET_VERSION.into(),
                machine_id: node_name.to_string(),
                system_uuid: node_name.to_string(),
                operating_system: "linux".into(),
                os_image: "mcm-rs local VM (kwok)".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// Clients of target clusters, one per kubeconfig text, so that a thousand creates share
/// one connection pool.
#[derive(Default)]
pub struct TargetClients {
    clients: Mutex<HashMap<u64, kube::Client>>,
}

impl std::fmt::Debug for TargetClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetClients").finish_non_exhaustive()
    }
}

impl TargetClients {
    /// The client of the cluster `kubeconfig` (its text) names.
    pub async fn get(&self, kubeconfig: &str) -> Result<kube::Client, KwokError> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        kubeconfig.hash(&mut h);
        let key = h.finish();
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        let parsed = Kubeconfig::from_yaml(kubeconfig).map_err(KwokError::Kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
                .await
                .map_err(KwokError::Kubeconfig)?;
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(USER_AGENT),
        ));
        let client = kube::Client::try_from(config).map_err(KwokError::Client)?;
        Ok(self.lock().entry(key).or_insert(client).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, kube::Client>> {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Creates the Node unless it exists; an existing Node with another providerID is an error.
pub async fn ensure_node(client: &kube::Client, node: &Node) -> Result<(), KwokError> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.metadata.name.clone().unwrap_or_default();
    let expected = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .unwrap_or_default();
    match api.create(&PostParams::default(), node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api.get(&name).await.map_err(|source| KwokError::Api {
                action: "read",
                node: name.clone(),
                source,
            })?;
            let found = existing.spec.and_then(|s| s.provider_id);
            if found.as_deref() == Some(expected.as_str()) {
                Ok(())
            } else {
                Err(KwokError::ForeignNode {
                    node: name,
                    found,
                    expected,
                })
            }
        }
        Err(source) => Err(KwokError::Api {
            action: "create",
            node: name,
            source,
        }),
    }
}

/// Deletes the Node of a VM when it is that VM's (its providerID), and only that object (a
/// uid precondition). A missing Node is fine.
pub async fn delete_node(
    client: &kube::Client,
    name: &str,
    provider_id: &str,
) -> Result<(), KwokError> {
    let api: Api<Node> = Api::all(client.clone());
    let api_err = |action, source| KwokError::Api {
        action,
        node: name.to_string(),
        source,
    };
    let Some(node) = api.get_opt(name).await.map_err(|e| api_err("read", e))? else {
        return Ok(());
    };
    if node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) != Some(provider_id) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(api_err("delete", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_handed_to_kwok_with_the_vm_identity() {
        let spec = ProviderSpec::from_value(&serde_json::json!({
            "node": "kwok",
            "labels": {"pool": "a"},
            "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
            "capacity": {"cpu": "8"},
        }))
        .unwrap();
        let node = kwok_node("m-1", "local:///m-1", &spec);
        assert_eq!(
            node.metadata.annotations.as_ref().unwrap()[KWOK_NODE_ANNOTATION],
            "fake"
        );
        assert_eq!(node.metadata.labels.as_ref().unwrap()["pool"], "a");
        let node_spec = node.spec.as_ref().unwrap();
        assert_eq!(node_spec.provider_id.as_deref(), Some("local:///m-1"));
        assert_eq!(node_spec.taints.as_ref().unwrap()[0].key, "k");
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.capacity.as_ref().unwrap()["cpu"].0, "8");
        assert!(status.conditions.is_none(), "kwok sets the conditions");
    }
}
