//! The AWS providerSpec (Gardener's `AWSProviderSpec` JSON field names) and its validation.
//!
//! [`parse_provider_spec`] decodes a MachineClass's `providerSpec`; [`ProviderSpec::validate`]
//! and [`validate_secret`] return *every* problem at once, each naming its field, so a user
//! fixes a class in one round. Unknown fields are ignored here (the MachineClass keeps them).

use std::collections::BTreeMap;
use std::fmt;

use mcm_api::MachineClass;
use mcm_driver::{SecretData, SpecError, SpecProblem};

/// The provider name in error messages.
pub const PROVIDER: &str = "AWS";
use serde::{Deserialize, Serialize};

use crate::tags::{CLUSTER_TAG_PREFIX, ROLE_TAG_PREFIX};

/// Secret key of the access key id.
pub const ACCESS_KEY_ID: &str = "providerAccessKeyId";
/// Secret key of the secret access key.
pub const SECRET_ACCESS_KEY: &str = "providerSecretAccessKey";
/// Alternative secret key of the access key id.
pub const ALT_ACCESS_KEY_ID: &str = "accessKeyID";
/// The secret key of the web-identity token file of workload identity (Gardener's
/// `cloudprovider` Secret).
pub const WORKLOAD_IDENTITY_TOKEN_FILE: &str = "workloadIdentityTokenFile";
/// The secret key of the IAM role workload identity assumes.
pub const ROLE_ARN: &str = "roleARN";
/// Alternative secret key of the secret access key.
pub const ALT_SECRET_ACCESS_KEY: &str = "secretAccessKey";
/// The `deviceName` that stands for the AMI's root device.
pub const ROOT_DEVICE_NAME: &str = "/root";
/// The EBS volume types AWS accepts for machines.
pub const VOLUME_TYPES: [&str; 6] = ["gp2", "gp3", "io1", "st1", "sc1", "standard"];

/// The providerSpec of an AWS MachineClass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// API version of the spec (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The AMI id (`ami-...`).
    #[serde(default)]
    pub ami: String,
    /// Block device mappings; a device named `/root` is the AMI's root device.
    #[serde(default)]
    pub block_devices: Vec<BlockDevice>,
    /// Target a capacity reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<CapacityReservation>,
    /// EBS-optimized instance.
    #[serde(default)]
    pub ebs_optimized: bool,
    /// The IAM instance profile (exactly one of name and ARN).
    #[serde(default)]
    pub iam: IamProfile,
    /// The EC2 instance type.
    #[serde(default)]
    pub machine_type: String,
    /// The SSH key pair name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    /// Detailed monitoring.
    #[serde(default)]
    pub monitoring: bool,
    /// Network interfaces (at least one).
    #[serde(default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// The AWS region.
    #[serde(default)]
    pub region: String,
    /// Set: run as a one-time spot instance; `""` means no maximum price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_price: Option<String>,
    /// `false` disables the source/destination check (NAT instances); default enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_and_dst_checks_enabled: Option<bool>,
    /// Tags of the instance, its volumes and NICs; must hold a `kubernetes.io/cluster/*` and a
    /// `kubernetes.io/role/*` key.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Instance metadata service options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_metadata_options: Option<InstanceMetadataOptions>,
    /// CPU options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_options: Option<CpuOptions>,
    /// Placement (group, tenancy, host, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Market options: the market the instance is bought in (wins over `spotPrice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_market_options: Option<InstanceMarketOptions>,
}

/// Market options, as Gardener's `AWSInstanceMarketOptions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceMarketOptions {
    /// `spot`, `capacity-block` or `interruptible-capacity-reservation` (EC2's market types).
    #[serde(default)]
    pub market_type: String,
}

/// One block device mapping.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockDevice {
    /// Device name (`/dev/sdb`, `/dev/xvdba`) or `/root`.
    #[serde(default)]
    pub device_name: String,
    /// The EBS volume.
    #[serde(default)]
    pub ebs: Ebs,
    /// Suppress a device of the AMI's mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_device: Option<String>,
    /// Instance store volume name (`ephemeralN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_name: Option<String>,
}

