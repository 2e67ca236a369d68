//! The `RunInstances` request of a machine, built from the providerSpec by small pure
//! functions, and the reading of `Instance`s back into driver responses.

use base64::Engine as _;
use k8s_openapi::api::core::v1::NodeAddress;
use mcm_driver::{ResourceKind, ResourceState, ResourceStatus};

use crate::model::{Instance, InstanceState};
use crate::query::Query;
use crate::spec::{ProviderSpec, ROOT_DEVICE_NAME};
use crate::tags;

/// The longest `ClientToken` EC2 accepts.
pub const MAX_CLIENT_TOKEN_LEN: usize = 64;

/// A block device says `/root` but the AMI has no root device name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the AMI {ami} has no root device name, so blockDevices cannot name {ROOT_DEVICE_NAME}")]
pub struct NoRootDevice {
    /// The AMI.
    pub ami: String,
}

/// Sets the block device mappings (`BlockDeviceMapping.N`); `/root` (or a single unnamed
/// device) becomes the AMI's root device `root_device_name`. Volumes are deleted with the
/// instance unless the spec says otherwise.
pub fn block_device_mappings(
    request: &mut Query,
    spec: &ProviderSpec,
    root_device_name: Option<&str>,
) -> Result<(), NoRootDevice> {
    let single = spec.block_devices.len() == 1;
    for (i, d) in spec.block_devices.iter().enumerate() {
        let is_root = d.device_name == ROOT_DEVICE_NAME || (single && d.device_name.is_empty());
        let name = if is_root {
            root_device_name
                .filter(|n| !n.is_empty())
                .ok_or_else(|| NoRootDevice {
                    ami: spec.ami.clone(),
                })?
        } else {
            d.device_name.as_str()
        };
        let p = format!("BlockDeviceMapping.{}", i + 1);
        let e = &d.ebs;
        request
            .set(format!("{p}.DeviceName"), name)
            .set(
                format!("{p}.Ebs.DeleteOnTermination"),
                e.delete_on_termination.unwrap_or(true),
            )
            .set(format!("{p}.Ebs.Encrypted"), e.encrypted)
            .opt(format!("{p}.Ebs.Iops"), (e.iops > 0).then_some(e.iops))
            .opt(format!("{p}.Ebs.KmsKeyId"), e.kms_key_id.as_ref())
            .opt(format!("{p}.Ebs.SnapshotId"), e.snapshot_id.as_ref())
            .opt(format!("{p}.Ebs.Throughput"), e.throughput)
            .opt(
                format!("{p}.Ebs.VolumeSize"),
                (e.volume_size > 0).then_some(e.volume_size),
            )
            .non_empty(format!("{p}.Ebs.VolumeType"), &e.volume_type)
            .opt(format!("{p}.NoDevice"), d.no_device.as_ref())
            .opt(format!("{p}.VirtualName"), d.virtual_name.as_ref());
    }
    Ok(())
}

/// Sets the network interfaces (`NetworkInterface.N`); device indexes default to the
/// position in the list and interfaces are deleted with the instance unless the spec says
/// otherwise. An interface with an `ipv6AddressCount` gets a primary IPv6 address unless
/// `primaryIpv6` says otherwise (load balancers of IPv6 shoots target it), and `primaryIpv6`
/// alone is not sent, as Gardener's provider does.
pub fn network_interfaces(request: &mut Query, spec: &ProviderSpec) {
    for (i, n) in spec.network_interfaces.iter().enumerate() {
        let p = format!("NetworkInterface.{}", i + 1);
        request
            .opt(
                format!("{p}.AssociatePublicIpAddress"),
                n.associate_public_ip_address,
            )
            .set(
                format!("{p}.DeleteOnTermination"),
                n.delete_on_termination.unwrap_or(true),
            )
            .opt(format!("{p}.Description"), n.description.as_ref())
            .set(
                format!("{p}.DeviceIndex"),
                n.device_index.unwrap_or(i as i32),
            )
            .opt(format!("{p}.InterfaceType"), n.interface_type.as_ref())
            .opt(format!("{p}.Ipv6AddressCount"), n.ipv6_address_count)
            .opt(format!("{p}.Ipv6PrefixCount"), n.ipv6_prefix_count)
            .opt(format!("{p}.NetworkCardIndex"), n.network_card_index)
            .opt(
                format!("{p}.PrimaryIpv6"),
                n.ipv6_address_count.map(|_| n.primary_ipv6.unwrap_or(true)),
            )
            .list(
                &format!("{p}.SecurityGroupId"),
                n.security_group_ids.iter().map(String::as_str),
            )
            .set(format!("{p}.SubnetId"), &n.subnet_id);
    }
}

