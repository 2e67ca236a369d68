//! The settings of the machine controller.

use std::time::Duration;

use super::observe;

/// Settings of the machine controller (the flags of Gardener's machine-controller).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--namespace`: where Machines, MachineClasses and their Secrets live.
    pub namespace: String,
    /// Timeouts and health rules that a Machine's spec may override.
    pub defaults: observe::Defaults,
    /// `--machine-pv-detach-timeout`
    pub pv_detach_timeout: Duration,
    /// `--machine-pv-reattach-timeout`
    pub pv_reattach_timeout: Duration,
    /// `--bootstrap-token-auth-extra-groups`
    pub bootstrap_token_auth_extra_groups: String,
    /// Retry period after `ResourceExhausted` from the driver.
    pub resource_exhausted_retry: Duration,
    /// First retry after a failure; doubles per consecutive failure.
    pub backoff_initial: Duration,
    /// Longest retry period after failures.
    pub backoff_max: Duration,
    /// Pause between evictions refused by a PodDisruptionBudget.
    pub eviction_retry_interval: Duration,
    /// Pods drained at the same time.
    pub drain_parallelism: usize,
    /// Re-check period of healthy machines.
    pub resync: Duration,
    /// There is a target cluster (`--target-kubeconfig` is not `none`). Without one a
    /// created machine is `Available` (no Node, no bootstrap token, no drain), and its
    /// addresses come from the driver.
    pub target_cluster: bool,
}
