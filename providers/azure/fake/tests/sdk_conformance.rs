//! Drives the fake Azure Resource Manager (`mcm-fake-arm`, providers/azure/fake) with the legacy Azure SDK 0.21
//! (`azure_identity`, `azure_mgmt_compute`, `azure_mgmt_network`, `azure_core`): the token
//! endpoint and bearer tokens, the wire format of NICs, VMs and disks, asynchronous operations
//! polled by hand and by the SDK's own futures, paging, references between resources, faults and
//! how the SDK surfaces each error.
//!
//! The Azure driver speaks this wire format without these crates; the test keeps the fake
//! faithful to them. It builds only with the `sdk-conformance` feature (the crates take minutes
//! to compile): `cargo test -p mcm-fake-arm --features sdk-conformance`.

use mcm_fake_arm as fake_arm;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_core::Continuable;
use azure_core::auth::TokenCredential;
use azure_core::error::ErrorKind;
use azure_core::headers::{self, HeaderName, Headers};
use azure_core::{
    ClientOptions, Context, Method, Pipeline, Policy, PolicyResult, Request, RetryOptions,
    StatusCode, Url,
};
use azure_identity::ClientSecretCredential;
use azure_mgmt_compute::models::{
    DiskList, VirtualMachine, VirtualMachineListResult, VirtualMachineUpdate,
};
use azure_mgmt_network::models::{NetworkInterface, NetworkInterfaceListResult};
use base64::Engine as _;
use fake_arm::{
    COMPUTE_API_VERSION, DISK_API_VERSION, FakeArm, NETWORK_API_VERSION, allocation_failed_message,
    operation_id_from_url, sku_not_available_message,
};
use serde_json::{Value, json};

const SUB: &str = "0b5e7a3c-2f6d-4c1e-9a8b-7d6c5b4a3f21";
const TENANT: &str = "7f3e2d1c-0b9a-4e8d-b7c6-5a4f3e2d1c0b";
const CLIENT_ID: &str = "3c2b1a09-8f7e-4d6c-a5b4-c3d2e1f0a9b8";
const SECRET: &str = "fake~client.secret-value";
const RG: &str = "shoot--dev--az";
const LOCATION: &str = "westeurope";
const DEADLINE: Duration = Duration::from_secs(10);

type TestResult = Result<(), Box<dyn std::error::Error>>;

tokio::task_local! {
    /// The `x-ms-client-request-id` the [`ClientRequestId`] policy puts on requests sent within
    /// its scope.
    static CLIENT_REQUEST_ID: String;
}

/// A per-call policy setting `x-ms-client-request-id` from [`CLIENT_REQUEST_ID`]. The 0.21
/// clients send every request with `Context::default()`, so a task-local is the way to carry a
/// per-request value into the pipeline. (Written out instead of `#[async_trait]`: this is the
/// signature that attribute generates.)
#[derive(Debug)]
struct ClientRequestId;

impl Policy for ClientRequestId {
    fn send<'a, 'b, 'c, 'd, 'async_trait>(
        &'a self,
        ctx: &'b Context,
        request: &'c mut Request,
        next: &'d [Arc<dyn Policy>],
    ) -> Pin<Box<dyn Future<Output = PolicyResult> + Send + 'async_trait>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        'd: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            if let Ok(id) = CLIENT_REQUEST_ID.try_with(Clone::clone) {
                request.insert_header(headers::CLIENT_REQUEST_ID, id);
            }
            next[0].send(ctx, request, &next[1..]).await
        })
    }
}

/// A per-retry policy recording status and headers of every response, errors included: an
/// `azure_core::Error` keeps the status, code and message of an HTTP error but not its headers
/// (`x-ms-request-id`, `Retry-After`).
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Seen>>);

/// A response the [`Recorder`] saw: status and headers.
type Seen = (u16, Vec<(String, String)>);

impl Recorder {
    fn last_header(&self, name: &str) -> Option<String> {
        let seen = self.0.lock().expect("recorder");
        let (_, headers) = seen.last()?;
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

impl Policy for Recorder {
    fn send<'a, 'b, 'c, 'd, 'async_trait>(
        &'a self,
        ctx: &'b Context,
        request: &'c mut Request,
        next: &'d [Arc<dyn Policy>],
    ) -> Pin<Box<dyn Future<Output = PolicyResult> + Send + 'async_trait>>
    where
        'a: 'async_trait,
        'b: 'async_trait,
        'c: 'async_trait,
        'd: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let response = next[0].send(ctx, request, &next[1..]).await?;
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.as_str().to_owned()))
                .collect();
            self.0
                .lock()
                .expect("recorder")
                .push((response.status() as u16, headers));
            Ok(response)
        })
    }
}

/// The fake, a credential and clients as the driver would build them.
struct Env {
    fake: FakeArm,
    credential: Arc<dyn TokenCredential>,
    compute: azure_mgmt_compute::Client,
    network: azure_mgmt_network::Client,
    recorder: Arc<Recorder>,
}

async fn env() -> Env {
    let fake = FakeArm::start(SUB, TENANT, CLIENT_ID, SECRET).await;
    fake.set_operation_delay(Duration::from_millis(50));
    let credential = credential(&fake, SECRET);
    let recorder = Arc::new(Recorder::default());
    let compute = compute_client(&fake, &credential, false, &recorder);
    let network = network_client(&fake, &credential, &recorder);
    Env {
        fake,
        credential,
        compute,
        network,
        recorder,
    }
}

