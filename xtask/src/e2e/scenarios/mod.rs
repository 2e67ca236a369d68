//! The scenarios of `cargo xtask e2e`.

mod budget;
mod chart;
mod faults;
mod fleet;
mod inplace;
mod policy;
mod preserve;
mod rollout;
mod swap;
mod upstream;

use anyhow::Result;

use super::ctx::Ctx;

/// One scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// A MachineDeployment 0 -> 3 -> 6 -> 2; Nodes and VM processes follow.
    Scale,
    /// A template change under a workload with a PDB: the PDB is never violated.
    RollingUpdate,
    /// `kill -9` of a VM: Unknown -> Failed -> replaced; the workload moves.
    VmCrash,
    /// `kill -9` of a VM whose Node holds two pods at their PodDisruptionBudget's limit,
    /// drain timeout 2h: the dead pods are deleted, not evicted; gone within health + 30s.
    VmCrashBudget,
    /// A VM started behind the controller's back is collected.
    OrphanVm,
    /// The target API server unreachable past the status-check timeout: freeze, no failures.
    ApiserverOutage,
    /// SIGKILL of the machine controller mid-rollout: the rollout finishes, no VM leaks.
    ControllerRestart,
    /// Deleting a MachineDeployment leaves no Machine, Node or VM.
    DeleteDeployment,
    /// An invalid providerSpec is reported on the Machine and nothing is created.
    BadClass,
    /// Crashed VMs with `autoPreserveFailedMachineMax: 1`: one Failed machine is kept with
    /// its drained node, the next is replaced, the kept one is replaced once released.
    Preserve,
    /// `effective-creation-timeout` on a deployment whose VMs never join: its machines fail
    /// after that timeout, not the flag's, and are replaced.
    CreationTimeout,
    /// VMs joining after ~25s, a declared creation timeout of 20s: the effective creation
    /// timeout adapts (30s) and the pool converges, where growth 0 replaces machines forever;
    /// fast joins bring it back to 20s.
    SlowCloud,
    /// Both controllers with `--target-kubeconfig=none`: machines are Available.
    NoTarget,
    /// `rollbackTo` after a rollout: the previous template is rolled out again.
    Rollback,
    /// Strategy `InPlaceUpdate`: machines updated where they stand; a failed update replaced.
    InPlaceUpdate,
    /// Three of four VMs killed at once: the remediation short-circuit replaces none until
    /// lifted, then the driver's fast path replaces all three without the health timeout.
    ZoneOutage,
    /// Lifecycle hooks hold a deletion before the drain and before the VM.
    LifecycleHooks,
    /// A rollout that could replace two machines at once, held to one at a time by a
    /// MachineDisruptionBudget `maxUnavailable: 1`.
    DisruptionBudget,
    /// A fleet exactly as the Go MCM leaves it, handed to mcm-rs: no rollout, nothing
    /// replaced; then a scale-down, a rollout and the deletion complete.
    SwapIn,
    /// After mcm-rs ran, every object carries what the Go MCM needs to finish it.
    SwapBack,
    /// The Helm chart and the images on a real node (containerd, runc, a kubelet): probes,
    /// non-root read-only containers, the webhook through its Service, machines whose VMs run
    /// in the pod, metrics through the Service, RBAC without a refusal, a pod deletion, an
    /// upgrade and an uninstall that replace no machine.
    Chart,
}

