//! Provider ids `aws:///<region>/<instance-id>` and EBS volume ids of PersistentVolumes.

use k8s_openapi::api::core::v1::PersistentVolumeSpec;

/// The name of the EBS CSI driver.
pub const EBS_CSI_DRIVER: &str = "ebs.csi.aws.com";

/// The provider id of an instance: `aws:///<region>/<instance-id>`.
pub fn encode_provider_id(region: &str, instance_id: &str) -> String {
    format!("aws:///{region}/{instance_id}")
}

/// A provider id that is not `aws:///<region-or-zone>/<instance-id>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an AWS provider id (aws:///<region>/<instance-id>)")]
pub struct ProviderIdError(pub String);

/// The instance id of a provider id. Accepts `aws:///<region>/<id>` (MCM) and
/// `aws:///<zone>/<id>` (the Kubernetes cloud provider).
pub fn decode_provider_id(provider_id: &str) -> Result<&str, ProviderIdError> {
    let err = || ProviderIdError(provider_id.to_string());
    let rest = provider_id.strip_prefix("aws://").ok_or_else(err)?;
    let id = rest.rsplit('/').next().ok_or_else(err)?;
    let valid = id
        .strip_prefix("i-")
        .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_alphanumeric()));
    if valid { Ok(id) } else { Err(err()) }
}

/// The EBS volume id of a PersistentVolume, if it is an EBS volume: in-tree
/// `awsElasticBlockStore.volumeID` (`aws://<zone>/vol-...` or `vol-...`) or an
/// `ebs.csi.aws.com` CSI `volumeHandle`.
pub fn volume_id(spec: &PersistentVolumeSpec) -> Option<String> {
    if let Some(ebs) = &spec.aws_elastic_block_store {
        let id = ebs.volume_id.rsplit('/').next().unwrap_or_default();
        return (!id.is_empty()).then(|| id.to_string());
    }
    spec.csi
        .as_ref()
        .filter(|csi| csi.driver == EBS_CSI_DRIVER && !csi.volume_handle.is_empty())
        .map(|csi| csi.volume_handle.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource};

    #[test]
    fn provider_ids_round_trip() {
        let id = encode_provider_id("eu-west-1", "i-0abc");
        assert_eq!(id, "aws:///eu-west-1/i-0abc");
        assert_eq!(decode_provider_id(&id), Ok("i-0abc"));
        assert_eq!(decode_provider_id("aws:///eu-west-1a/i-12"), Ok("i-12"));
        for bad in [
            "",
            "gce:///p/z/i-1",
            "aws:///eu-west-1/",
            "aws:///eu-west-1/vol-1",
            "aws:///r/i-",
            "aws:///r/i-1/../x",
        ] {
            assert!(decode_provider_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ebs_volumes_are_recognised_in_tree_and_csi() {
        let in_tree = PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "aws://eu-west-1a/vol-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(volume_id(&in_tree).as_deref(), Some("vol-1"));
        let bare = PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "vol-2".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(volume_id(&bare).as_deref(), Some("vol-2"));
        let csi = |driver: &str| PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: "vol-3".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(volume_id(&csi(EBS_CSI_DRIVER)).as_deref(), Some("vol-3"));
        assert_eq!(volume_id(&csi("pd.csi.storage.gke.io")), None);
        assert_eq!(volume_id(&PersistentVolumeSpec::default()), None);
    }
}
