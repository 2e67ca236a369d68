//! The Azure providerSpec (Gardener's `AzureProviderSpec` JSON field names) and its validation.
//!
//! [`parse_provider_spec`] decodes a MachineClass's `providerSpec` (and moves the deprecated
//! `properties.machineSet` into `availabilitySet` / `virtualMachineScaleSet`, as Gardener's
//! provider does); [`ProviderSpec::validate`] and [`credentials`] return *every* problem at
//! once, with Gardener's field paths and messages (data disks are indexed here:
//! `dataDisks[1].lun` instead of `dataDisks.lun`).

use std::collections::{BTreeMap, BTreeSet};

use mcm_api::MachineClass;
use mcm_driver::{SecretData, SpecError, SpecProblem, USER_DATA_KEY};
use serde::{Deserialize, Serialize};

/// The provider name in error messages.
pub const PROVIDER: &str = "Azure";
/// Prefix of the tag key naming the cluster.
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io-cluster-";
/// Prefix of the tag key naming the node role.
pub const ROLE_TAG_PREFIX: &str = "kubernetes.io-role-";
/// Cloud names of `cloudConfiguration.name`.
pub const CLOUDS: [&str; 3] = ["AzurePublic", "AzureChina", "AzureGovernment"];
/// Kinds of the deprecated `machineSet`.
pub const MACHINE_SET_KINDS: [&str; 2] = ["availabilityset", "vmo"];

/// The providerSpec of an Azure MachineClass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// The Azure location (region), e.g. `westeurope`.
    #[serde(default)]
    pub location: String,
    /// Tags of the VM, its NIC and disks; must hold a `kubernetes.io-cluster-*` and a
    /// `kubernetes.io-role-*` key.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The VM's properties.
    #[serde(default)]
    pub properties: VmProperties,
    /// The resource group of the machines.
    #[serde(default)]
    pub resource_group: String,
    /// The subnet of the machines' NICs.
    #[serde(default)]
    pub subnet_info: SubnetInfo,
    /// The Azure cloud (public by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_configuration: Option<CloudConfiguration>,
}

/// The subnet of the NICs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubnetInfo {
    /// The virtual network.
    #[serde(default)]
    pub vnet_name: String,
    /// The virtual network's resource group (default: the spec's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vnet_resource_group: Option<String>,
    /// The subnet.
    #[serde(default)]
    pub subnet_name: String,
}

/// The Azure cloud.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CloudConfiguration {
    /// `AzurePublic`, `AzureChina` or `AzureGovernment`.
    #[serde(default)]
    pub name: String,
}

/// The VM's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmProperties {
    /// The size.
    #[serde(default)]
    pub hardware_profile: HardwareProfile,
    /// Image and disks.
    #[serde(default)]
    pub storage_profile: StorageProfile,
    /// Admin user and SSH key.
    #[serde(default)]
    pub os_profile: OsProfile,
    /// Accelerated networking.
    #[serde(default)]
    pub network_profile: NetworkProfile,
    /// The availability set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_set: Option<SubResource>,
    /// A user-assigned managed identity (resource id).
    #[serde(
        default,
        rename = "identityID",
        alias = "identityId",
        skip_serializing_if = "Option::is_none"
    )]
    pub identity_id: Option<String>,
    /// The availability zone (a number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<i64>,
    /// The VM scale set (flexible orchestration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_scale_set: Option<SubResource>,
    /// Boot diagnostics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics_profile: Option<DiagnosticsProfile>,
    /// Deprecated: an availability set or VM scale set by kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_set: Option<MachineSetConfig>,
    /// Trusted launch / confidential VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_profile: Option<SecurityProfile>,
    /// A capacity reservation group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<CapacityReservation>,
}

/// A reference by resource id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubResource {
    /// The resource id.
    #[serde(default)]
    pub id: String,
}

/// The deprecated machine set reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineSetConfig {
    /// The resource id.
    #[serde(default)]
    pub id: String,
    /// `availabilityset` or `vmo`.
    #[serde(default)]
    pub kind: String,
}

/// A capacity reservation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityReservation {
    /// The capacity reservation group's resource id.
    #[serde(
        default,
        rename = "capacityReservationGroupID",
        skip_serializing_if = "Option::is_none"
    )]
    pub capacity_reservation_group_id: Option<String>,
}

/// The VM's security profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityProfile {
    /// `TrustedLaunch` or `ConfidentialVM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_type: Option<String>,
    /// UEFI settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi_settings: Option<UefiSettings>,
}

/// UEFI settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UefiSettings {
    /// Virtual TPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtpm_enabled: Option<bool>,
    /// Secure boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot_enabled: Option<bool>,
}

