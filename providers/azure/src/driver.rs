//! [`AzureDriver`]: the [`Driver`] of Azure VMs with their NIC and managed disks.
//!
//! | operation | ARM calls |
//! |---|---|
//! | `create_machine` | GET NIC, PUT NIC (when missing or failed) and wait; GET VM, PUT VM (when missing or failed) and wait; a capacity or quota failure removes the VM, NIC and disks again |
//! | `get_machine_status` | GET VM (another cluster's → `NotFound`; `Failed` before the machine has a providerID → `NotFound`, create repairs it; `Failed` after → GET with the instance view, the VM's state from its power state), GET NIC; reports VM, NIC and disks |
//! | `delete_machine` | GET VM, DELETE VM and wait; DELETE NIC, OS disk, data disks (each when present, even when the VM is gone) and wait |
//! | `list_machines` | list VMs, NICs and disks of the resource group (`nextLink` pages); everything with the cluster and role tags, by machine |
//! | `get_volume_ids` | none (disk ids from the PersistentVolume specs) |
//! | `initialize_machine` | none (`Unimplemented`, as Gardener's provider) |

use std::collections::BTreeMap;
use std::sync::Arc;

use azure_core::http::Method;
use mcm_api::Machine;
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse,
    Driver, DriverError, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, ListMachinesRequest, ListMachinesResponse, ResourceKind, ResourceState,
    ResourceStatus, SpecError, USER_DATA_KEY,
};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::client::{AzureDriverConfig, Call, Clients, Poll};
use crate::errors::AzureError;
use crate::resources::{self, ResourceType};
use crate::spec::{self, ClusterTags, ProviderSpec};

/// The Azure driver. Cheap to clone: the HTTP client and the credentials (with their token
/// caches) are shared.
#[derive(Debug, Clone)]
pub struct AzureDriver {
    config: AzureDriverConfig,
    clients: Arc<Clients>,
}

fn invalid(e: SpecError) -> DriverError {
    e.into_driver_error()
}

fn machine_name(machine: &Machine) -> Result<&str, DriverError> {
    machine
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| DriverError::invalid_argument("the machine has no name"))
}

/// The provisioning state of an ARM resource (JSON).
fn provisioning_state(r: &Value) -> &str {
    r.pointer("/properties/provisioningState")
        .and_then(|s| s.as_str())
        .unwrap_or_default()
}

/// The state of a resource in the SPI's terms.
pub fn resource_state(provisioning_state: &str) -> ResourceState {
    match provisioning_state.to_ascii_lowercase().as_str() {
        "succeeded" => ResourceState::Running,
        "creating" | "updating" | "migrating" => ResourceState::Creating,
        "failed" | "canceled" => ResourceState::Failed,
        "deleting" => ResourceState::Deleting,
        _ => ResourceState::Unknown,
    }
}

fn status_of(kind: ResourceKind, name: &str, r: &Value) -> ResourceStatus {
    let state = provisioning_state(r);
    ResourceStatus {
        kind,
        id: name.to_string(),
        state: resource_state(state),
        message: (!state.is_empty()).then(|| format!("provisioningState {state}")),
    }
}

/// The state of a VM whose `provisioningState` is `Failed`, from its instance view: an
/// operation on it failed (an extension, an update), which does not stop it. Running (or
/// starting) is `Running`; stopped or deallocated is `Stopped`; without a power state it is
/// `Failed`. The message names the failure and the power state. Pure.
pub fn failed_vm_status(name: &str, vm: &Value) -> ResourceStatus {
    let statuses = vm
        .pointer("/properties/instanceView/statuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let code_of = |prefix: &str| {
        statuses.iter().find_map(|s| {
            let code = s.get("code")?.as_str()?;
            code.strip_prefix(prefix).map(|rest| (rest.to_string(), s))
        })
    };
    let power = code_of("PowerState/").map(|(p, _)| p);
    let failure = code_of("ProvisioningState/failed/").map(|(code, s)| {
        match s.get("message").and_then(Value::as_str) {
            Some(m) if !m.is_empty() => format!("{code}: {m}"),
            _ => code,
        }
    });
    let state = match power.as_deref() {
        Some("running" | "starting") => ResourceState::Running,
        Some("stopped" | "stopping" | "deallocated" | "deallocating") => ResourceState::Stopped,
        _ => ResourceState::Failed,
    };
    let mut message = "provisioningState Failed".to_string();
    if let Some(f) = failure {
        message.push_str(&format!(" ({f})"));
    }
    message.push_str(&format!(
        ", power state {}",
        power.as_deref().unwrap_or("unknown")
    ));
    ResourceStatus {
        kind: ResourceKind::Vm,
        id: name.to_string(),
        state,
        message: Some(message),
    }
}

