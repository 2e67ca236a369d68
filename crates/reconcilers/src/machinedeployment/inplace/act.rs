//! The writes of an in-place rollout: scaling a set through the deployment's [`Actor`] (and
//! recording it in the snapshot the next steps decide from), and the Node writes (in-place
//! labels, uncordon, clean-up), each idempotent.

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::super::act::Actor;
use super::super::context::{Context, DeploymentProblem, Error};
use super::model::InPlaceSnapshot;
use super::patch::{cleanup_patch, label_patch};
use crate::kube_api::{self, ApiCallError, ApiErrorExt, ApiResultExt};

/// Scales the set `name` through the actor and records it in `s`.
pub(crate) async fn scale(
    act: &Actor<'_>,
    s: &mut InPlaceSnapshot,
    name: &str,
    replicas: i32,
) -> Result<(), Error> {
    let current = std::iter::once(&s.new_set)
        .chain(s.old_sets.iter())
        .find(|x| x.state.name == name)
        .map(|x| x.state.clone());
    // Upstream's MaxSurge is 0 for in-place updates: max-replicas is the replicas.
    let new_set = s.new_set.state.name == name;
    act.scale_set(name, current.as_ref(), replicas, 0, new_set)
        .await?;
    s.scale(name, replicas);
    Ok(())
}

/// Labels the Node `name` (as the store has it) `key: "true"`; false when it has the label
/// already or is unknown or gone.
pub(crate) async fn label_node(
    ctx: &Context,
    api: &Api<Node>,
    name: &str,
    key: &str,
) -> Result<bool, Error> {
    let Some(node) = ctx.nodes.get(&ObjectRef::new(name)) else {
        return Ok(false);
    };
    let Some(patch) = label_patch(&node, key) else {
        return Ok(false);
    };
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(ApiCallError::new("label", "Node", name, e).into()),
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