/// Boot diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiagnosticsProfile {
    /// Enabled.
    #[serde(default)]
    pub enabled: bool,
    /// The storage account URI (managed storage when absent).
    #[serde(
        default,
        rename = "storageURI",
        skip_serializing_if = "Option::is_none"
    )]
    pub storage_uri: Option<String>,
}

/// The VM size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfile {
    /// E.g. `Standard_D2s_v5`.
    #[serde(default)]
    pub vm_size: String,
}

/// Image and disks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfile {
    /// The image.
    #[serde(default)]
    pub image_reference: ImageReference,
    /// `SCSI` or `NVMe`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub disk_controller_type: String,
    /// The OS disk.
    #[serde(default)]
    pub os_disk: OsDisk,
    /// Data disks.
    #[serde(default)]
    pub data_disks: Vec<DataDisk>,
}

/// An image: exactly one of `id`, `urn`, `communityGalleryImageID`, `sharedGalleryImageID`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageReference {
    /// A managed image or gallery image version id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// `publisher:offer:sku:version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urn: Option<String>,
    /// Do not accept the marketplace agreement (and send no plan).
    #[serde(default)]
    pub skip_marketplace_agreement: bool,
    /// A community gallery image id.
    #[serde(
        default,
        rename = "communityGalleryImageID",
        skip_serializing_if = "Option::is_none"
    )]
    pub community_gallery_image_id: Option<String>,
    /// A shared gallery image id.
    #[serde(
        default,
        rename = "sharedGalleryImageID",
        skip_serializing_if = "Option::is_none"
    )]
    pub shared_gallery_image_id: Option<String>,
}

/// The parts of a marketplace image URN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Urn {
    /// Publisher.
    pub publisher: String,
    /// Offer.
    pub offer: String,
    /// SKU.
    pub sku: String,
    /// Version.
    pub version: String,
}

impl ImageReference {
    /// The URN's parts, if the image is a (well-formed) URN.
    pub fn urn_parts(&self) -> Option<Urn> {
        let urn = self.urn.as_deref()?.trim();
        let parts: Vec<&str> = urn.split(':').collect();
        match parts.as_slice() {
            [p, o, s, v] if parts.iter().all(|x| !x.trim().is_empty()) => Some(Urn {
                publisher: p.to_string(),
                offer: o.to_string(),
                sku: s.to_string(),
                version: v.to_string(),
            }),
            _ => None,
        }
    }

    /// The URN whose marketplace plan and terms a create looks at: a URN image without
    /// `skipMarketPlaceAgreement` (as Gardener's provider decides).
    pub fn marketplace_urn(&self) -> Option<Urn> {
        if self.skip_marketplace_agreement {
            return None;
        }
        self.urn_parts()
    }

    fn set(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.id.trim().is_empty() {
            out.push("id");
        }
        if self.urn.as_deref().is_some_and(|u| !u.trim().is_empty()) {
            out.push("urn");
        }
        if self
            .community_gallery_image_id
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
        {
            out.push("communityGalleryImageID");
        }
        if self
            .shared_gallery_image_id
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
        {
            out.push("sharedGalleryImageID");
        }
        out
    }

    fn validate(&self, at: &str, out: &mut Vec<SpecProblem>) {
        let set = self.set();
        if set.len() != 1 {
            out.push(SpecProblem::new(
                at,
                format!(
                    "must specify only one of image id, community gallery image id, shared gallery image id or an urn (got {})",
                    if set.is_empty() { "none".to_string() } else { set.join(", ") }
                ),
            ));
            return;
        }
        if let Some(urn) = self.urn.as_deref().filter(|u| !u.trim().is_empty()) {
            let parts: Vec<&str> = urn.split(':').collect();
            if parts.len() != 4 {
                out.push(SpecProblem::new(
                    format!("{at}.urn"),
                    "invalid urn format, urn should be of the format publisher:offer:sku:version",
                ));
            } else {
                for (part, name) in parts.iter().zip(["publisher", "offer", "sku", "version"]) {
                    if part.trim().is_empty() {
                        out.push(SpecProblem::new(
                            format!("{at}.urn"),
                            format!("urn must have {name}"),
                        ));
                    }
                }
            }
        }
    }
}

/// The OS disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsDisk {
    /// `None`, `ReadOnly` or `ReadWrite`.
    #[serde(default)]
    pub caching: String,
    /// The managed disk.
    #[serde(default)]
    pub managed_disk: ManagedDisk,
    /// Size in GB.
    #[serde(default, rename = "diskSizeGB")]
    pub disk_size_gb: i64,
    /// E.g. `FromImage`.
    #[serde(default)]
    pub create_option: String,
    /// Accepted and unused, as Gardener's driver leaves it unused (the OS disk is named after the machine).
    #[serde(default, skip_serializing)]
    pub name: Option<serde_json::Value>,
}

