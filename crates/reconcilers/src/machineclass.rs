//! The machineclass controller: finalizers on classes (while Machines use them) and on the
//! Secrets they reference, and the class validation, run once per generation and published
//! as an Event.
//!
//! A referenced Secret also gets the label [`CLASS_CREDENTIALS_LABEL`], which is what the
//! process's Secret watch selects: only those Secrets are watched, and a reconcile reads them
//! from the store (the API server is asked only for a Secret the store does not hold yet).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use mcm_api::constants::finalizers;

/// The finalizer on MachineClasses (the Go MCM's name; the legacy name is replaced).
const CLASS_FINALIZER: &str = finalizers::MACHINE_CONTROLLER_MANAGER;
/// The finalizer on the Secrets classes reference (the Go machine controller's name there).
const SECRET_FINALIZER: &str = finalizers::MACHINE_CONTROLLER;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{Driver, SpecProblem};
use serde_json::json;

use crate::events::EventPublisher;
use crate::informers::CLASS_CREDENTIALS_LABEL;
use crate::kube_api::{self, ApiCallError, ApiResultExt, STANDARD_RETRY};
use crate::machine::observe::{SecretRef, class_name, class_secret_refs};

/// Errors of the class controller: a failed API call on a class or a Secret.
pub(crate) type ClassError = ApiCallError;

/// What the class controller needs.
pub(crate) struct ClassCtx {
    /// Control cluster client.
    pub client: kube::Client,
    /// The namespace of classes and machines.
    pub namespace: String,
    /// All classes.
    pub classes: Store<MachineClass>,
    /// All machines.
    pub machines: Store<Machine>,
    /// The Secrets classes reference (labelled).
    pub secrets: Store<Secret>,
    /// Events on classes.
    pub events: EventPublisher,
    /// Turns true once the stores listed: before, a Secret only looks unreferenced.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// The provider's rules for `providerSpec` ([`Driver::validate_machine_class`]).
    pub driver: Arc<dyn Driver>,
    validated: Mutex<HashMap<String, i64>>,
}

impl ClassCtx {
    /// Builds the context.
    pub(crate) fn new(
        client: kube::Client,
        namespace: String,
        classes: Store<MachineClass>,
        machines: Store<Machine>,
        secrets: Store<Secret>,
        synced: tokio::sync::watch::Receiver<bool>,
        driver: Arc<dyn Driver>,
    ) -> Self {
        ClassCtx {
            synced,
            driver,
            events: EventPublisher::new(client.clone(), "machine-controller"),
            client,
            namespace,
            classes,
            machines,
            secrets,
            validated: Mutex::new(HashMap::new()),
        }
    }
}

/// Problems of a class that every provider shares and that need no cloud to find. Each names
/// the field.
pub fn class_problems(class: &MachineClass) -> Vec<SpecProblem> {
    let mut problems = Vec::new();
    if !class.provider_spec.is_object() {
        problems.push(SpecProblem::new("providerSpec", "must be an object"));
    }
    if class
        .secret_ref
        .as_ref()
        .and_then(|r| r.name.as_deref())
        .is_none_or(str::is_empty)
    {
        problems.push(SpecProblem::new(
            "secretRef.name",
            "must name the Secret with the cloud credentials and userData",
        ));
    }
    if let Some(t) = &class.node_template {
        for (k, q) in &t.capacity {
            if let Err(e) = mcm_api::quantity::ParsedQuantity::from_quantity(q) {
                problems.push(SpecProblem::new(
                    format!("nodeTemplate.capacity.{k}"),
                    e.to_string(),
                ));
            }
        }
    }
    problems
}

/// Every problem of a class: the shared ones ([`class_problems`]) and the provider's own
/// ([`Driver::validate_machine_class`]), as `field: detail` lines.
pub(crate) fn validate(class: &MachineClass, driver: &dyn Driver) -> Vec<String> {
    class_problems(class)
        .into_iter()
        .chain(driver.validate_machine_class(class))
        .map(|p| p.to_string())
        .collect()
}

