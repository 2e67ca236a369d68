//! A stateful fake of the Compute Engine REST API v1 (instances and zone operations) for tests.
//!
//! [`FakeCompute::start`] serves the paths of `https://compute.googleapis.com/compute/v1/...`
//! on 127.0.0.1 and a free port. Point the official `google-cloud-compute-v1` client at it with
//! `with_endpoint(fake.url())` and service-account credentials built from
//! [`service_account_json`]; the server stops when the handle is dropped.
//!
//! # Endpoints (base `/compute/v1/projects/{project}`)
//!
//! - `POST /zones/{zone}/instances?requestId=` (insert), `GET /zones/{zone}/instances`
//!   (list: `filter`, `maxResults`, `pageToken`, `orderBy`), `GET|DELETE
//!   /zones/{zone}/instances/{instance}` (by name or numeric id), `GET /aggregated/instances`,
//!   `GET /zones/{zone}/operations/{operation}` and `POST .../operations/{operation}/wait`.
//!
//! # What it mimics faithfully
//!
//! - Authentication: every request needs `Authorization: Bearer <JWT>` whose payload `iss` is the
//!   configured service account (the self-signed JWT `google-cloud-auth` makes), not expired, with
//!   a `cloud-platform`/`compute` scope (or a compute audience). Failures are the front end's
//!   (ESF) errors: 401 `UNAUTHENTICATED` with `errors[0].reason` `required`/`authError`, an
//!   `ErrorInfo` detail (`CREDENTIALS_MISSING`, `ACCESS_TOKEN_TYPE_UNSUPPORTED`,
//!   `ACCESS_TOKEN_EXPIRED`) and `WWW-Authenticate`; 403 `ACCESS_TOKEN_SCOPE_INSUFFICIENT`. The
//!   signature is not verified.
//! - Error bodies of the GCE back end: `{"error": {"code", "message", "errors": [{"message",
//!   "domain", "reason"}]}}` *without* `status` and `details`, as GCE sends them (so the Rust
//!   client reports `Code::Unknown` and the reason as an `ErrorInfo` built from `errors[0]`).
//!   Errors of the front end (auth, rate limits) carry `status` and `details`, as ESF does.
//! - Insert validation: `name` (RFC 1035), `machineType` (required; partial or full URL in the
//!   request's zone), exactly one boot disk with a source, at least one network interface, label
//!   keys and values, network tags, metadata keys (format, duplicates, 512 KB). 409
//!   `alreadyExists` for a taken name (also while it is being deleted). `requestId` must be a UUID;
//!   a `requestId` seen before returns the very same operation (in its current state), whatever
//!   the request, and creates nothing.
//! - Server-side fields: `id` (uint64 as string), `selfLink`, `creationTimestamp` (RFC 3339 with
//!   the -07:00 offset GCE uses), `zone` URL, `machineType`/`network`/`subnetwork`/disk URLs
//!   normalised to full URLs, `networkIP` (unique 10.128.x.y), `nic0..`, `natIP` (unique 34.x)
//!   for requested access configs, boot disk `persistent-disk-0` named after the instance,
//!   `metadata.fingerprint`, `tags.fingerprint`, `labelFingerprint` (URL-safe base64, which is
//!   what the client decodes), `scheduling` defaults, `cpuPlatform`, `lastStartTimestamp`.
//!   Disks (not local SSDs) are resources of their own ([`FakeCompute::disks`]): deleting an
//!   instance deletes its
//!   `autoDelete` disks and leaves the others (a leak a driver must avoid); reusing a leftover
//!   disk's name fails the insert operation with `RESOURCE_ALREADY_EXISTS`.
//! - Asynchronous operations: insert returns an operation `PENDING`; after half the delay it is
//!   `RUNNING` (instance `PROVISIONING` → `STAGING`), after the delay `DONE` with `endTime`
//!   (instance `RUNNING`). Delete: instance `STOPPING` at once, gone when the operation is
//!   `DONE`. Operation names `operation-<millis>-<hex>-<hex>-<hex>`, `zone`/`targetLink`/
//!   `selfLink` full URLs, `targetId`, `user`, `clientOperationId` = `requestId`.
//! - A second delete (or any delete) while an operation on the instance is still running gets
//!   400 `resourceNotReady` ("The resource '...' is not ready"), which is what GCE answers for a
//!   resource with an operation in progress.
//! - Lists: `items` omitted when empty, sorted by name (or `orderBy=creationTimestamp desc`),
//!   `maxResults` 0..=500 (default 500), opaque `nextPageToken`; aggregated lists key every known
//!   zone as `zones/<zone>`, zones without results on the page carrying the
//!   `NO_RESULTS_ON_PAGE` warning; pagination runs across zones.
//! - Filters: `field = value`, `!=`, `:` (`labels.k:*` = has label), `<`, `<=`, `>`, `>=`, the
//!   regular-expression form `field eq re` / `field ne re` (full match), quoted or bare values,
//!   `*` wildcards with `=`, nested fields (`labels.k`, `scheduling.preemptible`,
//!   `networkInterfaces.networkIP`), `AND`, `OR`, `NOT`, parentheses; juxtaposed expressions are
//!   ANDed. Anything else (unknown field, dangling operator, bad regex) → 400 `invalid`.
//! - Faults: [`Fault`] for inserts, [`FakeCompute::throttle_next`] and
//!   [`FakeCompute::unavailable_next`] for any request. Operation failures (quota, stock-out)
//!   leave no instance behind.
//!
//! # What it simplifies
//!
//! - One project; another project in the path gets 403 `forbidden` ("Required
//!   'compute.instances.get' permission for ..."). Zones: a fixed set of real zones
//!   ([`DEFAULT_ZONES`]) plus [`FakeCompute::add_zone`]; others get 400 "Unknown zone.".
//! - Machine types, images, networks and subnetworks are not checked for existence; `source`
//!   disks are attached as given; explicit `networkIP`s are not checked for clashes; no
//!   deletion protection; `requestId`s never expire; message texts are close to GCE's, not
//!   byte-identical. The `wait` call returns after [`FakeCompute::set_wait_timeout`] (2 s by
//!   default) instead of GCE's 2 minutes. `returnPartialSuccess`, `includeAllScopes` and
//!   `serviceProjectNumber` are accepted and ignored.
//!
//! # The test key
//!
//! `test-sa-key.pem` next to this file is a throwaway 2048-bit RSA key generated for these tests
//! only (`openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048`). It belongs to no real
//! service account and grants nothing anywhere; the client needs a real key only because it
//! signs its JWTs locally.
#![allow(dead_code)]

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

/// The prefix of the resource URLs GCE returns (`selfLink`, `zone`, `targetLink`, ...).
pub const API_BASE: &str = "https://www.googleapis.com/compute/v1";

/// The throwaway test RSA key (PKCS#8 PEM) used by [`service_account_json`]; see the module docs.
pub const TEST_SA_PRIVATE_KEY: &str = include_str!("test-sa-key.pem");

/// The zones the fake knows from the start (real GCE zones); [`FakeCompute::add_zone`] adds more.
pub const DEFAULT_ZONES: &[&str] = &[
    "asia-southeast1-a",
    "asia-southeast1-b",
    "europe-west1-b",
    "europe-west1-c",
    "europe-west1-d",
    "europe-west3-a",
    "europe-west3-b",
    "europe-west3-c",
    "europe-west4-a",
    "europe-west4-b",
    "us-central1-a",
    "us-central1-b",
    "us-central1-c",
    "us-central1-f",
    "us-east1-b",
    "us-east1-c",
];

/// How long an operation takes by default.
pub const DEFAULT_OPERATION_DELAY: Duration = Duration::from_millis(300);
/// How long `operations/{op}/wait` waits by default (GCE waits up to 2 minutes).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(2);

const MAX_RESULTS: usize = 500;
const NAME_REGEX: &str = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)";
const RESOURCE_PARAM_REGEX: &str = "[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19}";
const METADATA_MAX_BYTES: usize = 512 * 1024;
const SCOPES_ACCEPTED: &[&str] = &[
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/compute",
];

/// The service-account key JSON (as downloaded from IAM) for `email` in `project`, with the
/// throwaway [`TEST_SA_PRIVATE_KEY`]; feed it to
/// `google_cloud_auth::credentials::service_account::Builder::new`.
pub fn service_account_json(project: &str, email: &str) -> Value {
    json!({
        "type": "service_account",
        "project_id": project,
        "private_key_id": "5f0c6b1a2d3e4f5061728394a5b6c7d8e9f0a1b2",
        "private_key": TEST_SA_PRIVATE_KEY,
        "client_email": email,
        "client_id": "109876543210987654321",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": "https://oauth2.googleapis.com/token",
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": format!(
            "https://www.googleapis.com/robot/v1/metadata/x509/{}",
            email.replace('@', "%40")
        ),
        "universe_domain": "googleapis.com",
    })
}

/// An unsigned bearer token the fake accepts for `email` (it does not verify signatures): for
/// raw HTTP requests in tests that do not go through the client.
pub fn test_bearer_token(email: &str) -> String {
    let now = unix_secs();
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": "test"});
    let claims = json!({
        "iss": email,
        "sub": email,
        "scope": SCOPES_ACCEPTED[0],
        "iat": now,
        "exp": now + 3600,
    });
    format!(
        "{}.{}.c2lnbmF0dXJl",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

/// A fault injected into the next insert(s) ([`FakeCompute::fail_next_inserts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The insert is accepted (operation, instance `PROVISIONING`), then the operation ends `DONE`
    /// with `error.errors[0].code = "QUOTA_EXCEEDED"` ("Quota 'CPUS' exceeded.  Limit: 24.0 in
    /// region <r>.", a `quotaInfo` error detail), `httpErrorStatusCode` 403 and
    /// `httpErrorMessage` `FORBIDDEN`; the instance is gone afterwards.
    Quota,
    /// Like [`Fault::Quota`] with `ZONE_RESOURCE_POOL_EXHAUSTED` ("The zone 'projects/p/zones/z'
    /// does not have enough resources available to fulfill the request.  Try a different zone,
    /// or try again later."), `httpErrorStatusCode` 503, `SERVICE UNAVAILABLE`.
    ZoneExhausted,
    /// The insert is rejected at once: HTTP 403, reason `quotaExceeded` (domain `usageLimits`),
    /// as GCE does for quotas it checks before accepting the request.
    QuotaRejected,
    /// The insert is rejected at once: HTTP 429 from the front end (`status`
    /// `RESOURCE_EXHAUSTED`, `errors[0].reason` `rateLimitExceeded`, `ErrorInfo` reason
    /// `RATE_LIMIT_EXCEEDED`) with a `Retry-After` header.
    RateLimited {
        /// The `Retry-After` header value, in seconds.
        retry_after_secs: u64,
    },
    /// The insert is rejected at once with HTTP 403 for Compute's per-project rate limit
    /// (`status` `PERMISSION_DENIED`, `errors[0].reason` `rateLimitExceeded`, `ErrorInfo` reason
    /// `RATE_LIMIT_EXCEEDED`), as the Compute API answers it, with a `Retry-After` header.
    RateLimitedForbidden {
        /// The `Retry-After` header value, in seconds.
        retry_after_secs: u64,
    },
    /// The insert is rejected at once: HTTP 503, reason `backendError`, no `status`.
    Unavailable,
}

impl Fault {
    /// Whether the fault rejects the request itself (rather than failing its operation).
    pub fn is_synchronous(&self) -> bool {
        !matches!(self, Fault::Quota | Fault::ZoneExhausted)
    }
}

/// One request the fake received (after authentication was checked).
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// `GET`, `POST`, `DELETE`, ...
    pub method: String,
    /// The URL path, e.g. `/compute/v1/projects/p/zones/z/instances`.
    pub path: String,
    /// The query parameters in order (`$alt=json`, `requestId`, `filter`, ...).
    pub query: Vec<(String, String)>,
    /// The request headers (lower-case names) except `authorization`.
    pub headers: BTreeMap<String, String>,
    /// The `iss` of the bearer JWT when authentication succeeded.
    pub principal: Option<String>,
    /// The JSON body, if the request had one.
    pub body: Option<Value>,
    /// The HTTP status the fake answered.
    pub status: u16,
}

