//! Requests and responses of the driver operations.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{NodeAddress, PersistentVolumeSpec, Secret};
use mcm_api::{Machine, MachineClass};

/// A correlation id for one driver call. The controller creates one per operation and logs
/// it; the driver passes it to every cloud call it makes (as a client token, a request
/// header or a tag), so all cloud calls of one operation can be found together.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(String);

impl RequestId {
    /// A fresh random id (32 hex characters).
    pub fn generate() -> Self {
        use rand::Rng;
        let n: u128 = rand::rng().random();
        RequestId(format!("{n:032x}"))
    }

    /// Wraps an existing id.
    pub fn from_string(id: impl Into<String>) -> Self {
        RequestId(id.into())
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The identity of one attempt to create a machine's VM, the same on every retry of that
/// attempt and after a restart of the controller. The controller derives it from the
/// Machine's UID and the moment it first asked for a VM (the durable `vm-requested` record on
/// the Machine), so a retry after a timeout, a lost response or a crash carries the same key,
/// and a new attempt (after the cloud refused the last one) a new one.
///
/// Drivers pass it to the cloud's idempotency mechanism so that repeating a create can never
/// make a second VM, e.g. EC2's `ClientToken` (a mechanism that replays a failed request's
/// failure, as Compute Engine's `requestId` does, would turn a transient failure into a long
/// one: such clouds rely on unique VM names instead). It is a UUID in its canonical text form
/// (36 characters). It is not a correlation id: use [`RequestId`] for that.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of the creation attempt that `machine_uid` requested at `requested_at` (the
    /// `vm-requested` record). Deterministic: the same inputs give the same key in every
    /// process and version (the first 16 bytes of SHA-256, formatted as a version-8 UUID).
    pub fn for_creation(machine_uid: &str, requested_at: &str) -> Self {
        use sha2::Digest;
        let digest = sha2::Sha256::new()
            .chain_update(b"mcm-rs/create/")
            .chain_update(machine_uid.as_bytes())
            .chain_update(b"/")
            .chain_update(requested_at.as_bytes())
            .finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&digest[..16]);
        // RFC 9562: version 8 (custom), variant 10.
        b[6] = (b[6] & 0x0f) | 0x80;
        b[8] = (b[8] & 0x3f) | 0x80;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        IdempotencyKey(format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        ))
    }

    /// A fresh random key, for a creation that is not retried across processes (tests,
    /// tools).
    pub fn random() -> Self {
        use rand::Rng;
        let n: u128 = rand::rng().random();
        let b = n.to_be_bytes();
        Self::for_creation(&format!("{n:032x}"), &format!("{:02x}", b[0]))
    }

    /// Wraps an existing key (tests, drivers replaying a recorded key).
    pub fn from_string(key: impl Into<String>) -> Self {
        IdempotencyKey(key.into())
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Secret data passed to the driver: the data of the class's `secretRef` merged with (and
/// overridden by) the data of its `credentialsSecretRef`, as MCM does.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData(pub BTreeMap<String, Vec<u8>>);

impl fmt::Debug for SecretData {
    /// Prints the keys only: secret values never end up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl SecretData {
    /// Merges the data of `secret_ref` and then `credentials` (later keys win).
    pub fn merge(secret_ref: Option<&Secret>, credentials: Option<&Secret>) -> Self {
        let mut data = BTreeMap::new();
        for secret in [secret_ref, credentials].into_iter().flatten() {
            if let Some(d) = &secret.data {
                for (k, v) in d {
                    data.insert(k.clone(), v.0.clone());
                }
            }
        }
        SecretData(data)
    }

    /// Builds secret data from string pairs (tests, examples).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        SecretData(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    /// The raw bytes of a key.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.0.get(key).map(Vec::as_slice)
    }

    /// A key decoded as UTF-8; `None` when absent or not UTF-8.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|b| std::str::from_utf8(b).ok())
    }

    /// The first key of `keys` that is present, as UTF-8 (for aliases such as
    /// `providerAccessKeyId` / `accessKeyID`).
    pub fn first_str(&self, keys: &[&str]) -> Option<&str> {
        keys.iter().find_map(|k| self.get_str(k))
    }
}