/// The Machines (names) that use a class.
pub(crate) fn machines_using(machines: &[Arc<Machine>], class: &str) -> Vec<String> {
    machines
        .iter()
        .filter(|m| class_name(m).ok() == Some(class))
        .map(|m| m.name_any())
        .collect()
}

/// The Secrets referenced by any class that is not being deleted.
pub(crate) fn referenced_secrets(classes: &[Arc<MachineClass>]) -> BTreeSet<(String, String)> {
    classes
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .flat_map(|c| class_secret_refs(c))
        .flatten()
        .map(|r| (r.namespace, r.name))
        .collect()
}

/// The classes (not being deleted or being deleted alike) that reference `secret`.
pub(crate) fn classes_referencing(
    secret: &Secret,
    classes: &Store<MachineClass>,
) -> Vec<ObjectRef<MachineClass>> {
    let (ns, name) = (secret.namespace(), secret.name_any());
    classes
        .state()
        .iter()
        .filter(|c| {
            class_secret_refs(c)
                .into_iter()
                .flatten()
                .any(|r| Some(&r.namespace) == ns.as_ref() && r.name == name)
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// The metadata patch that gives (`wanted`) or takes away our finalizer (on classes the Go
/// MCM's `machine-controller-manager`, replacing the legacy name; on Secrets its
/// `machine-controller`) and, for Secrets, the watch label; `None` when the object already
/// is as wanted. Pure.
pub(crate) fn marking_patch<K: Resource>(
    obj: &K,
    wanted: bool,
    label: bool,
) -> Option<serde_json::Value> {
    let has_label = obj
        .labels()
        .get(CLASS_CREDENTIALS_LABEL)
        .map(String::as_str)
        == Some("true");
    let label_ok = !label || has_label == wanted;
    // `label` marks a Secret; a class's legacy finalizer name goes either way.
    let (finalizer, legacy): (&str, &[&str]) = if label {
        (SECRET_FINALIZER, &[])
    } else {
        (CLASS_FINALIZER, crate::machine::LEGACY_FINALIZERS)
    };
    let finalizers = kube_api::finalizers_as(obj.finalizers(), finalizer, legacy, wanted);
    if finalizers.is_none() && label_ok {
        return None;
    }
    let finalizers = finalizers.unwrap_or_else(|| obj.finalizers().to_vec());
    let mut meta = json!({ "finalizers": finalizers, "resourceVersion": obj.resource_version() });
    if label {
        let value = if wanted { json!("true") } else { json!(null) };
        meta["labels"] = json!({ CLASS_CREDENTIALS_LABEL: value });
    }
    Some(json!({ "metadata": meta }))
}

/// Applies [`marking_patch`]; an object that is gone is left alone.
async fn mark<K>(api: &Api<K>, obj: &K, wanted: bool, label: bool) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match marking_patch(obj, wanted, label) {
        // Gone: nothing is left to mark.
        Some(patch) => kube_api::merge_patch(api, kube_api::Part::Object, &obj.name_any(), &patch)
            .await
            .map(|_gone_or_done| ()),
        None => Ok(()),
    }
}

/// Gives a referenced Secret our finalizer and the watch label (or takes them away). Read
/// from the store; from the API server only when the store does not hold it yet.
async fn sync_secret(ctx: &ClassCtx, r: &SecretRef, wanted: bool) -> Result<(), ClassError> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &r.namespace);
    let stored = ctx
        .secrets
        .get(&ObjectRef::new(&r.name).within(&r.namespace));
    // Not in the store: not labelled yet (a new class, or a finalizer Gardener's MCM put
    // there): read it once.
    let secret = match stored {
        Some(s) => s,
        None => match api
            .get_opt(&r.name)
            .await
            .context("read", "Secret", &r.name)?
        {
            Some(s) => Arc::new(s),
            // Missing: the Machines using the class report it.
            None => return Ok(()),
        },
    };
    mark(&api, secret.as_ref(), wanted, true)
        .await
        .context("mark", "Secret", &r.name)
}

