//! The overshooting safety guard: freezes a MachineSet (and its MachineDeployment) that has
//! far more machines than it should, unfreezes it once the count dropped below a lower
//! threshold or when a user sets the unfreeze annotation. A controller per MachineSet:
//! triggered by the set and its deployment, and re-checked every overshooting period.
//!
//! Thresholds follow MCM (`--safety-up`, `--safety-down`): for a set owned by a deployment,
//! `higher = deployment.replicas + maxSurge + safetyUp`, otherwise
//! `higher = 2 * set.replicas + safetyUp`; `lower = higher - safetyDown`. A set is frozen when its fully labeled machines
//! reach `higher` and unfrozen when they drop to `lower` or below. A frozen set creates no
//! machines; a frozen deployment only scales down.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use mcm_api::constants::{annotations, freeze_reasons, labels};
use mcm_api::intstr::scaled_value;
use mcm_api::{Machine, MachineDeployment, MachineSet};
use serde_json::json;

use crate::events::EventPublisher;
use crate::kube_api::{self, ApiCallError, STANDARD_RETRY};
use crate::machineset::decide::is_frozen;
use crate::selector::labels_contain;

/// The `--safety-up` / `--safety-down` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SafetyLimits {
    /// Machines above the bound that freeze the set (MCM default 2).
    pub safety_up: i32,
    /// How far below the freeze threshold the count must drop to unfreeze (MCM default 1).
    pub safety_down: i32,
}

impl Default for SafetyLimits {
    fn default() -> Self {
        SafetyLimits {
            safety_up: 2,
            safety_down: 1,
        }
    }
}

/// What to do with a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Overshoot {
    /// Freeze with this message.
    Freeze(String),
    /// Unfreeze.
    Unfreeze,
    /// Leave as is.
    Keep,
}

/// The freeze (`higher`) and unfreeze (`lower`) thresholds of a set.
pub(crate) fn thresholds(
    set_replicas: i32,
    deployment: Option<(i32, i32)>,
    limits: SafetyLimits,
) -> (i32, i32) {
    let higher = match deployment {
        Some((replicas, surge)) => replicas + surge + limits.safety_up,
        None => 2 * set_replicas + limits.safety_up,
    };
    (higher, higher - limits.safety_down)
}

/// MCM's `checkAndFreezeORUnfreezeMachineSets` for one set. `deployment` is the owning
/// deployment's `(replicas, resolved maxSurge)`.
pub(crate) fn overshoot_decision(
    set_name: &str,
    set_replicas: i32,
    deployment: Option<(i32, i32)>,
    machines: i32,
    frozen_label: bool,
    frozen_condition: bool,
    limits: SafetyLimits,
) -> Overshoot {
    let (higher, lower) = thresholds(set_replicas, deployment, limits);
    if !frozen_label && machines >= higher {
        Overshoot::Freeze(format!(
            "The number of machines backing MachineSet: {set_name} is {machines} >= {higher} which is the Max-ScaleUp-Limit"
        ))
    } else if machines <= lower && (frozen_label || frozen_condition) {
        Overshoot::Unfreeze
    } else {
        Overshoot::Keep
    }
}

/// Shared state of the overshooting guard.
#[derive(Clone)]
pub(crate) struct SafetyContext {
    /// Client of the control cluster.
    pub client: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// Store of the MachineSets.
    pub sets: Store<MachineSet>,
    /// Store of the MachineDeployments.
    pub deployments: Store<MachineDeployment>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Thresholds.
    pub limits: SafetyLimits,
    /// Where the guard takes time from (the Frozen conditions' times).
    pub clock: crate::clock::SharedClock,
    /// `--machine-safety-overshooting-period`: how often each set is re-checked.
    pub period: Duration,
}

/// Errors of the overshooting guard: a failed API call on a set or deployment.
pub(crate) type SafetyError = ApiCallError;

fn kube_err<K: Freezable>(
    action: &'static str,
    name: &str,
) -> impl FnOnce(kube::Error) -> SafetyError {
    let name = name.to_owned();
    move |source| ApiCallError::new(action, K::KIND, &name, source)
}

/// The `controller` label of the guard's reconcile metrics.
pub(crate) const CONTROLLER: &str = "overshooting";

/// Retry policy of a failed check ([`kube_api::error_policy`]).
pub(crate) fn error_policy(
    set: Arc<MachineSet>,
    error: &SafetyError,
    _ctx: Arc<SafetyContext>,
) -> Action {
    kube_api::error_policy(&STANDARD_RETRY, MachineSet::KIND, &set.name_any(), error)
}

fn deployment_of(
    set: &MachineSet,
    deployments: &Store<MachineDeployment>,
) -> Option<Arc<MachineDeployment>> {
    let owner = mcm_api::owner::controller_of(&set.metadata)?;
    if owner.kind != MachineDeployment::KIND {
        return None;
    }
    deployments.state().into_iter().find(|d| {
        d.metadata.uid.as_deref() == Some(owner.uid.as_str()) && d.namespace() == set.namespace()
    })
}

