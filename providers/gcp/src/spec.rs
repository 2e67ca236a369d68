//! The GCP providerSpec (Gardener's `GCPProviderSpec` JSON field names) and its validation.
//!
//! [`parse_provider_spec`] decodes a MachineClass's `providerSpec`; [`ProviderSpec::validate`]
//! and [`validate_secret`] return *every* problem at once, each naming its field, so a user
//! fixes a class in one round. Unknown fields are ignored here (the MachineClass keeps them).
//!
//! The rules and messages follow Gardener's provider (`pkg/gcp/validation`), with field paths
//! under `providerSpec.` and three of its path slips corrected (a missing network interface is
//! reported at `providerSpec.networkInterfaces`, a forbidden metadata key at
//! `providerSpec.metadata[i].key`, a disk's KMS key at `providerSpec.disks[i].encryption`).
//! Beyond Gardener's rules, the checks GCE would otherwise fail a create with are made here too
//! (exactly one boot disk, label syntax, preemptible scheduling, the cluster and role tags that
//! finding the machines again depends on).

use std::collections::BTreeMap;
use std::fmt;

use mcm_api::MachineClass;
use mcm_driver::{SecretData, SpecError, SpecProblem, USER_DATA_KEY};

/// The provider name in error messages.
pub const PROVIDER: &str = "GCP";
use serde::{Deserialize, Serialize};

/// Secret keys that may hold the credentials JSON, in the order they are looked up.
pub const CREDENTIALS_KEYS: [&str; 3] = [
    "serviceAccountJSON",
    "serviceaccount.json",
    "credentialsConfig",
];
/// Secret key of the project, when the credentials JSON has no `project_id`.
pub const PROJECT_ID_KEY: &str = "projectID";
/// Prefix of the network tag naming the cluster.
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes-io-cluster-";
/// Prefix of the network tag naming the node role.
pub const ROLE_TAG_PREFIX: &str = "kubernetes-io-role-";
/// The disk `type` of a local SSD.
pub const DISK_TYPE_SCRATCH: &str = "SCRATCH";
/// Disk interfaces of a local SSD.
pub const SCRATCH_INTERFACES: [&str; 2] = ["NVME", "SCSI"];
/// `scheduling.onHostMaintenance` values.
pub const ON_HOST_MAINTENANCE: [&str; 2] = ["MIGRATE", "TERMINATE"];
/// Metadata key of cloud-config user data.
pub const USER_DATA_METADATA_KEY: &str = "user-data";
/// Metadata key of user data that is a script.
pub const STARTUP_SCRIPT_METADATA_KEY: &str = "startup-script";
/// The token URL external-account credentials must use.
pub const STS_TOKEN_URL: &str = "https://sts.googleapis.com/v1/token";
/// The subject token type external-account credentials must use.
pub const JWT_SUBJECT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
/// The token file external-account credentials must read (Gardener's workload identity).
pub const WORKLOAD_IDENTITY_TOKEN_FILE: &str =
    "/var/run/secrets/gardener.cloud/workload-identity/token";

/// The providerSpec of a GCP MachineClass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// API version of the spec (informational; Gardener's field has no JSON tag).
    #[serde(
        rename = "APIVersion",
        alias = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Allow the instance to send and receive packets for other addresses.
    #[serde(default, alias = "canIPForward")]
    pub can_ip_forward: bool,
    /// Protect the instance from deletion.
    #[serde(default)]
    pub deletion_protection: bool,
    /// The instance's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Disks, the boot disk among them.
    #[serde(default)]
    pub disks: Vec<Disk>,
    /// GPUs to attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Gpu>,
    /// Instance labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The machine type name, e.g. `n1-standard-2`.
    #[serde(default)]
    pub machine_type: String,
    /// Metadata items (user data comes from the secret, not from here).
    #[serde(default)]
    pub metadata: Vec<MetadataItem>,
    /// The minimum CPU platform, e.g. `Intel Skylake`.
    #[serde(
        default,
        alias = "minCPUPlatform",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_cpu_platform: Option<String>,
    /// Network interfaces (at least one).
    #[serde(default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// The region, e.g. `europe-west1`.
    #[serde(default)]
    pub region: String,
    /// Scheduling options.
    #[serde(default)]
    pub scheduling: Scheduling,
    /// Service accounts of the instance.
    #[serde(default)]
    pub service_accounts: Vec<ServiceAccount>,
    /// Network tags; must hold a `kubernetes-io-cluster-*` and a `kubernetes-io-role-*` tag,
    /// by which the machines of a cluster are found.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The zone, e.g. `europe-west1-b`.
    #[serde(default)]
    pub zone: String,
    /// Shielded VM options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shielded_instance_configuration: Option<ShieldedInstanceConfiguration>,
    /// Advanced machine features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advanced_machine_features: Option<AdvancedMachineFeatures>,
}

