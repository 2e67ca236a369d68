//! The machineclass controller: finalizers on classes (while Machines use them) and on the
//! Secrets they reference, and the class validation, run once per generation and published
//! as an Event.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use mcm_api::constants::finalizers::MACHINE_CONTROLLER as FINALIZER;
use mcm_api::{Machine, MachineClass};
use serde_json::json;

use crate::events::EventPublisher;
use crate::machine::observe::{SecretRef, class_name, class_secret_refs};

/// Errors of the class controller.
#[derive(Debug, thiserror::Error)]
pub enum ClassError {
    /// A Kubernetes API call failed.
    #[error("failed to {action}")]
    Kube {
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ClassError {
    let action = action.into();
    move |source| ClassError::Kube { action, source }
}

/// What the class controller needs.
pub struct ClassCtx {
    /// Control cluster client.
    pub client: kube::Client,
    /// The namespace of classes and machines.
    pub namespace: String,
    /// All classes.
    pub classes: Store<MachineClass>,
    /// All machines.
    pub machines: Store<Machine>,
    /// Events on classes.
    pub events: EventPublisher,
    validated: Mutex<HashMap<String, i64>>,
}

impl ClassCtx {
    /// Builds the context.
    pub fn new(
        client: kube::Client,
        namespace: String,
        classes: Store<MachineClass>,
        machines: Store<Machine>,
    ) -> Self {
        ClassCtx {
            events: EventPublisher::new(client.clone(), "machine-controller"),
            client,
            namespace,
            classes,
            machines,
            validated: Mutex::new(HashMap::new()),
        }
    }
}

/// Problems of a class that need no cloud to find. Each names the field.
pub fn validate(class: &MachineClass) -> Vec<String> {
    let mut problems = Vec::new();
    if !class.provider_spec.is_object() {
        problems.push("providerSpec: must be an object".to_string());
    }
    if class
        .secret_ref
        .as_ref()
        .and_then(|r| r.name.as_deref())
        .is_none_or(str::is_empty)
    {
        problems.push(
            "secretRef.name: must name the Secret with the cloud credentials and userData".into(),
        );
    }
    if let Some(t) = &class.node_template {
        for (k, q) in &t.capacity {
            if let Err(e) = mcm_api::quantity::ParsedQuantity::from_quantity(q) {
                problems.push(format!("nodeTemplate.capacity.{k}: {e}"));
            }
        }
    }
    problems
}

/// The Machines (names) that use a class.
pub fn machines_using(machines: &[Arc<Machine>], class: &str) -> Vec<String> {
    machines
        .iter()
        .filter(|m| class_name(m).ok() == Some(class))
        .map(|m| m.name_any())
        .collect()
}

/// The Secrets referenced by any class that is not being deleted.
pub fn referenced_secrets(classes: &[Arc<MachineClass>]) -> BTreeSet<(String, String)> {
    classes
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .flat_map(|c| class_secret_refs(c))
        .flatten()
        .map(|r| (r.namespace, r.name))
        .collect()
}

async fn set_finalizer<K>(api: &Api<K>, obj: &K, present: bool) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let has = obj.finalizers().iter().any(|f| f == FINALIZER);
    if has == present {
        return Ok(());
    }
    let mut list: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.into());
    }
    let patch =
        json!({ "metadata": { "finalizers": list, "resourceVersion": obj.resource_version() } });
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn sync_secret(ctx: &ClassCtx, r: &SecretRef, wanted: bool) -> Result<(), ClassError> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &r.namespace);
    let Some(secret) = api
        .get_opt(&r.name)
        .await
        .map_err(kube_err(format!("read secret {}", r.name)))?
    else {
        return Ok(());
    };
    set_finalizer(&api, &secret, wanted)
        .await
        .map_err(kube_err(format!(
            "update the finalizer of secret {}",
            r.name
        )))
}

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machineclass";

/// Reconciles one class.
pub async fn reconcile(class: Arc<MachineClass>, ctx: Arc<ClassCtx>) -> Result<Action, ClassError> {
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
        set_finalizer(&api, class.as_ref(), false)
            .await
            .map_err(kube_err("remove the class finalizer"))?;
        return Ok(Action::await_change());
    }

    set_finalizer(&api, class.as_ref(), true)
        .await
        .map_err(kube_err("add the class finalizer"))?;
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
        let problems = validate(&class);
        let reference = class.object_ref(&());
        if problems.is_empty() {
            ctx.events
                .normal(
                    &reference,
                    "Valid",
                    "Validate",
                    format!("MachineClass {name} is valid"),
                )
                .await;
        } else {
            ctx.events
                .warning(
                    &reference,
                    "Invalid",
                    "Validate",
                    format!("MachineClass {name} is invalid: {}", problems.join("; ")),
                )
                .await;
        }
        if let Ok(mut v) = ctx.validated.lock() {
            v.insert(uid, generation);
        }
    }
    Ok(Action::await_change())
}

/// Retry policy of failed class reconciles.
pub fn error_policy(class: Arc<MachineClass>, err: &ClassError, _ctx: Arc<ClassCtx>) -> Action {
    let ClassError::Kube { source, .. } = err;
    if matches!(source, kube::Error::Api(s) if s.code == 409) {
        // Our view was stale (the class or secret changed meanwhile): retry soon, quietly.
        tracing::debug!(class = %class.name_any(), error = %err, "conflict; retrying");
        return Action::requeue(Duration::from_secs(1));
    }
    tracing::warn!(class = %class.name_any(), error = %err, cause = %source, "class reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::SecretReference;

    #[test]
    fn validation_names_the_fields() {
        let class = MachineClass {
            provider_spec: json!("not an object"),
            ..Default::default()
        };
        let problems = validate(&class);
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
        assert!(validate(&ok).is_empty());
    }
}
