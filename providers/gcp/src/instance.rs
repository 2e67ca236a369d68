//! The `instances.insert` body of a machine, and what an instance tells about a machine.
//!
//! [`insert_body`] is a pure function of the spec, the project, the machine name and the user
//! data, written in the REST shape of the Compute API (so a test can compare it with what
//! Gardener's provider sends) and then read into the client's model ([`to_model`]).

use google_cloud_compute_v1::model::Instance;
use google_cloud_compute_v1::model::instance::Status;
use k8s_openapi::api::core::v1::NodeAddress;
use mcm_driver::{ResourceKind, ResourceState, ResourceStatus};
use serde_json::{Map, Value, json};

use crate::spec::{
    DISK_TYPE_SCRATCH, ProviderSpec, STARTUP_SCRIPT_METADATA_KEY, USER_DATA_METADATA_KEY,
};

/// The label Gardener's GCP extension puts on every instance of a shoot (its technical id,
/// sanitised), since gardener-extension-provider-gcp v1.34 (January 2024).
pub const CLUSTER_NAME_LABEL: &str = "k8s-cluster-name";

/// The server-side filter of the instance listing: the class's [`CLUSTER_NAME_LABEL`] when
/// it has one, so Compute sends only this cluster's instances instead of the whole
/// project's. `None` (no filter) for a class without that label: the network tags that
/// identify a cluster's instances cannot be filtered by Compute, so they are checked on
/// every listed instance either way.
pub fn list_filter(spec: &ProviderSpec) -> Option<String> {
    let value = spec.labels.get(CLUSTER_NAME_LABEL)?;
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    Some(format!("labels.{CLUSTER_NAME_LABEL} = \"{escaped}\""))
}

/// The metadata key user data goes under: `user-data` for cloud-config, else
/// `startup-script` (as Gardener's provider decides).
pub fn user_data_key(user_data: &str) -> &'static str {
    if user_data.starts_with("#cloud-config") {
        USER_DATA_METADATA_KEY
    } else {
        STARTUP_SCRIPT_METADATA_KEY
    }
}

/// The body of `instances.insert` for machine `name` (REST JSON, camelCase, int64 as strings).
pub fn insert_body(spec: &ProviderSpec, project: &str, name: &str, user_data: &str) -> Value {
    let zone = &spec.zone;
    let mut body = Map::new();
    body.insert("name".into(), json!(name));
    body.insert(
        "machineType".into(),
        json!(format!("zones/{zone}/machineTypes/{}", spec.machine_type)),
    );
    body.insert("canIpForward".into(), json!(spec.can_ip_forward));
    body.insert("deletionProtection".into(), json!(spec.deletion_protection));
    if let Some(d) = &spec.description {
        body.insert("description".into(), json!(d));
    }
    if let Some(p) = spec.min_cpu_platform.as_deref().filter(|p| !p.is_empty()) {
        body.insert("minCpuPlatform".into(), json!(p));
    }
    if !spec.labels.is_empty() {
        body.insert("labels".into(), json!(spec.labels));
    }
    body.insert("tags".into(), json!({ "items": spec.tags }));
    body.insert(
        "scheduling".into(),
        json!({
            "automaticRestart": spec.scheduling.automatic_restart,
            "onHostMaintenance": spec.scheduling.on_host_maintenance,
            "preemptible": spec.scheduling.preemptible,
        }),
    );
    if let Some(gpu) = &spec.gpu {
        body.insert(
            "guestAccelerators".into(),
            json!([{
                "acceleratorType": format!("projects/{project}/zones/{zone}/acceleratorTypes/{}", gpu.accelerator_type),
                "acceleratorCount": gpu.count,
            }]),
        );
    }
    if let Some(s) = &spec.shielded_instance_configuration {
        let mut c = Map::new();
        for (key, v) in [
            ("enableIntegrityMonitoring", s.integrity_monitoring),
            ("enableSecureBoot", s.secure_boot),
            ("enableVtpm", s.vtpm),
        ] {
            if let Some(v) = v {
                c.insert(key.into(), json!(v));
            }
        }
        body.insert("shieldedInstanceConfig".into(), Value::Object(c));
    }
    if let Some(a) = &spec.advanced_machine_features {
        body.insert(
            "advancedMachineFeatures".into(),
            json!({ "enableNestedVirtualization": a.enable_nested_virtualization }),
        );
    }
    body.insert(
        "disks".into(),
        Value::Array(spec.disks.iter().map(|d| disk(d, zone)).collect()),
    );
    let mut items = vec![json!({ "key": user_data_key(user_data), "value": user_data })];
    items.extend(
        spec.metadata
            .iter()
            .map(|m| json!({ "key": m.key, "value": m.value })),
    );
    body.insert("metadata".into(), json!({ "items": items }));
    body.insert(
        "networkInterfaces".into(),
        Value::Array(
            spec.network_interfaces
                .iter()
                .map(|n| network_interface(n, project, &spec.region))
                .collect(),
        ),
    );
    if !spec.service_accounts.is_empty() {
        body.insert(
            "serviceAccounts".into(),
            Value::Array(
                spec.service_accounts
                    .iter()
                    .map(|s| json!({ "email": s.email, "scopes": s.scopes }))
                    .collect(),
            ),
        );
    }
    Value::Object(body)
}