/// One disk of the instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Delete the disk with the instance (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete: Option<bool>,
    /// The boot disk.
    #[serde(default)]
    pub boot: bool,
    /// Size in GB (persistent disks; 0: the image's size).
    #[serde(default, alias = "sizeGB")]
    pub size_gb: i64,
    /// The disk type name (`pd-standard`, `pd-ssd`, `pd-balanced`, ...), or `SCRATCH` for a
    /// local SSD. Empty: GCE's default (`pd-standard`).
    #[serde(default, rename = "type")]
    pub disk_type: String,
    /// `NVME` or `SCSI`, for a local SSD.
    #[serde(default)]
    pub interface: String,
    /// The source image, e.g. `projects/debian-cloud/global/images/family/debian-12`.
    #[serde(default)]
    pub image: String,
    /// Customer-managed encryption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<DiskEncryption>,
    /// Disk labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Provisioned IOPS (0: the type's default).
    #[serde(default)]
    pub provisioned_iops: i64,
    /// Provisioned throughput in MB/s (0: the type's default).
    #[serde(default)]
    pub provisioned_throughput: i64,
    /// The storage pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_pool: Option<String>,
}

impl Disk {
    /// A local SSD.
    pub fn is_scratch(&self) -> bool {
        self.disk_type == DISK_TYPE_SCRATCH
    }

    /// Whether GCE deletes the disk with the instance.
    pub fn auto_delete(&self) -> bool {
        self.auto_delete.unwrap_or(true)
    }
}

/// Customer-managed encryption of a disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskEncryption {
    /// The Cloud KMS key.
    #[serde(default)]
    pub kms_key_name: String,
    /// The service account using the key (empty: the Compute Engine service agent).
    #[serde(default)]
    pub kms_key_service_account: String,
}

/// A metadata item.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataItem {
    /// The key.
    #[serde(default)]
    pub key: String,
    /// The value (may be null).
    #[serde(default)]
    pub value: Option<String>,
}

/// A network interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Do not attach an ephemeral external IP (Gardener's key `disableExternalIP`, set on
    /// every class its extension writes).
    #[serde(default, rename = "disableExternalIP")]
    pub disable_external_ip: bool,
    /// The network name.
    #[serde(default)]
    pub network: String,
    /// The subnetwork name (in the spec's region).
    #[serde(default)]
    pub subnetwork: String,
    /// `IPV4_ONLY` or `IPV4_IPV6`.
    #[serde(default)]
    pub stack_type: String,
    /// `EXTERNAL` or `INTERNAL` (Gardener's JSON key is `ipv6accessType`).
    #[serde(default, rename = "ipv6accessType", alias = "ipv6AccessType")]
    pub ipv6_access_type: String,
    /// Give the interface an alias IP range (Gardener's key `useAliasIPs`).
    #[serde(default, rename = "useAliasIPs")]
    pub use_alias_ips: bool,
    /// The alias range's CIDR size, e.g. `/24`.
    #[serde(default)]
    pub ip_cidr_range: String,
    /// The subnetwork's secondary range the alias range comes from.
    #[serde(default)]
    pub subnetwork_range_name: String,
}

/// Scheduling options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scheduling {
    /// Restart the instance after a crash or maintenance.
    #[serde(default)]
    pub automatic_restart: bool,
    /// `MIGRATE` or `TERMINATE`.
    #[serde(default)]
    pub on_host_maintenance: String,
    /// A preemptible instance.
    #[serde(default)]
    pub preemptible: bool,
}

/// A service account of the instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceAccount {
    /// Its email.
    #[serde(default)]
    pub email: String,
    /// OAuth scopes.
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// GPUs of the instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// The accelerator type name, e.g. `nvidia-tesla-t4`.
    #[serde(default)]
    pub accelerator_type: String,
    /// How many.
    #[serde(default)]
    pub count: i64,
}

/// Shielded VM options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShieldedInstanceConfiguration {
    /// Integrity monitoring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_monitoring: Option<bool>,
    /// Secure boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Virtual TPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtpm: Option<bool>,
}

/// Advanced machine features.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedMachineFeatures {
    /// Nested virtualization.
    #[serde(default)]
    pub enable_nested_virtualization: bool,
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

/// The network tags naming a cluster and a role, by which the machines are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTags {
    /// The `kubernetes-io-cluster-*` tag.
    pub cluster: String,
    /// The `kubernetes-io-role-*` tag.
    pub role: String,
}

impl ClusterTags {
    /// The cluster and role tags among `tags` (the last of each, as Gardener's provider picks
    /// them), or `None` if either is missing.
    pub fn from_tags<S: AsRef<str>>(tags: &[S]) -> Option<ClusterTags> {
        let last = |prefix: &str| {
            tags.iter()
                .map(AsRef::as_ref)
                .rfind(|t| t.contains(prefix))
                .map(str::to_string)
        };
        Some(ClusterTags {
            cluster: last(CLUSTER_TAG_PREFIX)?,
            role: last(ROLE_TAG_PREFIX)?,
        })
    }

    /// Whether an instance with network tags `tags` belongs to this cluster and role.
    pub fn matches<S: AsRef<str>>(&self, tags: &[S]) -> bool {
        ClusterTags::from_tags(tags).as_ref() == Some(self)
    }
}

