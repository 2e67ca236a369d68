//! The `RunInstances` request of a machine, built from the providerSpec by small pure
//! functions, and the reading of `Instance`s back into driver responses.

use aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder;
use aws_sdk_ec2::types::{
    AmdSevSnpSpecification, BlockDeviceMapping, CapacityReservationPreference,
    CapacityReservationSpecification, CapacityReservationTarget, CpuOptionsRequest, EbsBlockDevice,
    HttpTokensState, IamInstanceProfileSpecification, Instance, InstanceInterruptionBehavior,
    InstanceMarketOptionsRequest, InstanceMetadataEndpointState, InstanceMetadataOptionsRequest,
    InstanceMetadataProtocolState, InstanceNetworkInterfaceSpecification, InstanceStateName,
    InstanceType, MarketType, Placement, RunInstancesMonitoringEnabled, SpotInstanceType,
    SpotMarketOptions, Tenancy, VolumeType,
};
use base64::Engine as _;
use k8s_openapi::api::core::v1::NodeAddress;
use mcm_driver::{ResourceKind, ResourceState, ResourceStatus};

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

/// The block device mappings; `/root` (or a single unnamed device) becomes the AMI's root
/// device `root_device_name`. Volumes are deleted with the instance unless the spec says
/// otherwise.
pub fn block_device_mappings(
    spec: &ProviderSpec,
    root_device_name: Option<&str>,
) -> Result<Vec<BlockDeviceMapping>, NoRootDevice> {
    let single = spec.block_devices.len() == 1;
    spec.block_devices
        .iter()
        .map(|d| {
            let is_root = d.device_name == ROOT_DEVICE_NAME || (single && d.device_name.is_empty());
            let name = if is_root {
                root_device_name
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| NoRootDevice {
                        ami: spec.ami.clone(),
                    })?
                    .to_string()
            } else {
                d.device_name.clone()
            };
            let e = &d.ebs;
            let ebs = EbsBlockDevice::builder()
                .delete_on_termination(e.delete_on_termination.unwrap_or(true))
                .encrypted(e.encrypted)
                .set_volume_size((e.volume_size > 0).then_some(e.volume_size))
                .set_volume_type(
                    (!e.volume_type.is_empty()).then(|| VolumeType::from(e.volume_type.as_str())),
                )
                .set_iops((e.iops > 0).then_some(e.iops))
                .set_throughput(e.throughput)
                .set_kms_key_id(e.kms_key_id.clone())
                .set_snapshot_id(e.snapshot_id.clone())
                .build();
            Ok(BlockDeviceMapping::builder()
                .device_name(name)
                .ebs(ebs)
                .set_no_device(d.no_device.clone())
                .set_virtual_name(d.virtual_name.clone())
                .build())
        })
        .collect()
}

/// The network interfaces; device indexes default to the position in the list and
/// interfaces are deleted with the instance unless the spec says otherwise. An interface
/// with an `ipv6AddressCount` gets a primary IPv6 address unless `primaryIpv6` says
/// otherwise (load balancers of IPv6 shoots target it), and `primaryIpv6` alone is not sent,
/// as Gardener's provider does.
pub fn network_interfaces(spec: &ProviderSpec) -> Vec<InstanceNetworkInterfaceSpecification> {
    spec.network_interfaces
        .iter()
        .enumerate()
        .map(|(i, n)| {
            InstanceNetworkInterfaceSpecification::builder()
                .device_index(n.device_index.unwrap_or(i as i32))
                .subnet_id(&n.subnet_id)
                .set_groups(Some(n.security_group_ids.clone()))
                .set_associate_public_ip_address(n.associate_public_ip_address)
                .delete_on_termination(n.delete_on_termination.unwrap_or(true))
                .set_description(n.description.clone())
                .set_ipv6_address_count(n.ipv6_address_count)
                .set_ipv6_prefix_count(n.ipv6_prefix_count)
                .set_interface_type(n.interface_type.clone())
                .set_network_card_index(n.network_card_index)
                .set_primary_ipv6(n.ipv6_address_count.map(|_| n.primary_ipv6.unwrap_or(true)))
                .build()
        })
        .collect()
}

