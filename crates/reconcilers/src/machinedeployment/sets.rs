//! What a MachineDeployment writes into its MachineSets, pure: its new set
//! ([`new_machine_set`]), the annotations copied to it and those that come with its replicas,
//! and the parts of the template written into the existing new set instead of rolled out.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use mcm_api::canonical::{MACHINE_CONFIGURATION_KEYS, canonical, merge_patch_to};
use mcm_api::constants::{annotations, labels, taints};
use mcm_api::owner::controller_reference;
use mcm_api::{MachineDeployment, MachineSet, MachineSetSpec, MachineTemplateSpec};
use serde_json::{Value, json};

use super::hash::template_hash;

/// Deployment annotations that are never copied to its MachineSets (upstream's list).
pub(crate) const NOT_COPIED_TO_SETS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    annotations::REVISION,
    annotations::REVISION_HISTORY,
    annotations::DESIRED_REPLICAS,
    annotations::MAX_REPLICAS,
    taints::PREFER_NO_SCHEDULE,
    annotations::UNFREEZE,
    annotations::TRIGGER_DELETION_BY_MCM,
    // The adaptation's state on the deployment (mcm-rs: they mean nothing on a set, and each
    // count would be a write of the set).
    annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT,
    annotations::REPLACE_CYCLE_COUNT,
    annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT,
];

/// The deployment's annotations that its new MachineSet carries too (e.g.
/// `node.machine.sapcloud.io/effective-creation-timeout`), as upstream copies them.
pub(crate) fn copied_annotations(d: &MachineDeployment) -> BTreeMap<String, String> {
    d.annotations()
        .iter()
        .filter(|(k, _)| !NOT_COPIED_TO_SETS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The copied annotations the set lacks or has with another value (added or overwritten,
/// never removed, as upstream).
///
/// The scaler's `last-deployment-replica-change-by-scaler-time` waits while the set still
/// has more replicas than the deployment: the set deletes the machines the scaler marked up
/// to that time, and before its replicas come down it would replace them. It then comes with
/// the replicas, in [`Actor::scale_set`](super::act::Actor::scale_set)'s patch.
pub(crate) fn annotations_to_copy(
    d: &MachineDeployment,
    set: &MachineSet,
) -> BTreeMap<String, String> {
    let have = set.annotations();
    let scale_down_pending = set.spec.replicas() > d.spec.replicas();
    copied_annotations(d)
        .into_iter()
        .filter(|(k, _)| {
            !(scale_down_pending && k == annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME)
        })
        .filter(|(k, v)| have.get(k) != Some(v))
        .collect()
}

/// The copied annotations the set has and the deployment no longer has, which the set loses:
/// only `effective-creation-timeout` (its new machines would otherwise keep getting a value
/// the deployment dropped, e.g. the adapted timeout once it is back at the declared one;
/// upstream removes none).
pub(crate) fn annotations_to_remove(d: &MachineDeployment, set: &MachineSet) -> Vec<&'static str> {
    let key = annotations::EFFECTIVE_CREATION_TIMEOUT;
    (set.annotations().contains_key(key) && !d.annotations().contains_key(key))
        .then_some(key)
        .into_iter()
        .collect()
}

/// The annotations a set gets with its replicas: [`replica_annotations`], and on the new
/// set the scaler's `last-deployment-replica-change-by-scaler-time` (see
/// [`annotations_to_copy`]).
pub(crate) fn scale_annotations(
    d: &MachineDeployment,
    max_surge: i32,
    new_set: bool,
) -> BTreeMap<String, String> {
    let mut anns = replica_annotations(d, max_surge);
    let key = annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME;
    if let Some(time) = d.annotations().get(key).filter(|_| new_set) {
        anns.insert(key.to_owned(), time.clone());
    }
    anns
}

/// The parts of a template that are written into the existing new set instead of rolled
/// out (upstream's `SetNewMachineSetNodeTemplate`, `SetNewMachineSetConfig`,
/// `UpdateMachineSetClassKind`): the node template, the machine configuration and the class
/// kind, as JSON.
fn in_place_parts(template: Option<&MachineTemplateSpec>) -> Value {
    let spec = template
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null);
    let mut parts = serde_json::Map::new();
    for key in std::iter::once("nodeTemplate").chain(MACHINE_CONFIGURATION_KEYS.iter().copied()) {
        if let Some(v) = spec.get(key) {
            parts.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(kind) = spec.pointer("/class/kind") {
        parts.insert("class".to_owned(), json!({ "kind": kind }));
    }
    Value::Object(parts)
}

/// The merge patch of `spec.template.spec` that brings the new set's node template, machine
/// configuration and class kind in line with the deployment's, `None` when they are the
/// same to a Go client (compared in canonical form, so a Go writer's representation of
/// the same values changes nothing).
pub(crate) fn in_place_template_patch(d: &MachineDeployment, set: &MachineSet) -> Option<Value> {
    let want = in_place_parts(Some(&d.spec.template));
    let have = in_place_parts(set.spec.template.as_ref());
    if canonical(&want, &[]) == canonical(&have, &[]) {
        return None;
    }
    merge_patch_to(&have, &want)
}

/// The deployment's `spec.autoPreserveFailedMachineMax` for its new set when the set has
/// another value (unset counts as 0, as upstream's `omitempty` int), `None` when they agree;
/// 0 is written as `null` (the field removed).
pub(crate) fn auto_preserve_max_update(d: &MachineDeployment, set: &MachineSet) -> Option<Value> {
    let want = d.spec.auto_preserve_failed_machine_max.unwrap_or(0);
    let have = set.spec.auto_preserve_failed_machine_max.unwrap_or(0);
    (want != have).then(|| if want == 0 { Value::Null } else { json!(want) })
}

/// The annotations a set of the deployment carries about the deployment's size: desired
/// replicas and the most machines allowed (`replicas + max_surge`).
pub(crate) fn replica_annotations(
    d: &MachineDeployment,
    max_surge: i32,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            annotations::DESIRED_REPLICAS.to_owned(),
            d.spec.replicas().to_string(),
        ),
        (
            annotations::MAX_REPLICAS.to_owned(),
            (d.spec.replicas() + max_surge).to_string(),
        ),
    ])
}