impl RequestRecord {
    /// The first value of query parameter `name`.
    pub fn query_param(&self, name: &str) -> Option<&str> {
        query_param(&self.query, name)
    }
}

/// The running fake; the server and its operation tasks stop when this is dropped.
pub struct FakeCompute {
    shared: Arc<Shared>,
    url: String,
    server: JoinHandle<()>,
}

impl Drop for FakeCompute {
    fn drop(&mut self) {
        self.server.abort();
        for task in lock(&self.shared.tasks).drain(..) {
            task.abort();
        }
    }
}

impl FakeCompute {
    /// Starts a fake for `project` that accepts bearer JWTs issued by `sa_email`.
    pub async fn start(project: &str, sa_email: &str) -> FakeCompute {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0 for the fake Compute API");
        let addr = listener.local_addr().expect("local address of the fake");
        let shared = Arc::new(Shared::new(project, sa_email));
        let app = router(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeCompute {
            shared,
            url: format!("http://{addr}"),
            server,
        }
    }

    /// The endpoint for the client's `with_endpoint`, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The project the fake serves.
    pub fn project(&self) -> &str {
        &self.shared.project
    }

    /// The service account whose JWTs the fake accepts.
    pub fn sa_email(&self) -> &str {
        &self.shared.sa_email
    }

    /// How long operations started from now on take to reach `DONE` (default 300 ms).
    pub fn set_operation_delay(&self, delay: Duration) {
        self.shared.lock().op_delay = delay;
    }

    /// How long `operations/{op}/wait` waits for `DONE` before answering (default 2 s).
    pub fn set_wait_timeout(&self, timeout: Duration) {
        self.shared.lock().wait_timeout = timeout;
    }

    /// Freezes all operations in their current state (instances stay `PROVISIONING`/`STOPPING`)
    /// until [`FakeCompute::resume_operations`]; for deterministic in-flight states.
    pub fn pause_operations(&self) {
        self.shared.lock().paused = true;
        self.shared.bump();
    }

    /// Lets paused operations continue (each finishes its remaining delay, if any).
    pub fn resume_operations(&self) {
        self.shared.lock().paused = false;
        self.shared.bump();
    }

    /// Makes the next `n` inserts fail with `fault` (queued after faults already pending).
    /// Synchronous faults hit the next insert requests; [`Fault::Quota`] and
    /// [`Fault::ZoneExhausted`] hit the next inserts that pass validation.
    pub fn fail_next_inserts(&self, n: usize, fault: Fault) {
        let mut w = self.shared.lock();
        w.insert_faults.extend(std::iter::repeat_n(fault, n));
    }

    /// Answers the next `n` authenticated requests of any kind with 429 `rateLimitExceeded` and
    /// `Retry-After: 1` (see [`FakeCompute::throttle_next_with`]).
    pub fn throttle_next(&self, n: usize) {
        self.throttle_next_with(n, 1);
    }

    /// Like [`FakeCompute::throttle_next`] with `Retry-After: retry_after_secs`.
    pub fn throttle_next_with(&self, n: usize, retry_after_secs: u64) {
        let mut w = self.shared.lock();
        let fault = Fault::RateLimited { retry_after_secs };
        w.request_faults.extend(std::iter::repeat_n(fault, n));
    }

    /// Answers the next `n` authenticated requests of any kind with 503 `backendError` (which the
    /// client's default retry policy retries for GET and DELETE).
    pub fn unavailable_next(&self, n: usize) {
        let mut w = self.shared.lock();
        w.request_faults
            .extend(std::iter::repeat_n(Fault::Unavailable, n));
    }

    /// Adds a zone the fake accepts (and lists in aggregated lists).
    pub fn add_zone(&self, zone: &str) {
        self.shared.lock().zones.insert(zone.to_owned());
        self.shared.bump();
    }

    /// The known zones, sorted.
    pub fn zones(&self) -> Vec<String> {
        self.shared.lock().zones.iter().cloned().collect()
    }

    /// All instances of all zones, as the API returns them, sorted by zone and name.
    pub fn instances(&self) -> Vec<Value> {
        let w = self.shared.lock();
        w.instances.values().map(|r| r.json.clone()).collect()
    }

    /// The instance `name` in `zone`, as the API returns it.
    pub fn instance(&self, zone: &str, name: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.instances
            .get(&(zone.to_owned(), name.to_owned()))
            .map(|r| r.json.clone())
    }

    /// All disks of all zones, sorted by zone and name.
    pub fn disks(&self) -> Vec<Value> {
        self.shared.lock().disks.values().cloned().collect()
    }

    /// All operations the fake has created (in no particular order).
    pub fn operations(&self) -> Vec<Value> {
        let w = self.shared.lock();
        w.operations.values().map(|o| o.json.clone()).collect()
    }

    /// The operation `name` of `zone`.
    pub fn operation(&self, zone: &str, name: &str) -> Option<Value> {
        let w = self.shared.lock();
        w.operations
            .get(name)
            .filter(|o| o.zone == zone)
            .map(|o| o.json.clone())
    }

    /// Plants an instance in `zone` without an API call or operation (e.g. an orphan VM): the
    /// server-side fields are filled as for an insert; `status` defaults to `RUNNING`. Its disks
    /// (from `initializeParams`) are created too. Returns the stored instance.
    ///
    /// Panics if `instance` has no `name` or the name is taken in `zone`.
    pub fn insert_instance_directly(&self, zone: &str, instance: Value) -> Value {
        let mut w = self.shared.lock();
        let name = instance
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        assert!(!name.is_empty(), "insert_instance_directly needs a name");
        let key = (zone.to_owned(), name);
        assert!(
            !w.instances.contains_key(&key),
            "instance {key:?} exists already"
        );
        let status = instance
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("RUNNING")
            .to_owned();
        w.zones.insert(zone.to_owned());
        let project = self.shared.project.clone();
        let (json, disks) = build_instance(&mut w, &project, zone, &instance, &status);
        for (disk, body) in disks {
            w.disks.insert((zone.to_owned(), disk), body);
        }
        w.instances.insert(
            key,
            InstanceRec {
                json: json.clone(),
                busy: None,
            },
        );
        drop(w);
        self.shared.bump();
        json
    }

    /// Sets the `status` of an instance (e.g. `TERMINATED` after a preemption); returns whether
    /// the instance exists.
    pub fn set_instance_status(&self, zone: &str, name: &str, status: &str) -> bool {
        let mut w = self.shared.lock();
        let Some(rec) = w.instances.get_mut(&(zone.to_owned(), name.to_owned())) else {
            return false;
        };
        rec.json["status"] = json!(status);
        match status {
            "TERMINATED" | "STOPPED" | "SUSPENDED" => {
                rec.json["lastStopTimestamp"] = json!(now_timestamp());
            }
            "RUNNING" => rec.json["lastStartTimestamp"] = json!(now_timestamp()),
            _ => {}
        }
        drop(w);
        self.shared.bump();
        true
    }

    /// Removes an instance out of band (as if someone deleted it in the console), with its
    /// `autoDelete` disks; returns it.
    pub fn remove_instance_directly(&self, zone: &str, name: &str) -> Option<Value> {
        let mut w = self.shared.lock();
        let removed = remove_instance(&mut w, &(zone.to_owned(), name.to_owned()));
        drop(w);
        self.shared.bump();
        removed
    }

    /// Every request received so far, in order.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.shared.lock().log.clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_request_log(&self) {
        self.shared.lock().log.clear();
    }

    /// How many instances list and aggregated-list responses carried so far, all pages
    /// together (what a caller had to read).
    pub fn instances_listed(&self) -> usize {
        self.shared.lock().instances_listed
    }

