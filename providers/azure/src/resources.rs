//! The resources of a machine: names, ids and the ARM bodies of its NIC and VM.
//!
//! A machine `m` is a NIC `m-nic`, a VM `m`, an OS disk `m-os-disk` and data disks
//! `m-<name>-<lun>-data-disk` (`m-<lun>-data-disk` without a name), as Gardener's provider names
//! them, so every step of a create finds what an earlier attempt made, and a delete finds every
//! leftover even when the VM is gone. The bodies are pure functions of the spec, written in
//! ARM's JSON shape.

use base64::Engine as _;
use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use serde_json::{Map, Value, json};

use crate::spec::{DataDisk, ImageReference, ProviderSpec};

/// The name of the Azure Disk CSI driver.
pub const DISK_CSI_DRIVER: &str = "disk.csi.azure.com";
/// Suffix of a machine's NIC.
pub const NIC_SUFFIX: &str = "-nic";
/// Suffix of a machine's OS disk.
pub const OS_DISK_SUFFIX: &str = "-os-disk";
/// Suffix of a machine's data disks.
pub const DATA_DISK_SUFFIX: &str = "-data-disk";

/// The NIC of machine `vm`.
pub fn nic_name(vm: &str) -> String {
    format!("{vm}{NIC_SUFFIX}")
}

/// The OS disk of machine `vm`.
pub fn os_disk_name(vm: &str) -> String {
    format!("{vm}{OS_DISK_SUFFIX}")
}

/// A data disk of machine `vm`.
pub fn data_disk_name(vm: &str, disk: &DataDisk) -> String {
    if disk.name.trim().is_empty() {
        format!("{vm}-{}{DATA_DISK_SUFFIX}", disk.lun)
    } else {
        format!("{vm}-{}-{}{DATA_DISK_SUFFIX}", disk.name, disk.lun)
    }
}

/// Every disk name of machine `vm` under `spec`.
pub fn disk_names(vm: &str, spec: &ProviderSpec) -> Vec<String> {
    let mut out = vec![os_disk_name(vm)];
    out.extend(
        spec.properties
            .storage_profile
            .data_disks
            .iter()
            .map(|d| data_disk_name(vm, d)),
    );
    out
}

/// What a resource of the cluster belongs to: the machine a VM, NIC or disk name is derived
/// from (`None` for names this driver does not make).
pub fn machine_of(kind: ResourceType, name: &str, spec: &ProviderSpec) -> Option<String> {
    match kind {
        ResourceType::Vm => Some(name.to_string()),
        ResourceType::Nic => name.strip_suffix(NIC_SUFFIX).map(str::to_string),
        ResourceType::Disk => {
            if let Some(vm) = name.strip_suffix(OS_DISK_SUFFIX) {
                return Some(vm.to_string());
            }
            spec.properties
                .storage_profile
                .data_disks
                .iter()
                .find_map(|d| {
                    let suffix = data_disk_name("", d);
                    name.strip_suffix(&suffix).map(str::to_string)
                })
        }
    }
    .filter(|m| !m.is_empty())
}

/// The ARM resource types of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResourceType {
    /// `Microsoft.Compute/virtualMachines`.
    Vm,
    /// `Microsoft.Network/networkInterfaces`.
    Nic,
    /// `Microsoft.Compute/disks`.
    Disk,
}

/// The API version of `Microsoft.Compute`'s virtual machines and marketplace images (that of
/// the legacy Azure SDK's `azure_mgmt_compute` 0.21 default tag, whose wire format the golden
/// requests were captured with).
pub const COMPUTE_API_VERSION: &str = "2024-07-01";
/// The API version of `Microsoft.Compute/disks` (the same SDK's disks).
pub const DISK_API_VERSION: &str = "2024-03-02";
/// The API version of `Microsoft.Network` (`azure_mgmt_network` 0.21's default tag).
pub const NETWORK_API_VERSION: &str = "2024-03-01";