impl Scenario {
    /// Every scenario, in the order the suite runs them.
    pub const ALL: [Scenario; 21] = [
        Scenario::Scale,
        Scenario::RollingUpdate,
        Scenario::VmCrash,
        Scenario::VmCrashBudget,
        Scenario::OrphanVm,
        Scenario::ApiserverOutage,
        Scenario::ControllerRestart,
        Scenario::DeleteDeployment,
        Scenario::BadClass,
        Scenario::Preserve,
        // Before creation-timeout: the shards take every other scenario, and the longest
        // (slow-cloud, about 150 s) goes to the shard without preserve and zone-outage.
        Scenario::SlowCloud,
        Scenario::CreationTimeout,
        Scenario::NoTarget,
        Scenario::Rollback,
        Scenario::InPlaceUpdate,
        Scenario::ZoneOutage,
        Scenario::LifecycleHooks,
        Scenario::DisruptionBudget,
        Scenario::SwapIn,
        Scenario::SwapBack,
        Scenario::Chart,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Scale => "scale",
            Scenario::RollingUpdate => "rolling-update",
            Scenario::VmCrash => "vm-crash",
            Scenario::VmCrashBudget => "vm-crash-budget",
            Scenario::OrphanVm => "orphan-vm",
            Scenario::ApiserverOutage => "apiserver-outage",
            Scenario::ControllerRestart => "controller-restart",
            Scenario::DeleteDeployment => "delete-deployment",
            Scenario::BadClass => "bad-class",
            Scenario::Preserve => "preserve",
            Scenario::CreationTimeout => "creation-timeout",
            Scenario::SlowCloud => "slow-cloud",
            Scenario::NoTarget => "no-target",
            Scenario::Rollback => "rollback",
            Scenario::InPlaceUpdate => "in-place-update",
            Scenario::ZoneOutage => "zone-outage",
            Scenario::LifecycleHooks => "lifecycle-hooks",
            Scenario::DisruptionBudget => "disruption-budget",
            Scenario::SwapIn => "swap-in",
            Scenario::SwapBack => "swap-back",
            Scenario::Chart => "chart",
        }
    }

    /// Whether the scenario runs as a job of its own (`cargo xtask e2e --scenario <name>`)
    /// rather than in a shard: the chart scenario has its own control plane and node, builds
    /// the images, and is the suite's longest; in a shard it would add its time to the
    /// shard's.
    pub fn alone(self) -> bool {
        self == Scenario::Chart
    }

    /// Runs the scenario in `ctx`; on success, a line of what was measured.
    pub async fn run(self, ctx: &mut Ctx<'_>) -> Result<String> {
        match self {
            Scenario::Scale => fleet::scale(ctx).await,
            Scenario::RollingUpdate => rollout::rolling_update(ctx).await,
            Scenario::VmCrash => faults::vm_crash(ctx).await,
            Scenario::VmCrashBudget => faults::vm_crash_budget(ctx).await,
            Scenario::OrphanVm => faults::orphan_vm(ctx).await,
            Scenario::ApiserverOutage => faults::apiserver_outage(ctx).await,
            Scenario::ControllerRestart => rollout::controller_restart(ctx).await,
            Scenario::DeleteDeployment => fleet::delete_deployment(ctx).await,
            Scenario::BadClass => fleet::bad_class(ctx).await,
            Scenario::Preserve => preserve::preserve(ctx).await,
            Scenario::CreationTimeout => upstream::creation_timeout(ctx).await,
            Scenario::SlowCloud => upstream::slow_cloud(ctx).await,
            Scenario::NoTarget => upstream::no_target(ctx).await,
            Scenario::Rollback => upstream::rollback(ctx).await,
            Scenario::InPlaceUpdate => inplace::in_place_update(ctx).await,
            Scenario::ZoneOutage => policy::zone_outage(ctx).await,
            Scenario::LifecycleHooks => policy::lifecycle_hooks(ctx).await,
            Scenario::DisruptionBudget => budget::disruption_budget(ctx).await,
            Scenario::SwapIn => swap::swap_in(ctx).await,
            Scenario::SwapBack => swap::swap_back(ctx).await,
            Scenario::Chart => chart::chart(ctx).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_match_the_command_line_values() {
        for s in Scenario::ALL {
            let value = s.to_possible_value().expect("every scenario is selectable");
            assert_eq!(value.get_name(), s.name());
        }
    }
}