/// An EBS volume of a block device mapping.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ebs {
    /// Delete the volume with the instance (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// Encrypt the volume.
    #[serde(default)]
    pub encrypted: bool,
    /// Provisioned IOPS (required for io1).
    #[serde(default)]
    pub iops: i32,
    /// Throughput in MiB/s (gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<i32>,
    /// KMS key for encryption.
    #[serde(default, rename = "kmsKeyID", skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// Snapshot to create the volume from.
    #[serde(
        default,
        rename = "snapshotID",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_id: Option<String>,
    /// Size in GiB.
    #[serde(default)]
    pub volume_size: i32,
    /// Volume type, one of [`VOLUME_TYPES`].
    #[serde(default)]
    pub volume_type: String,
}

/// The IAM instance profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IamProfile {
    /// The profile's ARN.
    #[serde(default)]
    pub arn: String,
    /// The profile's name.
    #[serde(default)]
    pub name: String,
}

/// A network interface created with the instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Assign a public IPv4 address.
    #[serde(
        default,
        rename = "associatePublicIPAddress",
        skip_serializing_if = "Option::is_none"
    )]
    pub associate_public_ip_address: Option<bool>,
    /// Number of IPv6 addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address_count: Option<i32>,
    /// Number of IPv6 prefixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix_count: Option<i32>,
    /// Delete the interface with the instance (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// Description of the interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Security groups (at least one).
    #[serde(default, rename = "securityGroupIDs")]
    pub security_group_ids: Vec<String>,
    /// The subnet.
    #[serde(default, rename = "subnetID")]
    pub subnet_id: String,
    /// `interface`, `efa` or `efa-only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_type: Option<String>,
    /// Network card index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_card_index: Option<i32>,
    /// Device index (default: the position in the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_index: Option<i32>,
    /// Whether the first IPv6 address is the primary one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_ipv6: Option<bool>,
}

/// Capacity reservation targeting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservation {
    /// `capacity-reservations-only`, `open` or `none` (not together with an id or group ARN).
    #[serde(default)]
    pub capacity_reservation_preference: String,
    /// A reservation id.
    #[serde(
        default,
        rename = "capacityReservationId",
        skip_serializing_if = "Option::is_none"
    )]
    pub capacity_reservation_id: Option<String>,
    /// A reservation resource group ARN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation_resource_group_arn: Option<String>,
}

/// Instance metadata service options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceMetadataOptions {
    /// `enabled` or `disabled`.
    #[serde(default, rename = "httpEndpoint")]
    pub http_endpoint: String,
    /// PUT response hop limit (0..=64).
    #[serde(
        default,
        rename = "httpPutResponseHopLimit",
        skip_serializing_if = "Option::is_none"
    )]
    pub http_put_response_hop_limit: Option<i32>,
    /// `required` (IMDSv2 only) or `optional`.
    #[serde(default, rename = "httpTokens")]
    pub http_tokens: String,
    /// `enabled` or `disabled`.
    #[serde(default, rename = "httpProtocolIpv6")]
    pub http_protocol_ipv6: String,
}

/// CPU options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuOptions {
    /// Number of cores (required).
    #[serde(default)]
    pub core_count: Option<i32>,
    /// Threads per core, 1 or 2 (required).
    #[serde(default)]
    pub threads_per_core: Option<i32>,
    /// `enabled` or `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amd_sev_snp: Option<String>,
}

/// Placement of the instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Placement group id.
    #[serde(default, rename = "groupId", skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// `default`, `dedicated` or `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenancy: Option<String>,
    /// Dedicated host id.
    #[serde(default, rename = "hostId", skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Partition number in a partition placement group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_number: Option<i32>,
    /// `default` or `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
    /// (mcm-rs) Availability zone; usually implied by the subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
}

/// Decodes the providerSpec of `class` as Gardener's Go driver decodes it (keys matched
/// ignoring case, unknown keys ignored: [`class_warnings`] names them); no validation.
pub fn parse_provider_spec(class: &MachineClass) -> Result<ProviderSpec, SpecError> {
    mcm_driver::spec::decode_provider_spec(class, PROVIDER).map(|d| d.value)
}

/// The keys of the class's providerSpec that Gardener's Go driver would ignore, and so do we
/// (admission warnings, the class's Event).
pub fn class_warnings(class: &MachineClass) -> Vec<String> {
    mcm_driver::spec::class_warnings::<ProviderSpec>(class, PROVIDER)
}