/// A managed disk's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedDisk {
    /// E.g. `Premium_LRS`.
    #[serde(default)]
    pub storage_account_type: String,
    /// Confidential VM disk encryption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_profile: Option<DiskSecurityProfile>,
    /// Accepted and unused, as Gardener's driver leaves it unused (a new disk has no id yet).
    #[serde(default, skip_serializing)]
    pub id: Option<serde_json::Value>,
}

/// A disk's security profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskSecurityProfile {
    /// `DiskWithVMGuestState` or `VMGuestStateOnly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_encryption_type: Option<String>,
}

/// A data disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataDisk {
    /// Part of the disk's name (`<machine>-<name>-<lun>-data-disk`).
    #[serde(default)]
    pub name: String,
    /// The LUN (unique per VM).
    #[serde(default)]
    pub lun: i32,
    /// Caching (default `None`).
    #[serde(default)]
    pub caching: String,
    /// E.g. `StandardSSD_LRS`.
    #[serde(default)]
    pub storage_account_type: String,
    /// Size in GB.
    #[serde(default, rename = "diskSizeGB")]
    pub disk_size_gb: i64,
    /// Create the disk from an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<ImageReference>,
}

/// Admin user and SSH key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsProfile {
    /// The admin user.
    #[serde(default)]
    pub admin_username: String,
    /// Linux settings.
    #[serde(default)]
    pub linux_configuration: LinuxConfiguration,
    /// Accepted and unused, as Gardener's driver leaves it unused (password login is disabled).
    #[serde(default, skip_serializing)]
    pub admin_password: Option<serde_json::Value>,
    /// Accepted and unused, as Gardener's driver leaves it unused (the computer is named after the machine).
    #[serde(default, skip_serializing)]
    pub computer_name: Option<serde_json::Value>,
    /// Accepted and unused, as Gardener's driver leaves it unused (the user data comes from the Secret).
    #[serde(default, skip_serializing)]
    pub custom_data: Option<serde_json::Value>,
}

/// Linux settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinuxConfiguration {
    /// No password login.
    #[serde(default)]
    pub disable_password_authentication: bool,
    /// SSH.
    #[serde(default)]
    pub ssh: SshConfiguration,
}

/// SSH settings (one public key, as Gardener's spec has it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshConfiguration {
    /// The public key.
    #[serde(default)]
    pub public_keys: SshPublicKey,
}

/// An SSH public key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKey {
    /// Where it goes, e.g. `/home/core/.ssh/authorized_keys`.
    #[serde(default)]
    pub path: String,
    /// The key.
    #[serde(default)]
    pub key_data: String,
}

/// Accelerated networking.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    /// Enable accelerated networking on the NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerated_networking: Option<bool>,
    /// Accepted and unused, as Gardener's driver leaves it unused (the NIC is created for the machine).
    #[serde(default, skip_serializing)]
    pub network_interfaces: Option<serde_json::Value>,
}

/// The keys of the class's providerSpec that Gardener's Go driver would ignore, and so do we
/// (admission warnings, the class's Event).
pub fn class_warnings(class: &MachineClass) -> Vec<String> {
    mcm_driver::spec::class_warnings::<ProviderSpec>(class, PROVIDER)
}

/// Decodes the providerSpec of `class` as Gardener's Go driver decodes it (keys matched
/// ignoring case, unknown keys ignored: [`class_warnings`] names them), no validation; a
/// deprecated `machineSet` is moved into `availabilitySet` (kind `availabilityset`) or
/// `virtualMachineScaleSet` (kind `vmo`).
pub fn parse_provider_spec(class: &MachineClass) -> Result<ProviderSpec, SpecError> {
    let mut spec: ProviderSpec = mcm_driver::spec::decode_provider_spec(class, PROVIDER)?.value;
    let p = &mut spec.properties;
    if let Some(ms) = p.machine_set.clone() {
        match ms.kind.as_str() {
            "vmo" if p.virtual_machine_scale_set.is_none() => {
                p.virtual_machine_scale_set = Some(SubResource { id: ms.id })
            }
            "availabilityset" if p.availability_set.is_none() => {
                p.availability_set = Some(SubResource { id: ms.id })
            }
            _ => {}
        }
    }
    Ok(spec)
}

const SPEC: &str = "providerSpec";

/// The tag keys naming a cluster and a role, by which the machines' resources are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTags {
    /// The `kubernetes.io-cluster-*` key.
    pub cluster: String,
    /// The `kubernetes.io-role-*` key.
    pub role: String,
}