/// Sets the instance profile: by name, else by ARN.
pub fn iam_instance_profile(request: &mut Query, spec: &ProviderSpec) {
    if !spec.iam.name.is_empty() {
        request.set("IamInstanceProfile.Name", &spec.iam.name);
    } else {
        request.set("IamInstanceProfile.Arn", &spec.iam.arn);
    }
}

/// Sets the market options: `instanceMarketOptions.marketType` when set (the market alone,
/// as Gardener's provider sends it); else a one-time spot instance (terminated on
/// interruption) when the deprecated `spotPrice` is set (`""`: no maximum price).
pub fn market_options(request: &mut Query, spec: &ProviderSpec) {
    const P: &str = "InstanceMarketOptions";
    if let Some(m) = &spec.instance_market_options {
        request.set(format!("{P}.MarketType"), &m.market_type);
        return;
    }
    let Some(price) = spec.spot_price.as_ref() else {
        return;
    };
    request
        .set(format!("{P}.MarketType"), "spot")
        .set(
            format!("{P}.SpotOptions.InstanceInterruptionBehavior"),
            "terminate",
        )
        .non_empty(format!("{P}.SpotOptions.MaxPrice"), price)
        .set(format!("{P}.SpotOptions.SpotInstanceType"), "one-time");
}

/// Sets the capacity reservation: a preference, or a target (a reservation id or a resource
/// group), never both (EC2 rejects both).
pub fn capacity_reservation(request: &mut Query, spec: &ProviderSpec) {
    const P: &str = "CapacityReservationSpecification";
    let Some(c) = spec.capacity_reservation.as_ref() else {
        return;
    };
    if !c.capacity_reservation_preference.is_empty() {
        request.set(
            format!("{P}.CapacityReservationPreference"),
            &c.capacity_reservation_preference,
        );
    } else if let Some(arn) = &c.capacity_reservation_resource_group_arn {
        request.set(
            format!("{P}.CapacityReservationTarget.CapacityReservationResourceGroupArn"),
            arn,
        );
    } else if let Some(id) = &c.capacity_reservation_id {
        request.set(
            format!("{P}.CapacityReservationTarget.CapacityReservationId"),
            id,
        );
    }
}

/// The Machine (node template) annotation Gardener's provider reads a placement from when
/// the spec has none: EC2's `Placement` as JSON, field names matched ignoring case
/// (`{"AvailabilityZone": "eu-west-1a", "Tenancy": "dedicated"}`).
pub const PLACEMENT_ANNOTATION: &str = "machine.sapcloud.io/awsPlacement";

/// Why a `RunInstances` request cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A block device says `/root` but the AMI has no root device name.
    #[error(transparent)]
    NoRootDevice(#[from] NoRootDevice),
    /// The placement annotation is not EC2's placement as JSON.
    #[error("annotation {PLACEMENT_ANNOTATION}: {source}")]
    PlacementAnnotation {
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

/// EC2's `Placement` as the annotation writes it (Go field names).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AnnotatedPlacement {
    #[serde(default)]
    availability_zone: Option<String>,
    #[serde(default)]
    affinity: Option<String>,
    #[serde(default)]
    group_name: Option<String>,
    #[serde(default)]
    partition_number: Option<i32>,
    #[serde(default)]
    host_id: Option<String>,
    #[serde(default)]
    tenancy: Option<String>,
    #[serde(default)]
    spread_domain: Option<String>,
    #[serde(default)]
    host_resource_group_arn: Option<String>,
    #[serde(default)]
    group_id: Option<String>,
}

/// EC2's `Placement`, as the spec or the annotation give it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// `Affinity`
    pub affinity: Option<String>,
    /// `AvailabilityZone`
    pub availability_zone: Option<String>,
    /// `GroupId`
    pub group_id: Option<String>,
    /// `GroupName`
    pub group_name: Option<String>,
    /// `HostId`
    pub host_id: Option<String>,
    /// `HostResourceGroupArn`
    pub host_resource_group_arn: Option<String>,
    /// `PartitionNumber`
    pub partition_number: Option<i32>,
    /// `SpreadDomain`
    pub spread_domain: Option<String>,
    /// `Tenancy`
    pub tenancy: Option<String>,
}