fn tag_keys(r: &Value) -> Vec<String> {
    r.get("tags")
        .and_then(|t| t.as_object())
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default()
}

fn ours(r: &Value, tags: &ClusterTags) -> bool {
    tags.matches(tag_keys(r).iter())
}

impl AzureDriver {
    /// A driver with explicit settings (e.g. endpoint overrides for tests).
    pub fn new(config: AzureDriverConfig) -> AzureDriver {
        AzureDriver {
            config,
            clients: Arc::default(),
        }
    }

    /// A driver with default settings; endpoints follow `MCM_AZURE_ARM_ENDPOINT` and
    /// `AZURE_AUTHORITY_HOST`, and the HTTP client trusts the CA certificates of the file
    /// `MCM_AZURE_CA_FILE` names besides the platform's ([`AzureDriverConfig::from_env`]).
    pub fn from_env() -> Result<AzureDriver, AzureError> {
        Ok(AzureDriver::new(AzureDriverConfig::from_env()?))
    }

    /// The settings of this driver.
    pub fn config(&self) -> &AzureDriverConfig {
        &self.config
    }

    fn call(
        &self,
        spec: &ProviderSpec,
        creds: &spec::Credentials,
        request_id: &mcm_driver::RequestId,
    ) -> Result<Call, DriverError> {
        let cloud = spec.cloud_configuration.as_ref().map(|c| c.name.as_str());
        self.clients
            .call(&self.config, cloud, creds, request_id)
            .map_err(|e| e.into_driver_error("preparing the Azure clients", request_id))
    }

    async fn get(
        &self,
        call: &Call,
        group: &str,
        kind: ResourceType,
        name: &str,
    ) -> Result<Option<Value>, AzureError> {
        let path = resources::resource_path(&call.subscription, group, kind, name);
        call.get_optional(&format!("GET {} {name}", kind.name()), &path)
            .await
    }

    /// The plan of the class's marketplace image, with its terms accepted, as Gardener's
    /// provider does before it creates a VM (`ProcessVMImageConfiguration`): for a URN image
    /// without `skipMarketPlaceAgreement`, the image version is read; when it has a plan, the
    /// plan's terms are read and accepted if they are not yet. `None`: no plan to send.
    async fn marketplace_plan(
        &self,
        call: &Call,
        spec: &ProviderSpec,
    ) -> Result<Option<Value>, AzureError> {
        let Some(urn) = spec
            .properties
            .storage_profile
            .image_reference
            .marketplace_urn()
        else {
            return Ok(None);
        };
        let image = self.vm_image(call, &spec.location, &urn).await?;
        let Some(plan) = resources::image_plan(&image) else {
            return Ok(None);
        };
        let path = resources::agreement_path(&call.subscription, &plan);
        let terms = call
            .arm_json("GET marketplace terms", Method::Get, &path, None)
            .await?;
        if !resources::terms_accepted(&terms) {
            let mut accepted = terms.clone();
            accepted["properties"]["accepted"] = json!(true);
            call.arm_json("PUT marketplace terms", Method::Put, &path, Some(&accepted))
                .await?;
            info!(plan = %plan, request_id = %call.request_id, "accepted the marketplace terms of the image's plan");
        }
        Ok(Some(plan))
    }

