//! A stateful fake of Azure Resource Manager (virtual machines, network interfaces, managed disks
//! and their long-running operations) and of the Entra ID (AAD) token endpoint, for tests.
//!
//! [`FakeArm::start`] serves on 127.0.0.1 and a free port, over HTTPS, the paths of
//! `https://management.azure.com` and of the authority host `https://login.microsoftonline.com`.
//! Its certificate (for `127.0.0.1` and `localhost`) is signed by a CA made for this fake,
//! [`FakeArm::ca_pem`]: a client trusts it, and nothing else does. HTTPS because azure_identity
//! 1.x refuses an authority host that is not `https`, and because ARM is HTTPS too. Point an
//! ARM client (the Azure driver) at [`FakeArm::url`] as both the ARM endpoint and the authority
//! host, trusting [`FakeArm::ca_pem`]. The server stops when the handle is dropped.
//!
//! # Endpoints
//!
//! - `POST /{tenant}/oauth2/v2.0/token`: the client-credentials grant (form body `client_id`,
//!   `client_secret`, `scope`, `grant_type`), which is what `ClientSecretCredential` sends, or
//!   with `client_assertion` (`client_assertion_type` `...:jwt-bearer`) instead of the secret,
//!   what workload identity sends: a federated token the application trusts
//!   ([`FakeArm::trust_federated_token`]), else AADSTS70021.
//! - Under `/subscriptions/{sub}/resourceGroups/{rg}/providers`:
//!   `Microsoft.Compute/virtualMachines/{vm}` (`PUT`, `PATCH`, `GET` with `$expand=instanceView`
//!   or `userData`, `DELETE` with `forceDeletion`), `.../virtualMachines/{vm}/instanceView` (`GET`),
//!   `Microsoft.Compute/virtualMachines` (list), `Microsoft.Network/networkInterfaces/{nic}`
//!   (`PUT`, `PATCH` of tags, `GET`, `DELETE`) and its list, `Microsoft.Compute/disks/{disk}`
//!   (`PUT` with `creationData` `Empty` or `FromImage` — an image id or a shared or community
//!   gallery image — as a long-running operation, `GET`, `DELETE`) and its list. The
//!   subscription-wide lists
//!   (`/subscriptions/{sub}/providers/Microsoft.Compute/virtualMachines`, ...) are served too.
//! - Operation status: `/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{id}`
//!   (VMs), `.../Microsoft.Compute/locations/{loc}/DiskOperations/{id}` (disks),
//!   `.../Microsoft.Network/locations/{loc}/operations/{id}` and `.../operationResults/{id}` (NICs).
//!
//! # What it mimics faithfully
//!
//! - Authentication: the token endpoint checks tenant, `grant_type`, client id, secret and that
//!   the scope ends in `/.default` and names a known resource (Azure Resource Manager, or the
//!   fake's own URL, which is the resource a client asks for when its ARM endpoint is the fake),
//!   answering in Entra ID's error shape (`error`, `error_description` with the `AADSTS` code,
//!   `error_codes`, `trace_id`, `correlation_id`, `error_uri`): 400 `invalid_request`
//!   (AADSTS90002 unknown tenant, AADSTS900144 missing scope), 400 `unauthorized_client`
//!   (AADSTS700016 unknown application), 401 `invalid_client` (AADSTS7000215 wrong secret), 400
//!   `invalid_scope` (AADSTS1002012), 400 `invalid_resource` (AADSTS500011), 400
//!   `unsupported_grant_type` (AADSTS70003). Tokens are opaque JWT-shaped strings; every ARM
//!   request needs `Authorization: Bearer <token the fake issued>` or gets ARM's 401
//!   `AuthenticationFailed` (header missing or malformed), `InvalidAuthenticationToken`,
//!   `ExpiredAuthenticationToken` or `InvalidAuthenticationTokenAudience`, with
//!   `WWW-Authenticate`.
//! - ARM's front door: `api-version` is required on every ARM request (400
//!   `MissingApiVersionParameter`; a malformed one is 400 `InvalidApiVersionParameter`), JSON
//!   bodies only (415 `UnsupportedMediaType`, 400 `InvalidRequestContent`), tags checked (400
//!   `InvalidTagNameCharacters` for `<>%&\?/`, `InvalidTagNameLength` > 512,
//!   `InvalidTagValueLength` > 256), `location` required (400 `LocationRequired`) and normalised
//!   (`West Europe` → `westeurope`), an existing resource cannot move (409
//!   `InvalidResourceLocation`), names and resource groups are case-insensitive, another
//!   subscription is 404 `SubscriptionNotFound`. Errors are `{"error": {"code", "message",
//!   "target"?, "details"?}}` with `x-ms-failure-cause: gateway` on the front door's own errors.
//!   Every response carries a fresh `x-ms-request-id`, an `x-ms-correlation-request-id` (the
//!   request's, else fresh), `x-ms-routing-request-id`, the
//!   `x-ms-ratelimit-remaining-subscription-{reads,writes,deletes}` header and echoes
//!   `x-ms-client-request-id`.
//! - Long-running operations as ARM does them: `PUT` answers 201 (create) or 200 (update) with the
//!   resource in `provisioningState` `Creating`/`Updating` (network resources: `Updating`, the
//!   only in-flight state of `Microsoft.Network`), an `Azure-AsyncOperation` URL and
//!   `Retry-After`; `DELETE` answers 202 with `Location` and `Azure-AsyncOperation` (and 204 for a
//!   resource that does not exist); `PATCH` of a VM answers 200 `Updating`. The operation resource
//!   answers `{"startTime", "status": "InProgress", "name"}` and later `Succeeded`, `Failed` with
//!   `error {code, message}`, or `Canceled` (compute), `{"status": ...}` (network); the
//!   `Location` URL (`monitor=true` for compute, `operationResults` for network) answers 202 while
//!   running and 200 (compute) or 204 (network) when done. Completion is asynchronous (a task per
//!   operation, [`FakeArm::set_operation_delay`]); [`FakeArm::pause_operations`] freezes it.
//! - Virtual machines: the request body is validated like Compute does for the fields a driver
//!   sends (`Required parameter 'adminPassword' is missing (null).` and friends, with `target`;
//!   `customData` must be base64 and at most 87380 characters; a Linux VM without password
//!   authentication needs an SSH key, each key `ssh-rsa` or a well-formed `ssh-ed25519`, the
//!   types Azure supports); server-side fields are filled
//!   (`vmId`, `timeCreated`, `etag`, `osDisk.managedDisk.id`, disk names, `osType`, caching and
//!   delete-option defaults, `exactVersion`, Linux configuration defaults); `customData`,
//!   `adminPassword` and `userData` are write-only (`userData` comes back with `$expand=userData`).
//!   `$expand=instanceView` adds `properties.instanceView` with `ProvisioningState/...` and
//!   `PowerState/...` statuses (`ProvisioningState/failed/<code>` with the message after a failed
//!   create). A second `PUT` while an operation runs preempts it (the old operation ends
//!   `Canceled` with `OperationPreempted`); a `PUT` or `PATCH` while the VM is being deleted is 409
//!   `OperationNotAllowed`; changing `osDisk.name` or `customData` is 409
//!   `PropertyChangeNotAllowed`; `If-Match`/`If-None-Match: *` are honoured (412).
//! - Marketplace images ([`FakeArm::add_vm_image`]): the image version `GET`
//!   (`.../locations/{loc}/publishers/{p}/artifacttypes/vmimage/offers/{o}/skus/{s}/versions/{v}`,
//!   404 `NotFound` "Artifact: VMImage was not found.") with its `properties.plan`, and the terms
//!   of a plan (`Microsoft.MarketplaceOrdering/offerTypes/virtualmachine/.../agreements/current`,
//!   `GET`, and `PUT` with the `signature` the `GET` gave). A VM from a published image with a
//!   plan is refused without that `plan` (400 `VMMarketplaceInvalidInput`) or without accepted
//!   terms (400 `MarketplacePurchaseEligibilityFailed`), as Compute does.
//! - References between resources: a VM references NICs by id; a referenced NIC must exist (404
//!   `NotFound`), be provisioned (429 `RetryableError` / `ReferencedResourceNotProvisioned`, which
//!   Azure's SDKs retry) and not be used by another VM (400 `NicInUse`). The NIC gets
//!   `properties.virtualMachine.id`, `primary` and a `macAddress` while a VM uses it and cannot be
//!   deleted then (400 `NicInUse`, "Network Interface ... is used by existing resource ... In order
//!   to delete the network interface, it must be dissociated from the resource. To learn more, see
//!   aka.ms/deletenic."). A NIC's subnet must have been registered with [`FakeArm::add_subnet`]
//!   (else 400 `InvalidResourceReference`, "Resource ... referenced by resource ... was not found.
//!   Please make sure that the referenced resource exists, and that both resources are in the same
//!   region.", naming the virtual network when it is unknown, else the subnet; a malformed id is
//!   400 `LinkedInvalidPropertyId`); private IPs come from the subnet (10.n.0.4 upwards).
//! - Managed disks are created by the VM `PUT` (OS disk `FromImage`, data disks `Empty`, or
//!   `Attach` of an existing disk): `managedBy` is the VM id while attached, `diskState`
//!   `Attached`/`Unattached`, no tags (ARM does not copy a VM's tags to its implicit disks), the
//!   VM's zones, `creationData.imageReference.id` in Compute's capitalised image-id form. A name
//!   taken by an existing disk is 409 `ConflictingUserInput`; deleting an attached disk is 409
//!   `OperationNotAllowed` ("Disk ... is attached to VM ..."). Deleting a VM deletes the NICs and
//!   disks whose `deleteOption` is `Delete` and detaches the others (the default is `Detach`).
//! - Compute reports references to other resources with the resource group in upper case
//!   (`osDisk.managedDisk.id`, and the NIC's `virtualMachine.id`), as Azure does: compare ids
//!   case-insensitively.
//! - Lists are sorted by name, paged ([`FakeArm::set_page_size`], default 100; ARM uses up to
//!   1000) with an absolute `nextLink` carrying `api-version` and an opaque `$skiptoken`.
//! - Faults: [`FakeArm::throttle_next`] (429 `TooManyRequests` with `Retry-After`, the ARM
//!   throttling message), [`FakeArm::fail_next_vm_creates`] (accepted, then the operation ends
//!   `Failed` and the VM stays with `provisioningState: Failed`, its NIC still in use and its
//!   disks attached, as Azure leaves them), [`FakeArm::reject_next_vm_creates`] and
//!   [`FakeArm::reject_next_nic_creates`] (synchronous errors). [`allocation_failed_message`],
//!   [`zonal_allocation_failed_message`], [`sku_not_available_message`] and
//!   [`quota_exceeded_message`] give Azure's texts.
//!
//! # What it simplifies
//!
//! - One subscription, one tenant, one application. Resource groups exist implicitly unless
//!   [`FakeArm::add_resource_group`] was called (then others are 404 `ResourceGroupNotFound`).
//!   Locations, VM sizes, images and zones are not checked; there is no quota, no capacity and no
//!   RBAC. Token signatures are not verified (the tokens are looked up).
//! - Only the VM, NIC and disk properties a driver uses are interpreted; the rest of a body is
//!   stored and returned as sent. `PATCH` of a VM replaces `tags`, changes `deleteOption`s (OS
//!   disk, data disks by `lun`, NICs by id) and merges other properties; it never detaches disks.
//!   `PATCH` of a NIC only replaces tags (synchronously, as `UpdateTags` does).
//! - Implicit data disks without a name are called `<vm>_DataDisk_<lun>`, OS disks
//!   `<vm>_OsDisk_1_<32 hex>`. Operation ids are UUIDs, `p=` is random. A failed delete never
//!   happens; a failed operation's `Location` URL answers 409 with the error.
//! - Message texts follow Azure's where known and are close paraphrases elsewhere (noted at the
//!   error's construction).
#![allow(dead_code)]

mod tls;

pub use tls::HttpsServer;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// The `api-version` of `Microsoft.Compute/virtualMachines` in the legacy SDK's default tag (the driver's).
pub const COMPUTE_API_VERSION: &str = "2024-07-01";
/// The `api-version` of `Microsoft.Compute/disks` in the legacy SDK's default tag (the driver's).
pub const DISK_API_VERSION: &str = "2024-03-02";
/// The `api-version` of `Microsoft.Network` in the legacy SDK's default tag (the driver's).
pub const NETWORK_API_VERSION: &str = "2024-03-01";
/// How long an operation takes by default.
pub const DEFAULT_OPERATION_DELAY: Duration = Duration::from_millis(300);
/// Items per list page by default (ARM pages at up to 1000).
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// The `Retry-After` (seconds) on operation responses by default.
pub const DEFAULT_RETRY_AFTER_SECS: u64 = 1;
/// The `expires_in` of issued tokens by default (Entra ID's usual 3599 s).
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(3599);
/// The resource type of virtual machines.
pub const VM_TYPE: &str = "Microsoft.Compute/virtualMachines";
/// The resource type of managed disks.
pub const DISK_TYPE: &str = "Microsoft.Compute/disks";
/// The resource type of network interfaces.
pub const NIC_TYPE: &str = "Microsoft.Network/networkInterfaces";

/// The audiences (token resources) ARM accepts besides the fake's own URL.
const ARM_AUDIENCES: &[&str] = &[
    "https://management.core.windows.net/",
    "https://management.core.windows.net",
    "https://management.azure.com/",
    "https://management.azure.com",
];
const TAG_RESERVED: &[char] = &['<', '>', '%', '&', '\\', '?', '/'];
const CUSTOM_DATA_MAX: usize = 87_380;

/// Compute's message for `AllocationFailed` (a regional stock-out; the operation fails).
pub fn allocation_failed_message() -> String {
    "Allocation failed. We do not have sufficient capacity for the requested VM size in this \
     region. Read more about improving likelihood of allocation success at \
     http://aka.ms/allocation-guidance"
        .to_owned()
}

/// Compute's message for `ZonalAllocationFailed` (a zonal stock-out; the operation fails).
pub fn zonal_allocation_failed_message() -> String {
    "Allocation failed. We do not have sufficient capacity for the requested VM size in this \
     zone. Read more about improving likelihood of allocation success at \
     http://aka.ms/allocation-guidance"
        .to_owned()
}

/// Compute's message for 409 `SkuNotAvailable` (capacity restrictions, rejected at once).
pub fn sku_not_available_message(vm_size: &str, location: &str) -> String {
    format!(
        "The requested VM size for resource 'Following SKUs have failed for Capacity \
         Restrictions: {vm_size}' is currently not available in location '{location}'. Please \
         try another size or deploy to a different location or different zone. See \
         https://aka.ms/azureskunotavailable for details."
    )
}

/// Compute's message for a core quota (409 `OperationNotAllowed`, rejected at once; Azure puts
/// `QuotaExceeded` in `details[0].code`).
pub fn quota_exceeded_message(
    family: &str,
    location: &str,
    limit: u32,
    usage: u32,
    required: u32,
) -> String {
    format!(
        "Operation could not be completed as it results in exceeding approved {family} Cores \
         quota. Additional details - Deployment Model: Resource Manager, Location: {location}, \
         Current Limit: {limit}, Current Usage: {usage}, Additional Required: {required}, \
         (Minimum) New Limit Required: {}. Submit a request for Quota increase at \
         https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/UsageAndQuota.ReactView \
         by specifying parameters listed in the 'Details' section for deployment to succeed. \
         Please read more about quota limits at \
         https://docs.microsoft.com/en-us/azure/azure-supportability/per-vm-quota-requests",
        usage + required
    )
}

/// The operation id in an `Azure-AsyncOperation` or `Location` URL the fake issued.
pub fn operation_id_from_url(url: &str) -> Option<String> {
    let path = url.split('?').next()?;
    let mut segments = path.rsplit('/');
    let id = segments.next()?;
    let kind = segments.next()?.to_ascii_lowercase();
    matches!(
        kind.as_str(),
        "operations" | "diskoperations" | "operationresults"
    )
    .then(|| id.to_ascii_lowercase())
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// `GET`, `PUT`, `DELETE`, ...
    pub method: String,
    /// The URL path, percent-encoded as received.
    pub path: String,
    /// The decoded query parameters in order (`api-version`, `$expand`, `$skiptoken`, ...).
    pub query: Vec<(String, String)>,
    /// The request headers (lower-case names) except `authorization`.
    pub headers: BTreeMap<String, String>,
    /// The client id of the bearer token (ARM requests) or of the form (token requests), when
    /// authentication succeeded.
    pub principal: Option<String>,
    /// The JSON body (token requests: the form as an object, `client_secret` redacted).
    pub body: Option<Value>,
    /// The HTTP status the fake answered.
    pub status: u16,
    /// The `x-ms-request-id` the fake answered with.
    pub request_id: String,
}

impl RequestRecord {
    /// The first value of query parameter `name` (case-sensitive).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// Whether this is a request to the token endpoint.
    pub fn is_token_request(&self) -> bool {
        self.path.ends_with("/oauth2/v2.0/token")
    }
}

/// The running fake; the server and its operation tasks stop when this is dropped.
pub struct FakeArm {
    shared: Arc<Shared>,
    server: HttpsServer,
}

impl Drop for FakeArm {
    fn drop(&mut self) {
        // The server stops when `self.server` is dropped, after this.
        for task in lock(&self.shared.tasks).drain(..) {
            task.abort();
        }
    }
}

impl FakeArm {
    /// Starts a fake for `subscription` in `tenant` that issues tokens to the application
    /// `client_id` with `client_secret`.
    pub async fn start(
        subscription: &str,
        tenant: &str,
        client_id: &str,
        client_secret: &str,
    ) -> FakeArm {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0 for the fake ARM");
        let addr = listener
            .local_addr()
            .expect("local address of the fake ARM");
        let shared = Arc::new(Shared::new(
            subscription,
            tenant,
            client_id,
            client_secret,
            format!("https://{addr}"),
        ));
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = HttpsServer::serve(listener, tls::Certificates::generate(), app);
        FakeArm { shared, server }
    }

