//! The AWS (EC2) provider of mcm-rs.
//!
//! [`AwsDriver`] implements [`mcm_driver::Driver`] with EC2 instances, following Gardener's
//! `machine-controller-manager-provider-aws`:
//!
//! - the MachineClass's `providerSpec` is Gardener's AWS spec ([`spec::ProviderSpec`]:
//!   `ami`, `machineType`, `region`, `iam`, `keyName`, `tags`, `blockDevices`,
//!   `networkInterfaces`, `srcAndDstChecksEnabled`, `instanceMetadataOptions`, `cpuOptions`,
//!   `capacityReservation`, `placement`, `spotPrice`, ...), validated with every problem
//!   reported at once ([`spec::ProviderSpec::validate`]);
//! - the secret holds `providerAccessKeyId`/`providerSecretAccessKey` (or
//!   `accessKeyID`/`secretAccessKey`), or workload identity (`roleARN` and
//!   `workloadIdentityTokenFile`, [`credentials`]), and `userData`;
//! - `RunInstances` carries the creation attempt's idempotency key as `ClientToken`, and a
//!   create returns only once EC2 lists the instance, so no retry makes a second one;
//! - instances carry the class's tags plus `Name=<machine>` (on the instance, its volumes and
//!   NICs); a machine's instance is found by its recorded providerID, before that by those
//!   tags ([`tags`]); provider ids are
//!   `aws:///<region>/<instance-id>` ([`provider_id`]); node names are private DNS names;
//! - EC2 error codes map to MCM codes ([`errors`]), keeping the SDK error as source and the
//!   AWS and mcm request ids in the message;
//! - EC2 is called through `aws-sdk-ec2`: its retries, clock-skew correction, endpoint rules
//!   and paginators; one client per region and credentials, kept while used; every EC2
//!   request carries the driver's request id ([`client`]).
//!
//! Settings that are not part of a MachineClass live in [`AwsDriverConfig`]; the EC2 endpoint
//! can be overridden there or with `AWS_ENDPOINT_URL` (how the tests use moto).
#![warn(missing_docs)]

pub mod client;
pub mod credentials;
pub mod driver;
pub mod errors;
pub mod launch;
pub mod provider_id;
pub mod spec;
pub mod tags;

pub use client::{AwsDriverConfig, REQUEST_ID_HEADER};
pub use driver::AwsDriver;
pub use errors::classify;
pub use mcm_driver::{SpecError, SpecProblem};
pub use provider_id::{decode_provider_id, encode_provider_id, volume_id};
pub use spec::{ProviderSpec, parse_provider_spec};