/// The new MachineSet of a deployment: template with the hash label (in labels, template
/// labels and selector), revision and replica annotations, the deployment as controller.
pub(crate) fn new_machine_set(
    d: &MachineDeployment,
    replicas: i32,
    revision: i64,
    max_surge: i32,
) -> MachineSet {
    let collision = d.status.as_ref().and_then(|s| s.collision_count);
    let hash = template_hash(&d.spec.template, collision);
    let mut template = d.spec.template.clone();
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let mut set_labels = meta.labels.clone().unwrap_or_default();
    set_labels.remove(labels::FREEZE);
    let mut selector = d.spec.selector.clone().unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let mut annotations_map = copied_annotations(d);
    annotations_map.extend(replica_annotations(d, max_surge));
    annotations_map.insert(annotations::REVISION.to_owned(), revision.to_string());
    MachineSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", d.name_any(), hash)),
            namespace: d.namespace(),
            labels: Some(set_labels),
            annotations: Some(annotations_map),
            owner_references: Some(vec![controller_reference(d)]),
            ..ObjectMeta::default()
        },
        spec: MachineSetSpec {
            replicas: Some(replicas),
            selector: Some(selector),
            min_ready_seconds: d.spec.min_ready_seconds,
            template: Some(template),
            auto_preserve_failed_machine_max: d.spec.auto_preserve_failed_machine_max,
            ..MachineSetSpec::default()
        },
        ..MachineSet::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_annotations_reach_the_set_except_upstreams_list() {
        let mut d = MachineDeployment::default();
        d.metadata.annotations = Some(BTreeMap::from([
            (
                annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
                "5m".to_owned(),
            ),
            (annotations::REVISION.to_owned(), "4".to_owned()),
            (
                annotations::TRIGGER_DELETION_BY_MCM.to_owned(),
                "m1".to_owned(),
            ),
        ]));
        let copied = copied_annotations(&d);
        assert_eq!(
            copied.keys().collect::<Vec<_>>(),
            vec![annotations::EFFECTIVE_CREATION_TIMEOUT]
        );
        let mut set = new_machine_set(&d, 1, 5, 1);
        assert_eq!(
            set.annotations()[annotations::EFFECTIVE_CREATION_TIMEOUT],
            "5m"
        );
        assert_eq!(set.annotations()[annotations::REVISION], "5");
        assert!(annotations_to_copy(&d, &set).is_empty());
        set.annotations_mut()
            .insert(annotations::EFFECTIVE_CREATION_TIMEOUT.into(), "1m".into());
        assert_eq!(
            annotations_to_copy(&d, &set),
            BTreeMap::from([(
                annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
                "5m".to_owned()
            )])
        );
        assert!(annotations_to_remove(&d, &set).is_empty());
        // The deployment dropped it (an adapted value back at the declared one): so does
        // the set.
        d.annotations_mut()
            .remove(annotations::EFFECTIVE_CREATION_TIMEOUT);
        assert_eq!(
            annotations_to_remove(&d, &set),
            vec![annotations::EFFECTIVE_CREATION_TIMEOUT]
        );
    }

    #[test]
    fn the_adaptation_state_stays_on_the_deployment() {
        let mut d = MachineDeployment::default();
        d.metadata.annotations = Some(BTreeMap::from([
            (
                annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
                "30m0s".to_owned(),
            ),
            (
                annotations::EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT.to_owned(),
                "2026-11-26T10:00:00Z".to_owned(),
            ),
            (annotations::REPLACE_CYCLE_COUNT.to_owned(), "1".to_owned()),
            (
                annotations::REPLACE_CYCLE_COUNT_LAST_APPLIED_AT.to_owned(),
                "2026-11-26T10:00:00Z".to_owned(),
            ),
        ]));
        assert_eq!(
            copied_annotations(&d).keys().collect::<Vec<_>>(),
            vec![annotations::EFFECTIVE_CREATION_TIMEOUT]
        );
    }

    #[test]
    fn the_replica_change_time_waits_for_a_pending_scale_down() {
        let key = annotations::LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME;
        let mut d = MachineDeployment::default();
        d.spec.replicas = Some(3);
        d.metadata.annotations = Some(BTreeMap::from([(
            key.to_owned(),
            "2026-11-26T10:00:00Z".to_owned(),
        )]));
        let mut set = new_machine_set(&d, 5, 1, 1);
        set.annotations_mut().remove(key);
        // The set still has 5 replicas: the time comes with the scale-down.
        assert!(!annotations_to_copy(&d, &set).contains_key(key));
        assert!(scale_annotations(&d, 1, true).contains_key(key));
        assert!(!scale_annotations(&d, 1, false).contains_key(key));
        // Replicas as the deployment's (or fewer): copied at once.
        set.spec.replicas = Some(3);
        assert!(annotations_to_copy(&d, &set).contains_key(key));
    }

    #[test]
    fn the_new_set_follows_the_deployments_auto_preserve_max() {
        let mut d = MachineDeployment::default();
        d.spec.auto_preserve_failed_machine_max = Some(2);
        let mut set = new_machine_set(&d, 1, 1, 1);
        assert_eq!(set.spec.auto_preserve_failed_machine_max, Some(2));
        assert_eq!(auto_preserve_max_update(&d, &set), None);
        d.spec.auto_preserve_failed_machine_max = Some(3);
        assert_eq!(auto_preserve_max_update(&d, &set), Some(json!(3)));
        d.spec.auto_preserve_failed_machine_max = None;
        assert_eq!(auto_preserve_max_update(&d, &set), Some(Value::Null));
        set.spec.auto_preserve_failed_machine_max = Some(0);
        assert_eq!(auto_preserve_max_update(&d, &set), None);
    }
}