    /// The base URL (no trailing slash), e.g. `https://127.0.0.1:40123`: the ARM endpoint and
    /// the authority host (tokens are asked for its `/.default` scope).
    pub fn url(&self) -> String {
        self.shared.base.clone()
    }

    /// The PEM of the CA that signed the certificate of [`FakeArm::url`], made for this fake.
    pub fn ca_pem(&self) -> &str {
        self.server.ca_pem()
    }

    /// How many TLS handshakes failed: clients that did not trust [`FakeArm::ca_pem`] (or
    /// that spoke plain HTTP).
    pub fn failed_tls_handshakes(&self) -> u64 {
        self.server.failed_handshakes()
    }

    /// Waits until at least `count` TLS handshakes failed ([`FakeArm::failed_tls_handshakes`]),
    /// at most `deadline`; whether they did.
    pub async fn wait_for_failed_tls_handshakes(&self, count: u64, deadline: Duration) -> bool {
        self.server
            .wait_for_failed_handshakes(count, deadline)
            .await
    }

    /// The subscription the fake serves.
    pub fn subscription(&self) -> &str {
        &self.shared.subscription
    }

    /// The tenant whose token endpoint the fake serves.
    pub fn tenant(&self) -> &str {
        &self.shared.tenant
    }

    /// The application (client) id the fake issues tokens to.
    pub fn client_id(&self) -> &str {
        &self.shared.client_id
    }

    /// The token URL `ClientSecretCredential` builds from the authority host [`FakeArm::url`].
    pub fn token_url(&self) -> String {
        format!(
            "{}/{}/oauth2/v2.0/token",
            self.shared.base, self.shared.tenant
        )
    }

    /// The id of VM `name` in `rg`.
    pub fn vm_id(&self, rg: &str, name: &str) -> String {
        resource_id(&self.shared.subscription, rg, VM_TYPE, name)
    }

    /// The id of NIC `name` in `rg`.
    pub fn nic_id(&self, rg: &str, name: &str) -> String {
        resource_id(&self.shared.subscription, rg, NIC_TYPE, name)
    }

    /// The id of disk `name` in `rg`.
    pub fn disk_id(&self, rg: &str, name: &str) -> String {
        resource_id(&self.shared.subscription, rg, DISK_TYPE, name)
    }

    /// The id of subnet `subnet` of virtual network `vnet` in `rg`.
    pub fn subnet_id(&self, rg: &str, vnet: &str, subnet: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/{subnet}",
            self.shared.subscription
        )
    }

    /// How long operations started from now on take (default 300 ms).
    pub fn set_operation_delay(&self, delay: Duration) {
        self.shared.lock().op_delay = delay;
    }

    /// Items per list page (default 100; at least 1).
    pub fn set_page_size(&self, size: usize) {
        self.shared.lock().page_size = size.max(1);
    }

    /// The `Retry-After` seconds on operation responses (default 1): how long a client is
    /// asked to wait between polls.
    pub fn set_retry_after(&self, secs: u64) {
        self.shared.lock().retry_after = secs;
    }

    /// The lifetime (`expires_in`) of tokens issued from now on (default 3599 s).
    /// azure_identity 1.x's token cache asks for a new token 300 s before one expires.
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.shared.lock().token_lifetime = lifetime;
    }

    /// Expires every token issued so far (ARM answers 401 `ExpiredAuthenticationToken` to
    /// them; a client's token cache does not know and keeps sending them until their expiry).
    pub fn expire_tokens(&self) {
        let mut w = self.shared.lock();
        let past = unix_secs() - 1;
        for token in w.tokens.values_mut() {
            token.expires_at = token.expires_at.min(past);
        }
    }

    /// How many tokens the token endpoint issued.
    pub fn tokens_issued(&self) -> usize {
        self.shared.lock().tokens.len()
    }

    /// Registers resource group `rg`; once any is registered, unknown groups are 404
    /// `ResourceGroupNotFound`.
    pub fn add_resource_group(&self, rg: &str) {
        self.shared.lock().resource_groups.insert(rg.to_lowercase());
    }

    /// Registers subnet `subnet` of virtual network `vnet` in `rg` (creating the network) and
    /// returns its id. Each subnet hands out private IPs from its own 10.n.0.0/16.
    pub fn add_subnet(&self, rg: &str, vnet: &str, subnet: &str) -> String {
        let mut w = self.shared.lock();
        let index = w.subnet_count + 1;
        let net = w
            .vnets
            .entry((rg.to_lowercase(), vnet.to_lowercase()))
            .or_insert_with(|| VnetRec {
                subnets: BTreeMap::new(),
            });
        if let std::collections::btree_map::Entry::Vacant(e) =
            net.subnets.entry(subnet.to_lowercase())
        {
            e.insert(SubnetRec {
                index,
                next_host: 0,
            });
            w.subnet_count = index;
        }
        drop(w);
        self.shared.bump();
        self.subnet_id(rg, vnet, subnet)
    }

    /// Freezes all operations in their current state (`Creating`, `Deleting`, ...) until
    /// [`FakeArm::resume_operations`].
    pub fn pause_operations(&self) {
        self.shared.lock().paused = true;
        self.shared.bump();
    }

    /// Lets paused operations finish (those whose delay has passed finish at once).
    pub fn resume_operations(&self) {
        self.shared.lock().paused = false;
        self.shared.bump();
    }

    /// Answers the next `n` authenticated ARM requests of any kind (not token requests) with 429
    /// `TooManyRequests` and `Retry-After: retry_after_secs`. azure_core's pipelines retry 429s by
    /// themselves unless built with `RetryOptions::none()`; the driver sends ARM requests
    /// without a pipeline and leaves the retry to the controller.
    pub fn throttle_next(&self, n: usize, retry_after_secs: u64) {
        let mut w = self.shared.lock();
        w.throttles.extend(std::iter::repeat_n(retry_after_secs, n));
    }

    /// Makes the next `n` VM creates (a `PUT` of a VM that does not exist or is `Failed`) that
    /// pass validation be accepted and their operation end `Failed` with `code` and `message`
    /// (e.g. `AllocationFailed` with [`allocation_failed_message`]); the VM stays, `Failed`.
    pub fn fail_next_vm_creates(&self, n: usize, code: &str, message: &str) {
        let mut w = self.shared.lock();
        let fault = (code.to_owned(), message.to_owned());
        w.vm_failures.extend(std::iter::repeat_n(fault, n));
    }

    /// Makes the next `n` VM creates that pass validation fail at once with HTTP `status`,
    /// `code` and `message` (e.g. 409 `SkuNotAvailable` with [`sku_not_available_message`]).
    pub fn reject_next_vm_creates(&self, n: usize, status: u16, code: &str, message: &str) {
        let mut w = self.shared.lock();
        let fault = (status, code.to_owned(), message.to_owned());
        w.vm_rejects.extend(std::iter::repeat_n(fault, n));
    }

    /// Makes the next `n` NIC creates that pass validation fail at once with HTTP `status`,
    /// `code` and `message`.
    pub fn reject_next_nic_creates(&self, n: usize, status: u16, code: &str, message: &str) {
        let mut w = self.shared.lock();
        let fault = (status, code.to_owned(), message.to_owned());
        w.nic_rejects.extend(std::iter::repeat_n(fault, n));
    }

    /// The VMs of `rg` as `GET` returns them, sorted by name.
    pub fn vms(&self, rg: &str) -> Vec<Value> {
        let rg = rg.to_lowercase();
        let w = self.shared.lock();
        w.vms
            .iter()
            .filter(|(k, _)| k.0 == rg)
            .map(|(_, r)| r.json.clone())
            .collect()
    }

    /// The NICs of `rg` as `GET` returns them, sorted by name.
    pub fn nics(&self, rg: &str) -> Vec<Value> {
        let rg = rg.to_lowercase();
        let w = self.shared.lock();
        w.nics
            .iter()
            .filter(|(k, _)| k.0 == rg)
            .map(|(_, r)| r.json.clone())
            .collect()
    }

    /// The disks of `rg` as `GET` returns them, sorted by name.
    pub fn disks(&self, rg: &str) -> Vec<Value> {
        let rg = rg.to_lowercase();
        let w = self.shared.lock();
        w.disks
            .iter()
            .filter(|(k, _)| k.0 == rg)
            .map(|(_, r)| r.json.clone())
            .collect()
    }

    /// VM `name` of `rg` as `GET` returns it.
    pub fn vm(&self, rg: &str, name: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.vms.get(&key(rg, name)).map(|r| r.json.clone())
    }

    /// The instance view of VM `name` (what `$expand=instanceView` adds).
    pub fn vm_instance_view(&self, rg: &str, name: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.vms.get(&key(rg, name)).map(instance_view)
    }

    /// NIC `name` of `rg` as `GET` returns it.
    pub fn nic(&self, rg: &str, name: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.nics.get(&key(rg, name)).map(|r| r.json.clone())
    }

    /// Disk `name` of `rg` as `GET` returns it.
    pub fn disk(&self, rg: &str, name: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.disks.get(&key(rg, name)).map(|r| r.json.clone())
    }

    /// The status body of operation `id` (as its `Azure-AsyncOperation` URL answers).
    pub fn operation(&self, id: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.ops.get(&id.to_ascii_lowercase()).map(operation_body)
    }

    /// The status (`InProgress`, `Succeeded`, `Failed`, `Canceled`) of operation `id`.
    pub fn operation_status(&self, id: &str) -> Option<String> {
        let w = self.shared.lock();
        w.ops
            .get(&id.to_ascii_lowercase())
            .map(|o| o.status.to_owned())
    }

    /// How many operations are still running.
    pub fn operations_in_progress(&self) -> usize {
        let w = self.shared.lock();
        w.ops.values().filter(|o| o.status == IN_PROGRESS).count()
    }

    /// Plants a VM without an API call or operation (`provisioningState: Succeeded`, running):
    /// `vm` is a body as the API takes it (`name` required; `location` defaults to
    /// `westeurope`). Its implicit disks are created and its NICs, if they exist, attached.
    /// Returns the stored VM. Panics if the name is taken or the body is invalid.
    pub fn put_vm_directly(&self, rg: &str, vm: Value) -> Value {
        let mut body = strip_nulls(vm);
        let name = body["name"]
            .as_str()
            .expect("put_vm_directly needs a name")
            .to_owned();
        if body.get("location").is_none() {
            body["location"] = json!("westeurope");
        }
        let mut w = self.shared.lock();
        assert!(
            !w.vms.contains_key(&key(rg, &name)),
            "VM {rg}/{name} exists already"
        );
        let sub = self.shared.subscription.clone();
        let plan = plan_vm(&mut w, &sub, rg, &name, &body, true)
            .unwrap_or_else(|e| panic!("put_vm_directly: {} {}", e.0.code, e.0.message));
        let json = accept_vm(&mut w, &sub, rg, &name, plan, "Succeeded");
        drop(w);
        self.shared.bump();
        json
    }

    /// Plants a NIC without an API call (`provisioningState: Succeeded`): `nic` is a body as the
    /// API takes it (`name` required, `location` defaults to `westeurope`; subnets are not
    /// checked). Returns the stored NIC.
    pub fn put_nic_directly(&self, rg: &str, nic: Value) -> Value {
        let mut body = strip_nulls(nic);
        let name = body["name"]
            .as_str()
            .expect("put_nic_directly needs a name")
            .to_owned();
        if body.get("location").is_none() {
            body["location"] = json!("westeurope");
        }
        let mut w = self.shared.lock();
        let sub = self.shared.subscription.clone();
        let existing = w.nics.get(&key(rg, &name)).map(|r| r.json.clone());
        let mut json = build_nic(&mut w, &sub, rg, &name, &body, existing.as_ref(), false)
            .unwrap_or_else(|e| panic!("put_nic_directly: {} {}", e.0.code, e.0.message));
        set_nic_state(&mut json, "Succeeded");
        w.nics.insert(
            key(rg, &name),
            NicRec {
                json: json.clone(),
                busy: None,
            },
        );
        drop(w);
        self.shared.bump();
        json
    }

    /// Plants a managed disk (e.g. an orphan): `disk` needs `name`; `location` defaults to
    /// `westeurope`, `sku` to `Standard_LRS`, `creationData` to `Empty`, `diskSizeGB` to 30;
    /// `managedBy`, if given, marks it attached. Returns the stored disk.
    pub fn put_disk_directly(&self, rg: &str, disk: Value) -> Value {
        let body = strip_nulls(disk);
        let name = body["name"]
            .as_str()
            .expect("put_disk_directly needs a name")
            .to_owned();
        let mut w = self.shared.lock();
        let json = disk_json(
            &mut w,
            &self.shared.subscription,
            rg,
            &name,
            &body,
            "Succeeded",
        );
        w.disks.insert(
            key(rg, &name),
            DiskRec {
                json: json.clone(),
                busy: None,
            },
        );
        drop(w);
        self.shared.bump();
        json
    }

    /// Removes VM `name` out of band (as if deleted in the portal), deleting or detaching its
    /// NICs and disks by their `deleteOption`; returns it.
    pub fn delete_vm_directly(&self, rg: &str, name: &str) -> Option<Value> {
        let mut w = self.shared.lock();
        let removed = remove_vm(&mut w, &key(rg, name));
        drop(w);
        self.shared.bump();
        removed
    }

    /// Removes NIC `name` out of band, even if a VM uses it; returns it.
    pub fn delete_nic_directly(&self, rg: &str, name: &str) -> Option<Value> {
        let removed = self.shared.lock().nics.remove(&key(rg, name));
        self.shared.bump();
        removed.map(|r| r.json)
    }

    /// Removes disk `name` out of band, even if attached; returns it.
    pub fn delete_disk_directly(&self, rg: &str, name: &str) -> Option<Value> {
        let removed = self.shared.lock().disks.remove(&key(rg, name));
        self.shared.bump();
        removed.map(|r| r.json)
    }

    /// Sets the power state of VM `name` (`running`, `stopped`, `deallocated`, ...) as shown in
    /// its instance view (`PowerState/<state>`); returns whether the VM exists.
    pub fn set_vm_power_state(&self, rg: &str, name: &str, state: &str) -> bool {
        let mut w = self.shared.lock();
        let Some(vm) = w.vms.get_mut(&key(rg, name)) else {
            return false;
        };
        vm.power = Some(state.to_owned());
        drop(w);
        self.shared.bump();
        true
    }

    /// Publishes the marketplace image `urn` (`publisher:offer:sku:version`) in `location`,
    /// with the plan `(name, product, publisher)` if it has one; its terms start unaccepted.
    /// A VM from a published image with a plan needs that `plan` and accepted terms.
    pub fn add_vm_image(&self, location: &str, urn: &str, plan: Option<(&str, &str, &str)>) {
        let mut w = self.shared.lock();
        let plan = plan.map(|(name, product, publisher)| {
            w.agreements
                .entry(agreement_key(publisher, product, name))
                .or_insert(false);
            json!({"name": name, "product": product, "publisher": publisher})
        });
        w.images.insert(image_key(location, urn), plan);
    }

    /// Makes the application trust the federated token `token` as a client assertion (what
    /// workload identity sends instead of the client secret), as a federated identity
    /// credential of the application does for the tokens of its issuer.
    pub fn trust_federated_token(&self, token: &str) {
        self.shared.lock().federated_tokens.insert(token.to_owned());
    }

    /// Whether the marketplace terms of plan `(name, product, publisher)` are accepted.
    pub fn agreement_accepted(&self, name: &str, product: &str, publisher: &str) -> bool {
        let w = self.shared.lock();
        w.agreements
            .get(&agreement_key(publisher, product, name))
            .copied()
            .unwrap_or(false)
    }

    /// Makes VM `name` `Failed` out of band, as a failed extension or update does to a VM that
    /// keeps running: `provisioningState` `Failed`, the instance view's
    /// `ProvisioningState/failed/<code>` with `message`, the power state unchanged. Returns
    /// whether the VM exists.
    pub fn fail_vm_directly(&self, rg: &str, name: &str, code: &str, message: &str) -> bool {
        let mut w = self.shared.lock();
        let Some(vm) = w.vms.get_mut(&key(rg, name)) else {
            return false;
        };
        vm.json["properties"]["provisioningState"] = json!(FAILED);
        vm.failure = Some((code.to_owned(), message.to_owned()));
        drop(w);
        self.shared.bump();
        true
    }

    /// Every request received so far, in order.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.shared.lock().log.clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_request_log(&self) {
        self.shared.lock().log.clear();
    }

    /// How many `PUT`s created VM `name` (accepted requests for a VM that did not exist; the
    /// re-`PUT`s of a client's retries, rejected and invalid requests do not count).
    pub fn creates_of(&self, name: &str) -> usize {
        let w = self.shared.lock();
        w.vm_creates.get(&name.to_lowercase()).copied().unwrap_or(0)
    }

    /// How many `PUT`s created NIC `name`.
    pub fn nic_creates_of(&self, name: &str) -> usize {
        let w = self.shared.lock();
        w.nic_creates
            .get(&name.to_lowercase())
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `condition` holds, re-checking on every state change of the fake (no
    /// polling); returns whether it held before `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut condition: impl FnMut(&FakeArm) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut changes = self.shared.changed.subscribe();
            if condition(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return condition(self),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

/// (resource group, name), both lower-cased: ARM names are case-insensitive.
type Key = (String, String);
/// (code, message).
type ErrPair = (String, String);
/// (status, code, message).
type Reject = (u16, String, String);

const IN_PROGRESS: &str = "InProgress";
const SUCCEEDED: &str = "Succeeded";
const FAILED: &str = "Failed";
const CANCELED: &str = "Canceled";

fn key(rg: &str, name: &str) -> Key {
    (rg.to_lowercase(), name.to_lowercase())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Shared {
    subscription: String,
    tenant: String,
    client_id: String,
    client_secret: String,
    base: String,
    world: Mutex<World>,
    /// Bumped on every state change.
    changed: watch::Sender<u64>,
    tasks: Mutex<Vec<AbortHandle>>,
}

struct World {
    op_delay: Duration,
    page_size: usize,
    retry_after: u64,
    token_lifetime: Duration,
    paused: bool,
    resource_groups: BTreeSet<String>,
    vnets: BTreeMap<Key, VnetRec>,
    subnet_count: u32,
    vms: BTreeMap<Key, VmRec>,
    nics: BTreeMap<Key, NicRec>,
    disks: BTreeMap<Key, DiskRec>,
    ops: HashMap<String, OpRec>,
    tokens: HashMap<String, TokenRec>,
    throttles: VecDeque<u64>,
    /// Marketplace images by `location/publisher/offer/sku/version` (lower case): their plan
    /// (`{name, product, publisher}`), if they have one.
    images: BTreeMap<String, Option<Value>>,
    /// Marketplace terms by `publisher/product/plan` (lower case): accepted or not.
    agreements: BTreeMap<String, bool>,
    /// Federated tokens the application trusts (workload identity's client assertions).
    federated_tokens: BTreeSet<String>,
    vm_failures: VecDeque<ErrPair>,
    vm_rejects: VecDeque<Reject>,
    nic_rejects: VecDeque<Reject>,
    log: Vec<RequestRecord>,
    vm_creates: BTreeMap<String, usize>,
    nic_creates: BTreeMap<String, usize>,
    etag: u64,
    rng: u64,
}

struct VnetRec {
    subnets: BTreeMap<String, SubnetRec>,
}

struct SubnetRec {
    index: u32,
    next_host: u32,
}

struct VmRec {
    json: Value,
    /// The operation still running on the VM.
    busy: Option<String>,
    /// The error of the last failed create/update (shown in the instance view).
    failure: Option<ErrPair>,
    power: Option<String>,
    custom_data: Option<String>,
    user_data: Option<Value>,
}

struct NicRec {
    json: Value,
    busy: Option<String>,
}

struct DiskRec {
    json: Value,
    busy: Option<String>,
}

struct TokenRec {
    client_id: String,
    audience: String,
    expires_at: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpNs {
    Compute,
    Disk,
    Network,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Create,
    Update,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Vm(Key),
    Nic(Key),
    Disk(Key),
}

struct OpRec {
    id: String,
    ns: OpNs,
    kind: OpKind,
    target: Target,
    location: String,
    api_version: String,
    p: String,
    status: &'static str,
    error: Option<ErrPair>,
    /// The failure the operation will end with.
    failure: Option<ErrPair>,
    start: String,
    end: Option<String>,
}

impl Shared {
    fn new(
        subscription: &str,
        tenant: &str,
        client_id: &str,
        client_secret: &str,
        base: String,
    ) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        Shared {
            subscription: subscription.to_owned(),
            tenant: tenant.to_owned(),
            client_id: client_id.to_owned(),
            client_secret: client_secret.to_owned(),
            base,
            world: Mutex::new(World {
                op_delay: DEFAULT_OPERATION_DELAY,
                page_size: DEFAULT_PAGE_SIZE,
                retry_after: DEFAULT_RETRY_AFTER_SECS,
                token_lifetime: DEFAULT_TOKEN_LIFETIME,
                paused: false,
                resource_groups: BTreeSet::new(),
                vnets: BTreeMap::new(),
                subnet_count: 0,
                vms: BTreeMap::new(),
                nics: BTreeMap::new(),
                disks: BTreeMap::new(),
                ops: HashMap::new(),
                tokens: HashMap::new(),
                throttles: VecDeque::new(),
                images: BTreeMap::new(),
                agreements: BTreeMap::new(),
                federated_tokens: BTreeSet::new(),
                vm_failures: VecDeque::new(),
                vm_rejects: VecDeque::new(),
                nic_rejects: VecDeque::new(),
                log: Vec::new(),
                vm_creates: BTreeMap::new(),
                nic_creates: BTreeMap::new(),
                etag: 0,
                rng: seed,
            }),
            changed: watch::channel(0).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    async fn until_resumed(&self) {
        loop {
            let mut changes = self.changed.subscribe();
            if !self.lock().paused {
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Finishes operation `op_id` with its effects.
    fn complete(&self, op_id: &str) {
        let mut w = self.lock();
        let Some(op) = w.ops.get(op_id) else {
            return;
        };
        if op.status != IN_PROGRESS {
            return;
        }
        let (kind, target, failure) = (op.kind, op.target.clone(), op.failure.clone());
        let mine = |busy: &Option<String>| busy.as_deref() == Some(op_id);
        let mut outcome: Result<(), ErrPair> = Ok(());
        match (&target, kind) {
            (Target::Vm(k), OpKind::Create | OpKind::Update) => match w.vms.get_mut(k) {
                Some(vm) if mine(&vm.busy) => {
                    vm.busy = None;
                    match failure {
                        Some(f) => {
                            vm.json["properties"]["provisioningState"] = json!(FAILED);
                            vm.failure = Some(f.clone());
                            if kind == OpKind::Create || vm.power.as_deref() == Some("starting") {
                                vm.power = None;
                            }
                            outcome = Err(f);
                        }
                        None => {
                            vm.json["properties"]["provisioningState"] = json!(SUCCEEDED);
                            vm.failure = None;
                            if vm.power.as_deref().is_none_or(|p| p == "starting") {
                                vm.power = Some("running".into());
                            }
                        }
                    }
                }
                _ => outcome = Err(preempted()),
            },
            (Target::Vm(k), OpKind::Delete) => {
                if w.vms.get(k).is_some_and(|vm| mine(&vm.busy)) {
                    remove_vm(&mut w, k);
                }
            }
            (Target::Nic(k), OpKind::Create | OpKind::Update) => match w.nics.get_mut(k) {
                Some(nic) if mine(&nic.busy) => {
                    nic.busy = None;
                    set_nic_state(&mut nic.json, SUCCEEDED);
                }
                _ => outcome = Err(preempted()),
            },
            (Target::Nic(k), OpKind::Delete) => {
                if w.nics.get(k).is_some_and(|n| mine(&n.busy)) {
                    w.nics.remove(k);
                }
            }
            (Target::Disk(k), OpKind::Delete) => {
                if w.disks.get(k).is_some_and(|d| mine(&d.busy)) {
                    w.disks.remove(k);
                }
            }
            (Target::Disk(k), OpKind::Create | OpKind::Update) => match w.disks.get_mut(k) {
                Some(disk) if mine(&disk.busy) => {
                    disk.busy = None;
                    disk.json["properties"]["provisioningState"] = json!(SUCCEEDED);
                }
                _ => outcome = Err(preempted()),
            },
        }
        if let Some(op) = w.ops.get_mut(op_id) {
            op.end = Some(now_rfc3339());
            match outcome {
                Ok(()) => op.status = SUCCEEDED,
                Err(e) => {
                    op.status = if e.0 == "OperationPreempted" {
                        CANCELED
                    } else {
                        FAILED
                    };
                    op.error = Some(e);
                }
            }
        }
        drop(w);
        self.bump();
    }
}

impl World {
    /// splitmix64.
    fn rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A random (version 4) UUID.
    fn uuid(&mut self) -> String {
        let (a, b) = (self.rand(), self.rand());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0x0fff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    fn hex32(&mut self) -> String {
        format!("{:016x}{:016x}", self.rand(), self.rand())
    }

    fn next_etag(&mut self) -> u64 {
        self.etag += 1;
        self.etag
    }

    /// Cancels the operation running on a resource (a newer operation preempts it); returns
    /// the failure it was going to end with.
    fn preempt(&mut self, op_id: Option<&String>) -> Option<ErrPair> {
        let op = self.ops.get_mut(op_id?)?;
        if op.status != IN_PROGRESS {
            return None;
        }
        op.status = CANCELED;
        op.error = Some(preempted());
        op.end = Some(now_rfc3339());
        op.failure.take()
    }
}

fn preempted() -> ErrPair {
    (
        "OperationPreempted".into(),
        "Operation execution has been preempted by a more recent operation.".into(),
    )
}

/// Registers a new operation and starts its task; returns its id.
fn start_operation(
    s: &Arc<Shared>,
    w: &mut World,
    ns: OpNs,
    kind: OpKind,
    target: Target,
    location: &str,
    api_version: &str,
) -> String {
    let id = w.uuid();
    let p = w.uuid();
    w.ops.insert(
        id.clone(),
        OpRec {
            id: id.clone(),
            ns,
            kind,
            target,
            location: location.to_owned(),
            api_version: api_version.to_owned(),
            p,
            status: IN_PROGRESS,
            error: None,
            failure: None,
            start: now_rfc3339(),
            end: None,
        },
    );
    let delay = w.op_delay;
    let shared = Arc::clone(s);
    let op_id = id.clone();
    let task = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        shared.until_resumed().await;
        shared.complete(&op_id);
    });
    let mut tasks = lock(&s.tasks);
    tasks.retain(|t| !t.is_finished());
    tasks.push(task.abort_handle());
    id
}

fn ns_path(op: &OpRec) -> &'static str {
    match op.ns {
        OpNs::Network => "Microsoft.Network",
        OpNs::Compute | OpNs::Disk => "Microsoft.Compute",
    }
}

/// The `Azure-AsyncOperation` URL of `op`.
fn async_operation_url(s: &Shared, op: &OpRec) -> String {
    let prefix = format!(
        "{}/subscriptions/{}/providers/{}/locations/{}",
        s.base,
        s.subscription,
        ns_path(op),
        op.location
    );
    match op.ns {
        OpNs::Compute => format!(
            "{prefix}/operations/{}?p={}&api-version={}",
            op.id, op.p, op.api_version
        ),
        OpNs::Disk => format!(
            "{prefix}/DiskOperations/{}?p={}&api-version={}",
            op.id, op.p, op.api_version
        ),
        OpNs::Network => format!(
            "{prefix}/operations/{}?api-version={}",
            op.id, op.api_version
        ),
    }
}

/// The `Location` URL of `op`.
fn location_url(s: &Shared, op: &OpRec) -> String {
    let prefix = format!(
        "{}/subscriptions/{}/providers/{}/locations/{}",
        s.base,
        s.subscription,
        ns_path(op),
        op.location
    );
    match op.ns {
        OpNs::Compute => format!(
            "{prefix}/operations/{}?p={}&monitor=true&api-version={}",
            op.id, op.p, op.api_version
        ),
        OpNs::Disk => format!(
            "{prefix}/DiskOperations/{}?p={}&monitor=true&api-version={}",
            op.id, op.p, op.api_version
        ),
        OpNs::Network => format!(
            "{prefix}/operationResults/{}?api-version={}",
            op.id, op.api_version
        ),
    }
}

/// The body the `Azure-AsyncOperation` URL answers.
fn operation_body(op: &OpRec) -> Value {
    let mut body = match op.ns {
        OpNs::Network => json!({"status": op.status}),
        OpNs::Compute | OpNs::Disk => {
            json!({"startTime": op.start, "status": op.status, "name": op.id})
        }
    };
    if let Some(end) = &op.end
        && op.ns != OpNs::Network
    {
        body["endTime"] = json!(end);
    }
    if let Some((code, message)) = &op.error {
        body["error"] = match op.ns {
            OpNs::Network => json!({"code": code, "message": message, "details": []}),
            _ => json!({"code": code, "message": message}),
        };
    }
    body
}

// ---------------------------------------------------------------------------------------------
// Time, ids and small helpers
// ---------------------------------------------------------------------------------------------

fn unix_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day, hour, minute, second, 100 ns ticks) of `secs`/`nanos` after the epoch.
fn civil(secs: i64, nanos: u32) -> (i64, u32, u32, i64, i64, i64, u32) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60, nanos / 100)
}

/// RFC 3339 with 100 ns precision and `+00:00`, as Compute writes `timeCreated`.
fn now_rfc3339() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let (y, m, d, hh, mm, ss, ticks) = civil(now.as_secs() as i64, now.subsec_nanos());
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{ticks:07}+00:00")
}

/// `2024-05-03 09:12:30Z`, as Entra ID writes `timestamp`.
fn aad_timestamp() -> String {
    let (y, m, d, hh, mm, ss, _) = civil(unix_secs(), 0);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}:{ss:02}Z")
}

/// `5/3/2024 9:12:30 AM`, as ARM writes times in `ExpiredAuthenticationToken`.
fn us_time(secs: i64) -> String {
    let (y, m, d, hh, mm, ss, _) = civil(secs, 0);
    let (h12, ampm) = match hh {
        0 => (12, "AM"),
        1..=11 => (hh, "AM"),
        12 => (12, "PM"),
        _ => (hh - 12, "PM"),
    };
    format!("{m}/{d}/{y} {h12}:{mm:02}:{ss:02} {ampm}")
}

/// `20240503T091230Z`, as in `x-ms-routing-request-id`.
fn routing_time() -> String {
    let (y, m, d, hh, mm, ss, _) = civil(unix_secs(), 0);
    format!("{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z")
}

fn resource_id(sub: &str, rg: &str, type_: &str, name: &str) -> String {
    format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/{type_}/{name}")
}

/// A resource id as parsed case-insensitively: (subscription, resource group, lower-case
/// `namespace/type`, name, the remaining segments).
struct ParsedId {
    sub: String,
    rg: String,
    type_: String,
    name: String,
    rest: Vec<String>,
}

fn parse_id(id: &str) -> Option<ParsedId> {
    let segs: Vec<&str> = id.trim_end_matches('/').split('/').collect();
    if segs.len() < 9
        || !segs[0].is_empty()
        || !segs[1].eq_ignore_ascii_case("subscriptions")
        || !segs[3].eq_ignore_ascii_case("resourceGroups")
        || !segs[5].eq_ignore_ascii_case("providers")
        || segs.iter().skip(1).any(|s| s.is_empty())
    {
        return None;
    }
    Some(ParsedId {
        sub: segs[2].to_owned(),
        rg: segs[4].to_owned(),
        type_: format!("{}/{}", segs[6], segs[7]).to_lowercase(),
        name: segs[8].to_owned(),
        rest: segs[9..].iter().map(|s| (*s).to_owned()).collect(),
    })
}

fn normalize_location(location: &str) -> String {
    location
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}

/// Removes `null`s recursively: ARM treats them as absent (and SDK models serialise some
/// `Option`s, e.g. `timeCreated`, as `null`).
fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn eq_ci(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `application/x-www-form-urlencoded` to pairs.
fn parse_form(body: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (
                percent_decode(&k.replace('+', " ")),
                percent_decode(&v.replace('+', " ")),
            )
        })
        .collect()
}

fn is_api_version(v: &str) -> bool {
    let (Some(date), Some(suffix)) = (v.get(..10), v.get(10..)) else {
        return false;
    };
    let date_ok = date.bytes().enumerate().all(|(i, c)| {
        if i == 4 || i == 7 {
            c == b'-'
        } else {
            c.is_ascii_digit()
        }
    });
    let suffix_ok = suffix.is_empty()
        || suffix
            .strip_prefix('-')
            .is_some_and(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()));
    date_ok && suffix_ok
}

