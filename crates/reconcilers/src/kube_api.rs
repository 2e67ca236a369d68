//! Kubernetes API helpers shared by the controllers: classifying API errors
//! ([`ApiErrorExt`]), writes that report a vanished object as [`Outcome::Gone`] instead of
//! failing or silently succeeding ([`merge_patch`] of an object or its status, [`delete`]),
//! idempotent finalizer updates guarded by the resourceVersion ([`set_finalizer`]), status patches that clear emptied fields ([`status_patch`]), an
//! error type for a failed call on a named object ([`ApiCallError`],
//! [`ApiResultExt::context`]) and one retry policy for failed reconciles ([`error_policy`]).

use std::fmt::Debug;
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Classification of Kubernetes API errors by their HTTP status code.
pub(crate) trait ApiErrorExt {
    /// The status code of an error the API server answered with (`None` for transport,
    /// decoding and other client-side errors).
    fn api_code(&self) -> Option<u16>;

    /// A write conflict (409): the object changed since it was read, or already exists.
    fn is_conflict(&self) -> bool {
        self.api_code() == Some(409)
    }

    /// The object does not exist (404).
    fn is_not_found(&self) -> bool {
        self.api_code() == Some(404)
    }
}

impl ApiErrorExt for kube::Error {
    fn api_code(&self) -> Option<u16> {
        match self {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }
}

/// The result of a write to an object that may have disappeared meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the object may be gone"]
pub(crate) enum Outcome {
    /// The write was applied (or, for a finalizer, nothing needed to change).
    Done,
    /// The object does not exist (any more): nothing was written.
    Gone,
}

impl Outcome {
    /// Whether the object was gone.
    pub(crate) fn is_gone(self) -> bool {
        self == Outcome::Gone
    }
}

/// Turns a NotFound error into [`Outcome::Gone`] and any success into [`Outcome::Done`].
pub(crate) fn gone_if_not_found<T>(result: Result<T, kube::Error>) -> ApiResult {
    match result {
        Ok(_) => Ok(Outcome::Done),
        Err(e) if e.is_not_found() => Ok(Outcome::Gone),
        Err(e) => Err(e),
    }
}

/// The bounds [`Api`] puts on the objects it reads and writes.
pub(crate) trait ApiObject: Clone + DeserializeOwned + Debug {}

impl<K: Clone + DeserializeOwned + Debug> ApiObject for K {}

/// The part of an object a merge patch writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// Metadata and spec (the object itself).
    Object,
    /// The `status` subresource.
    Status,
}

/// Applies a JSON merge patch to the object `name` (its metadata/spec or its status);
/// [`Outcome::Gone`] when the object does not exist.
pub(crate) async fn merge_patch<K: ApiObject>(
    api: &Api<K>,
    part: Part,
    name: &str,
    patch: &Value,
) -> ApiResult {
    gone_if_not_found(patch_existing(api, part, name, patch).await)
}

/// Applies a JSON merge patch to the object `name`, which must exist (NotFound is an error).
pub(crate) async fn patch_existing<K: ApiObject>(
    api: &Api<K>,
    part: Part,
    name: &str,
    patch: &Value,
) -> Result<K, kube::Error> {
    let params = PatchParams::default();
    let patch = Patch::Merge(patch);
    match part {
        Part::Object => api.patch(name, &params, &patch).await,
        Part::Status => api.patch_status(name, &params, &patch).await,
    }
}

/// A merge patch for `status` that also clears fields that became empty (`clearable`: the
/// status's field names that are omitted when empty).
pub(crate) fn status_patch<T: serde::Serialize>(status: &T, clearable: &[&str]) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        for k in clearable {
            map.entry((*k).to_owned()).or_insert(Value::Null);
        }
    }
    json!({ "status": value })
}

/// Deletes the object `name`; [`Outcome::Gone`] when it did not exist.
pub(crate) async fn delete<K: ApiObject>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> ApiResult {
    gone_if_not_found(api.delete(name, params).await)
}

/// The result of a write that reports a vanished object as [`Outcome::Gone`].
pub(crate) type ApiResult = Result<Outcome, kube::Error>;

