//! What a machine's decisions read about the other objects of its namespace, from the
//! stores: its owners, the rollout protection of its set, and its deployment's verdict on
//! one more replacement (the census, counted under the deployment's permit). Read by
//! [`gather`](super::gather); the rules themselves are [`policy`](super::policy)'s and
//! [`remediation`](super::remediation)'s.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use mcm_api::{Machine, MachineDeployment, MachineSet};
use mcm_permits::{Permit, PermitGiver};

use super::model::Replacement;
use super::policy::{controller_owner, max_replacements, rollout_protection};
use super::{observe, remediation};
use crate::informers::Stores;

/// The MachineSet and MachineDeployment of namespace `ns` that own `m`.
pub(crate) fn owners(
    stores: &Stores,
    ns: &str,
    m: &Machine,
) -> (Option<Arc<MachineSet>>, Option<Arc<MachineDeployment>>) {
    let set = controller_owner(m.owner_references(), "MachineSet")
        .and_then(|n| stores.sets.get(&ObjectRef::new(n).within(ns)));
    let deployment = set.as_ref().and_then(|s| {
        controller_owner(s.owner_references(), "MachineDeployment")
            .and_then(|n| stores.deployments.get(&ObjectRef::new(n).within(ns)))
    });
    (set, deployment)
}

/// Why `m` must not be marked Failed now: it belongs to an old MachineSet of a
/// MachineDeployment that is rolling out (failing it would leave pods unschedulable while
/// the new machines are not ready yet).
pub(crate) fn failure_protection(stores: &Stores, ns: &str, m: &Machine) -> Option<String> {
    let (set, deployment) = owners(stores, ns, m);
    let (set, deployment) = (set?, deployment?);
    let owned: Vec<Arc<MachineSet>> = stores
        .sets
        .state()
        .into_iter()
        .filter(|s| {
            controller_owner(s.owner_references(), "MachineDeployment")
                == Some(deployment.name_any().as_str())
        })
        .collect();
    rollout_protection(&set, &deployment, &owned)
}

/// The verdict of the deployment of `m` on replacing it, with the deployment's permit when
/// it was taken (held while the failure is written: it serialises the failures of a
/// deployment's machines, so each counts those written before it).
pub(crate) fn replacement(
    permits: &PermitGiver,
    stores: &Stores,
    ns: &str,
    m: &Machine,
) -> (Replacement, Option<Permit>) {
    let (_, Some(deployment)) = owners(stores, ns, m) else {
        return (Replacement::NotAsked, None);
    };
    let key = format!("{ns}/{}", deployment.name_any());
    permits.register(&key, 1);
    let permit = match permits.try_acquire_now(&key) {
        Ok(permit) => permit,
        Err(busy) => {
            tracing::debug!(%busy, "replacement permit busy");
            return (Replacement::Busy, None);
        }
    };
    match throttle(stores, ns, m, &deployment) {
        Some(throttled) => (Replacement::Throttled(throttled), Some(permit)),
        None => (Replacement::Allowed, Some(permit)),
    }
}

/// Whether `deployment` allows no further failure now: its remediation short-circuit holds
/// (too many of its machines are unhealthy at once), or its budget of machines in flight is
/// used up (the `remediation.mcm-rs.io/max-in-flight` annotation, else maxSurge, at least 1).
/// `Some` says why. A remediation annotation that does not resolve holds all remediation and
/// says so.
fn throttle(
    stores: &Stores,
    ns: &str,
    m: &Machine,
    deployment: &MachineDeployment,
) -> Option<String> {
    let name = deployment.name_any();
    let policy = match remediation::policy_of(deployment.metadata.annotations.as_ref()) {
        Ok(p) => p,
        Err(e) => {
            return Some(format!(
                "remediation of MachineDeployment {name} is held until its annotation is fixed: {e}"
            ));
        }
    };
    let census = census(stores, ns, m, deployment);
    remediation::verdict(&policy, max_replacements(deployment), census).map(|t| t.describe(&name))
}

/// Counts the machines of `deployment` for its remediation decision about `m` (counted as
/// unhealthy: it is about to fail), as [`remediation::Member`] defines them, with their
/// Nodes from the store.
fn census(
    stores: &Stores,
    ns: &str,
    m: &Machine,
    deployment: &MachineDeployment,
) -> remediation::Census {
    let members = stores
        .machines
        .state()
        .into_iter()
        .filter(|other| {
            owners(stores, ns, other)
                .1
                .is_some_and(|d| d.uid() == deployment.uid())
        })
        .map(|other| {
            let node =
                observe::node_name(&other).and_then(|n| stores.nodes.get(&ObjectRef::new(n)));
            let member = remediation::Member::of(&other, node.as_deref());
            if other.uid() == m.uid() {
                member.deciding()
            } else {
                member
            }
        });
    remediation::census(deployment.spec.replicas(), members)
}