// ---------------------------------------------------------------------------------------------
// Errors and replies
// ---------------------------------------------------------------------------------------------

/// An error in ARM's shape (boxed: it travels in every `Result` of the handlers).
#[derive(Debug)]
struct ArmError(Box<ArmErrorBody>);

#[derive(Debug)]
struct ArmErrorBody {
    status: u16,
    code: String,
    message: String,
    target: Option<String>,
    details: Option<Value>,
    headers: Vec<(String, String)>,
}

impl ArmError {
    fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        ArmError(Box::new(ArmErrorBody {
            status,
            code: code.to_owned(),
            message: message.into(),
            target: None,
            details: None,
            headers: Vec::new(),
        }))
    }

    fn target(mut self, target: &str) -> Self {
        self.0.target = Some(target.to_owned());
        self
    }

    fn details(mut self, details: Value) -> Self {
        self.0.details = Some(details);
        self
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.0.headers.push((name.to_owned(), value.into()));
        self
    }

    /// Marks an error of ARM's front door rather than of a resource provider.
    fn gateway(self) -> Self {
        self.header("x-ms-failure-cause", "gateway")
    }

    /// Compute's "Required parameter 'x' is missing (null)." (`InvalidParameter`, `target`).
    fn missing(param: &str) -> Self {
        ArmError::new(
            400,
            "InvalidParameter",
            format!("Required parameter '{param}' is missing (null)."),
        )
        .target(param)
    }

    fn invalid(param: &str) -> Self {
        ArmError::new(
            400,
            "InvalidParameter",
            format!("The value of parameter {param} is invalid."),
        )
        .target(param)
    }

    fn not_found(type_: &str, rg: &str, name: &str) -> Self {
        ArmError::new(
            404,
            "ResourceNotFound",
            format!(
                "The Resource '{type_}/{name}' under resource group '{rg}' was not found. For \
                 more details please go to https://aka.ms/ARMResourceNotFoundFix"
            ),
        )
        .gateway()
    }
}

/// A response before the common headers are added.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Option<Value>,
}

impl Reply {
    fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: Some(body),
        }
    }

    fn empty(status: u16) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: None,
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }
}

impl From<ArmError> for Reply {
    fn from(e: ArmError) -> Self {
        let e = *e.0;
        let mut error = json!({"code": e.code, "message": e.message});
        if let Some(t) = e.target {
            error["target"] = json!(t);
        }
        if let Some(d) = e.details {
            error["details"] = d;
        }
        Reply {
            status: e.status,
            headers: e.headers,
            body: Some(json!({ "error": error })),
        }
    }
}

/// An Entra ID error (`error`, `error_description`, `error_codes`, ...).
fn aad_error(w: &mut World, status: u16, error: &str, code: u32, description: &str) -> Reply {
    let trace = w.uuid();
    let correlation = w.uuid();
    let timestamp = aad_timestamp();
    Reply::json(
        status,
        json!({
            "error": error,
            "error_description": format!(
                "AADSTS{code}: {description} Trace ID: {trace} Correlation ID: {correlation} Timestamp: {timestamp}"
            ),
            "error_codes": [code],
            "timestamp": timestamp,
            "trace_id": trace,
            "correlation_id": correlation,
            "error_uri": format!("https://login.microsoftonline.com/error?code={code}"),
        }),
    )
}

