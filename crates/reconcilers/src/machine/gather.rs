//! The first part of a reconcile: every read it decides from, taken once. The stores, the
//! settings and "now" from the context's clock; then the driver, only where
//! [`plan::probe`] says an answer can change the plan.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use mcm_api::{Machine, MachinePhase};

use super::decide::{self, ClassProblem, Probe, VmReport};
pub(crate) use super::model::{NodeState, Replacement, Snapshot};
use super::partition::{self, ZoneMember, ZonePartition};
use super::{Ctx, act, fleet, observe, plan};

/// Reads what a reconcile of `m` decides from; `None` while the store's copy of `m` predates
/// this controller's own last write (deciding on it would repeat that write's step).
pub(crate) async fn gather(ctx: &Ctx, m: &Arc<Machine>) -> Option<Snapshot> {
    if ctx.store_is_behind(m) {
        return None;
    }
    let frozen = ctx.freeze.is_frozen();
    let ns = &ctx.settings.namespace;
    let (_, deployment) = fleet::owners(&ctx.stores, ns, m);
    let (cfg, policy_problem) = observe::machine_config_in(
        m,
        deployment
            .as_ref()
            .and_then(|d| d.metadata.annotations.as_ref()),
        &ctx.settings.defaults,
    );
    let class = match observe::class_name(m) {
        Err(p) => Err(p),
        Ok(name) => match ctx.class(name) {
            None => Err(ClassProblem::ClassMissing { name: name.into() }),
            Some(_) => Ok(()),
        },
    };
    let node = observe::node_name(m)
        .and_then(|n| ctx.node(n))
        .filter(|n| !observe::node_not_managed(n));
    let deleting = m.metadata.deletion_timestamp.is_some();
    let attachments_left = match observe::node_name(m) {
        Some(n) if deleting => act::attachments_of(ctx, n).len(),
        _ => 0,
    };
    let mut snapshot = Snapshot {
        machine: m.clone(),
        now: ctx.clock.now(),
        frozen,
        node_state: node_state(ctx, m),
        cfg,
        policy_problem,
        deployment,
        class,
        node,
        protection: decide::protection_matters(m.phase())
            .then(|| fleet::failure_protection(&ctx.stores, ns, m))
            .flatten(),
        replacement: Replacement::NotAsked,
        permit: None,
        node_copy_behind: false,
        attachments_left,
        vm: VmReport::NotAsked,
        zone_partition: None,
    };
    snapshot.node_copy_behind = snapshot
        .node
        .as_deref()
        .is_some_and(|n| ctx.node_store_is_behind(n));
    snapshot.zone_partition = zone_partition(ctx, m, snapshot.node.as_deref());
    match plan::probe(&snapshot, &ctx.settings) {
        Probe::None => {}
        Probe::VmStatus => snapshot.vm = act::vm_report(ctx, m).await,
    }
    // Counted under the deployment's permit, held until the reconcile ends: it serialises
    // concurrent failures of its machines, so each counts the failures written before it.
    if plan::asks_replacement(&snapshot, &ctx.settings) {
        let (replacement, permit) = fleet::replacement(&ctx.permits, &ctx.stores, ns, m);
        snapshot.replacement = replacement;
        snapshot.permit = permit.map(Arc::new);
    }
    Some(snapshot)
}

/// The partition of the zone of `m`, counted over every machine of the namespace: only for
/// an Unknown machine whose Node is unreachable (the only kind a partition holds).
fn zone_partition(ctx: &Ctx, m: &Machine, node: Option<&Node>) -> Option<ZonePartition> {
    if m.phase() != Some(&MachinePhase::Unknown) || m.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let rule = &ctx.settings.defaults.zone_partition;
    if rule.max_hold.is_zero() || !observe::node_health(node?, &[]).unreachable {
        return None;
    }
    let zone = zone_of(node)?;
    let members: Vec<ZoneMember> = ctx
        .stores
        .machines
        .state()
        .iter()
        .filter(|x| x.metadata.deletion_timestamp.is_none())
        .map(|x| {
            let node = observe::node_name(x).and_then(|n| ctx.node(n));
            partition::member(x, node.as_deref())
        })
        .collect();
    partition::zone_partition(&zone, &members, rule)
}

/// The zone of a machine: its Node's zone label (the manager, which reports partitions on
/// the MachineDeployments, counts the same way).
fn zone_of(node: Option<&Node>) -> Option<String> {
    node.and_then(|n| partition::node_zone(n.metadata.labels.as_ref()))
}

/// The state of the Node `m` records, from the Node store. A Node deleted while annotated
/// not-managed-by-MCM counts as present: its Machine stays.
fn node_state(ctx: &Ctx, m: &Machine) -> NodeState {
    match observe::node_name(m) {
        None => NodeState::NotRecorded,
        Some(n) => match ctx.node(n) {
            Some(node) if observe::node_not_managed(&node) => NodeState::Present,
            Some(node) if node.metadata.deletion_timestamp.is_some() => NodeState::Deleting,
            Some(_) => NodeState::Present,
            None if ctx.unmanaged_node_deleted(n) => NodeState::Present,
            None => NodeState::Gone,
        },
    }
}