impl ClusterTags {
    /// The cluster and role tag keys among `tags`, or `None` if either is missing.
    pub fn from_tags<'a>(
        tags: impl IntoIterator<Item = &'a String> + Clone,
    ) -> Option<ClusterTags> {
        let first = |prefix: &str| {
            tags.clone()
                .into_iter()
                .find(|k| k.starts_with(prefix))
                .cloned()
        };
        Some(ClusterTags {
            cluster: first(CLUSTER_TAG_PREFIX)?,
            role: first(ROLE_TAG_PREFIX)?,
        })
    }

    /// Whether a resource with tag keys `keys` is the cluster's (both keys present).
    pub fn matches<'a>(&self, keys: impl IntoIterator<Item = &'a String>) -> bool {
        let keys: BTreeSet<&String> = keys.into_iter().collect();
        keys.contains(&self.cluster) && keys.contains(&self.role)
    }
}

impl ProviderSpec {
    /// Every problem of the spec (empty: valid).
    pub fn validate(&self) -> Vec<SpecProblem> {
        let mut out = Vec::new();
        let required = |v: &str| v.trim().is_empty();
        if required(&self.location) {
            out.push(SpecProblem::new(
                format!("{SPEC}.location"),
                "must provide a location",
            ));
        }
        if required(&self.resource_group) {
            out.push(SpecProblem::new(
                format!("{SPEC}.resourceGroup"),
                "must provide a resourceGroup",
            ));
        }
        if required(&self.subnet_info.vnet_name) {
            out.push(SpecProblem::new(
                format!("{SPEC}.subnetInfo.vnetName"),
                "must provide vnetName",
            ));
        }
        if required(&self.subnet_info.subnet_name) {
            out.push(SpecProblem::new(
                format!("{SPEC}.subnetInfo.subnetName"),
                "must provide subnetName",
            ));
        }
        let p = &self.properties;
        let props = format!("{SPEC}.properties");
        if let Some(ms) = &p.machine_set
            && !MACHINE_SET_KINDS.contains(&ms.kind.as_str())
        {
            out.push(SpecProblem::new(
                format!("{props}.machineSet.kind"),
                format!(
                    "unsupported value {:?}: supported values: \"availabilityset\", \"vmo\"",
                    ms.kind
                ),
            ));
        }
        if required(&p.hardware_profile.vm_size) {
            out.push(SpecProblem::new(
                format!("{props}.hardwareProfile.vmSize"),
                "must provide vmSize",
            ));
        }
        let storage = format!("{props}.storageProfile");
        p.storage_profile
            .image_reference
            .validate(&format!("{storage}.imageReference"), &mut out);
        let dct = &p.storage_profile.disk_controller_type;
        if !dct.is_empty() && !["NVMe", "SCSI"].contains(&dct.as_str()) {
            out.push(SpecProblem::new(
                format!("{storage}.diskControllerType"),
                format!("unsupported value {dct:?}: supported values: \"NVMe\", \"SCSI\""),
            ));
        }
        let os = &p.storage_profile.os_disk;
        if required(&os.create_option) {
            out.push(SpecProblem::new(
                format!("{storage}.osDisk.createOption"),
                "must provide createOption",
            ));
        }
        if os.disk_size_gb <= 0 {
            out.push(SpecProblem::new(
                format!("{storage}.osDisk.diskSizeGB"),
                "OSDisk size must be positive and greater than 0",
            ));
        }
        if let Some(t) = os
            .managed_disk
            .security_profile
            .as_ref()
            .and_then(|s| s.security_encryption_type.as_deref())
            .filter(|t| !t.trim().is_empty())
            && !["DiskWithVMGuestState", "VMGuestStateOnly"].contains(&t)
        {
            out.push(SpecProblem::new(
                format!("{storage}.osDisk.managedDisk.securityProfile.securityEncryptionType"),
                format!("unsupported value {t:?}: supported values: \"DiskWithVMGuestState\", \"VMGuestStateOnly\""),
            ));
        }
        let mut luns: BTreeMap<i32, usize> = BTreeMap::new();
        for (i, d) in p.storage_profile.data_disks.iter().enumerate() {
            let at = |f: &str| format!("{storage}.dataDisks[{i}].{f}");
            if d.lun < 0 {
                out.push(SpecProblem::new(at("lun"), "lun must be a positive number"));
            }
            *luns.entry(d.lun).or_default() += 1;
            if d.disk_size_gb <= 0 {
                out.push(SpecProblem::new(
                    at("diskSizeGB"),
                    "DataDisk size must be positive and greater than 0",
                ));
            }
            if required(&d.storage_account_type) {
                out.push(SpecProblem::new(
                    at("storageAccountType"),
                    "must provide storageAccountType",
                ));
            }
            if let Some(r) = &d.image_ref {
                r.validate(&at("imageRef"), &mut out);
            }
        }
        for (lun, n) in luns.iter().filter(|(_, n)| **n > 1) {
            out.push(SpecProblem::new(
                format!("{storage}.dataDisks"),
                format!("DataDisk Lun '{lun}' duplicated {n} times, Lun must be unique"),
            ));
        }
        if required(&p.os_profile.admin_username) {
            out.push(SpecProblem::new(
                format!("{props}.osProfile.adminUsername"),
                "adminUsername must be provided",
            ));
        }
        let placements = [
            p.zone.is_some(),
            p.availability_set
                .as_ref()
                .is_some_and(|s| !s.id.trim().is_empty()),
            p.virtual_machine_scale_set
                .as_ref()
                .is_some_and(|s| !s.id.trim().is_empty()),
        ];
        if placements.iter().filter(|x| **x).count() != 1 {
            out.push(SpecProblem::new(
                format!("{props}.zone"),
                "Only one of Zone, AvailabilitySet and VirtualMachineScaleSet can be set.",
            ));
        }
        if let Some(id) = p
            .capacity_reservation
            .as_ref()
            .and_then(|c| c.capacity_reservation_group_id.as_deref())
            && !id
                .to_ascii_lowercase()
                .contains("/providers/microsoft.compute/capacityreservationgroups/")
        {
            out.push(SpecProblem::new(
                format!("{props}.capacityReservation.capacityReservationGroupID"),
                format!(
                    "provided resource ID must be of type 'CapacityReservationGroups', got {id:?}"
                ),
            ));
        }
        if let Some(t) = p
            .security_profile
            .as_ref()
            .and_then(|s| s.security_type.as_deref())
            .filter(|t| !t.trim().is_empty())
            && !["ConfidentialVM", "TrustedLaunch"].contains(&t)
        {
            out.push(SpecProblem::new(
                format!("{props}.securityProfile.securityType"),
                format!("unsupported value {t:?}: supported values: \"ConfidentialVM\", \"TrustedLaunch\""),
            ));
        }
        if !self.tags.keys().any(|k| k.starts_with(CLUSTER_TAG_PREFIX)) {
            out.push(SpecProblem::new(
                format!("{SPEC}.tags.{CLUSTER_TAG_PREFIX}"),
                format!("Tag starting with {CLUSTER_TAG_PREFIX} must be set"),
            ));
        }
        if !self.tags.keys().any(|k| k.starts_with(ROLE_TAG_PREFIX)) {
            out.push(SpecProblem::new(
                format!("{SPEC}.tags.{ROLE_TAG_PREFIX}"),
                format!("Tag starting with {ROLE_TAG_PREFIX} must be set"),
            ));
        }
        if let Some(c) = &self.cloud_configuration
            && !CLOUDS.contains(&c.name.as_str())
        {
            out.push(SpecProblem::new(
                format!("{SPEC}.cloudConfiguration.name"),
                format!(
                    "unsupported value {:?}: supported values: \"AzurePublic\", \"AzureChina\", \"AzureGovernment\"",
                    c.name
                ),
            ));
        }
        out
    }

