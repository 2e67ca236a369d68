//! What the budget controller reads: a budget's machines from the machine store with the
//! gate's in-flight deletions and waits (`observe`), and the budgets a machine event
//! concerns ([`budgets_for_machine`]).

use std::collections::HashSet;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use mcm_api::{Machine, MachineDisruptionBudget};

use super::context::Context;
use super::decide;
use super::model::Waiting;

/// A budget's facts as one reconcile reads them.
pub(crate) struct Observed {
    /// The machines of the store (all namespaces).
    pub machines: Vec<Arc<Machine>>,
    /// The deletions in flight in the budget's namespace.
    pub in_flight: HashSet<String>,
    /// The disruptions waiting for the budget.
    pub waiting: Vec<Waiting>,
}

impl Observed {
    /// The machines `budget` selects.
    pub(crate) fn selected(&self, budget: &MachineDisruptionBudget) -> Vec<&Machine> {
        self.machines
            .iter()
            .map(AsRef::as_ref)
            .filter(|m| decide::selects(budget, m))
            .collect()
    }
}

/// Reads the machines, the in-flight deletions and the waits of `budget`.
pub(crate) fn observe(ctx: &Context, budget: &MachineDisruptionBudget) -> Observed {
    let ns = budget.namespace().unwrap_or_default();
    let machines = ctx.machines.state();
    let instant = ctx.clock.instant();
    let in_flight = ctx.gate.in_flight(&ns, &machines, instant);
    let waiting = ctx.gate.waiting(&ns, &budget.name_any(), instant);
    Observed {
        machines,
        in_flight,
        waiting,
    }
}

/// The budgets that select `machine`, for watches.
pub(crate) fn budgets_for_machine(
    machine: &Machine,
    budgets: &Store<MachineDisruptionBudget>,
) -> Vec<ObjectRef<MachineDisruptionBudget>> {
    budgets
        .state()
        .iter()
        .filter(|b| decide::selects(b, machine))
        .map(|b| ObjectRef::from_obj(b.as_ref()))
        .collect()
}
