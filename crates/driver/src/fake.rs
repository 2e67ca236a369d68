//! An in-memory driver for unit tests of controllers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::{
    Code, CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse,
    Driver, DriverError, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, IdempotencyKey, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse, Operation, RequestId, ResourceKind, ResourceState,
    ResourceStatus,
};

/// A VM of the [`FakeDriver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeVm {
    /// The machine it belongs to.
    pub machine_name: String,
    /// The class it was created from.
    pub class_name: String,
    /// `fake:///<machine>`.
    pub provider_id: String,
    /// Whether `initialize_machine` ran.
    pub initialized: bool,
}

#[derive(Default)]
struct State {
    vms: BTreeMap<String, FakeVm>,
    scripted: BTreeMap<Operation, VecDeque<DriverError>>,
    calls: Vec<(Operation, RequestId)>,
    states_seen: Vec<(Operation, Option<String>)>,
    provider_ids_seen: Vec<(Operation, Option<String>)>,
    idempotency_keys: Vec<IdempotencyKey>,
    require_initialization: bool,
}

/// An in-memory driver: VMs live in a map keyed by machine name. Errors can be scripted per
/// operation, and every call is recorded with its request id.
#[derive(Default)]
pub struct FakeDriver {
    state: Mutex<State>,
}

impl FakeDriver {
    /// An empty cloud.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `get_machine_status` answer `Uninitialized` until `initialize_machine` ran.
    pub fn require_initialization(&self) {
        self.with(|s| s.require_initialization = true);
    }

    /// Queues an error that the next call of `op` returns (in order).
    pub fn fail_next(&self, op: Operation, err: DriverError) {
        self.with(|s| s.scripted.entry(op).or_default().push_back(err));
    }

    /// Adds a VM behind the controller's back (an orphan when no Machine has that name).
    pub fn insert_vm(&self, machine_name: &str, class_name: &str) {
        self.with(|s| {
            s.vms.insert(
                machine_name.to_string(),
                FakeVm {
                    machine_name: machine_name.into(),
                    class_name: class_name.into(),
                    provider_id: provider_id(machine_name),
                    initialized: true,
                },
            )
        });
    }

    /// Removes a VM behind the controller's back (deleted by a controller that crashed before
    /// it recorded the deletion, or by someone else). Whether it existed.
    pub fn remove_vm(&self, machine_name: &str) -> bool {
        self.with(|s| s.vms.remove(machine_name).is_some())
    }

    /// The VMs that exist now.
    pub fn vms(&self) -> Vec<FakeVm> {
        self.with(|s| s.vms.values().cloned().collect())
    }

    /// The calls made so far, with their request ids.
    pub fn calls(&self) -> Vec<(Operation, RequestId)> {
        self.with(|s| s.calls.clone())
    }

    /// The `status.lastKnownState` each call about a machine carried, in call order.
    pub fn states_seen(&self) -> Vec<(Operation, Option<String>)> {
        self.with(|s| s.states_seen.clone())
    }

    /// The `spec.providerID` each call about a machine carried, in call order.
    pub fn provider_ids_seen(&self) -> Vec<(Operation, Option<String>)> {
        self.with(|s| s.provider_ids_seen.clone())
    }

    /// The idempotency key of each `create_machine` call, in call order.
    pub fn idempotency_keys(&self) -> Vec<IdempotencyKey> {
        self.with(|s| s.idempotency_keys.clone())
    }

    fn note_state(&self, op: Operation, m: &mcm_api::Machine) {
        let state = m.status.as_ref().and_then(|s| s.last_known_state.clone());
        let provider_id = m.spec.provider_id.clone();
        self.with(|s| {
            s.states_seen.push((op, state));
            s.provider_ids_seen.push((op, provider_id));
        });
    }