    /// The marketplace image version `urn` in `location`; one that does not exist is
    /// [`AzureError::ImageNotFound`].
    async fn vm_image(
        &self,
        call: &Call,
        location: &str,
        urn: &spec::Urn,
    ) -> Result<Value, AzureError> {
        let name = format!(
            "{}:{}:{}:{}",
            urn.publisher, urn.offer, urn.sku, urn.version
        );
        let what = format!("GET virtualMachineImages {name}");
        let path = resources::vm_image_path(&call.subscription, location, urn);
        match call.arm_json(&what, Method::Get, &path, None).await {
            Ok(image) => Ok(image),
            Err(e) if e.is_not_found() => Err(AzureError::ImageNotFound {
                urn: name,
                location: location.to_string(),
                source: Box::new(e),
            }),
            Err(e) => Err(e),
        }
    }

    /// Makes the data disks of machine `vm` that come from an image (the VM attaches them),
    /// as Gardener's provider does (`CreateDisksWithImageRef`); a disk an earlier attempt made
    /// is kept, one it left `Failed` is made again.
    async fn put_image_disks(
        &self,
        call: &Call,
        spec: &ProviderSpec,
        vm: &str,
    ) -> Result<(), AzureError> {
        let group = &spec.resource_group;
        for d in &spec.properties.storage_profile.data_disks {
            let Some(image) = &d.image_ref else { continue };
            let name = resources::data_disk_name(vm, d);
            if let Some(existing) = self.get(call, group, ResourceType::Disk, &name).await?
                && resource_state(provisioning_state(&existing)) != ResourceState::Failed
            {
                continue;
            }
            let urn_image_id = match image.urn_parts() {
                Some(urn) if image.id.trim().is_empty() => {
                    let found = self.vm_image(call, &spec.location, &urn).await?;
                    found.get("id").and_then(Value::as_str).map(str::to_string)
                }
                _ => None,
            };
            let body = resources::disk_body(
                spec,
                d,
                resources::disk_creation_data(image, urn_image_id.as_deref()),
            );
            let what = format!("PUT disks {name}");
            let path =
                resources::resource_path(&call.subscription, group, ResourceType::Disk, &name);
            call.put(&self.config, &what, &path, &body).await?;
        }
        Ok(())
    }

    /// A VM with its instance view (`$expand=instanceView`), if it exists.
    async fn get_vm_viewed(
        &self,
        call: &Call,
        group: &str,
        name: &str,
    ) -> Result<Option<Value>, AzureError> {
        let what = format!("GET virtualMachines {name} (instance view)");
        let path = resources::resource_path(&call.subscription, group, ResourceType::Vm, name);
        call.get_optional(&what, &format!("{path}&$expand=instanceView"))
            .await
    }

    /// Deletes a resource and waits; one that is not there is a success.
    async fn delete(
        &self,
        call: &Call,
        group: &str,
        kind: ResourceType,
        name: &str,
    ) -> Result<bool, AzureError> {
        let what = format!("DELETE {} {name}", kind.name());
        let path = resources::resource_path(&call.subscription, group, kind, name);
        let response = match call.send(&what, Method::Delete, &path, None).await {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(e),
        };
        if response.status == 204 {
            return Ok(false);
        }
        call.wait(
            &self.config,
            &what,
            Poll::of(response.status, &response.headers),
        )
        .await?;
        Ok(true)
    }

    async fn put_nic(&self, call: &Call, spec: &ProviderSpec, vm: &str) -> Result<(), AzureError> {
        let name = resources::nic_name(vm);
        let what = format!("PUT networkInterfaces {name}");
        let path = resources::resource_path(
            &call.subscription,
            &spec.resource_group,
            ResourceType::Nic,
            &name,
        );
        let body = resources::nic_body(spec, &call.subscription, vm);
        call.put(&self.config, &what, &path, &body).await
    }

    async fn put_vm(
        &self,
        call: &Call,
        spec: &ProviderSpec,
        vm: &str,
        user_data: &[u8],
    ) -> Result<(), AzureError> {
        let plan = self.marketplace_plan(call, spec).await?;
        self.put_image_disks(call, spec, vm).await?;
        let what = format!("PUT virtualMachines {vm}");
        let path = resources::resource_path(
            &call.subscription,
            &spec.resource_group,
            ResourceType::Vm,
            vm,
        );
        let body = resources::vm_body(
            spec,
            &call.subscription,
            vm,
            user_data,
            &resources::ssh_key_data(spec),
            plan.as_ref(),
        );
        call.put(&self.config, &what, &path, &body).await
    }