const SPEC: &str = "providerSpec";

impl ProviderSpec {
    /// Every problem of the spec (empty: valid).
    pub fn validate(&self) -> Vec<SpecProblem> {
        let mut out = Vec::new();
        if let Some(m) = &self.instance_market_options {
            let known = aws_sdk_ec2::types::MarketType::values();
            if !known.contains(&m.market_type.as_str()) {
                out.push(SpecProblem::new(
                    format!("{SPEC}.instanceMarketOptions.marketType"),
                    format!(
                        "unsupported value {:?}: supported values: {}",
                        m.market_type,
                        known
                            .iter()
                            .map(|v| format!("{v:?}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        for (value, field) in [
            (&self.ami, "ami"),
            (&self.region, "region"),
            (&self.machine_type, "machineType"),
        ] {
            if value.trim().is_empty() {
                out.push(SpecProblem::new(format!("{SPEC}.{field}"), "is required"));
            }
        }
        if self.iam.name.is_empty() == self.iam.arn.is_empty() {
            out.push(SpecProblem::new(
                format!("{SPEC}.iam"),
                "exactly one of iam.name and iam.arn must be set",
            ));
        }
        out.extend(validate_block_devices(&self.block_devices));
        out.extend(validate_capacity_reservation(
            self.capacity_reservation.as_ref(),
        ));
        out.extend(validate_network_interfaces(&self.network_interfaces));
        out.extend(validate_tags(&self.tags));
        out.extend(validate_metadata_options(
            self.instance_metadata_options.as_ref(),
        ));
        out.extend(validate_cpu_options(self.cpu_options.as_ref()));
        out.extend(validate_placement(self.placement.as_ref()));
        if let Some(price) = self.spot_price.as_deref()
            && !price.is_empty()
            && !price.parse::<f64>().is_ok_and(|p| p.is_finite() && p > 0.0)
        {
            out.push(SpecProblem::new(
                format!("{SPEC}.spotPrice"),
                format!("{price:?} is not a positive price (use \"\" for no maximum)"),
            ));
        }
        out
    }

    /// Whether the source/destination check must be disabled on the instance.
    pub fn disables_src_dst_check(&self) -> bool {
        self.src_and_dst_checks_enabled == Some(false)
    }
}

/// Whether `name` follows AWS's data device naming (`/dev/sd[a-z]`, `/dev/xvd[a-c][a-z]?`).
pub fn is_data_device_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("/dev/") else {
        return false;
    };
    let lower = |c: u8| c.is_ascii_lowercase();
    if let Some(tail) = rest.strip_prefix("sd") {
        return tail.len() == 1 && lower(tail.as_bytes()[0]);
    }
    if let Some(tail) = rest.strip_prefix("xvd") {
        let t = tail.as_bytes();
        return match t.len() {
            1 => (b'a'..=b'c').contains(&t[0]),
            2 => (b'a'..=b'c').contains(&t[0]) && lower(t[1]),
            _ => false,
        };
    }
    false
}

fn validate_block_devices(devices: &[BlockDevice]) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    let base = format!("{SPEC}.blockDevices");
    let mut roots = 0;
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, d) in devices.iter().enumerate() {
        let at = format!("{base}[{i}]");
        if d.device_name == ROOT_DEVICE_NAME {
            roots += 1;
        } else if devices.len() > 1 && !is_data_device_name(&d.device_name) {
            out.push(SpecProblem::new(
                format!("{at}.deviceName"),
                format!(
                    "{:?} must be {ROOT_DEVICE_NAME} or match ^/dev/(sd[a-z]|xvd[a-c][a-z]?)$",
                    d.device_name
                ),
            ));
        }
        *names.entry(d.device_name.as_str()).or_default() += 1;
        if !VOLUME_TYPES.contains(&d.ebs.volume_type.as_str()) {
            out.push(SpecProblem::new(
                format!("{at}.ebs.volumeType"),
                format!(
                    "{:?} is not one of {}",
                    d.ebs.volume_type,
                    VOLUME_TYPES.join(", ")
                ),
            ));
        }
        if d.ebs.volume_size <= 0 {
            out.push(SpecProblem::new(
                format!("{at}.ebs.volumeSize"),
                "must be a positive number of GiB",
            ));
        }
        if d.ebs.iops < 0 || (d.ebs.volume_type == "io1" && d.ebs.iops == 0) {
            out.push(SpecProblem::new(
                format!("{at}.ebs.iops"),
                "must be positive (and is required for io1)",
            ));
        }
        if d.ebs.throughput.is_some_and(|t| t <= 0) {
            out.push(SpecProblem::new(
                format!("{at}.ebs.throughput"),
                "must be positive",
            ));
        }
    }
    if roots > 1 || (roots == 0 && devices.len() > 1) {
        out.push(SpecProblem::new(
            base.clone(),
            format!("exactly one device must be the root device ({ROOT_DEVICE_NAME})"),
        ));
    }
    for (name, n) in names {
        if n > 1 {
            out.push(SpecProblem::new(
                base.clone(),
                format!("device name {name:?} is used {n} times; device names must be unique"),
            ));
        }
    }
    out
}

/// The values EC2 takes for `CapacityReservationPreference`.
pub const CAPACITY_RESERVATION_PREFERENCES: [&str; 3] =
    ["capacity-reservations-only", "open", "none"];

fn validate_capacity_reservation(c: Option<&CapacityReservation>) -> Vec<SpecProblem> {
    let Some(c) = c else { return vec![] };
    let field = format!("{SPEC}.capacityReservation");
    let targeted = c.capacity_reservation_id.is_some();
    let grouped = c.capacity_reservation_resource_group_arn.is_some();
    let mut out = Vec::new();
    if !c.capacity_reservation_preference.is_empty() {
        if targeted || grouped {
            out.push(SpecProblem::new(
                field.clone(),
                "capacityReservationPreference cannot be set together with capacityReservationId or capacityReservationResourceGroupArn",
            ));
        }
        if !CAPACITY_RESERVATION_PREFERENCES.contains(&c.capacity_reservation_preference.as_str()) {
            out.push(SpecProblem::new(
                format!("{field}.capacityReservationPreference"),
                "must be `capacity-reservations-only`, `open` or `none`",
            ));
        }
    } else if targeted && grouped {
        out.push(SpecProblem::new(
            field,
            "set only one of capacityReservationId and capacityReservationResourceGroupArn",
        ));
    }
    out
}

fn validate_network_interfaces(nics: &[NetworkInterface]) -> Vec<SpecProblem> {
    let base = format!("{SPEC}.networkInterfaces");
    if nics.is_empty() {
        return vec![SpecProblem::new(
            base,
            "at least one network interface is required",
        )];
    }
    let mut out = Vec::new();
    for (i, nic) in nics.iter().enumerate() {
        let at = format!("{base}[{i}]");
        if nic.subnet_id.trim().is_empty() {
            out.push(SpecProblem::new(format!("{at}.subnetID"), "is required"));
        }
        if nic.security_group_ids.is_empty() {
            out.push(SpecProblem::new(
                format!("{at}.securityGroupIDs"),
                "at least one security group is required",
            ));
        }
        for (j, sg) in nic.security_group_ids.iter().enumerate() {
            if sg.trim().is_empty() {
                out.push(SpecProblem::new(
                    format!("{at}.securityGroupIDs[{j}]"),
                    "must not be blank",
                ));
            }
        }
    }
    out
}

fn validate_tags(tags: &BTreeMap<String, String>) -> Vec<SpecProblem> {
    let field = format!("{SPEC}.tags");
    let mut out = Vec::new();
    for prefix in [CLUSTER_TAG_PREFIX, ROLE_TAG_PREFIX] {
        if !tags
            .keys()
            .any(|k| k.starts_with(prefix) && k.len() > prefix.len())
        {
            out.push(SpecProblem::new(
                field.clone(),
                format!("a tag with a key of the form {prefix}<name> is required"),
            ));
        }
    }
    out
}

fn one_of(field: String, value: &str, allowed: &[&str]) -> Option<SpecProblem> {
    (!value.is_empty() && !allowed.contains(&value)).then(|| {
        SpecProblem::new(
            field,
            format!("{value:?} is not one of {}", allowed.join(", ")),
        )
    })
}

fn validate_metadata_options(m: Option<&InstanceMetadataOptions>) -> Vec<SpecProblem> {
    let Some(m) = m else { return vec![] };
    let base = format!("{SPEC}.instanceMetadataOptions");
    let mut out = Vec::new();
    if m.http_put_response_hop_limit
        .is_some_and(|h| !(0..=64).contains(&h))
    {
        out.push(SpecProblem::new(
            format!("{base}.httpPutResponseHopLimit"),
            "must be between 0 and 64",
        ));
    }
    out.extend(one_of(
        format!("{base}.httpEndpoint"),
        &m.http_endpoint,
        &["enabled", "disabled"],
    ));
    out.extend(one_of(
        format!("{base}.httpTokens"),
        &m.http_tokens,
        &["required", "optional"],
    ));
    out.extend(one_of(
        format!("{base}.httpProtocolIpv6"),
        &m.http_protocol_ipv6,
        &["enabled", "disabled"],
    ));
    out
}

fn validate_cpu_options(c: Option<&CpuOptions>) -> Vec<SpecProblem> {
    let Some(c) = c else { return vec![] };
    let base = format!("{SPEC}.cpuOptions");
    let mut out = Vec::new();
    // Both counts or neither (Gardener renders `cpuOptions` with only `amdSevSnp` for
    // confidential machines), as Gardener's provider validates them.
    match (c.core_count, c.threads_per_core) {
        (None, Some(_)) => out.push(SpecProblem::new(
            format!("{base}.coreCount"),
            "is required when threadsPerCore is set",
        )),
        (Some(_), None) => out.push(SpecProblem::new(
            format!("{base}.threadsPerCore"),
            "is required when coreCount is set",
        )),
        _ => {}
    }
    if c.core_count.is_some_and(|n| n <= 0) {
        out.push(SpecProblem::new(
            format!("{base}.coreCount"),
            "must be positive",
        ));
    }
    if c.threads_per_core.is_some_and(|t| t != 1 && t != 2) {
        out.push(SpecProblem::new(
            format!("{base}.threadsPerCore"),
            "must be 1 or 2",
        ));
    }
    if let Some(v) = &c.amd_sev_snp {
        out.extend(one_of(
            format!("{base}.amdSevSnp"),
            v,
            &["enabled", "disabled"],
        ));
    }
    out
}

fn validate_placement(p: Option<&Placement>) -> Vec<SpecProblem> {
    let Some(p) = p else { return vec![] };
    let base = format!("{SPEC}.placement");
    let mut out = Vec::new();
    if let Some(t) = &p.tenancy {
        out.extend(one_of(
            format!("{base}.tenancy"),
            t,
            &["default", "dedicated", "host"],
        ));
    }
    if let Some(a) = &p.affinity {
        out.extend(one_of(format!("{base}.affinity"), a, &["default", "host"]));
    }
    out
}

/// The static credentials of a secret.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct AccessKey {
    /// The access key id.
    pub id: String,
    /// The secret access key.
    pub secret: String,
}

impl fmt::Debug for AccessKey {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn non_blank<'a>(secret: &'a SecretData, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .filter_map(|k| secret.get_str(k))
        .map(str::trim)
        .find(|v| !v.is_empty())
}

/// The access key of a secret (`providerAccessKeyId`/`providerSecretAccessKey`, or
/// `accessKeyID`/`secretAccessKey`).
pub fn access_key(secret: &SecretData) -> Option<AccessKey> {
    Some(AccessKey {
        id: non_blank(secret, &[ACCESS_KEY_ID, ALT_ACCESS_KEY_ID])?.to_string(),
        secret: non_blank(secret, &[SECRET_ACCESS_KEY, ALT_SECRET_ACCESS_KEY])?.to_string(),
    })
}

/// How a secret lets the driver authenticate to AWS.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Auth {
    /// A static access key.
    AccessKey(AccessKey),
    /// Workload identity, as Gardener's provider does it: the web-identity token in
    /// `workloadIdentityTokenFile` (a file gardenlet keeps fresh, read again on every refresh)
    /// exchanged for temporary credentials of `roleARN` with STS `AssumeRoleWithWebIdentity`.
    WebIdentity {
        /// The IAM role to assume.
        role_arn: String,
        /// The path of the token file.
        token_file: std::path::PathBuf,
    },
}

impl fmt::Debug for Auth {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::AccessKey(k) => k.fmt(f),
            Auth::WebIdentity {
                role_arn,
                token_file,
            } => f
                .debug_struct("WebIdentity")
                .field("role_arn", role_arn)
                .field("token_file", token_file)
                .finish(),
        }
    }
}