    /// How many times `op` was called.
    pub fn call_count(&self, op: Operation) -> usize {
        self.with(|s| s.calls.iter().filter(|(o, _)| *o == op).count())
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock only means another test thread panicked; the data is still usable.
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// Records the call and returns a scripted error if one is queued.
    fn enter(&self, op: Operation, id: &RequestId) -> Result<(), DriverError> {
        self.with(|s| {
            s.calls.push((op, id.clone()));
            match s.scripted.get_mut(&op).and_then(VecDeque::pop_front) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
    }
}

fn provider_id(machine_name: &str) -> String {
    format!("fake:///{machine_name}")
}

fn name_of(m: &mcm_api::Machine) -> String {
    m.metadata.name.clone().unwrap_or_default()
}

fn vm_resource(vm: &FakeVm) -> ResourceStatus {
    ResourceStatus {
        kind: ResourceKind::Vm,
        id: vm.provider_id.clone(),
        state: ResourceState::Running,
        message: None,
    }
}

#[async_trait]
impl Driver for FakeDriver {
    async fn create_machine(
        &self,
        req: CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        self.note_state(Operation::CreateMachine, &req.machine);
        self.with(|s| s.idempotency_keys.push(req.idempotency_key.clone()));
        self.enter(Operation::CreateMachine, &req.request_id)?;
        let name = name_of(&req.machine);
        let class = req.machine_class.metadata.name.clone().unwrap_or_default();
        let vm = self.with(|s| {
            let initialized = !s.require_initialization;
            s.vms
                .entry(name.clone())
                .or_insert_with(|| FakeVm {
                    machine_name: name.clone(),
                    class_name: class,
                    provider_id: provider_id(&name),
                    initialized,
                })
                .clone()
        });
        Ok(CreateMachineResponse {
            last_known_state: Some(format!("created {}", vm.provider_id)),
            provider_id: vm.provider_id,
            node_name: name,
            addresses: vec![],
        })
    }

    async fn initialize_machine(
        &self,
        req: InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        self.note_state(Operation::InitializeMachine, &req.machine);
        self.enter(Operation::InitializeMachine, &req.request_id)?;
        let name = name_of(&req.machine);
        self.with(|s| match s.vms.get_mut(&name) {
            Some(vm) => {
                vm.initialized = true;
                Ok(InitializeMachineResponse {
                    provider_id: vm.provider_id.clone(),
                    node_name: name.clone(),
                })
            }
            None => Err(DriverError::not_found(format!("no VM for machine {name}"))),
        })
    }

    async fn delete_machine(
        &self,
        req: DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        self.note_state(Operation::DeleteMachine, &req.machine);
        self.enter(Operation::DeleteMachine, &req.request_id)?;
        let name = name_of(&req.machine);
        self.with(|s| s.vms.remove(&name));
        Ok(DeleteMachineResponse::default())
    }

    async fn get_machine_status(
        &self,
        req: GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        self.note_state(Operation::GetMachineStatus, &req.machine);
        self.enter(Operation::GetMachineStatus, &req.request_id)?;
        let name = name_of(&req.machine);
        let vm = self
            .with(|s| s.vms.get(&name).cloned())
            .ok_or_else(|| DriverError::not_found(format!("no VM for machine {name}")))?;
        if !vm.initialized {
            return Err(DriverError::new(
                Code::Uninitialized,
                format!("VM of machine {name} is not initialized"),
            ));
        }
        Ok(GetMachineStatusResponse {
            provider_id: vm.provider_id.clone(),
            node_name: name,
            addresses: vec![],
            resources: vec![vm_resource(&vm)],
        })
    }

    async fn list_machines(
        &self,
        req: ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        self.enter(Operation::ListMachines, &req.request_id)?;
        let class = req.machine_class.metadata.name.clone().unwrap_or_default();
        let vms: Vec<FakeVm> = self.with(|s| {
            s.vms
                .values()
                .filter(|vm| vm.class_name == class)
                .cloned()
                .collect()
        });
        Ok(ListMachinesResponse {
            machines: vms
                .iter()
                .map(|vm| (vm.provider_id.clone(), vm.machine_name.clone()))
                .collect(),
            resources: vms
                .iter()
                .map(|vm| (vm.provider_id.clone(), vec![vm_resource(vm)]))
                .collect(),
        })
    }

    async fn get_volume_ids(
        &self,
        req: GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        self.enter(Operation::GetVolumeIds, &req.request_id)?;
        // CSI volumes of any driver are "ours": their handle is the volume id.
        let volume_ids = req
            .pv_specs
            .iter()
            .filter_map(|spec| spec.csi.as_ref().map(|c| c.volume_handle.clone()))
            .collect();
        Ok(GetVolumeIdsResponse { volume_ids })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, SecretData};

    fn class(name: &str) -> mcm_api::MachineClass {
        let mut c = mcm_api::MachineClass::default();
        c.metadata.name = Some(name.into());
        c
    }

    fn create(name: &str, class_name: &str) -> CreateMachineRequest {
        CreateMachineRequest {
            machine: mcm_api::Machine::new(name, Default::default()),
            machine_class: class(class_name),
            secret: SecretData::default(),
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        }
    }

    #[tokio::test]
    async fn create_is_idempotent_and_list_filters_by_class() {
        let d = FakeDriver::new();
        let a = d.create_machine(create("m1", "c1")).await.unwrap();
        let b = d.create_machine(create("m1", "c1")).await.unwrap();
        assert_eq!(a, b);
        d.insert_vm("orphan", "c2");
        let list = d
            .list_machines(ListMachinesRequest {
                machine_class: class("c1"),
                secret: SecretData::default(),
                request_id: RequestId::generate(),
            })
            .await
            .unwrap();
        assert_eq!(
            list.machines,
            BTreeMap::from([("fake:///m1".to_string(), "m1".to_string())])
        );
        assert_eq!(d.call_count(Operation::CreateMachine), 2);
    }

    #[tokio::test]
    async fn scripted_errors_come_first_then_normal_behaviour() {
        let d = FakeDriver::new();
        d.fail_next(
            Operation::CreateMachine,
            DriverError::new(Code::ResourceExhausted, "no capacity"),
        );
        let err = d.create_machine(create("m", "c")).await.unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(d.vms().is_empty());
        d.create_machine(create("m", "c")).await.unwrap();
        assert_eq!(d.vms().len(), 1);
    }

    #[tokio::test]
    async fn uninitialized_until_initialize_runs() {
        let d = FakeDriver::new();
        d.require_initialization();
        let req = create("m", "c");
        d.create_machine(req.clone()).await.unwrap();
        let status = || GetMachineStatusRequest {
            machine: req.machine.clone(),
            machine_class: req.machine_class.clone(),
            secret: SecretData::default(),
            request_id: RequestId::generate(),
        };
        let err = d.get_machine_status(status()).await.unwrap_err();
        assert_eq!(err.code, Code::Uninitialized);
        d.initialize_machine(InitializeMachineRequest {
            machine: req.machine.clone(),
            machine_class: req.machine_class.clone(),
            secret: SecretData::default(),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap();
        assert!(d.get_machine_status(status()).await.is_ok());
    }
}