fn disk(d: &crate::spec::Disk, zone: &str) -> Value {
    let mut out = Map::new();
    out.insert("autoDelete".into(), json!(d.auto_delete()));
    let mut params = Map::new();
    if d.is_scratch() {
        out.insert("type".into(), json!(DISK_TYPE_SCRATCH));
        out.insert("boot".into(), json!(false));
        out.insert("interface".into(), json!(d.interface));
        params.insert(
            "diskType".into(),
            json!(format!("zones/{zone}/diskTypes/local-ssd")),
        );
    } else {
        out.insert("type".into(), json!("PERSISTENT"));
        out.insert("boot".into(), json!(d.boot));
        if d.size_gb > 0 {
            params.insert("diskSizeGb".into(), json!(d.size_gb.to_string()));
        }
        if !d.disk_type.is_empty() {
            params.insert(
                "diskType".into(),
                json!(format!("zones/{zone}/diskTypes/{}", d.disk_type)),
            );
        }
        if !d.image.is_empty() {
            params.insert("sourceImage".into(), json!(d.image));
        }
        if !d.labels.is_empty() {
            params.insert("labels".into(), json!(d.labels));
        }
        if d.provisioned_iops > 0 {
            params.insert(
                "provisionedIops".into(),
                json!(d.provisioned_iops.to_string()),
            );
        }
        if d.provisioned_throughput > 0 {
            params.insert(
                "provisionedThroughput".into(),
                json!(d.provisioned_throughput.to_string()),
            );
        }
        if let Some(pool) = d.storage_pool.as_deref().filter(|p| !p.is_empty()) {
            params.insert("storagePool".into(), json!(pool));
        }
    }
    out.insert("initializeParams".into(), Value::Object(params));
    if let Some(enc) = &d.encryption {
        let mut key = Map::new();
        key.insert("kmsKeyName".into(), json!(enc.kms_key_name.trim()));
        if !enc.kms_key_service_account.trim().is_empty() {
            key.insert(
                "kmsKeyServiceAccount".into(),
                json!(enc.kms_key_service_account.trim()),
            );
        }
        out.insert("diskEncryptionKey".into(), Value::Object(key));
    }
    Value::Object(out)
}

fn network_interface(n: &crate::spec::NetworkInterface, project: &str, region: &str) -> Value {
    let mut out = Map::new();
    if !n.disable_external_ip {
        out.insert("accessConfigs".into(), json!([{}]));
    }
    if !n.network.is_empty() {
        out.insert(
            "network".into(),
            json!(format!("projects/{project}/global/networks/{}", n.network)),
        );
    }
    if !n.subnetwork.is_empty() {
        out.insert(
            "subnetwork".into(),
            json!(format!("regions/{region}/subnetworks/{}", n.subnetwork)),
        );
    }
    if n.stack_type == "IPV4_IPV6" || n.use_alias_ips {
        if !n.stack_type.is_empty() {
            out.insert("stackType".into(), json!(n.stack_type));
        }
        if !n.ipv6_access_type.is_empty() {
            out.insert("ipv6AccessType".into(), json!(n.ipv6_access_type));
        }
        out.insert(
            "aliasIpRanges".into(),
            json!([{ "ipCidrRange": n.ip_cidr_range, "subnetworkRangeName": n.subnetwork_range_name }]),
        );
    }
    Value::Object(out)
}

/// Reads a REST body into the client's model.
pub fn to_model(body: Value) -> Result<Instance, serde_json::Error> {
    serde_json::from_value(body)
}