/// `ClientSecretCredential` with the fake as authority host: it posts to
/// `{authority}/{tenant}/oauth2/v2.0/token`.
fn credential(fake: &FakeArm, secret: &str) -> Arc<dyn TokenCredential> {
    Arc::new(ClientSecretCredential::new(
        azure_core::new_http_client(),
        Url::parse(&fake.url()).expect("authority host"),
        TENANT.to_owned(),
        CLIENT_ID.to_owned(),
        secret.to_owned(),
    ))
}

/// The scope the generated clients ask for: `{endpoint}/.default`.
fn scope(fake: &FakeArm) -> String {
    let endpoint = Url::parse(&fake.url()).expect("endpoint");
    endpoint
        .join(azure_core::auth::DEFAULT_SCOPE_SUFFIX)
        .expect("scope")
        .to_string()
}

/// Client options with the two policies; `retry: false` turns the SDK's retries off.
fn options(retry: bool, recorder: &Arc<Recorder>) -> ClientOptions {
    let mut options = ClientOptions::default();
    if !retry {
        options = options.retry(RetryOptions::none());
    }
    options
        .per_call_policies_mut()
        .push(Arc::new(ClientRequestId));
    let recorder: Arc<dyn Policy> = recorder.clone();
    options.per_retry_policies_mut().push(recorder);
    options
}

/// `Client::new` rather than the builder: only `new` takes `ClientOptions` with policies.
fn compute_client(
    fake: &FakeArm,
    credential: &Arc<dyn TokenCredential>,
    retry: bool,
    recorder: &Arc<Recorder>,
) -> azure_mgmt_compute::Client {
    azure_mgmt_compute::Client::new(
        Url::parse(&fake.url()).expect("endpoint"),
        credential.clone(),
        vec![scope(fake)],
        options(retry, recorder),
    )
}

fn network_client(
    fake: &FakeArm,
    credential: &Arc<dyn TokenCredential>,
    recorder: &Arc<Recorder>,
) -> azure_mgmt_network::Client {
    azure_mgmt_network::Client::new(
        Url::parse(&fake.url()).expect("endpoint"),
        credential.clone(),
        vec![scope(fake)],
        options(false, recorder),
    )
}

/// What a raw request got back.
struct Raw {
    status: u16,
    headers: Headers,
    body: Value,
}

impl Raw {
    fn header(&self, name: &'static str) -> Option<String> {
        self.headers
            .get_optional_string(&HeaderName::from_static(name))
    }
}

