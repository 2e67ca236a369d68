//! The MachineDisruptionBudget controller: writes each budget's status (counters and the
//! `DisruptionAllowed` condition) and publishes Events on transitions: `InvalidSpec`
//! (Warning) when the spec cannot be acted on, `BudgetExhausted` (Warning) when no
//! disruption is allowed while a voluntary disruption waits for the budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use mcm_api::disruption_budget::{
    BudgetCondition, CONDITION_DISRUPTION_ALLOWED, MachineDisruptionBudgetStatus, condition_reasons,
};
use mcm_api::{ConditionStatus, Machine, MachineDisruptionBudget};

use super::decide::{self, Counts};
use super::{BudgetGate, Waiting};
use crate::events::EventPublisher;
use crate::kube_api::{self, ApiResultExt, Part, ReconcileFailure, RetryPolicy, merge_patch};

/// The `controller` label of this controller's reconcile metrics.
pub const CONTROLLER: &str = "machinedisruptionbudget";
/// How often a budget is reconciled without any event.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(300);
/// How often a budget with windows is looked at (a window opens or closes on a minute).
pub const WINDOW_PERIOD: Duration = Duration::from_secs(30);

/// Problems of a budget that are no API failures (none yet: a bad spec is reported on the
/// object, not returned).
#[derive(Debug, thiserror::Error)]
pub enum BudgetProblem {}

/// Errors of the budget reconciler.
pub type Error = ReconcileFailure<BudgetProblem>;

/// Shared state of the budget controller.
pub struct Context {
    /// Client of the control cluster.
    pub client: Client,
    /// Store of the Machines.
    pub machines: Store<Machine>,
    /// The gate (budgets store, in-flight deletions, waits).
    pub gate: BudgetGate,
    /// Event publisher.
    pub events: EventPublisher,
    /// The last Event note announced per budget uid, so an Event is published on a
    /// transition, not on every reconcile.
    pub announced: Mutex<HashMap<String, String>>,
}

/// What a budget's status should say, computed from facts. Pure.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Counters (`None` for an invalid spec, where only the selection is counted).
    pub counts: Counts,
    /// Whether the limit could be evaluated.
    pub valid: bool,
    /// Condition status, reason and message.
    pub condition: (ConditionStatus, &'static str, String),
    /// The Warning Event to publish when this differs from the last one (`reason`, note).
    pub warning: Option<(&'static str, String)>,
}

/// Decides a budget's condition and Warning from its spec, its selected machines, the
/// deletions in flight, the waiting disruptions and `now`. Pure.
pub fn verdict(
    budget: &MachineDisruptionBudget,
    selected: &[&Machine],
    in_flight: &std::collections::HashSet<String>,
    waiting: &[Waiting],
    now: Timestamp,
) -> Verdict {
    match decide::validate(budget) {
        Err(e) => {
            let mut counts = Counts::default();
            for m in selected {
                counts.expected += 1;
                match decide::standing(m, in_flight) {
                    decide::Standing::Available => counts.current_available += 1,
                    decide::Standing::Deleting => counts.deleting += 1,
                    decide::Standing::Involuntary => counts.unavailable_involuntary += 1,
                }
            }
            let message = format!("the budget blocks nothing until its spec is fixed: {e}");
            Verdict {
                counts,
                valid: false,
                condition: (
                    ConditionStatus::False,
                    condition_reasons::INVALID_SPEC,
                    message.clone(),
                ),
                warning: Some((condition_reasons::INVALID_SPEC, message)),
            }
        }
        Ok(policy) => {
            let counts = decide::count(&policy.limit, selected.iter().copied(), in_flight);
            let condition = if !policy.in_window(now) {
                (
                    ConditionStatus::True,
                    condition_reasons::OUTSIDE_WINDOWS,
                    "no window of the budget is open: it blocks nothing now".to_owned(),
                )
            } else if counts.disruptions_allowed > 0 {
                (
                    ConditionStatus::True,
                    condition_reasons::SUFFICIENT_MACHINES,
                    format!(
                        "{} voluntary disruption(s) allowed: {} of {} selected machines available, {} must stay available",
                        counts.disruptions_allowed,
                        counts.current_available,
                        counts.expected,
                        counts.desired_available
                    ),
                )
            } else {
                let mut message = decide::exhausted_message(&counts);
                if !waiting.is_empty() {
                    message.push_str("; waiting: ");
                    message.push_str(&waiting_note(waiting));
                }
                (
                    ConditionStatus::False,
                    condition_reasons::BUDGET_EXHAUSTED,
                    message,
                )
            };
            let warning = (condition.1 == condition_reasons::BUDGET_EXHAUSTED
                && !waiting.is_empty())
            .then(|| {
                (
                    condition_reasons::BUDGET_EXHAUSTED,
                    format!(
                        "No voluntary disruption allowed; waiting: {}",
                        waiting_note(waiting)
                    ),
                )
            });
            Verdict {
                counts,
                valid: true,
                condition,
                warning,
            }
        }
    }
}

fn waiting_note(waiting: &[Waiting]) -> String {
    let mut items: Vec<String> = waiting
        .iter()
        .map(|w| format!("{} of machine {}", w.reason, w.machine))
        .collect();
    items.sort();
    items.join(", ")
}

/// The status a budget should have for `verdict` (the condition's transition time kept
/// when its status did not change).
pub fn desired_status(
    budget: &MachineDisruptionBudget,
    verdict: &Verdict,
    now: Timestamp,
) -> MachineDisruptionBudgetStatus {
    let prev = budget
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_DISRUPTION_ALLOWED));
    let (status, reason, message) = &verdict.condition;
    let last_transition_time = match prev {
        Some(p) if p.status == *status => p.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    let c = &verdict.counts;
    MachineDisruptionBudgetStatus {
        observed_generation: budget.metadata.generation,
        expected_machines: Some(c.expected),
        current_available: Some(c.current_available),
        desired_available: verdict.valid.then_some(c.desired_available),
        disruptions_allowed: Some(if verdict.valid {
            c.disruptions_allowed
        } else {
            0
        }),
        unavailable_involuntary: Some(c.unavailable_involuntary),
        conditions: Some(vec![BudgetCondition {
            type_: CONDITION_DISRUPTION_ALLOWED.to_owned(),
            status: status.clone(),
            last_transition_time,
            reason: Some((*reason).to_owned()),
            message: Some(message.clone()),
            observed_generation: budget.metadata.generation,
        }]),
    }
}

