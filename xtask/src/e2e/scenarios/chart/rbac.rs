//! The chart's RBAC against what the controllers call: the API server audits every request
//! of the scenario's control plane; the requests of the releases' ServiceAccounts are
//! compared with the rules the releases grant. Every request must be granted (the chart's
//! RBAC is enough), and every granted verb must be used by the scenario or be listed in
//! [`NOT_EXERCISED`] with the call that needs it (no verb beyond what the code uses).

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::{Api, ListParams};
use serde::Deserialize;

use super::{Cluster, Release};

/// A permission: API group ("" for core), resource (`resource/subresource`), verb.
pub(super) type Permission = (String, String, String);

/// Granted verbs the scenario does not call, each with the call in the code that needs it.
/// (group, resource, verb, the call).
const NOT_EXERCISED: &[(&str, &str, &str, &str)] = &[
    (
        "",
        "events",
        "patch",
        "mcm-reconcilers events::Recorder::write: the same Event again counts up the first one",
    ),
    (
        "",
        "nodes",
        "delete",
        "machine::act::delete::remove_node: the Node of a deleted machine",
    ),
    (
        "",
        "nodes",
        "get",
        "kube_api::patch_from_copy after a conflict; machine::act::delete and inplace::act read a Node before they change it",
    ),
    (
        "",
        "nodes/status",
        "patch",
        "machine::act::drain::patch_node_condition: the drain's condition on the Node",
    ),
    (
        "",
        "persistentvolumeclaims",
        "get",
        "mcm-drain volumes: the volumes an evicted pod had, waited for",
    ),
    (
        "",
        "persistentvolumes",
        "get",
        "mcm-drain volumes: the volumes an evicted pod had, waited for",
    ),
    (
        "",
        "pods",
        "delete",
        "mcm-drain pod::delete_pod: a forced drain, or the pods of a VM that is gone",
    ),
    (
        "",
        "pods/eviction",
        "create",
        "mcm-drain pod::evict_pod: the drain of a Node with pods",
    ),
    (
        "",
        "secrets",
        "update",
        "mcm-core webhook::certs::shared: the shared serving certificate's Secret renewed",
    ),
    (
        "machine.sapcloud.io",
        "machinedeployments",
        "update",
        "machinedeployment::act::rollback: spec.rollbackTo cleared with a replace",
    ),
    (
        "machine.sapcloud.io",
        "machines",
        "delete",
        "machineset::act (a scale-down) and machine::execute (a failed machine)",
    ),
    (
        "machine.sapcloud.io",
        "machines",
        "get",
        "machine::act::records: the finalizer removal read again after a conflict",
    ),
    (
        "machine.sapcloud.io",
        "machinesets",
        "delete",
        "machinedeployment::act: sets beyond revisionHistoryLimit and a rollout's old sets",
    ),
    (
        "machine.sapcloud.io",
        "machinesets",
        "get",
        "machinedeployment::act::create_new_set: the set that already exists",
    ),
    (
        "policy",
        "poddisruptionbudgets",
        "list",
        "mcm-drain pod::list_budgets: which budget refused an eviction",
    ),
    (
        "policy.mcm-rs.io",
        "machinedisruptionbudgets/status",
        "patch",
        "disruptionbudget::act::update_status (the scenario defines no budget)",
    ),
    (
        "storage.k8s.io",
        "volumeattachments",
        "delete",
        "machine::act::delete: the VolumeAttachments of a deleted machine",
    ),
];

/// What the releases grant, and the ServiceAccounts they grant it to.
#[derive(Debug, Default)]
pub(super) struct Granted {
    permissions: BTreeSet<Permission>,
    /// `system:serviceaccount:<ns>:<name>` of each release, with when its `helm uninstall`
    /// began (if it did): Helm deletes the RBAC with the Deployment, so a terminating pod's
    /// last requests (the leader releasing its Lease) are refused after that, by design of
    /// the uninstall rather than for a missing rule.
    users: BTreeMap<String, Option<jiff::Timestamp>>,
    /// Each release's user.
    by_release: BTreeMap<&'static str, String>,
}