/// Sends a request straight through the HTTP client (no retry policy turning errors into
/// `Err`), with `Authorization: Bearer <token>` when `token` is given.
async fn raw(method: Method, url: &str, token: Option<&str>) -> Raw {
    let mut request = Request::new(Url::parse(url).expect("url"), method);
    if let Some(token) = token {
        request.insert_header(headers::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = azure_core::new_http_client()
        .execute_request(&request)
        .await
        .expect("raw request");
    let (status, headers, body) = response.deconstruct();
    let bytes = body.collect().await.expect("raw body");
    Raw {
        status: status as u16,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

async fn token(env: &Env) -> String {
    let scope = scope(&env.fake);
    let token = env
        .credential
        .get_token(&[scope.as_str()])
        .await
        .expect("token");
    token.token.secret().to_owned()
}

/// Polls an `Azure-AsyncOperation` or `Location` URL once, the way a driver does between waits:
/// an `azure_core::Pipeline` (the one the generated clients use, with their policies) and the
/// credential's bearer token. Success statuses only (the pipeline turns others into errors).
async fn poll(env: &Env, url: &str) -> Raw {
    let pipeline = Pipeline::new(
        option_env!("CARGO_PKG_NAME"),
        option_env!("CARGO_PKG_VERSION"),
        options(false, &env.recorder),
        Vec::new(),
        Vec::new(),
    );
    let mut request = Request::new(Url::parse(url).expect("operation URL"), Method::Get);
    request.insert_header(
        headers::AUTHORIZATION,
        format!("Bearer {}", token(env).await),
    );
    let response = pipeline
        .send(&Context::new(), &mut request)
        .await
        .expect("poll");
    let (status, headers, body) = response.deconstruct();
    let bytes = body.collect().await.expect("poll body");
    Raw {
        status: status as u16,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// Waits (without sleeping) until the fake finished operation `url`.
async fn wait_done(env: &Env, url: &str) {
    let id = operation_id_from_url(url).expect("operation id");
    let done = env
        .fake
        .wait_for(DEADLINE, |f| {
            f.operation_status(&id)
                .is_some_and(|status| status != "InProgress")
        })
        .await;
    assert!(done, "operation {id} did not finish");
}

fn header(headers: &Headers, name: &'static str) -> Option<String> {
    headers.get_optional_string(&HeaderName::from_static(name))
}

fn tags(name: &str) -> Value {
    json!({
        "kubernetes.io-cluster-shoot--dev--az": "1",
        "kubernetes.io-role-node": "1",
        "Name": name,
    })
}

/// A NIC as the driver sends it.
fn nic_body(name: &str, subnet_id: &str) -> NetworkInterface {
    serde_json::from_value(json!({
        "location": LOCATION,
        "tags": tags(name),
        "properties": {
            "ipConfigurations": [{
                "name": format!("{name}-ip-configuration"),
                "properties": {
                    "subnet": {"id": subnet_id},
                    "privateIPAllocationMethod": "Dynamic",
                },
            }],
            "enableAcceleratedNetworking": false,
            "enableIPForwarding": true,
        },
    }))
    .expect("NetworkInterface")
}

/// A VM as the driver sends it; `delete_option` for its NIC and OS disk.
fn vm_body(name: &str, nic_id: &str, delete_option: &str) -> VirtualMachine {
    let custom_data = base64::engine::general_purpose::STANDARD.encode("#cloud-config\n");
    serde_json::from_value(json!({
        "location": LOCATION,
        "tags": tags(name),
        "zones": ["1"],
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_D2s_v3"},
            "storageProfile": {
                "imageReference": {
                    "publisher": "SUSE",
                    "offer": "sles-chost-byos",
                    "sku": "sles-chost-15-sp5",
                    "version": "latest",
                },
                "osDisk": {
                    "name": format!("{name}-os-disk"),
                    "createOption": "FromImage",
                    "caching": "None",
                    "diskSizeGB": 50,
                    "managedDisk": {"storageAccountType": "StandardSSD_LRS"},
                    "deleteOption": delete_option,
                },
            },
            "osProfile": {
                "computerName": name,
                "adminUsername": "core",
                "customData": custom_data,
                "linuxConfiguration": {
                    "disablePasswordAuthentication": true,
                    "ssh": {"publicKeys": [{
                        "path": "/home/core/.ssh/authorized_keys",
                        "keyData": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g",
                    }]},
                },
            },
            "networkProfile": {"networkInterfaces": [{
                "id": nic_id,
                "properties": {"primary": true, "deleteOption": delete_option},
            }]},
        },
    }))
    .expect("VirtualMachine")
}

/// A planted NIC (JSON as the API takes it).
fn planted_nic(env: &Env, name: &str) -> Value {
    env.fake.put_nic_directly(
        RG,
        json!({
            "name": name,
            "location": LOCATION,
            "properties": {"ipConfigurations": [{
                "name": "ipconfig1",
                "properties": {"subnet": {"id": env.fake.subnet_id(RG, "vnet", "nodes")}},
            }]},
        }),
    )
}

/// A planted VM using NIC `nic`.
fn planted_vm(env: &Env, name: &str, nic: &str, delete_option: &str) -> Value {
    let mut body = serde_json::to_value(vm_body(name, &env.fake.nic_id(RG, nic), delete_option))
        .expect("VM JSON");
    body["name"] = json!(name);
    env.fake.put_vm_directly(RG, body)
}

fn http_error(err: &azure_core::Error) -> (u16, String, String) {
    let e = err.as_http_error().expect("an HTTP error");
    (
        e.status() as u16,
        e.error_code().unwrap_or_default().to_owned(),
        e.error_message().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn token_endpoint_issues_tokens_and_arm_requires_them() -> TestResult {
    let env = env().await;
    let list_url = format!(
        "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API_VERSION}",
        env.fake.url()
    );

    // The credential gets a token from {authority}/{tenant}/oauth2/v2.0/token.
    let token = token(&env).await;
    assert_eq!(token.split('.').count(), 3, "a JWT-shaped token");
    assert_eq!(env.fake.tokens_issued(), 1);
    let log = env.fake.request_log();
    let token_request = log
        .iter()
        .find(|r| r.is_token_request())
        .expect("token request");
    assert_eq!(token_request.method, "POST");
    assert_eq!(token_request.path, format!("/{TENANT}/oauth2/v2.0/token"));
    let form = token_request.body.clone().unwrap_or_default();
    assert_eq!(form["grant_type"], "client_credentials");
    assert_eq!(form["client_id"], CLIENT_ID);
    assert_eq!(form["client_secret"], "***");
    assert_eq!(form["scope"], scope(&env.fake));

    // ARM without a token, with a foreign one, and without api-version.
    let r = raw(Method::Get, &list_url, None).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body["error"]["code"], "AuthenticationFailed");
    assert!(
        r.header("www-authenticate")
            .is_some_and(|h| h.contains("invalid_token"))
    );
    assert!(r.header("x-ms-request-id").is_some());
    let r = raw(Method::Get, &list_url, Some("eyJ0eXAi.not.issued")).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body["error"]["code"], "InvalidAuthenticationToken");
    let no_version = list_url.split('?').next().unwrap_or_default().to_owned();
    let r = raw(Method::Get, &no_version, Some(&token)).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["code"], "MissingApiVersionParameter");
    let r = raw(Method::Get, &list_url, Some(&token)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, json!({"value": []}));

    // Through the SDK: a 404 is an HttpResponse error with ARM's code.
    let err = env
        .compute
        .virtual_machines_client()
        .get(RG, "missing", SUB)
        .await
        .expect_err("404");
    assert_eq!(http_error(&err).0, 404);
    assert_eq!(http_error(&err).1, "ResourceNotFound");
    assert!(matches!(
        err.kind(),
        ErrorKind::HttpResponse { status: StatusCode::NotFound, error_code: Some(c) } if c == "ResourceNotFound"
    ));

    // A wrong secret: the credential fails with Entra ID's invalid_client.
    let wrong = credential(&env.fake, "not-the-secret");
    let client = compute_client(&env.fake, &wrong, false, &env.recorder);
    let err = client
        .virtual_machines_client()
        .get(RG, "vm", SUB)
        .await
        .expect_err("credential error");
    assert_eq!(err.kind(), &ErrorKind::Credential);
    // oauth2's ServerResponse is not a `source`: Entra ID's answer shows in the Debug form only.
    let debug = format!("{err:?}");
    assert!(
        debug.contains("invalid_client") && debug.contains("AADSTS7000215"),
        "{debug}"
    );

    // An expired token: the SDK's cache keeps using it and ARM says so.
    env.fake.expire_tokens();
    let err = env
        .compute
        .virtual_machines_client()
        .get(RG, "vm", SUB)
        .await
        .expect_err("expired");
    assert_eq!(http_error(&err).0, 401);
    assert_eq!(http_error(&err).1, "ExpiredAuthenticationToken");
    Ok(())
}

#[tokio::test]
async fn nic_then_vm_with_operations_polled_by_hand() -> TestResult {
    let env = env().await;
    let subnet = env.fake.add_subnet(RG, "vnet", "nodes");

    // NIC: 201 Updating with Azure-AsyncOperation; the operation runs until resumed.
    env.fake.pause_operations();
    let response = CLIENT_REQUEST_ID
        .scope(
            "nic-create-1".to_owned(),
            env.network
                .network_interfaces_client()
                .create_or_update(RG, "m1-nic", nic_body("m1-nic", &subnet), SUB)
                .send(),
        )
        .await?;
    let raw_response = response.as_raw_response();
    assert_eq!(raw_response.status(), StatusCode::Created);
    let nic_op = header(raw_response.headers(), "azure-asyncoperation").expect("async op");
    assert!(nic_op.contains("/providers/Microsoft.Network/locations/westeurope/operations/"));
    assert!(nic_op.ends_with(&format!("api-version={NETWORK_API_VERSION}")));
    assert_eq!(
        header(raw_response.headers(), "retry-after").as_deref(),
        Some("1")
    );
    assert!(header(raw_response.headers(), "x-ms-request-id").is_some());
    assert_eq!(
        header(raw_response.headers(), "x-ms-client-request-id").as_deref(),
        Some("nic-create-1")
    );
    let nic = serde_json::to_value(response.into_body().await?)?;
    assert_eq!(nic["properties"]["provisioningState"], "Updating");
    let put = env
        .fake
        .request_log()
        .into_iter()
        .rfind(|r| r.method == "PUT")
        .expect("PUT logged");
    assert_eq!(
        put.path,
        format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/networkInterfaces/m1-nic"
        )
    );
    assert_eq!(put.query_param("api-version"), Some(NETWORK_API_VERSION));
    assert_eq!(put.header("x-ms-client-request-id"), Some("nic-create-1"));
    assert_eq!(
        put.body
            .as_ref()
            .map(|b| b["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"].clone()),
        Some(json!(subnet))
    );

    let r = poll(&env, &nic_op).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, json!({"status": "InProgress"}));
    // A VM cannot use the NIC yet: 429 RetryableError (the SDK's retry policy would retry it).
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Detach"),
            SUB,
        )
        .send()
        .await
        .expect_err("NIC not provisioned");
    assert_eq!(http_error(&err).0, 429);
    assert_eq!(http_error(&err).1, "RetryableError");
    env.fake.resume_operations();
    wait_done(&env, &nic_op).await;
    let r = poll(&env, &nic_op).await;
    assert_eq!(r.body, json!({"status": "Succeeded"}));
    let nic = env
        .network
        .network_interfaces_client()
        .get(RG, "m1-nic", SUB)
        .await?;
    let nic = serde_json::to_value(nic)?;
    assert_eq!(nic["properties"]["provisioningState"], "Succeeded");
    assert_eq!(
        nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"],
        "10.1.0.4"
    );
    let nic_id = nic["id"].as_str().expect("NIC id").to_owned();

    // VM: 201 Creating, compute's operation URL; GET with the instance view while it runs.
    env.fake.pause_operations();
    let response = env
        .compute
        .virtual_machines_client()
        .create_or_update(RG, "m1", vm_body("m1", &nic_id, "Detach"), SUB)
        .send()
        .await?;
    assert_eq!(response.as_raw_response().status(), StatusCode::Created);
    let vm_op =
        header(response.as_raw_response().headers(), "azure-asyncoperation").expect("async op");
    assert!(vm_op.contains("/providers/Microsoft.Compute/locations/westeurope/operations/"));
    assert!(vm_op.ends_with(&format!("api-version={COMPUTE_API_VERSION}")));
    let vm = serde_json::to_value(response.into_body().await?)?;
    assert_eq!(vm["properties"]["provisioningState"], "Creating");
    assert!(vm["properties"]["osProfile"].get("customData").is_none());
    let put = env
        .fake
        .request_log()
        .into_iter()
        .rfind(|r| r.method == "PUT")
        .expect("PUT logged");
    assert_eq!(put.query_param("api-version"), Some(COMPUTE_API_VERSION));
    let sent = put.body.expect("body");
    assert!(sent["properties"]["osProfile"]["customData"].is_string());
    assert_eq!(
        sent["properties"]["hardwareProfile"]["vmSize"],
        "Standard_D2s_v3"
    );

    let creating = env
        .compute
        .virtual_machines_client()
        .get(RG, "m1", SUB)
        .expand("instanceView")
        .await?;
    let view = serde_json::to_value(creating)?["properties"]["instanceView"].clone();
    assert_eq!(view["statuses"][0]["code"], "ProvisioningState/creating");
    let r = poll(&env, &vm_op).await;
    assert_eq!(r.body["status"], "InProgress");
    assert!(r.body["startTime"].is_string() && r.body["name"].is_string());
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));

    env.fake.resume_operations();
    wait_done(&env, &vm_op).await;
    let r = poll(&env, &vm_op).await;
    assert_eq!(r.body["status"], "Succeeded");
    assert!(r.body["endTime"].is_string());

    let vm = env
        .compute
        .virtual_machines_client()
        .get(RG, "m1", SUB)
        .expand("instanceView")
        .await?;
    let vm = serde_json::to_value(vm)?;
    assert_eq!(vm["properties"]["provisioningState"], "Succeeded");
    let codes: Vec<&str> = vm["properties"]["instanceView"]["statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["code"].as_str())
        .collect();
    assert_eq!(codes, ["ProvisioningState/succeeded", "PowerState/running"]);
    let vm_id = vm["id"].as_str().expect("VM id");

    // The NIC is in use by the VM (resource group upper-cased, as Compute reports it).
    let nic = env.fake.nic(RG, "m1-nic").expect("NIC");
    let user = nic["properties"]["virtualMachine"]["id"]
        .as_str()
        .expect("in use");
    assert!(user.eq_ignore_ascii_case(vm_id));
    assert!(user.contains(&format!("/resourceGroups/{}/", RG.to_uppercase())));
    assert_eq!(nic["properties"]["primary"], true);
    // The OS disk exists, attached, without the VM's tags.
    let disk = env
        .compute
        .disks_client()
        .get(SUB, RG, "m1-os-disk")
        .await?;
    let disk = serde_json::to_value(disk)?;
    assert_eq!(disk["managedBy"], vm_id);
    assert_eq!(disk["properties"]["diskState"], "Attached");
    assert_eq!(disk["zones"], json!(["1"]));
    assert!(disk.get("tags").is_none());
    assert_eq!(env.fake.creates_of("m1"), 1);
    Ok(())
}

