//! Plain data of the MachineDisruptionBudget controller: a valid budget spec ([`Policy`]),
//! how a selected machine counts ([`Standing`], [`Counts`]), a refused disruption
//! ([`Blocked`]) and one that waits ([`Waiting`]), and what a budget's status should say
//! ([`Verdict`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::cron::Schedule;
use mcm_api::{ConditionStatus, DisruptionReason};

/// The limit of a valid budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Limit {
    /// `minAvailable`.
    MinAvailable(IntOrString),
    /// `maxUnavailable`.
    MaxUnavailable(IntOrString),
}

/// A valid budget spec, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Policy {
    /// The limit.
    pub limit: Limit,
    /// The reasons it limits (`None`: every voluntary reason).
    pub reasons: Option<BTreeSet<DisruptionReason>>,
    /// Its windows (empty: always applies).
    pub windows: Vec<(Schedule, Duration)>,
}

/// Why a budget spec cannot be acted on (all problems, in one message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub(crate) struct InvalidSpec {
    /// One line per problem, naming the field.
    pub problems: Vec<String>,
}

impl Policy {
    /// Whether the budget limits `reason`.
    pub(crate) fn covers(&self, reason: &DisruptionReason) -> bool {
        self.reasons.as_ref().is_none_or(|rs| rs.contains(reason))
    }

    /// Whether the budget applies at `now`: always without windows, else while one is open
    /// (its schedule fired at most its duration ago).
    pub(crate) fn in_window(&self, now: Timestamp) -> bool {
        self.windows.is_empty()
            || self.windows.iter().any(|(s, d)| {
                s.last_start(now, *d)
                    .is_some_and(|t| now.duration_since(t).unsigned_abs() < *d)
            })
    }
}

/// How a selected machine counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Running and not being deleted.
    Available,
    /// Being deleted (or its deletion was just issued).
    Deleting,
    /// Unavailable for another reason (Failed, Unknown, Pending, ...).
    Involuntary,
}

/// The numbers of a budget (its status counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    /// Selected machines.
    pub expected: i32,
    /// Available ones.
    pub current_available: i32,
    /// Ones that must stay available.
    pub desired_available: i32,
    /// Voluntary disruptions allowed now.
    pub disruptions_allowed: i32,
    /// Involuntarily unavailable ones.
    pub unavailable_involuntary: i32,
    /// Ones being deleted.
    pub deleting: i32,
}

impl Counts {
    /// At least as many available as desired.
    pub(crate) fn healthy(&self) -> bool {
        self.current_available >= self.desired_available
    }
}

/// A voluntary disruption that must wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MachineDisruptionBudget {budget} blocks the {reason} of machine {machine}: {message}")]
pub(crate) struct Blocked {
    /// The budget's name.
    pub budget: String,
    /// The machine's name.
    pub machine: String,
    /// The reason of the disruption.
    pub reason: DisruptionReason,
    /// Why (counts).
    pub message: String,
}

/// A voluntary disruption that waits for a budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// The machine.
    pub machine: String,
    /// The reason.
    pub reason: DisruptionReason,
    /// When it was last refused.
    pub since: Instant,
}

/// What a budget's status should say, computed from facts. Pure.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// Counters (`None` for an invalid spec, where only the selection is counted).
    pub counts: Counts,
    /// Whether the limit could be evaluated.
    pub valid: bool,
    /// Condition status, reason and message.
    pub condition: (ConditionStatus, &'static str, String),
    /// The Warning Event to publish when this differs from the last one (`reason`, note).
    pub warning: Option<(&'static str, String)>,
}