/// The authentication of a secret: its access key, else its workload identity (both keys).
pub fn auth(secret: &SecretData) -> Option<Auth> {
    if let Some(key) = access_key(secret) {
        return Some(Auth::AccessKey(key));
    }
    Some(Auth::WebIdentity {
        role_arn: non_blank(secret, &[ROLE_ARN])?.to_string(),
        token_file: non_blank(secret, &[WORKLOAD_IDENTITY_TOKEN_FILE])?.into(),
    })
}

/// Every problem of the secret: credentials always, `userData` when `need_user_data`
/// (creation; deletion and listing must work without it).
pub fn validate_secret(secret: &SecretData, need_user_data: bool) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    let has_key = non_blank(secret, &[ACCESS_KEY_ID, ALT_ACCESS_KEY_ID]).is_some();
    let workload_identity = non_blank(secret, &[WORKLOAD_IDENTITY_TOKEN_FILE, ROLE_ARN]).is_some();
    if !has_key && workload_identity {
        for (key, other) in [
            (ROLE_ARN, WORKLOAD_IDENTITY_TOKEN_FILE),
            (WORKLOAD_IDENTITY_TOKEN_FILE, ROLE_ARN),
        ] {
            if non_blank(secret, &[key]).is_none() {
                out.push(SpecProblem::new(
                    format!("secretRef.{key}"),
                    format!("is required with {other} (workload identity)"),
                ));
            }
        }
    } else if !has_key {
        out.push(SpecProblem::new(
            format!("secretRef.{ACCESS_KEY_ID}"),
            format!(
                "one of {ACCESS_KEY_ID} and {ALT_ACCESS_KEY_ID} is required (or {ROLE_ARN} with \
                 {WORKLOAD_IDENTITY_TOKEN_FILE} for workload identity)"
            ),
        ));
    }
    if !workload_identity
        && non_blank(secret, &[SECRET_ACCESS_KEY, ALT_SECRET_ACCESS_KEY]).is_none()
    {
        out.push(SpecProblem::new(
            format!("secretRef.{SECRET_ACCESS_KEY}"),
            format!("one of {SECRET_ACCESS_KEY} and {ALT_SECRET_ACCESS_KEY} is required"),
        ));
    }
    if need_user_data
        && secret
            .get(mcm_driver::USER_DATA_KEY)
            .is_none_or(<[u8]>::is_empty)
    {
        out.push(SpecProblem::new(
            format!("secretRef.{}", mcm_driver::USER_DATA_KEY),
            "is required",
        ));
    }
    out
}