impl ResourceType {
    /// The resource provider's type, e.g. `Microsoft.Compute/virtualMachines`.
    pub fn provider_type(self) -> &'static str {
        match self {
            ResourceType::Vm => "Microsoft.Compute/virtualMachines",
            ResourceType::Nic => "Microsoft.Network/networkInterfaces",
            ResourceType::Disk => "Microsoft.Compute/disks",
        }
    }

    /// The type's name in ARM paths and in the driver's messages, e.g. `virtualMachines`.
    pub fn name(self) -> &'static str {
        match self {
            ResourceType::Vm => "virtualMachines",
            ResourceType::Nic => "networkInterfaces",
            ResourceType::Disk => "disks",
        }
    }

    /// The API version the driver speaks for the type.
    pub fn api_version(self) -> &'static str {
        match self {
            ResourceType::Vm => COMPUTE_API_VERSION,
            ResourceType::Nic => NETWORK_API_VERSION,
            ResourceType::Disk => DISK_API_VERSION,
        }
    }
}

/// The ARM id of a resource.
pub fn resource_id(subscription: &str, group: &str, kind: ResourceType, name: &str) -> String {
    format!(
        "/subscriptions/{subscription}/resourceGroups/{group}/providers/{}/{name}",
        kind.provider_type()
    )
}

/// The ARM path (with its query) of a resource.
pub fn resource_path(subscription: &str, group: &str, kind: ResourceType, name: &str) -> String {
    format!(
        "{}?api-version={}",
        resource_id(subscription, group, kind, name),
        kind.api_version()
    )
}

/// The ARM path (with its query) of the list of a resource group's resources of `kind`.
pub fn list_path(subscription: &str, group: &str, kind: ResourceType) -> String {
    format!(
        "/subscriptions/{subscription}/resourceGroups/{group}/providers/{}?api-version={}",
        kind.provider_type(),
        kind.api_version()
    )
}

/// The ARM path (with its query) of a marketplace image version in `location`.
pub fn vm_image_path(subscription: &str, location: &str, urn: &crate::spec::Urn) -> String {
    format!(
        "/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}/publishers/{}\
         /artifacttypes/vmimage/offers/{}/skus/{}/versions/{}?api-version={COMPUTE_API_VERSION}",
        urn.publisher, urn.offer, urn.sku, urn.version
    )
}

/// The provider id of machine `vm`: `azure:///<location>/<vm>` (as Gardener's provider writes it).
pub fn provider_id(location: &str, vm: &str) -> String {
    format!("azure:///{location}/{vm}")
}

/// The ARM id of the subnet of the machines' NICs.
pub fn subnet_id(subscription: &str, spec: &ProviderSpec) -> String {
    format!(
        "/subscriptions/{subscription}/resourceGroups/{}/providers/Microsoft.Network/virtualNetworks/{}/subnets/{}",
        spec.vnet_resource_group(),
        spec.subnet_info.vnet_name,
        spec.subnet_info.subnet_name
    )
}

/// The body of the NIC PUT.
pub fn nic_body(spec: &ProviderSpec, subscription: &str, vm: &str) -> Value {
    let name = nic_name(vm);
    let mut props = Map::new();
    if let Some(a) = spec.properties.network_profile.accelerated_networking {
        props.insert("enableAcceleratedNetworking".into(), json!(a));
    }
    props.insert("enableIPForwarding".into(), json!(true));
    props.insert("nicType".into(), json!("Standard"));
    props.insert(
        "ipConfigurations".into(),
        json!([{
            "name": name,
            "properties": {
                "privateIPAllocationMethod": "Dynamic",
                "subnet": { "id": subnet_id(subscription, spec) },
            }
        }]),
    );
    json!({ "location": spec.location, "tags": spec.tags, "properties": Value::Object(props) })
}