#[tokio::test]
async fn the_sdk_lro_futures() -> TestResult {
    let env = env().await;
    let subnet = env.fake.add_subnet(RG, "vnet", "nodes");

    // Network: `.await` polls Azure-AsyncOperation (sleeping Retry-After), then GETs the NIC.
    let nic = env
        .network
        .network_interfaces_client()
        .create_or_update(RG, "m2-nic", nic_body("m2-nic", &subnet), SUB)
        .await?;
    let nic = serde_json::to_value(nic)?;
    assert_eq!(nic["properties"]["provisioningState"], "Succeeded");

    // Compute: `.await` re-sends the PUT after Retry-After until a 200 (it reads no
    // provisioning state), so the second PUT is an update of the VM being created.
    let nic_id = nic["id"].as_str().expect("NIC id");
    let vm = env
        .compute
        .virtual_machines_client()
        .create_or_update(RG, "m2", vm_body("m2", nic_id, "Delete"), SUB)
        .await?;
    let vm = serde_json::to_value(vm)?;
    assert!(matches!(
        vm["properties"]["provisioningState"].as_str(),
        Some("Creating" | "Updating" | "Succeeded")
    ));
    let puts = env
        .fake
        .request_log()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with("/virtualMachines/m2"))
        .map(|r| r.status)
        .collect::<Vec<_>>();
    assert_eq!(puts, [201, 200]);
    assert_eq!(env.fake.creates_of("m2"), 1);
    let done = env
        .fake
        .wait_for(DEADLINE, |f| {
            f.vm(RG, "m2")
                .is_some_and(|vm| vm["properties"]["provisioningState"] == "Succeeded")
        })
        .await;
    assert!(done);
    Ok(())
}