/// The instance profile by name, else by ARN.
pub fn iam_instance_profile(spec: &ProviderSpec) -> IamInstanceProfileSpecification {
    let b = IamInstanceProfileSpecification::builder();
    if !spec.iam.name.is_empty() {
        b.name(&spec.iam.name).build()
    } else {
        b.arn(&spec.iam.arn).build()
    }
}

/// Market options: `instanceMarketOptions.marketType` when set (the market alone, as
/// Gardener's provider sends it); else a one-time spot instance (terminated on interruption)
/// when the deprecated `spotPrice` is set (`""`: no maximum price).
pub fn market_options(spec: &ProviderSpec) -> Option<InstanceMarketOptionsRequest> {
    if let Some(m) = &spec.instance_market_options {
        return Some(
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::from(m.market_type.as_str()))
                .build(),
        );
    }
    let price = spec.spot_price.as_ref()?;
    let spot = SpotMarketOptions::builder()
        .spot_instance_type(SpotInstanceType::OneTime)
        .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
        .set_max_price((!price.is_empty()).then(|| price.clone()))
        .build();
    Some(
        InstanceMarketOptionsRequest::builder()
            .market_type(MarketType::Spot)
            .spot_options(spot)
            .build(),
    )
}

/// The capacity reservation: a preference, or a target (a reservation id or a resource
/// group), never both (EC2 rejects both).
pub fn capacity_reservation(spec: &ProviderSpec) -> Option<CapacityReservationSpecification> {
    let c = spec.capacity_reservation.as_ref()?;
    if !c.capacity_reservation_preference.is_empty() {
        return Some(
            CapacityReservationSpecification::builder()
                .capacity_reservation_preference(CapacityReservationPreference::from(
                    c.capacity_reservation_preference.as_str(),
                ))
                .build(),
        );
    }
    let target = if let Some(arn) = &c.capacity_reservation_resource_group_arn {
        CapacityReservationTarget::builder()
            .capacity_reservation_resource_group_arn(arn)
            .build()
    } else {
        CapacityReservationTarget::builder()
            .capacity_reservation_id(c.capacity_reservation_id.clone()?)
            .build()
    };
    Some(
        CapacityReservationSpecification::builder()
            .capacity_reservation_target(target)
            .build(),
    )
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
    let p = Placement::builder()
        .set_availability_zone(a.availability_zone)
        .set_affinity(a.affinity)
        .set_group_name(a.group_name)
        .set_partition_number(a.partition_number)
        .set_host_id(a.host_id)
        .set_tenancy(a.tenancy.as_deref().map(Tenancy::from))
        .set_spread_domain(a.spread_domain)
        .set_host_resource_group_arn(a.host_resource_group_arn)
        .set_group_id(a.group_id)
        .build();
    Ok((p != Placement::builder().build()).then_some(p))
}

/// The placement, if the spec has one.
pub fn placement(spec: &ProviderSpec) -> Option<Placement> {
    let p = spec.placement.as_ref()?;
    Some(
        Placement::builder()
            .set_group_id(p.group_id.clone())
            .set_tenancy(p.tenancy.as_deref().map(Tenancy::from))
            .set_host_id(p.host_id.clone())
            .set_partition_number(p.partition_number)
            .set_affinity(p.affinity.clone())
            .set_availability_zone(p.availability_zone.clone())
            .build(),
    )
}

/// The instance metadata options, if the spec has them.
pub fn metadata_options(spec: &ProviderSpec) -> Option<InstanceMetadataOptionsRequest> {
    let m = spec.instance_metadata_options.as_ref()?;
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Some(
        InstanceMetadataOptionsRequest::builder()
            .set_http_endpoint(
                some(&m.http_endpoint).map(|s| InstanceMetadataEndpointState::from(s.as_str())),
            )
            .set_http_tokens(some(&m.http_tokens).map(|s| HttpTokensState::from(s.as_str())))
            .set_http_put_response_hop_limit(m.http_put_response_hop_limit)
            .set_http_protocol_ipv6(
                some(&m.http_protocol_ipv6)
                    .map(|s| InstanceMetadataProtocolState::from(s.as_str())),
            )
            .build(),
    )
}