/// The image reference of a storage profile or disk.
fn image_reference(r: &crate::spec::ImageReference) -> Value {
    if !r.id.trim().is_empty() {
        return json!({ "id": r.id });
    }
    if let Some(id) = r
        .community_gallery_image_id
        .as_deref()
        .filter(|s| !s.trim().is_empty())
    {
        return json!({ "communityGalleryImageId": id });
    }
    if let Some(id) = r
        .shared_gallery_image_id
        .as_deref()
        .filter(|s| !s.trim().is_empty())
    {
        return json!({ "sharedGalleryImageId": id });
    }
    match r.urn_parts() {
        Some(u) => {
            json!({ "publisher": u.publisher, "offer": u.offer, "sku": u.sku, "version": u.version })
        }
        None => json!({}),
    }
}

/// The SSH public key of a machine: the class's, else [`unusable_ssh_key`] (Gardener's classes
/// have none when the shoot's SSH access is off, and Azure refuses a Linux VM without
/// password authentication and without a key).
pub fn ssh_key_data(spec: &ProviderSpec) -> String {
    let key = &spec
        .properties
        .os_profile
        .linux_configuration
        .ssh
        .public_keys
        .key_data;
    if key.trim().is_empty() {
        unusable_ssh_key()
    } else {
        key.clone()
    }
}

