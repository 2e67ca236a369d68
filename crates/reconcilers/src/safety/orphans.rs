//! Orphan VM collection, a controller per MachineClass: the VMs the driver lists for the
//! class that no Machine owns are deleted, every orphan period and whenever a deletion asks
//! for a pass (leftovers of a VM are looked for).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{DeleteMachineRequest, ListMachinesRequest, RequestId};

use crate::kube_api;
use crate::machine::{Ctx, Error, act, nodefinalizer, observe};

/// The `controller` label of the collector's reconcile metrics.
pub(crate) const CONTROLLER: &str = "orphans";

/// The least time between two passes asked for by deletions (each finished deletion asks
/// for one, to find the leftovers of its VM). A pass lists every VM of the class from the
/// cloud: during the scale-down of a fleet, one per deletion would be a cloud API call per
/// machine and kept the collector busy without a pause; asked for within this time of the
/// last pass, the next one waits for it.
pub(crate) const ON_DEMAND_MIN_GAP: Duration = Duration::from_secs(5);

/// The orphans among the VMs a driver listed: `(provider id, machine name)` pairs whose
/// machine name no Machine has.
pub(crate) fn orphans<'a>(
    listed: &'a BTreeMap<String, String>,
    machine_names: &BTreeSet<String>,
) -> Vec<(&'a str, &'a str)> {
    listed
        .iter()
        .filter(|(_, name)| !machine_names.contains(*name))
        .map(|(id, name)| (id.as_str(), name.as_str()))
        .collect()
}

/// The Node an orphan VM registered (its `spec.providerID`), unless a Machine claims that
/// Node (its `node` label) or the Node is not managed by MCM. Once the VM is deleted such a
/// Node would stay NotReady for ever. Pure.
pub(crate) fn orphan_node<'a>(
    nodes: &'a [Arc<Node>],
    machines: &[Arc<Machine>],
    provider_id: &str,
) -> Option<&'a Node> {
    let node = nodes
        .iter()
        .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id))?;
    let name = node.name_any();
    let claimed = machines
        .iter()
        .any(|m| m.node_name() == Some(name.as_str()));
    (!claimed && !observe::node_not_managed(node)).then_some(node.as_ref())
}

/// What the collector needs: the machine controller's context and its period.
pub(crate) struct OrphanCtx {
    /// The machine controller's context (driver, clients, stores, freeze).
    pub machine: Arc<Ctx>,
    /// `--machine-safety-orphan-vms-period`.
    pub period: Duration,
}