// ---------------------------------------------------------------------------------------------
// The front door
// ---------------------------------------------------------------------------------------------

/// A received request.
struct Ctx {
    method: Method,
    path: String,
    /// Percent-decoded path segments (without the leading empty one).
    segs: Vec<String>,
    query: Vec<(String, String)>,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Ctx {
    fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn api_version(&self) -> &str {
        self.query("api-version").unwrap_or_default()
    }

    /// The JSON object body of a `PUT`/`PATCH`, `null`s removed.
    fn json_body(&self) -> Result<Value, ArmError> {
        let content_type = self.header("content-type").unwrap_or_default();
        if !content_type
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
        {
            return Err(ArmError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "The content media type '{content_type}' is not supported. Only \
                     'application/json' is supported."
                ),
            )
            .gateway());
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v @ Value::Object(_)) => Ok(strip_nulls(v)),
            Ok(_) => Err(ArmError::new(
                400,
                "InvalidRequestContent",
                "The request content was invalid and could not be deserialized: 'Expected an \
                 object.'.",
            )
            .gateway()),
            Err(e) => Err(ArmError::new(
                400,
                "InvalidRequestContent",
                format!("The request content was invalid and could not be deserialized: '{e}'."),
            )
            .gateway()),
        }
    }
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default()
        .to_vec();
    let query = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let segs = path
        .trim_start_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let ctx = Ctx {
        method: parts.method,
        path,
        segs,
        query,
        headers: parts.headers,
        body: bytes,
    };
    let token_request = is_token_path(&ctx.segs);
    let (reply, principal) = if token_request {
        token_endpoint(&s, &ctx)
    } else {
        arm(&s, &ctx)
    };
    let (response, record) = finish(&s, &ctx, reply, principal, token_request);
    s.lock().log.push(record);
    response
}

fn is_token_path(segs: &[String]) -> bool {
    segs.len() == 4
        && eq_ci(&segs[1], "oauth2")
        && eq_ci(&segs[2], "v2.0")
        && eq_ci(&segs[3], "token")
}

/// Adds the common headers, builds the response and the log record.
fn finish(
    s: &Shared,
    ctx: &Ctx,
    reply: Reply,
    principal: Option<String>,
    token_request: bool,
) -> (Response, RequestRecord) {
    let mut w = s.lock();
    let request_id = w.uuid();
    let correlation = ctx
        .header("x-ms-correlation-request-id")
        .map(str::to_owned)
        .unwrap_or_else(|| w.uuid());
    drop(w);
    let mut headers: Vec<(String, String)> = vec![
        ("x-ms-request-id".into(), request_id.clone()),
        ("cache-control".into(), "no-cache".into()),
        ("pragma".into(), "no-cache".into()),
        ("expires".into(), "-1".into()),
        (
            "strict-transport-security".into(),
            "max-age=31536000; includeSubDomains".into(),
        ),
        ("x-content-type-options".into(), "nosniff".into()),
    ];
    if token_request {
        if let Some(id) = ctx.header("client-request-id") {
            headers.push(("client-request-id".into(), id.to_owned()));
        }
    } else {
        headers.push(("x-ms-correlation-request-id".into(), correlation.clone()));
        headers.push((
            "x-ms-routing-request-id".into(),
            format!("WESTEUROPE:{}:{correlation}", routing_time()),
        ));
        let budget = match ctx.method.as_str() {
            "GET" | "HEAD" => ("x-ms-ratelimit-remaining-subscription-reads", "11999"),
            "DELETE" => ("x-ms-ratelimit-remaining-subscription-deletes", "11999"),
            _ => ("x-ms-ratelimit-remaining-subscription-writes", "1199"),
        };
        headers.push((budget.0.into(), budget.1.into()));
        if let Some(id) = ctx.header("x-ms-client-request-id") {
            headers.push(("x-ms-client-request-id".into(), id.to_owned()));
        }
    }
    headers.extend(reply.headers);
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match &reply.body {
        Some(v) => {
            headers.push((
                "content-type".into(),
                "application/json; charset=utf-8".into(),
            ));
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            response.headers_mut().append(n, v);
        }
    }
    let record_body = if token_request {
        let form: Map<String, Value> = parse_form(&ctx.body)
            .into_iter()
            .map(|(k, v)| {
                let v = if k == "client_secret" {
                    "***".into()
                } else {
                    v
                };
                (k, Value::String(v))
            })
            .collect();
        Some(Value::Object(form))
    } else {
        serde_json::from_slice(&ctx.body).ok()
    };
    let record = RequestRecord {
        method: ctx.method.to_string(),
        path: ctx.path.clone(),
        query: ctx.query.clone(),
        headers: ctx
            .headers
            .iter()
            .filter(|(k, _)| *k != header::AUTHORIZATION)
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        principal,
        body: record_body,
        status: reply.status,
        request_id,
    };
    (response, record)
}

/// `POST /{tenant}/oauth2/v2.0/token`.
fn token_endpoint(s: &Shared, ctx: &Ctx) -> (Reply, Option<String>) {
    let mut w = s.lock();
    if ctx.method != Method::POST {
        return (
            aad_error(
                &mut w,
                400,
                "invalid_request",
                900_561,
                "The endpoint only accepts POST requests.",
            ),
            None,
        );
    }
    let form = parse_form(&ctx.body);
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let tenant = &ctx.segs[0];
    if !eq_ci(tenant, &s.tenant) {
        let d = format!(
            "Tenant '{tenant}' not found. Check to make sure you have the correct tenant ID and \
             are signing into the correct cloud. Check with your subscription administrator, this \
             may happen if there are no active subscriptions for the tenant."
        );
        return (aad_error(&mut w, 400, "invalid_request", 90_002, &d), None);
    }
    match field("grant_type") {
        Some("client_credentials") => {}
        Some(other) => {
            let d = format!(
                "The provided request must include a 'grant_type' input parameter. Unsupported grant type '{other}'."
            );
            return (
                aad_error(&mut w, 400, "unsupported_grant_type", 70_003, &d),
                None,
            );
        }
        None => {
            let d = "The request body must contain the following parameter: 'grant_type'.";
            return (aad_error(&mut w, 400, "invalid_request", 900_144, d), None);
        }
    }
    let client_id = field("client_id").unwrap_or_default().to_owned();
    if client_id != s.client_id {
        let d = format!(
            "Application with identifier '{client_id}' was not found in the directory \
             '{tenant}'. This can happen if the application has not been installed by the \
             administrator of the tenant or consented to by any user in the tenant. You may have \
             sent your authentication request to the wrong tenant."
        );
        return (
            aad_error(&mut w, 400, "unauthorized_client", 700_016, &d),
            None,
        );
    }
    if let Some(assertion) = field("client_assertion") {
        // Workload identity: a federated token of the application instead of its secret.
        if field("client_assertion_type")
            != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        {
            let d = "The client_assertion_type must be \
                     urn:ietf:params:oauth:client-assertion-type:jwt-bearer.";
            return (aad_error(&mut w, 400, "invalid_request", 50_027, d), None);
        }
        if !w.federated_tokens.contains(assertion) {
            let d = format!(
                "No matching federated identity record found for presented assertion. \
                 Assertion Issuer: 'https://issuer.gardener.invalid'. Please check your \
                 federated identity credential Subject, Audience and Issuer against the \
                 presented assertion. Application: '{client_id}'."
            );
            return (aad_error(&mut w, 400, "invalid_request", 70_021, &d), None);
        }
    } else if field("client_secret") != Some(s.client_secret.as_str()) {
        let d = format!(
            "Invalid client secret provided. Ensure the secret being sent in the request is the \
             client secret value, not the client secret ID, for a secret added to app \
             '{client_id}'."
        );
        return (
            aad_error(&mut w, 401, "invalid_client", 7_000_215, &d),
            None,
        );
    }
    let Some(scope) = field("scope") else {
        let d = "The request body must contain the following parameter: 'scope'.";
        return (aad_error(&mut w, 400, "invalid_request", 900_144, d), None);
    };
    let Some(resource) = scope
        .strip_suffix("/.default")
        .filter(|_| !scope.contains(' '))
    else {
        let d = format!(
            "The provided value for scope {scope} is not valid. Client credential flows must \
             have a scope value with /.default suffixed to the resource identifier (application \
             ID URI)."
        );
        return (aad_error(&mut w, 400, "invalid_scope", 1_002_012, &d), None);
    };
    let resource_url = resource.trim_end_matches('/');
    let known = ARM_AUDIENCES
        .iter()
        .any(|a| a.trim_end_matches('/') == resource_url)
        || resource_url == s.base;
    if !known {
        let d = format!(
            "The resource principal named {resource} was not found in the tenant named \
             {tenant}. This can happen if the application has not been installed by the \
             administrator of the tenant or consented to by any user in the tenant. You might \
             have sent your authentication request to the wrong tenant."
        );
        return (
            aad_error(&mut w, 400, "invalid_resource", 500_011, &d),
            None,
        );
    }
    let lifetime = w.token_lifetime.as_secs();
    let now = unix_secs();
    let claims = json!({
        "aud": resource,
        "iss": format!("https://sts.windows.net/{}/", s.tenant),
        "iat": now,
        "nbf": now,
        "exp": now + lifetime as i64,
        "appid": client_id,
        "tid": s.tenant,
        "oid": w.uuid(),
        "uti": w.hex32(),
    });
    let token = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"RS256","kid":"fake-arm"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(w.hex32()),
    );
    w.tokens.insert(
        token.clone(),
        TokenRec {
            client_id: client_id.clone(),
            audience: resource.to_owned(),
            expires_at: now + lifetime as i64,
        },
    );
    drop(w);
    s.bump();
    (
        Reply::json(
            200,
            json!({
                "token_type": "Bearer",
                "expires_in": lifetime,
                "ext_expires_in": lifetime,
                "access_token": token,
            }),
        ),
        Some(client_id),
    )
}

/// Checks the bearer token; returns its client id.
fn authenticate(s: &Shared, ctx: &Ctx) -> Result<String, ArmError> {
    let www = |description: &str| {
        format!(
            "Bearer authorization_uri=\"https://login.windows.net/{}\", error=\"invalid_token\", \
             error_description=\"{description}\"",
            s.tenant
        )
    };
    let Some(value) = ctx.header("authorization") else {
        return Err(ArmError::new(
            401,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing.",
        )
        .header(
            "www-authenticate",
            www("The authentication failed because of missing 'Authorization' header."),
        )
        .gateway());
    };
    let Some(token) = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    else {
        return Err(ArmError::new(
            401,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is provided in an invalid format.",
        )
        .header(
            "www-authenticate",
            www("The authentication failed because the 'Authorization' header is invalid."),
        )
        .gateway());
    };
    let w = s.lock();
    let Some(rec) = w.tokens.get(token) else {
        return Err(ArmError::new(
            401,
            "InvalidAuthenticationToken",
            "The access token is invalid.",
        )
        .header("www-authenticate", www("The access token is invalid."))
        .gateway());
    };
    let now = unix_secs();
    if rec.expires_at <= now {
        return Err(ArmError::new(
            401,
            "ExpiredAuthenticationToken",
            format!(
                "The access token expiry UTC time '{}' is earlier than current UTC time '{}'.",
                us_time(rec.expires_at),
                us_time(now)
            ),
        )
        .header("www-authenticate", www("The access token has expired."))
        .gateway());
    }
    let aud = rec.audience.trim_end_matches('/');
    let ok = ARM_AUDIENCES.iter().any(|a| a.trim_end_matches('/') == aud) || aud == s.base;
    if !ok {
        return Err(ArmError::new(
            401,
            "InvalidAuthenticationTokenAudience",
            format!(
                "The access token has been obtained for wrong audience or resource '{}'. It \
                 should exactly match with one of the allowed audiences \
                 'https://management.core.windows.net/','https://management.core.windows.net',\
                 'https://management.azure.com/','https://management.azure.com'.",
                rec.audience
            ),
        )
        .header(
            "www-authenticate",
            www("The access token has been obtained for wrong audience or resource."),
        )
        .gateway());
    }
    Ok(rec.client_id.clone())
}

/// Everything under `/subscriptions`.
fn arm(s: &Arc<Shared>, ctx: &Ctx) -> (Reply, Option<String>) {
    let principal = match authenticate(s, ctx) {
        Ok(p) => p,
        Err(e) => return (e.into(), None),
    };
    let reply = match route(s, ctx) {
        Ok(r) => r,
        Err(e) => e.into(),
    };
    (reply, Some(principal))
}