    /// The resource group of the virtual network.
    pub fn vnet_resource_group(&self) -> &str {
        self.subnet_info
            .vnet_resource_group
            .as_deref()
            .filter(|g| !g.trim().is_empty())
            .unwrap_or(&self.resource_group)
    }
}

/// The secret key naming the federated token file of workload identity.
pub const WORKLOAD_IDENTITY_TOKEN_FILE: &str = "workloadIdentityTokenFile";

/// The service principal of a class's secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The subscription.
    pub subscription_id: String,
    /// The tenant.
    pub tenant_id: String,
    /// The client (application) id.
    pub client_id: String,
    /// How the application proves who it is.
    pub auth: Auth,
}

/// How a service principal authenticates.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// With its client secret (`clientSecret`).
    ClientSecret(String),
    /// With workload identity: the federated token in `token_file` (`workloadIdentityTokenFile`,
    /// a file mounted into the controller's container and refreshed there) is the client
    /// assertion.
    WorkloadIdentity {
        /// The path of the token file.
        token_file: String,
    },
}

impl std::fmt::Debug for Auth {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::ClientSecret(_) => f.write_str("ClientSecret(..)"),
            Auth::WorkloadIdentity { token_file } => f
                .debug_struct("WorkloadIdentity")
                .field("token_file", token_file)
                .finish(),
        }
    }
}

impl std::fmt::Debug for Credentials {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("subscription_id", &self.subscription_id)
            .field("tenant_id", &self.tenant_id)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// The first of `keys` present in the secret, trimmed.
fn first_present(secret: &SecretData, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| secret.get_str(k))
        .map(|v| v.trim().to_string())
}

