//! Volumes of the drained pods: which to track (pure), how to resolve them (PVC -> PV ->
//! driver volume id), and whether they are still attached to the node or attached elsewhere
//! (pure, over the Node and the VolumeAttachment store).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use mcm_driver::{Driver, GetVolumeIdsRequest, RequestId};

use crate::classify::pod_key;
use crate::error::DrainError;

/// A PersistentVolume whose attachment the drain tracks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackedVolume {
    /// The PersistentVolume's name.
    pub pv: String,
    /// The volume id the driver returned for it (e.g. a CSI volume handle).
    pub id: String,
}

impl fmt::Display for TrackedVolume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (PersistentVolume {})", self.id, self.pv)
    }
}

/// The PersistentVolumeClaims (`claim name`s) of each pod to drain that no other pod on the
/// node uses. A shared claim (e.g. ReadWriteMany) would only detach once every user is gone,
/// including pods that stay on the node, so its volume is not waited for (as in MCM).
pub fn unshared_claims(to_drain: &[&Pod], staying: &[&Pod]) -> BTreeMap<String, Vec<String>> {
    let mut users: HashMap<(String, String), usize> = HashMap::new();
    for pod in to_drain.iter().chain(staying) {
        for claim in claims(pod) {
            *users
                .entry((pod.metadata.namespace.clone().unwrap_or_default(), claim))
                .or_default() += 1;
        }
    }
    to_drain
        .iter()
        .map(|pod| {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let own = claims(pod)
                .into_iter()
                .filter(|c| users.get(&(ns.clone(), c.clone())) == Some(&1))
                .collect();
            (pod_key(pod), own)
        })
        .collect()
}