/// Whether `name` is a valid GCE resource name (RFC 1035, 1..=63 characters).
pub fn is_resource_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// What is wrong with a GCE label key, if anything (GCE: 1..=63 characters, lowercase
/// letters, digits, `_` and `-`, starting with a lowercase letter).
pub fn label_key_problem(key: &str) -> Option<&'static str> {
    let first = key.chars().next()?;
    if key.chars().count() > 63 {
        return Some("label keys have at most 63 characters");
    }
    if !first.is_lowercase() {
        return Some("label keys start with a lowercase letter");
    }
    if !key.chars().all(label_char) {
        return Some("label keys hold only lowercase letters, digits, '_' and '-'");
    }
    None
}

/// What is wrong with a GCE label value, if anything (0..=63 characters, lowercase letters,
/// digits, `_` and `-`).
pub fn label_value_problem(value: &str) -> Option<&'static str> {
    if value.chars().count() > 63 {
        return Some("label values have at most 63 characters");
    }
    if !value.chars().all(label_char) {
        return Some("label values hold only lowercase letters, digits, '_' and '-'");
    }
    None
}

fn label_char(c: char) -> bool {
    c.is_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
}

fn labels_problems(labels: &BTreeMap<String, String>, field: &str, out: &mut Vec<SpecProblem>) {
    for (k, v) in labels {
        if k.is_empty() {
            out.push(SpecProblem::new(field, "label keys must not be empty"));
        } else if let Some(p) = label_key_problem(k) {
            out.push(SpecProblem::new(format!("{field}[{k:?}]"), p));
        }
        if let Some(p) = label_value_problem(v) {
            out.push(SpecProblem::new(format!("{field}[{k:?}]"), p));
        }
    }
}

impl ProviderSpec {
    /// Every problem of the spec (empty: valid).
    pub fn validate(&self) -> Vec<SpecProblem> {
        let mut out = Vec::new();
        self.validate_disks(&mut out);
        for (value, field, what) in [
            (&self.machine_type, "machineType", "machineType is required"),
            (&self.region, "region", "region is required"),
            (&self.zone, "zone", "zone is required"),
        ] {
            if value.trim().is_empty() {
                out.push(SpecProblem::new(format!("{SPEC}.{field}"), what));
            }
        }
        if !self.region.is_empty()
            && !self.zone.is_empty()
            && !self.zone.starts_with(&format!("{}-", self.region))
        {
            out.push(SpecProblem::new(
                format!("{SPEC}.zone"),
                format!("zone {:?} is not in region {:?}", self.zone, self.region),
            ));
        }
        self.validate_network_interfaces(&mut out);
        for (i, item) in self.metadata.iter().enumerate() {
            if item.key == USER_DATA_METADATA_KEY {
                out.push(SpecProblem::new(
                    format!("{SPEC}.metadata[{i}].key"),
                    "user-data key is forbidden in metadata",
                ));
            } else if item.key.trim().is_empty() {
                out.push(SpecProblem::new(
                    format!("{SPEC}.metadata[{i}].key"),
                    "metadata keys must not be empty",
                ));
            }
        }
        if let Some(gpu) = &self.gpu {
            if gpu.accelerator_type.trim().is_empty() {
                out.push(SpecProblem::new(
                    format!("{SPEC}.gpu.acceleratorType"),
                    "accelerator type needs to be provided",
                ));
            }
            if gpu.count <= 0 {
                out.push(SpecProblem::new(
                    format!("{SPEC}.gpu.count"),
                    "gpu count must be > 0",
                ));
            }
        }
        self.validate_scheduling(&mut out);
        for (i, sa) in self.service_accounts.iter().enumerate() {
            if sa.email.trim().is_empty() {
                out.push(SpecProblem::new(
                    format!("{SPEC}.serviceAccounts[{i}].email"),
                    "email is required",
                ));
            }
        }
        labels_problems(&self.labels, &format!("{SPEC}.labels"), &mut out);
        if ClusterTags::from_tags(&self.tags).is_none() {
            out.push(SpecProblem::new(
                format!("{SPEC}.tags"),
                format!(
                    "a {CLUSTER_TAG_PREFIX}<cluster> and a {ROLE_TAG_PREFIX}<role> tag are required: \
                     the machines of a cluster are found by them"
                ),
            ));
        }
        out
    }