impl Placement {
    /// Sets `Placement.*` of `request`.
    pub fn set_on(&self, request: &mut Query) {
        request
            .opt("Placement.Affinity", self.affinity.as_ref())
            .opt(
                "Placement.AvailabilityZone",
                self.availability_zone.as_ref(),
            )
            .opt("Placement.GroupId", self.group_id.as_ref())
            .opt("Placement.GroupName", self.group_name.as_ref())
            .opt("Placement.HostId", self.host_id.as_ref())
            .opt(
                "Placement.HostResourceGroupArn",
                self.host_resource_group_arn.as_ref(),
            )
            .opt("Placement.PartitionNumber", self.partition_number)
            .opt("Placement.SpreadDomain", self.spread_domain.as_ref())
            .opt("Placement.Tenancy", self.tenancy.as_ref());
    }
}

/// The placement: the spec's, else the one of the Machine's [`PLACEMENT_ANNOTATION`] (as
/// Gardener's provider falls back to it); an annotation with no field is none.
pub fn placement_of(
    spec: &ProviderSpec,
    annotation: Option<&str>,
) -> Result<Option<Placement>, LaunchError> {
    if spec.placement.is_some() {
        return Ok(placement(spec));
    }
    let Some(text) = annotation.filter(|a| !a.trim().is_empty()) else {
        return Ok(None);
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|source| LaunchError::PlacementAnnotation { source })?;
    let a: AnnotatedPlacement = mcm_driver::gojson::go_decode(&value, PLACEMENT_ANNOTATION)
        .map_err(|source| LaunchError::PlacementAnnotation { source })?
        .value;
    let p = Placement {
        availability_zone: a.availability_zone,
        affinity: a.affinity,
        group_name: a.group_name,
        partition_number: a.partition_number,
        host_id: a.host_id,
        tenancy: a.tenancy,
        spread_domain: a.spread_domain,
        host_resource_group_arn: a.host_resource_group_arn,
        group_id: a.group_id,
    };
    Ok((p != Placement::default()).then_some(p))
}

/// The placement, if the spec has one.
pub fn placement(spec: &ProviderSpec) -> Option<Placement> {
    let p = spec.placement.as_ref()?;
    Some(Placement {
        group_id: p.group_id.clone(),
        tenancy: p.tenancy.clone(),
        host_id: p.host_id.clone(),
        partition_number: p.partition_number,
        affinity: p.affinity.clone(),
        availability_zone: p.availability_zone.clone(),
        ..Placement::default()
    })
}

/// Sets the instance metadata options, if the spec has them.
pub fn metadata_options(request: &mut Query, spec: &ProviderSpec) {
    let Some(m) = spec.instance_metadata_options.as_ref() else {
        return;
    };
    request
        .non_empty("MetadataOptions.HttpEndpoint", &m.http_endpoint)
        .non_empty("MetadataOptions.HttpProtocolIpv6", &m.http_protocol_ipv6)
        .opt(
            "MetadataOptions.HttpPutResponseHopLimit",
            m.http_put_response_hop_limit,
        )
        .non_empty("MetadataOptions.HttpTokens", &m.http_tokens);
}

/// Sets the CPU options, if the spec has them.
pub fn cpu_options(request: &mut Query, spec: &ProviderSpec) {
    let Some(c) = spec.cpu_options.as_ref() else {
        return;
    };
    request
        .opt("CpuOptions.AmdSevSnp", c.amd_sev_snp.as_ref())
        .opt("CpuOptions.CoreCount", c.core_count)
        .opt("CpuOptions.ThreadsPerCore", c.threads_per_core);
}