    /// How many inserts of instance `name` were accepted (each created an operation; replays of
    /// a `requestId`, rejected and failed-validation requests do not count).
    pub fn insert_count(&self, name: &str) -> usize {
        self.shared
            .lock()
            .insert_counts
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// [`FakeCompute::insert_count`] for every instance name.
    pub fn insert_counts(&self) -> BTreeMap<String, usize> {
        self.shared.lock().insert_counts.clone()
    }

    /// Waits until `condition` holds, re-checking on every state change of the fake (no
    /// polling); returns whether it held before `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut condition: impl FnMut(&FakeCompute) -> bool,
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

struct Shared {
    project: String,
    sa_email: String,
    world: Mutex<World>,
    /// Bumped on every state change (operations progressing, instances appearing, ...).
    changed: watch::Sender<u64>,
    tasks: Mutex<Vec<AbortHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn new(project: &str, sa_email: &str) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        Shared {
            project: project.to_owned(),
            sa_email: sa_email.to_owned(),
            world: Mutex::new(World {
                op_delay: DEFAULT_OPERATION_DELAY,
                wait_timeout: DEFAULT_WAIT_TIMEOUT,
                paused: false,
                zones: DEFAULT_ZONES.iter().map(|z| (*z).to_owned()).collect(),
                instances: BTreeMap::new(),
                disks: BTreeMap::new(),
                operations: BTreeMap::new(),
                request_ids: HashMap::new(),
                insert_faults: VecDeque::new(),
                request_faults: VecDeque::new(),
                log: Vec::new(),
                instances_listed: 0,
                insert_counts: BTreeMap::new(),
                next_ip: 2,
                next_nat_ip: 2,
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

    /// Moves operation `op_name` to `RUNNING` (`done == false`) or `DONE`, with its effects.
    fn advance(&self, op_name: &str, done: bool) {
        let mut w = self.lock();
        let Some(op) = w.operations.get(op_name) else {
            return;
        };
        let key = (op.zone.clone(), op.target.clone());
        let (kind, target_id, failed) = (op.kind, op.target_id.clone(), op.failure.is_some());
        let same_instance = |w: &World| {
            w.instances
                .get(&key)
                .is_some_and(|r| r.json["id"] == json!(target_id))
        };
        let now = now_timestamp();
        if !done {
            if same_instance(&w)
                && let Some(rec) = w.instances.get_mut(&key)
                && kind == OpKind::Insert
                && rec.json["status"] == "PROVISIONING"
            {
                rec.json["status"] = json!("STAGING");
            }
            if let Some(op) = w.operations.get_mut(op_name) {
                op.json["status"] = json!("RUNNING");
                op.json["progress"] = json!(50);
                op.json["startTime"] = json!(now);
            }
        } else {
            match kind {
                OpKind::Insert if failed => {
                    if same_instance(&w) {
                        w.instances.remove(&key);
                    }
                    let zone = key.0.clone();
                    let created = w.operations[op_name].disks.clone();
                    for disk in created {
                        w.disks.remove(&(zone.clone(), disk));
                    }
                }
                OpKind::Insert => {
                    if same_instance(&w)
                        && let Some(rec) = w.instances.get_mut(&key)
                    {
                        if matches!(
                            rec.json["status"].as_str(),
                            Some("PROVISIONING" | "STAGING")
                        ) {
                            rec.json["status"] = json!("RUNNING");
                            rec.json["lastStartTimestamp"] = json!(now);
                            rec.json["cpuPlatform"] = json!("Intel Broadwell");
                        }
                        if rec.busy.as_deref() == Some(op_name) {
                            rec.busy = None;
                        }
                    }
                }
                OpKind::Delete => {
                    if same_instance(&w) {
                        remove_instance(&mut w, &key);
                    }
                }
            }
            if let Some(op) = w.operations.get_mut(op_name) {
                op.json["status"] = json!("DONE");
                op.json["progress"] = json!(100);
                op.json["endTime"] = json!(now);
                if op.json.get("startTime").is_none() {
                    op.json["startTime"] = json!(now);
                }
                if let Some(f) = &op.failure {
                    let mut item = json!({"code": f.code, "message": f.message});
                    if let Some(details) = &f.details {
                        item["errorDetails"] = details.clone();
                    }
                    op.json["error"] = json!({"errors": [item]});
                    op.json["httpErrorStatusCode"] = json!(f.http_status);
                    op.json["httpErrorMessage"] = json!(f.http_message);
                }
            }
        }
        drop(w);
        self.bump();
    }
}

struct World {
    op_delay: Duration,
    wait_timeout: Duration,
    paused: bool,
    zones: BTreeSet<String>,
    /// By (zone, name): the natural order of lists and aggregated lists.
    instances: BTreeMap<(String, String), InstanceRec>,
    disks: BTreeMap<(String, String), Value>,
    operations: BTreeMap<String, OpRec>,
    /// requestId → operation name.
    request_ids: HashMap<String, String>,
    insert_faults: VecDeque<Fault>,
    request_faults: VecDeque<Fault>,
    log: Vec<RequestRecord>,
    insert_counts: BTreeMap<String, usize>,
    /// Instances sent back in list and aggregated-list responses, all pages together.
    instances_listed: usize,
    next_ip: u32,
    next_nat_ip: u32,
    rng: u64,
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

    /// A 19-digit resource id, as a string (GCE's uint64 JSON encoding).
    fn new_id(&mut self) -> String {
        (1_000_000_000_000_000_000 + self.rand() % 9_000_000_000_000_000_000).to_string()
    }

    /// URL-safe base64 with padding, as GCE sends fingerprints (and the client decodes them).
    fn fingerprint(&mut self) -> String {
        URL_SAFE.encode(self.rand().to_be_bytes())
    }

    fn operation_name(&mut self) -> String {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        format!(
            "operation-{millis}-{:013x}-{:08x}-{:08x}",
            self.rand() & 0x1f_ffff_ffff_ffff,
            self.rand() as u32,
            self.rand() as u32
        )
    }

    fn allocate_ip(&mut self) -> String {
        loop {
            let n = self.next_ip;
            self.next_ip += 1;
            let (b, c, d) = ((n >> 16) & 0x3f, (n >> 8) & 0xff, n & 0xff);
            if d > 1 && d < 255 {
                return format!("10.{}.{c}.{d}", 128 + b);
            }
        }
    }

    fn allocate_nat_ip(&mut self) -> String {
        loop {
            let n = self.next_nat_ip;
            self.next_nat_ip += 1;
            let (b, c, d) = ((n >> 16) & 0x3f, (n >> 8) & 0xff, n & 0xff);
            if d > 0 && d < 255 {
                return format!("34.{}.{c}.{d}", 100 + b);
            }
        }
    }
}

struct InstanceRec {
    json: Value,
    /// The operation (insert or delete) still running on the instance.
    busy: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Insert,
    Delete,
}

struct OpRec {
    zone: String,
    kind: OpKind,
    /// The instance name.
    target: String,
    target_id: String,
    json: Value,
    failure: Option<OpFailure>,
    /// Disks the insert created (removed again if it fails).
    disks: Vec<String>,
}

struct OpFailure {
    code: String,
    message: String,
    http_status: u16,
    http_message: &'static str,
    details: Option<Value>,
}

fn remove_instance(w: &mut World, key: &(String, String)) -> Option<Value> {
    let rec = w.instances.remove(key)?;
    let self_link = rec.json["selfLink"].clone();
    for disk in rec.json["disks"].as_array().into_iter().flatten() {
        let Some(disk_name) = disk["source"].as_str().and_then(|s| s.rsplit('/').next()) else {
            continue;
        };
        let disk_key = (key.0.clone(), disk_name.to_owned());
        if disk["autoDelete"] == json!(true) {
            w.disks.remove(&disk_key);
        } else if let Some(d) = w.disks.get_mut(&disk_key)
            && let Some(users) = d["users"].as_array_mut()
        {
            users.retain(|u| *u != self_link);
        }
    }
    Some(rec.json)
}

fn spawn_operation(s: &Arc<Shared>, op_name: String, delay: Duration) {
    let shared = Arc::clone(s);
    let task = tokio::spawn(async move {
        let first = delay / 2;
        tokio::time::sleep(first).await;
        shared.until_resumed().await;
        shared.advance(&op_name, false);
        tokio::time::sleep(delay.saturating_sub(first)).await;
        shared.until_resumed().await;
        shared.advance(&op_name, true);
    });
    let mut tasks = lock(&s.tasks);
    tasks.retain(|t| !t.is_finished());
    tasks.push(task.abort_handle());
}

// ---------------------------------------------------------------------------------------------
// Time and URLs
// ---------------------------------------------------------------------------------------------

fn unix_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// RFC 3339 with milliseconds in the -07:00 offset, like GCE's `creationTimestamp`.
fn now_timestamp() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64 - 7 * 3600;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}-07:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn zone_url(project: &str, zone: &str) -> String {
    format!("{API_BASE}/projects/{project}/zones/{zone}")
}

fn region_of(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(r, _)| r)
}

/// A full resource URL from a full or partial one (`zones/z/...`, `projects/p/...`).
fn normalize_url(project: &str, value: &str) -> String {
    for prefix in [
        "https://www.googleapis.com/compute/v1/",
        "https://compute.googleapis.com/compute/v1/",
    ] {
        if let Some(rest) = value.strip_prefix(prefix) {
            return format!("{API_BASE}/{rest}");
        }
    }
    if value.starts_with("https://") || value.starts_with("http://") {
        return value.to_owned();
    }
    let value = value.trim_start_matches('/');
    if value.starts_with("projects/") {
        format!("{API_BASE}/{value}")
    } else {
        format!("{API_BASE}/projects/{project}/{value}")
    }
}

fn query_param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// An error response in GCE's or the front end's JSON shape.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
    www_authenticate: bool,
}

impl ApiError {
    /// A GCE back-end error: `code`, `message`, `errors[]`; no `status`, no `details`.
    fn gce(code: u16, domain: &str, reason: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError {
            status: StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: json!({"error": {
                "code": code,
                "message": message,
                "errors": [{"message": message, "domain": domain, "reason": reason}],
            }}),
            retry_after: None,
            www_authenticate: false,
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::gce(400, "global", "invalid", message)
    }

    fn required(field: &str) -> Self {
        Self::gce(
            400,
            "global",
            "required",
            format!("Required field '{field}' not specified"),
        )
    }

    fn not_found(resource: &str) -> Self {
        Self::gce(
            404,
            "global",
            "notFound",
            format!("The resource '{resource}' was not found"),
        )
    }

    /// A front-end (ESF) error: also `status` and an `ErrorInfo` detail.
    fn frontend(
        code: u16,
        status: &str,
        message: &str,
        item: Value,
        info_reason: &str,
        metadata: Value,
    ) -> Self {
        ApiError {
            status: StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: json!({"error": {
                "code": code,
                "message": message,
                "errors": [item],
                "status": status,
                "details": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": info_reason,
                    "domain": "googleapis.com",
                    "metadata": metadata,
                }],
            }}),
            retry_after: None,
            www_authenticate: false,
        }
    }

    fn rate_limited(project: &str, retry_after_secs: u64) -> Self {
        let message = format!(
            "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service \
             'compute.googleapis.com' for consumer 'project_number:{}'.",
            project_number(project)
        );
        let mut e = Self::frontend(
            429,
            "RESOURCE_EXHAUSTED",
            &message,
            json!({"message": message, "domain": "usageLimits", "reason": "rateLimitExceeded"}),
            "RATE_LIMIT_EXCEEDED",
            json!({
                "service": "compute.googleapis.com",
                "consumer": format!("projects/{}", project_number(project)),
                "quota_metric": "compute.googleapis.com/default",
                "quota_limit": "defaultPerMinutePerProject",
                "quota_limit_value": "1500",
                "quota_location": "global",
            }),
        );
        if let Some(details) = e.body["error"]["details"].as_array_mut() {
            details.push(json!({
                "@type": "type.googleapis.com/google.rpc.Help",
                "links": [{
                    "description": "Request a higher quota limit.",
                    "url": "https://cloud.google.com/docs/quotas/help/request_increase",
                }],
            }));
        }
        e.retry_after = Some(retry_after_secs);
        e
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, &self.body);
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.www_authenticate {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"https://accounts.google.com/\""),
            );
        }
        response
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, serde_json::to_vec(body).unwrap_or_default()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

fn project_number(project: &str) -> u64 {
    // A stable 12-digit "project number" for messages.
    let h = project.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    100_000_000_000 + h % 900_000_000_000
}