    fn validate_disks(&self, out: &mut Vec<SpecProblem>) {
        if self.disks.is_empty() {
            out.push(SpecProblem::new(
                format!("{SPEC}.disks"),
                "at least one disk is required",
            ));
            return;
        }
        let boot = self.disks.iter().filter(|d| d.boot).count();
        if boot != 1 {
            out.push(SpecProblem::new(
                format!("{SPEC}.disks"),
                format!("exactly one disk must have boot: true, found {boot}"),
            ));
        }
        for (i, d) in self.disks.iter().enumerate() {
            let at = |f: &str| format!("{SPEC}.disks[{i}].{f}");
            if d.is_scratch() {
                if !SCRATCH_INTERFACES.contains(&d.interface.as_str()) {
                    out.push(SpecProblem::new(
                        at("interface"),
                        format!(
                            "unsupported value {:?}: supported values: \"NVME\", \"SCSI\"",
                            d.interface
                        ),
                    ));
                }
                if d.boot {
                    out.push(SpecProblem::new(
                        at("boot"),
                        "a SCRATCH disk cannot be the boot disk",
                    ));
                }
            }
            if d.boot && d.image.trim().is_empty() {
                out.push(SpecProblem::new(
                    at("image"),
                    "image is required for boot disk",
                ));
            }
            for (value, field) in [
                (d.size_gb, "sizeGb"),
                (d.provisioned_iops, "provisionedIops"),
                (d.provisioned_throughput, "provisionedThroughput"),
            ] {
                if value < 0 {
                    out.push(SpecProblem::new(
                        at(field),
                        format!("must not be negative, got {value}"),
                    ));
                }
            }
            if let Some(enc) = &d.encryption {
                if enc.kms_key_name.trim().is_empty() {
                    out.push(SpecProblem::new(
                        at("encryption.kmsKeyName"),
                        "kmsKeyName is required to be specified",
                    ));
                }
                if !enc.kms_key_service_account.is_empty()
                    && enc.kms_key_service_account.trim().is_empty()
                {
                    out.push(SpecProblem::new(
                        at("encryption.kmsKeyServiceAccount"),
                        "kmsKeyServiceAccount should either be explicitly specified without spaces or left \
                         un-specified to default to the Compute Service Agent",
                    ));
                }
            }
            labels_problems(&d.labels, &at("labels"), out);
        }
    }

    fn validate_network_interfaces(&self, out: &mut Vec<SpecProblem>) {
        if self.network_interfaces.is_empty() {
            out.push(SpecProblem::new(
                format!("{SPEC}.networkInterfaces"),
                "at least one network interface is required",
            ));
        }
        for (i, nic) in self.network_interfaces.iter().enumerate() {
            let at = |f: &str| format!("{SPEC}.networkInterfaces[{i}]{f}");
            if nic.network.is_empty() && nic.subnetwork.is_empty() {
                out.push(SpecProblem::new(
                    at(""),
                    "either network or subnetwork or both is required",
                ));
            }
            if !["", "IPV4_IPV6", "IPV4_ONLY"].contains(&nic.stack_type.as_str()) {
                out.push(SpecProblem::new(
                    at(".stackType"),
                    format!(
                        "invalid value {:?}: must be either IPV4_IPV6 or IPV4_ONLY",
                        nic.stack_type
                    ),
                ));
            }
            if !["", "EXTERNAL", "INTERNAL"].contains(&nic.ipv6_access_type.as_str()) {
                out.push(SpecProblem::new(
                    at(".ipv6AccessType"),
                    format!(
                        "invalid value {:?}: must be either EXTERNAL or INTERNAL",
                        nic.ipv6_access_type
                    ),
                ));
            }
            if let Some(p) = cidr_size_problem(&nic.ip_cidr_range) {
                out.push(SpecProblem::new(
                    at(".ipCidrRange"),
                    format!("invalid value {:?}: {p}", nic.ip_cidr_range),
                ));
            }
        }
    }

    fn validate_scheduling(&self, out: &mut Vec<SpecProblem>) {
        let s = &self.scheduling;
        let field = format!("{SPEC}.scheduling.onHostMaintenance");
        if !ON_HOST_MAINTENANCE.contains(&s.on_host_maintenance.as_str()) {
            out.push(SpecProblem::new(
                &field,
                format!(
                    "unsupported value {:?}: supported values: \"MIGRATE\", \"TERMINATE\"",
                    s.on_host_maintenance
                ),
            ));
        } else if s.on_host_maintenance != "TERMINATE" {
            if self.gpu.is_some() {
                out.push(SpecProblem::new(
                    &field,
                    "liveMigration is not allowed for VMs with gpu attached, use \"TERMINATE\" instead",
                ));
            }
            if s.preemptible {
                out.push(SpecProblem::new(
                    &field,
                    "preemptible VMs must use \"TERMINATE\"",
                ));
            }
        }
        if s.preemptible && s.automatic_restart {
            out.push(SpecProblem::new(
                format!("{SPEC}.scheduling.automaticRestart"),
                "preemptible VMs cannot restart automatically",
            ));
        }
    }
}

/// What is wrong with an alias range size like `/24`, if anything (empty is fine).
fn cidr_size_problem(range: &str) -> Option<String> {
    if range.is_empty() {
        return None;
    }
    let Some(size) = range.strip_prefix('/') else {
        return Some("CIDR range must start with '/'".into());
    };
    match size.parse::<i64>() {
        Err(_) => Some(format!("invalid CIDR mask size: {size}")),
        Ok(n) if !(0..=32).contains(&n) => Some("CIDR mask size must be between 0 and 32".into()),
        Ok(_) => None,
    }
}

/// The kind of credentials in the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialsKind {
    /// A service-account key (`type: service_account`).
    ServiceAccount,
    /// Workload identity federation (`type: external_account`, Gardener's token file).
    ExternalAccount,
}

/// The credentials of a class's secret: the JSON, its kind and the project.
#[derive(Clone, PartialEq)]
pub struct GcpCredentials {
    /// The secret key it came from.
    pub key: &'static str,
    /// The credentials JSON.
    pub json: serde_json::Value,
    /// Its kind.
    pub kind: CredentialsKind,
    /// The project (the JSON's `project_id`, else the secret's `projectID`).
    pub project: String,
}

