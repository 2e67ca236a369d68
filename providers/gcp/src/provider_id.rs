//! Provider ids `gce:///<project>/<zone>/<name>` and GCE disk ids of PersistentVolumes.

use k8s_openapi::api::core::v1::PersistentVolumeSpec;

/// The name of the GCE persistent-disk CSI driver.
pub const PD_CSI_DRIVER: &str = "pd.csi.storage.gke.io";

/// Where an instance lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRef {
    /// The project.
    pub project: String,
    /// The zone.
    pub zone: String,
    /// The instance name.
    pub name: String,
}

impl InstanceRef {
    /// The provider id: `gce:///<project>/<zone>/<name>` (as Gardener's provider and the
    /// Kubernetes GCE cloud provider write it).
    pub fn provider_id(&self) -> String {
        format!("gce:///{}/{}/{}", self.project, self.zone, self.name)
    }
}

/// A provider id that is not `gce:///<project>/<zone>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a GCE provider id (gce:///<project>/<zone>/<name>)")]
pub struct ProviderIdError(pub String);

/// The instance a provider id names.
pub fn decode_provider_id(provider_id: &str) -> Result<InstanceRef, ProviderIdError> {
    let err = || ProviderIdError(provider_id.to_string());
    let rest = provider_id.strip_prefix("gce://").ok_or_else(err)?;
    let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [project, zone, name] if !project.is_empty() && !zone.is_empty() && !name.is_empty() => {
            Ok(InstanceRef {
                project: project.to_string(),
                zone: zone.to_string(),
                name: name.to_string(),
            })
        }
        _ => Err(err()),
    }
}

/// The GCE disk id of a PersistentVolume, if it is a GCE persistent disk: in-tree
/// `gcePersistentDisk.pdName`, or a `pd.csi.storage.gke.io` CSI `volumeHandle` as it is
/// (`projects/<p>/zones/<z>/disks/<name>`), as Gardener's provider reports them.
pub fn volume_id(spec: &PersistentVolumeSpec) -> Option<String> {
    if let Some(pd) = &spec.gce_persistent_disk {
        return (!pd.pd_name.is_empty()).then(|| pd.pd_name.clone());
    }
    spec.csi
        .as_ref()
        .filter(|csi| csi.driver == PD_CSI_DRIVER && !csi.volume_handle.is_empty())
        .map(|csi| csi.volume_handle.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource};

    #[test]
    fn provider_ids_round_trip() {
        let r = InstanceRef {
            project: "p-1".into(),
            zone: "europe-west1-b".into(),
            name: "m-0".into(),
        };
        assert_eq!(r.provider_id(), "gce:///p-1/europe-west1-b/m-0");
        assert_eq!(decode_provider_id(&r.provider_id()).unwrap(), r);
        for bad in [
            "aws:///r/i-1",
            "gce:///p/z",
            "gce:///p//n",
            "gce:///p/z/n/x",
            "",
        ] {
            assert!(decode_provider_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volume_ids() {
        let in_tree = PersistentVolumeSpec {
            gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                pd_name: "disk-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(volume_id(&in_tree).as_deref(), Some("disk-1"));
        let csi = |driver: &str| PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: "projects/p/zones/z/disks/d".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            volume_id(&csi(PD_CSI_DRIVER)).as_deref(),
            Some("projects/p/zones/z/disks/d")
        );
        assert_eq!(volume_id(&csi("ebs.csi.aws.com")), None);
        assert_eq!(volume_id(&PersistentVolumeSpec::default()), None);
    }
}
