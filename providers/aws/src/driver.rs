//! [`AwsDriver`]: the [`Driver`] of EC2 instances.
//!
//! | operation | EC2 calls |
//! |---|---|
//! | `create_machine` | `DescribeInstances` (by tags; an existing instance is returned), `DescribeImages` (AMI and its root device), `RunInstances` with the attempt's idempotency key as `ClientToken`, then `DescribeInstances` by id until EC2 lists the instance |
//! | `initialize_machine` | `DescribeInstances` (by the providerID's id, else by tags), `ModifyNetworkInterfaceAttribute` per interface (source/destination check off when `srcAndDstChecksEnabled: false`; `efa` and `efa-only` interfaces are left as they are) |
//! | `get_machine_status` | `DescribeInstances` by the providerID's instance id; without a providerID by `Name` + cluster/role tags (several → `OutOfRange`); none or terminated → `NotFound`, check still on → `Uninitialized` |
//! | `delete_machine` | `DescribeInstances` + `TerminateInstances` of the providerID's instance (unless it is gone), else of the instances found by tags; gone = success |
//! | `list_machines` | `DescribeInstances` pages with the cluster and role tags |
//! | `get_volume_ids` | none (EBS volume ids from the PersistentVolume specs) |

use std::sync::Arc;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, Instance, InstanceStateName};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    Code, CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse,
    Driver, DriverError, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest,
    ListMachinesResponse, RequestId, SecretData, USER_DATA_KEY,
};
use tracing::{debug, info, warn};

use crate::client::{self, AwsDriverConfig};
use crate::errors::from_sdk;
use crate::launch;
use crate::provider_id::{decode_provider_id, encode_provider_id, volume_id};
use crate::spec::{self, ProviderSpec};
use crate::tags::{self, ClusterTags};
use mcm_driver::{SpecError, SpecProblem};

/// The AWS driver. Cheap to share: one HTTP connection pool and one EC2 client per region
/// and credentials ([`client::Ec2Clients`]).
#[derive(Debug, Clone)]
pub struct AwsDriver {
    clients: Arc<client::Ec2Clients>,
    config: AwsDriverConfig,
}

/// What one driver call works with.
struct Call<'a> {
    ec2: Client,
    spec: ProviderSpec,
    tags: ClusterTags,
    request_id: &'a RequestId,
}

impl AwsDriver {
    /// A driver with explicit settings (e.g. an endpoint override for tests).
    pub async fn new(config: AwsDriverConfig) -> AwsDriver {
        let sdk = client::load_sdk_config(&config).await;
        AwsDriver {
            clients: Arc::new(client::Ec2Clients::new(sdk, &config)),
            config,
        }
    }

    /// A driver with default settings; the endpoint follows `AWS_ENDPOINT_URL_EC2` /
    /// `AWS_ENDPOINT_URL` when set.
    pub async fn from_env() -> AwsDriver {
        AwsDriver::new(AwsDriverConfig::default()).await
    }

    /// The settings of this driver.
    pub fn config(&self) -> &AwsDriverConfig {
        &self.config
    }

