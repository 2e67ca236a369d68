//! The provider SPI of mcm-rs.
//!
//! A cloud provider implements [`Driver`]; the machine controller calls it to create, find,
//! initialize and delete the VM of each `Machine`, to list the VMs of a class (orphan
//! collection) and to map PersistentVolumes to cloud volume ids (drain). Every call carries a
//! [`RequestId`] that the driver passes on to every cloud API call it makes.
//!
//! Errors are [`DriverError`]s with MCM's [`Code`]s; the controllers act on the code
//! (`NotFound` on delete is success, `ResourceExhausted` backs off longer, `Uninitialized`
//! triggers `initialize_machine`, ...), and the cause is kept as a typed source.
//!
//! Wrappers compose around any driver: [`FaultInjecting`] (chaos and tests),
//! [`RateLimited`] (a token bucket on cloud calls) and [`Instrumented`] (the
//! `mcm_cloud_api_driver_*` metrics). [`FakeDriver`] is an in-memory driver for unit tests.
//!
//! # A driver, end to end
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Mutex;
//! use mcm_driver::*;
//!
//! /// A "cloud" that keeps VMs in a map: machine name -> VM id.
//! #[derive(Default)]
//! struct ToyDriver {
//!     vms: Mutex<BTreeMap<String, String>>,
//! }
//!
//! #[async_trait::async_trait]
//! impl Driver for ToyDriver {
//!     async fn create_machine(
//!         &self,
//!         req: CreateMachineRequest,
//!     ) -> Result<CreateMachineResponse, DriverError> {
//!         let name = req.machine.metadata.name.clone().unwrap_or_default();
//!         let mut vms = self.vms.lock().unwrap();
//!         // Idempotent: a second create for the same machine returns the same VM (a real
//!         // cloud gets `req.idempotency_key` as its client token for that).
//!         let id = vms
//!             .entry(name.clone())
//!             .or_insert_with(|| format!("vm-{}", req.idempotency_key))
//!             .clone();
//!         Ok(CreateMachineResponse {
//!             provider_id: format!("toy:///{id}"),
//!             node_name: name,
//!             last_known_state: None,
//!             addresses: vec![],
//!         })
//!     }
//!
//!     async fn delete_machine(
//!         &self,
//!         req: DeleteMachineRequest,
//!     ) -> Result<DeleteMachineResponse, DriverError> {
//!         let name = req.machine.metadata.name.unwrap_or_default();
//!         self.vms.lock().unwrap().remove(&name); // absent is success
//!         Ok(DeleteMachineResponse::default())
//!     }
//!
//!     async fn get_machine_status(
//!         &self,
//!         req: GetMachineStatusRequest,
//!     ) -> Result<GetMachineStatusResponse, DriverError> {
//!         let name = req.machine.metadata.name.unwrap_or_default();
//!         match self.vms.lock().unwrap().get(&name) {
//!             Some(id) => Ok(GetMachineStatusResponse {
//!                 provider_id: format!("toy:///{id}"),
//!                 node_name: name,
//!                 addresses: vec![],
//!                 resources: vec![],
//!             }),
//!             None => Err(DriverError::not_found(format!("no VM for machine {name}"))),
//!         }
//!     }
//!
//!     async fn list_machines(
//!         &self,
//!         _req: ListMachinesRequest,
//!     ) -> Result<ListMachinesResponse, DriverError> {
//!         let machines = self
//!             .vms
//!             .lock()
//!             .unwrap()
//!             .iter()
//!             .map(|(name, id)| (format!("toy:///{id}"), name.clone()))
//!             .collect();
//!         Ok(ListMachinesResponse { machines, ..Default::default() })
//!     }
//!
//!     async fn get_volume_ids(
//!         &self,
//!         _req: GetVolumeIdsRequest,
//!     ) -> Result<GetVolumeIdsResponse, DriverError> {
//!         Ok(GetVolumeIdsResponse::default()) // no volumes in this cloud
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let driver = ToyDriver::default();
//! let machine = mcm_api::Machine::new("worker-1", Default::default());
//! let class = mcm_api::MachineClass::default();
//! let created = driver
//!     .create_machine(CreateMachineRequest {
//!         machine: machine.clone(),
//!         machine_class: class.clone(),
//!         secret: SecretData::default(),
//!         request_id: RequestId::generate(),
//!         idempotency_key: IdempotencyKey::for_creation("uid-1", "2026-01-01T00:00:00Z"),
//!     })
//!     .await
//!     .unwrap();
//! let status = driver
//!     .get_machine_status(GetMachineStatusRequest {
//!         machine: machine.clone(),
//!         machine_class: class.clone(),
//!         secret: SecretData::default(),
//!         request_id: RequestId::generate(),
//!     })
//!     .await
//!     .unwrap();
//! assert_eq!(status.provider_id, created.provider_id);
//!
//! // Not every driver needs initialize_machine: the default says so with a typed code.
//! let err = driver
//!     .initialize_machine(InitializeMachineRequest {
//!         machine,
//!         machine_class: class,
//!         secret: SecretData::default(),
//!         request_id: RequestId::generate(),
//!     })
//!     .await
//!     .unwrap_err();
//! assert_eq!(err.code, Code::Unimplemented);
//! # }
//! ```
#![warn(missing_docs)]