impl Granted {
    /// Records the Roles and ClusterRoles of `release` (by its instance label) and its pods'
    /// ServiceAccount.
    pub(super) async fn record(&mut self, cluster: &Cluster, release: &Release) -> Result<()> {
        let lp = ListParams::default().labels(&release.selector());
        let roles: Api<Role> = Api::all(cluster.client.clone());
        let cluster_roles: Api<ClusterRole> = Api::all(cluster.client.clone());
        let mut rules: Vec<PolicyRule> = Vec::new();
        for r in roles.list(&lp).await?.items {
            rules.extend(r.rules.unwrap_or_default());
        }
        for r in cluster_roles.list(&lp).await?.items {
            rules.extend(r.rules.unwrap_or_default());
        }
        ensure!(
            !rules.is_empty(),
            "the release {} has no RBAC rule",
            release.name
        );
        self.permissions.extend(permissions(&rules));
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(cluster.client.clone(), &release.ns);
        let account = deployments
            .list(&lp)
            .await?
            .items
            .into_iter()
            .find_map(|d| d.spec?.template.spec?.service_account_name)
            .context("the release's Deployment names no ServiceAccount")?;
        let user = format!("system:serviceaccount:{}:{account}", release.ns);
        self.users.insert(user.clone(), None);
        self.by_release.insert(release.name, user);
        Ok(())
    }

    /// Notes that `release`'s `helm uninstall` begins now.
    pub(super) fn uninstalling(&mut self, release: &Release) {
        if let Some(user) = self.by_release.get(release.name) {
            self.users
                .insert(user.clone(), Some(jiff::Timestamp::now()));
        }
    }
}

/// Every (group, resource, verb) of `rules` (resource names are not told apart).
fn permissions(rules: &[PolicyRule]) -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

/// The part of an audit event this reads.
#[derive(Deserialize)]
struct AuditEvent {
    #[serde(rename = "requestReceivedTimestamp")]
    received: Option<jiff::Timestamp>,
    verb: String,
    user: AuditUser,
    #[serde(rename = "objectRef")]
    object: Option<AuditObject>,
    #[serde(rename = "responseStatus")]
    status: Option<AuditStatus>,
}

#[derive(Deserialize)]
struct AuditUser {
    username: String,
}

#[derive(Deserialize)]
struct AuditObject {
    #[serde(rename = "apiGroup", default)]
    group: String,
    resource: Option<String>,
    subresource: Option<String>,
}

#[derive(Deserialize)]
struct AuditStatus {
    code: Option<u16>,
}

/// What the audit log says `users` did.
#[derive(Debug, Default)]
struct Used {
    /// Permissions used (answered other than 403).
    used: BTreeSet<Permission>,
    /// Refused (403) before the user's release began to be uninstalled.
    refused: BTreeSet<Permission>,
    /// Refused after that (its RBAC was being deleted).
    refused_uninstalling: BTreeSet<Permission>,
}

/// The permissions `users` used in an audit log (JSON lines), and the ones refused (403),
/// told apart by whether the user's release was being uninstalled.
fn used(log: impl BufRead, users: &BTreeMap<String, Option<jiff::Timestamp>>) -> Used {
    let mut out = Used::default();
    for line in log.lines().map_while(Result::ok) {
        let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
            continue;
        };
        let Some(uninstalled) = users.get(&event.user.username) else {
            continue;
        };
        let Some(object) = event.object else { continue };
        let Some(resource) = object.resource else {
            continue;
        };
        let resource = match object.subresource {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource,
        };
        let permission = (object.group, resource, event.verb);
        let uninstalling = matches!(
            (uninstalled, event.received),
            (Some(at), Some(received)) if received >= *at
        );
        if event.status.and_then(|s| s.code) != Some(403) {
            out.used.insert(permission);
        } else if uninstalling {
            out.refused_uninstalling.insert(permission);
        } else {
            out.refused.insert(permission);
        }
    }
    out
}

fn show(p: &Permission) -> String {
    let group = if p.0.is_empty() { "core" } else { &p.0 };
    format!("{} {group}/{}", p.2, p.1)
}

