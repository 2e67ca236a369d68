//! [`GcpDriver`]: the [`Driver`] of Compute Engine instances.
//!
//! | operation | Compute calls |
//! |---|---|
//! | `create_machine` | `instances.insert` (with `requestId`) and `zoneOperations.get` until done, `instances.get`; an instance of that name already there (409) is returned when it carries the class's cluster and role tags |
//! | `initialize_machine` | none (`Unimplemented`, as Gardener's provider) |
//! | `get_machine_status` | `instances.get` in the providerID's zone (else the class's); not there or another cluster's → `NotFound` |
//! | `delete_machine` | `instances.get`, `instances.delete` (with `requestId`) and `zoneOperations.get` until done; gone = success; an instance of another cluster is never deleted |
//! | `list_machines` | `instances.aggregatedList` pages (the client's paginator) filtered by the class's `k8s-cluster-name` label when it has one, the zones of the class's region, instances with the cluster and role tags |
//! | `get_volume_ids` | none (disk ids from the PersistentVolume specs) |

use std::sync::Arc;

use google_cloud_compute_v1::model::Instance;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::paginator::Paginator;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    Code, CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse,
    Driver, DriverError, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, ListMachinesRequest, ListMachinesResponse, RequestId, SecretData,
    USER_DATA_KEY,
};
use tracing::{debug, info};

use crate::client::{Call, Clients, GcpDriverConfig, gce_request_id};
use crate::errors::GcpError;
use crate::instance;
use crate::provider_id::{InstanceRef, decode_provider_id, volume_id};
use crate::spec::{self, ClusterTags, ProviderSpec};
use mcm_driver::{SpecError, SpecProblem};

/// The GCP driver. Cheap to clone: the Compute clients (one per distinct credentials) are
/// shared.
#[derive(Debug, Clone)]
pub struct GcpDriver {
    config: GcpDriverConfig,
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

/// The region of a spec: its `region`, else its zone without the zone letter.
fn region_of(spec: &ProviderSpec) -> String {
    if !spec.region.is_empty() {
        return spec.region.clone();
    }
    spec.zone
        .rsplit_once('-')
        .map(|(r, _)| r.to_string())
        .unwrap_or_default()
}

/// Where the VM of a machine is: the machine's providerID when it names one in the project,
/// else the class's zone and the machine's name.
pub fn instance_ref(
    machine: &Machine,
    spec: &ProviderSpec,
    project: &str,
) -> Result<InstanceRef, DriverError> {
    let name = machine_name(machine)?;
    if let Some(p) = machine
        .spec
        .provider_id
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        let r = decode_provider_id(p)
            .map_err(|e| DriverError::invalid_argument(e.to_string()).with_source(e))?;
        if r.project == project {
            return Ok(r);
        }
    }
    Ok(InstanceRef {
        project: project.to_string(),
        zone: spec.zone.clone(),
        name: name.to_string(),
    })
}

/// The machine name of an instance, and whether it is the cluster's.
fn ours(i: &Instance, tags: &ClusterTags) -> bool {
    tags.matches(instance::network_tags(i))
}

impl GcpDriver {
    /// A driver with explicit settings (e.g. an endpoint override for tests).
    pub fn new(config: GcpDriverConfig) -> GcpDriver {
        crate::client::install_crypto_provider();
        GcpDriver {
            config,
            clients: Arc::default(),
        }
    }

    /// A driver with default settings; the endpoint follows `MCM_GCP_COMPUTE_ENDPOINT`.
    pub fn from_env() -> GcpDriver {
        GcpDriver::new(GcpDriverConfig::from_env())
    }

    /// The settings of this driver.
    pub fn config(&self) -> &GcpDriverConfig {
        &self.config
    }

    async fn call(&self, secret: &SecretData, request_id: &RequestId) -> Result<Call, DriverError> {
        let creds = spec::credentials(secret).map_err(|p| {
            invalid(SpecError::Invalid {
                provider: spec::PROVIDER,
                problems: p,
            })
        })?;
        let client = self
            .clients
            .get(&self.config, &creds)
            .await
            .map_err(|e| e.into_driver_error("preparing the Compute client", request_id))?;
        Ok(Call {
            client,
            project: creds.project,
            request_id: request_id.clone(),
        })
    }