/// Follows `nextLink` exactly as the SDK's `Pageable` (`list(..).into_stream()`) does: the
/// first URL is the list URL with `api-version`; each next one is `url.join(nextLink)` on the
/// endpoint, `api-version` appended when missing; the page type's `Continuable` says when to
/// stop. (The crate has no `futures` to poll `into_stream()` itself with.)
async fn pages<T>(env: &Env, path: &str, api_version: &str) -> Vec<T>
where
    T: serde::de::DeserializeOwned + Continuable<Continuation = String>,
{
    let endpoint = Url::parse(&env.fake.url()).expect("endpoint");
    let mut url = endpoint.join(path).expect("list URL");
    url.query_pairs_mut()
        .append_pair("api-version", api_version);
    let mut pages = Vec::new();
    for _ in 0..100 {
        let r = raw(Method::Get, url.as_str(), Some(&token(env).await)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let page: T = serde_json::from_value(r.body).expect("page");
        let next = page.continuation();
        pages.push(page);
        let Some(next) = next else {
            return pages;
        };
        let mut base = endpoint.clone();
        base.set_path("");
        url = base.join(&next).expect("nextLink");
        if !url.query_pairs().any(|(k, _)| k == "api-version") {
            url.query_pairs_mut()
                .append_pair("api-version", api_version);
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test]
async fn lists_page_with_next_link() -> TestResult {
    let env = env().await;
    env.fake.add_subnet(RG, "vnet", "nodes");
    for i in [3, 1, 5, 2, 4] {
        planted_nic(&env, &format!("m{i}-nic"));
        planted_vm(&env, &format!("m{i}"), &format!("m{i}-nic"), "Delete");
    }
    env.fake.set_page_size(2);
    env.fake.clear_request_log();

    let prefix = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers");
    let vm_pages: Vec<VirtualMachineListResult> = pages(
        &env,
        &format!("{prefix}/Microsoft.Compute/virtualMachines"),
        COMPUTE_API_VERSION,
    )
    .await;
    let names: Vec<Vec<String>> = vm_pages
        .iter()
        .map(|p| {
            p.value
                .iter()
                .filter_map(|vm| vm.resource.name.clone())
                .collect()
        })
        .collect();
    assert_eq!(names, [vec!["m1", "m2"], vec!["m3", "m4"], vec!["m5"]]);
    let next = vm_pages[0].next_link.clone().expect("nextLink");
    assert!(
        next.starts_with(&format!("{}{prefix}/", env.fake.url())),
        "{next}"
    );
    assert!(next.contains(&format!("api-version={COMPUTE_API_VERSION}&$skiptoken=")));
    assert!(vm_pages[2].next_link.is_none());
    let gets: Vec<_> = env
        .fake
        .request_log()
        .into_iter()
        .filter(|r| !r.is_token_request())
        .collect();
    assert_eq!(gets.len(), 3);
    assert!(gets[0].query_param("$skiptoken").is_none());
    for get in &gets[1..] {
        assert!(get.query_param("$skiptoken").is_some());
        assert_eq!(get.query_param("api-version"), Some(COMPUTE_API_VERSION));
    }

    let nic_pages: Vec<NetworkInterfaceListResult> = pages(
        &env,
        &format!("{prefix}/Microsoft.Network/networkInterfaces"),
        NETWORK_API_VERSION,
    )
    .await;
    assert!(nic_pages.iter().all(|p| p.value.len() <= 2));
    let nics: Vec<String> = nic_pages
        .into_iter()
        .flat_map(|p| p.value)
        .filter_map(|n| n.resource.name)
        .collect();
    assert_eq!(nics, ["m1-nic", "m2-nic", "m3-nic", "m4-nic", "m5-nic"]);

    let disk_pages: Vec<DiskList> = pages(
        &env,
        &format!("{prefix}/Microsoft.Compute/disks"),
        DISK_API_VERSION,
    )
    .await;
    assert_eq!(disk_pages.len(), 3);
    let disks = disk_pages.into_iter().flat_map(|p| p.value).count();
    assert_eq!(disks, 5);
    Ok(())
}

#[tokio::test]
async fn attached_nics_and_disks_cannot_be_deleted_until_the_vm_is_gone() -> TestResult {
    let env = env().await;
    env.fake.add_subnet(RG, "vnet", "nodes");
    planted_nic(&env, "m1-nic");
    let vm = planted_vm(&env, "m1", "m1-nic", "Detach");
    let vm_id = vm["id"].as_str().expect("VM id").to_owned();

    let err = env
        .network
        .network_interfaces_client()
        .delete(RG, "m1-nic", SUB)
        .send()
        .await
        .expect_err("NIC in use");
    let (status, code, message) = http_error(&err);
    assert_eq!((status, code.as_str()), (400, "NicInUse"));
    assert!(
        message.contains("is used by existing resource"),
        "{message}"
    );
    assert!(
        message.contains("/providers/Microsoft.Compute/virtualMachines/m1."),
        "{message}"
    );
    let err = env
        .compute
        .disks_client()
        .delete(SUB, RG, "m1-os-disk")
        .send()
        .await
        .expect_err("disk attached");
    let (status, code, message) = http_error(&err);
    assert_eq!((status, code.as_str()), (409, "OperationNotAllowed"));
    assert_eq!(
        message,
        format!("Disk m1-os-disk is attached to VM {vm_id}.")
    );

    // Delete the VM: 202 with Location and Azure-AsyncOperation.
    env.fake.pause_operations();
    let response = env
        .compute
        .virtual_machines_client()
        .delete(RG, "m1", SUB)
        .send()
        .await?;
    let raw_response = response.as_raw_response();
    assert_eq!(raw_response.status(), StatusCode::Accepted);
    let location = header(raw_response.headers(), "location").expect("Location");
    assert!(location.contains("monitor=true"));
    assert!(header(raw_response.headers(), "azure-asyncoperation").is_some());
    assert_eq!(
        env.fake.vm(RG, "m1").expect("still there")["properties"]["provisioningState"],
        "Deleting"
    );
    let r = poll(&env, &location).await;
    assert_eq!(r.status, 202);
    // A PUT while the VM is being deleted is refused.
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Detach"),
            SUB,
        )
        .send()
        .await
        .expect_err("marked for deletion");
    assert_eq!(http_error(&err).1, "OperationNotAllowed");
    env.fake.resume_operations();
    wait_done(&env, &location).await;
    let r = poll(&env, &location).await;
    assert_eq!(r.status, 200);
    assert!(env.fake.vm(RG, "m1").is_none());

    // Detached now: the NIC and the disk can go.
    let nic = env.fake.nic(RG, "m1-nic").expect("NIC kept");
    assert!(nic["properties"].get("virtualMachine").is_none());
    let response = env
        .network
        .network_interfaces_client()
        .delete(RG, "m1-nic", SUB)
        .send()
        .await?;
    assert_eq!(response.as_raw_response().status(), StatusCode::Accepted);
    let location = header(response.as_raw_response().headers(), "location").expect("Location");
    assert!(location.contains("/operationResults/"));
    wait_done(&env, &location).await;
    assert_eq!(poll(&env, &location).await.status, 204);
    assert!(env.fake.nic(RG, "m1-nic").is_none());
    let disk = env.fake.disk(RG, "m1-os-disk").expect("disk kept");
    assert_eq!(disk["properties"]["diskState"], "Unattached");
    assert!(disk.get("managedBy").is_none());

    // Re-creating the VM with the leftover disk's name conflicts.
    env.fake.add_subnet(RG, "vnet", "nodes");
    planted_nic(&env, "m1-nic");
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Detach"),
            SUB,
        )
        .send()
        .await
        .expect_err("disk name taken");
    assert_eq!(http_error(&err).0, 409);
    assert_eq!(http_error(&err).1, "ConflictingUserInput");

    let response = env
        .compute
        .disks_client()
        .delete(SUB, RG, "m1-os-disk")
        .send()
        .await?;
    assert_eq!(response.as_raw_response().status(), StatusCode::Accepted);
    let op = header(response.as_raw_response().headers(), "azure-asyncoperation").expect("op");
    assert!(op.contains("/DiskOperations/") && op.contains(DISK_API_VERSION));
    wait_done(&env, &op).await;
    assert!(env.fake.disk(RG, "m1-os-disk").is_none());
    Ok(())
}

#[tokio::test]
async fn delete_options_delete_the_nic_and_disk_with_the_vm() -> TestResult {
    let env = env().await;
    env.fake.add_subnet(RG, "vnet", "nodes");
    planted_nic(&env, "m1-nic");
    planted_vm(&env, "m1", "m1-nic", "Delete");
    let response = env
        .compute
        .virtual_machines_client()
        .delete(RG, "m1", SUB)
        .force_deletion(true)
        .send()
        .await?;
    let op = header(response.as_raw_response().headers(), "azure-asyncoperation").expect("op");
    wait_done(&env, &op).await;
    assert!(env.fake.vm(RG, "m1").is_none());
    assert!(env.fake.nic(RG, "m1-nic").is_none());
    assert!(env.fake.disk(RG, "m1-os-disk").is_none());
    let delete = env
        .fake
        .request_log()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .expect("DELETE logged");
    assert_eq!(delete.query_param("forceDeletion"), Some("true"));
    Ok(())
}

#[tokio::test]
async fn patch_sets_delete_options_before_a_delete() -> TestResult {
    let env = env().await;
    env.fake.add_subnet(RG, "vnet", "nodes");
    planted_nic(&env, "m1-nic");
    planted_vm(&env, "m1", "m1-nic", "Detach");
    let update: VirtualMachineUpdate = serde_json::from_value(json!({
        "tags": tags("m1"),
        "properties": {
            "storageProfile": {"osDisk": {"createOption": "FromImage", "deleteOption": "Delete"}},
            "networkProfile": {"networkInterfaces": [{
                "id": env.fake.nic_id(RG, "m1-nic"),
                "properties": {"deleteOption": "Delete"},
            }]},
        },
    }))?;
    let response = env
        .compute
        .virtual_machines_client()
        .update(RG, "m1", update, SUB)
        .send()
        .await?;
    assert_eq!(response.as_raw_response().status(), StatusCode::Ok);
    let op = header(response.as_raw_response().headers(), "azure-asyncoperation").expect("op");
    let vm = serde_json::to_value(response.into_body().await?)?;
    assert_eq!(vm["properties"]["provisioningState"], "Updating");
    assert_eq!(
        vm["properties"]["storageProfile"]["osDisk"]["deleteOption"],
        "Delete"
    );
    wait_done(&env, &op).await;
    assert_eq!(poll(&env, &op).await.body["status"], "Succeeded");

    let response = env
        .compute
        .virtual_machines_client()
        .delete(RG, "m1", SUB)
        .send()
        .await?;
    let op = header(response.as_raw_response().headers(), "azure-asyncoperation").expect("op");
    wait_done(&env, &op).await;
    assert!(env.fake.vms(RG).is_empty());
    assert!(env.fake.nics(RG).is_empty());
    assert!(env.fake.disks(RG).is_empty());
    Ok(())
}

#[tokio::test]
async fn deleting_what_does_not_exist_is_204() -> TestResult {
    let env = env().await;
    let vm = env
        .compute
        .virtual_machines_client()
        .delete(RG, "gone", SUB)
        .send()
        .await?;
    assert_eq!(vm.as_raw_response().status(), StatusCode::NoContent);
    let nic = env
        .network
        .network_interfaces_client()
        .delete(RG, "gone-nic", SUB)
        .send()
        .await?;
    assert_eq!(nic.as_raw_response().status(), StatusCode::NoContent);
    let disk = env
        .compute
        .disks_client()
        .delete(SUB, RG, "gone-disk")
        .send()
        .await?;
    assert_eq!(disk.as_raw_response().status(), StatusCode::NoContent);
    Ok(())
}

#[tokio::test]
async fn a_failed_create_leaves_a_failed_vm_holding_its_nic() -> TestResult {
    let env = env().await;
    env.fake.add_subnet(RG, "vnet", "nodes");
    planted_nic(&env, "m1-nic");
    env.fake
        .fail_next_vm_creates(1, "AllocationFailed", &allocation_failed_message());
    let response = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Delete"),
            SUB,
        )
        .send()
        .await?;
    assert_eq!(response.as_raw_response().status(), StatusCode::Created);
    let op = header(response.as_raw_response().headers(), "azure-asyncoperation").expect("op");
    wait_done(&env, &op).await;
    let r = poll(&env, &op).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "Failed");
    assert_eq!(r.body["error"]["code"], "AllocationFailed");
    assert_eq!(r.body["error"]["message"], allocation_failed_message());

    let vm = env
        .compute
        .virtual_machines_client()
        .get(RG, "m1", SUB)
        .expand("instanceView")
        .await?;
    let vm = serde_json::to_value(vm)?;
    assert_eq!(vm["properties"]["provisioningState"], "Failed");
    let status = &vm["properties"]["instanceView"]["statuses"][0];
    assert_eq!(status["code"], "ProvisioningState/failed/AllocationFailed");
    assert_eq!(status["level"], "Error");
    assert_eq!(status["message"], allocation_failed_message());
    let err = env
        .network
        .network_interfaces_client()
        .delete(RG, "m1-nic", SUB)
        .send()
        .await
        .expect_err("still in use");
    assert_eq!(http_error(&err).1, "NicInUse");

    // Deleting the failed VM cleans up (delete options `Delete`).
    let response = env
        .compute
        .virtual_machines_client()
        .delete(RG, "m1", SUB)
        .send()
        .await?;
    let op = header(response.as_raw_response().headers(), "azure-asyncoperation").expect("op");
    wait_done(&env, &op).await;
    assert!(env.fake.nics(RG).is_empty() && env.fake.disks(RG).is_empty());
    Ok(())
}

