//! The Azure provider of mcm-rs.
//!
//! [`AzureDriver`] implements [`mcm_driver::Driver`] with Azure VMs, following Gardener's
//! `machine-controller-manager-provider-azure`:
//!
//! - the MachineClass's `providerSpec` is Gardener's Azure spec ([`spec::ProviderSpec`]:
//!   `location`, `resourceGroup`, `subnetInfo`, `properties.hardwareProfile.vmSize`,
//!   `storageProfile` (image `id` / `urn` / community or shared gallery image, `osDisk`,
//!   `dataDisks`), `osProfile`, `networkProfile`, `zone` / `availabilitySet` /
//!   `virtualMachineScaleSet` (or the deprecated `machineSet`), `identityID`, `tags`, ...),
//!   validated with every problem reported at once;
//! - the secret holds the service principal (`clientID`, `clientSecret`, `tenantID`,
//!   `subscriptionID`, or their `azure*` spellings) and `userData`; the client secret is never
//!   logged;
//! - a machine is a NIC, a VM, an OS disk and data disks named after the machine
//!   ([`resources`]), created in that order and deleted VM first, then NIC and disks, even when
//!   the VM is gone; resources are found by the class's `kubernetes.io-cluster-*` and
//!   `kubernetes.io-role-*` tags, and leftovers of a machine (a NIC without its VM) are listed as
//!   that machine, so orphan collection removes them; provider ids are
//!   `azure:///<location>/<name>`;
//! - ARM errors map to MCM codes ([`errors`]), keeping azure_core's error or the operation's
//!   outcome as the source and naming `x-ms-request-id`;
//! - every request carries the driver's request id as `x-ms-client-request-id` ([`client`]);
//!   long-running operations are polled by the driver;
//! - tokens come from azure_identity 1.x (client secret or workload identity), and requests go
//!   through azure_core 1.x's HTTP client interface on reqwest with rustls on ring ([`client`]).
#![warn(missing_docs)]

pub mod client;
pub mod driver;
pub mod errors;
pub mod resources;
pub mod spec;

pub use client::{
    ARM_ENDPOINT_ENV, AUTHORITY_HOST_ENV, AzureDriverConfig, CA_FILE_ENV, CloudEndpoints,
};
pub use driver::AzureDriver;
pub use errors::AzureError;
pub use errors::classify;
pub use mcm_driver::{SpecError, SpecProblem};
pub use spec::{ProviderSpec, parse_provider_spec};
