//! The safety controllers:
//! - [`orphans`]: VMs the driver lists for a class that no Machine owns are deleted, per
//!   MachineClass, periodically and on demand;
//! - [`apiserver`]: when the control or target API server stays unreachable longer than the
//!   status-check timeout, the machine controller freezes (no machine is marked Failed, no
//!   deletion starts); on recovery it unfreezes and restarts the health timers of Unknown
//!   machines, since their nodes could not report while the path was cut;
//! - [`overshoot`] (manager side): freezes MachineSets with far more machines than asked for.

pub(crate) mod apiserver;
pub(crate) mod orphans;
pub(crate) mod overshoot;

use std::time::Duration;

/// Periods and timeouts of the machine-controller side's safety controllers.
#[derive(Debug, Clone)]
pub struct SafetySettings {
    /// `--machine-safety-orphan-vms-period`
    pub orphan_vms_period: Duration,
    /// `--machine-safety-apiserver-statuscheck-period`
    pub apiserver_statuscheck_period: Duration,
    /// `--machine-safety-apiserver-statuscheck-timeout`
    pub apiserver_statuscheck_timeout: Duration,
}
