//! An out-of-tree provider for mcm-rs in one file, built on `mcm-core` alone. Its "cloud"
//! keeps VMs in memory, and each VM plays its own kubelet: it registers a Node in the target
//! cluster (the `kubeconfig` of the class Secret) and keeps it Ready. Replace the bodies of
//! the five driver methods with calls to a real cloud API; everything else (flags, leader
//! election, lifecycle, drain, health, metrics) comes from mcm-core.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use mcm_core::clap::Parser;
use mcm_core::driver::*;
use mcm_core::k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use mcm_core::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use mcm_core::k8s_openapi::jiff::Timestamp;
use mcm_core::kube::api::{Api, Patch, PatchParams, PostParams};
use mcm_core::kube::config::{Config, KubeConfigOptions, Kubeconfig};

/// The VMs of the "cloud": provider id -> machine name.
type Vms = Arc<Mutex<BTreeMap<String, String>>>;

#[derive(Default)]
struct Skeleton(Vms);

fn fail<E: std::fmt::Display>(code: Code) -> impl Fn(E) -> DriverError {
    move |e| DriverError::new(code, e.to_string())
}

fn lock(vms: &Vms) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
    vms.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client of the target cluster from the class Secret's `kubeconfig`.
async fn target(secret: &SecretData) -> Result<mcm_core::kube::Client, DriverError> {
    let yaml = secret
        .get_str("kubeconfig")
        .ok_or(DriverError::new(Code::InvalidArgument, "the class Secret has no kubeconfig"))?;
    let kc = Kubeconfig::from_yaml(yaml).map_err(fail(Code::InvalidArgument))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await;
    mcm_core::kube::Client::try_from(config.map_err(fail(Code::InvalidArgument))?).map_err(fail(Code::Internal))
}

/// The VM's kubelet: registers its Node, then reports it Ready every 10 s while the VM exists.
async fn kubelet(nodes: Api<Node>, name: String, id: String, vms: Vms) {
    let spec = NodeSpec { provider_id: Some(id.clone()), ..NodeSpec::default() };
    let meta = ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() };
    let node = Node { metadata: meta, spec: Some(spec), ..Node::default() };
    let _ = nodes.create(&PostParams::default(), &node).await;
    while lock(&vms).contains_key(&id) {
        let ready = NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_heartbeat_time: Some(Time(Timestamp::now())),
            ..NodeCondition::default()
        };
        let status = NodeStatus { conditions: Some(vec![ready]), ..NodeStatus::default() };
        let patch = Node { status: Some(status), ..Node::default() };
        let _ = nodes.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await;
        mcm_core::tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    }
}

#[mcm_core::async_trait]
impl Driver for Skeleton {
    async fn create_machine(&self, req: CreateMachineRequest) -> Result<CreateMachineResponse, DriverError> {
        let name = req.machine.metadata.name.clone().unwrap_or_default();
        let id = format!("skeleton:///{name}");
        let nodes = Api::all(target(&req.secret).await?);
        let new = lock(&self.0).insert(id.clone(), name.clone());
        if new.is_none() {
            mcm_core::tokio::spawn(kubelet(nodes, name.clone(), id.clone(), self.0.clone()));
        }
        Ok(CreateMachineResponse { provider_id: id, node_name: name, last_known_state: None, addresses: vec![] })
    }

    async fn delete_machine(&self, req: DeleteMachineRequest) -> Result<DeleteMachineResponse, DriverError> {
        let name = req.machine.metadata.name.unwrap_or_default();
        lock(&self.0).retain(|_, m| *m != name);
        Ok(DeleteMachineResponse::default())
    }

    async fn get_machine_status(&self, req: GetMachineStatusRequest) -> Result<GetMachineStatusResponse, DriverError> {
        let name = req.machine.metadata.name.unwrap_or_default();
        let id = lock(&self.0).iter().find(|(_, m)| **m == name).map(|(id, _)| id.clone());
        let id = id.ok_or(DriverError::not_found(format!("no VM for machine {name}")))?;
        Ok(GetMachineStatusResponse { provider_id: id, node_name: name, addresses: vec![], resources: vec![] })
    }

    async fn list_machines(&self, _: ListMachinesRequest) -> Result<ListMachinesResponse, DriverError> {
        Ok(ListMachinesResponse { machines: lock(&self.0).clone(), resources: BTreeMap::new() })
    }

    async fn get_volume_ids(&self, _: GetVolumeIdsRequest) -> Result<GetVolumeIdsResponse, DriverError> {
        Ok(GetVolumeIdsResponse::default())
    }
}

#[mcm_core::tokio::main(crate = "mcm_core::tokio")]
async fn main() -> Result<(), mcm_core::RunError> {
    mcm_core::run_machine_controller(mcm_core::MachineControllerOptions::parse(), Skeleton::default()).await
}