/// The error a synchronous fault answers with.
fn sync_fault_error(fault: &Fault, project: &str, zone: &str) -> ApiError {
    match fault {
        Fault::RateLimited { retry_after_secs } => {
            ApiError::rate_limited(project, *retry_after_secs)
        }
        Fault::RateLimitedForbidden { retry_after_secs } => {
            let mut e = ApiError::rate_limited(project, *retry_after_secs);
            e.status = StatusCode::FORBIDDEN;
            e.body["error"]["code"] = json!(403);
            e.body["error"]["status"] = json!("PERMISSION_DENIED");
            e
        }
        Fault::Unavailable => ApiError::gce(
            503,
            "global",
            "backendError",
            "The service is currently unavailable.",
        ),
        Fault::QuotaRejected | Fault::Quota | Fault::ZoneExhausted => ApiError::gce(
            403,
            "usageLimits",
            "quotaExceeded",
            format!(
                "Quota 'CPUS' exceeded.  Limit: 24.0 in region {}.",
                region_of(zone)
            ),
        ),
    }
}

fn operation_failure(fault: &Fault, project: &str, zone: &str) -> OpFailure {
    match fault {
        Fault::ZoneExhausted => OpFailure {
            code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
            message: format!(
                "The zone 'projects/{project}/zones/{zone}' does not have enough resources \
                 available to fulfill the request.  Try a different zone, or try again later."
            ),
            http_status: 503,
            http_message: "SERVICE UNAVAILABLE",
            details: None,
        },
        _ => {
            let region = region_of(zone);
            OpFailure {
                code: "QUOTA_EXCEEDED".into(),
                message: format!("Quota 'CPUS' exceeded.  Limit: 24.0 in region {region}."),
                http_status: 403,
                http_message: "FORBIDDEN",
                details: Some(json!([{"quotaInfo": {
                    "metricName": "compute.googleapis.com/cpus",
                    "limitName": "CPUS-per-project-region",
                    "dimensions": {"region": region},
                    "limit": 24.0,
                }}])),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Front end: authentication, request faults, request log
// ---------------------------------------------------------------------------------------------

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/compute/v1/projects/{project}/zones/{zone}/instances",
            get(list_instances).post(insert_instance),
        )
        .route(
            "/compute/v1/projects/{project}/zones/{zone}/instances/{instance}",
            get(get_instance).delete(delete_instance),
        )
        .route(
            "/compute/v1/projects/{project}/aggregated/instances",
            get(aggregated_list),
        )
        .route(
            "/compute/v1/projects/{project}/zones/{zone}/operations/{operation}",
            get(get_operation),
        )
        .route(
            "/compute/v1/projects/{project}/zones/{zone}/operations/{operation}/wait",
            post(wait_operation),
        )
        .fallback(not_routed)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            frontend,
        ))
        .with_state(shared)
}

/// Google's front end answers unknown paths with an HTML 404 page.
async fn not_routed() -> Response {
    let mut response = (
        StatusCode::NOT_FOUND,
        "<!DOCTYPE html>\n<html lang=en><title>Error 404 (Not Found)!!1</title>\
         <p><b>404.</b> <ins>That's an error.</ins></html>",
    )
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=UTF-8"),
    );
    response
}

async fn frontend(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    let query = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let headers = parts
        .headers
        .iter()
        .filter(|(k, _)| *k != header::AUTHORIZATION)
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let method = parts.method.clone();
    let path = parts.uri.path().to_owned();
    let auth = authenticate(&s, &parts.headers, rpc_method(&method, &path));
    let principal = auth.as_ref().ok().cloned();
    let response = match auth {
        Err(e) => e.into_response(),
        Ok(_) => {
            let fault = s.lock().request_faults.pop_front();
            match fault {
                Some(f) => sync_fault_error(&f, &s.project, "us-central1-a").into_response(),
                None => {
                    next.run(Request::from_parts(parts, Body::from(bytes.clone())))
                        .await
                }
            }
        }
    };
    let record = RequestRecord {
        method: method.to_string(),
        path,
        query,
        headers,
        principal,
        body: serde_json::from_slice(&bytes).ok(),
        status: response.status().as_u16(),
    };
    s.lock().log.push(record);
    response
}

/// The RPC name ESF puts in `ErrorInfo.metadata.method`.
fn rpc_method(method: &Method, path: &str) -> &'static str {
    let operations = path.contains("/operations/");
    let aggregated = path.contains("/aggregated/");
    let collection = path.ends_with("/instances");
    match (method.as_str(), operations, aggregated, collection) {
        ("POST", true, _, _) => "compute.v1.ZoneOperationsService.Wait",
        (_, true, _, _) => "compute.v1.ZoneOperationsService.Get",
        (_, _, true, _) => "compute.v1.InstancesService.AggregatedList",
        ("POST", _, _, true) => "compute.v1.InstancesService.Insert",
        (_, _, _, true) => "compute.v1.InstancesService.List",
        ("DELETE", _, _, _) => "compute.v1.InstancesService.Delete",
        _ => "compute.v1.InstancesService.Get",
    }
}

/// Checks the bearer JWT; returns its `iss`.
fn authenticate(s: &Shared, headers: &HeaderMap, rpc: &str) -> Result<String, ApiError> {
    let metadata = json!({"service": "compute.googleapis.com", "method": rpc});
    let invalid = |info_reason: &str| {
        let mut e = ApiError::frontend(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, \
             login cookie or other valid authentication credential. See \
             https://developers.google.com/identity/sign-in/web/devconsole-project.",
            json!({
                "message": "Invalid Credentials",
                "domain": "global",
                "reason": "authError",
                "location": "Authorization",
                "locationType": "header",
            }),
            info_reason,
            metadata.clone(),
        );
        e.www_authenticate = true;
        e
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        let mut e = ApiError::frontend(
            401,
            "UNAUTHENTICATED",
            "Request is missing required authentication credential. Expected OAuth 2 access \
             token, login cookie or other valid authentication credential. See \
             https://developers.google.com/identity/sign-in/web/devconsole-project.",
            json!({
                "message": "Login Required.",
                "domain": "global",
                "reason": "required",
                "location": "Authorization",
                "locationType": "header",
            }),
            "CREDENTIALS_MISSING",
            metadata.clone(),
        );
        e.www_authenticate = true;
        return Err(e);
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| invalid("ACCESS_TOKEN_TYPE_UNSUPPORTED"))?;
    let decode = |part: &str| -> Option<Value> {
        let bytes = URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).ok()?;
        serde_json::from_slice(&bytes).ok()
    };
    let parts: Vec<&str> = token.split('.').collect();
    let [header_part, claims_part, signature] = parts.as_slice() else {
        return Err(invalid("ACCESS_TOKEN_TYPE_UNSUPPORTED"));
    };
    let jwt_header = decode(header_part).ok_or_else(|| invalid("ACCESS_TOKEN_TYPE_UNSUPPORTED"))?;
    let claims = decode(claims_part).ok_or_else(|| invalid("ACCESS_TOKEN_TYPE_UNSUPPORTED"))?;
    if jwt_header["alg"] != "RS256" || signature.is_empty() {
        return Err(invalid("ACCESS_TOKEN_TYPE_UNSUPPORTED"));
    }
    let issuer = claims["iss"].as_str().unwrap_or_default();
    if issuer != s.sa_email {
        return Err(invalid("ACCESS_TOKEN_TYPE_UNSUPPORTED"));
    }
    if claims["exp"].as_i64().is_some_and(|exp| exp < unix_secs()) {
        return Err(invalid("ACCESS_TOKEN_EXPIRED"));
    }
    let scoped = claims["scope"]
        .as_str()
        .is_some_and(|s| s.split_whitespace().any(|s| SCOPES_ACCEPTED.contains(&s)));
    let compute_audience = claims["aud"]
        .as_str()
        .is_some_and(|a| a.starts_with("https://compute.googleapis.com"));
    if !scoped && !compute_audience {
        return Err(ApiError::frontend(
            403,
            "PERMISSION_DENIED",
            "Request had insufficient authentication scopes.",
            json!({
                "message": "Insufficient Permission",
                "domain": "global",
                "reason": "insufficientPermissions",
            }),
            "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
            metadata,
        ));
    }
    Ok(issuer.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

type Q = Query<Vec<(String, String)>>;

fn check_project(
    s: &Shared,
    project: &str,
    permission: &str,
    resource: &str,
) -> Result<(), ApiError> {
    if project == s.project {
        return Ok(());
    }
    Err(ApiError::gce(
        403,
        "global",
        "forbidden",
        format!("Required '{permission}' permission for '{resource}'"),
    ))
}

fn check_zone(w: &World, zone: &str) -> Result<(), ApiError> {
    if w.zones.contains(zone) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "Invalid value for field 'zone': '{zone}'. Unknown zone."
    )))
}

/// Instance path parameters: a name or a numeric id.
fn check_resource_param(value: &str) -> Result<(), ApiError> {
    let numeric = !value.is_empty()
        && value.len() <= 20
        && !value.starts_with('0')
        && value.bytes().all(|b| b.is_ascii_digit());
    if is_rfc1035(value) || numeric {
        return Ok(());
    }
    Err(ApiError::gce(
        400,
        "global",
        "invalidParameter",
        format!(
            "Invalid value '{value}'. Values must match the following regular expression: \
             '{RESOURCE_PARAM_REGEX}'"
        ),
    ))
}

fn check_request_id(request_id: &str) -> Result<(), ApiError> {
    let bytes = request_id.as_bytes();
    let shaped = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    let zero = bytes.iter().all(|b| *b == b'0' || *b == b'-');
    if shaped && !zero {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "Invalid value for field 'requestId': '{request_id}'. The request ID must be a valid \
         UUID with the exception that zero UUID is not supported \
         (00000000-0000-0000-0000-000000000000)."
    )))
}

/// The operation of a `requestId` seen before, if any.
fn replayed(w: &World, request_id: Option<&str>) -> Result<Option<Value>, ApiError> {
    let Some(rid) = request_id else {
        return Ok(None);
    };
    check_request_id(rid)?;
    Ok(w.request_ids
        .get(rid)
        .and_then(|op| w.operations.get(op))
        .map(|op| op.json.clone()))
}

fn find_instance(w: &World, zone: &str, name_or_id: &str) -> Option<(String, String)> {
    let key = (zone.to_owned(), name_or_id.to_owned());
    if w.instances.contains_key(&key) {
        return Some(key);
    }
    if !name_or_id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    w.instances
        .iter()
        .find(|((z, _), r)| z == zone && r.json["id"] == json!(name_or_id))
        .map(|(k, _)| k.clone())
}

/// A new `PENDING` operation on `target` (an instance JSON).
fn new_operation(
    w: &mut World,
    s: &Shared,
    zone: &str,
    operation_type: &str,
    target: &Value,
    request_id: Option<&str>,
) -> Value {
    let name = w.operation_name();
    let mut op = json!({
        "kind": "compute#operation",
        "id": w.new_id(),
        "name": name,
        "zone": zone_url(&s.project, zone),
        "operationType": operation_type,
        "targetLink": target["selfLink"],
        "targetId": target["id"],
        "status": "PENDING",
        "user": s.sa_email,
        "progress": 0,
        "insertTime": now_timestamp(),
        "selfLink": format!("{}/operations/{name}", zone_url(&s.project, zone)),
    });
    if let Some(rid) = request_id {
        op["clientOperationId"] = json!(rid);
    }
    op
}