/// The state of a VM of the given GCE status.
pub fn vm_state(status: Option<&Status>) -> ResourceState {
    match status {
        Some(Status::Provisioning | Status::Staging | Status::Pending) => ResourceState::Creating,
        Some(Status::Running) => ResourceState::Running,
        Some(
            Status::Stopping
            | Status::Stopped
            | Status::Suspending
            | Status::Suspended
            | Status::Terminated
            | Status::PendingStop,
        ) => ResourceState::Stopped,
        Some(Status::Deprovisioning) => ResourceState::Deleting,
        _ => ResourceState::Unknown,
    }
}

/// The name of a resource from its URL (`.../disks/name` → `name`).
fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// The resources of an instance: the VM (with its GCE status) and its attached disks.
pub fn resources(instance: &Instance) -> Vec<ResourceStatus> {
    let name = instance.name.clone().unwrap_or_default();
    let status_name = instance
        .status
        .as_ref()
        .and_then(|s| s.name())
        .unwrap_or("UNKNOWN");
    let mut out = vec![ResourceStatus {
        kind: ResourceKind::Vm,
        id: name,
        state: vm_state(instance.status.as_ref()),
        message: Some(match instance.status_message.as_deref() {
            Some(m) if !m.is_empty() => format!("{status_name}: {m}"),
            _ => status_name.to_string(),
        }),
    }];
    for d in &instance.disks {
        if let Some(source) = &d.source {
            out.push(ResourceStatus {
                kind: ResourceKind::Disk,
                id: last_segment(source).to_string(),
                state: ResourceState::Running,
                message: d.boot.unwrap_or(false).then(|| "boot disk".to_string()),
            });
        }
    }
    out
}

/// The addresses of an instance: internal IPs of its interfaces, external NAT IPs, and its
/// name as host name.
pub fn addresses(instance: &Instance) -> Vec<NodeAddress> {
    let address = |type_: &str, address: &str| NodeAddress {
        type_: type_.to_string(),
        address: address.to_string(),
    };
    let mut out = Vec::new();
    for nic in &instance.network_interfaces {
        if let Some(ip) = nic.network_ip.as_deref().filter(|s| !s.is_empty()) {
            out.push(address("InternalIP", ip));
        }
        for ac in &nic.access_configs {
            if let Some(ip) = ac.nat_ip.as_deref().filter(|s| !s.is_empty()) {
                out.push(address("ExternalIP", ip));
            }
        }
    }
    if let Some(name) = &instance.name {
        out.push(address("Hostname", name));
    }
    out
}