/// A fresh `ssh-ed25519` public key whose private half is dropped at once, so nobody can log
/// in with it (Gardener's provider does the same with an RSA key).
pub fn unusable_ssh_key() -> String {
    use ring::signature::KeyPair as _;
    let rng = ring::rand::SystemRandom::new();
    let public = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
        .ok()
        .and_then(|pkcs8| ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).ok())
        .map(|pair| pair.public_key().as_ref().to_vec())
        // The system's random source failing is not recoverable here; an all-zero key is
        // still a key nobody holds (no private key maps to it in practice).
        .unwrap_or_else(|| vec![0; 32]);
    let mut blob = Vec::with_capacity(51);
    for part in [b"ssh-ed25519".as_slice(), public.as_slice()] {
        blob.extend_from_slice(&(part.len() as u32).to_be_bytes());
        blob.extend_from_slice(part);
    }
    format!(
        "ssh-ed25519 {}",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

/// The `creationData` of a data disk made from `image`: `FromImage` with the image's id, or
/// its shared or community gallery image; a URN's platform image id (`urn_image_id`, read from
/// the image version) goes in as the id, as Gardener's provider does. Pure.
pub fn disk_creation_data(image: &ImageReference, urn_image_id: Option<&str>) -> Value {
    let some = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
    let reference = if !image.id.trim().is_empty() {
        json!({ "imageReference": { "id": image.id } })
    } else if let Some(id) = some(&image.shared_gallery_image_id) {
        json!({ "galleryImageReference": { "sharedGalleryImageId": id } })
    } else if let Some(id) = some(&image.community_gallery_image_id) {
        json!({ "galleryImageReference": { "communityGalleryImageId": id } })
    } else {
        json!({ "imageReference": { "id": urn_image_id.unwrap_or_default() } })
    };
    let mut data = json!({ "createOption": "FromImage" });
    if let (Some(out), Some(r)) = (data.as_object_mut(), reference.as_object()) {
        out.extend(r.clone());
    }
    data
}

/// The body of the PUT of data disk `d` made from an image (before the VM, which attaches it):
/// the class's location, tags and zone, its size and storage type, `creation_data`
/// ([`disk_creation_data`]). Pure.
pub fn disk_body(spec: &ProviderSpec, d: &DataDisk, creation_data: Value) -> Value {
    let mut body = json!({
        "location": spec.location,
        "tags": spec.tags,
        "sku": { "name": d.storage_account_type },
        "properties": {
            "creationData": creation_data,
            "diskSizeGB": d.disk_size_gb,
            "osType": "Linux",
        },
    });
    if let Some(zone) = spec.properties.zone {
        body["zones"] = json!([zone.to_string()]);
    }
    body
}

/// The API version of the Marketplace Ordering terms.
pub const MARKETPLACE_ORDERING_API_VERSION: &str = "2021-01-01";

/// The purchase plan of a marketplace image version (`properties.plan`: `name`, `product`,
/// `publisher`), if it has one. Pure.
pub fn image_plan(image: &Value) -> Option<Value> {
    let plan = image.pointer("/properties/plan")?;
    let field = |f: &str| {
        plan.get(f)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    Some(json!({
        "name": field("name")?,
        "product": field("product")?,
        "publisher": field("publisher")?,
    }))
}

/// The ARM path (with its query) of the marketplace terms of `plan`.
pub fn agreement_path(subscription: &str, plan: &Value) -> String {
    let field = |f: &str| plan[f].as_str().unwrap_or_default().to_string();
    format!(
        "/subscriptions/{subscription}/providers/Microsoft.MarketplaceOrdering/offerTypes/virtualmachine\
         /publishers/{}/offers/{}/plans/{}/agreements/current?api-version={MARKETPLACE_ORDERING_API_VERSION}",
        field("publisher"),
        field("product"),
        field("name"),
    )
}

/// Whether marketplace terms say they are accepted. Pure.
pub fn terms_accepted(terms: &Value) -> bool {
    terms.pointer("/properties/accepted") == Some(&Value::Bool(true))
}

/// The body of the VM PUT: the spec, the machine's NIC, OS disk and data disks (deleted with
/// the VM), the user data as `customData`, `ssh_key` as the admin user's SSH key
/// ([`ssh_key_data`]), the marketplace image's `plan` if it has one.
pub fn vm_body(
    spec: &ProviderSpec,
    subscription: &str,
    vm: &str,
    user_data: &[u8],
    ssh_key: &str,
    plan: Option<&Value>,
) -> Value {
    let p = &spec.properties;
    let sp = &p.storage_profile;
    let nic_id = resource_id(
        subscription,
        &spec.resource_group,
        ResourceType::Nic,
        &nic_name(vm),
    );
    let mut os_disk = json!({
        "name": os_disk_name(vm),
        "createOption": sp.os_disk.create_option,
        "caching": sp.os_disk.caching,
        "deleteOption": "Delete",
        "diskSizeGB": sp.os_disk.disk_size_gb,
        "managedDisk": { "storageAccountType": sp.os_disk.managed_disk.storage_account_type },
    });
    if let Some(t) = sp
        .os_disk
        .managed_disk
        .security_profile
        .as_ref()
        .and_then(|s| s.security_encryption_type.as_deref())
        .filter(|t| !t.trim().is_empty())
    {
        os_disk["managedDisk"]["securityProfile"] = json!({ "securityEncryptionType": t });
    }
    let data_disks: Vec<Value> = sp
        .data_disks
        .iter()
        .map(|d| {
            let name = data_disk_name(vm, d);
            let mut disk = json!({
                "name": name,
                "lun": d.lun,
                "createOption": "Empty",
                "caching": if d.caching.is_empty() { "None" } else { d.caching.as_str() },
                "deleteOption": "Delete",
                "diskSizeGB": d.disk_size_gb,
                "managedDisk": { "storageAccountType": d.storage_account_type },
            });
            if d.image_ref.is_some() {
                // Made from its image before the VM ([`disk_body`]), attached here.
                disk["createOption"] = json!("Attach");
                disk["managedDisk"]["id"] = json!(resource_id(
                    subscription,
                    &spec.resource_group,
                    ResourceType::Disk,
                    &name
                ));
            }
            disk
        })
        .collect();
    let mut storage = json!({
        "imageReference": image_reference(&sp.image_reference),
        "osDisk": os_disk,
    });
    // No data disks: no `dataDisks` key, as the SDK the wire format was anchored to sent it.
    if !data_disks.is_empty() {
        storage["dataDisks"] = Value::Array(data_disks);
    }
    if !sp.disk_controller_type.is_empty() {
        storage["diskControllerType"] = json!(sp.disk_controller_type);
    }
    let ssh = &p.os_profile.linux_configuration.ssh.public_keys;
    let linux = json!({
        "disablePasswordAuthentication": p.os_profile.linux_configuration.disable_password_authentication,
        "ssh": { "publicKeys": [{ "path": ssh.path, "keyData": ssh_key }] },
    });
    let mut props = json!({
        "hardwareProfile": { "vmSize": p.hardware_profile.vm_size },
        "networkProfile": { "networkInterfaces": [{
            "id": nic_id, "properties": { "primary": true, "deleteOption": "Delete" } }] },
        "osProfile": {
            "adminUsername": p.os_profile.admin_username,
            "computerName": vm,
            "customData": base64::engine::general_purpose::STANDARD.encode(user_data),
            "linuxConfiguration": linux,
        },
        "storageProfile": storage,
    });
    if let Some(a) = p
        .availability_set
        .as_ref()
        .filter(|a| !a.id.trim().is_empty())
    {
        props["availabilitySet"] = json!({ "id": a.id });
    }
    if let Some(s) = p
        .virtual_machine_scale_set
        .as_ref()
        .filter(|s| !s.id.trim().is_empty())
    {
        props["virtualMachineScaleSet"] = json!({ "id": s.id });
    }
    if let Some(d) = &p.diagnostics_profile {
        let mut b = json!({ "enabled": d.enabled });
        if let Some(uri) = &d.storage_uri {
            b["storageUri"] = json!(uri);
        }
        props["diagnosticsProfile"] = json!({ "bootDiagnostics": b });
    }
    if let Some(s) = &p.security_profile {
        let mut sec = Map::new();
        if let Some(t) = &s.security_type {
            sec.insert("securityType".into(), json!(t));
        }
        if let Some(u) = &s.uefi_settings {
            let mut uefi = Map::new();
            if let Some(b) = u.secure_boot_enabled {
                uefi.insert("secureBootEnabled".into(), json!(b));
            }
            if let Some(b) = u.vtpm_enabled {
                uefi.insert("vTpmEnabled".into(), json!(b));
            }
            sec.insert("uefiSettings".into(), Value::Object(uefi));
        }
        props["securityProfile"] = Value::Object(sec);
    }
    if let Some(id) = p
        .capacity_reservation
        .as_ref()
        .and_then(|c| c.capacity_reservation_group_id.as_deref())
    {
        props["capacityReservation"] = json!({ "capacityReservationGroup": { "id": id } });
    }
    let mut body = json!({ "location": spec.location, "tags": spec.tags, "properties": props });
    if let Some(zone) = p.zone {
        body["zones"] = json!([zone.to_string()]);
    }
    if let Some(id) = p.identity_id.as_deref().filter(|s| !s.trim().is_empty()) {
        body["identity"] = json!({ "type": "UserAssigned", "userAssignedIdentities": { id: {} } });
    }
    if let Some(plan) = plan {
        body["plan"] = plan.clone();
    }
    body
}

/// The Azure disk id of a PersistentVolume, if it is an Azure disk: in-tree
/// `azureDisk.diskName`, or a `disk.csi.azure.com` CSI `volumeHandle` as it is.
pub fn volume_id(spec: &PersistentVolumeSpec) -> Option<String> {
    if let Some(d) = &spec.azure_disk {
        return (!d.disk_name.is_empty()).then(|| d.disk_name.clone());
    }
    spec.csi
        .as_ref()
        .filter(|csi| csi.driver == DISK_CSI_DRIVER && !csi.volume_handle.trim().is_empty())
        .map(|csi| csi.volume_handle.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_provider_spec;
    use crate::spec::tests::gardener_spec;
    use pretty_assertions::assert_eq;

    fn spec() -> ProviderSpec {
        let class = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "providerSpec": gardener_spec()}),
        )
        .unwrap();
        parse_provider_spec(&class).unwrap()
    }

    #[test]
    fn names_and_ids() {
        let s = spec();
        assert_eq!(nic_name("m-0"), "m-0-nic");
        assert_eq!(
            disk_names("m-0", &s),
            vec!["m-0-os-disk", "m-0-data-0-data-disk"]
        );
        let unnamed = DataDisk {
            lun: 3,
            ..Default::default()
        };
        assert_eq!(data_disk_name("m-0", &unnamed), "m-0-3-data-disk");
        assert_eq!(provider_id("westeurope", "m-0"), "azure:///westeurope/m-0");
        assert_eq!(
            resource_id("sub", "rg", ResourceType::Nic, "m-0-nic"),
            "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/m-0-nic"
        );
        assert_eq!(
            machine_of(ResourceType::Nic, "m-0-nic", &s).as_deref(),
            Some("m-0")
        );
        assert_eq!(
            machine_of(ResourceType::Disk, "m-0-os-disk", &s).as_deref(),
            Some("m-0")
        );
        assert_eq!(
            machine_of(ResourceType::Disk, "m-0-data-0-data-disk", &s).as_deref(),
            Some("m-0")
        );
        assert_eq!(
            machine_of(ResourceType::Disk, "someone-elses-disk", &s),
            None
        );
        assert_eq!(machine_of(ResourceType::Nic, "-nic", &s), None);
    }

    #[test]
    fn a_class_without_an_ssh_key_gets_a_fresh_key_nobody_holds() {
        let mut s = spec();
        assert_eq!(ssh_key_data(&s), "ssh-rsa AAAA");
        s.properties
            .os_profile
            .linux_configuration
            .ssh
            .public_keys
            .key_data = " ".into();
        let (a, b) = (ssh_key_data(&s), ssh_key_data(&s));
        assert_ne!(a, b, "a fresh key each time");
        let blob = base64::engine::general_purpose::STANDARD
            .decode(a.strip_prefix("ssh-ed25519 ").expect("an ssh-ed25519 key"))
            .unwrap();
        assert_eq!(blob.len(), 4 + 11 + 4 + 32);
        assert_eq!(&blob[4..15], b"ssh-ed25519");
        let vm = vm_body(&s, "sub", "m-0", b"", &a, None);
        assert_eq!(
            vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"],
            a.as_str()
        );
    }

    #[test]
    fn the_nic_and_vm_bodies_are_what_gardeners_provider_sends() {
        let s = spec();
        let nic = nic_body(&s, "sub", "m-0");
        assert_eq!(
            nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"],
            "/subscriptions/sub/resourceGroups/shoot--a--b/providers/Microsoft.Network/virtualNetworks/shoot--a--b/subnets/shoot--a--b-nodes"
        );
        assert_eq!(nic["properties"]["enableAcceleratedNetworking"], true);
        assert_eq!(nic["tags"]["kubernetes.io-role-node"], "1");
        let vm = vm_body(
            &s,
            "sub",
            "m-0",
            b"#cloud-config\n",
            &ssh_key_data(&s),
            None,
        );
        assert_eq!(vm["zones"], json!(["2"]));
        assert_eq!(vm["identity"]["type"], "UserAssigned");
        let p = &vm["properties"];
        assert_eq!(p["osProfile"]["customData"], "I2Nsb3VkLWNvbmZpZwo=");
        assert_eq!(p["osProfile"]["computerName"], "m-0");
        assert_eq!(
            p["storageProfile"]["imageReference"],
            json!({"publisher": "sap", "offer": "gardenlinux", "sku": "greatest", "version": "1443.3.0"})
        );
        assert_eq!(p["storageProfile"]["osDisk"]["name"], "m-0-os-disk");
        assert_eq!(p["storageProfile"]["osDisk"]["deleteOption"], "Delete");
        assert_eq!(
            p["storageProfile"]["dataDisks"][0]["name"],
            "m-0-data-0-data-disk"
        );
        assert_eq!(
            p["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"],
            "Delete"
        );
        assert_eq!(
            p["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["path"],
            "/home/core/.ssh/authorized_keys"
        );
    }

    #[test]
    fn volume_ids() {
        let pvs: Vec<PersistentVolumeSpec> = serde_json::from_value(json!([
            {"azureDisk": {"diskName": "d1", "diskURI": "/subscriptions/s/d1"}},
            {"csi": {"driver": "disk.csi.azure.com", "volumeHandle": "/subscriptions/s/disks/d2"}},
            {"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "x"}}
        ]))
        .unwrap();
        let ids: Vec<String> = pvs.iter().filter_map(volume_id).collect();
        assert_eq!(ids, vec!["d1", "/subscriptions/s/disks/d2"]);
    }
}