/// The `controller` label of this controller's reconcile metrics.
pub(crate) const CONTROLLER: &str = "machineclass";

/// The `controller` label of the secret controller's reconcile metrics.
pub(crate) const SECRET_CONTROLLER: &str = "secret";

/// Whether any class (also one being deleted, which still needs it until its Machines are
/// gone) references `secret`. Pure.
pub(crate) fn secret_in_use(secret: &Secret, classes: &[Arc<MachineClass>]) -> bool {
    let (ns, name) = (secret.namespace(), secret.name_any());
    classes.iter().any(|c| {
        class_secret_refs(c)
            .into_iter()
            .flatten()
            .any(|r| Some(&r.namespace) == ns.as_ref() && r.name == name)
    })
}

/// The secret controller: a labelled Secret (see [`CLASS_CREDENTIALS_LABEL`]) that no class
/// references any more loses our finalizer and the label, so it can be deleted. Runs once
/// the stores listed.
pub(crate) async fn reconcile_secret(
    secret: Arc<Secret>,
    ctx: Arc<ClassCtx>,
) -> Result<Action, ClassError> {
    let mut synced = ctx.synced.clone();
    let _ = synced.wait_for(|s| *s).await;
    if secret_in_use(&secret, &ctx.classes.state()) {
        return Ok(Action::await_change());
    }
    let name = secret.name_any();
    let api: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &secret.namespace().unwrap_or_default());
    tracing::info!("no MachineClass references the Secret any more: releasing it");
    mark(&api, secret.as_ref(), false, true)
        .await
        .context("release", "Secret", &name)?;
    Ok(Action::await_change())
}

/// Retry policy of the secret controller ([`kube_api::error_policy`]).
pub(crate) fn secret_error_policy(
    secret: Arc<Secret>,
    err: &ClassError,
    _ctx: Arc<ClassCtx>,
) -> Action {
    kube_api::error_policy(&STANDARD_RETRY, "Secret", &secret.name_any(), err)
}

/// Gives the class our finalizer, or takes it away.
async fn mark_class(
    api: &Api<MachineClass>,
    class: &MachineClass,
    wanted: bool,
) -> Result<(), ClassError> {
    let action = if wanted {
        "add the finalizer to"
    } else {
        "remove the finalizer of"
    };
    mark(api, class, wanted, false)
        .await
        .context(action, MachineClass::KIND, &class.name_any())
}

/// The part of the validation Event that names the providerSpec keys the provider ignores
/// (`""` without any). Pure.
pub(crate) fn ignored_note(warnings: &[String]) -> String {
    if warnings.is_empty() {
        String::new()
    } else {
        format!("; ignored: {}", warnings.join("; "))
    }
}

