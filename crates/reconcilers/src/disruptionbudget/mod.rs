//! MachineDisruptionBudgets (`policy.mcm-rs.io/v1alpha1`): the gate the MachineSet
//! controller asks before a voluntary deletion ([`BudgetGate`]), and the controller that
//! writes each budget's status and Events.
//!
//! The gate is shared by every reconcile of the process. A deletion it admits is recorded in
//! a small ledger for [`IN_FLIGHT_TIMEOUT`] (like kube's controller expectations), and
//! counted as unavailable meanwhile, so that concurrent
//! reconciles of several sets never overshoot a budget. Until the budgets have been listed
//! once, voluntary deletions wait; when the cluster does not serve the kind at all (the CRD
//! is not installed, or the manager may not list it), the gate admits everything, so a
//! drop-in installation without the CRD behaves exactly like MCM.
//!
//! The modules, each depending only on those before it: [`model`] (plain data), [`decide`]
//! (pure: validity, counting, admission, the status), [`gate`] (the shared gate and its
//! ledger), [`context`] (the controller's state and error), [`observe`] (reads the stores and
//! the ledger), [`act`] (Events and status writes) and [`reconcile`](mod@reconcile) (the glue).

pub(crate) mod act;
pub(crate) mod context;
pub(crate) mod decide;
pub(crate) mod gate;
pub(crate) mod model;
pub(crate) mod observe;
pub(crate) mod reconcile;

pub(crate) use context::Context;
pub(crate) use gate::{BudgetGate, Refusal};
pub(crate) use model::Blocked;
pub(crate) use observe::budgets_for_machine;
pub(crate) use reconcile::{CONTROLLER, error_policy, reconcile};