/// The finalizer list of `current` with `finalizer` present or absent, or `None` when it
/// already is so. Other finalizers keep their order; an added one goes last.
pub(crate) fn finalizers_with(
    current: &[String],
    finalizer: &str,
    present: bool,
) -> Option<Vec<String>> {
    finalizers_as(current, finalizer, &[], present)
}

/// The finalizer list with `finalizer` present or absent and each of the `legacy` names (the
/// same finalizer under an older name) absent, or `None` when `current` already is so. Pure.
pub(crate) fn finalizers_as(
    current: &[String],
    finalizer: &str,
    legacy: &[&str],
    present: bool,
) -> Option<Vec<String>> {
    let has = current.iter().any(|f| f == finalizer);
    let has_legacy = current.iter().any(|f| legacy.contains(&f.as_str()));
    if has == present && !has_legacy {
        return None;
    }
    let mut list: Vec<String> = current
        .iter()
        .filter(|f| *f != finalizer && !legacy.contains(&f.as_str()))
        .cloned()
        .collect();
    if present {
        list.push(finalizer.to_owned());
    }
    Some(list)
}

/// The merge patch of [`finalizers_as`], guarded by the object's resourceVersion, or `None`
/// when nothing needs to change.
pub(crate) fn finalizer_patch_as<K: Resource>(
    obj: &K,
    finalizer: &str,
    legacy: &[&str],
    present: bool,
) -> Option<Value> {
    let list = finalizers_as(obj.finalizers(), finalizer, legacy, present)?;
    Some(json!({"metadata": {
        "finalizers": list,
        "resourceVersion": obj.resource_version(),
    }}))
}

/// Makes `finalizer` present or absent on `obj` and its `legacy` names absent
/// ([`finalizer_patch_as`]). Idempotent like [`set_finalizer`].
pub(crate) async fn set_finalizer_as<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    legacy: &[&str],
    present: bool,
) -> ApiResult
where
    K: Resource + ApiObject,
{
    match finalizer_patch_as(obj, finalizer, legacy, present) {
        Some(patch) => merge_patch(api, Part::Object, &obj.name_any(), &patch).await,
        None => Ok(Outcome::Done),
    }
}

/// The merge patch that makes `finalizer` present or absent on `obj`, guarded by the
/// object's resourceVersion (a concurrent change of the list fails with a conflict instead
/// of being overwritten), or `None` when nothing needs to change.
pub(crate) fn finalizer_patch<K: Resource>(
    obj: &K,
    finalizer: &str,
    present: bool,
) -> Option<Value> {
    let list = finalizers_with(obj.finalizers(), finalizer, present)?;
    Some(json!({"metadata": {
        "finalizers": list,
        "resourceVersion": obj.resource_version(),
    }}))
}

/// Makes `finalizer` present or absent on `obj`. Idempotent: no request when the list is
/// already right ([`Outcome::Done`]); [`Outcome::Gone`] when the object no longer exists.
pub(crate) async fn set_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    present: bool,
) -> ApiResult
where
    K: Resource + ApiObject,
{
    match finalizer_patch(obj, finalizer, present) {
        Some(patch) => merge_patch(api, Part::Object, &obj.name_any(), &patch).await,
        None => Ok(Outcome::Done),
    }
}

/// How many times [`patch_from_copy`] plans and writes before it returns the conflict.
pub(crate) const COPY_PATCH_ATTEMPTS: u32 = 3;

/// Applies the merge patch `patch_of` plans from a copy of an object, guarded by that copy's
/// resourceVersion (for patches that replace a list, such as a Node's taints); `None` from
/// `patch_of`: nothing to change. On a conflict the object is read and the patch planned
/// again from what was read, at most [`COPY_PATCH_ATTEMPTS`] writes in all; then the
/// conflict is returned.
///
/// A store's copy can stay behind the object for good: the Node store passes on no
/// heartbeat-only change, so while a kubelet writes its status the copy's resourceVersion is
/// old, and a write guarded by it alone would conflict on every retry.
pub(crate) async fn patch_from_copy<K>(
    api: &Api<K>,
    copy: &K,
    patch_of: impl Fn(&K) -> Option<Value>,
) -> ApiResult
where
    K: Resource + ApiObject,
{
    let name = copy.name_any();
    let mut read: Option<K> = None;
    let mut attempt = 1;
    loop {
        let current = read.as_ref().unwrap_or(copy);
        let Some(mut patch) = patch_of(current) else {
            return Ok(Outcome::Done);
        };
        patch["metadata"]["resourceVersion"] = json!(current.resource_version());
        match merge_patch(api, Part::Object, &name, &patch).await {
            Err(e) if e.is_conflict() && attempt < COPY_PATCH_ATTEMPTS => {
                attempt += 1;
                match api.get_opt(&name).await? {
                    Some(object) => read = Some(object),
                    None => return Ok(Outcome::Gone),
                }
            }
            written => return written,
        }
    }
}