/// The well-known secret key holding the user data (cloud-init) for new machines.
pub const USER_DATA_KEY: &str = "userData";

/// Create a VM for a Machine.
#[derive(Debug, Clone)]
pub struct CreateMachineRequest {
    /// The Machine to create a VM for.
    pub machine: Machine,
    /// Its class (template of the VM).
    pub machine_class: MachineClass,
    /// Merged secret data (credentials, `userData` with the bootstrap token filled in).
    pub secret: SecretData,
    /// The correlation id to pass to every cloud call.
    pub request_id: RequestId,
    /// The identity of this creation attempt, stable across its retries and controller
    /// restarts: passed to the cloud's idempotency mechanism, so that a repeated create
    /// returns the VM the first one made instead of making another (see [`IdempotencyKey`]).
    pub idempotency_key: IdempotencyKey,
}

/// The VM that was created (or found, when create is called again for the same machine).
#[derive(Debug, Clone, PartialEq)]
pub struct CreateMachineResponse {
    /// The provider's id of the VM, e.g. `aws:///eu-west-1/i-0123`.
    pub provider_id: String,
    /// The name the Node of this VM will register with.
    pub node_name: String,
    /// Opaque state the driver wants to find again on the next call.
    pub last_known_state: Option<String>,
    /// Addresses of the VM known at creation.
    pub addresses: Vec<NodeAddress>,
}

/// Finish the set-up of a created VM (e.g. network settings that need the VM to exist).
#[derive(Debug, Clone)]
pub struct InitializeMachineRequest {
    /// The Machine.
    pub machine: Machine,
    /// Its class.
    pub machine_class: MachineClass,
    /// Merged secret data.
    pub secret: SecretData,
    /// The correlation id.
    pub request_id: RequestId,
}

/// The result of [`crate::Driver::initialize_machine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitializeMachineResponse {
    /// The provider's id of the VM.
    pub provider_id: String,
    /// The node name of the VM.
    pub node_name: String,
}

/// Delete the VM of a Machine and everything created for it (NICs, disks, ...).
#[derive(Debug, Clone)]
pub struct DeleteMachineRequest {
    /// The Machine (its `spec.providerID` may be empty if creation never finished).
    pub machine: Machine,
    /// Its class.
    pub machine_class: MachineClass,
    /// Merged secret data.
    pub secret: SecretData,
    /// The correlation id.
    pub request_id: RequestId,
}

/// The result of [`crate::Driver::delete_machine`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteMachineResponse {
    /// Opaque state the driver wants to keep.
    pub last_known_state: Option<String>,
}

/// Ask for the VM of a Machine.
#[derive(Debug, Clone)]
pub struct GetMachineStatusRequest {
    /// The Machine.
    pub machine: Machine,
    /// Its class.
    pub machine_class: MachineClass,
    /// Merged secret data.
    pub secret: SecretData,
    /// The correlation id.
    pub request_id: RequestId,
}

/// The VM of a Machine as the cloud sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GetMachineStatusResponse {
    /// The provider's id of the VM.
    pub provider_id: String,
    /// The node name of the VM.
    pub node_name: String,
    /// Addresses of the VM.
    pub addresses: Vec<NodeAddress>,
    /// The individual resources of the machine (VM, NICs, disks) and their states, so
    /// partial failures are visible.
    pub resources: Vec<ResourceStatus>,
}

/// List the VMs that belong to a MachineClass (orphan collection).
#[derive(Debug, Clone)]
pub struct ListMachinesRequest {
    /// The class whose VMs to list (cluster/role tags, labels, ...).
    pub machine_class: MachineClass,
    /// Merged secret data.
    pub secret: SecretData,
    /// The correlation id.
    pub request_id: RequestId,
}

/// The VMs of a class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListMachinesResponse {
    /// provider id -> machine name, as in MCM.
    pub machines: BTreeMap<String, String>,
    /// provider id -> the individual resources of that machine, where the driver knows them.
    pub resources: BTreeMap<String, Vec<ResourceStatus>>,
}