/// The CPU options, if the spec has them.
pub fn cpu_options(spec: &ProviderSpec) -> Option<CpuOptionsRequest> {
    let c = spec.cpu_options.as_ref()?;
    Some(
        CpuOptionsRequest::builder()
            .set_core_count(c.core_count)
            .set_threads_per_core(c.threads_per_core)
            .set_amd_sev_snp(c.amd_sev_snp.as_deref().map(AmdSevSnpSpecification::from))
            .build(),
    )
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

/// Fills a `RunInstances` request for one instance of `machine_name` (whose
/// [`PLACEMENT_ANNOTATION`] is `placement_annotation`).
pub fn run_instances_request(
    request: RunInstancesFluentBuilder,
    spec: &ProviderSpec,
    machine_name: &str,
    placement_annotation: Option<&str>,
    user_data: &[u8],
    root_device_name: Option<&str>,
    client_token: &str,
) -> Result<RunInstancesFluentBuilder, LaunchError> {
    let tags = tags::resource_tags(&spec.tags, machine_name);
    let monitoring = spec.monitoring.then(|| {
        RunInstancesMonitoringEnabled::builder()
            .enabled(true)
            .build()
    });
    Ok(request
        .image_id(&spec.ami)
        .instance_type(InstanceType::from(spec.machine_type.as_str()))
        .min_count(1)
        .max_count(1)
        .client_token(client_token)
        .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
        .set_key_name(spec.key_name.clone().filter(|k| !k.is_empty()))
        .iam_instance_profile(iam_instance_profile(spec))
        .set_network_interfaces(Some(network_interfaces(spec)))
        .set_block_device_mappings(
            Some(block_device_mappings(spec, root_device_name)?).filter(|m| !m.is_empty()),
        )
        .set_tag_specifications(Some(tags::tag_specifications(&tags)))
        .set_ebs_optimized(spec.ebs_optimized.then_some(true))
        .set_monitoring(monitoring)
        .set_instance_market_options(market_options(spec))
        .set_capacity_reservation_specification(capacity_reservation(spec))
        .set_placement(placement_of(spec, placement_annotation)?)
        .set_metadata_options(metadata_options(spec))
        .set_cpu_options(cpu_options(spec)))
}

/// The node name of an instance: its private DNS name (the name the kubelet registers with
/// on AWS), else its instance id when the VPC has no DNS host names.
pub fn node_name(instance: &Instance) -> String {
    instance
        .private_dns_name()
        .filter(|n| !n.is_empty())
        .or(instance.instance_id())
        .unwrap_or_default()
        .to_string()
}

/// The addresses of an instance, as a Node would report them.
pub fn addresses(instance: &Instance) -> Vec<NodeAddress> {
    let mut out = Vec::new();
    let mut push = |type_: &str, value: Option<&str>| {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            out.push(NodeAddress {
                type_: type_.to_string(),
                address: v.to_string(),
            });
        }
    };
    push("InternalIP", instance.private_ip_address());
    push("InternalDNS", instance.private_dns_name());
    push("Hostname", instance.private_dns_name());
    push("ExternalIP", instance.public_ip_address());
    push("ExternalDNS", instance.public_dns_name());
    out
}

/// The state of the VM resource of an instance.
pub fn vm_state(state: Option<&InstanceStateName>) -> ResourceState {
    match state {
        Some(InstanceStateName::Pending) => ResourceState::Creating,
        Some(InstanceStateName::Running) => ResourceState::Running,
        Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => ResourceState::Stopped,
        Some(InstanceStateName::ShuttingDown | InstanceStateName::Terminated) => {
            ResourceState::Deleting
        }
        _ => ResourceState::Unknown,
    }
}

