//! The writes of an in-place rollout: a machine's move to the new set (through the
//! deployment's [`Actor`]) and the Node writes (in-place labels, uncordon, clean-up), each
//! idempotent.

use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use mcm_api::{Machine, MachineSet};

use super::super::act::Actor;
use super::super::context::{Context, DeploymentProblem, Error};
use super::patch::{cleanup_patch, label_patch, transfer_patch};
use crate::kube_api::{self, ApiCallError, ApiErrorExt, ApiResultExt};

/// Moves `machine` (as observed) from the set whose selector is `old_selector` to `new_set`
/// ([`transfer_patch`]).
pub(crate) async fn move_machine(
    act: &Actor<'_>,
    machine: &Machine,
    old_selector: &BTreeMap<String, String>,
    from: &str,
    new_set: &MachineSet,
) -> Result<(), Error> {
    let patch = transfer_patch(machine, old_selector, new_set);
    act.move_machine(&machine.name_any(), &patch).await?;
    tracing::info!(
        machine = %machine.name_any(),
        from,
        to = %new_set.name_any(),
        "moved an in-place updated machine to the new MachineSet"
    );
    Ok(())
}

/// Labels `node` (as the store had it) `key: "true"` unless it has the label; a Node gone
/// meanwhile needs nothing.
pub(crate) async fn label_node(api: &Api<Node>, node: &Node, key: &str) -> Result<(), Error> {
    let Some(patch) = label_patch(node, key) else {
        return Ok(());
    };
    let name = node.name_any();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(ApiCallError::new("label", "Node", &name, e).into()),
    }
}

/// Uncordons the Node `name`: removes what the drain's cordon added
/// ([`mcm_drain::uncordon`]); a Node gone or not cordoned by the drain is fine.
pub(crate) async fn uncordon(ctx: &Context, name: &str) -> Result<(), Error> {
    mcm_drain::uncordon(ctx.target.clone(), name)
        .await
        .map_err(|source| {
            Error::Problem(DeploymentProblem::Uncordon {
                node: name.to_owned(),
                source,
            })
        })?;
    Ok(())
}

/// Cleans up the Node `name` after the successful in-place update of its machine: uncordons
/// it, then applies [`cleanup_patch`] planned from a fresh read (the store's copy is stale
/// after the uncordon), again after a conflict. Uncordoning first makes a crash in between
/// harmless: the Node keeps `update-result` until both are done.
pub(crate) async fn clean_node(ctx: &Context, api: &Api<Node>, name: &str) -> Result<(), Error> {
    uncordon(ctx, name).await?;
    let Some(node) = api.get_opt(name).await.context("get", "Node", name)? else {
        return Ok(());
    };
    if cleanup_patch(&node).is_none() {
        return Ok(());
    }
    // A node gone meanwhile needs no clean-up.
    let _ = kube_api::patch_from_copy(api, &node, cleanup_patch)
        .await
        .context("clean up after the in-place update", "Node", name)?;
    tracing::info!(node = name, "cleaned up a node after its in-place update");
    Ok(())
}
