//! The GCP (Compute Engine) provider of mcm-rs.
//!
//! [`GcpDriver`] implements [`mcm_driver::Driver`] with Compute Engine instances, following
//! Gardener's `machine-controller-manager-provider-gcp`:
//!
//! - the MachineClass's `providerSpec` is Gardener's GCP spec ([`spec::ProviderSpec`]:
//!   `canIpForward`, `deletionProtection`, `description`, `disks`, `gpu`, `labels`,
//!   `machineType`, `metadata`, `minCpuPlatform`, `networkInterfaces`, `region`, `zone`,
//!   `scheduling`, `serviceAccounts`, `tags`, `shieldedInstanceConfiguration`,
//!   `advancedMachineFeatures`), validated with every problem reported at once;
//! - the secret holds the credentials JSON under `serviceAccountJSON` (or
//!   `serviceaccount.json`, `credentialsConfig`: a service-account key or Gardener's
//!   workload-identity `external_account`), optionally `projectID`, and `userData`; the key
//!   material is never logged;
//! - instances are named after their machines and found by the class's
//!   `kubernetes-io-cluster-*` and `kubernetes-io-role-*` network tags; provider ids are
//!   `gce:///<project>/<zone>/<name>` ([`provider_id`]); node names are machine names;
//! - Compute errors and failed zone operations map to MCM codes ([`errors`]), keeping the
//!   client's error or the operation's errors and name as the source;
//! - every request names the driver's request id, and creates and deletes carry it as GCE's
//!   `requestId` ([`client`]).
//!
//! Settings that are not part of a MachineClass live in [`GcpDriverConfig`]; the Compute
//! endpoint can be overridden there or with `MCM_GCP_COMPUTE_ENDPOINT` (how the tests use a
//! fake Compute server).
#![warn(missing_docs)]

pub mod client;
pub mod driver;
pub mod errors;
pub mod instance;
pub mod provider_id;
pub mod spec;

pub use client::{ENDPOINT_ENV, GcpDriverConfig};
pub use driver::GcpDriver;
pub use errors::{classify_http, classify_operation};
pub use mcm_driver::{SpecError, SpecProblem};
pub use provider_id::{InstanceRef, decode_provider_id, volume_id};
pub use spec::{ProviderSpec, parse_provider_spec};