/// The `ClientToken` of a creation attempt's idempotency key: the key itself for the first
/// instance of the attempt, `<key>-<n>` for the `n`-th one launched after the earlier ones
/// terminated at once (EC2 keeps answering a used token with its instance, even a
/// terminated one). At most 64 printable ASCII characters, as EC2 accepts.
pub fn client_token(idempotency_key: &str, generation: u32) -> String {
    let suffix = if generation == 0 {
        String::new()
    } else {
        format!("-{generation}")
    };
    let mut token: String = idempotency_key
        .chars()
        .filter(char::is_ascii_graphic)
        .take(MAX_CLIENT_TOKEN_LEN - suffix.len())
        .collect();
    token.push_str(&suffix);
    token
}

/// The `RunInstances` request of one instance of `machine_name` (whose
/// [`PLACEMENT_ANNOTATION`] is `placement_annotation`).
pub fn run_instances_request(
    spec: &ProviderSpec,
    machine_name: &str,
    placement_annotation: Option<&str>,
    user_data: &[u8],
    root_device_name: Option<&str>,
    client_token: &str,
) -> Result<Query, LaunchError> {
    let tags = tags::resource_tags(&spec.tags, machine_name);
    let placement = placement_of(spec, placement_annotation)?;
    let mut q = Query::new("RunInstances");
    q.set("ImageId", &spec.ami)
        .set("InstanceType", &spec.machine_type)
        .set("MinCount", 1)
        .set("MaxCount", 1)
        .set("ClientToken", client_token)
        .set(
            "UserData",
            base64::engine::general_purpose::STANDARD.encode(user_data),
        )
        .opt("KeyName", spec.key_name.as_ref().filter(|k| !k.is_empty()))
        .opt("EbsOptimized", spec.ebs_optimized.then_some(true))
        .opt("Monitoring.Enabled", spec.monitoring.then_some(true));
    iam_instance_profile(&mut q, spec);
    network_interfaces(&mut q, spec);
    block_device_mappings(&mut q, spec, root_device_name)?;
    tags::tag_specifications(&mut q, &tags);
    market_options(&mut q, spec);
    capacity_reservation(&mut q, spec);
    if let Some(p) = placement {
        p.set_on(&mut q);
    }
    metadata_options(&mut q, spec);
    cpu_options(&mut q, spec);
    Ok(q)
}

/// The node name of an instance: its private DNS name (the name the kubelet registers with
/// on AWS), else its instance id when the VPC has no DNS host names.
pub fn node_name(instance: &Instance) -> String {
    if instance.private_dns_name.is_empty() {
        instance.id.clone()
    } else {
        instance.private_dns_name.clone()
    }
}

/// The addresses of an instance, as a Node would report them.
pub fn addresses(instance: &Instance) -> Vec<NodeAddress> {
    [
        ("InternalIP", &instance.private_ip_address),
        ("InternalDNS", &instance.private_dns_name),
        ("Hostname", &instance.private_dns_name),
        ("ExternalIP", &instance.public_ip_address),
        ("ExternalDNS", &instance.public_dns_name),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(type_, v)| NodeAddress {
        type_: type_.to_string(),
        address: v.clone(),
    })
    .collect()
}

/// The state of the VM resource of an instance.
pub fn vm_state(state: &InstanceState) -> ResourceState {
    match state {
        InstanceState::Pending => ResourceState::Creating,
        InstanceState::Running => ResourceState::Running,
        InstanceState::Stopping | InstanceState::Stopped => ResourceState::Stopped,
        InstanceState::ShuttingDown | InstanceState::Terminated => ResourceState::Deleting,
        InstanceState::Unknown => ResourceState::Unknown,
    }
}