/// Reads the service principal of `secret`, or every problem with it (and with `userData`
/// when `need_user_data`).
pub fn credentials(
    secret: &SecretData,
    need_user_data: bool,
) -> Result<Credentials, Vec<SpecProblem>> {
    let mut problems = Vec::new();
    let mut take = |keys: &[&str], field: &str, what: &str| {
        let v = first_present(secret, keys).unwrap_or_default();
        if v.is_empty() {
            problems.push(SpecProblem::new(
                format!("secretRef.{field}"),
                what.to_string(),
            ));
        }
        v
    };
    let client_id = take(
        &["clientID", "azureClientId"],
        "clientID",
        "must provide clientID",
    );
    let subscription_id = take(
        &["subscriptionID", "azureSubscriptionId"],
        "subscriptionID",
        "must provide subscriptionID",
    );
    let tenant_id = take(
        &["tenantID", "azureTenantId"],
        "tenantID",
        "must provide tenantID",
    );
    let client_secret =
        first_present(secret, &["clientSecret", "azureClientSecret"]).unwrap_or_default();
    let token_file = first_present(secret, &[WORKLOAD_IDENTITY_TOKEN_FILE]).unwrap_or_default();
    // As Gardener's provider validates them: one or the other.
    let auth = match (client_secret.is_empty(), token_file.is_empty()) {
        (false, true) => Some(Auth::ClientSecret(client_secret)),
        (true, false) => Some(Auth::WorkloadIdentity { token_file }),
        (false, false) => {
            problems.push(SpecProblem::new(
                "secretRef.clientSecret",
                format!("clientSecret is mutually exclusive with {WORKLOAD_IDENTITY_TOKEN_FILE}"),
            ));
            None
        }
        (true, true) => {
            problems.push(SpecProblem::new(
                "secretRef.clientSecret",
                format!("must provide clientSecret or {WORKLOAD_IDENTITY_TOKEN_FILE}"),
            ));
            None
        }
    };
    if need_user_data && secret.get(USER_DATA_KEY).is_none() {
        problems.push(SpecProblem::new(
            format!("secretRef.{USER_DATA_KEY}"),
            "must provide userData",
        ));
    }
    match auth {
        Some(auth) if problems.is_empty() => Ok(Credentials {
            subscription_id,
            tenant_id,
            client_id,
            auth,
        }),
        _ => Err(problems),
    }
}

fn provider_problem(class: &MachineClass) -> Option<SpecProblem> {
    let p = class.provider.as_deref()?;
    (!p.eq_ignore_ascii_case(PROVIDER)).then(|| {
        SpecProblem::new(
            "provider",
            format!(
                "Request for provider {p} cannot be fulfilled. Only Azure provider is supported."
            ),
        )
    })
}

/// The problems of a class's providerSpec, for the admission webhook (no secret, no cloud
/// call): a class of another provider has none here.
pub fn class_problems(class: &MachineClass) -> Vec<SpecProblem> {
    mcm_driver::spec::class_problems(class, PROVIDER, parse_provider_spec, ProviderSpec::validate)
}

/// Decodes and validates a class and its secret for creating a machine (every problem).
pub fn checked_spec(
    class: &MachineClass,
    secret: &SecretData,
) -> Result<(ProviderSpec, Credentials), SpecError> {
    let spec = parse_provider_spec(class)?;
    let mut problems: Vec<SpecProblem> = provider_problem(class).into_iter().collect();
    problems.extend(spec.validate());
    let creds = credentials(secret, true);
    match creds {
        Ok(c) if problems.is_empty() => Ok((spec, c)),
        Ok(_) => Err(SpecError::Invalid {
            provider: PROVIDER,
            problems,
        }),
        Err(p) => {
            problems.extend(p);
            Err(SpecError::Invalid {
                provider: PROVIDER,
                problems,
            })
        }
    }
}