    /// Removes the VM, then its NIC and disks, each when present. Returns what was deleted.
    async fn remove_all(
        &self,
        call: &Call,
        spec: &ProviderSpec,
        vm: &str,
    ) -> Result<Vec<String>, AzureError> {
        let group = &spec.resource_group;
        let mut deleted = Vec::new();
        if self.delete(call, group, ResourceType::Vm, vm).await? {
            deleted.push(vm.to_string());
        }
        let nic = resources::nic_name(vm);
        if self.delete(call, group, ResourceType::Nic, &nic).await? {
            deleted.push(nic);
        }
        for disk in resources::disk_names(vm, spec) {
            if self.delete(call, group, ResourceType::Disk, &disk).await? {
                deleted.push(disk);
            }
        }
        Ok(deleted)
    }

    async fn list_all(
        &self,
        call: &Call,
        group: &str,
    ) -> Result<Vec<(ResourceType, Value)>, AzureError> {
        let mut out = Vec::new();
        for kind in [ResourceType::Vm, ResourceType::Nic, ResourceType::Disk] {
            let path = resources::list_path(&call.subscription, group, kind);
            let items = call.list(&format!("list {}", kind.name()), &path).await?;
            out.extend(items.into_iter().map(|item| (kind, item)));
        }
        Ok(out)
    }
}

fn resource_kind(kind: ResourceType) -> ResourceKind {
    match kind {
        ResourceType::Vm => ResourceKind::Vm,
        ResourceType::Nic => ResourceKind::NetworkInterface,
        ResourceType::Disk => ResourceKind::Disk,
    }
}

/// The private IPs of a NIC.
fn nic_addresses(nic: &Value) -> Vec<k8s_openapi::api::core::v1::NodeAddress> {
    nic.pointer("/properties/ipConfigurations")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            c.pointer("/properties/privateIPAddress")
                .and_then(|a| a.as_str())
        })
        .map(|a| k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: a.to_string(),
        })
        .collect()
}

#[async_trait::async_trait]
impl Driver for AzureDriver {
    fn validate_machine_class(
        &self,
        class: &mcm_api::MachineClass,
    ) -> Vec<mcm_driver::SpecProblem> {
        spec::class_problems(class)
    }

    fn machine_class_warnings(&self, class: &mcm_api::MachineClass) -> Vec<String> {
        spec::class_warnings(class)
    }

    async fn create_machine(
        &self,
        req: CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let vm = machine_name(&req.machine)?;
        let (spec, creds) = spec::checked_spec(&req.machine_class, &req.secret).map_err(invalid)?;
        let call = self.call(&spec, &creds, &req.request_id)?;
        let group = &spec.resource_group;
        let context = format!("creating VM {vm}");
        let err = |e: AzureError| e.into_driver_error(&context, &req.request_id);

        // The NIC: made when missing, made again when an earlier attempt left it failed.
        let nic_name = resources::nic_name(vm);
        let nic = self
            .get(&call, group, ResourceType::Nic, &nic_name)
            .await
            .map_err(err)?;
        if nic
            .as_ref()
            .is_none_or(|n| resource_state(provisioning_state(n)) == ResourceState::Failed)
        {
            self.put_nic(&call, &spec, vm).await.map_err(err)?;
            debug!(machine = vm, nic = %nic_name, request_id = %req.request_id, "NIC created");
        }

        // The VM: taken as it is when an earlier attempt made it, made (again) otherwise.
        let existing = self
            .get(&call, group, ResourceType::Vm, vm)
            .await
            .map_err(err)?;
        match existing {
            Some(v) if resource_state(provisioning_state(&v)) != ResourceState::Failed => {
                info!(machine = vm, request_id = %req.request_id, "VM exists already");
            }
            _ => {
                let user_data = req.secret.get(USER_DATA_KEY).unwrap_or_default();
                if let Err(e) = self.put_vm(&call, &spec, vm, user_data).await {
                    let class = e.classification();
                    if class.code == mcm_driver::Code::ResourceExhausted {
                        // No capacity: leave nothing behind, as Gardener's provider does, so
                        // the retry (or another zone's machine) starts clean.
                        match self.remove_all(&call, &spec, vm).await {
                            Ok(removed) => {
                                info!(machine = vm, ?removed, request_id = %req.request_id, "cleaned up after capacity failure")
                            }
                            Err(cleanup) => {
                                warn!(machine = vm, error = %cleanup, request_id = %req.request_id, "cleanup after capacity failure failed")
                            }
                        }
                    }
                    return Err(err(e));
                }
            }
        }
        let nic = self
            .get(&call, group, ResourceType::Nic, &nic_name)
            .await
            .map_err(err)?;
        let provider_id = resources::provider_id(&spec.location, vm);
        info!(machine = vm, %provider_id, request_id = %req.request_id, "VM created");
        Ok(CreateMachineResponse {
            provider_id,
            node_name: vm.to_string(),
            last_known_state: None,
            addresses: nic.as_ref().map(nic_addresses).unwrap_or_default(),
        })
    }