/// The network tags of an instance.
pub fn network_tags(instance: &Instance) -> &[String] {
    instance
        .tags
        .as_ref()
        .map(|t| t.items.as_slice())
        .unwrap_or(&[])
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_listing_filters_on_the_cluster_label_of_the_class_if_it_has_one() {
        let mut spec = ProviderSpec::default();
        assert_eq!(list_filter(&spec), None);
        spec.labels
            .insert(CLUSTER_NAME_LABEL.into(), "shoot--dev--my-shoot".into());
        assert_eq!(
            list_filter(&spec).as_deref(),
            Some(r#"labels.k8s-cluster-name = "shoot--dev--my-shoot""#)
        );
        spec.labels
            .insert(CLUSTER_NAME_LABEL.into(), r#"a"b\c"#.into());
        assert_eq!(
            list_filter(&spec).as_deref(),
            Some(r#"labels.k8s-cluster-name = "a\"b\\c""#)
        );
    }

    use super::*;
    use crate::spec::tests::gardener_spec;
    use pretty_assertions::assert_eq;

    fn spec() -> ProviderSpec {
        serde_json::from_value(gardener_spec()).unwrap()
    }

    #[test]
    fn the_insert_body_is_what_gardeners_provider_sends() {
        let body = insert_body(&spec(), "proj", "m-0", "#cloud-config\na: b\n");
        assert_eq!(
            body,
            json!({
                "name": "m-0",
                "machineType": "zones/europe-west1-b/machineTypes/n1-standard-2",
                "canIpForward": true,
                "deletionProtection": false,
                "description": "a worker",
                "labels": {"name": "shoot--a--b"},
                "tags": {"items": ["kubernetes-io-cluster-shoot--a--b", "kubernetes-io-role-node", "shoot--a--b"]},
                "scheduling": {"automaticRestart": true, "onHostMaintenance": "MIGRATE", "preemptible": false},
                "disks": [
                    {"autoDelete": true, "type": "PERSISTENT", "boot": true, "initializeParams": {
                        "diskSizeGb": "50", "diskType": "zones/europe-west1-b/diskTypes/pd-balanced",
                        "sourceImage": "projects/debian-cloud/global/images/family/debian-12",
                        "labels": {"name": "shoot--a--b"}}},
                    {"autoDelete": true, "type": "SCRATCH", "boot": false, "interface": "NVME",
                     "initializeParams": {"diskType": "zones/europe-west1-b/diskTypes/local-ssd"}}
                ],
                "metadata": {"items": [
                    {"key": "user-data", "value": "#cloud-config\na: b\n"},
                    {"key": "block-project-ssh-keys", "value": "TRUE"}
                ]},
                "networkInterfaces": [{
                    "accessConfigs": [{}],
                    "network": "projects/proj/global/networks/net",
                    "subnetwork": "regions/europe-west1/subnetworks/nodes",
                    "stackType": "IPV4_IPV6",
                    "ipv6AccessType": "EXTERNAL",
                    "aliasIpRanges": [{"ipCidrRange": "/24", "subnetworkRangeName": "pods"}]
                }],
                "serviceAccounts": [{"email": "sa@p.iam.gserviceaccount.com",
                                     "scopes": ["https://www.googleapis.com/auth/compute"]}]
            })
        );
        let model = to_model(body).expect("the client's model reads the body");
        assert_eq!(
            model.disks[0]
                .initialize_params
                .as_ref()
                .unwrap()
                .disk_size_gb,
            Some(50)
        );
        assert_eq!(model.metadata.unwrap().items.len(), 2);
    }

    #[test]
    fn scripts_go_to_startup_script_and_options_are_optional() {
        let mut s = spec();
        s.network_interfaces[0].disable_external_ip = true;
        s.network_interfaces[0].stack_type = String::new();
        s.disks.truncate(1);
        s.disks[0].disk_type = String::new();
        s.disks[0].auto_delete = Some(false);
        s.gpu = Some(crate::spec::Gpu {
            accelerator_type: "nvidia-tesla-t4".into(),
            count: 1,
        });
        let body = insert_body(&s, "proj", "m-0", "#!/bin/sh\n");
        assert_eq!(body["metadata"]["items"][0]["key"], "startup-script");
        assert_eq!(body["networkInterfaces"][0].get("accessConfigs"), None);
        assert_eq!(body["networkInterfaces"][0].get("aliasIpRanges"), None);
        assert_eq!(body["disks"][0]["autoDelete"], false);
        assert_eq!(
            body["disks"][0]["initializeParams"].get("diskType"),
            None,
            "GCE's default type"
        );
        assert_eq!(
            body["guestAccelerators"],
            json!([{"acceleratorType": "projects/proj/zones/europe-west1-b/acceleratorTypes/nvidia-tesla-t4",
                    "acceleratorCount": 1}])
        );
        to_model(body).unwrap();
    }

    #[test]
    fn what_an_instance_tells() {
        let i: Instance = serde_json::from_value(json!({
            "name": "m-0", "status": "STOPPING",
            "networkInterfaces": [{"networkIP": "10.0.0.2", "accessConfigs": [{"natIP": "34.1.2.3"}]}],
            "disks": [{"source": "https://www.googleapis.com/compute/v1/projects/p/zones/z/disks/m-0", "boot": true}],
            "tags": {"items": ["a"]}
        }))
        .unwrap();
        let addrs: Vec<(String, String)> = addresses(&i)
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            addrs,
            vec![
                ("InternalIP".into(), "10.0.0.2".into()),
                ("ExternalIP".into(), "34.1.2.3".into()),
                ("Hostname".into(), "m-0".into()),
            ]
        );
        let r = resources(&i);
        assert_eq!(
            (r[0].kind.clone(), r[0].state),
            (ResourceKind::Vm, ResourceState::Stopped)
        );
        assert_eq!(r[0].message.as_deref(), Some("STOPPING"));
        assert_eq!(
            (r[1].kind.clone(), r[1].id.as_str()),
            (ResourceKind::Disk, "m-0")
        );
        assert_eq!(network_tags(&i), ["a".to_string()]);
        assert_eq!(vm_state(Some(&Status::Running)), ResourceState::Running);
        assert_eq!(vm_state(Some(&Status::Staging)), ResourceState::Creating);
        assert_eq!(vm_state(None), ResourceState::Unknown);
    }
}
