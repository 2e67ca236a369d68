//! The machine controller: the lifecycle of each Machine, its VM and its Node.
//!
//! Each reconcile ([`reconcile()`]) observes ([`observe`]), decides ([`decide::next_step`],
//! pure) and acts ([`act`], one idempotent action per step). [`ctx`] is what a reconcile
//! reads and uses, [`policy`] the pure rules around the decision (rollout protection,
//! replacement budget, backoff), [`health`], [`remediation`] and [`hooks`] the
//! additive health and disruption policies.

pub mod act;
pub mod ctx;
pub mod decide;
pub mod error;
pub mod freeze;
pub mod health;
pub mod hooks;
pub mod inplace;
pub mod metrics;
pub mod nodetemplate;
pub mod observe;
pub mod policy;
pub mod preserve;
pub mod reconcile;
pub mod remediation;
pub mod settings;
pub mod status;
pub mod token;

pub use ctx::{Ctx, Stores};
pub use error::Error;
pub use freeze::Freeze;
pub use metrics::MachineMetrics;
pub use policy::{backoff_delay, max_replacements, rollout_protection};
pub use reconcile::{CONTROLLER, error_policy, reconcile};
pub use settings::Settings;