async fn insert_instance(
    State(s): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    Query(query): Q,
    body: Bytes,
) -> Result<Response, ApiError> {
    {
        let mut w = s.lock();
        if w.insert_faults.front().is_some_and(Fault::is_synchronous)
            && let Some(fault) = w.insert_faults.pop_front()
        {
            return Err(sync_fault_error(&fault, &s.project, &zone));
        }
    }
    let input: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let message = "Invalid JSON payload received. Expected an object for 'resource'.";
            return Err(ApiError::frontend(
                400,
                "INVALID_ARGUMENT",
                message,
                json!({"message": message, "reason": "invalid"}),
                "INVALID_ARGUMENT",
                json!({"service": "compute.googleapis.com"}),
            ));
        }
    };
    let name = input["name"].as_str().unwrap_or_default().to_owned();
    check_project(
        &s,
        &project,
        "compute.instances.create",
        &format!("projects/{project}/zones/{zone}/instances/{name}"),
    )?;
    let request_id = query_param(&query, "requestId");
    let mut w = s.lock();
    check_zone(&w, &zone)?;
    if let Some(op) = replayed(&w, request_id)? {
        return Ok(json_response(StatusCode::OK, &op));
    }
    validate_instance(&input, &project, &zone)?;
    let key = (zone.clone(), name.clone());
    if w.instances.contains_key(&key) {
        return Err(ApiError::gce(
            409,
            "global",
            "alreadyExists",
            format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
            ),
        ));
    }
    let fault = if w.insert_faults.front().is_some_and(|f| !f.is_synchronous()) {
        w.insert_faults.pop_front()
    } else {
        None
    };
    let delay = w.op_delay;
    let (instance, disks) = build_instance(&mut w, &project, &zone, &input, "PROVISIONING");
    let taken = disks
        .iter()
        .map(|(d, _)| d)
        .find(|d| w.disks.contains_key(&(zone.clone(), (*d).clone())))
        .cloned();
    let failure = match (&taken, &fault) {
        (Some(disk), _) => Some(OpFailure {
            code: "RESOURCE_ALREADY_EXISTS".into(),
            message: format!(
                "The resource 'projects/{project}/zones/{zone}/disks/{disk}' already exists"
            ),
            http_status: 409,
            http_message: "CONFLICT",
            details: None,
        }),
        (None, Some(f)) => Some(operation_failure(f, &project, &zone)),
        (None, None) => None,
    };
    let mut created = Vec::new();
    if taken.is_none() {
        for (disk, body) in disks {
            created.push(disk.clone());
            w.disks.insert((zone.clone(), disk), body);
        }
    }
    let op = new_operation(&mut w, &s, &zone, "insert", &instance, request_id);
    let op_name = op["name"].as_str().unwrap_or_default().to_owned();
    w.operations.insert(
        op_name.clone(),
        OpRec {
            zone: zone.clone(),
            kind: OpKind::Insert,
            target: name.clone(),
            target_id: instance["id"].as_str().unwrap_or_default().to_owned(),
            json: op.clone(),
            failure,
            disks: created,
        },
    );
    w.instances.insert(
        key,
        InstanceRec {
            json: instance,
            busy: Some(op_name.clone()),
        },
    );
    if let Some(rid) = request_id {
        w.request_ids.insert(rid.to_owned(), op_name.clone());
    }
    *w.insert_counts.entry(name).or_default() += 1;
    drop(w);
    s.bump();
    spawn_operation(&s, op_name, delay);
    Ok(json_response(StatusCode::OK, &op))
}

async fn get_instance(
    State(s): State<Arc<Shared>>,
    Path((project, zone, instance)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let resource = format!("projects/{project}/zones/{zone}/instances/{instance}");
    check_project(&s, &project, "compute.instances.get", &resource)?;
    check_resource_param(&instance)?;
    let w = s.lock();
    check_zone(&w, &zone)?;
    let key = find_instance(&w, &zone, &instance).ok_or_else(|| ApiError::not_found(&resource))?;
    Ok(json_response(StatusCode::OK, &w.instances[&key].json))
}

async fn delete_instance(
    State(s): State<Arc<Shared>>,
    Path((project, zone, instance)): Path<(String, String, String)>,
    Query(query): Q,
) -> Result<Response, ApiError> {
    let resource = format!("projects/{project}/zones/{zone}/instances/{instance}");
    check_project(&s, &project, "compute.instances.delete", &resource)?;
    check_resource_param(&instance)?;
    let request_id = query_param(&query, "requestId");
    let mut w = s.lock();
    check_zone(&w, &zone)?;
    if let Some(op) = replayed(&w, request_id)? {
        return Ok(json_response(StatusCode::OK, &op));
    }
    let key = find_instance(&w, &zone, &instance).ok_or_else(|| ApiError::not_found(&resource))?;
    let target = w.instances[&key].json.clone();
    if w.instances[&key].busy.is_some() {
        return Err(ApiError::gce(
            400,
            "global",
            "resourceNotReady",
            format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{}' is not ready",
                key.1
            ),
        ));
    }
    let delay = w.op_delay;
    let op = new_operation(&mut w, &s, &zone, "delete", &target, request_id);
    let op_name = op["name"].as_str().unwrap_or_default().to_owned();
    if let Some(rec) = w.instances.get_mut(&key) {
        rec.json["status"] = json!("STOPPING");
        rec.busy = Some(op_name.clone());
    }
    w.operations.insert(
        op_name.clone(),
        OpRec {
            zone: zone.clone(),
            kind: OpKind::Delete,
            target: key.1.clone(),
            target_id: target["id"].as_str().unwrap_or_default().to_owned(),
            json: op.clone(),
            failure: None,
            disks: Vec::new(),
        },
    );
    if let Some(rid) = request_id {
        w.request_ids.insert(rid.to_owned(), op_name.clone());
    }
    drop(w);
    s.bump();
    spawn_operation(&s, op_name, delay);
    Ok(json_response(StatusCode::OK, &op))
}

async fn get_operation(
    State(s): State<Arc<Shared>>,
    Path((project, zone, operation)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let op = current_operation(&s, &project, &zone, &operation)?;
    Ok(json_response(StatusCode::OK, &op))
}

fn current_operation(s: &Shared, project: &str, zone: &str, name: &str) -> Result<Value, ApiError> {
    let resource = format!("projects/{project}/zones/{zone}/operations/{name}");
    check_project(s, project, "compute.zoneOperations.get", &resource)?;
    let w = s.lock();
    check_zone(&w, zone)?;
    w.operations
        .get(name)
        .filter(|o| o.zone == zone)
        .map(|o| o.json.clone())
        .ok_or_else(|| ApiError::not_found(&resource))
}

/// `operations/{op}/wait`: answers when the operation is `DONE` or the wait timeout passed.
async fn wait_operation(
    State(s): State<Arc<Shared>>,
    Path((project, zone, operation)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let timeout = s.lock().wait_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut changes = s.changed.subscribe();
        let op = current_operation(&s, &project, &zone, &operation)?;
        if op["status"] == "DONE" {
            return Ok(json_response(StatusCode::OK, &op));
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => continue,
            _ => {
                let op = current_operation(&s, &project, &zone, &operation)?;
                return Ok(json_response(StatusCode::OK, &op));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lists
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    Name,
    CreatedAsc,
    CreatedDesc,
}

impl Order {
    fn tag(self) -> &'static str {
        match self {
            Order::Name => "n",
            Order::CreatedAsc => "ca",
            Order::CreatedDesc => "cd",
        }
    }
}

/// (zone, primary sort value, name).
type SortKey = (String, String, String);

struct ListParams {
    filter: Option<Expr>,
    max_results: usize,
    after: Option<SortKey>,
    order: Order,
}

fn list_params(query: &[(String, String)], aggregated: bool) -> Result<ListParams, ApiError> {
    let filter = match query_param(query, "filter").map(str::trim) {
        None | Some("") => None,
        Some(f) => Some(parse_filter(f).map_err(|_| {
            ApiError::invalid(format!(
                "Invalid value for field 'filter': '{f}'. Invalid list filter expression."
            ))
        })?),
    };
    let max_results = match query_param(query, "maxResults") {
        None => MAX_RESULTS,
        Some(v) => match v.parse::<i64>() {
            Ok(0) => MAX_RESULTS,
            Ok(n) if (1..=MAX_RESULTS as i64).contains(&n) => n as usize,
            Ok(n) if n > MAX_RESULTS as i64 => {
                return Err(ApiError::invalid(format!(
                    "Invalid value for field 'maxResults': '{n}'. Must be less than or equal to \
                     {MAX_RESULTS}"
                )));
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "Invalid value for field 'maxResults': '{v}'. Must be greater than or equal \
                     to 0"
                )));
            }
        },
    };
    let order = match query_param(query, "orderBy").map(str::trim) {
        None | Some("" | "name" | "name asc") => Order::Name,
        Some("creationTimestamp" | "creationTimestamp asc") if !aggregated => Order::CreatedAsc,
        Some("creationTimestamp desc") if !aggregated => Order::CreatedDesc,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'orderBy': '{other}'. Sorting by this field is not \
                 supported."
            )));
        }
    };
    let after = match query_param(query, "pageToken") {
        None | Some("") => None,
        Some(token) => Some(decode_page_token(token, order).ok_or_else(|| {
            ApiError::invalid(format!(
                "Invalid value for field 'pageToken': '{token}'. Invalid page token."
            ))
        })?),
    };
    Ok(ListParams {
        filter,
        max_results,
        after,
        order,
    })
}