    /// Validates the class and secret (every problem at once) and builds the call's client.
    fn call<'a>(
        &self,
        class: &MachineClass,
        secret: &SecretData,
        request_id: &'a RequestId,
        need_user_data: bool,
    ) -> Result<Call<'a>, DriverError> {
        let spec = spec::checked_spec(class, secret, need_user_data).map_err(invalid)?;
        self.call_with(spec, secret, request_id)
    }

    /// Like [`Self::call`] but only requires what deletion needs (region, credentials, tags),
    /// so a class that became invalid does not block deleting its machines.
    fn deletion_call<'a>(
        &self,
        class: &MachineClass,
        secret: &SecretData,
        request_id: &'a RequestId,
    ) -> Result<Call<'a>, DriverError> {
        let spec = spec::parse_provider_spec(class).map_err(invalid)?;
        let mut problems = spec::validate_secret(secret, false);
        if spec.region.trim().is_empty() {
            problems.push(SpecProblem {
                field: "providerSpec.region".into(),
                detail: "is required".into(),
            });
        }
        if !problems.is_empty() {
            return Err(invalid(SpecError::Invalid {
                provider: spec::PROVIDER,
                problems,
            }));
        }
        self.call_with(spec, secret, request_id)
    }

    fn call_with<'a>(
        &self,
        spec: ProviderSpec,
        secret: &SecretData,
        request_id: &'a RequestId,
    ) -> Result<Call<'a>, DriverError> {
        let tags = ClusterTags::from_tags(&spec.tags).ok_or_else(|| {
            invalid(SpecError::Invalid {
                provider: spec::PROVIDER,
                problems: vec![SpecProblem {
                    field: "providerSpec.tags".into(),
                    detail: "kubernetes.io/cluster/* and kubernetes.io/role/* tags are required"
                        .into(),
                }],
            })
        })?;
        let auth = spec::auth(secret).ok_or_else(|| {
            DriverError::invalid_argument(
                "the secret has neither an AWS access key nor workload identity".to_string(),
            )
        })?;
        if let spec::Auth::WebIdentity { token_file, .. } = &auth
            && let Err(e) = std::fs::metadata(token_file)
        {
            return Err(DriverError::new(
                Code::Unauthenticated,
                format!(
                    "the workload identity token file {} of the secret cannot be read: {e} (request id {request_id})",
                    token_file.display()
                ),
            )
            .with_source(e));
        }
        let ec2 = self.clients.client(&spec.region, &auth);
        Ok(Call {
            ec2,
            spec,
            tags,
            request_id,
        })
    }

    /// Every page of `DescribeInstances` with `filters`, keeping the instances that carry both
    /// the cluster and the role tag.
    async fn describe(
        &self,
        call: &Call<'_>,
        filters: Vec<Filter>,
    ) -> Result<Vec<Instance>, DriverError> {
        let page_size = self.config.page_size.clamp(5, 1000);
        let mut pages = call
            .ec2
            .describe_instances()
            .set_filters(Some(filters))
            .max_results(page_size)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| from_sdk("DescribeInstances", call.request_id, e))?;
            out.extend(
                page.reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .filter(|i| call.tags.matches(i.tags()))
                    .cloned(),
            );
        }
        Ok(out)
    }

    /// The live instances of a machine.
    async fn instances_of(
        &self,
        call: &Call<'_>,
        machine: &str,
    ) -> Result<Vec<Instance>, DriverError> {
        self.describe(call, call.tags.machine_filters(machine))
            .await
    }

    /// The one live instance of a machine: `NotFound` when none, `OutOfRange` when several.
    async fn the_instance_of(
        &self,
        call: &Call<'_>,
        machine: &str,
    ) -> Result<Instance, DriverError> {
        let mut found = self.instances_of(call, machine).await?;
        match found.len() {
            0 => Err(DriverError::not_found(format!(
                "no instance of machine {machine} (tags Name={machine}, {}, {}) in {} (request id {})",
                call.tags.cluster, call.tags.role, call.spec.region, call.request_id
            ))),
            1 => Ok(found.remove(0)),
            _ => Err(DriverError::new(
                Code::OutOfRange,
                format!(
                    "{} instances back machine {machine}: {} (request id {})",
                    found.len(),
                    ids(&found).join(", "),
                    call.request_id
                ),
            )),
        }
    }

    /// The instance of a machine: by the providerID's instance id when one is recorded (tags
    /// can be changed by anyone, and a lookup by id does not depend on them), else by tags
    /// ([`Self::the_instance_of`]). A terminated (or terminating) instance is `NotFound`.
    async fn instance_of_machine(
        &self,
        call: &Call<'_>,
        machine: &Machine,
    ) -> Result<Instance, DriverError> {
        let name = machine_name(machine)?;
        let Some(provider_id) = recorded_provider_id(machine) else {
            return self.the_instance_of(call, name).await;
        };
        let id = decode_provider_id(provider_id)
            .map_err(|e| DriverError::invalid_argument(e.to_string()).with_source(e))?;
        match self.instance_by_id(call, id).await? {
            Some(i) if !is_terminal(&i) => Ok(i),
            found => Err(DriverError::not_found(format!(
                "instance {id} of machine {name} ({provider_id}) {} in {} (request id {})",
                if found.is_some() {
                    "is terminated"
                } else {
                    "does not exist"
                },
                call.spec.region,
                call.request_id
            ))),
        }
    }

    /// `DescribeInstances` of one instance id; `None` when EC2 does not know it.
    async fn instance_by_id(
        &self,
        call: &Call<'_>,
        instance_id: &str,
    ) -> Result<Option<Instance>, DriverError> {
        match call
            .ec2
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(out) => Ok(out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .find(|i| i.instance_id() == Some(instance_id))
                .cloned()),
            Err(e) => {
                let e = from_sdk("DescribeInstances", call.request_id, e);
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// Waits, polling `DescribeInstances` by id with a growing pause, until EC2 lists the
    /// instance it just launched (its reads are eventually consistent). `Unavailable` after
    /// the driver's `visibility_timeout`: the retry of the create, with the same client token,
    /// gets the same instance and waits again.
    async fn await_listed(
        &self,
        call: &Call<'_>,
        instance_id: &str,
    ) -> Result<Instance, DriverError> {
        let deadline = tokio::time::Instant::now() + self.config.visibility_timeout;
        let mut pause = std::time::Duration::from_millis(200);
        loop {
            if let Some(i) = self.instance_by_id(call, instance_id).await? {
                return Ok(i);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(DriverError::new(
                    Code::Unavailable,
                    format!(
                        "instance {instance_id} was launched but EC2 did not list it within {}s; the retry finds the same instance by its client token (request id {})",
                        self.config.visibility_timeout.as_secs(),
                        call.request_id
                    ),
                ));
            }
            debug!(instance = instance_id, request_id = %call.request_id, "launched instance not listed yet");
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
        }
    }

    /// `RunInstances` with the attempt's client token, then [`Self::await_listed`]. A token
    /// whose instance terminated already (EC2 answers a used token with its instance, even a
    /// terminated one) is followed by the next generation's token (`<key>-1`, ...): the
    /// sequence is the same after a restart, so a crash in between never launches twice.
    async fn launch(
        &self,
        call: &Call<'_>,
        request: &aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder,
        key: &str,
    ) -> Result<Instance, DriverError> {
        let mut gone = Vec::new();
        for generation in 0..MAX_GENERATIONS {
            let token = launch::client_token(key, generation);
            let out = request
                .clone()
                .client_token(&token)
                .send()
                .await
                .map_err(|e| from_sdk("RunInstances", call.request_id, e))
                .map_err(|e| {
                    if e.code == Code::AlreadyExists {
                        // The token launched an instance with other parameters (the class or
                        // the user data changed between retries): that instance exists, and
                        // the next attempt adopts it once EC2 lists it by its tags.
                        DriverError::new(
                            Code::Unavailable,
                            format!(
                                "an instance was launched for this creation attempt (client token {token}) with other parameters; it is adopted once EC2 lists it: {}",
                                e.message
                            ),
                        )
                        .with_source(e)
                    } else {
                        e
                    }
                })?;
            let id = out
                .instances()
                .first()
                .and_then(|i| i.instance_id())
                .ok_or_else(|| {
                    DriverError::internal(format!(
                        "RunInstances returned no instance (request id {})",
                        call.request_id
                    ))
                })?
                .to_string();
            let instance = self.await_listed(call, &id).await?;
            if !is_terminal(&instance) {
                return Ok(instance);
            }
            let reason = instance
                .state_reason()
                .and_then(|r| r.message())
                .unwrap_or("no reason given");
            warn!(instance = %id, client_token = %token, reason, request_id = %call.request_id,
                "the instance of this client token terminated; launching the next one");
            gone.push(format!("{id} ({reason})"));
        }
        Err(DriverError::new(
            Code::ResourceExhausted,
            format!(
                "every instance launched for this machine terminated at once: {} (request id {})",
                gone.join(", "),
                call.request_id
            ),
        ))
    }

    /// The root device name of the AMI; `InvalidArgument` when the AMI does not exist.
    async fn root_device_name(&self, call: &Call<'_>) -> Result<Option<String>, DriverError> {
        let out = call
            .ec2
            .describe_images()
            .image_ids(&call.spec.ami)
            .send()
            .await
            .map_err(|e| from_sdk("DescribeImages", call.request_id, e))?;
        let image = out.images().first().ok_or_else(|| {
            DriverError::invalid_argument(format!(
                "the AMI {} does not exist in {} (request id {})",
                call.spec.ami, call.spec.region, call.request_id
            ))
        })?;
        Ok(image.root_device_name().map(String::from))
    }

    /// Whether the instance does not exist or is terminated already (terminating it again
    /// is pointless, and moto fails a second termination).
    async fn is_gone(&self, call: &Call<'_>, instance_id: &str) -> Result<bool, DriverError> {
        Ok(self
            .instance_by_id(call, instance_id)
            .await?
            .is_none_or(|i| is_terminal(&i)))
    }

    async fn terminate(
        &self,
        call: &Call<'_>,
        instance_ids: Vec<String>,
    ) -> Result<(), DriverError> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        match call
            .ec2
            .terminate_instances()
            .set_instance_ids(Some(instance_ids.clone()))
            .send()
            .await
        {
            Ok(_) => {
                info!(instances = ?instance_ids, request_id = %call.request_id, "terminated");
                Ok(())
            }
            Err(e) => {
                let e = from_sdk("TerminateInstances", call.request_id, e);
                if e.is_not_found() {
                    info!(instances = ?instance_ids, request_id = %call.request_id, "already gone");
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    fn provider_id(&self, call: &Call<'_>, instance: &Instance) -> String {
        encode_provider_id(
            &call.spec.region,
            instance.instance_id().unwrap_or_default(),
        )
    }
}

/// Client tokens tried per creation attempt before giving up (each after the last one's
/// instance terminated at once, e.g. for lack of capacity).
const MAX_GENERATIONS: u32 = 5;

/// Terminated or being terminated.
fn is_terminal(instance: &Instance) -> bool {
    matches!(
        instance.state().and_then(|s| s.name()),
        Some(InstanceStateName::Terminated | InstanceStateName::ShuttingDown)
    )
}

/// The machine's recorded providerID, when it has one.
fn recorded_provider_id(machine: &Machine) -> Option<&str> {
    machine
        .spec
        .provider_id
        .as_deref()
        .filter(|p| !p.is_empty())
}

fn invalid(e: SpecError) -> DriverError {
    e.into_driver_error()
}

fn ids(instances: &[Instance]) -> Vec<String> {
    instances
        .iter()
        .filter_map(|i| i.instance_id())
        .map(String::from)
        .collect()
}

fn machine_name(machine: &Machine) -> Result<&str, DriverError> {
    machine
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| DriverError::invalid_argument("the machine has no name"))
}

#[async_trait::async_trait]
impl Driver for AwsDriver {
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
        client::with_request_id(req.request_id.clone(), async move {
            let name = machine_name(&req.machine)?;
            let call = self.call(&req.machine_class, &req.secret, &req.request_id, true)?;
            let existing = self.instances_of(&call, name).await?;
            if let Some(instance) = launch::oldest(&existing) {
                if existing.len() > 1 {
                    warn!(machine = name, instances = ?ids(&existing), request_id = %req.request_id,
                        "several instances back this machine; returning the oldest");
                }
                let provider_id = self.provider_id(&call, instance);
                info!(machine = name, %provider_id, request_id = %req.request_id, "instance exists already");
                return Ok(CreateMachineResponse {
                    provider_id,
                    node_name: launch::node_name(instance),
                    last_known_state: None,
                    addresses: launch::addresses(instance),
                });
            }
            let root = self.root_device_name(&call).await?;
            let user_data = req.secret.get(USER_DATA_KEY).unwrap_or_default();
            let placement_annotation = req
                .machine
                .spec
                .node_template
                .as_ref()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(launch::PLACEMENT_ANNOTATION))
                .map(String::as_str);
            let request = launch::run_instances_request(
                call.ec2.run_instances(),
                &call.spec,
                name,
                placement_annotation,
                user_data,
                root.as_deref(),
                &launch::client_token(req.idempotency_key.as_str(), 0),
            )
            .map_err(|e| DriverError::invalid_argument(e.to_string()).with_source(e))?;
            let instance = self
                .launch(&call, &request, req.idempotency_key.as_str())
                .await?;
            let provider_id = self.provider_id(&call, &instance);
            info!(machine = name, %provider_id, idempotency_key = %req.idempotency_key, request_id = %req.request_id, "instance created");
            Ok(CreateMachineResponse {
                provider_id,
                node_name: launch::node_name(&instance),
                last_known_state: None,
                addresses: launch::addresses(&instance),
            })
        })
        .await
    }

    async fn initialize_machine(
        &self,
        req: InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        client::with_request_id(req.request_id.clone(), async move {
            let name = machine_name(&req.machine)?;
            let call = self.call(&req.machine_class, &req.secret, &req.request_id, false)?;
            let instance = self.instance_of_machine(&call, &req.machine).await?;
            let id = instance.instance_id().unwrap_or_default().to_string();
            for eni in launch::src_dst_checks_to_disable(&call.spec, &instance) {
                call.ec2
                    .modify_network_interface_attribute()
                    .network_interface_id(&eni)
                    .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                    .send()
                    .await
                    .map_err(|e| from_sdk("ModifyNetworkInterfaceAttribute", &req.request_id, e))?;
                info!(machine = name, instance = %id, interface = %eni, request_id = %req.request_id, "source/destination check disabled");
            }
            Ok(InitializeMachineResponse {
                provider_id: self.provider_id(&call, &instance),
                node_name: launch::node_name(&instance),
            })
        })
        .await
    }

    async fn delete_machine(
        &self,
        req: DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        client::with_request_id(req.request_id.clone(), async move {
            let name = machine_name(&req.machine)?;
            let call = self.deletion_call(&req.machine_class, &req.secret, &req.request_id)?;
            let ids = match recorded_provider_id(&req.machine) {
                Some(provider_id) => {
                    let id = decode_provider_id(provider_id)
                        .map_err(|e| DriverError::invalid_argument(e.to_string()).with_source(e))?;
                    if self.is_gone(&call, id).await? {
                        info!(machine = name, %provider_id, request_id = %req.request_id, "instance already terminated");
                        vec![]
                    } else {
                        vec![id.to_string()]
                    }
                }
                None => {
                    let found = self.instances_of(&call, name).await?;
                    debug!(machine = name, instances = ?ids(&found), request_id = %req.request_id, "instances found by tags");
                    ids(&found)
                }
            };
            self.terminate(&call, ids).await?;
            Ok(DeleteMachineResponse::default())
        })
        .await
    }

    async fn get_machine_status(
        &self,
        req: GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        client::with_request_id(req.request_id.clone(), async move {
            let call = self.call(&req.machine_class, &req.secret, &req.request_id, false)?;
            let instance = self.instance_of_machine(&call, &req.machine).await?;
            let provider_id = self.provider_id(&call, &instance);
            if launch::needs_initialization(&call.spec, &instance) {
                return Err(DriverError::new(
                    Code::Uninitialized,
                    format!(
                        "instance {provider_id} still has its source/destination check enabled on {} (request id {})",
                        launch::src_dst_checks_to_disable(&call.spec, &instance).join(", "),
                        req.request_id
                    ),
                ));
            }
            Ok(GetMachineStatusResponse {
                provider_id,
                node_name: launch::node_name(&instance),
                addresses: launch::addresses(&instance),
                resources: launch::resources(&instance),
            })
        })
        .await
    }

    async fn list_machines(
        &self,
        req: ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        client::with_request_id(req.request_id.clone(), async move {
            let call = self.call(&req.machine_class, &req.secret, &req.request_id, false)?;
            let instances = self.describe(&call, call.tags.class_filters()).await?;
            let mut out = ListMachinesResponse::default();
            for i in &instances {
                let provider_id = self.provider_id(&call, i);
                let name = tags::name_tag(i.tags()).unwrap_or_default().to_string();
                out.resources
                    .insert(provider_id.clone(), launch::resources(i));
                out.machines.insert(provider_id, name);
            }
            debug!(class = ?req.machine_class.metadata.name, count = out.machines.len(), request_id = %req.request_id, "listed instances");
            Ok(out)
        })
        .await
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
