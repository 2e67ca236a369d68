//! The effects of the machine controller: one small action per [`Step`](super::decide::Step)
//! (and the preservation and in-place steps' shared writes). Every action is idempotent: it may
//! run again after a crash at any point. Actions decide nothing beyond how to carry out their
//! step.
//!
//! Split by what they touch: `records` (the Machine's status, progress and Events, shared by
//! all), `create`, `running` (the phases of a machine that exists and the driver probes),
//! `drain` and `delete`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use mcm_api::constants::annotations::progress;
use mcm_api::constants::{annotations, labels, node_conditions};
use mcm_api::{Machine, MachineClass, MachineOperationType, MachinePhase};
use mcm_driver::{
    Code, CreateMachineRequest, DeleteMachineRequest, DriverError, GetMachineStatusRequest,
    GetMachineStatusResponse, IdempotencyKey, InitializeMachineRequest, RequestId, SecretData,
    USER_DATA_KEY,
};
use serde_json::json;

use super::{Ctx, Error, FINALIZER, LEGACY_FINALIZERS, token};
use crate::kube_api::{self, ApiErrorExt};
use crate::machine::decide::{ClassProblem, MachineConfig, VmReport};
use crate::machine::hooks::HookStage;
use crate::machine::metrics::{DeploymentLabels, PlacementLabels, Timed};
use crate::machine::status::{self, Operation};

mod create;
mod delete;
mod drain;
mod inplace;
mod preserve;
mod records;
mod running;

pub use create::*;
pub use delete::*;
pub use drain::*;
pub use inplace::inplace_step;
pub use preserve::preserve_step;
pub(crate) use preserve::warn_invalid_node_value;
pub use records::*;
pub use running::*;