#[tokio::test]
async fn synchronous_rejections() -> TestResult {
    let env = env().await;
    env.fake.add_subnet(RG, "vnet", "nodes");
    planted_nic(&env, "m1-nic");
    let message = sku_not_available_message("Standard_D2s_v3", LOCATION);
    env.fake
        .reject_next_vm_creates(1, 409, "SkuNotAvailable", &message);
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Delete"),
            SUB,
        )
        .send()
        .await
        .expect_err("rejected");
    assert_eq!(
        http_error(&err),
        (409, "SkuNotAvailable".to_owned(), message)
    );
    assert!(env.fake.vm(RG, "m1").is_none());
    assert_eq!(env.fake.creates_of("m1"), 0);

    // A NIC in an unknown subnet.
    let missing = env.fake.subnet_id(RG, "vnet", "elsewhere");
    let err = env
        .network
        .network_interfaces_client()
        .create_or_update(RG, "m2-nic", nic_body("m2-nic", &missing), SUB)
        .send()
        .await
        .expect_err("unknown subnet");
    let (status, code, message) = http_error(&err);
    assert_eq!((status, code.as_str()), (400, "InvalidResourceReference"));
    assert!(message.starts_with(&format!("Resource {missing} referenced by resource ")));
    assert!(env.fake.nic(RG, "m2-nic").is_none());

    // A VM referencing a NIC that does not exist, and one without a password or SSH-only.
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m3",
            vm_body("m3", &env.fake.nic_id(RG, "m3-nic"), "Delete"),
            SUB,
        )
        .send()
        .await
        .expect_err("NIC missing");
    assert_eq!(http_error(&err).0, 404);
    assert_eq!(http_error(&err).1, "NotFound");
    let mut body = serde_json::to_value(vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Delete"))?;
    body["properties"]["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] =
        json!(false);
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            serde_json::from_value::<VirtualMachine>(body)?,
            SUB,
        )
        .send()
        .await
        .expect_err("password missing");
    assert_eq!(
        http_error(&err),
        (
            400,
            "InvalidParameter".to_owned(),
            "Required parameter 'adminPassword' is missing (null).".to_owned()
        )
    );
    // Tag names with '/' are reserved.
    let mut body = serde_json::to_value(vm_body("m1", &env.fake.nic_id(RG, "m1-nic"), "Delete"))?;
    body["tags"] = json!({"kubernetes.io/cluster/shoot--dev--az": "1"});
    let err = env
        .compute
        .virtual_machines_client()
        .create_or_update(
            RG,
            "m1",
            serde_json::from_value::<VirtualMachine>(body)?,
            SUB,
        )
        .send()
        .await
        .expect_err("reserved tag characters");
    assert_eq!(http_error(&err).1, "InvalidTagNameCharacters");
    Ok(())
}