fn has_unfreeze_annotation<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::UNFREEZE))
}

/// The guard for one set (MCM's `reconcileClusterMachineSafetyOvershooting`, per set):
/// freeze or unfreeze it by its machine count, keep its deployment's freeze in line with its
/// sets, and honour the unfreeze annotations of the deployment and of the set.
pub(crate) async fn reconcile(
    set: Arc<MachineSet>,
    ctx: Arc<SafetyContext>,
) -> Result<Action, SafetyError> {
    let ctx = ctx.as_ref();
    let name = set.name_any();
    let template_labels = set.template_labels();
    let count = ctx
        .machines
        .state()
        .iter()
        .filter(|m| m.namespace() == set.namespace())
        .filter(|m| labels_contain(m.metadata.labels.as_ref(), template_labels))
        .filter(|m| {
            m.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.name == name))
        })
        .count();
    let deployment = deployment_of(&set, &ctx.deployments);
    // MCM's guard counts an unset (or unusable) maxSurge as 0; an in-place deployment's
    // maxSurge is that of `strategy.inPlaceUpdate` (upstream's machine_safety.go).
    let limits = deployment.as_ref().map(|d| {
        let in_place = d
            .spec
            .strategy
            .as_ref()
            .filter(|s| s.type_ == Some(mcm_api::MachineDeploymentStrategyType::InPlaceUpdate))
            .and_then(|s| s.in_place_update.as_ref())
            .and_then(|i| i.update_configuration.max_surge.as_ref());
        let surge = match in_place {
            Some(v) => Some(v),
            None => d.rolling_update_limits().0,
        }
        .and_then(|v| scaled_value(v, d.spec.replicas(), true).ok())
        .unwrap_or(0);
        (d.spec.replicas(), surge)
    });
    let decision = overshoot_decision(
        &name,
        set.spec.replicas(),
        limits,
        i32::try_from(count).unwrap_or(i32::MAX),
        is_frozen(set.metadata.labels.as_ref()),
        set.has_frozen_condition(),
        ctx.limits,
    );
    match decision {
        Overshoot::Freeze(message) => {
            let reason = freeze_reasons::OVERSHOOTING_REPLICA_COUNT;
            freeze(ctx, set.as_ref(), reason, &message).await?;
            if let Some(d) = &deployment {
                freeze(ctx, d.as_ref(), reason, &message).await?;
            }
        }
        Overshoot::Unfreeze => unfreeze(ctx, set.as_ref()).await?,
        Overshoot::Keep => {}
    }
    if let Some(d) = &deployment {
        sync_deployment_freeze_state(ctx, d).await?;
        if has_unfreeze_annotation(d.as_ref()) {
            unfreeze(ctx, d.as_ref()).await?;
            for set in ctx.sets.state().iter().filter(|s| {
                deployment_of(s, &ctx.deployments).is_some_and(|o| o.metadata.uid == d.metadata.uid)
            }) {
                let api: Api<MachineSet> =
                    Api::namespaced(ctx.client.clone(), &set.namespace().unwrap_or_default());
                let patch = json!({"metadata": {"annotations": {annotations::UNFREEZE: "True"}}});
                api.patch(
                    &set.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(kube_err::<MachineSet>("annotate", &set.name_any()))?;
            }
        }
    }
    if has_unfreeze_annotation(set.as_ref()) {
        unfreeze(ctx, set.as_ref()).await?;
    }
    Ok(Action::requeue(ctx.period))
}

/// The MachineSets of the deployment a MachineDeployment change concerns.
pub(crate) fn sets_of_deployment(
    d: &MachineDeployment,
    sets: &Store<MachineSet>,
    deployments: &Store<MachineDeployment>,
) -> Vec<kube::runtime::reflector::ObjectRef<MachineSet>> {
    sets.state()
        .iter()
        .filter(|s| deployment_of(s, deployments).is_some_and(|o| o.metadata.uid == d.metadata.uid))
        .map(|s| kube::runtime::reflector::ObjectRef::from_obj(s.as_ref()))
        .collect()
}

async fn sync_deployment_freeze_state(
    ctx: &SafetyContext,
    d: &MachineDeployment,
) -> Result<(), SafetyError> {
    let sets = ctx.sets.state();
    let frozen_label = is_frozen(d.metadata.labels.as_ref());
    let frozen_condition = d.has_frozen_condition();
    let has_frozen_set = sets.iter().any(|s| {
        deployment_of(s, &ctx.deployments).is_some_and(|o| o.metadata.uid == d.metadata.uid)
            && (is_frozen(s.metadata.labels.as_ref()) || s.has_frozen_condition())
    });
    if has_frozen_set && !(frozen_label && frozen_condition) {
        freeze(
            ctx,
            d,
            freeze_reasons::MACHINE_DEPLOYMENT_STATE_SYNC,
            "MachineDeployment State was inconsistent, hence safety controller has fixed this and frozen it",
        )
        .await?;
    } else if !has_frozen_set && (frozen_label || frozen_condition) {
        unfreeze(ctx, d).await?;
    }
    Ok(())
}