/// A failed API call on one named object: what was attempted, on what, and the cause.
#[derive(Debug, thiserror::Error)]
#[error("failed to {action} {kind} {name}")]
pub(crate) struct ApiCallError {
    /// What was attempted (e.g. `"delete"`, `"update status of"`).
    pub action: &'static str,
    /// The kind of object.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// The client error.
    #[source]
    pub source: kube::Error,
}

impl ApiCallError {
    /// The error of `action` on the `kind` object `name`.
    pub(crate) fn new(
        action: &'static str,
        kind: &'static str,
        name: &str,
        source: kube::Error,
    ) -> Self {
        ApiCallError {
            action,
            kind,
            name: name.to_owned(),
            source,
        }
    }
}

/// Names the object of a failed API call: `api.get(name).await.context("get", "Machine",
/// name)?` turns the client error into an [`ApiCallError`] (and, with `?`, into the
/// caller's error type).
pub(crate) trait ApiResultExt<T> {
    /// The result with the error of `action` on the `kind` object `name`.
    fn context(
        self,
        action: &'static str,
        kind: &'static str,
        name: &str,
    ) -> Result<T, ApiCallError>;
}

impl<T> ApiResultExt<T> for Result<T, kube::Error> {
    fn context(
        self,
        action: &'static str,
        kind: &'static str,
        name: &str,
    ) -> Result<T, ApiCallError> {
        self.map_err(|source| ApiCallError::new(action, kind, name, source))
    }
}

impl ReconcileError for ApiCallError {
    fn is_conflict(&self) -> bool {
        self.source.is_conflict()
    }
}

/// The error of a reconcile: a failed API call, or a problem particular to the controller
/// (`P`). Both keep their source.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileFailure<P: std::error::Error + 'static> {
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] ApiCallError),
    /// A problem particular to the controller.
    #[error(transparent)]
    Problem(P),
}

impl<P: std::error::Error + 'static> ReconcileError for ReconcileFailure<P> {
    fn is_conflict(&self) -> bool {
        matches!(self, ReconcileFailure::Kube(e) if e.source.is_conflict())
    }
}

/// What the retry policy needs to know about a reconcile error.
pub(crate) trait ReconcileError: std::error::Error {
    /// Whether the cause is a write conflict (our view of an object was stale): retried
    /// quickly and quietly.
    fn is_conflict(&self) -> bool;

    /// A retry period the error itself asks for (e.g. a rate limit), instead of the
    /// policy's backoff.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// Retry periods of a controller's failed reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// After a conflict.
    pub conflict: Duration,
    /// After any other failure (unless the error names its own period).
    pub backoff: Duration,
}

/// The retry periods of controllers without a reason for others: a conflict after 1 s,
/// anything else after 10 s.
pub(crate) const STANDARD_RETRY: RetryPolicy = RetryPolicy {
    conflict: Duration::from_secs(1),
    backoff: Duration::from_secs(10),
};

impl RetryPolicy {
    /// The policy of the manager's controllers (MachineSet, MachineDeployment): 200 ms after
    /// a conflict, 5 s after other failures.
    pub(crate) const MANAGER: RetryPolicy = RetryPolicy {
        conflict: Duration::from_millis(200),
        backoff: Duration::from_secs(5),
    };
}

/// When and how loudly to retry a failed reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    /// The requeue period.
    pub after: Duration,
    /// Whether the failure is worth a warning (conflicts are not).
    pub warn: bool,
}