fn sort_key(order: Order, zone: &str, instance: &Value) -> SortKey {
    let primary = match order {
        Order::Name => String::new(),
        Order::CreatedAsc | Order::CreatedDesc => instance["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    };
    let name = instance["name"].as_str().unwrap_or_default().to_owned();
    (zone.to_owned(), primary, name)
}

fn compare_keys(order: Order, a: &SortKey, b: &SortKey) -> Ordering {
    a.0.cmp(&b.0)
        .then_with(|| match order {
            Order::CreatedDesc => b.1.cmp(&a.1),
            _ => a.1.cmp(&b.1),
        })
        .then_with(|| a.2.cmp(&b.2))
}

fn encode_page_token(order: Order, key: &SortKey) -> String {
    URL_SAFE_NO_PAD.encode(json!(["v1", order.tag(), key.0, key.1, key.2]).to_string())
}

fn decode_page_token(token: &str, order: Order) -> Option<SortKey> {
    let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
    let v: Vec<String> = serde_json::from_slice(&bytes).ok()?;
    match v.as_slice() {
        [version, tag, zone, primary, name] if version == "v1" && tag == order.tag() => {
            Some((zone.clone(), primary.clone(), name.clone()))
        }
        _ => None,
    }
}

/// The matching instances of `zones` for one page, and the next page token.
fn page<'a>(
    w: &'a World,
    zones: &BTreeSet<String>,
    p: &ListParams,
) -> (Vec<(SortKey, &'a Value)>, Option<String>) {
    let mut items: Vec<(SortKey, &Value)> = w
        .instances
        .iter()
        .filter(|((zone, _), _)| zones.contains(zone))
        .filter(|(_, r)| p.filter.as_ref().is_none_or(|f| f.matches(&r.json)))
        .map(|((zone, _), r)| (sort_key(p.order, zone, &r.json), &r.json))
        .collect();
    items.sort_by(|a, b| compare_keys(p.order, &a.0, &b.0));
    if let Some(after) = &p.after {
        items.retain(|(k, _)| compare_keys(p.order, k, after) == Ordering::Greater);
    }
    let more = items.len() > p.max_results;
    items.truncate(p.max_results);
    let token = more
        .then(|| items.last().map(|(k, _)| encode_page_token(p.order, k)))
        .flatten();
    (items, token)
}

async fn list_instances(
    State(s): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    Query(query): Q,
) -> Result<Response, ApiError> {
    check_project(
        &s,
        &project,
        "compute.instances.list",
        &format!("projects/{project}/zones/{zone}"),
    )?;
    let mut w = s.lock();
    check_zone(&w, &zone)?;
    let params = list_params(&query, false)?;
    let zones = BTreeSet::from([zone.clone()]);
    let (items, token) = page(&w, &zones, &params);
    let listed = items.len();
    let mut body = json!({
        "kind": "compute#instanceList",
        "id": format!("projects/{project}/zones/{zone}/instances"),
        "selfLink": format!("{}/instances", zone_url(&project, &zone)),
    });
    if !items.is_empty() {
        body["items"] = Value::Array(items.into_iter().map(|(_, v)| v.clone()).collect());
    }
    if let Some(token) = token {
        body["nextPageToken"] = json!(token);
    }
    w.instances_listed += listed;
    Ok(json_response(StatusCode::OK, &body))
}

async fn aggregated_list(
    State(s): State<Arc<Shared>>,
    Path(project): Path<String>,
    Query(query): Q,
) -> Result<Response, ApiError> {
    check_project(
        &s,
        &project,
        "compute.instances.list",
        &format!("projects/{project}"),
    )?;
    let mut w = s.lock();
    let params = list_params(&query, true)?;
    let (items, token) = page(&w, &w.zones, &params);
    let listed = items.len();
    let mut scopes = Map::new();
    for zone in &w.zones {
        let scope = format!("zones/{zone}");
        let instances: Vec<Value> = items
            .iter()
            .filter(|(k, _)| k.0 == *zone)
            .map(|(_, v)| (*v).clone())
            .collect();
        let entry = if instances.is_empty() {
            json!({"warning": {
                "code": "NO_RESULTS_ON_PAGE",
                "message": format!("There are no results for scope '{scope}' on this page."),
                "data": [{"key": "scope", "value": scope}],
            }})
        } else {
            json!({"instances": instances})
        };
        scopes.insert(scope, entry);
    }
    let mut body = json!({
        "kind": "compute#instanceAggregatedList",
        "id": format!("projects/{project}/aggregated/instances"),
        "items": scopes,
        "selfLink": format!("{API_BASE}/projects/{project}/aggregated/instances"),
    });
    if let Some(token) = token {
        body["nextPageToken"] = json!(token);
    }
    w.instances_listed += listed;
    Ok(json_response(StatusCode::OK, &body))
}

// ---------------------------------------------------------------------------------------------
// Insert validation and the stored instance
// ---------------------------------------------------------------------------------------------

fn is_rfc1035(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.last().is_some_and(|c| *c != b'-')
}

fn label_char(c: char) -> bool {
    c.is_lowercase()
        || c.is_ascii_digit()
        || c == '_'
        || c == '-'
        || (c.is_alphabetic() && !c.is_uppercase())
}

fn validate_labels(labels: Option<&Value>, field: &str) -> Result<(), ApiError> {
    let Some(labels) = labels.filter(|l| !l.is_null()) else {
        return Ok(());
    };
    let Some(labels) = labels.as_object() else {
        return Err(ApiError::invalid(format!(
            "Invalid value for field '{field}': ''. Labels must be a map."
        )));
    };
    if labels.len() > 64 {
        return Err(ApiError::invalid(format!(
            "Invalid value for field '{field}': ''. Exceeded the maximum of 64 labels."
        )));
    }
    for (key, value) in labels {
        let key_ok = key.chars().count() <= 63
            && key.chars().next().is_some_and(char::is_lowercase)
            && key.chars().all(label_char);
        if !key_ok {
            return Err(ApiError::invalid(format!(
                "Invalid value for field '{field}': ''. Label key '{key}' violates format \
                 constraints. The key must start with a lowercase character, can only contain \
                 lowercase letters, numeric characters, underscores and dashes. The key can be at \
                 most 63 characters long. International characters are allowed."
            )));
        }
        let value = value.as_str().unwrap_or("\u{0}");
        if value.chars().count() > 63 || !value.chars().all(label_char) {
            return Err(ApiError::invalid(format!(
                "Invalid value for field '{field}': ''. Label value '{value}' violates format \
                 constraints. The value can only contain lowercase letters, numeric characters, \
                 underscores and dashes. The value can be at most 63 characters long. \
                 International characters are allowed."
            )));
        }
    }
    Ok(())
}

fn machine_type_url(project: &str, zone: &str, machine_type: &str) -> Option<String> {
    let url = normalize_url(project, machine_type);
    let prefix = format!("{}/machineTypes/", zone_url(project, zone));
    let name = url.strip_prefix(&prefix)?;
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ok.then_some(url)
}

fn validate_instance(input: &Value, project: &str, zone: &str) -> Result<(), ApiError> {
    match input["name"].as_str() {
        None | Some("") => return Err(ApiError::required("resource.name")),
        Some(name) if !is_rfc1035(name) => {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.name': '{name}'. Must be a match of regex \
                 '{NAME_REGEX}'"
            )));
        }
        Some(_) => {}
    }
    match input["machineType"].as_str() {
        None | Some("") => return Err(ApiError::required("resource.machineType")),
        Some(mt) if machine_type_url(project, zone, mt).is_none() => {
            let short = mt.rsplit('/').next().unwrap_or(mt);
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.machineType': '{mt}'. Machine type with name \
                 '{short}' does not exist in zone '{zone}'."
            )));
        }
        Some(_) => {}
    }
    let disks = input["disks"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if disks.is_empty() {
        return Err(ApiError::required("resource.disks"));
    }
    let boots = disks.iter().filter(|d| d["boot"] == json!(true)).count();
    if boots != 1 {
        return Err(ApiError::invalid(format!(
            "Invalid value for field 'resource.disks': ''. Exactly one boot disk must be \
             specified, found {boots}."
        )));
    }
    for (i, disk) in disks.iter().enumerate() {
        let init = &disk["initializeParams"];
        let has_source = disk["source"].is_string()
            || init["sourceImage"].is_string()
            || init["sourceSnapshot"].is_string()
            || (disk["boot"] != json!(true) && init.is_object());
        if !has_source {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.disks[{i}]': ''. The disk needs a source \
                 (source, initializeParams.sourceImage or initializeParams.sourceSnapshot)."
            )));
        }
        if let Some(size) = init.get("diskSizeGb").filter(|v| !v.is_null())
            && as_i64(size).is_none_or(|n| n <= 0)
        {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.disks[{i}].initializeParams.diskSizeGb': \
                 '{size}'. Must be a positive integer."
            )));
        }
        if let Some(disk_name) = init["diskName"].as_str()
            && !is_rfc1035(disk_name)
        {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.disks[{i}].initializeParams.diskName': \
                 '{disk_name}'. Must be a match of regex '{NAME_REGEX}'"
            )));
        }
        validate_labels(
            init.get("labels"),
            &format!("resource.disks[{i}].initializeParams.labels"),
        )?;
    }
    let nics = input["networkInterfaces"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if nics.is_empty() {
        return Err(ApiError::required("resource.networkInterfaces"));
    }
    validate_labels(input.get("labels"), "resource.labels")?;
    for (i, tag) in input["tags"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let tag = tag.as_str().unwrap_or_default();
        if !is_rfc1035(tag) {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.tags.items[{i}]': '{tag}'. Must be a match of \
                 regex '{NAME_REGEX}'"
            )));
        }
    }
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for (i, item) in input["metadata"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let key = item["key"].as_str().unwrap_or_default();
        let key_ok = (1..=128).contains(&key.len())
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !key_ok {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.metadata.items[{i}].key': '{key}'. Must be a \
                 match of regex '[a-zA-Z0-9-_]{{1,128}}'"
            )));
        }
        if !seen.insert(key.to_owned()) {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.metadata': ''. Duplicate metadata key \
                 '{key}'."
            )));
        }
        total += key.len() + item["value"].as_str().map_or(0, str::len);
    }
    if total > METADATA_MAX_BYTES {
        return Err(ApiError::invalid(
            "Invalid value for field 'resource.metadata': ''. Metadata exceeds the total size \
             limit of 512 KB.",
        ));
    }
    Ok(())
}