fn route(s: &Arc<Shared>, ctx: &Ctx) -> Result<Reply, ArmError> {
    if let Some(retry_after) = s.lock().throttles.pop_front() {
        let kind = match ctx.method.as_str() {
            "GET" | "HEAD" => "Read",
            "DELETE" => "Delete",
            _ => "Write",
        };
        return Err(ArmError::new(
            429,
            "TooManyRequests",
            format!(
                "The request is being throttled as the limit has been reached for operation type \
                 - {kind}_ObservationWindow_00:05:00. For more information, refer to - \
                 https://aka.ms/armthrottling"
            ),
        )
        .header("retry-after", retry_after.to_string())
        .gateway());
    }
    let segs: Vec<&str> = ctx.segs.iter().map(String::as_str).collect();
    let lower: Vec<String> = segs.iter().map(|s| s.to_ascii_lowercase()).collect();
    let l: Vec<&str> = lower.iter().map(String::as_str).collect();
    if l.first() != Some(&"subscriptions") || segs.len() < 2 {
        return Err(ArmError::new(
            404,
            "InvalidRequestUri",
            format!("The request URI '{}' is not valid.", ctx.path),
        )
        .gateway());
    }
    if !eq_ci(segs[1], &s.subscription) {
        return Err(ArmError::new(
            404,
            "SubscriptionNotFound",
            format!("The subscription '{}' could not be found.", segs[1]),
        )
        .gateway());
    }
    match ctx.query("api-version") {
        None => {
            return Err(ArmError::new(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
            .gateway());
        }
        Some(v) if !is_api_version(v) => {
            return Err(ArmError::new(
                400,
                "InvalidApiVersionParameter",
                format!(
                    "The api-version '{v}' is invalid. The supported versions are \
                     '2024-07-01,2024-03-01,2023-09-01,2022-12-01,2022-09-01,2022-06-01'."
                ),
            )
            .gateway());
        }
        Some(_) => {}
    }
    let m = &ctx.method;
    let get = *m == Method::GET;
    match l.as_slice() {
        // /subscriptions/{sub}/resourceGroups/{rg}/providers/{ns}/{type}[/{name}[/{child}]]
        [
            "subscriptions",
            _,
            "resourcegroups",
            _,
            "providers",
            ns,
            type_,
            rest @ ..,
        ] => {
            let rg = segs[3];
            check_rg(s, rg)?;
            let name = rest.first().map(|_| segs[7]);
            match (*ns, *type_, rest.len()) {
                ("microsoft.compute", "virtualmachines", 0) if get => {
                    list(s, ctx, ListKind::Vm, Some(rg))
                }
                ("microsoft.compute", "virtualmachines", 1) => {
                    vm_request(s, ctx, rg, name.unwrap_or_default())
                }
                ("microsoft.compute", "virtualmachines", 2) if rest[1] == "instanceview" && get => {
                    let w = s.lock();
                    let vm = w
                        .vms
                        .get(&key(rg, segs[7]))
                        .ok_or_else(|| ArmError::not_found(VM_TYPE, rg, segs[7]))?;
                    Ok(Reply::json(200, instance_view(vm)))
                }
                ("microsoft.compute", "disks", 0) if get => list(s, ctx, ListKind::Disk, Some(rg)),
                ("microsoft.compute", "disks", 1) => {
                    disk_request(s, ctx, rg, name.unwrap_or_default())
                }
                ("microsoft.network", "networkinterfaces", 0) if get => {
                    list(s, ctx, ListKind::Nic, Some(rg))
                }
                ("microsoft.network", "networkinterfaces", 1) => {
                    nic_request(s, ctx, rg, name.unwrap_or_default())
                }
                ("microsoft.compute" | "microsoft.network", _, 0 | 1) => {
                    if matches!(*type_, "virtualmachines" | "disks" | "networkinterfaces") {
                        Err(method_not_allowed(m))
                    } else {
                        Err(invalid_resource_type(segs[5], segs[6], ctx.api_version()))
                    }
                }
                _ => Err(invalid_resource_type(segs[5], segs[6], ctx.api_version())),
            }
        }
        // /subscriptions/{sub}/providers/{ns}/locations/{loc}/{operations|...}/{id}
        ["subscriptions", _, "providers", ns, "locations", _, kind, _] if get => {
            let ns = match (*ns, *kind) {
                ("microsoft.compute", "operations") => OpNs::Compute,
                ("microsoft.compute", "diskoperations") => OpNs::Disk,
                ("microsoft.network", "operations" | "operationresults") => OpNs::Network,
                _ => return Err(invalid_resource_type(segs[3], segs[6], ctx.api_version())),
            };
            let monitor = *kind == "operationresults" || ctx.query("monitor") == Some("true");
            operation_request(s, ns, segs[5], &lower[7], monitor)
        }
        // /subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/publishers/{p}/
        //   artifacttypes/vmimage/offers/{o}/skus/{s}/versions/{v}
        [
            "subscriptions",
            _,
            "providers",
            "microsoft.compute",
            "locations",
            _,
            "publishers",
            _,
            "artifacttypes",
            "vmimage",
            "offers",
            _,
            "skus",
            _,
            "versions",
            _,
        ] if get => vm_image(s, &segs),
        // /subscriptions/{sub}/providers/Microsoft.MarketplaceOrdering/offerTypes/virtualmachine/
        //   publishers/{p}/offers/{o}/plans/{plan}/agreements/current
        [
            "subscriptions",
            _,
            "providers",
            "microsoft.marketplaceordering",
            "offertypes",
            "virtualmachine",
            "publishers",
            _,
            "offers",
            _,
            "plans",
            _,
            "agreements",
            "current",
        ] => agreement_request(s, ctx, &segs),
        ["subscriptions", _, "providers", ns, type_] if get => match (*ns, *type_) {
            ("microsoft.compute", "virtualmachines") => list(s, ctx, ListKind::Vm, None),
            ("microsoft.compute", "disks") => list(s, ctx, ListKind::Disk, None),
            ("microsoft.network", "networkinterfaces") => list(s, ctx, ListKind::Nic, None),
            _ => Err(invalid_resource_type(segs[3], segs[4], ctx.api_version())),
        },
        _ => Err(ArmError::new(
            404,
            "InvalidRequestUri",
            format!("The request URI '{}' is not valid.", ctx.path),
        )
        .gateway()),
    }
}

fn invalid_resource_type(ns: &str, type_: &str, api_version: &str) -> ArmError {
    ArmError::new(
        400,
        "InvalidResourceType",
        format!(
            "The resource type '{type_}' could not be found in the namespace '{ns}' for api \
             version '{api_version}'."
        ),
    )
    .gateway()
}

fn method_not_allowed(method: &Method) -> ArmError {
    // Close to ARM's answer for a verb a resource type does not support.
    ArmError::new(
        405,
        "HttpMethodNotSupported",
        format!("The requested resource does not support http method '{method}'."),
    )
    .gateway()
}

fn check_rg(s: &Shared, rg: &str) -> Result<(), ArmError> {
    let w = s.lock();
    if w.resource_groups.is_empty() || w.resource_groups.contains(&rg.to_lowercase()) {
        return Ok(());
    }
    Err(ArmError::new(
        404,
        "ResourceGroupNotFound",
        format!("Resource group '{rg}' could not be found."),
    )
    .gateway())
}

/// ARM's checks of `tags`.
fn check_tags(body: &Value) -> Result<(), ArmError> {
    let Some(tags) = body.get("tags") else {
        return Ok(());
    };
    let Some(tags) = tags.as_object() else {
        return Err(ArmError::new(
            400,
            "InvalidRequestContent",
            "The request content was invalid and could not be deserialized: 'Error converting \
             value to type 'System.Collections.Generic.Dictionary`2[System.String,System.String]'. \
             Path 'tags'.'.",
        )
        .gateway());
    };
    let reserved: Vec<&str> = tags
        .keys()
        .filter(|k| {
            k.chars()
                .any(|c| TAG_RESERVED.contains(&c) || c.is_control())
        })
        .map(String::as_str)
        .collect();
    if !reserved.is_empty() {
        return Err(ArmError::new(
            400,
            "InvalidTagNameCharacters",
            format!(
                "The tag names '{}' have reserved characters '<,>,%,&,\\,?,/' or control \
                 characters.",
                reserved.join(",")
            ),
        )
        .gateway());
    }
    for (k, v) in tags {
        if k.chars().count() > 512 {
            return Err(ArmError::new(
                400,
                "InvalidTagNameLength",
                format!("The tag name '{k}' exceeds the maximum length of '512' characters."),
            )
            .gateway());
        }
        let v = v.as_str().unwrap_or_default();
        if v.chars().count() > 256 {
            return Err(ArmError::new(
                400,
                "InvalidTagValueLength",
                format!("The tag value '{v}' exceeds the maximum length of '256' characters."),
            )
            .gateway());
        }
    }
    Ok(())
}

fn location_of(body: &Value) -> Result<String, ArmError> {
    body.get("location")
        .and_then(Value::as_str)
        .filter(|l| !l.trim().is_empty())
        .map(normalize_location)
        .ok_or_else(|| {
            ArmError::new(
                400,
                "LocationRequired",
                "The location property is required for this definition.",
            )
            .gateway()
        })
}

fn check_location_unchanged(existing: &Value, location: &str, rg: &str) -> Result<(), ArmError> {
    let old = existing["location"].as_str().unwrap_or_default();
    if old == location {
        return Ok(());
    }
    Err(ArmError::new(
        409,
        "InvalidResourceLocation",
        format!(
            "The resource '{}' already exists in location '{old}' in resource group '{rg}'. A \
             resource with the same name cannot be created in location '{location}'. Please \
             select a new resource name.",
            existing["name"].as_str().unwrap_or_default()
        ),
    )
    .gateway())
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

fn operation_request(
    s: &Shared,
    ns: OpNs,
    location: &str,
    id: &str,
    monitor: bool,
) -> Result<Reply, ArmError> {
    let w = s.lock();
    let op = w
        .ops
        .get(id)
        .filter(|o| o.ns == ns && eq_ci(&o.location, location))
        .ok_or_else(|| {
            // Paraphrase of the resource providers' answer for an unknown operation id.
            ArmError::new(
                404,
                "NotFound",
                "The entity was not found in this Azure location.",
            )
        })?;
    let retry_after = w.retry_after.to_string();
    if !monitor {
        let reply = Reply::json(200, operation_body(op));
        return Ok(if op.status == IN_PROGRESS {
            reply.header("retry-after", retry_after)
        } else {
            reply
        });
    }
    match op.status {
        IN_PROGRESS => Ok(Reply::empty(202)
            .header("location", location_url(s, op))
            .header("retry-after", retry_after)),
        SUCCEEDED if ns == OpNs::Network => Ok(Reply::empty(204)),
        SUCCEEDED => Ok(Reply::empty(200)),
        _ => {
            let (code, message) = op.error.clone().unwrap_or_default();
            Err(ArmError::new(409, &code, message))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lists
// ---------------------------------------------------------------------------------------------

fn decode_skiptoken(token: &str) -> Result<Key, ArmError> {
    URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| {
            t.split_once('\n')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
        })
        .ok_or_else(|| {
            // Paraphrase of ARM's answer for a tampered continuation token.
            ArmError::new(
                400,
                "InvalidSkipToken",
                format!("The provided skip token '{token}' is not valid."),
            )
        })
}

#[derive(Clone, Copy)]
enum ListKind {
    Vm,
    Nic,
    Disk,
}

fn list(s: &Shared, ctx: &Ctx, kind: ListKind, rg: Option<&str>) -> Result<Reply, ArmError> {
    let w = s.lock();
    let after: Option<Key> = ctx.query("$skiptoken").map(decode_skiptoken).transpose()?;
    let rg = rg.map(str::to_lowercase);
    let items: Vec<(&Key, &Value)> = match kind {
        ListKind::Vm => w.vms.iter().map(|(k, r)| (k, &r.json)).collect(),
        ListKind::Nic => w.nics.iter().map(|(k, r)| (k, &r.json)).collect(),
        ListKind::Disk => w.disks.iter().map(|(k, r)| (k, &r.json)).collect(),
    };
    let mut selected = items
        .into_iter()
        .filter(|(k, _)| rg.as_ref().is_none_or(|rg| &k.0 == rg))
        .filter(|(k, _)| after.as_ref().is_none_or(|a| *k > a));
    let page: Vec<(&Key, &Value)> = selected.by_ref().take(w.page_size).collect();
    let more = selected.next().is_some();
    let mut body = json!({
        "value": page.iter().map(|(_, v)| (*v).clone()).collect::<Vec<_>>(),
    });
    if more && let Some((last, _)) = page.last() {
        let token = URL_SAFE_NO_PAD.encode(format!("{}\n{}", last.0, last.1));
        body["nextLink"] = json!(format!(
            "{}{}?api-version={}&$skiptoken={token}",
            s.base,
            ctx.path,
            ctx.api_version()
        ));
    }
    Ok(Reply::json(200, body))
}

// ---------------------------------------------------------------------------------------------
// Network interfaces
// ---------------------------------------------------------------------------------------------

fn nic_request(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    match ctx.method.as_str() {
        "GET" => {
            let w = s.lock();
            let nic = w
                .nics
                .get(&key(rg, name))
                .ok_or_else(|| ArmError::not_found(NIC_TYPE, rg, name))?;
            Ok(Reply::json(200, nic.json.clone()))
        }
        "PUT" => put_nic(s, ctx, rg, name),
        "PATCH" => {
            let body = ctx.json_body()?;
            check_tags(&body)?;
            let mut w = s.lock();
            let uuid = w.uuid();
            let nic = w
                .nics
                .get_mut(&key(rg, name))
                .ok_or_else(|| ArmError::not_found(NIC_TYPE, rg, name))?;
            match body.get("tags") {
                Some(tags) => nic.json["tags"] = tags.clone(),
                None => {
                    if let Some(o) = nic.json.as_object_mut() {
                        o.remove("tags");
                    }
                }
            }
            nic.json["etag"] = json!(format!("W/\"{uuid}\""));
            let json = nic.json.clone();
            drop(w);
            s.bump();
            Ok(Reply::json(200, json))
        }
        "DELETE" => delete_nic(s, ctx, rg, name),
        _ => Err(method_not_allowed(&ctx.method)),
    }
}

fn put_nic(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    let body = ctx.json_body()?;
    check_tags(&body)?;
    let location = location_of(&body)?;
    let mut w = s.lock();
    let k = key(rg, name);
    let existing = w.nics.get(&k).map(|r| (r.json.clone(), r.busy.clone()));
    if let Some((json, busy)) = &existing {
        check_location_unchanged(json, &location, rg)?;
        if json["properties"]["provisioningState"] == "Deleting"
            && let Some(op) = busy.as_ref().and_then(|b| w.ops.get(b))
        {
            return Err(ArmError::new(
                409,
                "AnotherOperationInProgress",
                format!(
                    "Another operation on this or dependent resource is in progress. To retrieve \
                     status of the operation use uri: {}.",
                    async_operation_url(s, op)
                ),
            ));
        }
    }
    let sub = s.subscription.clone();
    let existing_json = existing.as_ref().map(|(j, _)| j.clone());
    let mut json = build_nic(&mut w, &sub, rg, name, &body, existing_json.as_ref(), true)?;
    if existing.is_none()
        && let Some((status, code, message)) = w.nic_rejects.pop_front()
    {
        return Err(ArmError::new(status, &code, message));
    }
    set_nic_state(&mut json, "Updating");
    let running = w.nics.get(&k).and_then(|r| r.busy.clone());
    w.preempt(running.as_ref());
    let kind = if existing.is_some() {
        OpKind::Update
    } else {
        OpKind::Create
    };
    let op_id = start_operation(
        s,
        &mut w,
        OpNs::Network,
        kind,
        Target::Nic(k.clone()),
        &location,
        ctx.api_version(),
    );
    w.nics.insert(
        k,
        NicRec {
            json: json.clone(),
            busy: Some(op_id.clone()),
        },
    );
    if existing.is_none() {
        *w.nic_creates.entry(name.to_lowercase()).or_default() += 1;
    }
    let op_url = async_operation_url(s, &w.ops[&op_id]);
    let retry_after = w.retry_after.to_string();
    drop(w);
    s.bump();
    let status = if existing.is_some() { 200 } else { 201 };
    Ok(Reply::json(status, json)
        .header("azure-asyncoperation", op_url)
        .header("retry-after", retry_after))
}

/// Builds the NIC resource from a `PUT` body (checking subnets when `check_subnets`).
fn build_nic(
    w: &mut World,
    sub: &str,
    rg: &str,
    name: &str,
    body: &Value,
    existing: Option<&Value>,
    check_subnets: bool,
) -> Result<Value, ArmError> {
    let location = location_of(body)?;
    let (id, stored_name) = match existing {
        Some(e) => (
            e["id"].as_str().unwrap_or_default().to_owned(),
            e["name"].as_str().unwrap_or(name).to_owned(),
        ),
        None => (resource_id(sub, rg, NIC_TYPE, name), name.to_owned()),
    };
    let empty = Map::new();
    let props = body
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let configs = props
        .get("ipConfigurations")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| {
            // Paraphrase of the network RP's answer for a NIC without IP configurations.
            ArmError::new(
                400,
                "NetworkInterfaceMustHaveAtLeastOneIpConfiguration",
                format!("Network interface {id} must have one or more IP configurations."),
            )
        })?;
    let mut ip_configs = Vec::with_capacity(configs.len());
    for (i, config) in configs.iter().enumerate() {
        let config_name = config["name"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("ipconfig{}", i + 1));
        let mut cprops = config
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let path = format!("properties.ipConfigurations[{i}].properties.subnet.id");
        let subnet_id = cprops
            .get("subnet")
            .and_then(|s| s.get("id"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                // Paraphrase of the network RP's answer for an IP configuration without a subnet.
                ArmError::new(
                    400,
                    "IpConfigurationSubnetMissing",
                    format!(
                        "IP configuration {id}/ipConfigurations/{config_name} must reference a \
                         subnet."
                    ),
                )
            })?
            .to_owned();
        let parsed = parse_id(&subnet_id)
            .filter(|p| {
                p.type_ == "microsoft.network/virtualnetworks"
                    && p.rest.len() == 2
                    && eq_ci(&p.rest[0], "subnets")
            })
            .ok_or_else(|| {
                ArmError::new(
                    400,
                    "LinkedInvalidPropertyId",
                    format!(
                        "Property id '{subnet_id}' at path '{path}' is invalid. Expect fully \
                         qualified resource Id that start with '/subscriptions/{{subscriptionId}}' \
                         or '/providers/{{resourceProviderNamespace}}/'."
                    ),
                )
                .gateway()
            })?;
        let vnet_key = key(&parsed.rg, &parsed.name);
        let subnet_key = parsed.rest[1].to_lowercase();
        let previous_ip = existing.and_then(|e| {
            e["properties"]["ipConfigurations"]
                .as_array()?
                .iter()
                .find(|c| {
                    c["properties"]["subnet"]["id"]
                        .as_str()
                        .is_some_and(|s| eq_ci(s, &subnet_id))
                })?["properties"]["privateIPAddress"]
                .as_str()
                .map(str::to_owned)
        });
        let unknown = |referenced: String| {
            ArmError::new(
                400,
                "InvalidResourceReference",
                format!(
                    "Resource {referenced} referenced by resource {id} was not found. Please \
                     make sure that the referenced resource exists, and that both resources are \
                     in the same region."
                ),
            )
            .details(json!([]))
        };
        let sub_ok = eq_ci(&parsed.sub, sub);
        let vnet_known = sub_ok && w.vnets.contains_key(&vnet_key);
        let subnet_known = vnet_known
            && w.vnets
                .get(&vnet_key)
                .is_some_and(|v| v.subnets.contains_key(&subnet_key));
        if check_subnets && !subnet_known {
            let referenced = if vnet_known {
                subnet_id.clone()
            } else {
                format!(
                    "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/virtualNetworks/{}",
                    parsed.sub, parsed.rg, parsed.name
                )
            };
            return Err(unknown(referenced));
        }
        let static_ip = cprops
            .get("privateIPAllocationMethod")
            .and_then(Value::as_str)
            .is_some_and(|m| eq_ci(m, "Static"))
            .then(|| cprops.get("privateIPAddress").and_then(Value::as_str))
            .flatten()
            .map(str::to_owned);
        let ip = match static_ip.or(previous_ip) {
            Some(ip) => ip,
            None => match w
                .vnets
                .get_mut(&vnet_key)
                .filter(|_| sub_ok)
                .and_then(|v| v.subnets.get_mut(&subnet_key))
            {
                Some(subnet) => {
                    let host = subnet.next_host + 4;
                    subnet.next_host += 1;
                    format!("10.{}.{}.{}", subnet.index % 256, host / 256, host % 256)
                }
                None => {
                    let (a, b) = (w.rand() % 256, 4 + w.rand() % 250);
                    format!("10.255.{a}.{b}")
                }
            },
        };
        cprops.insert("privateIPAddress".into(), json!(ip));
        cprops
            .entry("privateIPAllocationMethod")
            .or_insert(json!("Dynamic"));
        cprops
            .entry("privateIPAddressVersion")
            .or_insert(json!("IPv4"));
        cprops.entry("primary").or_insert(json!(i == 0));
        cprops.insert("subnet".into(), json!({"id": subnet_id}));
        let etag = w.uuid();
        ip_configs.push(json!({
            "name": config_name,
            "id": format!("{id}/ipConfigurations/{config_name}"),
            "etag": format!("W/\"{etag}\""),
            "type": "Microsoft.Network/networkInterfaces/ipConfigurations",
            "properties": Value::Object(cprops),
        }));
    }
    let mut out_props = props.clone();
    for read_only in [
        "provisioningState",
        "resourceGuid",
        "macAddress",
        "virtualMachine",
        "primary",
        "hostedWorkloads",
        "tapConfigurations",
        "vnetEncryptionSupported",
    ] {
        out_props.remove(read_only);
    }
    out_props.insert("ipConfigurations".into(), Value::Array(ip_configs));
    let guid = match existing.and_then(|e| e["properties"]["resourceGuid"].as_str()) {
        Some(g) => g.to_owned(),
        None => w.uuid(),
    };
    out_props.insert("resourceGuid".into(), json!(guid));
    let dns = out_props
        .get("dnsSettings")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut dns = dns.as_object().cloned().unwrap_or_default();
    dns.entry("dnsServers").or_insert(json!([]));
    dns.insert("appliedDnsServers".into(), json!([]));
    let suffix = existing
        .and_then(|e| e["properties"]["dnsSettings"]["internalDomainNameSuffix"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{}.ax.internal.cloudapp.net", &w.hex32()[..26]));
    dns.insert("internalDomainNameSuffix".into(), json!(suffix));
    out_props.insert("dnsSettings".into(), Value::Object(dns));
    for (field, default) in [
        ("enableAcceleratedNetworking", json!(false)),
        ("enableIPForwarding", json!(false)),
        ("disableTcpStateTracking", json!(false)),
        ("nicType", json!("Standard")),
        ("auxiliaryMode", json!("None")),
        ("auxiliarySku", json!("None")),
    ] {
        out_props.entry(field).or_insert(default);
    }
    out_props.insert("vnetEncryptionSupported".into(), json!(false));
    out_props.insert("hostedWorkloads".into(), json!([]));
    out_props.insert("tapConfigurations".into(), json!([]));
    if let Some(e) = existing {
        for kept in ["virtualMachine", "macAddress", "primary"] {
            if let Some(v) = e["properties"].get(kept) {
                out_props.insert(kept.into(), v.clone());
            }
        }
    }
    let etag = w.uuid();
    let mut json = json!({
        "name": stored_name,
        "id": id,
        "etag": format!("W/\"{etag}\""),
        "type": NIC_TYPE,
        "location": location,
        "kind": "Regular",
        "properties": Value::Object(out_props),
    });
    if let Some(tags) = body.get("tags") {
        json["tags"] = tags.clone();
    }
    Ok(json)
}

fn set_nic_state(json: &mut Value, state: &str) {
    json["properties"]["provisioningState"] = json!(state);
    if let Some(configs) = json["properties"]["ipConfigurations"].as_array_mut() {
        for c in configs {
            c["properties"]["provisioningState"] = json!(state);
        }
    }
}

fn delete_nic(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    let mut w = s.lock();
    let k = key(rg, name);
    let Some(nic) = w.nics.get(&k) else {
        return Ok(Reply::empty(204));
    };
    if let Some(vm_id) = nic.json["properties"]["virtualMachine"]["id"].as_str() {
        return Err(ArmError::new(
            400,
            "NicInUse",
            format!(
                "Network Interface {} is used by existing resource {vm_id}. In order to delete \
                 the network interface, it must be dissociated from the resource. To learn more, \
                 see aka.ms/deletenic.",
                nic.json["id"].as_str().unwrap_or_default()
            ),
        )
        .details(json!([])));
    }
    let location = nic.json["location"].as_str().unwrap_or_default().to_owned();
    let running = nic.busy.clone();
    let deleting = nic.json["properties"]["provisioningState"] == "Deleting";
    let op_id = match running {
        Some(op) if deleting => op,
        running => {
            w.preempt(running.as_ref());
            let op = start_operation(
                s,
                &mut w,
                OpNs::Network,
                OpKind::Delete,
                Target::Nic(k.clone()),
                &location,
                ctx.api_version(),
            );
            if let Some(nic) = w.nics.get_mut(&k) {
                set_nic_state(&mut nic.json, "Deleting");
                nic.busy = Some(op.clone());
            }
            op
        }
    };
    let reply = accepted(s, &w, &op_id);
    drop(w);
    s.bump();
    Ok(reply)
}

/// 202 with `Location`, `Azure-AsyncOperation` and `Retry-After`.
fn accepted(s: &Shared, w: &World, op_id: &str) -> Reply {
    let op = &w.ops[op_id];
    Reply::empty(202)
        .header("location", location_url(s, op))
        .header("azure-asyncoperation", async_operation_url(s, op))
        .header("retry-after", w.retry_after.to_string())
}

// ---------------------------------------------------------------------------------------------
// Disks
// ---------------------------------------------------------------------------------------------

/// A disk resource as Compute stores it, from a request body, in `provisioning_state`.
fn disk_json(
    w: &mut World,
    sub: &str,
    rg: &str,
    name: &str,
    body: &Value,
    provisioning_state: &str,
) -> Value {
    let id = resource_id(sub, rg, DISK_TYPE, name);
    let location = normalize_location(body["location"].as_str().unwrap_or("westeurope"));
    let mut json = json!({
        "name": name,
        "id": id,
        "type": DISK_TYPE,
        "location": location,
        "sku": body.get("sku").cloned().unwrap_or(json!({"name": "Standard_LRS", "tier": "Standard"})),
    });
    for field in ["tags", "zones", "managedBy"] {
        if let Some(v) = body.get(field) {
            json[field] = v.clone();
        }
    }
    let mut props = body
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    props
        .entry("creationData")
        .or_insert(json!({"createOption": "Empty"}));
    let size = props
        .get("diskSizeGB")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    props.insert("diskSizeGB".into(), json!(size));
    props.insert("diskSizeBytes".into(), json!(size << 30));
    let uuid = w.uuid();
    props.entry("uniqueId").or_insert(json!(uuid));
    props.insert("timeCreated".into(), json!(now_rfc3339()));
    props.insert("provisioningState".into(), json!(provisioning_state));
    let state = if json.get("managedBy").is_some() {
        "Attached"
    } else {
        "Unattached"
    };
    props.insert("diskState".into(), json!(state));
    props
        .entry("encryption")
        .or_insert(json!({"type": "EncryptionAtRestWithPlatformKey"}));
    props
        .entry("networkAccessPolicy")
        .or_insert(json!("AllowAll"));
    props
        .entry("publicNetworkAccess")
        .or_insert(json!("Enabled"));
    json["properties"] = Value::Object(props);
    json
}

/// Compute's checks of a disk body: a `creationData.createOption` of `Empty` (with a size) or
/// `FromImage` (with an image id or a shared or community gallery image).
fn validate_disk(body: &Value) -> Result<(), ArmError> {
    let data = &body["properties"]["creationData"];
    let option = data["createOption"]
        .as_str()
        .ok_or_else(|| ArmError::missing("creationData.createOption"))?;
    if eq_ci(option, "Empty") {
        if body["properties"]["diskSizeGB"].as_i64().is_none() {
            return Err(ArmError::missing("diskSizeGB"));
        }
    } else if eq_ci(option, "FromImage") {
        let gallery = &data["galleryImageReference"];
        let has_image = data["imageReference"]["id"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
            || ["sharedGalleryImageId", "communityGalleryImageId", "id"]
                .iter()
                .any(|f| gallery[*f].as_str().is_some_and(|s| !s.is_empty()));
        if !has_image {
            return Err(ArmError::missing("creationData.imageReference"));
        }
    } else {
        return Err(ArmError::invalid("creationData.createOption"));
    }
    Ok(())
}

/// `PUT` of a disk: validated, stored `Updating`, `Succeeded` when its operation is done.
fn put_disk(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    let body: Value = serde_json::from_slice(&ctx.body).map_err(|_| {
        ArmError::new(
            400,
            "InvalidRequestContent",
            "The request content was invalid and could not be deserialized.",
        )
    })?;
    let body = strip_nulls(body);
    validate_disk(&body)?;
    let mut w = s.lock();
    let k = key(rg, name);
    if w.disks.get(&k).is_some_and(|d| d.busy.is_some()) {
        return Err(ArmError::new(
            409,
            "OperationNotAllowed",
            format!("An operation on disk {name} is in progress."),
        ));
    }
    let existing = w.disks.contains_key(&k);
    let sub = s.subscription.clone();
    let json = disk_json(&mut w, &sub, rg, name, &body, "Updating");
    let location = json["location"].as_str().unwrap_or_default().to_owned();
    let op_id = start_operation(
        s,
        &mut w,
        OpNs::Disk,
        if existing {
            OpKind::Update
        } else {
            OpKind::Create
        },
        Target::Disk(k.clone()),
        &location,
        ctx.api_version(),
    );
    w.disks.insert(
        k,
        DiskRec {
            json: json.clone(),
            busy: Some(op_id.clone()),
        },
    );
    let op_url = async_operation_url(s, &w.ops[&op_id]);
    let retry_after = w.retry_after.to_string();
    drop(w);
    s.bump();
    Ok(Reply::json(if existing { 200 } else { 202 }, json)
        .header("azure-asyncoperation", op_url)
        .header("retry-after", retry_after))
}

fn disk_request(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    match ctx.method.as_str() {
        "GET" => {
            let w = s.lock();
            let disk = w
                .disks
                .get(&key(rg, name))
                .ok_or_else(|| ArmError::not_found(DISK_TYPE, rg, name))?;
            Ok(Reply::json(200, disk.json.clone()))
        }
        "DELETE" => {
            let mut w = s.lock();
            let k = key(rg, name);
            let Some(disk) = w.disks.get(&k) else {
                return Ok(Reply::empty(204));
            };
            if let Some(vm) = disk.json["managedBy"].as_str() {
                return Err(ArmError::new(
                    409,
                    "OperationNotAllowed",
                    format!(
                        "Disk {} is attached to VM {vm}.",
                        disk.json["name"].as_str().unwrap_or(name)
                    ),
                ));
            }
            let location = disk.json["location"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let op_id = match disk.busy.clone() {
                Some(op) => op,
                None => {
                    let op = start_operation(
                        s,
                        &mut w,
                        OpNs::Disk,
                        OpKind::Delete,
                        Target::Disk(k.clone()),
                        &location,
                        ctx.api_version(),
                    );
                    if let Some(disk) = w.disks.get_mut(&k) {
                        disk.json["properties"]["provisioningState"] = json!("Deleting");
                        disk.busy = Some(op.clone());
                    }
                    op
                }
            };
            let reply = accepted(s, &w, &op_id);
            drop(w);
            s.bump();
            Ok(reply)
        }
        "PUT" => put_disk(s, ctx, rg, name),
        _ => Err(method_not_allowed(&ctx.method)),
    }
}

/// An implicit managed disk of a VM.
#[allow(clippy::too_many_arguments)]
fn new_disk(
    w: &mut World,
    id: &str,
    name: &str,
    location: &str,
    zones: Option<&Value>,
    sku: &str,
    size_gb: i64,
    os_type: Option<&str>,
    creation_data: Value,
    managed_by: &str,
) -> Value {
    let tier = if sku.starts_with("Premium") {
        "Premium"
    } else {
        "Standard"
    };
    let mut props = json!({
        "creationData": creation_data,
        "diskSizeGB": size_gb,
        "diskSizeBytes": size_gb << 30,
        "diskIOPSReadWrite": if tier == "Premium" { 120 } else { 500 },
        "diskMBpsReadWrite": if tier == "Premium" { 25 } else { 60 },
        "encryption": {"type": "EncryptionAtRestWithPlatformKey"},
        "networkAccessPolicy": "AllowAll",
        "publicNetworkAccess": "Enabled",
        "timeCreated": now_rfc3339(),
        "provisioningState": "Succeeded",
        "diskState": "Attached",
        "uniqueId": w.uuid(),
    });
    if let Some(os) = os_type {
        props["osType"] = json!(os);
        props["hyperVGeneration"] = json!("V2");
        props["supportedCapabilities"] = json!({"architecture": "x64"});
    }
    let mut disk = json!({
        "name": name,
        "id": id,
        "type": DISK_TYPE,
        "location": location,
        "managedBy": managed_by,
        "sku": {"name": sku, "tier": tier},
        "properties": props,
    });
    if let Some(z) = zones.filter(|z| z.as_array().is_some_and(|a| !a.is_empty())) {
        disk["zones"] = z.clone();
    }
    disk
}

// ---------------------------------------------------------------------------------------------
// Virtual machines
// ---------------------------------------------------------------------------------------------

fn vm_request(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    match ctx.method.as_str() {
        "GET" => {
            let w = s.lock();
            let vm = w
                .vms
                .get(&key(rg, name))
                .ok_or_else(|| ArmError::not_found(VM_TYPE, rg, name))?;
            let mut json = vm.json.clone();
            match ctx.query("$expand") {
                None => {}
                Some(e) if eq_ci(e, "instanceView") => {
                    json["properties"]["instanceView"] = instance_view(vm);
                }
                Some(e) if eq_ci(e, "userData") => {
                    if let Some(u) = &vm.user_data {
                        json["properties"]["userData"] = u.clone();
                    }
                }
                Some(_) => return Err(ArmError::invalid("$expand")),
            }
            Ok(Reply::json(200, json))
        }
        "PUT" => put_vm(s, ctx, rg, name),
        "PATCH" => patch_vm(s, ctx, rg, name),
        "DELETE" => delete_vm(s, ctx, rg, name),
        _ => Err(method_not_allowed(&ctx.method)),
    }
}

fn deleting_conflict(name: &str, operation: &str) -> ArmError {
    ArmError::new(
        409,
        "OperationNotAllowed",
        format!(
            "Operation '{operation}' is not allowed on VM '{name}' since the VM is marked for \
             deletion. You can only retry the Delete operation (or wait for an ongoing one to \
             complete)."
        ),
    )
}

fn check_preconditions(ctx: &Ctx, existing: Option<&VmRec>) -> Result<(), ArmError> {
    let failed = || {
        // Close to Compute's answer for a failed precondition.
        ArmError::new(
            412,
            "PreconditionFailed",
            "The specified precondition is not met: the resource's ETag does not match.",
        )
    };
    if let Some(inm) = ctx.header("if-none-match")
        && inm.trim() == "*"
        && existing.is_some()
    {
        return Err(failed());
    }
    if let Some(im) = ctx.header("if-match") {
        let matches = existing.is_some_and(|vm| im.trim() == "*" || vm.json["etag"] == im.trim());
        if !matches {
            return Err(failed());
        }
    }
    Ok(())
}

fn put_vm(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    let body = ctx.json_body()?;
    check_tags(&body)?;
    let location = location_of(&body)?;
    let mut w = s.lock();
    let k = key(rg, name);
    let existing = w.vms.get(&k);
    check_preconditions(ctx, existing)?;
    let existing_state = existing.map(|vm| {
        vm.json["properties"]["provisioningState"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    });
    if existing_state.as_deref() == Some("Deleting") {
        return Err(deleting_conflict(name, "Create or Update VM"));
    }
    if let Some(vm) = existing {
        check_location_unchanged(&vm.json, &location, rg)?;
    }
    let sub = s.subscription.clone();
    let plan = plan_vm(&mut w, &sub, rg, name, &body, false)?;
    let fault_applies = matches!(existing_state.as_deref(), None | Some(FAILED));
    if fault_applies && let Some((status, code, message)) = w.vm_rejects.pop_front() {
        return Err(ArmError::new(status, &code, message));
    }
    let creating = existing_state.is_none() || existing_state.as_deref() == Some("Creating");
    let state = if creating { "Creating" } else { "Updating" };
    let running = w.vms.get(&k).and_then(|vm| vm.busy.clone());
    let inherited = w.preempt(running.as_ref());
    let mut json = accept_vm(&mut w, &sub, rg, name, plan, state);
    let failure = match inherited {
        Some(f) => Some(f),
        None if fault_applies => w.vm_failures.pop_front(),
        None => None,
    };
    let kind = if existing_state.is_none() {
        OpKind::Create
    } else {
        OpKind::Update
    };
    let op_id = start_operation(
        s,
        &mut w,
        OpNs::Compute,
        kind,
        Target::Vm(k.clone()),
        &location,
        ctx.api_version(),
    );
    if let Some(op) = w.ops.get_mut(&op_id) {
        op.failure = failure;
    }
    if let Some(vm) = w.vms.get_mut(&k) {
        vm.busy = Some(op_id.clone());
        if existing_state.is_none() {
            vm.power = Some("starting".into());
        }
        json = vm.json.clone();
    }
    if existing_state.is_none() {
        *w.vm_creates.entry(name.to_lowercase()).or_default() += 1;
    }
    let op_url = async_operation_url(s, &w.ops[&op_id]);
    let retry_after = w.retry_after.to_string();
    drop(w);
    s.bump();
    let status = if existing_state.is_none() { 201 } else { 200 };
    Ok(Reply::json(status, json)
        .header("azure-asyncoperation", op_url)
        .header("retry-after", retry_after))
}

/// A checked VM `PUT`: the resource to store and the attachments to make.
struct VmPlan {
    json: Value,
    custom_data: Option<String>,
    user_data: Option<Value>,
    /// NICs to attach: (key, primary).
    nics: Vec<(Key, bool)>,
    /// NICs to detach.
    old_nics: Vec<Key>,
    /// Disks to create (key, resource) or attach (key, None).
    new_disks: Vec<(Key, Option<Value>)>,
    /// Disks to detach.
    old_disks: Vec<Key>,
}

/// Compute's validation of a VM body (the fields a driver sends).
/// Compute's checks of a Linux VM's SSH keys: a VM without password authentication needs
/// one, and each must be an `ssh-rsa` key or a well-formed `ssh-ed25519` key (the two types
/// Azure supports).
fn validate_ssh_keys(os_profile: &Value, no_password: bool) -> Result<(), ArmError> {
    let keys = os_profile["linuxConfiguration"]["ssh"]["publicKeys"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if no_password && keys.is_empty() {
        return Err(ArmError::new(
            400,
            "InvalidParameter",
            "Authentication using either SSH or by user name and password must be enabled in \
             Linux profile.",
        )
        .target("linuxConfiguration"));
    }
    let invalid = || ArmError::invalid("linuxConfiguration.ssh.publicKeys.keyData");
    for key in &keys {
        let data = key["keyData"].as_str().ok_or_else(invalid)?;
        let mut fields = data.split_whitespace();
        match fields.next() {
            Some("ssh-rsa") => {}
            Some("ssh-ed25519") => {
                let blob = fields
                    .next()
                    .and_then(|b| STANDARD.decode(b).ok())
                    .ok_or_else(invalid)?;
                // string "ssh-ed25519", string <32-byte key>
                let mut want = 11u32.to_be_bytes().to_vec();
                want.extend_from_slice(b"ssh-ed25519");
                want.extend_from_slice(&32u32.to_be_bytes());
                if blob.len() != want.len() + 32 || !blob.starts_with(&want) {
                    return Err(invalid());
                }
            }
            _ => return Err(invalid()),
        }
    }
    Ok(())
}

fn validate_vm(name: &str, body: &Value) -> Result<(), ArmError> {
    let props = body
        .get("properties")
        .ok_or_else(|| ArmError::missing("properties"))?;
    if str_at(props, &["hardwareProfile", "vmSize"]).is_none() {
        return Err(ArmError::missing("hardwareProfile.vmSize"));
    }
    let storage = props
        .get("storageProfile")
        .ok_or_else(|| ArmError::missing("storageProfile"))?;
    let os_create = str_at(storage, &["osDisk", "createOption"]).unwrap_or("FromImage");
    if eq_ci(os_create, "FromImage") {
        if storage.get("imageReference").is_none() {
            return Err(ArmError::missing("imageReference"));
        }
        let os_profile = props
            .get("osProfile")
            .ok_or_else(|| ArmError::missing("osProfile"))?;
        if os_profile.get("adminUsername").is_none() {
            return Err(ArmError::missing("adminUsername"));
        }
        let linux = os_profile.get("windowsConfiguration").is_none();
        let no_password = os_profile["linuxConfiguration"]["disablePasswordAuthentication"]
            .as_bool()
            .unwrap_or(false);
        if (!linux || !no_password) && os_profile.get("adminPassword").is_none() {
            return Err(ArmError::missing("adminPassword"));
        }
        if linux {
            validate_ssh_keys(os_profile, no_password)?;
        }
        if let Some(cd) = os_profile.get("customData") {
            let cd = cd.as_str().unwrap_or_default();
            if cd.len() > CUSTOM_DATA_MAX || STANDARD.decode(cd).is_err() {
                return Err(ArmError::new(
                    400,
                    "InvalidParameter",
                    format!(
                        "Custom data in OSProfile must be in Base64 encoding and with a maximum \
                         length of {CUSTOM_DATA_MAX} characters."
                    ),
                )
                .target("customData"));
            }
        }
    } else if eq_ci(os_create, "Attach") {
        if str_at(storage, &["osDisk", "managedDisk", "id"]).is_none() {
            return Err(ArmError::missing("osDisk.managedDisk.id"));
        }
    } else {
        return Err(ArmError::invalid("osDisk.createOption"));
    }
    let mut luns = BTreeSet::new();
    for disk in storage["dataDisks"].as_array().into_iter().flatten() {
        let lun = disk["lun"]
            .as_i64()
            .ok_or_else(|| ArmError::missing("dataDisk.lun"))?;
        if !(0..=63).contains(&lun) || !luns.insert(lun) {
            return Err(ArmError::invalid("dataDisk.lun"));
        }
        let create = disk["createOption"]
            .as_str()
            .ok_or_else(|| ArmError::missing("dataDisk.createOption"))?;
        if eq_ci(create, "Empty") {
            if disk.get("diskSizeGB").is_none() {
                return Err(ArmError::missing("dataDisk.diskSizeGB"));
            }
        } else if eq_ci(create, "Attach") {
            if str_at(disk, &["managedDisk", "id"]).is_none() {
                return Err(ArmError::missing("dataDisk.managedDisk.id"));
            }
        } else {
            return Err(ArmError::invalid("dataDisk.createOption"));
        }
    }
    let nics = props["networkProfile"]["networkInterfaces"]
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ArmError::missing("networkProfile"))?;
    for nic in nics {
        if nic["id"].as_str().is_none() {
            return Err(ArmError::missing("networkProfile.networkInterfaces.id"));
        }
    }
    let primaries = nics
        .iter()
        .filter(|n| n["properties"]["primary"] == json!(true))
        .count();
    if nics.len() > 1 && primaries != 1 {
        // Paraphrase of Compute's answer.
        return Err(ArmError::new(
            400,
            "InvalidParameter",
            format!("Virtual machine {name} must have one network interface set as the primary."),
        )
        .target("networkProfile.networkInterfaces"));
    }
    Ok(())
}

fn image_key(location: &str, urn: &str) -> String {
    format!("{location}/{}", urn.replace(':', "/")).to_ascii_lowercase()
}

fn agreement_key(publisher: &str, product: &str, plan: &str) -> String {
    format!("{publisher}/{product}/{plan}").to_ascii_lowercase()
}

/// `GET` of a marketplace image version.
fn vm_image(s: &Arc<Shared>, segs: &[&str]) -> Result<Reply, ArmError> {
    let (loc, publisher, offer, sku, version) = (segs[5], segs[7], segs[11], segs[13], segs[15]);
    let urn = format!("{publisher}:{offer}:{sku}:{version}");
    let w = s.lock();
    let Some(plan) = w.images.get(&image_key(loc, &urn)) else {
        return Err(ArmError::new(
            404,
            "NotFound",
            "Artifact: VMImage was not found.",
        ));
    };
    let mut properties = json!({
        "osDiskImage": {"operatingSystem": "Linux"},
        "hyperVGeneration": "V2",
        "architecture": "x64",
    });
    if let Some(plan) = plan {
        properties["plan"] = plan.clone();
    }
    Ok(Reply::json(
        200,
        json!({
            "name": version,
            "location": loc,
            "id": format!(
                "/Subscriptions/{}/Providers/Microsoft.Compute/Locations/{loc}/Publishers/{publisher}\
                 /ArtifactTypes/VMImage/Offers/{offer}/Skus/{sku}/Versions/{version}",
                s.subscription
            ),
            "properties": properties,
        }),
    ))
}

/// The signature the terms of a plan carry (what a `PUT` must send back).
fn agreement_signature(key: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(key, &mut h);
    format!("{:016X}", std::hash::Hasher::finish(&h))
}

/// `GET` and `PUT` of the marketplace terms of a plan (`agreements/current`): a `PUT` must carry
/// the signature the `GET` gave.
fn agreement_request(s: &Arc<Shared>, ctx: &Ctx, segs: &[&str]) -> Result<Reply, ArmError> {
    let (publisher, offer, plan) = (segs[7], segs[9], segs[11]);
    let k = agreement_key(publisher, offer, plan);
    let mut w = s.lock();
    let Some(accepted) = w.agreements.get(&k).copied() else {
        return Err(ArmError::new(
            404,
            "NotFound",
            format!(
                "Offer with PublisherId: '{publisher}', OfferId: '{offer}' cannot be purchased due to validation errors."
            ),
        ));
    };
    let signature = agreement_signature(&k);
    let terms = |accepted: bool| {
        json!({
            "id": format!(
                "/subscriptions/{}/providers/Microsoft.MarketplaceOrdering/offerTypes/VirtualMachine\
                 /publishers/{publisher}/offers/{offer}/plans/{plan}/agreements/current",
                s.subscription
            ),
            "name": plan,
            "type": "Microsoft.MarketplaceOrdering/offertypes",
            "properties": {
                "publisher": publisher,
                "product": offer,
                "plan": plan,
                "licenseTextLink": "https://mpcprodsa.blob.core.windows.net/legalterms/terms.txt",
                "privacyPolicyLink": "https://example.invalid/privacy",
                "retrieveDatetime": now_rfc3339(),
                "signature": signature,
                "accepted": accepted,
            },
        })
    };
    match ctx.method.as_str() {
        "GET" => Ok(Reply::json(200, terms(accepted))),
        "PUT" => {
            let body: Value = serde_json::from_slice(&ctx.body).map_err(|_| {
                ArmError::new(
                    400,
                    "InvalidRequestContent",
                    "The request content was invalid and could not be deserialized.",
                )
            })?;
            if body["properties"]["signature"].as_str() != Some(signature.as_str()) {
                return Err(ArmError::new(
                    400,
                    "BadRequest",
                    "The signature of the terms does not match: get the terms first.",
                ));
            }
            let accept = body["properties"]["accepted"].as_bool().unwrap_or(false);
            w.agreements.insert(k, accept);
            Ok(Reply::json(200, terms(accept)))
        }
        _ => Err(method_not_allowed(&ctx.method)),
    }
}

/// What Compute checks of a VM from a published marketplace image with a plan: the body's
/// `plan` names it, and its terms are accepted in the subscription. Images the test did not
/// publish are not checked.
fn check_marketplace(w: &World, sub: &str, name: &str, body: &Value) -> Result<(), ArmError> {
    let r = &body["properties"]["storageProfile"]["imageReference"];
    let (Some(publisher), Some(offer), Some(sku), Some(version)) = (
        r["publisher"].as_str(),
        r["offer"].as_str(),
        r["sku"].as_str(),
        r["version"].as_str(),
    ) else {
        return Ok(());
    };
    let location = body["location"].as_str().unwrap_or_default();
    let urn = format!("{publisher}:{offer}:{sku}:{version}");
    let Some(Some(plan)) = w.images.get(&image_key(location, &urn)) else {
        return Ok(());
    };
    let same = |a: &Value, b: &Value| {
        a.as_str()
            .zip(b.as_str())
            .is_some_and(|(a, b)| a.eq_ignore_ascii_case(b))
    };
    let sent = &body["plan"];
    if !["name", "product", "publisher"]
        .iter()
        .all(|f| same(&sent[*f], &plan[*f]))
    {
        return Err(ArmError::new(
            400,
            "VMMarketplaceInvalidInput",
            format!(
                "Creating a virtual machine from Marketplace image or a custom image sourced from \
                 a Marketplace image requires Plan information in the request. VM: '{name}'."
            ),
        ));
    }
    let k = agreement_key(
        plan["publisher"].as_str().unwrap_or_default(),
        plan["product"].as_str().unwrap_or_default(),
        plan["name"].as_str().unwrap_or_default(),
    );
    if !w.agreements.get(&k).copied().unwrap_or(false) {
        return Err(ArmError::new(
            400,
            "MarketplacePurchaseEligibilityFailed",
            format!(
                "Marketplace purchase eligibilty check returned errors. See inner errors for \
                 details. ; You have not accepted the legal terms on this subscription: '{}' \
                 for this plan. Before the subscription can be used, you need to accept the \
                 legal terms of the image.",
                sub
            ),
        ));
    }
    Ok(())
}

/// Checks a VM body against the current state and plans its effects (no mutation except names
/// and ids drawn from the random source). `direct`: planted by the test, references not checked
/// as strictly.
fn plan_vm(
    w: &mut World,
    sub: &str,
    rg: &str,
    name: &str,
    body: &Value,
    direct: bool,
) -> Result<VmPlan, ArmError> {
    validate_vm(name, body)?;
    if !direct {
        check_marketplace(w, sub, name, body)?;
    }
    let location = location_of(body)?;
    let k = key(rg, name);
    let existing = w
        .vms
        .get(&k)
        .map(|vm| (vm.json.clone(), vm.custom_data.clone()));
    let (vm_name, vm_id) = match &existing {
        Some((e, _)) => (
            e["name"].as_str().unwrap_or(name).to_owned(),
            e["id"].as_str().unwrap_or_default().to_owned(),
        ),
        None => (name.to_owned(), resource_id(sub, rg, VM_TYPE, name)),
    };
    let upper_rg = match parse_id(&vm_id) {
        Some(p) => p.rg.to_uppercase(),
        None => rg.to_uppercase(),
    };
    let compute_ref = |type_: &str, n: &str| resource_id(sub, &upper_rg, type_, n);
    let mut props = body["properties"].as_object().cloned().unwrap_or_default();
    for read_only in ["instanceView", "provisioningState", "vmId", "timeCreated"] {
        props.remove(read_only);
    }
    let user_data = props.remove("userData");

    // osProfile: write-only secrets out, defaults in.
    let mut custom_data = None;
    if let Some(os) = props.get_mut("osProfile").and_then(Value::as_object_mut) {
        custom_data = os
            .remove("customData")
            .and_then(|v| v.as_str().map(str::to_owned));
        os.remove("adminPassword");
        os.entry("computerName").or_insert(json!(vm_name));
        os.entry("secrets").or_insert(json!([]));
        os.entry("allowExtensionOperations").or_insert(json!(true));
        os.entry("requireGuestProvisionSignal")
            .or_insert(json!(true));
        if !os.contains_key("windowsConfiguration") {
            let linux = os
                .entry("linuxConfiguration")
                .or_insert(json!({}))
                .as_object_mut();
            if let Some(linux) = linux {
                linux
                    .entry("disablePasswordAuthentication")
                    .or_insert(json!(false));
                linux.entry("provisionVMAgent").or_insert(json!(true));
                linux.entry("patchSettings").or_insert(
                    json!({"patchMode": "ImageDefault", "assessmentMode": "ImageDefault"}),
                );
                linux
                    .entry("enableVMAgentPlatformUpdates")
                    .or_insert(json!(false));
            }
        }
    }
    if let Some((e, old_cd)) = &existing
        && e["properties"].get("osProfile").is_some()
        && custom_data.is_some()
        && &custom_data != old_cd
    {
        return Err(ArmError::new(
            409,
            "PropertyChangeNotAllowed",
            "Changing property 'customData' is not allowed.",
        )
        .target("customData"));
    }

    // Storage: OS disk and data disks get names, ids and defaults.
    let zones = body.get("zones").cloned();
    let old_storage = existing
        .as_ref()
        .map(|(e, _)| e["properties"]["storageProfile"].clone())
        .unwrap_or(Value::Null);
    let mut new_disks = Vec::new();
    let mut attached_after = Vec::new();
    let storage = props
        .get_mut("storageProfile")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ArmError::missing("storageProfile"))?;
    if let Some(image) = storage.get_mut("imageReference")
        && image.get("id").is_none()
        && image.get("communityGalleryImageId").is_none()
        && image.get("sharedGalleryImageId").is_none()
    {
        let version = image["version"].as_str().unwrap_or("latest").to_owned();
        let exact = if eq_ci(&version, "latest") {
            "1.0.20240101".to_owned()
        } else {
            version
        };
        image["exactVersion"] = json!(exact);
    }
    let image = storage.get("imageReference").cloned();
    let os_disk = storage.entry("osDisk").or_insert(json!({}));
    let os_create = os_disk["createOption"]
        .as_str()
        .unwrap_or("FromImage")
        .to_owned();
    os_disk["createOption"] = json!(os_create);
    let os_type = if body["properties"]["osProfile"]
        .get("windowsConfiguration")
        .is_some()
    {
        "Windows"
    } else {
        "Linux"
    };
    if os_disk.get("osType").is_none() {
        os_disk["osType"] = json!(os_type);
    }
    let old_os_name = old_storage["osDisk"]["name"].as_str().map(str::to_owned);
    let os_name = if eq_ci(&os_create, "Attach") {
        let id = str_at(os_disk, &["managedDisk", "id"]).unwrap_or_default();
        parse_id(id).map(|p| p.name).unwrap_or_default()
    } else {
        match (os_disk["name"].as_str(), &old_os_name) {
            (Some(n), Some(old)) if !eq_ci(n, old) => {
                return Err(ArmError::new(
                    409,
                    "PropertyChangeNotAllowed",
                    "Changing property 'osDisk.name' is not allowed.",
                )
                .target("osDisk.name"));
            }
            (Some(n), _) => n.to_owned(),
            (None, Some(old)) => old.clone(),
            (None, None) => format!("{vm_name}_OsDisk_1_{}", w.hex32()),
        }
    };
    os_disk["name"] = json!(os_name);
    if os_disk.get("caching").is_none() {
        os_disk["caching"] = json!("ReadWrite");
    }
    if os_disk.get("deleteOption").is_none() {
        os_disk["deleteOption"] = json!("Detach");
    }
    let os_size = os_disk["diskSizeGB"].as_i64().unwrap_or(30);
    os_disk["diskSizeGB"] = json!(os_size);
    let os_sku = str_at(os_disk, &["managedDisk", "storageAccountType"])
        .unwrap_or("Standard_LRS")
        .to_owned();
    os_disk["managedDisk"]["storageAccountType"] = json!(os_sku);
    os_disk["managedDisk"]["id"] = json!(compute_ref(DISK_TYPE, &os_name));
    let os_key = key(rg, &os_name);
    attached_after.push(os_key.clone());
    let old_disk_keys: Vec<Key> = disk_refs(&old_storage)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    if !old_disk_keys.contains(&os_key) {
        let creation = if eq_ci(&os_create, "Attach") {
            None
        } else {
            let image_ref = image
                .as_ref()
                .map(|i| image_creation_data(sub, &location, i));
            Some(new_disk(
                w,
                &resource_id(sub, rg, DISK_TYPE, &os_name),
                &os_name,
                &location,
                zones.as_ref(),
                &os_sku,
                os_size,
                Some(os_type),
                image_ref.unwrap_or(json!({"createOption": "FromImage"})),
                &vm_id,
            ))
        };
        new_disks.push((os_key, creation));
    }
    if let Some(data_disks) = storage.get_mut("dataDisks").and_then(Value::as_array_mut) {
        for disk in data_disks {
            let lun = disk["lun"].as_i64().unwrap_or_default();
            let create = disk["createOption"].as_str().unwrap_or("Empty").to_owned();
            let old = old_storage["dataDisks"]
                .as_array()
                .and_then(|a| a.iter().find(|d| d["lun"] == json!(lun)))
                .cloned();
            let disk_name = if eq_ci(&create, "Attach") {
                let id = str_at(disk, &["managedDisk", "id"]).unwrap_or_default();
                parse_id(id).map(|p| p.name).unwrap_or_default()
            } else {
                match (
                    disk["name"].as_str(),
                    old.as_ref().and_then(|o| o["name"].as_str()),
                ) {
                    (Some(n), _) => n.to_owned(),
                    (None, Some(old)) => old.to_owned(),
                    (None, None) => format!("{vm_name}_DataDisk_{lun}"),
                }
            };
            disk["name"] = json!(disk_name);
            if disk.get("caching").is_none() {
                disk["caching"] = json!("None");
            }
            if disk.get("deleteOption").is_none() {
                disk["deleteOption"] = json!("Detach");
            }
            disk["toBeDetached"] = json!(false);
            let sku = str_at(disk, &["managedDisk", "storageAccountType"])
                .unwrap_or("Standard_LRS")
                .to_owned();
            disk["managedDisk"]["storageAccountType"] = json!(sku);
            disk["managedDisk"]["id"] = json!(compute_ref(DISK_TYPE, &disk_name));
            let size = disk["diskSizeGB"].as_i64().unwrap_or(30);
            disk["diskSizeGB"] = json!(size);
            let dk = key(rg, &disk_name);
            attached_after.push(dk.clone());
            if !old_disk_keys.contains(&dk) {
                let creation = (!eq_ci(&create, "Attach")).then(|| {
                    new_disk(
                        w,
                        &resource_id(sub, rg, DISK_TYPE, &disk_name),
                        &disk_name,
                        &location,
                        zones.as_ref(),
                        &sku,
                        size,
                        None,
                        json!({"createOption": "Empty"}),
                        &vm_id,
                    )
                });
                new_disks.push((dk, creation));
            }
        }
    }
    storage.entry("diskControllerType").or_insert(json!("SCSI"));

    // Disk conflicts.
    for (dk, creation) in &new_disks {
        let current = w.disks.get(dk);
        match (creation, current) {
            (Some(_), Some(d)) if !direct => {
                let disk_name = d.json["name"].as_str().unwrap_or_default();
                let message = match d.json["managedBy"].as_str() {
                    Some(owner) => format!(
                        "A disk with name {disk_name} already exists in Resource Group {} and is \
                         attached to VM {owner}. 'Name' is an optional property for a disk and a \
                         unique name will be generated if not provided.",
                        rg.to_uppercase()
                    ),
                    None => format!(
                        "Disk {disk_name} already exists in resource group {}. Only \
                         CreateOption.Attach is supported.",
                        rg.to_uppercase()
                    ),
                };
                return Err(ArmError::new(409, "ConflictingUserInput", message));
            }
            (None, None) => {
                return Err(ArmError::new(
                    404,
                    "NotFound",
                    format!(
                        "Resource {} not found.",
                        resource_id(sub, rg, DISK_TYPE, &dk.1)
                    ),
                ));
            }
            (None, Some(d)) => {
                if let Some(owner) = d.json["managedBy"].as_str()
                    && !eq_ci(owner, &vm_id)
                {
                    // Paraphrase of Compute's answer for a disk attached elsewhere.
                    return Err(ArmError::new(
                        409,
                        "OperationNotAllowed",
                        format!(
                            "Disk {} is already attached to VM {owner}.",
                            d.json["name"].as_str().unwrap_or_default()
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    let old_disks = old_disk_keys
        .into_iter()
        .filter(|dk| !attached_after.contains(dk))
        .collect();

    // NICs.
    let refs = props
        .get("networkProfile")
        .and_then(|n| n["networkInterfaces"].as_array())
        .cloned()
        .unwrap_or_default();
    let single = refs.len() == 1;
    let mut nics = Vec::new();
    for r in &refs {
        let id = r["id"].as_str().unwrap_or_default();
        let parsed = parse_id(id).filter(|p| p.type_ == "microsoft.network/networkinterfaces");
        let not_found = || ArmError::new(404, "NotFound", format!("Resource {id} not found."));
        let Some(parsed) = parsed else {
            return Err(ArmError::new(
                400,
                "LinkedInvalidPropertyId",
                format!(
                    "Property id '{id}' at path 'properties.networkProfile.networkInterfaces.id' \
                     is invalid. Expect fully qualified resource Id that start with \
                     '/subscriptions/{{subscriptionId}}' or \
                     '/providers/{{resourceProviderNamespace}}/'."
                ),
            )
            .gateway());
        };
        if !eq_ci(&parsed.sub, sub) {
            return Err(not_found());
        }
        let nk = key(&parsed.rg, &parsed.name);
        match w.nics.get(&nk) {
            None if direct => continue,
            None => return Err(not_found()),
            Some(nic) => {
                if let Some(owner) = nic.json["properties"]["virtualMachine"]["id"].as_str()
                    && !eq_ci(owner, &compute_ref(VM_TYPE, &vm_name))
                    && !direct
                {
                    // Paraphrase of Compute's answer for a NIC another VM uses.
                    return Err(ArmError::new(
                        400,
                        "NicInUse",
                        format!(
                            "Network Interface {} is used by existing resource {owner}. A \
                             network interface can be attached to one virtual machine only.",
                            nic.json["id"].as_str().unwrap_or(id)
                        ),
                    ));
                }
                let state = nic.json["properties"]["provisioningState"]
                    .as_str()
                    .unwrap_or_default();
                if state != SUCCEEDED && !direct {
                    return Err(ArmError::new(
                        429,
                        "RetryableError",
                        "A retryable error occurred.",
                    )
                    .details(json!([{
                        "code": "ReferencedResourceNotProvisioned",
                        "message": format!(
                            "Cannot proceed with operation because resource {} used by resource \
                             {vm_id} is not in Succeeded state. Resource is in {state} state and \
                             the last operation that updated/is updating the resource is \
                             PutNicOperation.",
                            nic.json["id"].as_str().unwrap_or(id)
                        ),
                    }]))
                    .header("retry-after", w.retry_after.to_string()));
                }
            }
        }
        let primary = single || r["properties"]["primary"] == json!(true);
        nics.push((nk, primary));
    }
    let old_nics = existing
        .as_ref()
        .map(|(e, _)| nic_refs(e))
        .unwrap_or_default()
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| !nics.iter().any(|(n, _)| n == k))
        .collect();

    let mut json = json!({
        "name": vm_name,
        "id": vm_id,
        "type": VM_TYPE,
        "location": location,
    });
    for field in ["tags", "zones", "plan", "identity", "extendedLocation"] {
        if let Some(v) = body.get(field) {
            json[field] = v.clone();
        }
    }
    let (vm_uuid, created) = match &existing {
        Some((e, _)) => (
            e["properties"]["vmId"].clone(),
            e["properties"]["timeCreated"].clone(),
        ),
        None => (json!(w.uuid()), json!(now_rfc3339())),
    };
    props.insert("vmId".into(), vm_uuid);
    props.insert("timeCreated".into(), created);
    json["properties"] = Value::Object(props);
    Ok(VmPlan {
        json,
        custom_data,
        user_data,
        nics,
        old_nics,
        new_disks,
        old_disks,
    })
}

/// `creationData` of an OS disk made from `image`.
fn image_creation_data(sub: &str, location: &str, image: &Value) -> Value {
    if let Some(id) = image["id"].as_str() {
        return json!({"createOption": "FromImage", "imageReference": {"id": id}});
    }
    for gallery in ["communityGalleryImageId", "sharedGalleryImageId"] {
        if let Some(id) = image[gallery].as_str() {
            return json!({"createOption": "FromImage", "galleryImageReference": {gallery: id}});
        }
    }
    let part = |f: &str| image[f].as_str().unwrap_or_default().to_owned();
    json!({
        "createOption": "FromImage",
        "imageReference": {
            "id": format!(
                "/Subscriptions/{sub}/Providers/Microsoft.Compute/Locations/{location}/Publishers/{}/ArtifactTypes/VMImage/Offers/{}/Skus/{}/Versions/{}",
                part("publisher"),
                part("offer"),
                part("sku"),
                image["exactVersion"].as_str().unwrap_or("1.0.20240101"),
            )
        }
    })
}

/// Stores a planned VM in `state` and makes its attachments; returns the stored resource.
fn accept_vm(w: &mut World, sub: &str, rg: &str, name: &str, plan: VmPlan, state: &str) -> Value {
    let k = key(rg, name);
    let mut json = plan.json;
    json["properties"]["provisioningState"] = json!(state);
    let etag = w.next_etag();
    json["etag"] = json!(format!("\"{etag}\""));
    let vm_id = json["id"].as_str().unwrap_or_default().to_owned();
    let upper_ref = match parse_id(&vm_id) {
        Some(p) => resource_id(sub, &p.rg.to_uppercase(), VM_TYPE, &p.name),
        None => vm_id.clone(),
    };
    for nk in &plan.old_nics {
        if let Some(nic) = w.nics.get_mut(nk) {
            detach_nic(&mut nic.json, &vm_id);
        }
    }
    for (nk, primary) in &plan.nics {
        let mac = format!(
            "00-22-48-{:02X}-{:02X}-{:02X}",
            w.rand() % 256,
            w.rand() % 256,
            w.rand() % 256
        );
        if let Some(nic) = w.nics.get_mut(nk) {
            let props = &mut nic.json["properties"];
            props["virtualMachine"] = json!({"id": upper_ref});
            props["primary"] = json!(primary);
            if props.get("macAddress").is_none() {
                props["macAddress"] = json!(mac);
            }
        }
    }
    for dk in &plan.old_disks {
        if let Some(disk) = w.disks.get_mut(dk) {
            detach_disk(&mut disk.json, &vm_id);
        }
    }
    for (dk, creation) in plan.new_disks {
        match creation {
            Some(disk) => {
                w.disks.insert(
                    dk,
                    DiskRec {
                        json: disk,
                        busy: None,
                    },
                );
            }
            None => {
                if let Some(disk) = w.disks.get_mut(&dk) {
                    disk.json["managedBy"] = json!(vm_id);
                    disk.json["properties"]["diskState"] = json!("Attached");
                }
            }
        }
    }
    let (power, failure, busy) = match w.vms.get(&k) {
        Some(old) => (old.power.clone(), old.failure.clone(), old.busy.clone()),
        None => (
            (state == SUCCEEDED).then(|| "running".to_owned()),
            None,
            None,
        ),
    };
    let custom_data = match (plan.custom_data, w.vms.get(&k)) {
        (Some(cd), _) => Some(cd),
        (None, Some(old)) => old.custom_data.clone(),
        (None, None) => None,
    };
    let user_data = plan
        .user_data
        .or_else(|| w.vms.get(&k).and_then(|o| o.user_data.clone()));
    w.vms.insert(
        k,
        VmRec {
            json: json.clone(),
            busy,
            failure,
            power,
            custom_data,
            user_data,
        },
    );
    json
}

fn detach_nic(nic: &mut Value, vm_id: &str) {
    let props = &mut nic["properties"];
    let ours = props["virtualMachine"]["id"]
        .as_str()
        .is_some_and(|id| eq_ci(id, vm_id));
    if ours && let Some(p) = props.as_object_mut() {
        p.remove("virtualMachine");
        p.remove("macAddress");
        p.remove("primary");
    }
}

fn detach_disk(disk: &mut Value, vm_id: &str) {
    let ours = disk["managedBy"]
        .as_str()
        .is_some_and(|id| eq_ci(id, vm_id));
    if ours {
        if let Some(d) = disk.as_object_mut() {
            d.remove("managedBy");
        }
        disk["properties"]["diskState"] = json!("Unattached");
    }
}

/// The NICs a VM references: (key, deleteOption).
fn nic_refs(vm: &Value) -> Vec<(Key, String)> {
    vm["properties"]["networkProfile"]["networkInterfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let p = parse_id(r["id"].as_str()?)?;
            let option = r["properties"]["deleteOption"]
                .as_str()
                .unwrap_or("Detach")
                .to_owned();
            Some((key(&p.rg, &p.name), option))
        })
        .collect()
}

/// The managed disks of a storage profile: (key, deleteOption).
fn disk_refs(storage: &Value) -> Vec<(Key, String)> {
    let os = std::iter::once(&storage["osDisk"]);
    let data = storage["dataDisks"].as_array().into_iter().flatten();
    os.chain(data)
        .filter_map(|d| {
            let p = parse_id(d["managedDisk"]["id"].as_str()?)?;
            let option = d["deleteOption"].as_str().unwrap_or("Detach").to_owned();
            Some((key(&p.rg, &p.name), option))
        })
        .collect()
}

/// Removes a VM, deleting or detaching its NICs and disks by their `deleteOption`.
fn remove_vm(w: &mut World, k: &Key) -> Option<Value> {
    let rec = w.vms.remove(k)?;
    let vm_id = rec.json["id"].as_str().unwrap_or_default().to_owned();
    for (nk, option) in nic_refs(&rec.json) {
        if eq_ci(&option, "Delete") {
            w.nics.remove(&nk);
        } else if let Some(nic) = w.nics.get_mut(&nk) {
            detach_nic(&mut nic.json, &vm_id);
        }
    }
    for (dk, option) in disk_refs(&rec.json["properties"]["storageProfile"]) {
        if eq_ci(&option, "Delete") {
            w.disks.remove(&dk);
        } else if let Some(disk) = w.disks.get_mut(&dk) {
            detach_disk(&mut disk.json, &vm_id);
        }
    }
    Some(rec.json)
}

fn patch_vm(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    let body = ctx.json_body()?;
    check_tags(&body)?;
    let mut w = s.lock();
    let k = key(rg, name);
    let vm = w
        .vms
        .get(&k)
        .ok_or_else(|| ArmError::not_found(VM_TYPE, rg, name))?;
    check_preconditions(ctx, Some(vm))?;
    let state = vm.json["properties"]["provisioningState"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if state == "Deleting" {
        return Err(deleting_conflict(name, "Update VM"));
    }
    let mut json = vm.json.clone();
    let location = json["location"].as_str().unwrap_or_default().to_owned();
    if let Some(tags) = body.get("tags") {
        json["tags"] = tags.clone();
    }
    if let Some(props) = body.get("properties").and_then(Value::as_object) {
        for (field, value) in props {
            match field.as_str() {
                "storageProfile" => patch_storage(&mut json["properties"]["storageProfile"], value),
                "networkProfile" => patch_network(&mut json["properties"]["networkProfile"], value),
                "instanceView" | "provisioningState" | "vmId" | "timeCreated" => {}
                _ => merge(&mut json["properties"][field], value),
            }
        }
    }
    json["properties"]["provisioningState"] = json!(if state == "Creating" {
        "Creating"
    } else {
        "Updating"
    });
    let etag = w.next_etag();
    json["etag"] = json!(format!("\"{etag}\""));
    let running = w.vms.get(&k).and_then(|vm| vm.busy.clone());
    let inherited = w.preempt(running.as_ref());
    let op_id = start_operation(
        s,
        &mut w,
        OpNs::Compute,
        OpKind::Update,
        Target::Vm(k.clone()),
        &location,
        ctx.api_version(),
    );
    if let Some(op) = w.ops.get_mut(&op_id) {
        op.failure = inherited;
    }
    if let Some(vm) = w.vms.get_mut(&k) {
        vm.json = json.clone();
        vm.busy = Some(op_id.clone());
    }
    let op_url = async_operation_url(s, &w.ops[&op_id]);
    let retry_after = w.retry_after.to_string();
    drop(w);
    s.bump();
    Ok(Reply::json(200, json)
        .header("azure-asyncoperation", op_url)
        .header("retry-after", retry_after))
}

/// JSON merge patch (RFC 7386) without `null` deletions (they were stripped).
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        _ => *target = patch.clone(),
    }
}

fn patch_storage(storage: &mut Value, patch: &Value) {
    if let Some(option) = patch["osDisk"]["deleteOption"].as_str() {
        storage["osDisk"]["deleteOption"] = json!(option);
    }
    for disk in patch["dataDisks"].as_array().into_iter().flatten() {
        let Some(option) = disk["deleteOption"].as_str() else {
            continue;
        };
        if let Some(existing) = storage["dataDisks"]
            .as_array_mut()
            .and_then(|a| a.iter_mut().find(|d| d["lun"] == disk["lun"]))
        {
            existing["deleteOption"] = json!(option);
        }
    }
}

fn patch_network(network: &mut Value, patch: &Value) {
    for nic in patch["networkInterfaces"].as_array().into_iter().flatten() {
        let (Some(id), Some(option)) = (
            nic["id"].as_str(),
            nic["properties"]["deleteOption"].as_str(),
        ) else {
            continue;
        };
        if let Some(existing) = network["networkInterfaces"].as_array_mut().and_then(|a| {
            a.iter_mut()
                .find(|n| n["id"].as_str().is_some_and(|e| eq_ci(e, id)))
        }) {
            existing["properties"]["deleteOption"] = json!(option);
        }
    }
}

fn delete_vm(s: &Arc<Shared>, ctx: &Ctx, rg: &str, name: &str) -> Result<Reply, ArmError> {
    let mut w = s.lock();
    let k = key(rg, name);
    let Some(vm) = w.vms.get(&k) else {
        return Ok(Reply::empty(204));
    };
    let location = vm.json["location"].as_str().unwrap_or_default().to_owned();
    let deleting = vm.json["properties"]["provisioningState"] == "Deleting";
    let op_id = match vm.busy.clone() {
        Some(op) if deleting => op,
        running => {
            w.preempt(running.as_ref());
            let op = start_operation(
                s,
                &mut w,
                OpNs::Compute,
                OpKind::Delete,
                Target::Vm(k.clone()),
                &location,
                ctx.api_version(),
            );
            if let Some(vm) = w.vms.get_mut(&k) {
                vm.json["properties"]["provisioningState"] = json!("Deleting");
                vm.busy = Some(op.clone());
            }
            op
        }
    };
    let reply = accepted(s, &w, &op_id);
    drop(w);
    s.bump();
    Ok(reply)
}

fn iv_status(code: &str, display: &str, level: &str, time: Option<String>) -> Value {
    let mut v = json!({"code": code, "level": level, "displayStatus": display});
    if let Some(t) = time {
        v["time"] = json!(t);
    }
    v
}

/// `properties.instanceView` of a VM.
fn instance_view(vm: &VmRec) -> Value {
    let state = vm.json["properties"]["provisioningState"]
        .as_str()
        .unwrap_or_default();
    let now = now_rfc3339();
    let mut statuses = vec![match state {
        SUCCEEDED => iv_status(
            "ProvisioningState/succeeded",
            "Provisioning succeeded",
            "Info",
            Some(now.clone()),
        ),
        FAILED => {
            let (code, message) = vm.failure.clone().unwrap_or_default();
            let mut s = iv_status(
                &format!("ProvisioningState/failed/{code}"),
                "Provisioning failed",
                "Error",
                Some(now.clone()),
            );
            s["message"] = json!(message);
            s
        }
        other => iv_status(
            &format!("ProvisioningState/{}", other.to_lowercase()),
            other,
            "Info",
            None,
        ),
    }];
    if let Some(power) = &vm.power {
        statuses.push(iv_status(
            &format!("PowerState/{power}"),
            &format!("VM {power}"),
            "Info",
            None,
        ));
    }
    let storage = &vm.json["properties"]["storageProfile"];
    let disks: Vec<Value> = std::iter::once(&storage["osDisk"])
        .chain(storage["dataDisks"].as_array().into_iter().flatten())
        .filter_map(|d| d["name"].as_str())
        .map(|name| {
            json!({
                "name": name,
                "statuses": [iv_status(
                    "ProvisioningState/succeeded",
                    "Provisioning succeeded",
                    "Info",
                    Some(now.clone()),
                )],
            })
        })
        .collect();
    json!({
        "computerName": vm.json["properties"]["osProfile"]["computerName"],
        "hyperVGeneration": "V2",
        "disks": disks,
        "statuses": statuses,
    })
}
