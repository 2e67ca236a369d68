//! Voluntary deletions and the MachineDisruptionBudget gate: why the set deletes a machine
//! as far as budgets are concerned, and the gate's answer for each planned deletion (an
//! admitted one is recorded in flight by the gate, a refused one as a wait on its budget).

use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;
use mcm_api::{DisruptionReason, Machine, MachineSet};

use super::context::Context;
use super::observe::{is_old_set_of_rollout, node_preserve_annotation, node_was_preserved};
use crate::disruptionbudget::{self, Refusal};

/// The voluntary reason of deleting `machine` of `set` (`None`: involuntary or not gated).
fn voluntary_reason(
    ctx: &Context,
    set: &MachineSet,
    machine: &Machine,
    now: Timestamp,
) -> Option<DisruptionReason> {
    if set.metadata.deletion_timestamp.is_some() || machine.metadata.deletion_timestamp.is_some() {
        // Deleting a set is a user's direct deletion, like deleting a Deployment's pods by
        // deleting the Deployment: no budget is asked.
        return None;
    }
    let failed_to_replace = machine.phase() == Some(&mcm_api::MachinePhase::Failed)
        && mcm_api::preservation::failed_machine_to_terminate(
            machine,
            node_preserve_annotation(&ctx.nodes, machine).as_deref(),
            now,
        );
    disruptionbudget::decide::deletion_reason(
        failed_to_replace,
        disruptionbudget::decide::was_preserved(machine, node_was_preserved(&ctx.nodes, machine)),
        is_old_set_of_rollout(set, &ctx.deployments),
    )
}

/// Asks the budget gate about each planned deletion: returns the names to delete now and
/// the refusals. Involuntary deletions are never asked about.
pub(crate) fn gate_deletions(
    ctx: &Context,
    set: &MachineSet,
    names: &[String],
    claimed: &[Arc<Machine>],
) -> (Vec<String>, Vec<String>, Vec<Refusal>) {
    let (now, instant) = (ctx.clock.now(), ctx.clock.instant());
    let all = ctx.machines.state();
    let mut issue = Vec::new();
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for name in names {
        let Some(machine) = claimed.iter().find(|m| m.name_any() == *name) else {
            issue.push(name.clone());
            continue;
        };
        let Some(reason) = voluntary_reason(ctx, set, machine, now) else {
            issue.push(name.clone());
            continue;
        };
        match ctx.budget_gate.admit(&all, machine, &reason, now, instant) {
            Ok(()) => {
                issue.push(name.clone());
                admitted.push(name.clone());
            }
            Err(refusal) => refused.push(refusal),
        }
    }
    (issue, admitted, refused)
}