/// The resources of an instance: the VM, its network interfaces and its EBS volumes.
pub fn resources(instance: &Instance) -> Vec<ResourceStatus> {
    let mut out = vec![ResourceStatus {
        kind: ResourceKind::Vm,
        id: instance.id.clone(),
        state: vm_state(&instance.state),
        message: instance.state_reason.clone(),
    }];
    for nic in &instance.network_interfaces {
        out.push(ResourceStatus {
            kind: ResourceKind::NetworkInterface,
            id: nic.id.clone(),
            state: match nic.status.as_str() {
                "in-use" | "available" => ResourceState::Running,
                "attaching" => ResourceState::Creating,
                "detaching" => ResourceState::Deleting,
                _ => ResourceState::Unknown,
            },
            message: None,
        });
    }
    for v in &instance.volumes {
        out.push(ResourceStatus {
            kind: ResourceKind::Disk,
            id: v.volume_id.clone(),
            state: match v.status.as_str() {
                "attached" => ResourceState::Running,
                "attaching" => ResourceState::Creating,
                "detaching" | "detached" => ResourceState::Deleting,
                _ => ResourceState::Unknown,
            },
            message: (!v.device_name.is_empty()).then(|| format!("device {}", v.device_name)),
        });
    }
    out
}

/// Whether the instance still needs `initialize_machine` (its source/destination check is on
/// although the spec disables it).
pub fn needs_initialization(spec: &ProviderSpec, instance: &Instance) -> bool {
    !src_dst_checks_to_disable(spec, instance).is_empty()
}

/// The network interfaces of `instance` whose source/destination check is still on although
/// the spec turns it off (`srcAndDstChecksEnabled: false`): every attached interface except
/// `efa` and `efa-only` ones, whose check EC2 does not let change. The check is turned off
/// per interface, as Gardener's provider does, because EC2 refuses the instance-wide
/// attribute for an instance with several interfaces. Pure.
pub fn src_dst_checks_to_disable(spec: &ProviderSpec, instance: &Instance) -> Vec<String> {
    if !spec.disables_src_dst_check() {
        return vec![];
    }
    instance
        .network_interfaces
        .iter()
        .filter(|ni| !matches!(ni.interface_type.as_str(), "efa" | "efa-only"))
        .filter(|ni| ni.source_dest_check != Some(false))
        .filter(|ni| !ni.id.is_empty())
        .map(|ni| ni.id.clone())
        .collect()
}

