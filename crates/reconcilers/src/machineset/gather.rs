//! The first part of a reconcile of a set: every read it decides from, taken once (the
//! stores, the set's expectations, the budget gate's view, "now" from the context's clock).
//! No writes, no Events.

use std::sync::Arc;

use kube::ResourceExt;
use mcm_api::MachineSet;

use super::context::Context;
use super::model::Snapshot;
use super::observe;

/// Reads what a reconcile of `set` decides from.
pub(crate) fn gather(ctx: &Context, set: &Arc<MachineSet>) -> Snapshot {
    let ns = set.namespace().unwrap_or_default();
    let key = format!("{ns}/{}", set.name_any());
    let (now, instant) = (ctx.clock.now(), ctx.clock.instant());
    let machines = observe::machines_in(&ctx.machines, &ns);
    Snapshot {
        set: set.clone(),
        pending: ctx.expectations.pending(&key),
        key,
        now,
        instant,
        node_preserve: observe::node_preserve_annotations(&ctx.nodes, &machines),
        node_preserved: observe::nodes_preserved(&ctx.nodes, &machines),
        old_set_of_rollout: observe::is_old_set_of_rollout(set, &ctx.deployments),
        budgets: ctx.budget_gate.budgets.state(),
        gate: ctx.budget_gate.view(&ns, &ctx.machines.state(), instant),
        machines,
    }
}