impl fmt::Debug for GcpCredentials {
    /// Never prints the key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcpCredentials")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// Fields a service-account key may have (as Gardener's provider allows them).
const SERVICE_ACCOUNT_FIELDS: [&str; 11] = [
    "type",
    "project_id",
    "client_email",
    "universe_domain",
    "auth_uri",
    "auth_provider_x509_cert_url",
    "client_x509_cert_url",
    "client_id",
    "private_key_id",
    "private_key",
    "token_uri",
];

/// Reads the credentials of `secret`, or every problem with them.
pub fn credentials(secret: &SecretData) -> Result<GcpCredentials, Vec<SpecProblem>> {
    let field = |k: &str| format!("secretRef.{k}");
    let Some((key, raw)) = CREDENTIALS_KEYS
        .iter()
        .find_map(|k| secret.get_str(k).map(|v| (*k, v.trim())))
    else {
        return Err(vec![SpecProblem::new(
            field(CREDENTIALS_KEYS[0]),
            "secret serviceAccountJSON, serviceaccount.json or credentialsConfig is required field",
        )]);
    };
    let json: serde_json::Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            return Err(vec![SpecProblem::new(
                field(key),
                format!("is not valid JSON: {e}"),
            )]);
        }
    };
    let mut problems = Vec::new();
    let text = |name: &str| {
        json.get(name)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let kind = match text("type").as_str() {
        "service_account" => {
            if let Some(obj) = json.as_object() {
                for (k, v) in obj {
                    if !SERVICE_ACCOUNT_FIELDS.contains(&k.as_str()) {
                        problems.push(SpecProblem::new(
                            field(key),
                            format!(
                                "forbidden field {k:?} in a service-account key; allowed fields are {}",
                                SERVICE_ACCOUNT_FIELDS.join(", ")
                            ),
                        ));
                    } else if !v.is_string() {
                        problems.push(SpecProblem::new(
                            field(key),
                            format!("field {k:?} must be a string"),
                        ));
                    }
                }
            }
            for required in ["client_email", "private_key"] {
                if text(required).is_empty() {
                    problems.push(SpecProblem::new(
                        field(key),
                        format!("{required} is required"),
                    ));
                }
            }
            CredentialsKind::ServiceAccount
        }
        "external_account" => {
            if text("token_url") != STS_TOKEN_URL {
                problems.push(SpecProblem::new(
                    field(key),
                    format!("token_url must be {STS_TOKEN_URL:?}"),
                ));
            }
            let impersonation = text("service_account_impersonation_url");
            if !impersonation.is_empty() && !is_impersonation_url(&impersonation) {
                problems.push(SpecProblem::new(
                    field(key),
                    "service_account_impersonation_url must be \
                     https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/<email>:generateAccessToken",
                ));
            }
            if text("subject_token_type") != JWT_SUBJECT_TOKEN_TYPE {
                problems.push(SpecProblem::new(
                    field(key),
                    format!("subject_token_type must be {JWT_SUBJECT_TOKEN_TYPE:?}"),
                ));
            }
            let file = json
                .pointer("/credential_source/file")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            if file != WORKLOAD_IDENTITY_TOKEN_FILE {
                problems.push(SpecProblem::new(
                    field(key),
                    format!("credential_source.file must be {WORKLOAD_IDENTITY_TOKEN_FILE:?}"),
                ));
            }
            CredentialsKind::ExternalAccount
        }
        other => {
            problems.push(SpecProblem::new(
                field(key),
                format!("forbidden credential type {other:?} used. Only \"service_account\" or \"external_account\" is allowed"),
            ));
            CredentialsKind::ServiceAccount
        }
    };
    let project = match text("project_id") {
        p if !p.is_empty() => p,
        _ => secret
            .get_str(PROJECT_ID_KEY)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    if project.is_empty() {
        problems.push(SpecProblem::new(
            field(key),
            format!("no project id specified: neither project_id in the credentials nor {PROJECT_ID_KEY} in the secret"),
        ));
    }
    if problems.is_empty() {
        Ok(GcpCredentials {
            key,
            json,
            kind,
            project,
        })
    } else {
        Err(problems)
    }
}

fn is_impersonation_url(url: &str) -> bool {
    url.strip_prefix("https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/")
        .and_then(|rest| rest.strip_suffix(":generateAccessToken"))
        .is_some_and(|email| !email.is_empty())
}

/// Every problem of the secret: credentials, and user data when `need_user_data`.
pub fn validate_secret(secret: &SecretData, need_user_data: bool) -> Vec<SpecProblem> {
    let mut out = credentials(secret).err().unwrap_or_default();
    if need_user_data && secret.get(USER_DATA_KEY).is_none() {
        out.push(SpecProblem::new(
            format!("secretRef.{USER_DATA_KEY}"),
            "secret userData is required field",
        ));
    }
    out
}

/// The provider field must name GCP (if set).
fn provider_problem(class: &MachineClass) -> Option<SpecProblem> {
    let p = class.provider.as_deref()?;
    (!p.eq_ignore_ascii_case("gcp")).then(|| {
        SpecProblem::new(
            "provider",
            format!("requested for Provider {p:?}, we only support \"GCP\""),
        )
    })
}

/// The problems of a class's providerSpec, for the admission webhook (no secret, no cloud
/// call): a class of another provider has none here.
pub fn class_problems(class: &MachineClass) -> Vec<SpecProblem> {
    mcm_driver::spec::class_problems(class, PROVIDER, parse_provider_spec, ProviderSpec::validate)
}

/// Decodes and validates a class and its secret for creating a machine (every problem).
pub fn checked_spec(class: &MachineClass, secret: &SecretData) -> Result<ProviderSpec, SpecError> {
    let spec = parse_provider_spec(class)?;
    let mut problems: Vec<SpecProblem> = provider_problem(class).into_iter().collect();
    problems.extend(spec.validate());
    problems.extend(validate_secret(secret, true));
    if problems.is_empty() {
        Ok(spec)
    } else {
        Err(SpecError::Invalid {
            provider: PROVIDER,
            problems,
        })
    }
}

/// Decodes and validates what finding, reading and deleting machines needs (zone, tags,
/// credentials), so a class that became invalid otherwise does not block deleting its machines.
pub fn lookup_spec(class: &MachineClass, secret: &SecretData) -> Result<ProviderSpec, SpecError> {
    let spec = parse_provider_spec(class)?;
    let mut problems: Vec<SpecProblem> = provider_problem(class).into_iter().collect();
    if spec.zone.trim().is_empty() {
        problems.push(SpecProblem::new(format!("{SPEC}.zone"), "zone is required"));
    }
    if ClusterTags::from_tags(&spec.tags).is_none() {
        problems.push(SpecProblem::new(
            format!("{SPEC}.tags"),
            format!(
                "a {CLUSTER_TAG_PREFIX}<cluster> and a {ROLE_TAG_PREFIX}<role> tag are required"
            ),
        ));
    }
    problems.extend(validate_secret(secret, false));
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
pub(crate) mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// A valid spec as Gardener writes one.
    pub(crate) fn gardener_spec() -> serde_json::Value {
        json!({
            "canIpForward": true,
            "deletionProtection": false,
            "description": "a worker",
            "disks": [
                {"autoDelete": true, "boot": true, "sizeGb": 50, "type": "pd-balanced",
                 "image": "projects/debian-cloud/global/images/family/debian-12",
                 "labels": {"name": "shoot--a--b"}},
                {"type": "SCRATCH", "interface": "NVME"}
            ],
            "labels": {"name": "shoot--a--b"},
            "machineType": "n1-standard-2",
            "metadata": [{"key": "block-project-ssh-keys", "value": "TRUE"}],
            "networkInterfaces": [{"network": "net", "subnetwork": "nodes", "ipv6accessType": "EXTERNAL",
                                   "stackType": "IPV4_IPV6", "ipCidrRange": "/24", "subnetworkRangeName": "pods"}],
            "region": "europe-west1",
            "scheduling": {"automaticRestart": true, "onHostMaintenance": "MIGRATE", "preemptible": false},
            "serviceAccounts": [{"email": "sa@p.iam.gserviceaccount.com",
                                 "scopes": ["https://www.googleapis.com/auth/compute"]}],
            "tags": ["kubernetes-io-cluster-shoot--a--b", "kubernetes-io-role-node", "shoot--a--b"],
            "zone": "europe-west1-b",
            "someFutureField": 1
        })
    }

    fn spec_of(v: serde_json::Value) -> ProviderSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn gardener_spec_decodes_with_its_field_names() {
        let s = spec_of(gardener_spec());
        assert!(s.can_ip_forward);
        assert_eq!(s.disks[0].size_gb, 50);
        assert_eq!(s.disks[0].disk_type, "pd-balanced");
        assert!(s.disks[1].is_scratch());
        assert!(s.disks[1].auto_delete(), "autoDelete defaults to true");
        assert_eq!(s.network_interfaces[0].ipv6_access_type, "EXTERNAL");
        assert_eq!(s.scheduling.on_host_maintenance, "MIGRATE");
        assert_eq!(s.metadata[0].value.as_deref(), Some("TRUE"));
        assert_eq!(s.validate(), vec![]);
        // Go decodes case-insensitively; the spelling Gardener's own docs use is accepted too.
        let mut v = gardener_spec();
        v["networkInterfaces"][0] = json!({"network": "n", "ipv6AccessType": "INTERNAL"});
        assert_eq!(
            spec_of(v).network_interfaces[0].ipv6_access_type,
            "INTERNAL"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let s = spec_of(json!({
            "disks": [{"boot": true, "type": "SCRATCH", "interface": "IDE", "sizeGb": -1,
                       "encryption": {"kmsKeyName": " ", "kmsKeyServiceAccount": "  "}}],
            "metadata": [{"key": "user-data", "value": "x"}],
            "networkInterfaces": [{"stackType": "IPV6", "ipv6accessType": "BOTH", "ipCidrRange": "24"}],
            "gpu": {"count": 0},
            "scheduling": {"onHostMaintenance": "MIGRATE", "preemptible": true, "automaticRestart": true},
            "labels": {"Name": "X"},
            "serviceAccounts": [{"scopes": []}],
            "tags": ["kubernetes-io-cluster-x"]
        }));
        let fields: Vec<String> = s.validate().into_iter().map(|p| p.to_string()).collect();
        assert_eq!(
            fields,
            vec![
                "providerSpec.disks[0].interface: unsupported value \"IDE\": supported values: \"NVME\", \"SCSI\"",
                "providerSpec.disks[0].boot: a SCRATCH disk cannot be the boot disk",
                "providerSpec.disks[0].image: image is required for boot disk",
                "providerSpec.disks[0].sizeGb: must not be negative, got -1",
                "providerSpec.disks[0].encryption.kmsKeyName: kmsKeyName is required to be specified",
                "providerSpec.disks[0].encryption.kmsKeyServiceAccount: kmsKeyServiceAccount should either be \
                 explicitly specified without spaces or left un-specified to default to the Compute Service Agent",
                "providerSpec.machineType: machineType is required",
                "providerSpec.region: region is required",
                "providerSpec.zone: zone is required",
                "providerSpec.networkInterfaces[0]: either network or subnetwork or both is required",
                "providerSpec.networkInterfaces[0].stackType: invalid value \"IPV6\": must be either IPV4_IPV6 or IPV4_ONLY",
                "providerSpec.networkInterfaces[0].ipv6AccessType: invalid value \"BOTH\": must be either EXTERNAL or INTERNAL",
                "providerSpec.networkInterfaces[0].ipCidrRange: invalid value \"24\": CIDR range must start with '/'",
                "providerSpec.metadata[0].key: user-data key is forbidden in metadata",
                "providerSpec.gpu.acceleratorType: accelerator type needs to be provided",
                "providerSpec.gpu.count: gpu count must be > 0",
                "providerSpec.scheduling.onHostMaintenance: liveMigration is not allowed for VMs with gpu attached, use \"TERMINATE\" instead",
                "providerSpec.scheduling.onHostMaintenance: preemptible VMs must use \"TERMINATE\"",
                "providerSpec.scheduling.automaticRestart: preemptible VMs cannot restart automatically",
                "providerSpec.serviceAccounts[0].email: email is required",
                "providerSpec.labels[\"Name\"]: label keys start with a lowercase letter",
                "providerSpec.labels[\"Name\"]: label values hold only lowercase letters, digits, '_' and '-'",
                "providerSpec.tags: a kubernetes-io-cluster-<cluster> and a kubernetes-io-role-<role> tag are \
                 required: the machines of a cluster are found by them",
            ]
        );
    }

    #[test]
    fn structural_problems() {
        let s = spec_of(
            json!({"machineType": "m", "region": "europe-west1", "zone": "us-east1-b",
                               "scheduling": {"onHostMaintenance": ""},
                               "tags": ["kubernetes-io-cluster-c", "kubernetes-io-role-node"]}),
        );
        let got: Vec<String> = s.validate().into_iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "providerSpec.disks: at least one disk is required",
                "providerSpec.zone: zone \"us-east1-b\" is not in region \"europe-west1\"",
                "providerSpec.networkInterfaces: at least one network interface is required",
                "providerSpec.scheduling.onHostMaintenance: unsupported value \"\": supported values: \"MIGRATE\", \"TERMINATE\"",
            ]
        );
        let mut v = gardener_spec();
        v["disks"][1]["boot"] = json!(false);
        v["disks"]
            .as_array_mut()
            .unwrap()
            .push(json!({"boot": true, "image": "i"}));
        assert_eq!(
            spec_of(v).validate(),
            vec![SpecProblem::new(
                "providerSpec.disks",
                "exactly one disk must have boot: true, found 2"
            )]
        );
    }

    #[test]
    fn cidr_sizes() {
        assert_eq!(cidr_size_problem(""), None);
        assert_eq!(cidr_size_problem("/24"), None);
        assert_eq!(
            cidr_size_problem("/x").unwrap(),
            "invalid CIDR mask size: x"
        );
        assert_eq!(
            cidr_size_problem("/33").unwrap(),
            "CIDR mask size must be between 0 and 32"
        );
    }

    #[test]
    fn names_and_labels() {
        assert!(is_resource_name("shoot--a--b-worker-z1-5f7d9-abcde"));
        for bad in ["", "A", "1a", "a-", "a_b", &"a".repeat(64)] {
            assert!(!is_resource_name(bad), "{bad:?}");
        }
        assert_eq!(label_key_problem("name"), None);
        assert_eq!(label_key_problem("k8s-io_role"), None);
        assert_eq!(
            label_key_problem("élan"),
            None,
            "GCE allows international lowercase letters"
        );
        assert!(label_key_problem("9a").is_some());
        assert!(label_key_problem("a.b").is_some());
        assert_eq!(label_value_problem(""), None);
        assert!(label_value_problem(&"a".repeat(64)).is_some());
    }

    #[test]
    fn cluster_tags_are_the_last_of_each_kind() {
        let tags = [
            "kubernetes-io-cluster-a",
            "x",
            "kubernetes-io-role-node",
            "kubernetes-io-cluster-b",
        ];
        let ct = ClusterTags::from_tags(&tags).unwrap();
        assert_eq!(ct.cluster, "kubernetes-io-cluster-b");
        assert!(ct.matches(&["kubernetes-io-role-node", "kubernetes-io-cluster-b"]));
        assert!(!ct.matches(&["kubernetes-io-role-node", "kubernetes-io-cluster-a"]));
        assert!(!ct.matches(&["kubernetes-io-cluster-b"]));
        assert_eq!(ClusterTags::from_tags(&["kubernetes-io-role-node"]), None);
    }

    fn secret(pairs: &[(&str, &str)]) -> SecretData {
        SecretData::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn service_account_credentials() {
        let key = json!({"type": "service_account", "project_id": "p", "client_email": "e@p.iam",
                         "private_key": "-----BEGIN PRIVATE KEY-----\n", "private_key_id": "1"})
        .to_string();
        let c = credentials(&secret(&[("serviceaccount.json", &key)])).unwrap();
        assert_eq!(
            (c.key, c.kind, c.project.as_str()),
            ("serviceaccount.json", CredentialsKind::ServiceAccount, "p")
        );
        assert!(
            !format!("{c:?}").contains("PRIVATE"),
            "the key is never printed"
        );
        // The project from the secret when the key has none.
        let no_project =
            json!({"type": "service_account", "client_email": "e", "private_key": "k"}).to_string();
        let c = credentials(&secret(&[
            ("serviceAccountJSON", &no_project),
            ("projectID", "q"),
        ]))
        .unwrap();
        assert_eq!(c.project, "q");
        assert_eq!(
            validate_secret(&secret(&[("serviceAccountJSON", &no_project)]), true)
                .into_iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>(),
            vec![
                "secretRef.serviceAccountJSON: no project id specified: neither project_id in the credentials \
                 nor projectID in the secret",
                "secretRef.userData: secret userData is required field",
            ]
        );
    }

    #[test]
    fn bad_credentials() {
        let p = |pairs: &[(&str, &str)]| -> Vec<String> {
            validate_secret(&secret(pairs), true)
                .into_iter()
                .map(|p| p.to_string())
                .collect()
        };
        assert_eq!(
            p(&[]),
            vec![
                "secretRef.serviceAccountJSON: secret serviceAccountJSON, serviceaccount.json or credentialsConfig \
                 is required field",
                "secretRef.userData: secret userData is required field",
            ]
        );
        assert!(
            p(&[("serviceAccountJSON", "{"), ("userData", "")])[0].contains("is not valid JSON")
        );
        let extra = json!({"type": "service_account", "project_id": "p", "client_email": "e",
                           "private_key": "k", "extra": "x"})
        .to_string();
        assert!(
            p(&[("serviceAccountJSON", &extra), ("userData", "")])[0]
                .contains("forbidden field \"extra\"")
        );
        let other = json!({"type": "authorized_user", "project_id": "p"}).to_string();
        assert!(
            p(&[("serviceAccountJSON", &other), ("userData", "")])[0]
                .contains("forbidden credential type")
        );
        let ext = json!({"type": "external_account", "project_id": "p", "token_url": "https://evil/token",
                         "subject_token_type": JWT_SUBJECT_TOKEN_TYPE,
                         "credential_source": {"file": "/etc/shadow"}})
        .to_string();
        assert_eq!(p(&[("credentialsConfig", &ext), ("userData", "")]).len(), 2);
        let ok = json!({"type": "external_account", "project_id": "p", "token_url": STS_TOKEN_URL,
                        "subject_token_type": JWT_SUBJECT_TOKEN_TYPE,
                        "service_account_impersonation_url":
                            "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/a@b:generateAccessToken",
                        "credential_source": {"file": WORKLOAD_IDENTITY_TOKEN_FILE}})
        .to_string();
        assert_eq!(
            p(&[("credentialsConfig", &ok), ("userData", "")]),
            Vec::<String>::new()
        );
    }

    /// Go's decoder takes Gardener's `disableExternalIP` in any case and ignores unknown keys;
    /// so do we, and an unknown key is named with the field it is nearest to.
    #[test]
    fn keys_are_read_as_gardeners_go_driver_reads_them() {
        let mut spec = gardener_spec();
        spec["networkInterfaces"] = json!([
            { "disableExternalIp": true, "useAliasIPS": true, "subnetwork": "s" },
            { "disableExternalIPs": true, "subnetwork": "s" },
        ]);
        let class = MachineClass {
            provider: Some("GCP".into()),
            provider_spec: spec,
            ..MachineClass::default()
        };
        let parsed = parse_provider_spec(&class).unwrap();
        assert!(parsed.network_interfaces[0].disable_external_ip);
        assert!(parsed.network_interfaces[0].use_alias_ips);
        assert!(!parsed.network_interfaces[1].disable_external_ip);
        assert_eq!(
            class_warnings(&class),
            vec![
                "providerSpec.networkInterfaces[1].disableExternalIPs: unknown field, ignored \
                 (did you mean disableExternalIP?)"
                    .to_string(),
                "providerSpec.someFutureField: unknown field, ignored".to_string(),
            ]
        );
    }
}