    async fn delete_machine(
        &self,
        req: DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let vm = machine_name(&req.machine)?;
        let (spec, tags, creds) =
            spec::lookup_spec(&req.machine_class, &req.secret).map_err(invalid)?;
        let call = self.call(&spec, &creds, &req.request_id)?;
        let context = format!("deleting VM {vm}");
        let err = |e: AzureError| e.into_driver_error(&context, &req.request_id);
        if let Some(v) = self
            .get(&call, &spec.resource_group, ResourceType::Vm, vm)
            .await
            .map_err(err)?
            && !ours(&v, &tags)
        {
            return Err(DriverError::not_found(format!(
                "{context}: the VM does not carry the tags {} and {}; it is not deleted (request id {})",
                tags.cluster, tags.role, req.request_id
            )));
        }
        let removed = self.remove_all(&call, &spec, vm).await.map_err(err)?;
        info!(machine = vm, ?removed, request_id = %req.request_id, "machine resources deleted");
        Ok(DeleteMachineResponse::default())
    }

    async fn get_machine_status(
        &self,
        req: GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let vm = machine_name(&req.machine)?;
        let (spec, tags, creds) =
            spec::lookup_spec(&req.machine_class, &req.secret).map_err(invalid)?;
        let call = self.call(&spec, &creds, &req.request_id)?;
        let context = format!("reading VM {vm}");
        let err = |e: AzureError| e.into_driver_error(&context, &req.request_id);
        let group = &spec.resource_group;
        let created = req
            .machine
            .spec
            .provider_id
            .as_deref()
            .is_some_and(|p| !p.is_empty());
        let vm_status = match self
            .get(&call, group, ResourceType::Vm, vm)
            .await
            .map_err(err)?
        {
            // A create that failed leaves the VM behind in provisioningState Failed (its NIC
            // and disks with it): before the machine was ever created there is nothing to wait
            // for, and creating it again repairs it in place (create_machine puts a failed VM
            // again).
            Some(v)
                if ours(&v, &tags)
                    && !created
                    && resource_state(provisioning_state(&v)) == ResourceState::Failed =>
            {
                return Err(DriverError::not_found(format!(
                    "VM: [ResourceGroup: {group}, Name: {vm}] is in provisioningState Failed; creating it again \
                     repairs it (request id {})",
                    req.request_id
                )));
            }
            // A machine that was created: its VM failed an operation later and may well still
            // run its pods, so it exists, in the state its power state says.
            Some(v)
                if ours(&v, &tags)
                    && resource_state(provisioning_state(&v)) == ResourceState::Failed =>
            {
                let viewed = self
                    .get_vm_viewed(&call, group, vm)
                    .await
                    .map_err(err)?
                    .unwrap_or(v);
                failed_vm_status(vm, &viewed)
            }
            Some(v) if ours(&v, &tags) => status_of(ResourceKind::Vm, vm, &v),
            Some(_) => {
                return Err(DriverError::not_found(format!(
                    "VM: [ResourceGroup: {group}, Name: {vm}] does not carry the tags {} and {} (request id {})",
                    tags.cluster, tags.role, req.request_id
                )));
            }
            None => {
                return Err(DriverError::not_found(format!(
                    "VM: [ResourceGroup: {group}, Name: {vm}] is not found (request id {})",
                    req.request_id
                )));
            }
        };
        let nic_name = resources::nic_name(vm);
        let nic = self
            .get(&call, group, ResourceType::Nic, &nic_name)
            .await
            .map_err(err)?;
        let vm_state = vm_status.state;
        let mut statuses = vec![vm_status];
        match &nic {
            Some(n) => statuses.push(status_of(ResourceKind::NetworkInterface, &nic_name, n)),
            None => statuses.push(ResourceStatus {
                kind: ResourceKind::NetworkInterface,
                id: nic_name,
                state: ResourceState::Failed,
                message: Some("the VM's NIC is missing".into()),
            }),
        }
        for disk in resources::disk_names(vm, &spec) {
            statuses.push(ResourceStatus {
                kind: ResourceKind::Disk,
                id: disk,
                state: vm_state,
                message: Some("managed by the VM".into()),
            });
        }
        Ok(GetMachineStatusResponse {
            provider_id: resources::provider_id(&spec.location, vm),
            node_name: vm.to_string(),
            addresses: nic.as_ref().map(nic_addresses).unwrap_or_default(),
            resources: statuses,
        })
    }