/// The stored instance for `input` (server-side fields filled) and the disks to create.
fn build_instance(
    w: &mut World,
    project: &str,
    zone: &str,
    input: &Value,
    status: &str,
) -> (Value, Vec<(String, Value)>) {
    let mut inst = input.as_object().cloned().unwrap_or_default();
    let name = input["name"].as_str().unwrap_or_default().to_owned();
    let self_link = format!("{}/instances/{name}", zone_url(project, zone));
    let region = region_of(zone).to_owned();
    let now = now_timestamp();
    let mut set = |k: &str, v: Value| {
        inst.insert(k.to_owned(), v);
    };
    set("kind", json!("compute#instance"));
    set("id", json!(w.new_id()));
    set(
        "creationTimestamp",
        json!(input["creationTimestamp"].as_str().unwrap_or(&now)),
    );
    set("selfLink", json!(self_link));
    set("zone", json!(zone_url(project, zone)));
    set("status", json!(status));
    if let Some(mt) = input["machineType"].as_str() {
        set("machineType", json!(normalize_url(project, mt)));
    }
    let running = status == "RUNNING";
    set(
        "cpuPlatform",
        json!(if running {
            "Intel Broadwell"
        } else {
            "Unknown CPU Platform"
        }),
    );
    if running {
        set("lastStartTimestamp", json!(now));
    }
    set("fingerprint", json!(w.fingerprint()));
    set("labelFingerprint", json!(w.fingerprint()));
    for (k, default) in [
        ("canIpForward", false),
        ("deletionProtection", false),
        ("startRestricted", false),
    ] {
        if !inst.get(k).is_some_and(Value::is_boolean) {
            inst.insert(k.to_owned(), json!(default));
        }
    }
    if input["labels"].as_object().is_none_or(Map::is_empty) {
        inst.remove("labels");
    }
    let mut tags = json!({"fingerprint": w.fingerprint()});
    if let Some(items) = input["tags"]["items"].as_array().filter(|i| !i.is_empty()) {
        tags["items"] = json!(items);
    }
    inst.insert("tags".into(), tags);
    let mut metadata = json!({"kind": "compute#metadata", "fingerprint": w.fingerprint()});
    if let Some(items) = input["metadata"]["items"]
        .as_array()
        .filter(|i| !i.is_empty())
    {
        metadata["items"] = json!(items);
    }
    inst.insert("metadata".into(), metadata);
    let preemptible = input["scheduling"]["preemptible"] == json!(true);
    let mut scheduling = json!({
        "onHostMaintenance": if preemptible { "TERMINATE" } else { "MIGRATE" },
        "automaticRestart": !preemptible,
        "preemptible": preemptible,
        "provisioningModel": if preemptible { "SPOT" } else { "STANDARD" },
    });
    if let (Some(given), Some(out)) = (input["scheduling"].as_object(), scheduling.as_object_mut())
    {
        out.extend(given.clone());
    }
    inst.insert("scheduling".into(), scheduling);

    let mut nics = Vec::new();
    for (i, nic) in input["networkInterfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let mut nic = nic.as_object().cloned().unwrap_or_default();
        let network = nic
            .get("network")
            .and_then(Value::as_str)
            .map(|n| normalize_url(project, n))
            .unwrap_or_else(|| format!("{API_BASE}/projects/{project}/global/networks/default"));
        let subnetwork = nic
            .get("subnetwork")
            .and_then(Value::as_str)
            .map(|n| normalize_url(project, n))
            .or_else(|| {
                network.ends_with("/global/networks/default").then(|| {
                    format!("{API_BASE}/projects/{project}/regions/{region}/subnetworks/default")
                })
            });
        nic.insert("kind".into(), json!("compute#networkInterface"));
        nic.insert("name".into(), json!(format!("nic{i}")));
        nic.insert("network".into(), json!(network));
        if let Some(subnetwork) = subnetwork {
            nic.insert("subnetwork".into(), json!(subnetwork));
        }
        if !nic.get("networkIP").is_some_and(Value::is_string) {
            nic.insert("networkIP".into(), json!(w.allocate_ip()));
        }
        nic.insert("fingerprint".into(), json!(w.fingerprint()));
        nic.entry("stackType").or_insert(json!("IPV4_ONLY"));
        let configs = nic
            .get("accessConfigs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !configs.is_empty() {
            let configs: Vec<Value> = configs
                .into_iter()
                .map(|c| {
                    let mut c = c.as_object().cloned().unwrap_or_default();
                    c.insert("kind".into(), json!("compute#accessConfig"));
                    c.entry("type").or_insert(json!("ONE_TO_ONE_NAT"));
                    c.entry("name").or_insert(json!("External NAT"));
                    c.entry("networkTier").or_insert(json!("PREMIUM"));
                    if !c.get("natIP").is_some_and(Value::is_string) {
                        c.insert("natIP".into(), json!(w.allocate_nat_ip()));
                    }
                    Value::Object(c)
                })
                .collect();
            nic.insert("accessConfigs".into(), json!(configs));
        }
        nics.push(Value::Object(nic));
    }
    if !nics.is_empty() {
        inst.insert("networkInterfaces".into(), json!(nics));
    }

    let mut disks = Vec::new();
    let mut created = Vec::new();
    for (i, disk) in input["disks"].as_array().into_iter().flatten().enumerate() {
        let mut disk = disk.as_object().cloned().unwrap_or_default();
        let init = disk.remove("initializeParams").unwrap_or(Value::Null);
        let boot = disk.get("boot") == Some(&json!(true));
        let scratch = disk.get("type").and_then(Value::as_str) == Some("SCRATCH");
        let size = init
            .get("diskSizeGb")
            .and_then(as_i64)
            .or_else(|| disk.get("diskSizeGb").and_then(as_i64))
            .unwrap_or(if scratch { 375 } else { 10 });
        let source = match disk.get("source").and_then(Value::as_str) {
            // A local SSD is no disk resource: no source.
            _ if scratch => None,
            Some(source) => Some(normalize_url(project, source)),
            None => {
                let disk_name = init["diskName"].as_str().map_or_else(
                    || {
                        if boot {
                            name.clone()
                        } else {
                            format!("{name}-{i}")
                        }
                    },
                    str::to_owned,
                );
                let url = format!("{}/disks/{disk_name}", zone_url(project, zone));
                let disk_type = init["diskType"].as_str().map_or_else(
                    || format!("{}/diskTypes/pd-standard", zone_url(project, zone)),
                    |t| normalize_url(project, t),
                );
                let mut body = json!({
                    "kind": "compute#disk",
                    "id": w.new_id(),
                    "creationTimestamp": now,
                    "name": disk_name,
                    "zone": zone_url(project, zone),
                    "sizeGb": size.to_string(),
                    "type": disk_type,
                    "status": "READY",
                    "selfLink": url,
                    "users": [self_link],
                });
                if let Some(image) = init["sourceImage"].as_str() {
                    body["sourceImage"] = json!(normalize_url(project, image));
                }
                if let Some(labels) = init["labels"].as_object().filter(|l| !l.is_empty()) {
                    body["labels"] = json!(labels);
                }
                created.push((disk_name, body));
                Some(url)
            }
        };
        disk.insert("kind".into(), json!("compute#attachedDisk"));
        disk.entry("type").or_insert(json!("PERSISTENT"));
        disk.entry("mode").or_insert(json!("READ_WRITE"));
        disk.entry("interface").or_insert(json!("SCSI"));
        disk.entry("autoDelete").or_insert(json!(false));
        let device = if scratch {
            "local-ssd"
        } else {
            "persistent-disk"
        };
        disk.entry("deviceName")
            .or_insert(json!(format!("{device}-{i}")));
        disk.insert("index".into(), json!(i));
        disk.insert("boot".into(), json!(boot));
        if let Some(source) = source {
            disk.insert("source".into(), json!(source));
        }
        disk.insert("diskSizeGb".into(), json!(size.to_string()));
        disks.push(Value::Object(disk));
    }
    if !disks.is_empty() {
        inst.insert("disks".into(), json!(disks));
    }
    (Value::Object(inst), created)
}

// ---------------------------------------------------------------------------------------------
// List filters (AIP-160 as GCE implements it, plus the older `eq`/`ne` regular expressions)
// ---------------------------------------------------------------------------------------------

/// The top-level fields of an Instance a filter may name.
const INSTANCE_FIELDS: &[&str] = &[
    "advancedMachineFeatures",
    "canIpForward",
    "confidentialInstanceConfig",
    "cpuPlatform",
    "creationTimestamp",
    "deletionProtection",
    "description",
    "disks",
    "displayDevice",
    "fingerprint",
    "guestAccelerators",
    "hostname",
    "id",
    "instanceEncryptionKey",
    "keyRevocationActionType",
    "kind",
    "labelFingerprint",
    "labels",
    "lastStartTimestamp",
    "lastStopTimestamp",
    "lastSuspendedTimestamp",
    "machineType",
    "metadata",
    "minCpuPlatform",
    "name",
    "networkInterfaces",
    "networkPerformanceConfig",
    "params",
    "privateIpv6GoogleAccess",
    "reservationAffinity",
    "resourcePolicies",
    "resourceStatus",
    "satisfiesPzi",
    "satisfiesPzs",
    "scheduling",
    "selfLink",
    "serviceAccounts",
    "shieldedInstanceConfig",
    "shieldedInstanceIntegrityPolicy",
    "sourceMachineImage",
    "startRestricted",
    "status",
    "statusMessage",
    "tags",
    "zone",
];

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Open,
    Close,
    Op(&'static str),
    Word(String),
    Quoted(String),
}

#[derive(Debug)]
enum Cmp {
    Eq,
    Ne,
    Has,
    Lt,
    Le,
    Gt,
    Ge,
    Matches(Regex),
    NotMatches(Regex),
}

#[derive(Debug)]
enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Not(Box<Expr>),
    Compare {
        path: Vec<String>,
        cmp: Cmp,
        value: String,
    },
}

fn tokenize(filter: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = filter.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' => {
                tokens.push(Token::Open);
                i += 1;
            }
            ')' => {
                tokens.push(Token::Close);
                i += 1;
            }
            '"' | '\'' => {
                let quote = c;
                let mut value = String::new();
                i += 1;
                loop {
                    let Some(&d) = chars.get(i) else {
                        return Err("unterminated string".into());
                    };
                    i += 1;
                    if d == quote {
                        break;
                    }
                    if d == '\\' && matches!(chars.get(i), Some(&n) if n == quote || n == '\\') {
                        value.push(chars[i]);
                        i += 1;
                    } else {
                        value.push(d);
                    }
                }
                tokens.push(Token::Quoted(value));
            }
            '=' | '!' | ':' | '<' | '>' | '~' => {
                let next = chars.get(i + 1).copied();
                let (op, len) = match (c, next) {
                    ('!', Some('=')) => ("!=", 2),
                    ('<', Some('=')) => ("<=", 2),
                    ('>', Some('=')) => (">=", 2),
                    ('=', _) => ("=", 1),
                    (':', _) => (":", 1),
                    ('<', _) => ("<", 1),
                    ('>', _) => (">", 1),
                    _ => return Err(format!("unsupported operator at {i}")),
                };
                tokens.push(Token::Op(op));
                i += len;
            }
            _ => {
                let start = i;
                while i < chars.len()
                    && !chars[i].is_whitespace()
                    && !"()=!:<>~\"'".contains(chars[i])
                {
                    i += 1;
                }
                tokens.push(Token::Word(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(x)) if x == w)
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut terms = vec![self.and()?];
        while self.is_word("OR") {
            self.pos += 1;
            terms.push(self.and()?);
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Expr::Or(terms)
        })
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut terms = vec![self.unary()?];
        loop {
            match self.peek() {
                None | Some(Token::Close) => break,
                Some(Token::Word(w)) if w == "OR" => break,
                Some(Token::Word(w)) if w == "AND" => {
                    self.pos += 1;
                    terms.push(self.unary()?);
                }
                _ => terms.push(self.unary()?),
            }
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Expr::And(terms)
        })
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.is_word("NOT") {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        match self.next() {
            Some(Token::Open) => {
                let e = self.or()?;
                match self.next() {
                    Some(Token::Close) => Ok(e),
                    _ => Err("missing )".into()),
                }
            }
            Some(Token::Word(field)) => self.comparison(&field),
            other => Err(format!("unexpected {other:?}")),
        }
    }

    fn comparison(&mut self, field: &str) -> Result<Expr, String> {
        let path: Vec<String> = field.split('.').map(str::to_owned).collect();
        let valid_path = path.iter().all(|p| {
            p.starts_with(|c: char| c.is_ascii_alphabetic())
                && p.chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        });
        if !valid_path || !INSTANCE_FIELDS.contains(&path[0].as_str()) {
            return Err(format!("invalid field name '{field}'"));
        }
        let op = match self.next() {
            Some(Token::Op(op)) => op,
            Some(Token::Word(w)) if w == "eq" => "eq",
            Some(Token::Word(w)) if w == "ne" => "ne",
            other => return Err(format!("expected an operator after {field}, got {other:?}")),
        };
        let value = match self.next() {
            Some(Token::Word(v) | Token::Quoted(v)) => v,
            other => {
                return Err(format!(
                    "expected a value after {field} {op}, got {other:?}"
                ));
            }
        };
        let cmp = match op {
            "=" => Cmp::Eq,
            "!=" => Cmp::Ne,
            ":" => Cmp::Has,
            "<" => Cmp::Lt,
            "<=" => Cmp::Le,
            ">" => Cmp::Gt,
            ">=" => Cmp::Ge,
            "eq" => Cmp::Matches(Regex::parse(&value)?),
            _ => Cmp::NotMatches(Regex::parse(&value)?),
        };
        Ok(Expr::Compare { path, cmp, value })
    }
}