impl RetryPolicy {
    /// The retry of `error`: conflicts quietly after [`RetryPolicy::conflict`], others with
    /// a warning after their own [`ReconcileError::retry_after`] or [`RetryPolicy::backoff`].
    pub(crate) fn retry<E: ReconcileError + ?Sized>(&self, error: &E) -> Retry {
        if error.is_conflict() {
            return Retry {
                after: self.conflict,
                warn: false,
            };
        }
        Retry {
            after: error.retry_after().unwrap_or(self.backoff),
            warn: true,
        }
    }
}

/// The `error_policy` of a controller: logs the failure of the reconcile of `kind` `name`
/// (debug for a conflict, warning otherwise) and requeues as [`RetryPolicy::retry`] says.
pub(crate) fn error_policy<E: ReconcileError + 'static>(
    policy: &RetryPolicy,
    kind: &str,
    name: &str,
    error: &E,
) -> Action {
    let retry = policy.retry(error);
    let error = crate::error_chain(error);
    if retry.warn {
        tracing::warn!(kind, name, %error, "reconcile failed");
    } else {
        tracing::debug!(kind, name, %error, "conflict; retrying");
    }
    Action::requeue(retry.after)
}

#[cfg(test)]
mod copy_patch_tests {
    //! [`patch_from_copy`] against a real API server.