/// One collection pass for one class: deletes the VMs of the class that no Machine owns.
/// Returns how many were deleted. Nothing happens while frozen or before the stores synced.
pub(crate) async fn collect(ctx: &Ctx, class: &MachineClass) -> Result<usize, Error> {
    if ctx.freeze.is_frozen() || class.metadata.deletion_timestamp.is_some() {
        return Ok(0);
    }
    if ctx.settings.target_cluster {
        release_unclaimed_nodes(ctx).await?;
    }
    let class_name = class.name_any();
    let (class, secret) = match act::class_and_secret(ctx, &class_probe(&class_name)).await {
        Ok(x) => x,
        Err(Error::Class(p)) => {
            tracing::debug!(problem = %p, "class unusable: no orphan collection");
            return Ok(0);
        }
        Err(e) => return Err(e),
    };
    let request_id = RequestId::generate();
    let listed = ctx
        .driver
        .list_machines(ListMachinesRequest {
            machine_class: class.clone(),
            secret: secret.clone(),
            request_id: request_id.clone(),
        })
        .await
        .map_err(|e| Error::driver("list_machines", e))?;
    if listed.machines.is_empty() {
        return Ok(0);
    }
    // Candidates from the store; each one is confirmed by reading its Machine from the API
    // server, since a store that lags behind must never make a VM look orphaned. (One read
    // per candidate, and none in the usual pass that finds every VM owned: a list of all
    // Machines after every deletion cost a LIST of the whole namespace per deleted machine,
    // and its memory, during a scale-down of a thousand.)
    let in_store: BTreeSet<String> = ctx
        .stores
        .machines
        .state()
        .iter()
        .map(|m| m.name_any())
        .collect();
    let mut deleted = 0;
    for (provider_id, machine_name) in orphans(&listed.machines, &in_store) {
        if act::machine_exists(ctx, machine_name).await? {
            tracing::debug!(
                %provider_id,
                vm_machine = machine_name,
                "not an orphan: its Machine exists (the store had not seen it yet)"
            );
            continue;
        }
        let mut vm_machine = Machine::new(machine_name, Default::default());
        vm_machine.metadata.namespace = Some(ctx.settings.namespace.clone());
        vm_machine.spec.provider_id = Some(provider_id.to_string());
        tracing::info!(%provider_id, vm_machine = machine_name, %request_id, "deleting orphan VM");
        ctx.driver
            .delete_machine(DeleteMachineRequest {
                machine: vm_machine,
                machine_class: class.clone(),
                secret: secret.clone(),
                request_id: request_id.clone(),
            })
            .await
            .or_else(|e| {
                if e.is_not_found() {
                    Ok(Default::default())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| Error::driver("delete_machine", e))?;
        ctx.events
            .warning(
                &kube::Resource::object_ref(&class, &()),
                "OrphanVMDeleted",
                "OrphanCollection",
                format!("deleted orphan VM {provider_id} (machine {machine_name} does not exist)"),
            )
            .await;
        if ctx.settings.target_cluster {
            delete_orphan_node(ctx, &class, provider_id).await?;
        }
        deleted += 1;
    }
    Ok(deleted)
}

/// Deletes the Node the orphan VM `provider_id` registered, if the store has one that no
/// Machine claims (see [`orphan_node`]).
async fn delete_orphan_node(
    ctx: &Ctx,
    class: &MachineClass,
    provider_id: &str,
) -> Result<(), Error> {
    let nodes = ctx.stores.nodes.state();
    let Some(node) = orphan_node(&nodes, &ctx.stores.machines.state(), provider_id) else {
        return Ok(());
    };
    let name = node.name_any();
    if nodefinalizer::held(node) {
        nodefinalizer::release(ctx, &name).await?;
    }
    let api: Api<Node> = Api::all(ctx.target.clone());
    let outcome = kube_api::delete(&api, &name, &DeleteParams::default())
        .await
        .map_err(|e| Error::kube("delete the node of an orphan VM", e))?;
    if !outcome.is_gone() {
        tracing::info!(%provider_id, node = name, "deleted the node of an orphan VM");
        ctx.events
            .warning(
                &kube::Resource::object_ref(class, &()),
                "OrphanNodeDeleted",
                "OrphanCollection",
                format!("deleted node {name} of orphan VM {provider_id}"),
            )
            .await;
    }
    Ok(())
}

/// Releases the Node finalizer from Nodes that no Machine claims any longer
/// ([`nodefinalizer::unclaimed`]): a Machine whose finalizer was removed by hand leaves its
/// Node held, and `kubectl delete node` would wait for ever. Each candidate's Machine (named by
/// the Node's label) is confirmed absent on the API server first.
async fn release_unclaimed_nodes(ctx: &Ctx) -> Result<(), Error> {
    let nodes = ctx.stores.nodes.state();
    let machines = ctx.stores.machines.state();
    let timeout = ctx.settings.defaults.creation_timeout;
    for node in nodefinalizer::unclaimed(&nodes, &machines, timeout, ctx.clock.now()) {
        let name = node.name_any();
        if let Some(machine) = node
            .labels()
            .get(mcm_api::constants::labels::NODE_MACHINE_NAME)
            && act::machine_exists(ctx, machine).await?
        {
            continue;
        }
        tracing::info!(
            node = name,
            "releasing the finalizer of a node no machine claims"
        );
        nodefinalizer::release(ctx, &name).await?;
    }
    Ok(())
}

/// A Machine that names only `class_name`, to resolve the class and its secrets.
fn class_probe(class_name: &str) -> Machine {
    let mut m = Machine::new("orphan-probe", Default::default());
    m.spec.class = Some(mcm_api::ClassSpec {
        api_group: None,
        kind: Some(mcm_api::constants::MACHINE_CLASS_KIND.into()),
        name: Some(class_name.into()),
    });
    m
}

/// Reconciles one class: a collection pass once the stores synced, then again after the
/// orphan period.
pub(crate) async fn reconcile(
    class: Arc<MachineClass>,
    ctx: Arc<OrphanCtx>,
) -> Result<Action, Error> {
    // A store that has not listed yet is no evidence that a Machine does not exist.
    let mut synced = ctx.machine.synced.subscribe();
    let _ = synced.wait_for(|s| *s).await;
    match collect(&ctx.machine, &class).await? {
        0 => {}
        n => tracing::info!(deleted = n, "orphan collection deleted VMs"),
    }
    Ok(Action::requeue(ctx.period))
}

/// Retry policy of a failed pass: the next pass after a tenth of the period (at least 5 s).
pub(crate) fn error_policy(
    _class: Arc<MachineClass>,
    error: &Error,
    ctx: Arc<OrphanCtx>,
) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "orphan collection failed");
    Action::requeue((ctx.period / 10).max(Duration::from_secs(5)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_vms_without_a_machine_of_that_name() {
        let listed = BTreeMap::from([
            ("local:///a".to_string(), "a".to_string()),
            ("local:///b".to_string(), "b".to_string()),
        ]);
        let names = BTreeSet::from(["a".to_string()]);
        assert_eq!(orphans(&listed, &names), vec![("local:///b", "b")]);
        assert!(orphans(&listed, &BTreeSet::from(["a".into(), "b".into()])).is_empty());
    }

    #[test]
    fn the_node_of_an_orphan_vm_goes_unless_a_machine_claims_it_or_it_is_not_managed() {
        let node = |name: &str, id: &str, not_managed: bool| -> Arc<Node> {
            let mut n: Node = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name }, "spec": { "providerID": id }
            }))
            .unwrap();
            if not_managed {
                n.metadata.annotations = Some(
                    [(
                        mcm_api::constants::annotations::NOT_MANAGED_BY_MCM.to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                );
            }
            Arc::new(n)
        };
        let machine = |node: &str| -> Arc<Machine> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                    "metadata": { "name": "m", "labels": { "node": node } }, "spec": {}
                }))
                .unwrap(),
            )
        };
        let nodes = vec![
            node("a", "local:///a", false),
            node("b", "local:///b", false),
            node("c", "local:///c", true),
        ];
        let machines = vec![machine("b")];
        let found = orphan_node(&nodes, &machines, "local:///a").map(|n| n.name_any());
        assert_eq!(found.as_deref(), Some("a"));
        assert!(
            orphan_node(&nodes, &machines, "local:///b").is_none(),
            "claimed"
        );
        assert!(
            orphan_node(&nodes, &machines, "local:///c").is_none(),
            "not managed"
        );
        assert!(
            orphan_node(&nodes, &machines, "local:///x").is_none(),
            "no node"
        );
    }
}