/// The resources of an instance: the VM, its network interfaces and its EBS volumes.
pub fn resources(instance: &Instance) -> Vec<ResourceStatus> {
    let state = instance.state().and_then(|s| s.name());
    let mut out = vec![ResourceStatus {
        kind: ResourceKind::Vm,
        id: instance.instance_id().unwrap_or_default().to_string(),
        state: vm_state(state),
        message: instance
            .state_reason()
            .and_then(|r| r.message())
            .map(String::from),
    }];
    for nic in instance.network_interfaces() {
        out.push(ResourceStatus {
            kind: ResourceKind::NetworkInterface,
            id: nic.network_interface_id().unwrap_or_default().to_string(),
            state: match nic.status().map(|s| s.as_str()) {
                Some("in-use") | Some("available") => ResourceState::Running,
                Some("attaching") => ResourceState::Creating,
                Some("detaching") => ResourceState::Deleting,
                _ => ResourceState::Unknown,
            },
            message: None,
        });
    }
    for bd in instance.block_device_mappings() {
        let Some(ebs) = bd.ebs() else { continue };
        out.push(ResourceStatus {
            kind: ResourceKind::Disk,
            id: ebs.volume_id().unwrap_or_default().to_string(),
            state: match ebs.status().map(|s| s.as_str()) {
                Some("attached") => ResourceState::Running,
                Some("attaching") => ResourceState::Creating,
                Some("detaching") | Some("detached") => ResourceState::Deleting,
                _ => ResourceState::Unknown,
            },
            message: bd.device_name().map(|d| format!("device {d}")),
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
        .network_interfaces()
        .iter()
        .filter(|ni| !matches!(ni.interface_type(), Some("efa" | "efa-only")))
        .filter(|ni| ni.source_dest_check() != Some(false))
        .filter_map(|ni| ni.network_interface_id().map(str::to_string))
        .collect()
}

/// The oldest instance (by launch time, then id): the one to keep when several exist.
pub fn oldest(instances: &[Instance]) -> Option<&Instance> {
    instances.iter().min_by(|a, b| {
        let t = |i: &Instance| i.launch_time().map(|t| (t.secs(), t.subsec_nanos()));
        t(a).cmp(&t(b))
            .then_with(|| a.instance_id().cmp(&b.instance_id()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        EbsInstanceBlockDevice, InstanceBlockDeviceMapping, InstanceNetworkInterface,
        InstanceState, NetworkInterfaceStatus,
    };
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

    #[test]
    fn block_devices_map_root_and_data_volumes() {
        let m = block_device_mappings(&full(), Some("/dev/xvda")).unwrap();
        assert_eq!(m[0].device_name(), Some("/dev/xvda"));
        let root = m[0].ebs().unwrap();
        assert_eq!(root.volume_size(), Some(50));
        assert_eq!(root.volume_type(), Some(&VolumeType::Gp3));
        assert_eq!(root.throughput(), Some(200));
        assert_eq!(root.delete_on_termination(), Some(true));
        assert_eq!(root.encrypted(), Some(true));
        assert_eq!(root.kms_key_id(), Some("kms-1"));
        assert_eq!(root.iops(), None);
        let data = m[1].ebs().unwrap();
        assert_eq!(m[1].device_name(), Some("/dev/sdb"));
        assert_eq!(data.iops(), Some(3000));
        assert_eq!(data.delete_on_termination(), Some(false));
        assert_eq!(data.snapshot_id(), Some("snap-1"));
        assert_eq!(
            block_device_mappings(&full(), None),
            Err(NoRootDevice {
                ami: "ami-1".into()
            })
        );
        // A single unnamed device is the root device.
        let single = spec(
            json!({ "ami": "a", "blockDevices": [{ "ebs": { "volumeSize": 8, "volumeType": "gp2" } }] }),
        );
        let m = block_device_mappings(&single, Some("/dev/sda1")).unwrap();
        assert_eq!(m[0].device_name(), Some("/dev/sda1"));
    }

    #[test]
    fn network_interfaces_default_device_index_and_deletion() {
        let nics = network_interfaces(&full());
        assert_eq!(nics[0].device_index(), Some(0));
        assert_eq!(nics[0].groups(), ["sg-1", "sg-2"]);
        assert_eq!(nics[0].associate_public_ip_address(), Some(true));
        assert_eq!(nics[0].delete_on_termination(), Some(true));
        assert_eq!(nics[1].device_index(), Some(5));
        assert_eq!(nics[1].subnet_id(), Some("subnet-2"));
        assert_eq!(nics[1].delete_on_termination(), Some(false));
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
        assert_eq!(p.availability_zone(), Some("eu-west-1b"));
        assert_eq!(p.tenancy(), Some(&Tenancy::Dedicated));
        assert_eq!(p.partition_number(), Some(2));
        assert_eq!(placement_of(&s, Some("{}")).unwrap(), None);
        assert_eq!(placement_of(&s, None).unwrap(), None);
        let e = placement_of(&s, Some("{not json")).unwrap_err();
        assert!(e.to_string().contains(PLACEMENT_ANNOTATION), "{e}");
    }

    #[test]
    fn spot_capacity_placement_metadata_and_cpu_options() {
        let s = full();
        let market = market_options(&s).unwrap();
        assert_eq!(market.market_type(), Some(&MarketType::Spot));
        let spot = market.spot_options().unwrap();
        assert_eq!(spot.max_price(), Some("0.5"));
        assert_eq!(spot.spot_instance_type(), Some(&SpotInstanceType::OneTime));
        let mut no_max = s.clone();
        no_max.spot_price = Some(String::new());
        assert_eq!(
            market_options(&no_max)
                .unwrap()
                .spot_options()
                .unwrap()
                .max_price(),
            None
        );
        let mut on_demand = s.clone();
        on_demand.spot_price = None;
        assert_eq!(market_options(&on_demand), None);
        // instanceMarketOptions wins over spotPrice and is sent as the market alone.
        for market in ["spot", "capacity-block"] {
            let mut m = s.clone();
            m.instance_market_options = Some(crate::spec::InstanceMarketOptions {
                market_type: market.into(),
            });
            let got = market_options(&m).unwrap();
            assert_eq!(got.market_type(), Some(&MarketType::from(market)));
            assert_eq!(got.spot_options(), None);
        }

        let cr = capacity_reservation(&s).unwrap();
        assert_eq!(cr.capacity_reservation_preference(), None);
        assert_eq!(
            cr.capacity_reservation_target()
                .unwrap()
                .capacity_reservation_resource_group_arn(),
            Some("arn:group")
        );
        let p = placement(&s).unwrap();
        assert_eq!(p.tenancy(), Some(&Tenancy::Dedicated));
        assert_eq!(p.group_id(), Some("pg-1"));
        assert_eq!(p.partition_number(), Some(3));
        let md = metadata_options(&s).unwrap();
        assert_eq!(md.http_tokens(), Some(&HttpTokensState::Required));
        assert_eq!(md.http_put_response_hop_limit(), Some(2));
        assert_eq!(md.http_protocol_ipv6(), None);
        let cpu = cpu_options(&s).unwrap();
        assert_eq!(
            (cpu.core_count(), cpu.threads_per_core()),
            (Some(2), Some(1))
        );
        assert_eq!(
            iam_instance_profile(&s).arn(),
            Some("arn:aws:iam::1:instance-profile/nodes")
        );
    }

    fn offline_client() -> aws_sdk_ec2::Client {
        let conf = aws_sdk_ec2::Config::builder()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new("eu-west-1"))
            .build();
        aws_sdk_ec2::Client::from_conf(conf)
    }

    #[test]
    fn the_run_instances_request_carries_everything() {
        let req = run_instances_request(
            offline_client().run_instances(),
            &full(),
            "m-1",
            None,
            b"#!/bin/sh\necho hi\n",
            Some("/dev/xvda"),
            "0123456789abcdef",
        )
        .unwrap();
        let input = req.as_input();
        assert_eq!(input.get_image_id().as_deref(), Some("ami-1"));
        assert_eq!(
            input.get_instance_type(),
            &Some(InstanceType::from("m5.large"))
        );
        assert_eq!(
            (input.get_min_count(), input.get_max_count()),
            (&Some(1), &Some(1))
        );
        assert_eq!(
            input.get_client_token().as_deref(),
            Some("0123456789abcdef")
        );
        assert_eq!(
            input.get_user_data().as_deref(),
            Some("IyEvYmluL3NoCmVjaG8gaGkK")
        );
        assert_eq!(input.get_key_name().as_deref(), Some("ssh"));
        assert_eq!(input.get_network_interfaces().as_ref().unwrap().len(), 2);
        assert_eq!(input.get_block_device_mappings().as_ref().unwrap().len(), 2);
        let tag_specs = input.get_tag_specifications().as_ref().unwrap();
        assert_eq!(tag_specs.len(), 3);
        assert_eq!(tags::name_tag(tag_specs[0].tags()), Some("m-1"));
        assert_eq!(input.get_ebs_optimized(), &Some(true));
        assert_eq!(
            input.get_monitoring().as_ref().map(|m| m.enabled()),
            Some(Some(true))
        );
        assert!(input.get_instance_market_options().is_some());
        assert!(input.get_placement().is_some());
        assert!(input.get_metadata_options().is_some());
        assert!(input.get_cpu_options().is_some());
        assert!(input.get_capacity_reservation_specification().is_some());
        assert!(input.get_iam_instance_profile().is_some());
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

    fn instance(id: &str, state: InstanceStateName, launched: i64) -> Instance {
        Instance::builder()
            .instance_id(id)
            .private_dns_name(format!("ip-10-0-0-1.{id}.internal"))
            .private_ip_address("10.0.0.1")
            .state(InstanceState::builder().name(state).build())
            .launch_time(aws_sdk_ec2::primitives::DateTime::from_secs(launched))
            .network_interfaces(
                InstanceNetworkInterface::builder()
                    .network_interface_id("eni-1")
                    .status(NetworkInterfaceStatus::InUse)
                    .build(),
            )
            .block_device_mappings(
                InstanceBlockDeviceMapping::builder()
                    .device_name("/dev/xvda")
                    .ebs(
                        EbsInstanceBlockDevice::builder()
                            .volume_id("vol-1")
                            .status(aws_sdk_ec2::types::AttachmentStatus::Attached)
                            .build(),
                    )
                    .build(),
            )
            .build()
    }

    #[test]
    fn instances_read_back_into_names_addresses_and_resources() {
        let i = instance("i-1", InstanceStateName::Running, 10);
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
        assert_eq!(
            vm_state(Some(&InstanceStateName::Stopped)),
            ResourceState::Stopped
        );
        assert_eq!(
            vm_state(Some(&InstanceStateName::Pending)),
            ResourceState::Creating
        );
        let bare = Instance::builder().instance_id("i-2").build();
        assert_eq!(node_name(&bare), "i-2");
    }

    #[test]
    fn the_oldest_instance_wins_and_src_dst_needs_initialization() {
        let a = instance("i-b", InstanceStateName::Running, 20);
        let b = instance("i-a", InstanceStateName::Pending, 10);
        let all = [a, b];
        assert_eq!(oldest(&all).unwrap().instance_id(), Some("i-a"));
        let mut s = full();
        s.src_and_dst_checks_enabled = Some(false);
        let nic = |id: &str, kind: &str, on: bool| {
            aws_sdk_ec2::types::InstanceNetworkInterface::builder()
                .network_interface_id(id)
                .interface_type(kind)
                .source_dest_check(on)
                .build()
        };
        let with = |nics: Vec<aws_sdk_ec2::types::InstanceNetworkInterface>| {
            Instance::builder()
                .instance_id("i-c")
                .set_network_interfaces(Some(nics))
                .build()
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