/// The object reference of a budget for Events.
pub fn budget_reference(budget: &MachineDisruptionBudget) -> ObjectReference {
    budget.object_ref(&())
}

/// Reconciles one budget.
pub async fn reconcile(
    budget: Arc<MachineDisruptionBudget>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ns = budget.namespace().unwrap_or_default();
    let name = budget.name_any();
    let now = Timestamp::now();
    let machines = ctx.machines.state();
    let in_flight = ctx.gate.in_flight(&ns, &machines);
    let selected: Vec<&Machine> = machines
        .iter()
        .map(AsRef::as_ref)
        .filter(|m| decide::selects(&budget, m))
        .collect();
    let waiting = ctx.gate.waiting(&ns, &name);
    let verdict = verdict(&budget, &selected, &in_flight, &waiting, now);

    let note = verdict.warning.as_ref().map(|(r, n)| format!("{r}: {n}"));
    let uid = budget.metadata.uid.clone().unwrap_or_default();
    let changed = {
        let mut announced = ctx.announced.lock().unwrap_or_else(|e| e.into_inner());
        let note = note.clone().unwrap_or_default();
        announced.insert(uid, note.clone()).unwrap_or_default() != note
    };
    if changed && let Some((reason, note)) = verdict.warning.clone() {
        ctx.events
            .warning(&budget_reference(&budget), reason, "Evaluate", note)
            .await;
    }

    let status = desired_status(&budget, &verdict, now);
    if budget.status.as_ref() != Some(&status) {
        let api: Api<MachineDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = crate::machineset::controller::status_patch(&status, &["desiredAvailable"]);
        // A budget gone meanwhile needs no status.
        let _ = merge_patch(&api, Part::Status, &name, &patch)
            .await
            .context("update status of", MachineDisruptionBudget::KIND, &name)?;
    }
    let mut next = if budget.spec.windows.as_ref().is_some_and(|w| !w.is_empty()) {
        WINDOW_PERIOD
    } else {
        RESYNC_PERIOD
    };
    if !waiting.is_empty() {
        // Waits expire: look again so that the condition stops naming them.
        next = next.min(super::WAIT_TIMEOUT);
    }
    Ok(Action::requeue(next))
}

/// What to do after a failed reconcile ([`kube_api::error_policy`]).
pub fn error_policy(
    budget: Arc<MachineDisruptionBudget>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    kube_api::error_policy(
        &RetryPolicy::MANAGER,
        MachineDisruptionBudget::KIND,
        &budget.name_any(),
        error,
    )
}