    async fn list_machines(
        &self,
        req: ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let (spec, tags, creds) =
            spec::lookup_spec(&req.machine_class, &req.secret).map_err(invalid)?;
        let call = self.call(&spec, &creds, &req.request_id)?;
        let all = self
            .list_all(&call, &spec.resource_group)
            .await
            .map_err(|e| e.into_driver_error("listing VMs, NICs and disks", &req.request_id))?;
        let mut by_machine: BTreeMap<String, Vec<ResourceStatus>> = BTreeMap::new();
        for (kind, r) in all.iter().filter(|(_, r)| ours(r, &tags)) {
            let name = r.get("name").and_then(|n| n.as_str()).unwrap_or_default();
            if let Some(machine) = resources::machine_of(*kind, name, &spec) {
                by_machine.entry(machine).or_default().push(status_of(
                    resource_kind(*kind),
                    name,
                    r,
                ));
            }
        }
        let mut out = ListMachinesResponse::default();
        for (machine, statuses) in by_machine {
            let provider_id = resources::provider_id(&spec.location, &machine);
            out.machines.insert(provider_id.clone(), machine);
            out.resources.insert(provider_id, statuses);
        }
        debug!(class = ?req.machine_class.metadata.name, count = out.machines.len(), request_id = %req.request_id, "listed machines");
        Ok(out)
    }

    async fn get_volume_ids(
        &self,
        req: GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        Ok(GetVolumeIdsResponse {
            volume_ids: req
                .pv_specs
                .iter()
                .filter_map(resources::volume_id)
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn states_and_tags() {
        assert_eq!(resource_state("Succeeded"), ResourceState::Running);
        assert_eq!(resource_state("Creating"), ResourceState::Creating);
        assert_eq!(resource_state("Failed"), ResourceState::Failed);
        assert_eq!(resource_state("Deleting"), ResourceState::Deleting);
        assert_eq!(resource_state(""), ResourceState::Unknown);
        let tags = ClusterTags {
            cluster: "kubernetes.io-cluster-a".into(),
            role: "kubernetes.io-role-node".into(),
        };
        let r = json!({"tags": {"kubernetes.io-cluster-a": "1", "kubernetes.io-role-node": "1"},
                       "properties": {"provisioningState": "Succeeded",
                                      "ipConfigurations": [{"properties": {"privateIPAddress": "10.0.0.4"}}]}});
        assert!(ours(&r, &tags));
        assert!(!ours(
            &json!({"tags": {"kubernetes.io-cluster-a": "1"}}),
            &tags
        ));
        assert_eq!(nic_addresses(&r)[0].address, "10.0.0.4");
        assert_eq!(
            status_of(ResourceKind::Vm, "m", &r).state,
            ResourceState::Running
        );
    }
}