/// The problems of a class's providerSpec, for the admission webhook (no secret, no cloud
/// call): a class of another provider has none here.
pub fn class_problems(class: &MachineClass) -> Vec<SpecProblem> {
    mcm_driver::spec::class_problems(class, PROVIDER, parse_provider_spec, ProviderSpec::validate)
}

/// Decodes and validates the class and the secret together: every problem of both.
pub fn checked_spec(
    class: &MachineClass,
    secret: &SecretData,
    need_user_data: bool,
) -> Result<ProviderSpec, SpecError> {
    let spec = parse_provider_spec(class)?;
    let mut problems = Vec::new();
    if let Some(p) = class.provider.as_deref()
        && !p.eq_ignore_ascii_case("aws")
    {
        problems.push(SpecProblem::new(
            "provider",
            format!("{p:?} is not AWS: this driver serves AWS machine classes only"),
        ));
    }
    problems.extend(spec.validate());
    problems.extend(validate_secret(secret, need_user_data));
    if problems.is_empty() {
        Ok(spec)
    } else {
        Err(SpecError::Invalid {
            provider: PROVIDER,
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    pub(crate) fn valid_json() -> serde_json::Value {
        json!({
            "ami": "ami-123",
            "region": "eu-west-1",
            "machineType": "m5.large",
            "iam": { "name": "nodes" },
            "keyName": "ssh",
            "networkInterfaces": [{ "subnetID": "subnet-1", "securityGroupIDs": ["sg-1"] }],
            "tags": { "kubernetes.io/cluster/shoot": "1", "kubernetes.io/role/node": "1" },
            "blockDevices": [
                { "deviceName": "/root", "ebs": { "volumeSize": 50, "volumeType": "gp3", "throughput": 200, "kmsKeyID": "k", "snapshotID": "snap" } },
                { "deviceName": "/dev/sdb", "ebs": { "volumeSize": 100, "volumeType": "io1", "iops": 3000, "deleteOnTermination": false, "encrypted": true } }
            ],
            "srcAndDstChecksEnabled": false,
            "spotPrice": "",
            "instanceMetadataOptions": { "httpTokens": "required", "httpPutResponseHopLimit": 2 },
            "cpuOptions": { "coreCount": 2, "threadsPerCore": 1 },
            "placement": { "tenancy": "dedicated", "groupId": "pg-1" },
            "capacityReservation": { "capacityReservationId": "cr-1" },
            "unknownField": { "kept": "by the class, ignored here" }
        })
    }

    fn class(spec: serde_json::Value) -> MachineClass {
        MachineClass {
            provider_spec: spec,
            provider: Some("AWS".into()),
            ..Default::default()
        }
    }

    fn secret() -> SecretData {
        SecretData::from_pairs([
            ("providerAccessKeyId", "AKIA"),
            ("providerSecretAccessKey", "s3cr3t"),
            ("userData", "#!/bin/sh"),
        ])
    }

    #[test]
    fn a_gardener_spec_decodes_with_its_json_names() {
        let spec = parse_provider_spec(&class(valid_json())).unwrap();
        assert_eq!(spec.iam.name, "nodes");
        assert_eq!(spec.network_interfaces[0].subnet_id, "subnet-1");
        assert_eq!(spec.network_interfaces[0].security_group_ids, vec!["sg-1"]);
        assert_eq!(spec.block_devices[0].ebs.kms_key_id.as_deref(), Some("k"));
        assert_eq!(
            spec.block_devices[0].ebs.snapshot_id.as_deref(),
            Some("snap")
        );
        assert_eq!(spec.block_devices[1].ebs.iops, 3000);
        assert_eq!(spec.spot_price.as_deref(), Some(""));
        assert!(spec.disables_src_dst_check());
        assert_eq!(
            spec.instance_metadata_options
                .as_ref()
                .unwrap()
                .http_put_response_hop_limit,
            Some(2)
        );
        assert_eq!(
            spec.capacity_reservation
                .as_ref()
                .unwrap()
                .capacity_reservation_id
                .as_deref(),
            Some("cr-1")
        );
        assert_eq!(spec.validate(), vec![]);
        assert!(checked_spec(&class(valid_json()), &secret(), true).is_ok());
    }

    #[test]
    fn a_capacity_reservation_preference_is_one_ec2_takes() {
        let problems = |preference: &str| {
            validate_capacity_reservation(Some(&CapacityReservation {
                capacity_reservation_preference: preference.into(),
                ..CapacityReservation::default()
            }))
        };
        for ok in ["capacity-reservations-only", "open", "none"] {
            assert_eq!(problems(ok), vec![], "{ok}");
        }
        assert_eq!(
            problems("targeted")[0].field,
            "providerSpec.capacityReservation.capacityReservationPreference"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once_naming_its_field() {
        let spec: ProviderSpec = serde_json::from_value(json!({
            "iam": { "name": "a", "arn": "b" },
            "networkInterfaces": [{ "securityGroupIDs": [""] }],
            "tags": { "kubernetes.io/cluster/x": "1" },
            "blockDevices": [
                { "deviceName": "/root", "ebs": { "volumeSize": 0, "volumeType": "fast" } },
                { "deviceName": "/root", "ebs": { "volumeSize": 1, "volumeType": "io1", "throughput": 0 } },
                { "deviceName": "sdz", "ebs": { "volumeSize": 1, "volumeType": "gp2" } }
            ],
            "instanceMetadataOptions": { "httpTokens": "sometimes", "httpPutResponseHopLimit": 65 },
            "cpuOptions": { "threadsPerCore": 3 },
            "spotPrice": "cheap",
            "placement": { "tenancy": "shared" },
            "capacityReservation": { "capacityReservationPreference": "open", "capacityReservationId": "cr" }
        }))
        .unwrap();
        let fields: Vec<String> = spec.validate().into_iter().map(|p| p.field).collect();
        for want in [
            "providerSpec.ami",
            "providerSpec.region",
            "providerSpec.machineType",
            "providerSpec.iam",
            "providerSpec.blockDevices[0].ebs.volumeType",
            "providerSpec.blockDevices[0].ebs.volumeSize",
            "providerSpec.blockDevices[1].ebs.iops",
            "providerSpec.blockDevices[1].ebs.throughput",
            "providerSpec.blockDevices[2].deviceName",
            "providerSpec.blockDevices",
            "providerSpec.capacityReservation",
            "providerSpec.networkInterfaces[0].subnetID",
            "providerSpec.networkInterfaces[0].securityGroupIDs[0]",
            "providerSpec.tags",
            "providerSpec.instanceMetadataOptions.httpPutResponseHopLimit",
            "providerSpec.instanceMetadataOptions.httpTokens",
            "providerSpec.cpuOptions.coreCount",
            "providerSpec.cpuOptions.threadsPerCore",
            "providerSpec.spotPrice",
            "providerSpec.placement.tenancy",
        ] {
            assert!(fields.iter().any(|f| f == want), "{want} in {fields:?}");
        }
        // Two /root devices and a duplicated name are separate problems of blockDevices.
        assert_eq!(
            fields
                .iter()
                .filter(|f| *f == "providerSpec.blockDevices")
                .count(),
            2
        );
    }

    #[test]
    fn tags_need_a_cluster_and_a_role_key() {
        let problems = validate_tags(&BTreeMap::from([
            ("kubernetes.io/cluster/".to_string(), "1".to_string()),
            ("team".to_string(), "a".to_string()),
        ]));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].detail.contains("kubernetes.io/cluster/"));
        assert!(problems[1].detail.contains("kubernetes.io/role/"));
        assert!(
            validate_tags(&BTreeMap::from([
                ("kubernetes.io/cluster/c".to_string(), "1".to_string()),
                ("kubernetes.io/role/node".to_string(), "1".to_string()),
            ]))
            .is_empty()
        );
    }

    #[test]
    fn data_device_names_follow_aws_naming() {
        for ok in ["/dev/sdb", "/dev/sdz", "/dev/xvda", "/dev/xvdcz"] {
            assert!(is_data_device_name(ok), "{ok}");
        }
        for bad in [
            "/dev/sd",
            "/dev/sdbb",
            "/dev/xvdd",
            "/dev/xvdaaa",
            "sdb",
            "/dev/nvme0n1",
        ] {
            assert!(!is_data_device_name(bad), "{bad}");
        }
        // A single device may be unnamed (it is the root device).
        let single = vec![BlockDevice {
            ebs: Ebs {
                volume_size: 10,
                volume_type: "gp2".into(),
                ..Default::default()
            },
            ..Default::default()
        }];
        assert_eq!(validate_block_devices(&single), vec![]);
    }

    #[test]
    fn secrets_need_credentials_under_either_name_and_user_data_for_creation() {
        let alt = SecretData::from_pairs([("accessKeyID", "A"), ("secretAccessKey", "S")]);
        assert_eq!(validate_secret(&alt, false), vec![]);
        let problems = validate_secret(&alt, true);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field, "secretRef.userData");
        let key = access_key(&alt).unwrap();
        assert_eq!(key.id, "A");
        assert!(
            !format!("{key:?}").contains('S'),
            "the secret is not printed"
        );
        let empty = SecretData::from_pairs([("providerAccessKeyId", " ")]);
        let fields: Vec<_> = validate_secret(&empty, false)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(
            fields,
            vec![
                "secretRef.providerAccessKeyId",
                "secretRef.providerSecretAccessKey"
            ]
        );
        assert_eq!(access_key(&empty), None);
    }

    #[test]
    fn class_and_secret_problems_are_reported_together() {
        let mut spec = valid_json();
        spec["region"] = json!("");
        let mut c = class(spec);
        c.provider = Some("GCP".into());
        let err = checked_spec(&c, &SecretData::default(), true).unwrap_err();
        let text = err.to_string();
        for want in [
            "provider:",
            "providerSpec.region",
            "secretRef.providerAccessKeyId",
            "secretRef.userData",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        let bad = class(json!({ "ami": 5 }));
        assert!(matches!(
            parse_provider_spec(&bad),
            Err(SpecError::Decode { .. })
        ));
    }
}