    /// The spec for lookups and deletion (zone, tags, credentials) and the call.
    async fn lookup(
        &self,
        class: &MachineClass,
        secret: &SecretData,
        request_id: &RequestId,
    ) -> Result<(ProviderSpec, ClusterTags, Call), DriverError> {
        let spec = spec::lookup_spec(class, secret).map_err(invalid)?;
        let tags = ClusterTags::from_tags(&spec.tags).ok_or_else(|| {
            invalid(SpecError::Invalid {
                provider: spec::PROVIDER,
                problems: vec![SpecProblem::new(
                    "providerSpec.tags",
                    "cluster and role tags are required",
                )],
            })
        })?;
        let call = self.call(secret, request_id).await?;
        Ok((spec, tags, call))
    }

    /// The instance, or `None` if GCE has none of that name in that zone.
    async fn get(&self, call: &Call, r: &InstanceRef) -> Result<Option<Instance>, GcpError> {
        match call
            .client
            .get()
            .set_project(&r.project)
            .set_zone(&r.zone)
            .set_instance(&r.name)
            .with_user_agent(call.user_agent())
            .send()
            .await
        {
            Ok(i) => Ok(Some(i)),
            Err(e) => {
                let e = GcpError::api("instances.get", e);
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// The instance of `r` if it is the cluster's, else `NotFound`.
    async fn our_instance(
        &self,
        call: &Call,
        r: &InstanceRef,
        tags: &ClusterTags,
    ) -> Result<Instance, DriverError> {
        let context = format!("reading VM {}", r.provider_id());
        match self
            .get(call, r)
            .await
            .map_err(|e| e.into_driver_error(&context, &call.request_id))?
        {
            Some(i) if ours(&i, tags) => Ok(i),
            Some(_) => Err(DriverError::not_found(format!(
                "machine name={}: instance {} does not carry the tags {} and {} (request id {})",
                r.name,
                r.provider_id(),
                tags.cluster,
                tags.role,
                call.request_id
            ))),
            None => Err(DriverError::not_found(format!(
                "machine name={}: instance {} not found (request id {})",
                r.name,
                r.provider_id(),
                call.request_id
            ))),
        }
    }

    /// Inserts the instance and waits for the operation; an instance of that name that is
    /// already the cluster's is taken as created.
    ///
    /// The instance's name is the machine's, and Compute refuses a second instance of one
    /// name in a zone (`alreadyExists`): that is what makes a repeated create, in any process,
    /// return the first one's VM. The creation attempt's idempotency key is deliberately not
    /// the `requestId`: Compute answers a repeated `requestId` with the first request's
    /// operation whatever its outcome, so a retry after a failed insert (a zone out of
    /// capacity) would get the same failure back for as long as Compute remembers the id. The
    /// `requestId` is the call's ([`gce_request_id`]), which covers the client's own retries.
    async fn insert(
        &self,
        call: &Call,
        spec: &ProviderSpec,
        r: &InstanceRef,
        body: Instance,
    ) -> Result<(), DriverError> {
        let context = format!("creating VM {}", r.provider_id());
        let tags = ClusterTags::from_tags(&spec.tags);
        let sent = call
            .client
            .insert()
            .set_project(&r.project)
            .set_zone(&r.zone)
            .set_request_id(gce_request_id(&call.request_id))
            .set_body(body)
            .with_user_agent(call.user_agent())
            // The requestId makes a repeated insert return the first one's operation.
            .with_idempotency(true)
            .send()
            .await
            .map_err(|e| GcpError::api("instances.insert", e));
        let op = match sent {
            Ok(op) => op,
            Err(e) if e.is_already_exists() => {
                let existing = self
                    .get(call, r)
                    .await
                    .map_err(|e| e.into_driver_error(&context, &call.request_id))?;
                return match (existing, tags) {
                    (Some(i), Some(t)) if ours(&i, &t) => {
                        info!(machine = %r.name, provider_id = %r.provider_id(), request_id = %call.request_id,
                            "instance exists already");
                        Ok(())
                    }
                    _ => Err(DriverError::new(
                        Code::AlreadyExists,
                        format!(
                            "{context}: an instance of that name exists and is not this cluster's \
                             (its network tags lack the class's cluster and role tags) (request id {})",
                            call.request_id
                        ),
                    )
                    .with_source(e)),
                };
            }
            Err(e) => return Err(e.into_driver_error(&context, &call.request_id)),
        };
        debug!(machine = %r.name, operation = ?op.name, request_id = %call.request_id, "insert accepted");
        call.wait(&self.config, &r.zone, op)
            .await
            .map_err(|e| e.into_driver_error(&context, &call.request_id))?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Driver for GcpDriver {
    fn validate_machine_class(&self, class: &mcm_api::MachineClass) -> Vec<SpecProblem> {
        spec::class_problems(class)
    }

    fn machine_class_warnings(&self, class: &mcm_api::MachineClass) -> Vec<String> {
        spec::class_warnings(class)
    }

    async fn create_machine(
        &self,
        req: CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let name = machine_name(&req.machine)?;
        let spec = spec::checked_spec(&req.machine_class, &req.secret).map_err(invalid)?;
        if !spec::is_resource_name(name) {
            return Err(DriverError::invalid_argument(format!(
                "machine name {name:?} cannot name a GCE instance: 1-63 lowercase letters, digits and '-', \
                 starting with a letter and not ending with '-'"
            )));
        }
        let call = self.call(&req.secret, &req.request_id).await?;
        let r = InstanceRef {
            project: call.project.clone(),
            zone: spec.zone.clone(),
            name: name.to_string(),
        };
        let user_data = String::from_utf8_lossy(req.secret.get(USER_DATA_KEY).unwrap_or_default());
        let body = instance::to_model(instance::insert_body(
            &spec,
            &call.project,
            name,
            &user_data,
        ))
        .map_err(|e| {
            DriverError::internal(format!("building the instance of {name}: {e}")).with_source(e)
        })?;
        self.insert(&call, &spec, &r, body).await?;
        let provider_id = r.provider_id();
        let created = self.get(&call, &r).await.map_err(|e| {
            e.into_driver_error(&format!("reading VM {provider_id}"), &call.request_id)
        })?;
        info!(machine = name, %provider_id, request_id = %req.request_id, "instance created");
        Ok(CreateMachineResponse {
            provider_id,
            node_name: name.to_string(),
            last_known_state: None,
            addresses: created
                .as_ref()
                .map(instance::addresses)
                .unwrap_or_default(),
        })
    }

    async fn delete_machine(
        &self,
        req: DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let (spec, tags, call) = self
            .lookup(&req.machine_class, &req.secret, &req.request_id)
            .await?;
        let r = instance_ref(&req.machine, &spec, &call.project)?;
        let context = format!("deleting VM {}", r.provider_id());
        match self
            .get(&call, &r)
            .await
            .map_err(|e| e.into_driver_error(&context, &call.request_id))?
        {
            None => {
                info!(machine = %r.name, provider_id = %r.provider_id(), request_id = %req.request_id, "instance already gone");
                return Ok(DeleteMachineResponse::default());
            }
            Some(i) if !ours(&i, &tags) => {
                return Err(DriverError::not_found(format!(
                    "{context}: the instance does not carry the tags {} and {}; it is not deleted (request id {})",
                    tags.cluster, tags.role, req.request_id
                )));
            }
            Some(_) => {}
        }
        let sent = call
            .client
            .delete()
            .set_project(&r.project)
            .set_zone(&r.zone)
            .set_instance(&r.name)
            .set_request_id(gce_request_id(&req.request_id))
            .with_user_agent(call.user_agent())
            .send()
            .await
            .map_err(|e| GcpError::api("instances.delete", e));
        let op = match sent {
            Ok(op) => op,
            Err(e) if e.is_not_found() => return Ok(DeleteMachineResponse::default()),
            Err(e) => return Err(e.into_driver_error(&context, &req.request_id)),
        };
        call.wait(&self.config, &r.zone, op)
            .await
            .map_err(|e| e.into_driver_error(&context, &req.request_id))?;
        info!(machine = %r.name, provider_id = %r.provider_id(), request_id = %req.request_id, "instance deleted");
        Ok(DeleteMachineResponse::default())
    }

    async fn get_machine_status(
        &self,
        req: GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let (spec, tags, call) = self
            .lookup(&req.machine_class, &req.secret, &req.request_id)
            .await?;
        let r = instance_ref(&req.machine, &spec, &call.project)?;
        let i = self.our_instance(&call, &r, &tags).await?;
        Ok(GetMachineStatusResponse {
            provider_id: r.provider_id(),
            node_name: r.name.clone(),
            addresses: instance::addresses(&i),
            resources: instance::resources(&i),
        })
    }

    async fn list_machines(
        &self,
        req: ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let (spec, tags, call) = self
            .lookup(&req.machine_class, &req.secret, &req.request_id)
            .await?;
        let region_prefix = format!("zones/{}-", region_of(&spec));
        let filter = instance::list_filter(&spec);
        let mut out = ListMachinesResponse::default();
        let mut pages = 0usize;
        // The client's paginator: it asks for the next page with the last one's token until a
        // page has none.
        let mut paginator = call
            .client
            .aggregated_list()
            .set_project(&call.project)
            .set_max_results(self.config.page_size.clamp(1, 500))
            .set_or_clear_filter(filter)
            .with_user_agent(call.user_agent())
            .by_page();
        while let Some(page) = paginator.next().await {
            let page = page.map_err(|e| {
                GcpError::api("instances.aggregatedList", e)
                    .into_driver_error("listing VMs", &req.request_id)
            })?;
            pages += 1;
            for (scope, list) in &page.items {
                let Some(zone) = scope.strip_prefix("zones/") else {
                    continue;
                };
                if !scope.starts_with(&region_prefix) {
                    continue;
                }
                for i in list.instances.iter().filter(|i| ours(i, &tags)) {
                    let name = i.name.clone().unwrap_or_default();
                    let provider_id = InstanceRef {
                        project: call.project.clone(),
                        zone: zone.to_string(),
                        name: name.clone(),
                    }
                    .provider_id();
                    out.resources
                        .insert(provider_id.clone(), instance::resources(i));
                    out.machines.insert(provider_id, name);
                }
            }
        }
        debug!(class = ?req.machine_class.metadata.name, count = out.machines.len(), pages, request_id = %req.request_id, "listed instances");
        Ok(out)
    }

    async fn get_volume_ids(
        &self,
        req: GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        Ok(GetVolumeIdsResponse {
            volume_ids: req.pv_specs.iter().filter_map(volume_id).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, provider_id: Option<&str>) -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some(name.into());
        m.spec.provider_id = provider_id.map(str::to_string);
        m
    }

    #[test]
    fn the_vm_is_where_the_provider_id_says() {
        let spec = ProviderSpec {
            zone: "europe-west1-b".into(),
            ..Default::default()
        };
        let r = instance_ref(
            &machine("m-0", Some("gce:///p/europe-west1-c/m-0")),
            &spec,
            "p",
        )
        .unwrap();
        assert_eq!(
            r.zone, "europe-west1-c",
            "the zone the VM was created in, not the class's now"
        );
        let r = instance_ref(&machine("m-0", None), &spec, "p").unwrap();
        assert_eq!(r.provider_id(), "gce:///p/europe-west1-b/m-0");
        let r = instance_ref(&machine("m-0", Some("gce:///other/z/m-0")), &spec, "p").unwrap();
        assert_eq!(r.project, "p", "another project's id is not followed");
        assert!(instance_ref(&machine("m-0", Some("aws:///r/i-1")), &spec, "p").is_err());
    }

    #[test]
    fn regions() {
        let s = |region: &str, zone: &str| ProviderSpec {
            region: region.into(),
            zone: zone.into(),
            ..Default::default()
        };
        assert_eq!(
            region_of(&s("europe-west1", "europe-west1-b")),
            "europe-west1"
        );
        assert_eq!(region_of(&s("", "us-central1-a")), "us-central1");
    }
}