/// Decodes and validates what finding and deleting machines needs (location, resource group,
/// cluster and role tags, credentials), so a class that became invalid otherwise does not block
/// deleting its machines.
pub fn lookup_spec(
    class: &MachineClass,
    secret: &SecretData,
) -> Result<(ProviderSpec, ClusterTags, Credentials), SpecError> {
    let spec = parse_provider_spec(class)?;
    let mut problems: Vec<SpecProblem> = provider_problem(class).into_iter().collect();
    if spec.location.trim().is_empty() {
        problems.push(SpecProblem::new(
            format!("{SPEC}.location"),
            "must provide a location",
        ));
    }
    if spec.resource_group.trim().is_empty() {
        problems.push(SpecProblem::new(
            format!("{SPEC}.resourceGroup"),
            "must provide a resourceGroup",
        ));
    }
    let tags = ClusterTags::from_tags(spec.tags.keys());
    if tags.is_none() {
        problems.push(SpecProblem::new(
            format!("{SPEC}.tags"),
            format!("tags starting with {CLUSTER_TAG_PREFIX} and {ROLE_TAG_PREFIX} must be set"),
        ));
    }
    let creds = credentials(secret, false)
        .map_err(|p| problems.extend(p))
        .ok();
    match (tags, creds) {
        (Some(t), Some(c)) if problems.is_empty() => Ok((spec, t, c)),
        _ => Err(SpecError::Invalid {
            provider: PROVIDER,
            problems,
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// A valid spec as Gardener writes one.
    pub(crate) fn gardener_spec() -> serde_json::Value {
        json!({
            "location": "westeurope",
            "resourceGroup": "shoot--a--b",
            "subnetInfo": {"vnetName": "shoot--a--b", "subnetName": "shoot--a--b-nodes"},
            "tags": {"Name": "shoot--a--b", "kubernetes.io-cluster-shoot--a--b": "1", "kubernetes.io-role-node": "1"},
            "properties": {
                "hardwareProfile": {"vmSize": "Standard_D2s_v5"},
                "storageProfile": {
                    "imageReference": {"urn": "sap:gardenlinux:greatest:1443.3.0"},
                    "osDisk": {"caching": "None", "diskSizeGB": 50, "createOption": "FromImage",
                               "managedDisk": {"storageAccountType": "Premium_LRS"}},
                    "dataDisks": [{"name": "data", "lun": 0, "caching": "None",
                                   "storageAccountType": "StandardSSD_LRS", "diskSizeGB": 100}]
                },
                "osProfile": {"adminUsername": "core", "linuxConfiguration": {
                    "disablePasswordAuthentication": true,
                    "ssh": {"publicKeys": {"path": "/home/core/.ssh/authorized_keys", "keyData": "ssh-rsa AAAA"}}}},
                "networkProfile": {"acceleratedNetworking": true},
                "zone": 2,
                "identityID": "/subscriptions/s/resourceGroups/g/providers/Microsoft.ManagedIdentity/userAssignedIdentities/i"
            },
            "someFutureField": 1
        })
    }

    fn class(spec: serde_json::Value) -> MachineClass {
        serde_json::from_value(
            json!({"metadata": {"name": "c"}, "provider": "Azure", "providerSpec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn gardener_spec_decodes_with_its_field_names() {
        let s = parse_provider_spec(&class(gardener_spec())).unwrap();
        assert_eq!(s.properties.zone, Some(2));
        assert_eq!(s.properties.storage_profile.os_disk.disk_size_gb, 50);
        assert_eq!(s.properties.storage_profile.data_disks[0].lun, 0);
        assert_eq!(
            s.properties
                .os_profile
                .linux_configuration
                .ssh
                .public_keys
                .path,
            "/home/core/.ssh/authorized_keys"
        );
        assert!(s.properties.identity_id.is_some());
        assert_eq!(s.vnet_resource_group(), "shoot--a--b");
        let urn = s
            .properties
            .storage_profile
            .image_reference
            .urn_parts()
            .unwrap();
        assert_eq!(
            (urn.publisher.as_str(), urn.version.as_str()),
            ("sap", "1443.3.0")
        );
        assert_eq!(s.validate(), vec![]);
        let tags = ClusterTags::from_tags(s.tags.keys()).unwrap();
        assert_eq!(tags.cluster, "kubernetes.io-cluster-shoot--a--b");
        assert!(tags.matches(s.tags.keys()));
    }

    #[test]
    fn the_deprecated_machine_set_moves_to_its_field() {
        let mut v = gardener_spec();
        v["properties"].as_object_mut().unwrap().remove("zone");
        v["properties"]["machineSet"] = json!({"id": "/subscriptions/s/vmss", "kind": "vmo"});
        let s = parse_provider_spec(&class(v)).unwrap();
        assert_eq!(
            s.properties.virtual_machine_scale_set.as_ref().unwrap().id,
            "/subscriptions/s/vmss"
        );
        assert_eq!(s.validate(), vec![]);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let s = parse_provider_spec(&class(json!({
            "tags": {"a": "b"},
            "properties": {
                "storageProfile": {
                    "imageReference": {"urn": "a:b:c"},
                    "osDisk": {"diskSizeGB": 0},
                    "dataDisks": [{"lun": 1, "diskSizeGB": 1, "storageAccountType": "x"},
                                  {"lun": 1, "diskSizeGB": 0}]
                },
                "machineSet": {"id": "x", "kind": "vmss"},
                "zone": 1,
                "availabilitySet": {"id": "/as"},
                "securityProfile": {"securityType": "Bogus"}
            },
            "cloudConfiguration": {"name": "Mars"}
        })))
        .unwrap();
        let got: Vec<String> = s.validate().into_iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "providerSpec.location: must provide a location",
                "providerSpec.resourceGroup: must provide a resourceGroup",
                "providerSpec.subnetInfo.vnetName: must provide vnetName",
                "providerSpec.subnetInfo.subnetName: must provide subnetName",
                "providerSpec.properties.machineSet.kind: unsupported value \"vmss\": supported values: \"availabilityset\", \"vmo\"",
                "providerSpec.properties.hardwareProfile.vmSize: must provide vmSize",
                "providerSpec.properties.storageProfile.imageReference.urn: invalid urn format, urn should be of the format publisher:offer:sku:version",
                "providerSpec.properties.storageProfile.osDisk.createOption: must provide createOption",
                "providerSpec.properties.storageProfile.osDisk.diskSizeGB: OSDisk size must be positive and greater than 0",
                "providerSpec.properties.storageProfile.dataDisks[1].diskSizeGB: DataDisk size must be positive and greater than 0",
                "providerSpec.properties.storageProfile.dataDisks[1].storageAccountType: must provide storageAccountType",
                "providerSpec.properties.storageProfile.dataDisks: DataDisk Lun '1' duplicated 2 times, Lun must be unique",
                "providerSpec.properties.osProfile.adminUsername: adminUsername must be provided",
                "providerSpec.properties.zone: Only one of Zone, AvailabilitySet and VirtualMachineScaleSet can be set.",
                "providerSpec.properties.securityProfile.securityType: unsupported value \"Bogus\": supported values: \"ConfidentialVM\", \"TrustedLaunch\"",
                "providerSpec.tags.kubernetes.io-cluster-: Tag starting with kubernetes.io-cluster- must be set",
                "providerSpec.tags.kubernetes.io-role-: Tag starting with kubernetes.io-role- must be set",
                "providerSpec.cloudConfiguration.name: unsupported value \"Mars\": supported values: \"AzurePublic\", \"AzureChina\", \"AzureGovernment\"",
            ]
        );
        let mut v = gardener_spec();
        v["properties"]["storageProfile"]["imageReference"] =
            json!({"id": "/img", "urn": "a:b:c:d"});
        let got = parse_provider_spec(&class(v)).unwrap().validate();
        assert_eq!(got.len(), 1);
        assert!(got[0].detail.contains("got id, urn"), "{got:?}");
    }

    #[test]
    fn what_this_driver_does_not_make_yet_is_refused() {
        let mut v = gardener_spec();
        v["properties"]["storageProfile"]["dataDisks"][0]["imageRef"] = json!({"id": "/img"});
        assert_eq!(
            parse_provider_spec(&class(v.clone())).unwrap().validate(),
            vec![]
        );
        // A data disk's image is checked as the VM's is.
        v["properties"]["storageProfile"]["dataDisks"][0]["imageRef"] =
            json!({"id": "/img", "urn": "a:b:c:d"});
        let got = parse_provider_spec(&class(v)).unwrap().validate();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].field,
            "providerSpec.properties.storageProfile.dataDisks[0].imageRef"
        );
    }

    #[test]
    fn a_secret_has_a_client_secret_or_a_workload_identity_token_file() {
        let base = [
            ("clientID", "c"),
            ("tenantID", "t"),
            ("subscriptionID", "s"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = base.to_vec();
            pairs.extend_from_slice(extra);
            credentials(&secret(&pairs), false)
        };
        assert_eq!(
            with(&[("workloadIdentityTokenFile", "/var/run/token")])
                .unwrap()
                .auth,
            Auth::WorkloadIdentity {
                token_file: "/var/run/token".into()
            }
        );
        assert_eq!(
            with(&[("clientSecret", "x")]).unwrap().auth,
            Auth::ClientSecret("x".into())
        );
        let both = with(&[("clientSecret", "x"), ("workloadIdentityTokenFile", "/t")]);
        assert_eq!(
            both.unwrap_err()[0].detail,
            "clientSecret is mutually exclusive with workloadIdentityTokenFile"
        );
        let neither = with(&[]);
        assert_eq!(
            neither.unwrap_err()[0].detail,
            "must provide clientSecret or workloadIdentityTokenFile"
        );
    }

    fn secret(pairs: &[(&str, &str)]) -> SecretData {
        SecretData::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn credentials_with_either_key_spelling() {
        let c = credentials(
            &secret(&[
                ("azureClientId", "c"),
                ("azureClientSecret", "s"),
                ("azureTenantId", "t"),
                ("azureSubscriptionId", "sub"),
                ("userData", "x"),
            ]),
            true,
        )
        .unwrap();
        assert_eq!(
            (c.client_id.as_str(), c.subscription_id.as_str()),
            ("c", "sub")
        );
        assert!(
            !format!("{c:?}").contains("\"s\""),
            "the secret is never printed"
        );
        let p: Vec<String> = credentials(&secret(&[("clientID", " ")]), true)
            .unwrap_err()
            .into_iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            p,
            vec![
                "secretRef.clientID: must provide clientID",
                "secretRef.subscriptionID: must provide subscriptionID",
                "secretRef.tenantID: must provide tenantID",
                "secretRef.clientSecret: must provide clientSecret or workloadIdentityTokenFile",
                "secretRef.userData: must provide userData",
            ]
        );
    }
}