#[tokio::test]
async fn throttling_with_retry_after() -> TestResult {
    let env = env().await;
    planted_nic(&env, "m1-nic");

    // Without retries: a 429 error; Retry-After and x-ms-request-id only via the recorder.
    env.fake.throttle_next(1, 2);
    let err = env
        .network
        .network_interfaces_client()
        .get(RG, "m1-nic", SUB)
        .await
        .expect_err("throttled");
    let (status, code, message) = http_error(&err);
    assert_eq!((status, code.as_str()), (429, "TooManyRequests"));
    assert!(
        message.starts_with("The request is being throttled"),
        "{message}"
    );
    assert_eq!(
        env.recorder.last_header("retry-after").as_deref(),
        Some("2")
    );
    let request_id = env
        .recorder
        .last_header("x-ms-request-id")
        .expect("request id");
    let logged = env.fake.request_log().last().cloned().expect("logged");
    assert_eq!(logged.status, 429);
    assert_eq!(logged.request_id, request_id);
    // The HttpError's Display lists the response headers too.
    let http = err.as_http_error().expect("HTTP error").to_string();
    assert!(
        http.contains(&format!("x-ms-request-id:{request_id}")),
        "{http}"
    );

    // With the SDK's default retry policy the 429 is retried after Retry-After.
    let retrying = compute_client(&env.fake, &env.credential, true, &env.recorder);
    env.fake.throttle_next(1, 1);
    env.fake.clear_request_log();
    let missing = retrying
        .virtual_machines_client()
        .get(RG, "nothing", SUB)
        .await
        .expect_err("404 after the retry");
    assert_eq!(http_error(&missing).0, 404);
    let statuses = env
        .fake
        .request_log()
        .iter()
        .map(|r| r.status)
        .collect::<Vec<_>>();
    assert_eq!(statuses, [429, 404]);
    Ok(())
}

#[tokio::test]
async fn the_sdk_client_builder_without_retries() -> TestResult {
    let fake = FakeArm::start(SUB, TENANT, CLIENT_ID, SECRET).await;
    let credential = credential(&fake, SECRET);
    let compute = azure_mgmt_compute::Client::builder(credential)
        .endpoint(Url::parse(&fake.url())?)
        .retry(RetryOptions::none())
        .build()?;
    let response = compute
        .virtual_machines_client()
        .delete(RG, "nothing", SUB)
        .send()
        .await?;
    assert_eq!(response.as_raw_response().status(), StatusCode::NoContent);
    let logged = fake.request_log();
    assert_eq!(logged.len(), 2, "a token request, then the DELETE");
    assert!(logged[0].is_token_request());
    assert_eq!(logged[1].principal.as_deref(), Some(CLIENT_ID));
    assert!(
        logged[1]
            .header("user-agent")
            .is_some_and(|ua| ua.starts_with("azsdk-rust-mgmt_compute/0.21.0"))
    );
    Ok(())
}