/// Reconciles one class.
pub(crate) async fn reconcile(
    class: Arc<MachineClass>,
    ctx: Arc<ClassCtx>,
) -> Result<Action, ClassError> {
    let api: Api<MachineClass> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let name = class.name_any();
    let users = machines_using(&ctx.machines.state(), &name);
    let deleting = class.metadata.deletion_timestamp.is_some();

    if deleting {
        if !users.is_empty() {
            // Kept until no Machine needs it: deleting a VM needs the class's credentials.
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
        let still_referenced = referenced_secrets(&ctx.classes.state());
        for r in class_secret_refs(&class).into_iter().flatten() {
            if !still_referenced.contains(&(r.namespace.clone(), r.name.clone())) {
                sync_secret(&ctx, &r, false).await?;
            }
        }
        mark_class(&api, &class, false).await?;
        return Ok(Action::await_change());
    }

    mark_class(&api, &class, true).await?;
    for r in class_secret_refs(&class).into_iter().flatten() {
        sync_secret(&ctx, &r, true).await?;
    }

    // Validation once per generation; the result is an Event on the class.
    let generation = class.metadata.generation.unwrap_or(0);
    let uid = class.uid().unwrap_or_default();
    let seen = ctx
        .validated
        .lock()
        .map(|v| v.get(&uid) == Some(&generation))
        .unwrap_or(false);
    if !seen {
        let problems = validate(&class, ctx.driver.as_ref());
        let ignored = ignored_note(&ctx.driver.machine_class_warnings(&class));
        let reference = class.object_ref(&());
        if problems.is_empty() {
            ctx.events
                .normal(
                    &reference,
                    "Valid",
                    "Validate",
                    format!("MachineClass {name} is valid{ignored}"),
                )
                .await;
        } else {
            ctx.events
                .warning(
                    &reference,
                    "Invalid",
                    "Validate",
                    format!(
                        "MachineClass {name} is invalid: {}{ignored}",
                        problems.join("; ")
                    ),
                )
                .await;
        }
        if let Ok(mut v) = ctx.validated.lock() {
            v.insert(uid, generation);
        }
    }
    Ok(Action::await_change())
}

/// Retry policy of failed class reconciles: a conflict (our view of the class or a secret
/// was stale) soon and quietly, anything else after 10 s ([`kube_api::error_policy`]).
pub(crate) fn error_policy(
    class: Arc<MachineClass>,
    err: &ClassError,
    _ctx: Arc<ClassCtx>,
) -> Action {
    kube_api::error_policy(&STANDARD_RETRY, MachineClass::KIND, &class.name_any(), err)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_validation_event_names_the_ignored_keys() {
        assert_eq!(ignored_note(&[]), "");
        assert_eq!(
            ignored_note(&["providerSpec.a: unknown field, ignored".into(), "b".into()]),
            "; ignored: providerSpec.a: unknown field, ignored; b"
        );
    }

    #[test]
    fn classes_carry_the_go_mcms_finalizer_and_secrets_the_machine_controllers() {
        use k8s_openapi::api::core::v1::Secret;
        let finalizers =
            |patch: Option<serde_json::Value>| patch.map(|p| p["metadata"]["finalizers"].clone());
        // A class of an earlier mcm-rs: the legacy name is replaced.
        let mut class = MachineClass::default();
        class.metadata.finalizers = Some(vec![finalizers::MACHINE_CONTROLLER.into()]);
        assert_eq!(
            finalizers(marking_patch(&class, true, false)),
            Some(serde_json::json!([finalizers::MACHINE_CONTROLLER_MANAGER]))
        );
        // Released: both names go.
        class.metadata.finalizers = Some(vec![
            finalizers::MACHINE_CONTROLLER.into(),
            finalizers::MACHINE_CONTROLLER_MANAGER.into(),
        ]);
        assert_eq!(
            finalizers(marking_patch(&class, false, false)),
            Some(serde_json::json!([]))
        );
        // A Secret keeps the Go machine controller's name.
        let mut secret = Secret::default();
        secret.metadata.finalizers = Some(vec![finalizers::MACHINE_CONTROLLER.into()]);
        secret.metadata.labels =
            Some([(CLASS_CREDENTIALS_LABEL.to_string(), "true".to_string())].into());
        assert_eq!(marking_patch(&secret, true, true), None);
    }

    use super::*;
    use k8s_openapi::api::core::v1::SecretReference;

    #[test]
    fn validation_names_the_fields() {
        let class = MachineClass {
            provider_spec: json!("not an object"),
            ..Default::default()
        };
        let driver = mcm_driver::FakeDriver::new();
        let problems = validate(&class, &driver);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("providerSpec:"));
        assert!(problems[1].starts_with("secretRef.name:"));

        let ok = MachineClass {
            provider_spec: json!({}),
            secret_ref: Some(SecretReference {
                name: Some("s".into()),
                namespace: None,
            }),
            ..Default::default()
        };
        assert!(validate(&ok, &driver).is_empty());
    }
}