/// Map PersistentVolume specs to the cloud's volume ids (drain waits for those to detach).
#[derive(Debug, Clone)]
pub struct GetVolumeIdsRequest {
    /// The specs of the PersistentVolumes of the pods on a node.
    pub pv_specs: Vec<PersistentVolumeSpec>,
    /// The correlation id.
    pub request_id: RequestId,
}

/// The volume ids this provider recognised (specs of other provisioners are skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetVolumeIdsResponse {
    /// Cloud volume ids, in the order of the recognised specs.
    pub volume_ids: Vec<String>,
}

/// One resource that makes up a machine in the cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceStatus {
    /// What kind of resource.
    pub kind: ResourceKind,
    /// The cloud's id of it.
    pub id: String,
    /// Its state.
    pub state: ResourceState,
    /// Detail, e.g. why it failed.
    pub message: Option<String>,
}

/// Kinds of machine resources.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// The VM itself.
    Vm,
    /// A network interface.
    NetworkInterface,
    /// A disk.
    Disk,
    /// A public IP address.
    PublicIp,
    /// Anything else, named by the driver.
    Other(String),
}

/// States of a machine resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceState {
    /// Being created.
    Creating,
    /// Exists and works.
    Running,
    /// Exists but is stopped (for a VM: powered off or crashed).
    Stopped,
    /// Creation or operation failed.
    Failed,
    /// Being deleted.
    Deleting,
    /// The driver cannot tell.
    Unknown,
}

/// The driver operations, for metrics, logs and fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    /// [`crate::Driver::create_machine`]
    CreateMachine,
    /// [`crate::Driver::initialize_machine`]
    InitializeMachine,
    /// [`crate::Driver::delete_machine`]
    DeleteMachine,
    /// [`crate::Driver::get_machine_status`]
    GetMachineStatus,
    /// [`crate::Driver::list_machines`]
    ListMachines,
    /// [`crate::Driver::get_volume_ids`]
    GetVolumeIds,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 6] = [
        Operation::CreateMachine,
        Operation::InitializeMachine,
        Operation::DeleteMachine,
        Operation::GetMachineStatus,
        Operation::ListMachines,
        Operation::GetVolumeIds,
    ];

    /// The snake_case name used in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::CreateMachine => "create_machine",
            Operation::InitializeMachine => "initialize_machine",
            Operation::DeleteMachine => "delete_machine",
            Operation::GetMachineStatus => "get_machine_status",
            Operation::ListMachines => "list_machines",
            Operation::GetVolumeIds => "get_volume_ids",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn a_creation_key_is_the_same_in_every_version() {
        // SHA-256 of "mcm-rs/create/uid-1/2026-01-01T00:00:00Z", computed outside Rust: a
        // machine whose creation a former version started finds its VM by the same key.
        assert_eq!(
            IdempotencyKey::for_creation("uid-1", "2026-01-01T00:00:00Z").as_str(),
            "e68c2f59-5857-88b7-be46-32057fe76054"
        );
    }

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn credentials_secret_overrides_the_secret_ref() {
        let a = secret(&[("userData", "#!/bin/sh"), ("accessKeyID", "old")]);
        let b = secret(&[("accessKeyID", "new"), ("secretAccessKey", "s")]);
        let merged = SecretData::merge(Some(&a), Some(&b));
        assert_eq!(merged.get_str("accessKeyID"), Some("new"));
        assert_eq!(merged.get_str("userData"), Some("#!/bin/sh"));
        assert_eq!(merged.get_str("secretAccessKey"), Some("s"));
        assert_eq!(SecretData::merge(None, None), SecretData::default());
    }

    #[test]
    fn secret_values_never_reach_debug_output() {
        let data = SecretData::from_pairs([("password", "hunter2")]);
        let printed = format!("{data:?}");
        assert!(printed.contains("password"));
        assert!(!printed.contains("hunter2"));
    }

    #[test]
    fn aliases_resolve_in_order() {
        let data = SecretData::from_pairs([("accessKeyID", "b")]);
        assert_eq!(
            data.first_str(&["providerAccessKeyId", "accessKeyID"]),
            Some("b")
        );
        assert_eq!(data.first_str(&["nope"]), None);
    }

    #[test]
    fn request_ids_are_unique() {
        let a = RequestId::generate();
        let b = RequestId::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
    }
}