/// Compares the audit log with what was granted; a line of what it found.
pub(super) fn check(cluster: &Cluster, granted: &Granted) -> Result<String> {
    let path = cluster
        .cp
        .audit_log_path()
        .context("the control plane keeps no audit log")?;
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let Used {
        used,
        refused,
        refused_uninstalling,
    } = used(std::io::BufReader::new(file), &granted.users);
    ensure!(
        refused.is_empty(),
        "requests the chart's RBAC refused: {:?}",
        refused.iter().map(show).collect::<Vec<_>>()
    );
    let beyond: Vec<String> = used.difference(&granted.permissions).map(show).collect();
    ensure!(beyond.is_empty(), "used but not granted: {beyond:?}");
    let listed: BTreeSet<Permission> = NOT_EXERCISED
        .iter()
        .map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let unused: Vec<String> = granted
        .permissions
        .difference(&used)
        .filter(|p| !listed.contains(*p))
        .map(show)
        .collect();
    ensure!(
        unused.is_empty(),
        "granted but neither used by the scenario nor listed with the call that needs it: {unused:?}"
    );
    let exercised_after_all: Vec<String> = listed.intersection(&used).map(show).collect();
    Ok(format!(
        "RBAC: {} permissions used, all granted; {} of {} granted permissions used, {} listed as needed by calls the scenario does not make{}; refused only while helm uninstall deleted the RBAC: {:?}",
        used.len(),
        used.intersection(&granted.permissions).count(),
        granted.permissions.len(),
        listed.len(),
        if exercised_after_all.is_empty() {
            String::new()
        } else {
            format!(" (used anyway: {exercised_after_all:?})")
        },
        refused_uninstalling.iter().map(show).collect::<Vec<_>>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_expand_to_permissions_and_the_audit_log_to_what_a_user_used() {
        let rules: Vec<PolicyRule> = serde_json::from_value(serde_json::json!([
            { "apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get", "patch"] },
            { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"] },
        ]))
        .unwrap();
        let granted = permissions(&rules);
        assert_eq!(granted.len(), 5);
        assert!(granted.contains(&("".into(), "nodes/status".into(), "patch".into())));
        let sa = "system:serviceaccount:ns:mcm";
        let log = [
            r#"{"verb":"get","user":{"username":"system:serviceaccount:ns:mcm"},"objectRef":{"resource":"nodes","name":"n"},"responseStatus":{"code":200}}"#,
            r#"{"verb":"patch","user":{"username":"system:serviceaccount:ns:mcm"},"objectRef":{"resource":"nodes","subresource":"status"},"responseStatus":{"code":200}}"#,
            r#"{"requestReceivedTimestamp":"2026-11-29T09:00:00.000000Z","verb":"create","user":{"username":"system:serviceaccount:ns:mcm"},"objectRef":{"apiGroup":"coordination.k8s.io","resource":"leases"},"responseStatus":{"code":403}}"#,
            r#"{"requestReceivedTimestamp":"2026-11-29T09:10:00.000000Z","verb":"get","user":{"username":"system:serviceaccount:ns:mcm"},"objectRef":{"apiGroup":"coordination.k8s.io","resource":"leases"},"responseStatus":{"code":403}}"#,
            r#"{"verb":"delete","user":{"username":"admin"},"objectRef":{"resource":"nodes"}}"#,
            r#"{"verb":"get","user":{"username":"system:serviceaccount:ns:mcm"},"requestURI":"/version"}"#,
            "not json",
        ]
        .join("\n");
        let uninstall: jiff::Timestamp = "2026-11-29T09:05:00Z".parse().unwrap();
        let users = BTreeMap::from([(sa.to_string(), Some(uninstall))]);
        let Used {
            used,
            refused,
            refused_uninstalling,
        } = used(log.as_bytes(), &users);
        assert_eq!(
            refused_uninstalling.iter().map(show).collect::<Vec<_>>(),
            ["get coordination.k8s.io/leases"]
        );
        assert_eq!(
            used,
            BTreeSet::from([
                ("".into(), "nodes".into(), "get".into()),
                ("".into(), "nodes/status".into(), "patch".into()),
            ])
        );
        assert_eq!(
            refused.iter().map(show).collect::<Vec<_>>(),
            ["create coordination.k8s.io/leases"]
        );
    }
}