    use k8s_openapi::api::core::v1::{Node, Taint};
    use kube::api::{Api, DeleteParams, PostParams};
    use kube::core::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }
    }

    /// The taints of `n` with `key` added, `None` when it has it.
    fn with_taint(n: &Node, key: &str) -> Option<Value> {
        let mut list = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        if list.iter().any(|t| t.key == key) {
            return None;
        }
        list.push(taint(key));
        Some(json!({"spec": {"taints": list}}))
    }

    #[tokio::test]
    async fn a_patch_planned_from_a_stale_copy_is_planned_again_from_a_read() {
        let cp = mcm_testenv::shared(mcm_testenv::Components::API_SERVER)
            .await
            .expect("control plane");
        let api: Api<Node> = Api::all(cp.client().await.expect("client"));
        let name = format!("copy-patch-{}", rand::random::<u32>());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(vec![taint("a")]),
                ..Default::default()
            }),
            ..Node::default()
        };
        let stale = api
            .create(&PostParams::default(), &node)
            .await
            .expect("create");
        // Someone else writes (a kubelet's heartbeat, another taint): the copy is behind.
        let mut moved = stale.clone();
        moved.metadata.labels = Some([("moved".to_string(), "yes".to_string())].into());
        moved
            .spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .push(taint("other"));
        api.replace(&name, &PostParams::default(), &moved)
            .await
            .expect("move the node on");

        // A write guarded by the copy alone conflicts, and would on every retry.
        let mut guarded = with_taint(&stale, "b").unwrap();
        guarded["metadata"]["resourceVersion"] = json!(stale.resource_version());
        let e = merge_patch(&api, Part::Object, &name, &guarded)
            .await
            .unwrap_err();
        assert!(e.is_conflict(), "{e}");

        // Planned again from what is there: the other writer's taint is kept.
        let written = patch_from_copy(&api, &stale, |n| with_taint(n, "b"))
            .await
            .unwrap();
        assert_eq!(written, Outcome::Done);
        let now = api.get(&name).await.unwrap();
        let keys: Vec<String> = now
            .spec
            .unwrap()
            .taints
            .unwrap()
            .into_iter()
            .map(|t| t.key)
            // The API server's own (the Node is not Ready) is kept as well.
            .filter(|k| !k.starts_with("node.kubernetes.io/"))
            .collect();
        assert_eq!(keys, ["a", "other", "b"]);
        assert_eq!(now.metadata.labels.unwrap()["moved"], "yes");

        // Nothing to change: no write. Gone: nothing written, no error.
        let written = patch_from_copy(&api, &stale, |_| None).await.unwrap();
        assert_eq!(written, Outcome::Done);
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        let written = patch_from_copy(&api, &stale, |n| with_taint(n, "c"))
            .await
            .unwrap();
        assert_eq!(written, Outcome::Gone);
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_legacy_finalizer_name_is_replaced_or_removed_with_ours() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (ours, old) = ("new", "old");
        // Ours missing, the old name there: swapped, others kept in order.
        assert_eq!(
            finalizers_as(&list(&["x", old]), ours, &[old], true),
            Some(list(&["x", ours]))
        );
        // Both there: the old one goes.
        assert_eq!(
            finalizers_as(&list(&[old, ours]), ours, &[old], true),
            Some(list(&[ours]))
        );
        assert_eq!(finalizers_as(&list(&[ours]), ours, &[old], true), None);
        // Removal takes either name.
        assert_eq!(
            finalizers_as(&list(&[old, "x", ours]), ours, &[old], false),
            Some(list(&["x"]))
        );
        assert_eq!(finalizers_as(&list(&["x"]), ours, &[old], false), None);
        assert_eq!(
            finalizers_with(&list(&["x"]), ours, true),
            Some(list(&["x", ours]))
        );
    }

    use super::*;
    use kube::core::Status;
    use mcm_api::MachineSet;

    fn api_error(code: u16) -> kube::Error {
        let mut status = Status::failure("boom", "");
        status.code = code;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn classifies_api_errors_by_code() {
        assert!(api_error(409).is_conflict());
        assert!(!api_error(409).is_not_found());
        assert!(api_error(404).is_not_found());
        assert!(!api_error(500).is_conflict());
        assert_eq!(api_error(500).api_code(), Some(500));
        let other = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(other.api_code(), None);
        assert!(!other.is_not_found());
    }

    #[test]
    fn not_found_is_gone() {
        assert_eq!(gone_if_not_found(Ok(())).unwrap(), Outcome::Done);
        assert_eq!(
            gone_if_not_found::<()>(Err(api_error(404))).unwrap(),
            Outcome::Gone
        );
        assert!(gone_if_not_found::<()>(Err(api_error(409))).is_err());
    }

    #[test]
    fn finalizer_lists_are_idempotent() {
        let list = vec!["a".to_owned(), "f".to_owned(), "b".to_owned()];
        assert_eq!(finalizers_with(&list, "f", true), None);
        assert_eq!(
            finalizers_with(&list, "f", false),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(finalizers_with(&[], "f", false), None);
        assert_eq!(
            finalizers_with(&["a".to_owned()], "f", true),
            Some(vec!["a".to_owned(), "f".to_owned()])
        );
    }

    #[test]
    fn finalizer_patch_carries_the_resource_version() {
        let mut set = MachineSet::default();
        set.metadata.resource_version = Some("42".into());
        assert_eq!(
            finalizer_patch(&set, "f", true),
            Some(json!({"metadata": {"finalizers": ["f"], "resourceVersion": "42"}}))
        );
        assert_eq!(finalizer_patch(&set, "f", false), None);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("test error")]
    struct TestError {
        conflict: bool,
        after: Option<Duration>,
    }

    impl ReconcileError for TestError {
        fn is_conflict(&self) -> bool {
            self.conflict
        }
        fn retry_after(&self) -> Option<Duration> {
            self.after
        }
    }

    #[test]
    fn conflicts_retry_quickly_and_quietly() {
        let policy = RetryPolicy {
            conflict: Duration::from_millis(200),
            backoff: Duration::from_secs(5),
        };
        let err = |conflict, after| TestError { conflict, after };
        assert_eq!(
            policy.retry(&err(true, None)),
            Retry {
                after: Duration::from_millis(200),
                warn: false
            }
        );
        assert_eq!(
            policy.retry(&err(false, None)),
            Retry {
                after: Duration::from_secs(5),
                warn: true
            }
        );
        assert_eq!(
            policy
                .retry(&err(false, Some(Duration::from_secs(1))))
                .after,
            Duration::from_secs(1)
        );
        assert_eq!(
            error_policy(&policy, "MachineSet", "s", &err(true, None)),
            Action::requeue(Duration::from_millis(200))
        );
    }

    #[test]
    fn api_call_errors_keep_their_source() {
        let e = Err::<(), _>(api_error(500))
            .context("delete", "Machine", "m")
            .expect_err("failed");
        assert_eq!(e.action, "delete");
        // The message names the call, the source is the cause (printed once by a chain).
        assert_eq!(e.to_string(), "failed to delete Machine m");
        assert!(std::error::Error::source(&e).is_some());
        let chain = crate::error_chain(&e);
        assert!(chain.starts_with("failed to delete Machine m: "), "{chain}");
    }
}
