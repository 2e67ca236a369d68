//! Voluntary deletions and the MachineDisruptionBudget gate, pure: why the set deletes a
//! machine as far as budgets are concerned, the gate's verdict on each planned deletion
//! (from the [`GateView`](crate::disruptionbudget::gate::GateView) the reconcile read) and the
//! announcement of the refusals.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use mcm_api::{DisruptionReason, Machine};

use super::model::Snapshot;
use crate::disruptionbudget::gate::{Enforcement, Reservation};
use crate::disruptionbudget::{self, Blocked, Refusal};

/// The voluntary reason of deleting `machine` of the set of `s` (`None`: involuntary or not
/// gated). Pure.
fn voluntary_reason(s: &Snapshot, machine: &Machine) -> Option<DisruptionReason> {
    if s.set.metadata.deletion_timestamp.is_some() || machine.metadata.deletion_timestamp.is_some()
    {
        // Deleting a set is a user's direct deletion, like deleting a Deployment's pods by
        // deleting the Deployment: no budget is asked.
        return None;
    }
    let name = machine.name_any();
    let failed_to_replace = machine.phase() == Some(&mcm_api::MachinePhase::Failed)
        && mcm_api::preservation::failed_machine_to_terminate(
            machine,
            s.node_preserve.get(&name).map(String::as_str),
            s.now,
        );
    disruptionbudget::decide::deletion_reason(
        failed_to_replace,
        disruptionbudget::decide::was_preserved(machine, s.node_preserved.contains(&name)),
        s.old_set_of_rollout,
    )
}

/// The gate's verdicts on the planned deletions of a set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct GateVerdicts {
    /// The names to delete, in the plan's order (admitted and not gated ones).
    pub(crate) issue: Vec<String>,
    /// The admitted ones among them.
    pub(crate) admitted: Vec<String>,
    /// The refusals.
    pub(crate) refused: Vec<Refusal>,
    /// What to record in the gate before deleting (`None`: the gate does not enforce
    /// budgets, nothing is recorded).
    pub(crate) reservation: Option<Reservation>,
}

/// The gate's verdict on each planned deletion `names` of the `claimed` machines: as the gate
/// of `s` would answer one after the other (each admitted deletion counts as in flight for
/// the next). Involuntary deletions are never asked about. Pure.
pub(crate) fn gate_deletions(
    s: &Snapshot,
    names: &[String],
    claimed: &[Arc<Machine>],
) -> GateVerdicts {
    let ns = s.set.namespace().unwrap_or_default();
    let refs: Vec<&Machine> = s.machines.iter().map(AsRef::as_ref).collect();
    let mut in_flight: HashSet<String> = s.gate.in_flight.clone();
    let mut out = GateVerdicts::default();
    let mut blocked: Vec<Blocked> = Vec::new();
    for name in names {
        let Some(machine) = claimed.iter().find(|m| m.name_any() == *name) else {
            out.issue.push(name.clone());
            continue;
        };
        let Some(reason) = voluntary_reason(s, machine) else {
            out.issue.push(name.clone());
            continue;
        };
        let verdict = match s.gate.enforcement {
            Enforcement::Absent => {
                out.issue.push(name.clone());
                continue;
            }
            Enforcement::Pending => Err(Refusal::NotSynced),
            Enforcement::Enforced => disruptionbudget::decide::may_disrupt(
                s.budgets.iter().map(AsRef::as_ref),
                &refs,
                machine,
                &reason,
                s.now,
                &in_flight,
            )
            .map_err(Refusal::from),
        };
        match verdict {
            Ok(()) => {
                in_flight.insert(name.clone());
                out.issue.push(name.clone());
                out.admitted.push(name.clone());
            }
            Err(refusal) => {
                if let Refusal::Blocked(b) = &refusal {
                    blocked.push(b.clone());
                }
                out.refused.push(refusal);
            }
        }
    }
    if s.gate.enforcement == Enforcement::Enforced
        && !(out.admitted.is_empty() && blocked.is_empty())
    {
        out.reservation = Some(Reservation {
            namespace: ns,
            version: s.gate.version,
            admitted: out.admitted.clone(),
            refused: blocked,
        });
    }
    out
}

/// The announcement of budget refusals: its note (what the announcement record compares;
/// empty: nothing is refused by a budget) and the Warning Events it publishes when new.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct RefusalNote {
    /// `budget/machine` of each blocked deletion, joined.
    pub(crate) note: String,
    /// The Events: on the set, and on each budget the store has, per blocked deletion.
    pub(crate) events: Vec<(ObjectReference, String)>,
}

/// The announcement of `refused` for `set` (Warnings on the set and on the budgets of `s`).
/// Pure.
pub(crate) fn refusal_note(s: &Snapshot, refused: &[Refusal]) -> RefusalNote {
    let set = &*s.set;
    let blocked: Vec<&Blocked> = refused
        .iter()
        .filter_map(|r| match r {
            Refusal::Blocked(b) => Some(b),
            Refusal::NotSynced => None,
        })
        .collect();
    let note = blocked
        .iter()
        .map(|b| format!("{}/{}", b.budget, b.machine))
        .collect::<Vec<_>>()
        .join(",");
    let set_ref = kube::Resource::object_ref(set, &());
    let mut events = Vec::new();
    for b in blocked {
        let text = format!(
            "Not deleting machine {} ({}) of MachineSet {}: MachineDisruptionBudget {} allows no disruption now ({})",
            b.machine,
            b.reason,
            set.name_any(),
            b.budget,
            b.message
        );
        events.push((set_ref.clone(), text.clone()));
        if let Some(budget) = s
            .budgets
            .iter()
            .find(|x| x.name_any() == b.budget && x.namespace() == set.namespace())
        {
            events.push((kube::Resource::object_ref(budget.as_ref(), &()), text));
        }
    }
    RefusalNote { note, events }
}