/// What freezing needs of a MachineSet or MachineDeployment: where its conditions live.
trait Freezable:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    /// The kind.
    const KIND: &'static str;
    /// The field of `status` that holds the conditions.
    const CONDITIONS_FIELD: &'static str;
    /// Whether its conditions carry a `lastUpdateTime`.
    const UPDATE_TIME: bool;
    /// Its conditions, as JSON.
    fn conditions(&self) -> Vec<serde_json::Value>;

    /// The conditions other than Frozen.
    fn conditions_without_frozen(&self) -> Vec<serde_json::Value> {
        let mut all = self.conditions();
        all.retain(|c| c["type"] != FROZEN);
        all
    }

    /// Whether a Frozen condition is set.
    fn has_frozen_condition(&self) -> bool {
        self.conditions().iter().any(|c| c["type"] == FROZEN)
    }

    /// A Frozen condition set at `now`.
    fn frozen_condition(reason: &str, message: &str, now: Timestamp) -> serde_json::Value {
        let now = Time(now);
        let mut c = json!({
            "type": FROZEN, "status": "True", "lastTransitionTime": now,
            "reason": reason, "message": message,
        });
        if Self::UPDATE_TIME {
            c["lastUpdateTime"] = json!(now);
        }
        c
    }
}

/// The type of the Frozen condition of sets and deployments.
const FROZEN: &str = "Frozen";

macro_rules! freezable {
    ($kind:ty, $field:literal, $update_time:literal) => {
        impl Freezable for $kind {
            const KIND: &'static str = <$kind>::KIND;
            const CONDITIONS_FIELD: &'static str = $field;
            const UPDATE_TIME: bool = $update_time;
            fn conditions(&self) -> Vec<serde_json::Value> {
                let all = self.status.as_ref().and_then(|s| s.conditions.as_ref());
                all.into_iter().flatten().map(|c| json!(c)).collect()
            }
        }
    };
}
freezable!(MachineSet, "machineSetCondition", false);
freezable!(MachineDeployment, "conditions", true);

/// Freezes a set or deployment: the `freeze` label, a Frozen condition and a warning Event.
async fn freeze<K: Freezable>(
    ctx: &SafetyContext,
    obj: &K,
    reason: &str,
    message: &str,
) -> Result<(), SafetyError> {
    let name = obj.name_any();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let label = json!({"metadata": {"labels": {labels::FREEZE: labels::TRUE_VALUE}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .map_err(kube_err::<K>("freeze", &name))?;
    let mut conditions = obj.conditions_without_frozen();
    conditions.push(K::frozen_condition(reason, message, ctx.clock.now()));
    let status = json!({"status": {K::CONDITIONS_FIELD: conditions}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(kube_err::<K>("set Frozen condition of", &name))?;
    ctx.events
        .warning(&obj.object_ref(&()), "Frozen", "Freeze", message.to_owned())
        .await;
    tracing::warn!(kind = K::KIND, name, reason, "froze");
    Ok(())
}

/// Unfreezes a set or deployment: label, unfreeze annotation and Frozen condition go.
async fn unfreeze<K: Freezable>(ctx: &SafetyContext, obj: &K) -> Result<(), SafetyError> {
    let name = obj.name_any();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let meta = json!({"metadata": {
        "labels": {labels::FREEZE: null},
        "annotations": {annotations::UNFREEZE: null},
    }});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&meta))
        .await
        .map_err(kube_err::<K>("unfreeze", &name))?;
    if obj.has_frozen_condition() {
        let conditions = obj.conditions_without_frozen();
        let value = if conditions.is_empty() {
            serde_json::Value::Null
        } else {
            json!(conditions)
        };
        let status = json!({"status": {K::CONDITIONS_FIELD: value}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(kube_err::<K>("remove Frozen condition of", &name))?;
    }
    ctx.events
        .normal(
            &obj.object_ref(&()),
            "Unfrozen",
            "Unfreeze",
            format!("{} {name} unfrozen", K::KIND),
        )
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_follow_mcm() {
        let l = SafetyLimits::default();
        assert_eq!(thresholds(3, None, l), (8, 7));
        assert_eq!(thresholds(3, Some((3, 1)), l), (6, 5));
        assert!(matches!(
            overshoot_decision("s", 3, Some((3, 1)), 6, false, false, l),
            Overshoot::Freeze(_)
        ));
        // (machines, frozen label, frozen condition) -> decision
        let cases = [
            (5, false, false, Overshoot::Keep),
            (6, true, true, Overshoot::Keep),
            (5, true, true, Overshoot::Unfreeze),
            (5, false, true, Overshoot::Unfreeze),
        ];
        for (machines, label, condition, want) in cases {
            let got = overshoot_decision("s", 3, Some((3, 1)), machines, label, condition, l);
            assert_eq!(
                got, want,
                "{machines} machines, label {label}, condition {condition}"
            );
        }
    }
}