/// The oldest instance (by launch time, then id): the one to keep when several exist.
pub fn oldest(instances: &[Instance]) -> Option<&Instance> {
    instances.iter().min_by(|a, b| {
        let t = |i: &Instance| i.launch_time.map(|t| (t.secs(), t.subsec_nanos()));
        t(a).cmp(&t(b)).then_with(|| a.id.cmp(&b.id))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NetworkInterface, Volume};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ProviderSpec {
        serde_json::from_value(v).unwrap()
    }

    fn full() -> ProviderSpec {
        spec(json!({
            "ami": "ami-1", "region": "eu-west-1", "machineType": "m5.large",
            "iam": { "arn": "arn:aws:iam::1:instance-profile/nodes" },
            "keyName": "ssh",
            "monitoring": true, "ebsOptimized": true,
            "networkInterfaces": [
                { "subnetID": "subnet-1", "securityGroupIDs": ["sg-1", "sg-2"], "associatePublicIPAddress": true },
                { "subnetID": "subnet-2", "securityGroupIDs": ["sg-3"], "deleteOnTermination": false, "deviceIndex": 5 }
            ],
            "tags": { "kubernetes.io/cluster/c": "1", "kubernetes.io/role/node": "1" },
            "blockDevices": [
                { "deviceName": "/root", "ebs": { "volumeSize": 50, "volumeType": "gp3", "throughput": 200, "encrypted": true, "kmsKeyID": "kms-1" } },
                { "deviceName": "/dev/sdb", "ebs": { "volumeSize": 100, "volumeType": "io1", "iops": 3000, "deleteOnTermination": false, "snapshotID": "snap-1" } }
            ],
            "spotPrice": "0.5",
            "instanceMetadataOptions": { "httpTokens": "required", "httpPutResponseHopLimit": 2, "httpEndpoint": "enabled" },
            "cpuOptions": { "coreCount": 2, "threadsPerCore": 1 },
            "placement": { "tenancy": "dedicated", "groupId": "pg-1", "partitionNumber": 3 },
            "capacityReservation": { "capacityReservationResourceGroupArn": "arn:group" }
        }))
    }

    /// The parameters `set` puts on an empty request.
    fn params(set: impl FnOnce(&mut Query)) -> Query {
        let mut q = Query::new("RunInstances");
        set(&mut q);
        q
    }

    #[test]
    fn block_devices_map_root_and_data_volumes() {
        let s = full();
        let mut q = Query::new("RunInstances");
        block_device_mappings(&mut q, &s, Some("/dev/xvda")).unwrap();
        for (name, want) in [
            ("BlockDeviceMapping.1.DeviceName", Some("/dev/xvda")),
            ("BlockDeviceMapping.1.Ebs.VolumeSize", Some("50")),
            ("BlockDeviceMapping.1.Ebs.VolumeType", Some("gp3")),
            ("BlockDeviceMapping.1.Ebs.Throughput", Some("200")),
            ("BlockDeviceMapping.1.Ebs.DeleteOnTermination", Some("true")),
            ("BlockDeviceMapping.1.Ebs.Encrypted", Some("true")),
            ("BlockDeviceMapping.1.Ebs.KmsKeyId", Some("kms-1")),
            ("BlockDeviceMapping.1.Ebs.Iops", None),
            ("BlockDeviceMapping.2.DeviceName", Some("/dev/sdb")),
            ("BlockDeviceMapping.2.Ebs.Iops", Some("3000")),
            (
                "BlockDeviceMapping.2.Ebs.DeleteOnTermination",
                Some("false"),
            ),
            ("BlockDeviceMapping.2.Ebs.SnapshotId", Some("snap-1")),
        ] {
            assert_eq!(q.get(name), want, "{name}");
        }
        assert_eq!(
            block_device_mappings(&mut Query::new("RunInstances"), &s, None),
            Err(NoRootDevice {
                ami: "ami-1".into()
            })
        );
        // A single unnamed device is the root device.
        let single = spec(
            json!({ "ami": "a", "blockDevices": [{ "ebs": { "volumeSize": 8, "volumeType": "gp2" } }] }),
        );
        let mut q = Query::new("RunInstances");
        block_device_mappings(&mut q, &single, Some("/dev/sda1")).unwrap();
        assert_eq!(q.get("BlockDeviceMapping.1.DeviceName"), Some("/dev/sda1"));
    }

    #[test]
    fn network_interfaces_default_device_index_and_deletion() {
        let q = params(|q| network_interfaces(q, &full()));
        for (name, want) in [
            ("NetworkInterface.1.DeviceIndex", Some("0")),
            ("NetworkInterface.1.SecurityGroupId.1", Some("sg-1")),
            ("NetworkInterface.1.SecurityGroupId.2", Some("sg-2")),
            ("NetworkInterface.1.AssociatePublicIpAddress", Some("true")),
            ("NetworkInterface.1.DeleteOnTermination", Some("true")),
            ("NetworkInterface.1.PrimaryIpv6", None),
            ("NetworkInterface.2.DeviceIndex", Some("5")),
            ("NetworkInterface.2.SubnetId", Some("subnet-2")),
            ("NetworkInterface.2.DeleteOnTermination", Some("false")),
            ("NetworkInterface.2.AssociatePublicIpAddress", None),
        ] {
            assert_eq!(q.get(name), want, "{name}");
        }
    }

    #[test]
    fn the_placement_annotation_is_the_fallback_of_the_spec() {
        let mut s = full();
        let spec_placement = placement(&s);
        assert!(spec_placement.is_some());
        // The spec's placement wins.
        assert_eq!(
            placement_of(&s, Some(r#"{"AvailabilityZone": "eu-west-1b"}"#)).unwrap(),
            spec_placement
        );
        s.placement = None;
        let p = placement_of(
            &s,
            Some(r#"{"availabilityZone": "eu-west-1b", "Tenancy": "dedicated", "PartitionNumber": 2}"#),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.availability_zone.as_deref(), Some("eu-west-1b"));
        assert_eq!(p.tenancy.as_deref(), Some("dedicated"));
        assert_eq!(p.partition_number, Some(2));
        assert_eq!(placement_of(&s, Some("{}")).unwrap(), None);
        assert_eq!(placement_of(&s, None).unwrap(), None);
        let e = placement_of(&s, Some("{not json")).unwrap_err();
        assert!(e.to_string().contains(PLACEMENT_ANNOTATION), "{e}");
    }

    #[test]
    fn spot_capacity_placement_metadata_and_cpu_options() {
        let s = full();
        let market = params(|q| market_options(q, &s));
        assert_eq!(market.get("InstanceMarketOptions.MarketType"), Some("spot"));
        assert_eq!(
            market.get("InstanceMarketOptions.SpotOptions.MaxPrice"),
            Some("0.5")
        );
        assert_eq!(
            market.get("InstanceMarketOptions.SpotOptions.SpotInstanceType"),
            Some("one-time")
        );
        let mut no_max = s.clone();
        no_max.spot_price = Some(String::new());
        let q = params(|q| market_options(q, &no_max));
        assert_eq!(q.get("InstanceMarketOptions.SpotOptions.MaxPrice"), None);
        assert_eq!(q.get("InstanceMarketOptions.MarketType"), Some("spot"));
        let mut on_demand = s.clone();
        on_demand.spot_price = None;
        assert!(
            params(|q| market_options(q, &on_demand))
                .params()
                .is_empty()
        );
        // instanceMarketOptions wins over spotPrice and is sent as the market alone.
        for market in ["spot", "capacity-block"] {
            let mut m = s.clone();
            m.instance_market_options = Some(crate::spec::InstanceMarketOptions {
                market_type: market.into(),
            });
            let got = params(|q| market_options(q, &m));
            assert_eq!(
                got.params(),
                [(
                    "InstanceMarketOptions.MarketType".to_string(),
                    market.to_string()
                )]
            );
        }

        let cr = params(|q| capacity_reservation(q, &s));
        assert_eq!(
            cr.params(),
            [(
                "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationResourceGroupArn".to_string(),
                "arn:group".to_string()
            )]
        );
        let p = params(|q| placement(&s).unwrap().set_on(q));
        assert_eq!(p.get("Placement.Tenancy"), Some("dedicated"));
        assert_eq!(p.get("Placement.GroupId"), Some("pg-1"));
        assert_eq!(p.get("Placement.PartitionNumber"), Some("3"));
        let md = params(|q| metadata_options(q, &s));
        assert_eq!(md.get("MetadataOptions.HttpTokens"), Some("required"));
        assert_eq!(md.get("MetadataOptions.HttpPutResponseHopLimit"), Some("2"));
        assert_eq!(md.get("MetadataOptions.HttpProtocolIpv6"), None);
        let cpu = params(|q| cpu_options(q, &s));
        assert_eq!(
            (
                cpu.get("CpuOptions.CoreCount"),
                cpu.get("CpuOptions.ThreadsPerCore")
            ),
            (Some("2"), Some("1"))
        );
        assert_eq!(
            params(|q| iam_instance_profile(q, &s)).get("IamInstanceProfile.Arn"),
            Some("arn:aws:iam::1:instance-profile/nodes")
        );
    }

    #[test]
    fn the_run_instances_request_carries_everything() {
        let q = run_instances_request(
            &full(),
            "m-1",
            None,
            b"#!/bin/sh\necho hi\n",
            Some("/dev/xvda"),
            "0123456789abcdef",
        )
        .unwrap();
        assert_eq!(q.action(), "RunInstances");
        for (name, want) in [
            ("ImageId", "ami-1"),
            ("InstanceType", "m5.large"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("ClientToken", "0123456789abcdef"),
            ("UserData", "IyEvYmluL3NoCmVjaG8gaGkK"),
            ("KeyName", "ssh"),
            ("EbsOptimized", "true"),
            ("Monitoring.Enabled", "true"),
            ("NetworkInterface.2.SubnetId", "subnet-2"),
            ("BlockDeviceMapping.2.DeviceName", "/dev/sdb"),
            ("TagSpecification.3.ResourceType", "network-interface"),
            ("TagSpecification.1.Tag.1.Key", "Name"),
            ("TagSpecification.1.Tag.1.Value", "m-1"),
            ("InstanceMarketOptions.MarketType", "spot"),
            ("Placement.GroupId", "pg-1"),
            ("MetadataOptions.HttpTokens", "required"),
            ("CpuOptions.CoreCount", "2"),
            (
                "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationResourceGroupArn",
                "arn:group",
            ),
            (
                "IamInstanceProfile.Arn",
                "arn:aws:iam::1:instance-profile/nodes",
            ),
        ] {
            assert_eq!(q.get(name), Some(want), "{name}");
        }
        assert_eq!(q.get("NetworkInterface.3.SubnetId"), None);
    }

    #[test]
    fn client_tokens_are_the_key_bounded_and_numbered() {
        let key = "0b8e2f0c-6a1d-8c3e-9f00-1234567890ab";
        assert_eq!(client_token(key, 0), key);
        assert_eq!(client_token(key, 2), format!("{key}-2"));
        assert_eq!(
            client_token(&"a".repeat(100), 0).len(),
            MAX_CLIENT_TOKEN_LEN
        );
        let long = client_token(&"a".repeat(100), 12);
        assert_eq!(long.len(), MAX_CLIENT_TOKEN_LEN);
        assert!(long.ends_with("-12"), "{long}");
        assert_eq!(client_token("ab cd", 0), "abcd");
    }

    fn instance(id: &str, state: InstanceState, launched: i64) -> Instance {
        Instance {
            id: id.into(),
            private_dns_name: format!("ip-10-0-0-1.{id}.internal"),
            private_ip_address: "10.0.0.1".into(),
            state,
            launch_time: Some(aws_smithy_types::DateTime::from_secs(launched)),
            network_interfaces: vec![NetworkInterface {
                id: "eni-1".into(),
                status: "in-use".into(),
                ..NetworkInterface::default()
            }],
            volumes: vec![Volume {
                device_name: "/dev/xvda".into(),
                volume_id: "vol-1".into(),
                status: "attached".into(),
            }],
            ..Instance::default()
        }
    }

    #[test]
    fn instances_read_back_into_names_addresses_and_resources() {
        let i = instance("i-1", InstanceState::Running, 10);
        assert_eq!(node_name(&i), "ip-10-0-0-1.i-1.internal");
        let addrs: Vec<_> = addresses(&i)
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(addrs[0], ("InternalIP".into(), "10.0.0.1".into()));
        assert_eq!(addrs.len(), 3);
        let r = resources(&i);
        let kinds: Vec<_> = r
            .iter()
            .map(|r| (r.kind.clone(), r.id.as_str(), r.state))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (ResourceKind::Vm, "i-1", ResourceState::Running),
                (
                    ResourceKind::NetworkInterface,
                    "eni-1",
                    ResourceState::Running
                ),
                (ResourceKind::Disk, "vol-1", ResourceState::Running),
            ]
        );
        assert_eq!(vm_state(&InstanceState::Stopped), ResourceState::Stopped);
        assert_eq!(vm_state(&InstanceState::Pending), ResourceState::Creating);
        let bare = Instance {
            id: "i-2".into(),
            ..Instance::default()
        };
        assert_eq!(node_name(&bare), "i-2");
    }

    #[test]
    fn the_oldest_instance_wins_and_src_dst_needs_initialization() {
        let a = instance("i-b", InstanceState::Running, 20);
        let b = instance("i-a", InstanceState::Pending, 10);
        let all = [a, b];
        assert_eq!(oldest(&all).unwrap().id, "i-a");
        let mut s = full();
        s.src_and_dst_checks_enabled = Some(false);
        let nic = |id: &str, kind: &str, on: bool| NetworkInterface {
            id: id.into(),
            interface_type: kind.into(),
            source_dest_check: Some(on),
            ..NetworkInterface::default()
        };
        let with = |nics: Vec<NetworkInterface>| Instance {
            id: "i-c".into(),
            network_interfaces: nics,
            ..Instance::default()
        };
        // Every interface with the check on, except EFA ones, which EC2 does not let change.
        let efa = with(vec![
            nic("eni-0", "efa", true),
            nic("eni-1", "efa-only", true),
            nic("eni-2", "interface", true),
            nic("eni-3", "interface", false),
        ]);
        assert_eq!(
            src_dst_checks_to_disable(&s, &efa),
            vec!["eni-2".to_string()]
        );
        assert!(needs_initialization(&s, &efa));
        let done = with(vec![
            nic("eni-0", "efa", true),
            nic("eni-2", "interface", false),
        ]);
        assert!(!needs_initialization(&s, &done));
        s.src_and_dst_checks_enabled = None;
        assert!(!needs_initialization(&s, &efa));
    }
}