mod error;
mod fake;
mod fault;
pub mod gojson;
mod instrumented;
mod ratelimit;
pub mod spec;
mod types;

use std::sync::Arc;

use async_trait::async_trait;

pub use error::{BoxError, Code, DriverError};
pub use fake::{FakeDriver, FakeVm};
pub use fault::{FaultConfigError, FaultInjecting, FaultSpec};
pub use gojson::{GoDecoded, UnknownKey, go_decode};
pub use instrumented::{DriverMetrics, Instrumented};
pub use ratelimit::{RateLimited, TokenBucket};
pub use spec::{SpecError, SpecProblem};
pub use types::*;

/// The interface a cloud provider implements. All methods must be idempotent: the
/// controller may call any of them again after a crash or a timeout.
#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// Creates the VM of a machine, or returns the existing one when it exists already.
    ///
    /// Repeating a create must never make a second VM, even when the first call's response
    /// was lost, it timed out, or the controller crashed before it recorded the providerID:
    /// pass [`CreateMachineRequest::idempotency_key`] to the cloud's idempotency mechanism
    /// when a failed request does not consume it (EC2's `ClientToken`), or name the VM after
    /// the machine where the cloud refuses a second VM of one name (Compute Engine, Azure).
    /// The key stays the same on
    /// every retry of one attempt, also after a restart. When the cloud answers a repeated
    /// create before its reads can see the VM (eventual consistency), wait until they do or
    /// fail with a retryable code: a later `get_machine_status` that cannot find a VM the
    /// create returned must not report it as `NotFound` while it is still being made.
    ///
    /// Return `InvalidArgument` only when the request was refused before anything was
    /// created (e.g. an invalid `providerSpec`): the controller then records that no VM was
    /// requested, so the Machine can later be deleted without calling the driver. Any other
    /// error means a VM (or part of one) may exist.
    async fn create_machine(
        &self,
        req: CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError>;

    /// Finishes the set-up of a created VM. The default answers `Unimplemented`, which the
    /// controller treats as "nothing to initialize".
    async fn initialize_machine(
        &self,
        req: InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let _ = req;
        Err(DriverError::unimplemented(
            "this driver does not initialize machines",
        ))
    }

    /// Deletes the VM of a machine and the resources created for it. A VM that does not
    /// exist is not an error: return success (or `NotFound`, which callers treat alike).
    async fn delete_machine(
        &self,
        req: DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError>;

    /// Reports the VM of a machine, or `NotFound`.
    async fn get_machine_status(
        &self,
        req: GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError>;

    /// Lists the VMs of a class: provider id -> machine name.
    async fn list_machines(
        &self,
        req: ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError>;

    /// Maps PersistentVolume specs to the volume ids of this cloud.
    async fn get_volume_ids(
        &self,
        req: GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError>;

    /// Checks a MachineClass's `providerSpec` by this provider's rules before the class is
    /// stored: the admission webhook of the provider binary and the class controller call it.
    /// Return every problem at once, each naming its field (`providerSpec.capacity.cpu`); an
    /// empty list accepts the class. It gets no credentials and must not call the cloud.
    ///
    /// A class whose `provider` names another provider is not this driver's business: accept
    /// it ([`spec::is_for_provider`]). The default accepts every class, so drivers written
    /// before this method existed compile and behave as before.
    fn validate_machine_class(&self, class: &mcm_api::MachineClass) -> Vec<SpecProblem> {
        let _ = class;
        Vec::new()
    }

    /// The keys of a MachineClass's `providerSpec` that this provider ignores, as Go's
    /// decoder ignores keys no field takes ([`gojson::go_decode`] reports them), each saying
    /// where it is and the nearest known field. They do not make the class invalid: the
    /// admission webhook returns them as warnings (`kubectl apply` prints them) and the class
    /// controller's `Valid`/`Invalid` Event lists them. No cloud calls, no credentials. The
    /// default: none.
    fn machine_class_warnings(&self, class: &mcm_api::MachineClass) -> Vec<String> {
        let _ = class;
        Vec::new()
    }
}

macro_rules! forward_driver {
    ($ty:ty) => {
        #[async_trait]
        impl<D: Driver + ?Sized> Driver for $ty {
            async fn create_machine(
                &self,
                req: CreateMachineRequest,
            ) -> Result<CreateMachineResponse, DriverError> {
                (**self).create_machine(req).await
            }
            async fn initialize_machine(
                &self,
                req: InitializeMachineRequest,
            ) -> Result<InitializeMachineResponse, DriverError> {
                (**self).initialize_machine(req).await
            }
            async fn delete_machine(
                &self,
                req: DeleteMachineRequest,
            ) -> Result<DeleteMachineResponse, DriverError> {
                (**self).delete_machine(req).await
            }
            async fn get_machine_status(
                &self,
                req: GetMachineStatusRequest,
            ) -> Result<GetMachineStatusResponse, DriverError> {
                (**self).get_machine_status(req).await
            }
            async fn list_machines(
                &self,
                req: ListMachinesRequest,
            ) -> Result<ListMachinesResponse, DriverError> {
                (**self).list_machines(req).await
            }
            async fn get_volume_ids(
                &self,
                req: GetVolumeIdsRequest,
            ) -> Result<GetVolumeIdsResponse, DriverError> {
                (**self).get_volume_ids(req).await
            }
            fn validate_machine_class(&self, class: &mcm_api::MachineClass) -> Vec<SpecProblem> {
                (**self).validate_machine_class(class)
            }
            fn machine_class_warnings(&self, class: &mcm_api::MachineClass) -> Vec<String> {
                (**self).machine_class_warnings(class)
            }
        }
    };
}

forward_driver!(Arc<D>);
forward_driver!(Box<D>);

/// Implements [`Driver`] for a wrapper type `$ty<D>` with a field `inner: D` and a method
/// `async fn around<T, F>(&self, op: Operation, call: F) -> Result<T, DriverError>` that
/// decides what happens around each call.
macro_rules! wrap_driver {
    ($ty:ident) => {
        #[async_trait::async_trait]
        impl<D: $crate::Driver> $crate::Driver for $ty<D> {
            async fn create_machine(
                &self,
                req: $crate::CreateMachineRequest,
            ) -> Result<$crate::CreateMachineResponse, $crate::DriverError> {
                self.around(
                    $crate::Operation::CreateMachine,
                    self.inner.create_machine(req),
                )
                .await
            }
            async fn initialize_machine(
                &self,
                req: $crate::InitializeMachineRequest,
            ) -> Result<$crate::InitializeMachineResponse, $crate::DriverError> {
                self.around(
                    $crate::Operation::InitializeMachine,
                    self.inner.initialize_machine(req),
                )
                .await
            }
            async fn delete_machine(
                &self,
                req: $crate::DeleteMachineRequest,
            ) -> Result<$crate::DeleteMachineResponse, $crate::DriverError> {
                self.around(
                    $crate::Operation::DeleteMachine,
                    self.inner.delete_machine(req),
                )
                .await
            }
            async fn get_machine_status(
                &self,
                req: $crate::GetMachineStatusRequest,
            ) -> Result<$crate::GetMachineStatusResponse, $crate::DriverError> {
                self.around(
                    $crate::Operation::GetMachineStatus,
                    self.inner.get_machine_status(req),
                )
                .await
            }
            async fn list_machines(
                &self,
                req: $crate::ListMachinesRequest,
            ) -> Result<$crate::ListMachinesResponse, $crate::DriverError> {
                self.around(
                    $crate::Operation::ListMachines,
                    self.inner.list_machines(req),
                )
                .await
            }
            async fn get_volume_ids(
                &self,
                req: $crate::GetVolumeIdsRequest,
            ) -> Result<$crate::GetVolumeIdsResponse, $crate::DriverError> {
                self.around(
                    $crate::Operation::GetVolumeIds,
                    self.inner.get_volume_ids(req),
                )
                .await
            }
            fn validate_machine_class(
                &self,
                class: &mcm_api::MachineClass,
            ) -> Vec<$crate::SpecProblem> {
                self.inner.validate_machine_class(class)
            }
            fn machine_class_warnings(&self, class: &mcm_api::MachineClass) -> Vec<String> {
                self.inner.machine_class_warnings(class)
            }
        }
    };
}
pub(crate) use wrap_driver;