fn parse_filter(filter: &str) -> Result<Expr, String> {
    let mut parser = Parser {
        tokens: tokenize(filter)?,
        pos: 0,
    };
    if parser.tokens.is_empty() {
        return Err("empty filter".into());
    }
    let expr = parser.or()?;
    if parser.pos != parser.tokens.len() {
        return Err("trailing tokens".into());
    }
    Ok(expr)
}

/// The values at `path` in `v`, flattening arrays on the way.
fn resolve<'a>(v: &'a Value, path: &[String], out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| resolve(i, path, out)),
        _ => match path.split_first() {
            None => out.push(v),
            Some((first, rest)) => {
                if let Some(child) = v.get(first.as_str()) {
                    resolve(child, rest, out);
                }
            }
        },
    }
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `=` semantics: exact, or a `*` wildcard pattern.
fn equals(actual: &str, pattern: &str) -> bool {
    if !pattern.contains('*') {
        return actual == pattern;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

fn ordered(actual: &str, value: &str) -> Ordering {
    match (actual.parse::<f64>(), value.parse::<f64>()) {
        (Ok(a), Ok(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        _ => actual.cmp(value),
    }
}

impl Expr {
    fn matches(&self, instance: &Value) -> bool {
        match self {
            Expr::And(es) => es.iter().all(|e| e.matches(instance)),
            Expr::Or(es) => es.iter().any(|e| e.matches(instance)),
            Expr::Not(e) => !e.matches(instance),
            Expr::Compare { path, cmp, value } => {
                let mut found = Vec::new();
                resolve(instance, path, &mut found);
                let found: Vec<&Value> = found.into_iter().filter(|v| !v.is_null()).collect();
                let scalars = || found.iter().filter_map(|v| scalar(v));
                match cmp {
                    Cmp::Eq => scalars().any(|a| equals(&a, value)),
                    Cmp::Ne => !scalars().any(|a| equals(&a, value)),
                    Cmp::Has if value == "*" => !found.is_empty(),
                    Cmp::Has => found.iter().any(|v| match v {
                        Value::Object(m) => m.contains_key(value.as_str()),
                        other => scalar(other).is_some_and(|a| equals(&a, value)),
                    }),
                    Cmp::Lt => scalars().any(|a| ordered(&a, value) == Ordering::Less),
                    Cmp::Le => scalars().any(|a| ordered(&a, value) != Ordering::Greater),
                    Cmp::Gt => scalars().any(|a| ordered(&a, value) == Ordering::Greater),
                    Cmp::Ge => scalars().any(|a| ordered(&a, value) != Ordering::Less),
                    Cmp::Matches(re) => scalars().any(|a| re.full_match(&a)),
                    Cmp::NotMatches(re) => !scalars().any(|a| re.full_match(&a)),
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A small backtracking regular-expression matcher (the RE2 subset filters use)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Atom {
    Char(char),
    Any,
    Class {
        ranges: Vec<(char, char)>,
        negated: bool,
    },
    Group(Vec<Vec<Piece>>),
    Empty,
}

#[derive(Debug, Clone)]
struct Piece {
    atom: Atom,
    min: usize,
    max: usize,
}

/// Literals, `.`, classes (`[a-z0-9-]`, `[^...]`, `\d \w \s`), groups (`(...)`, `(?:...)`),
/// `|`, `* + ? {n} {n,} {n,m}`; always a full match (anchors are accepted and ignored).
#[derive(Debug)]
struct Regex {
    alternatives: Vec<Vec<Piece>>,
}

impl Regex {
    fn parse(pattern: &str) -> Result<Regex, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut i = 0;
        let alternatives = parse_alternatives(&chars, &mut i, 0)?;
        if i != chars.len() {
            return Err("unbalanced )".into());
        }
        Ok(Regex { alternatives })
    }

    fn full_match(&self, s: &str) -> bool {
        let chars: Vec<char> = s.chars().collect();
        match_alternatives(&self.alternatives, &chars, 0, &mut |j| j == chars.len())
    }
}

fn parse_alternatives(c: &[char], i: &mut usize, depth: usize) -> Result<Vec<Vec<Piece>>, String> {
    let mut alternatives = vec![Vec::new()];
    while *i < c.len() {
        match c[*i] {
            '|' => {
                *i += 1;
                alternatives.push(Vec::new());
            }
            ')' if depth > 0 => break,
            ')' => return Err("unbalanced )".into()),
            _ => {
                let atom = parse_atom(c, i, depth)?;
                let (min, max) = parse_quantifier(c, i)?;
                if let Some(seq) = alternatives.last_mut() {
                    seq.push(Piece { atom, min, max });
                }
            }
        }
    }
    Ok(alternatives)
}

fn class_escape(e: char) -> Option<(Vec<(char, char)>, bool)> {
    let digits = vec![('0', '9')];
    let word = vec![('a', 'z'), ('A', 'Z'), ('0', '9'), ('_', '_')];
    let space = vec![(' ', ' '), ('\t', '\r')];
    match e {
        'd' => Some((digits, false)),
        'D' => Some((digits, true)),
        'w' => Some((word, false)),
        'W' => Some((word, true)),
        's' => Some((space, false)),
        'S' => Some((space, true)),
        _ => None,
    }
}

fn parse_atom(c: &[char], i: &mut usize, depth: usize) -> Result<Atom, String> {
    let ch = c[*i];
    *i += 1;
    Ok(match ch {
        '(' => {
            if c.get(*i) == Some(&'?') {
                if c.get(*i + 1) != Some(&':') {
                    return Err("unsupported group".into());
                }
                *i += 2;
            }
            let inner = parse_alternatives(c, i, depth + 1)?;
            if c.get(*i) != Some(&')') {
                return Err("missing )".into());
            }
            *i += 1;
            Atom::Group(inner)
        }
        '.' => Atom::Any,
        '^' | '$' => Atom::Empty,
        '*' | '+' | '?' | '{' => return Err("nothing to repeat".into()),
        '\\' => {
            let e = *c.get(*i).ok_or("trailing backslash")?;
            *i += 1;
            match class_escape(e) {
                Some((ranges, negated)) => Atom::Class { ranges, negated },
                None if e.is_ascii_alphanumeric() => return Err(format!("unsupported \\{e}")),
                None => Atom::Char(e),
            }
        }
        '[' => {
            let negated = c.get(*i) == Some(&'^');
            if negated {
                *i += 1;
            }
            let mut ranges = Vec::new();
            let mut first = true;
            loop {
                let Some(&x) = c.get(*i) else {
                    return Err("missing ]".into());
                };
                *i += 1;
                if x == ']' && !first {
                    break;
                }
                first = false;
                let lo = if x == '\\' {
                    let e = *c.get(*i).ok_or("trailing backslash")?;
                    *i += 1;
                    if let Some((r, false)) = class_escape(e) {
                        ranges.extend(r);
                        continue;
                    }
                    e
                } else {
                    x
                };
                if c.get(*i) == Some(&'-') && c.get(*i + 1).is_some_and(|n| *n != ']') {
                    let hi = c[*i + 1];
                    *i += 2;
                    if hi < lo {
                        return Err("bad range".into());
                    }
                    ranges.push((lo, hi));
                } else {
                    ranges.push((lo, lo));
                }
            }
            Atom::Class { ranges, negated }
        }
        other => Atom::Char(other),
    })
}

fn parse_quantifier(c: &[char], i: &mut usize) -> Result<(usize, usize), String> {
    let q = match c.get(*i) {
        Some('*') => (0, usize::MAX),
        Some('+') => (1, usize::MAX),
        Some('?') => (0, 1),
        Some('{') => {
            let close = c[*i..].iter().position(|x| *x == '}').ok_or("missing }")?;
            let body: String = c[*i + 1..*i + close].iter().collect();
            let number = |s: &str| s.trim().parse::<usize>().map_err(|e| e.to_string());
            let (min, max) = match body.split_once(',') {
                None => (number(&body)?, number(&body)?),
                Some((lo, "")) => (number(lo)?, usize::MAX),
                Some((lo, hi)) => (number(lo)?, number(hi)?),
            };
            if max < min {
                return Err("bad repetition".into());
            }
            *i += close;
            (min, max)
        }
        _ => return Ok((1, 1)),
    };
    *i += 1;
    if c.get(*i) == Some(&'?') {
        *i += 1; // lazy: same result for a full match
    }
    Ok(q)
}

fn match_alternatives(
    alternatives: &[Vec<Piece>],
    s: &[char],
    i: usize,
    k: &mut dyn FnMut(usize) -> bool,
) -> bool {
    alternatives.iter().any(|seq| match_sequence(seq, s, i, k))
}

fn match_sequence(seq: &[Piece], s: &[char], i: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
    match seq.split_first() {
        None => k(i),
        Some((piece, rest)) => {
            match_piece(piece, 0, s, i, &mut |j| match_sequence(rest, s, j, &mut *k))
        }
    }
}

fn match_piece(
    p: &Piece,
    n: usize,
    s: &[char],
    i: usize,
    k: &mut dyn FnMut(usize) -> bool,
) -> bool {
    if n < p.max
        && match_atom(&p.atom, s, i, &mut |j| {
            (j > i || n < p.min) && match_piece(p, n + 1, s, j, &mut *k)
        })
    {
        return true;
    }
    n >= p.min && k(i)
}

fn match_atom(a: &Atom, s: &[char], i: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
    match a {
        Atom::Char(c) => s.get(i) == Some(c) && k(i + 1),
        Atom::Any => s.get(i).is_some_and(|c| *c != '\n') && k(i + 1),
        Atom::Class { ranges, negated } => {
            s.get(i)
                .is_some_and(|c| ranges.iter().any(|(lo, hi)| lo <= c && c <= hi) != *negated)
                && k(i + 1)
        }
        Atom::Group(alternatives) => match_alternatives(alternatives, s, i, k),
        Atom::Empty => k(i),
    }
}