fn claims(pod: &Pod) -> Vec<String> {
    let mut out: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether an entry of `node.status.volumesAttached` (e.g.
/// `kubernetes.io/csi/ebs.csi.aws.com^vol-123`) names the volume id `vol-123`.
pub fn attached_name_matches(attached_name: &str, id: &str) -> bool {
    if id.is_empty() {
        return false;
    }
    attached_name == id
        || attached_name
            .strip_suffix(id)
            .is_some_and(|prefix| prefix.ends_with(['^', '/', ':']))
}

fn va_pv(va: &VolumeAttachment) -> Option<&str> {
    va.spec.source.persistent_volume_name.as_deref()
}

fn va_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

/// The tracked volumes still attached to `node_name`: listed in `node.status.volumesAttached`,
/// or with an attached VolumeAttachment to that node. A missing node has nothing attached.
pub fn still_attached(
    node: Option<&Node>,
    attachments: &[Arc<VolumeAttachment>],
    node_name: &str,
    volumes: &[TrackedVolume],
) -> Vec<TrackedVolume> {
    let Some(node) = node else {
        return Vec::new();
    };
    let in_status: Vec<&str> = node
        .status
        .iter()
        .flat_map(|s| s.volumes_attached.iter().flatten())
        .map(|a| a.name.as_str())
        .collect();
    volumes
        .iter()
        .filter(|v| {
            in_status
                .iter()
                .any(|name| attached_name_matches(name, &v.id))
                || attachments.iter().any(|va| {
                    va.spec.node_name == node_name && va_pv(va) == Some(&v.pv) && va_attached(va)
                })
        })
        .cloned()
        .collect()
}

/// The tracked volumes not yet attached to another node than `node_name`.
pub fn not_reattached(
    attachments: &[Arc<VolumeAttachment>],
    node_name: &str,
    volumes: &[TrackedVolume],
) -> Vec<TrackedVolume> {
    volumes
        .iter()
        .filter(|v| {
            !attachments.iter().any(|va| {
                va.spec.node_name != node_name && va_pv(va) == Some(&v.pv) && va_attached(va)
            })
        })
        .cloned()
        .collect()
}

/// Resolves claims of a namespace to tracked volumes: PVC -> bound PV -> driver volume id.
/// Missing claims or volumes, unbound claims and volumes the driver does not recognise are
/// skipped (nothing to wait for).
pub(crate) async fn resolve(
    client: &kube::Client,
    driver: &Arc<dyn Driver>,
    namespace: &str,
    claims: &[String],
) -> Result<Vec<TrackedVolume>, DrainError> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut out = Vec::new();
    for claim in claims {
        let pvc = pvcs.get_opt(claim).await.map_err(|e| {
            DrainError::kube(format!("get PersistentVolumeClaim {namespace}/{claim}"), e)
        })?;
        let Some(pv_name) = pvc
            .and_then(|c| c.spec)
            .and_then(|s| s.volume_name)
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let Some(pv) = pvs
            .get_opt(&pv_name)
            .await
            .map_err(|e| DrainError::kube(format!("get PersistentVolume {pv_name}"), e))?
        else {
            continue;
        };
        let Some(spec) = pv.spec else { continue };
        let response = driver
            .get_volume_ids(GetVolumeIdsRequest {
                pv_specs: vec![spec],
                request_id: RequestId::generate(),
            })
            .await
            .map_err(DrainError::Driver)?;
        if let Some(id) = response.volume_ids.into_iter().find(|id| !id.is_empty()) {
            out.push(TrackedVolume { pv: pv_name, id });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        AttachedVolume, NodeStatus, PersistentVolumeClaimVolumeSource, PodSpec, Volume,
    };
    use k8s_openapi::api::storage::v1::{
        VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
    };

    fn pod(name: &str, claims: &[&str]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.spec = Some(PodSpec {
            volumes: Some(
                claims
                    .iter()
                    .map(|c| Volume {
                        name: c.to_string(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: c.to_string(),
                            read_only: None,
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    }

    fn vol(pv: &str, id: &str) -> TrackedVolume {
        TrackedVolume {
            pv: pv.into(),
            id: id.into(),
        }
    }

    fn va(pv: &str, node: &str, attached: bool) -> Arc<VolumeAttachment> {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some(format!("{pv}-{node}"));
        va.spec = VolumeAttachmentSpec {
            attacher: "fake.csi".into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        };
        va.status = Some(VolumeAttachmentStatus {
            attached,
            ..Default::default()
        });
        Arc::new(va)
    }

    fn node_with(attached: &[&str]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.status = Some(NodeStatus {
            volumes_attached: Some(
                attached
                    .iter()
                    .map(|a| AttachedVolume {
                        name: a.to_string(),
                        device_path: String::new(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    #[test]
    fn shared_claims_are_not_tracked() {
        let a = pod("a", &["data-a", "shared"]);
        let b = pod("b", &["shared"]);
        let ds = pod("ds", &["data-ds", "data-a-too"]);
        let mut staying_user = pod("stay", &["data-b"]);
        staying_user.metadata.name = Some("stay".into());
        let c = pod("c", &["data-b", "data-c"]);
        let claims = unshared_claims(&[&a, &b, &c], &[&ds, &staying_user]);
        assert_eq!(claims["ns/a"], vec!["data-a"]);
        assert!(claims["ns/b"].is_empty());
        assert_eq!(claims["ns/c"], vec!["data-c"]);
    }

    #[test]
    fn attached_names_match_on_a_separator() {
        assert!(attached_name_matches(
            "kubernetes.io/csi/fake^vol-1",
            "vol-1"
        ));
        assert!(attached_name_matches(
            "kubernetes.io/aws-ebs/aws://eu-1a/vol-1",
            "vol-1"
        ));
        assert!(attached_name_matches("vol-1", "vol-1"));
        assert!(!attached_name_matches(
            "kubernetes.io/csi/fake^vol-10",
            "vol-1"
        ));
        assert!(!attached_name_matches(
            "kubernetes.io/csi/fake^xvol-1",
            "vol-1"
        ));
        assert!(!attached_name_matches("anything", ""));
    }

    #[test]
    fn attachment_comes_from_node_status_or_volume_attachments() {
        let volumes = [
            vol("pv-1", "vol-1"),
            vol("pv-2", "vol-2"),
            vol("pv-3", "vol-3"),
        ];
        let node = node_with(&["kubernetes.io/csi/fake^vol-1"]);
        let vas = [
            va("pv-2", "n1", true),
            va("pv-3", "n1", false),
            va("pv-3", "n2", true),
        ];
        assert_eq!(
            still_attached(Some(&node), &vas, "n1", &volumes),
            vec![vol("pv-1", "vol-1"), vol("pv-2", "vol-2")]
        );
        assert!(still_attached(None, &vas, "n1", &volumes).is_empty());
        assert!(still_attached(Some(&node_with(&[])), &[], "n1", &volumes).is_empty());
    }

    #[test]
    fn reattachment_needs_an_attached_volume_attachment_elsewhere() {
        let volumes = [vol("pv-1", "vol-1"), vol("pv-2", "vol-2")];
        let vas = [
            va("pv-1", "n2", true),
            va("pv-2", "n1", true),
            va("pv-2", "n3", false),
        ];
        assert_eq!(
            not_reattached(&vas, "n1", &volumes),
            vec![vol("pv-2", "vol-2")]
        );
    }

    #[test]
    fn volumes_display_id_and_pv() {
        assert_eq!(
            vol("pv-1", "vol-1").to_string(),
            "vol-1 (PersistentVolume pv-1)"
        );
    }
}
