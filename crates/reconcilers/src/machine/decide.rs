//! The pure half of the machine controller: what to do next, from what was observed.
//!
//! [`next_step`] never performs I/O and never reads `status.lastOperation`: it decides from
//! the Machine's phase (and when that phase began), its Node, its class, and the controller's
//! configuration. Every [`Step`] is carried out by one small action in `act`, and every
//! action is idempotent, so a crash between any two steps resumes correctly.

use std::time::Duration;

use jiff::Timestamp;
use mcm_api::MachinePhase;

use super::hooks::HookStage;

/// How long a Node may be NotReady before drain is forced (MCM's rule).
pub(crate) const FORCE_DRAIN_NOT_READY_AFTER: Duration = Duration::from_secs(5 * 60);

/// How long a machine is Unknown before the driver's fast path may fail it. The nodes of one
/// outage do not go NotReady in the same instant (their last heartbeats differ by up to a
/// heartbeat interval, and the node lifecycle controller looks every few seconds); failing
/// the first one at once would let it be replaced before the remediation short-circuit has
/// seen the others. This covers Kubernetes' default spread (10s heartbeats, 5s monitor
/// period) and is still far below any health timeout.
pub(crate) const FAST_PATH_SETTLE: Duration = Duration::from_secs(20);

pub(crate) use super::model::*;

/// Decides the next step for a Machine. Pure: same input, same answer.
pub(crate) fn next_step(o: &Observed, cfg: &MachineConfig, now: Timestamp) -> Step {
    if o.deleting {
        return deletion_step(o, cfg, now);
    }
    let step = lifecycle_step(o, cfg, now);
    // Our finalizer first; a machine about to get its VM gets it with the record of the VM
    // request, in one write.
    if o.finalizer != crate::machine::Finalizer::Held && step != Step::CreateVm {
        return Step::AddFinalizer;
    }
    step
}

/// A question to the driver that the next step depends on: asked before deciding, with the
/// answer in [`Observed`]. Defined here, next to the rules that read the answers, so that the
/// driver is asked exactly where an answer can change the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// No question.
    None,
    /// The state of the VM ([`Observed::vm`]):
    /// - of an Unknown machine whose node is not Ready: a VM gone or stopped fails the machine
    ///   without waiting for the health timeout;
    /// - of a machine being deleted, when its drain starts and at each pass while its node is
    ///   not Ready: the pods of a node whose VM is gone or stopped run nowhere, and are
    ///   deleted instead of evicted ([`Step::DrainPass::vm_dead`](Step::DrainPass)).
    VmStatus,
}

/// The [`Probe`] the step of `o` depends on (`o` observed without one). Pure.
pub(crate) fn probe_for(o: &Observed, cfg: &MachineConfig) -> Probe {
    if o.class.is_err() || !o.vm_requested {
        return Probe::None;
    }
    if o.deleting {
        let d = &o.deletion;
        let draining = o.finalizer != crate::machine::Finalizer::Missing
            && o.phase == Some(MachinePhase::Terminating)
            && !d.vm_deleted
            && !d.drained;
        // A Ready node's VM runs: only the start of a drain, or a node that stopped being
        // Ready, asks.
        let asks = match &o.node {
            None => false,
            Some(node) => d.drain_started.is_none() || !node.ready,
        };
        return if draining && asks {
            Probe::VmStatus
        } else {
            Probe::None
        };
    }
    let unknown_not_ready = o.phase == Some(MachinePhase::Unknown)
        && !cfg.disable_health_timeout
        && o.node.as_ref().is_none_or(|n| !n.ready);
    if unknown_not_ready {
        Probe::VmStatus
    } else {
        Probe::None
    }
}

/// [`next_step`] of a machine that is not being deleted, finalizer aside.
fn lifecycle_step(o: &Observed, cfg: &MachineConfig, now: Timestamp) -> Step {
    let in_phase = elapsed(o.phase_since, now);
    // Without a target cluster no node name is recorded (there is no Node).
    let has_vm = o.provider_id.is_some() && (o.node_name.is_some() || !o.target_cluster);

    if !has_vm {
        // Creation: without a usable class nothing can be created.
        if let Err(problem) = &o.class {
            if matches!(
                o.phase,
                Some(MachinePhase::CrashLoopBackOff) | Some(MachinePhase::Pending)
            ) && in_phase >= cfg.creation_timeout
            {
                return fail_unless_frozen(
                    o,
                    format!(
                        "machine could not be created within the creation timeout ({}): {problem}",
                        mcm_api::duration::format_go_duration(cfg.creation_timeout)
                    ),
                );
            }
            return Step::ReportClassProblem(problem.clone());
        }
        return match o.phase {
            Some(MachinePhase::Failed) => Step::Nothing,
            Some(MachinePhase::CrashLoopBackOff) if in_phase >= cfg.creation_timeout => {
                fail_unless_frozen(
                    o,
                    format!(
                        "VM could not be created within the creation timeout ({})",
                        mcm_api::duration::format_go_duration(cfg.creation_timeout)
                    ),
                )
            }
            _ => Step::CreateVm,
        };
    }

    // The VM is recorded but its creation did not finish (the controller stopped between
    // recording the providerID and the phase, or initialization failed): finish it, which
    // initializes the VM when the driver says it needs that. The create step itself moves
    // on to Pending (or Running, Available) at once, so this is not the usual path.
    match o.phase {
        Some(MachinePhase::CrashLoopBackOff) if in_phase >= cfg.creation_timeout => {
            return fail_unless_frozen(
                o,
                format!(
                    "VM {} could not be initialized within the creation timeout ({})",
                    o.provider_id.as_deref().unwrap_or_default(),
                    mcm_api::duration::format_go_duration(cfg.creation_timeout)
                ),
            );
        }
        None | Some(MachinePhase::CrashLoopBackOff) => return Step::FinishCreation,
        _ => {}
    }
    if !o.target_cluster {
        return match o.phase {
            Some(MachinePhase::Pending) => Step::MarkAvailable,
            _ => Step::Nothing,
        };
    }
    match o.phase.clone() {
        None | Some(MachinePhase::CrashLoopBackOff) => Step::FinishCreation,
        Some(MachinePhase::Pending) | Some(MachinePhase::Available) => match &o.node {
            Some(n) if n.healthy() => Step::MarkRunning,
            None if o.phase == Some(MachinePhase::Pending)
                && cfg
                    .node_startup_timeout
                    .is_some_and(|t| in_phase >= t && t < cfg.creation_timeout) =>
            {
                fail_unless_frozen(
                    o,
                    format!(
                        "the VM's node did not register within the node-startup timeout ({})",
                        mcm_api::duration::format_go_duration(
                            cfg.node_startup_timeout.unwrap_or_default()
                        )
                    ),
                )
            }
            _ if in_phase >= cfg.creation_timeout => fail_unless_frozen(
                o,
                format!(
                    "{} ({})",
                    mcm_api::constants::operations::NOT_JOINED_WITHIN_CREATION_TIMEOUT,
                    mcm_api::duration::format_go_duration(cfg.creation_timeout)
                ),
            ),
            node => Step::AwaitNode {
                remaining: match cfg.node_startup_timeout {
                    Some(t) if node.is_none() && t > in_phase => {
                        (t - in_phase).min(cfg.creation_timeout - in_phase)
                    }
                    _ => cfg.creation_timeout - in_phase,
                },
            },
        },
        Some(MachinePhase::Running) => match &o.node {
            None => Step::MarkUnknown {
                reason: "node object not found".into(),
            },
            Some(n) if !n.healthy() => Step::MarkUnknown {
                reason: n.unhealthy_reason(),
            },
            Some(_) => Step::KeepRunning,
        },
        Some(MachinePhase::Unknown) => match &o.node {
            Some(n) if n.healthy() => Step::MarkRunning,
            _ if cfg.disable_health_timeout => Step::AwaitRecovery { remaining: None },
            // The fast path: the driver says the VM is gone or stopped, so waiting for the
            // health timeout cannot help (the node is not Ready, or there is none).
            node if vm_is_dead(&o.vm).is_some()
                && node.as_ref().is_none_or(|n| !n.ready)
                && in_phase >= FAST_PATH_SETTLE =>
            {
                let why = vm_is_dead(&o.vm).unwrap_or_default();
                fail_unless_frozen(o, format!("{why}; not waiting for the health timeout"))
            }
            Some(n) if expired_rule(n, now).is_some() => {
                if let Some(hold) = partition_hold(o, cfg, in_phase) {
                    return hold;
                }
                if let Some(reason) = &o.failure_protected {
                    return Step::Protected {
                        reason: reason.clone(),
                    };
                }
                let m = expired_rule(n, now).map(|m| m.rule.to_string());
                fail_unless_frozen(
                    o,
                    format!(
                        "node condition held beyond its health rule ({})",
                        m.unwrap_or_default()
                    ),
                )
            }
            node if in_phase >= cfg.health_timeout => {
                if let Some(hold) = partition_hold(o, cfg, in_phase) {
                    return hold;
                }
                if let Some(reason) = &o.failure_protected {
                    return Step::Protected {
                        reason: reason.clone(),
                    };
                }
                let why = match node {
                    Some(n) => n.unhealthy_reason(),
                    None => "node object not found".into(),
                };
                fail_unless_frozen(
                    o,
                    format!(
                        "machine stayed unhealthy beyond the health timeout ({}): {why}",
                        mcm_api::duration::format_go_duration(cfg.health_timeout)
                    ),
                )
            }
            node => {
                let fast_path =
                    vm_is_dead(&o.vm).map(|_| FAST_PATH_SETTLE.saturating_sub(in_phase));
                Step::AwaitRecovery {
                    remaining: Some(
                        node.iter()
                            .flat_map(|n| &n.rule_matches)
                            .map(|m| m.rule.timeout.saturating_sub(elapsed(m.since, now)))
                            .chain(fast_path)
                            .fold(cfg.health_timeout - in_phase, Duration::min),
                    ),
                }
            }
        },
        // A preserved Failed machine recovers when its node is healthy again.
        Some(MachinePhase::Failed) if o.preserved => match &o.node {
            Some(n) if n.healthy() => Step::MarkRunning,
            _ => Step::Nothing,
        },
        // Failed machines are replaced by their MachineSet; Terminating without a deletion
        // timestamp and in-place phases are not ours to change here.
        Some(_) => Step::Nothing,
    }
}

fn deletion_step(o: &Observed, cfg: &MachineConfig, now: Timestamp) -> Step {
    if o.finalizer == crate::machine::Finalizer::Missing {
        return Step::Nothing;
    }
    if o.phase != Some(MachinePhase::Terminating) {
        if o.frozen {
            return Step::Frozen;
        }
        return Step::MarkTerminating;
    }
    let d = &o.deletion;
    let vm_may_exist = o.vm_requested && !d.vm_deleted;
    if d.drain_started.is_none() && !d.drained && !d.pre_drain_expired {
        let since = d.requested.unwrap_or(o.phase_since);
        if let Some(step) = hook_step(HookStage::PreDrain, &d.pre_drain_hooks, since, cfg, now) {
            return step;
        }
    }
    if let Some(node) = &o.node
        && vm_may_exist
        && !d.drained
    {
        let elapsed = d.drain_started.map_or(Duration::ZERO, |s| elapsed(s, now));
        let force_reason = drain_force_reason(o, node, cfg, elapsed, now);
        return Step::DrainPass {
            first: d.drain_started.is_none(),
            force: force_reason.is_some(),
            force_reason,
            unreachable: node.unreachable,
            vm_dead: drain_vm_dead(node, &o.vm),
            elapsed,
            pods_gone_for: d.pods_drained.map(|t| self::elapsed(t, now)),
        };
    }
    if d.attachments_left > 0 {
        return Step::DeleteVolumeAttachments;
    }
    if !d.vm_deleted && !d.pre_terminate_expired {
        let since = d.drained_at.or(d.requested).unwrap_or(o.phase_since);
        if let Some(step) = hook_step(
            HookStage::PreTerminate,
            &d.pre_terminate_hooks,
            since,
            cfg,
            now,
        ) {
            return step;
        }
    }
    if vm_may_exist {
        return match &o.class {
            Err(problem) => Step::DeletionBlocked(problem.clone()),
            Ok(()) => Step::DeleteVm,
        };
    }
    if o.node.is_some() {
        return Step::DeleteNode;
    }
    Step::RemoveFinalizer
}

/// Why the drain deletes pods instead of evicting them: the `force-deletion` label, the
/// drain timeout (counted from the start of the drain), or MCM's rule of a node NotReady for
/// 5 minutes.
fn drain_force_reason(
    o: &Observed,
    node: &NodeHealth,
    cfg: &MachineConfig,
    drain_elapsed: Duration,
    now: Timestamp,
) -> Option<String> {
    if o.force_deletion {
        return Some(format!(
            "label {}={} is set",
            mcm_api::constants::labels::FORCE_DELETION,
            mcm_api::constants::labels::TRUE_VALUE
        ));
    }
    if drain_elapsed >= cfg.drain_timeout {
        return Some(format!(
            "drain timeout ({}) exceeded",
            mcm_api::duration::format_go_duration(cfg.drain_timeout)
        ));
    }
    node.not_ready_since
        .filter(|since| elapsed(*since, now) >= FORCE_DRAIN_NOT_READY_AFTER)
        .map(|_| "node has been NotReady for more than 5m".to_string())
}

/// The hold of an Unknown machine (`in_phase` in that phase) that would now be marked Failed,
/// if its zone is partitioned ([`super::partition`]): only while the driver reports its VM
/// running (a VM gone or stopped is a crash; a driver that cannot tell gives no evidence of a
/// partition), and for at most `zone_partition_max_hold` past the health timeout.
fn partition_hold(o: &Observed, cfg: &MachineConfig, in_phase: Duration) -> Option<Step> {
    let partition = o.zone_partition.as_ref()?;
    // Frozen: nothing is failed, and no hold is recorded either.
    if o.frozen || o.vm != VmReport::Present {
        return None;
    }
    let until = cfg.health_timeout + cfg.zone_partition_max_hold;
    (in_phase < until).then(|| Step::HeldByPartition {
        partition: partition.clone(),
        remaining: until - in_phase,
    })
}

/// Why the pods of a node being drained run nowhere, if they do: the node is not Ready and
/// the driver reports its VM gone or stopped. Both must agree: a Ready node's kubelet runs
/// its pods whatever a (possibly stale) cloud answer says. A node that is only unreachable,
/// its VM reported running (or the driver unable to tell), is a partition: its pods may run
/// behind it, so they are evicted under their budgets, and MCM's rule forces the drain after
/// 5 minutes NotReady ([`drain_force_reason`]).
fn drain_vm_dead(node: &NodeHealth, vm: &VmReport) -> Option<String> {
    if node.ready {
        return None;
    }
    vm_is_dead(vm)
}

/// The step of a stage held by `hooks` (`None`: no hook holds it), waiting since `since`.
fn hook_step(
    stage: HookStage,
    hooks: &[String],
    since: Timestamp,
    cfg: &MachineConfig,
    now: Timestamp,
) -> Option<Step> {
    if hooks.is_empty() {
        return None;
    }
    let waited = elapsed(since, now);
    Some(match cfg.hook_timeout {
        Some(t) if waited >= t => Step::ExpireHooks {
            stage,
            hooks: hooks.to_vec(),
        },
        t => Step::AwaitHooks {
            stage,
            hooks: hooks.to_vec(),
            remaining: t.map(|t| t - waited),
        },
    })
}

/// Why the driver's report makes waiting pointless, if it does.
fn vm_is_dead(vm: &VmReport) -> Option<String> {
    match vm {
        VmReport::Gone => Some("the driver reports the VM gone (NotFound)".to_string()),
        VmReport::Stopped { message } => {
            Some(format!("the driver reports the VM stopped: {message}"))
        }
        VmReport::NotAsked | VmReport::Present => None,
    }
}

/// The first health rule whose condition has held for its timeout.
fn expired_rule(node: &NodeHealth, now: Timestamp) -> Option<&RuleMatch> {
    node.rule_matches
        .iter()
        .find(|m| elapsed(m.since, now) >= m.rule.timeout)
}

/// Whether a rollout's protection of a machine in `phase` can change its next step: only an
/// Unknown machine past its health timeout consults it. The protection (a comparison of the
/// machine's set's template with its deployment's) is read only then. Pure.
pub(crate) fn protection_matters(phase: Option<&MachinePhase>) -> bool {
    phase == Some(&MachinePhase::Unknown)
}

fn fail_unless_frozen(o: &Observed, reason: String) -> Step {
    if o.frozen {
        Step::Frozen
    } else {
        Step::MarkFailed { reason }
    }
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const MIN: Duration = Duration::from_secs(60);

    fn cfg() -> MachineConfig {
        MachineConfig {
            creation_timeout: 20 * MIN,
            health_timeout: 10 * MIN,
            drain_timeout: 120 * MIN,
            disable_health_timeout: false,
            bad_conditions: vec!["KernelDeadlock".into()],
            unhealthy_conditions: vec![],
            node_startup_timeout: None,
            hook_timeout: None,
            zone_partition_max_hold: 30 * MIN,
        }
    }

    fn t0() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn at(minutes: u64) -> Timestamp {
        t0() + jiff::SignedDuration::from_secs(minutes as i64 * 60)
    }

    fn healthy() -> Option<NodeHealth> {
        Some(NodeHealth {
            ready: true,
            not_ready_since: None,
            bad_conditions: vec![],
            unreachable: false,
            rule_matches: vec![],
        })
    }

    fn not_ready(since_min: u64) -> Option<NodeHealth> {
        Some(NodeHealth {
            ready: false,
            not_ready_since: Some(at(since_min)),
            bad_conditions: vec![],
            unreachable: false,
            rule_matches: vec![],
        })
    }

    /// A machine with finalizer, usable class, no VM yet, phase since t0.
    fn fresh() -> Observed {
        Observed {
            deleting: false,
            finalizer: crate::machine::Finalizer::Held,
            phase: None,
            phase_since: t0(),
            provider_id: None,
            node_name: None,
            class: Ok(()),
            node: None,
            frozen: false,
            force_deletion: false,
            failure_protected: None,
            zone_partition: None,
            vm_requested: false,
            target_cluster: true,
            preserved: false,
            vm: VmReport::NotAsked,
            deletion: DeletionFacts::default(),
        }
    }

    #[test]
    fn a_rollouts_protection_changes_the_step_of_unknown_machines_only() {
        use MachinePhase::*;
        let phases = [
            Pending,
            Available,
            Running,
            Terminating,
            Unknown,
            Failed,
            CrashLoopBackOff,
            InPlaceUpdating,
            InPlaceUpdateSuccessful,
            InPlaceUpdateFailed,
        ];
        let mut protected_steps = 0;
        for phase in phases {
            for node in [healthy(), not_ready(0), None] {
                for minute in [0, 5, 10, 30, 120] {
                    let open = Observed {
                        node: node.clone(),
                        ..with_vm(phase.clone())
                    };
                    let protected = Observed {
                        failure_protected: Some("old set".into()),
                        ..open.clone()
                    };
                    let (a, b) = (
                        next_step(&open, &cfg(), at(minute)),
                        next_step(&protected, &cfg(), at(minute)),
                    );
                    if a != b {
                        assert!(
                            protection_matters(Some(&phase)),
                            "{phase:?}, {node:?}, minute {minute}: {a:?} / {b:?}"
                        );
                        protected_steps += 1;
                    }
                }
            }
        }
        // The comparison sees protection where it applies.
        assert!(protected_steps > 0);
        assert!(!protection_matters(None));
    }

    fn with_vm(phase: MachinePhase) -> Observed {
        Observed {
            phase: Some(phase),
            provider_id: Some("local:///m".into()),
            node_name: Some("m".into()),
            vm_requested: true,
            preserved: false,
            ..fresh()
        }
    }

    #[test]
    fn creation_table() {
        let missing = ClassProblem::ClassMissing { name: "c".into() };
        let cases: Vec<(&str, Observed, u64, Step)> = vec![
            (
                "no finalizer yet, VM to create: added with the VM request",
                Observed {
                    finalizer: crate::machine::Finalizer::Missing,
                    ..fresh()
                },
                0,
                Step::CreateVm,
            ),
            (
                "no finalizer yet, class missing: the finalizer first",
                Observed {
                    finalizer: crate::machine::Finalizer::Missing,
                    class: Err(missing.clone()),
                    ..fresh()
                },
                0,
                Step::AddFinalizer,
            ),
            (
                "an earlier release's finalizer name: renamed first",
                Observed {
                    finalizer: crate::machine::Finalizer::Legacy,
                    ..with_vm(MachinePhase::Running)
                },
                0,
                Step::AddFinalizer,
            ),
            (
                "no finalizer on a machine with a VM: the finalizer first",
                Observed {
                    finalizer: crate::machine::Finalizer::Missing,
                    ..with_vm(MachinePhase::Running)
                },
                0,
                Step::AddFinalizer,
            ),
            ("new machine", fresh(), 0, Step::CreateVm),
            (
                "class missing is reported, nothing created",
                Observed {
                    class: Err(missing.clone()),
                    ..fresh()
                },
                0,
                Step::ReportClassProblem(missing.clone()),
            ),
            (
                "crash loop retries creation before the timeout",
                Observed {
                    phase: Some(MachinePhase::CrashLoopBackOff),
                    ..fresh()
                },
                19,
                Step::CreateVm,
            ),
            (
                "crash loop fails after the creation timeout",
                Observed {
                    phase: Some(MachinePhase::CrashLoopBackOff),
                    ..fresh()
                },
                20,
                Step::MarkFailed {
                    reason: "VM could not be created within the creation timeout (20m0s)".into(),
                },
            ),
            (
                "crash loop past the timeout while frozen stays",
                Observed {
                    phase: Some(MachinePhase::CrashLoopBackOff),
                    frozen: true,
                    ..fresh()
                },
                30,
                Step::Frozen,
            ),
            (
                "VM recorded but its creation did not finish (phase lost in a crash)",
                Observed {
                    phase: None,
                    ..with_vm(MachinePhase::Pending)
                },
                0,
                Step::FinishCreation,
            ),
            (
                "VM recorded, creation unfinished, node joined already: finished first",
                Observed {
                    phase: None,
                    node: healthy(),
                    ..with_vm(MachinePhase::Pending)
                },
                0,
                Step::FinishCreation,
            ),
            (
                "VM recorded, initialization failed: finished before the timeout",
                Observed {
                    phase: Some(MachinePhase::CrashLoopBackOff),
                    node: not_ready(0),
                    ..with_vm(MachinePhase::Pending)
                },
                19,
                Step::FinishCreation,
            ),
            (
                "VM recorded, initialization failed until the creation timeout: Failed",
                with_vm(MachinePhase::CrashLoopBackOff),
                20,
                Step::MarkFailed {
                    reason:
                        "VM local:///m could not be initialized within the creation timeout (20m0s)"
                            .into(),
                },
            ),
            (
                "no target cluster, VM recorded, creation unfinished",
                Observed {
                    phase: None,
                    node_name: None,
                    target_cluster: false,
                    ..with_vm(MachinePhase::Pending)
                },
                0,
                Step::FinishCreation,
            ),
            (
                "pending waits for the node",
                with_vm(MachinePhase::Pending),
                5,
                Step::AwaitNode {
                    remaining: 15 * MIN,
                },
            ),
            (
                "pending with a NotReady node waits",
                Observed {
                    node: not_ready(0),
                    ..with_vm(MachinePhase::Pending)
                },
                5,
                Step::AwaitNode {
                    remaining: 15 * MIN,
                },
            ),
            (
                "pending with a Ready node runs",
                Observed {
                    node: healthy(),
                    ..with_vm(MachinePhase::Pending)
                },
                1,
                Step::MarkRunning,
            ),
            (
                "pending past the creation timeout fails",
                with_vm(MachinePhase::Pending),
                20,
                Step::MarkFailed {
                    reason: "machine did not join the cluster within the creation timeout (20m0s)"
                        .into(),
                },
            ),
            (
                "failed machines are left to their owner",
                Observed {
                    phase: Some(MachinePhase::Failed),
                    ..fresh()
                },
                100,
                Step::Nothing,
            ),
        ];
        for (name, o, minute, want) in cases {
            assert_eq!(next_step(&o, &cfg(), at(minute)), want, "{name}");
        }
    }

    #[test]
    fn health_table() {
        let bad = Some(NodeHealth {
            ready: true,
            not_ready_since: None,
            bad_conditions: vec!["KernelDeadlock".into()],
            unreachable: false,
            rule_matches: vec![],
        });
        let cases: Vec<(&str, Observed, u64, Step)> = vec![
            (
                "running and healthy",
                Observed { node: healthy(), ..with_vm(MachinePhase::Running) },
                0,
                Step::KeepRunning,
            ),
            (
                "running, node gone",
                with_vm(MachinePhase::Running),
                0,
                Step::MarkUnknown { reason: "node object not found".into() },
            ),
            (
                "running, node not ready",
                Observed { node: not_ready(0), ..with_vm(MachinePhase::Running) },
                0,
                Step::MarkUnknown { reason: "node is not Ready".into() },
            ),
            (
                "running, bad condition",
                Observed { node: bad.clone(), ..with_vm(MachinePhase::Running) },
                0,
                Step::MarkUnknown { reason: "node conditions KernelDeadlock are True".into() },
            ),
            (
                "unknown recovers",
                Observed { node: healthy(), ..with_vm(MachinePhase::Unknown) },
                3,
                Step::MarkRunning,
            ),
            (
                "unknown within the health timeout waits",
                Observed { node: not_ready(0), ..with_vm(MachinePhase::Unknown) },
                4,
                Step::AwaitRecovery { remaining: Some(6 * MIN) },
            ),
            (
                "unknown past the health timeout fails",
                Observed { node: not_ready(0), ..with_vm(MachinePhase::Unknown) },
                10,
                Step::MarkFailed {
                    reason: "machine stayed unhealthy beyond the health timeout (10m0s): node is not Ready".into(),
                },
            ),
            (
                "never failed while frozen",
                Observed { node: not_ready(0), frozen: true, ..with_vm(MachinePhase::Unknown) },
                60,
                Step::Frozen,
            ),
            (
                "never failed while protected by a rollout",
                Observed {
                    node: not_ready(0),
                    failure_protected: Some("old MachineSet during rollout".into()),
                    ..with_vm(MachinePhase::Unknown)
                },
                60,
                Step::Protected { reason: "old MachineSet during rollout".into() },
            ),
        ];
        for (name, o, minute, want) in cases {
            assert_eq!(next_step(&o, &cfg(), at(minute)), want, "{name}");
        }
    }

    #[test]
    fn disabled_health_timeout_waits_forever() {
        let c = MachineConfig {
            disable_health_timeout: true,
            ..cfg()
        };
        let o = Observed {
            node: not_ready(0),
            ..with_vm(MachinePhase::Unknown)
        };
        assert_eq!(
            next_step(&o, &c, at(10_000)),
            Step::AwaitRecovery { remaining: None }
        );
    }

    /// A Terminating machine with a VM, its node healthy, drain started at t0.
    fn terminating() -> Observed {
        Observed {
            deleting: true,
            node: healthy(),
            deletion: DeletionFacts {
                drain_started: Some(t0()),
                ..Default::default()
            },
            ..with_vm(MachinePhase::Terminating)
        }
    }

    fn pass(force_reason: Option<&str>, unreachable: bool, elapsed_min: u64) -> Step {
        Step::DrainPass {
            first: false,
            force: force_reason.is_some(),
            force_reason: force_reason.map(String::from),
            unreachable,
            vm_dead: None,
            elapsed: MIN * elapsed_min as u32,
            pods_gone_for: None,
        }
    }

    #[test]
    fn a_drain_asks_the_driver_at_its_start_and_while_the_node_is_not_ready() {
        let cfg = cfg();
        let started = terminating();
        assert_eq!(
            probe_for(&started, &cfg),
            Probe::None,
            "a Ready node's drain"
        );
        let not_started = Observed {
            deletion: DeletionFacts::default(),
            ..terminating()
        };
        assert_eq!(probe_for(&not_started, &cfg), Probe::VmStatus);
        let crashed = Observed {
            node: not_ready(0),
            ..terminating()
        };
        assert_eq!(probe_for(&crashed, &cfg), Probe::VmStatus);
        let drained = Observed {
            node: not_ready(0),
            deletion: DeletionFacts {
                drain_started: Some(t0()),
                drained: true,
                ..Default::default()
            },
            ..terminating()
        };
        assert_eq!(probe_for(&drained, &cfg), Probe::None);
    }

    /// A pass one minute into the drain of a node whose VM is dead.
    fn dead_pass(why: &str, unreachable: bool) -> Step {
        Step::DrainPass {
            first: false,
            force: false,
            force_reason: None,
            unreachable,
            vm_dead: Some(why.into()),
            elapsed: MIN,
            pods_gone_for: None,
        }
    }

    #[test]
    fn deletion_table() {
        let secret = ClassProblem::SecretMissing {
            class: "c".into(),
            secret: "s".into(),
        };
        let missing = ClassProblem::ClassMissing { name: "c".into() };
        let facts = |f: DeletionFacts| Observed {
            deletion: f,
            ..terminating()
        };
        let drained = DeletionFacts {
            drain_started: Some(t0()),
            drained: true,
            ..Default::default()
        };
        let unreachable = Some(NodeHealth {
            unreachable: true,
            rule_matches: vec![],
            ..not_ready(0).unwrap()
        });
        let cases: Vec<(&str, Observed, u64, Step)> = vec![
            (
                "start",
                Observed {
                    deleting: true,
                    ..with_vm(MachinePhase::Running)
                },
                0,
                Step::MarkTerminating,
            ),
            (
                "not started while frozen",
                Observed {
                    deleting: true,
                    frozen: true,
                    ..with_vm(MachinePhase::Running)
                },
                0,
                Step::Frozen,
            ),
            (
                "node present, drain not started",
                facts(DeletionFacts::default()),
                0,
                Step::DrainPass {
                    first: true,
                    force: false,
                    force_reason: None,
                    unreachable: false,
                    vm_dead: None,
                    elapsed: Duration::ZERO,
                    pods_gone_for: None,
                },
            ),
            ("a drain pass", terminating(), 1, pass(None, false, 1)),
            (
                "force after the drain timeout (counted from the drain start)",
                terminating(),
                120,
                pass(Some("drain timeout (2h0m0s) exceeded"), false, 120),
            ),
            (
                "force by label",
                Observed {
                    force_deletion: true,
                    ..terminating()
                },
                0,
                pass(Some("label force-deletion=True is set"), false, 0),
            ),
            (
                "force when NotReady for 5 minutes",
                Observed {
                    node: not_ready(0),
                    ..terminating()
                },
                5,
                pass(Some("node has been NotReady for more than 5m"), false, 5),
            ),
            (
                "not yet forced when NotReady for 4 minutes",
                Observed {
                    node: not_ready(0),
                    ..terminating()
                },
                4,
                pass(None, false, 4),
            ),
            (
                "an unreachable node is drained without waiting",
                Observed {
                    node: unreachable.clone(),
                    ..terminating()
                },
                1,
                pass(None, true, 1),
            ),
            (
                "the volume wait counts from when the pods were gone",
                facts(DeletionFacts {
                    drain_started: Some(t0()),
                    pods_drained: Some(at(3)),
                    ..Default::default()
                }),
                5,
                Step::DrainPass {
                    first: false,
                    force: false,
                    force_reason: None,
                    unreachable: false,
                    vm_dead: None,
                    elapsed: 5 * MIN,
                    pods_gone_for: Some(2 * MIN),
                },
            ),
            (
                "an unreachable node whose VM runs is a partition: evicted, not forced",
                Observed {
                    node: unreachable.clone(),
                    vm: VmReport::Present,
                    ..terminating()
                },
                1,
                pass(None, true, 1),
            ),
            (
                "a partition is forced after 5 minutes NotReady (MCM's rule)",
                Observed {
                    node: unreachable.clone(),
                    vm: VmReport::Present,
                    ..terminating()
                },
                5,
                pass(Some("node has been NotReady for more than 5m"), true, 5),
            ),
            (
                "the VM is gone and the node unreachable: its pods are deleted, not evicted",
                Observed {
                    node: unreachable.clone(),
                    vm: VmReport::Gone,
                    ..terminating()
                },
                1,
                dead_pass("the driver reports the VM gone (NotFound)", true),
            ),
            (
                "the VM is stopped and the node NotReady: its pods are deleted, not evicted",
                Observed {
                    node: not_ready(0),
                    vm: VmReport::Stopped {
                        message: "process exited".into(),
                    },
                    ..terminating()
                },
                1,
                dead_pass("the driver reports the VM stopped: process exited", false),
            ),
            (
                "a Ready node's pods are evicted whatever the driver says of its VM",
                Observed {
                    vm: VmReport::Gone,
                    ..terminating()
                },
                1,
                pass(None, false, 1),
            ),
            (
                "drained: VolumeAttachments next",
                facts(DeletionFacts {
                    attachments_left: 2,
                    ..drained.clone()
                }),
                0,
                Step::DeleteVolumeAttachments,
            ),
            (
                "drained: the VM next",
                facts(drained.clone()),
                0,
                Step::DeleteVm,
            ),
            (
                "VM deleted: the node next",
                facts(DeletionFacts {
                    vm_deleted: true,
                    ..drained.clone()
                }),
                0,
                Step::DeleteNode,
            ),
            (
                "everything gone: the finalizer",
                Observed {
                    node: None,
                    ..facts(DeletionFacts {
                        vm_deleted: true,
                        ..drained.clone()
                    })
                },
                0,
                Step::RemoveFinalizer,
            ),
            (
                "no credentials while a VM may exist: blocked, finalizer kept",
                Observed {
                    class: Err(secret.clone()),
                    ..facts(drained.clone())
                },
                0,
                Step::DeletionBlocked(secret.clone()),
            ),
            (
                "the drain does not need the class",
                Observed {
                    class: Err(missing.clone()),
                    ..terminating()
                },
                1,
                pass(None, false, 1),
            ),
            (
                "creation requested but no providerID: the VM may exist",
                Observed {
                    deleting: true,
                    phase: Some(MachinePhase::Terminating),
                    vm_requested: true,
                    class: Err(missing.clone()),
                    ..fresh()
                },
                0,
                Step::DeletionBlocked(missing.clone()),
            ),
            (
                "no VM was ever requested: deleted without the class",
                Observed {
                    deleting: true,
                    phase: Some(MachinePhase::Terminating),
                    class: Err(missing.clone()),
                    ..fresh()
                },
                0,
                Step::RemoveFinalizer,
            ),
            (
                "an earlier release's finalizer name: ours, the deletion goes on",
                Observed {
                    finalizer: crate::machine::Finalizer::Legacy,
                    ..terminating()
                },
                0,
                next_step(&terminating(), &cfg(), at(0)),
            ),
            (
                "someone else's finalizer only",
                Observed {
                    finalizer: crate::machine::Finalizer::Missing,
                    ..terminating()
                },
                0,
                Step::Nothing,
            ),
        ];
        for (name, o, minute, want) in cases {
            assert_eq!(next_step(&o, &cfg(), at(minute)), want, "{name}");
        }
        assert_ne!(
            next_step(&terminating(), &cfg(), at(0)),
            Step::Nothing,
            "a terminating machine with our finalizer has a step"
        );
    }

    #[test]
    fn a_preserved_failed_machine_runs_again_when_its_node_recovers() {
        let mut o = with_vm(MachinePhase::Failed);
        o.node = healthy();
        assert_eq!(next_step(&o, &cfg(), at(1)), Step::Nothing, "not preserved");
        o.preserved = true;
        assert_eq!(next_step(&o, &cfg(), at(1)), Step::MarkRunning);
        o.node = not_ready(0);
        assert_eq!(next_step(&o, &cfg(), at(1)), Step::Nothing);
    }

    #[test]
    fn without_a_target_cluster_a_created_machine_is_available() {
        let mut o = with_vm(MachinePhase::Pending);
        o.target_cluster = false;
        o.node_name = None;
        assert_eq!(
            next_step(&o, &cfg(), at(30)),
            Step::MarkAvailable,
            "no creation timeout"
        );
        o.phase = None;
        assert_eq!(next_step(&o, &cfg(), at(1)), Step::FinishCreation);
        o.phase = Some(MachinePhase::Available);
        assert_eq!(
            next_step(&o, &cfg(), at(100)),
            Step::Nothing,
            "no health check"
        );
        o.provider_id = None;
        o.phase = None;
        assert_eq!(next_step(&o, &cfg(), at(1)), Step::CreateVm);
        // Deletion: nothing to drain, the VM goes, then the finalizer.
        let mut d = with_vm(MachinePhase::Terminating);
        d.target_cluster = false;
        d.node_name = None;
        d.deleting = true;
        assert_eq!(next_step(&d, &cfg(), at(1)), Step::DeleteVm);
        d.deletion.vm_deleted = true;
        assert_eq!(next_step(&d, &cfg(), at(1)), Step::RemoveFinalizer);
    }

    #[test]
    fn the_fast_path_fails_an_unknown_machine_whose_vm_is_gone_or_stopped() {
        let unknown = |vm: VmReport| Observed {
            node: not_ready(0),
            vm,
            ..with_vm(MachinePhase::Unknown)
        };
        let gone = "the driver reports the VM gone (NotFound); not waiting for the health timeout";
        let cases: Vec<(&str, Observed, Step)> = vec![
            (
                "gone: Failed at once",
                unknown(VmReport::Gone),
                Step::MarkFailed { reason: gone.into() },
            ),
            (
                "stopped: Failed at once, with the driver's detail",
                unknown(VmReport::Stopped {
                    message: "process 42 exited".into(),
                }),
                Step::MarkFailed {
                    reason: "the driver reports the VM stopped: process 42 exited; not waiting for the health timeout".into(),
                },
            ),
            (
                "no node at all: the same",
                Observed {
                    node: None,
                    ..unknown(VmReport::Gone)
                },
                Step::MarkFailed { reason: gone.into() },
            ),
            (
                "present: the health timeout applies",
                unknown(VmReport::Present),
                Step::AwaitRecovery {
                    remaining: Some(9 * MIN),
                },
            ),
            (
                "not asked: the health timeout applies",
                unknown(VmReport::NotAsked),
                Step::AwaitRecovery {
                    remaining: Some(9 * MIN),
                },
            ),
            (
                "the freeze holds a gone VM's machine",
                Observed {
                    frozen: true,
                    ..unknown(VmReport::Gone)
                },
                Step::Frozen,
            ),
        ];
        for (name, o, want) in cases {
            assert_eq!(next_step(&o, &cfg(), at(1)), want, "{name}");
        }
        // Not before the settle time: the other machines of an outage are counted first.
        let just = t0() + jiff::SignedDuration::from_secs(5);
        assert_eq!(
            next_step(&unknown(VmReport::Gone), &cfg(), just),
            Step::AwaitRecovery {
                remaining: Some(Duration::from_secs(15))
            }
        );
        let c = MachineConfig {
            disable_health_timeout: true,
            ..cfg()
        };
        assert_eq!(
            next_step(&unknown(VmReport::Gone), &c, at(1)),
            Step::AwaitRecovery { remaining: None },
            "disableHealthTimeout: never failed for health, the fast path included"
        );
    }

    #[test]
    fn a_partitioned_zone_holds_its_machines_whose_vms_run_for_the_max_hold() {
        let partition = crate::machine::partition::ZonePartition {
            zone: "a".into(),
            unreachable: 3,
            machines: 3,
            healthy_elsewhere: 6,
            elsewhere: 6,
        };
        let held = |vm: VmReport, partitioned: bool| Observed {
            phase: Some(MachinePhase::Unknown),
            node: Some(NodeHealth {
                unreachable: true,
                ..not_ready(0).unwrap()
            }),
            vm,
            zone_partition: partitioned.then(|| partition.clone()),
            ..with_vm(MachinePhase::Unknown)
        };
        // Past the health timeout (10m), the VM running: held, for up to 30m past it.
        assert_eq!(
            next_step(&held(VmReport::Present, true), &cfg(), at(10)),
            Step::HeldByPartition {
                partition: partition.clone(),
                remaining: 30 * MIN,
            }
        );
        assert_eq!(
            next_step(&held(VmReport::Present, true), &cfg(), at(39)),
            Step::HeldByPartition {
                partition: partition.clone(),
                remaining: MIN,
            }
        );
        // After the max hold: remediated as ever.
        assert!(matches!(
            next_step(&held(VmReport::Present, true), &cfg(), at(40)),
            Step::MarkFailed { .. }
        ));
        // Not partitioned, or a driver that cannot tell: remediated at the health timeout.
        for o in [
            held(VmReport::Present, false),
            held(VmReport::NotAsked, true),
        ] {
            assert!(matches!(
                next_step(&o, &cfg(), at(10)),
                Step::MarkFailed { .. }
            ));
        }
        // A crashed VM in a partitioned zone is a crash: the fast path fails it.
        assert!(matches!(
            next_step(&held(VmReport::Gone, true), &cfg(), at(1)),
            Step::MarkFailed { .. }
        ));
        // A max hold of zero: no hold.
        let off = MachineConfig {
            zone_partition_max_hold: Duration::ZERO,
            ..cfg()
        };
        assert!(matches!(
            next_step(&held(VmReport::Present, true), &off, at(10)),
            Step::MarkFailed { .. }
        ));
        // Before the health timeout nothing is held yet: the machine waits as ever.
        assert!(matches!(
            next_step(&held(VmReport::Present, true), &cfg(), at(5)),
            Step::AwaitRecovery { .. }
        ));
        // A deletion asked for during the hold (the cluster-autoscaler's fixNodeGroupSize or
        // trigger-deletion-by-mcm, a user) goes on: the hold only stops the controller's own
        // remediation. Its drain is a partition's, here forced: the Node has been NotReady for
        // over 5 minutes (MCM's rule).
        let deleting = Observed {
            deleting: true,
            deletion: DeletionFacts {
                drain_started: Some(at(10)),
                ..Default::default()
            },
            ..held(VmReport::Present, true)
        };
        let deleting = Observed {
            phase: Some(MachinePhase::Terminating),
            ..deleting
        };
        assert_eq!(
            next_step(&deleting, &cfg(), at(11)),
            Step::DrainPass {
                first: false,
                force: true,
                force_reason: Some("node has been NotReady for more than 5m".into()),
                unreachable: true,
                vm_dead: None,
                elapsed: MIN,
                pods_gone_for: None,
            }
        );
    }

    #[test]
    fn health_rules_fail_a_machine_when_their_condition_held_long_enough() {
        use super::super::health::ConditionRule;
        let rule = ConditionRule {
            type_: "Ready".into(),
            status: "Unknown".into(),
            timeout: 3 * MIN,
        };
        let matched = |since: u64| {
            Some(NodeHealth {
                ready: false,
                not_ready_since: Some(at(since)),
                bad_conditions: vec![],
                unreachable: true,
                rule_matches: vec![RuleMatch {
                    rule: rule.clone(),
                    since: at(since),
                }],
            })
        };
        // Running with a matching condition: Unknown first.
        let o = Observed {
            node: matched(0),
            ..with_vm(MachinePhase::Running)
        };
        assert!(matches!(
            next_step(&o, &cfg(), at(0)),
            Step::MarkUnknown { .. }
        ));
        // Unknown: waits for the rule's timeout, not the 10m health timeout.
        let o = Observed {
            node: matched(0),
            ..with_vm(MachinePhase::Unknown)
        };
        assert_eq!(
            next_step(&o, &cfg(), at(1)),
            Step::AwaitRecovery {
                remaining: Some(2 * MIN)
            }
        );
        assert_eq!(
            next_step(&o, &cfg(), at(3)),
            Step::MarkFailed {
                reason: "node condition held beyond its health rule (Ready=Unknown for 3m0s)"
                    .into()
            }
        );
        // Rollout protection applies as to the health timeout.
        let protected = Observed {
            failure_protected: Some("old set".into()),
            ..o.clone()
        };
        assert_eq!(
            next_step(&protected, &cfg(), at(3)),
            Step::Protected {
                reason: "old set".into()
            }
        );
        // The condition changed after the phase did: the rule counts from the transition.
        let later = Observed {
            node: matched(2),
            ..with_vm(MachinePhase::Unknown)
        };
        assert_eq!(
            next_step(&later, &cfg(), at(4)),
            Step::AwaitRecovery {
                remaining: Some(MIN)
            }
        );
    }

    #[test]
    fn the_node_startup_timeout_fails_a_vm_whose_node_never_registers() {
        let c = MachineConfig {
            node_startup_timeout: Some(5 * MIN),
            ..cfg()
        };
        let pending = with_vm(MachinePhase::Pending);
        assert_eq!(
            next_step(&pending, &c, at(2)),
            Step::AwaitNode { remaining: 3 * MIN }
        );
        assert_eq!(
            next_step(&pending, &c, at(5)),
            Step::MarkFailed {
                reason: "the VM's node did not register within the node-startup timeout (5m0s)"
                    .into()
            }
        );
        // A registered node that is not Ready yet: the creation timeout bounds it.
        let registered = Observed {
            node: not_ready(1),
            ..with_vm(MachinePhase::Pending)
        };
        assert_eq!(
            next_step(&registered, &c, at(5)),
            Step::AwaitNode {
                remaining: 15 * MIN
            }
        );
        // Without the setting: only the creation timeout.
        assert_eq!(
            next_step(&pending, &cfg(), at(5)),
            Step::AwaitNode {
                remaining: 15 * MIN
            }
        );
    }

    #[test]
    fn lifecycle_hooks_hold_their_stage_of_the_deletion() {
        let hooked = |pre_drain: &[&str], pre_terminate: &[&str], facts: DeletionFacts| Observed {
            deleting: true,
            node: healthy(),
            deletion: DeletionFacts {
                requested: Some(t0()),
                pre_drain_hooks: pre_drain.iter().map(|h| h.to_string()).collect(),
                pre_terminate_hooks: pre_terminate.iter().map(|h| h.to_string()).collect(),
                ..facts
            },
            ..with_vm(MachinePhase::Terminating)
        };
        let wait = |stage, hook: &str, remaining| Step::AwaitHooks {
            stage,
            hooks: vec![hook.to_string()],
            remaining,
        };
        // Pre-drain: before the first drain pass.
        let o = hooked(&["etcd"], &[], DeletionFacts::default());
        assert_eq!(
            next_step(&o, &cfg(), at(60)),
            wait(HookStage::PreDrain, "etcd", None),
            "no timeout: held for as long as the hook is there"
        );
        // A hook added after the drain started does not stop the drain.
        let o = hooked(
            &["etcd"],
            &[],
            DeletionFacts {
                drain_started: Some(t0()),
                ..Default::default()
            },
        );
        assert!(matches!(
            next_step(&o, &cfg(), at(1)),
            Step::DrainPass { .. }
        ));
        // Pre-terminate: after the drain and the volume attachments, before the VM.
        let drained = DeletionFacts {
            drain_started: Some(t0()),
            drained: true,
            drained_at: Some(at(2)),
            ..Default::default()
        };
        let o = hooked(&[], &["lb"], drained.clone());
        assert_eq!(
            next_step(&o, &cfg(), at(3)),
            wait(HookStage::PreTerminate, "lb", None)
        );
        let o = hooked(
            &[],
            &["lb"],
            DeletionFacts {
                attachments_left: 1,
                ..drained.clone()
            },
        );
        assert_eq!(
            next_step(&o, &cfg(), at(3)),
            Step::DeleteVolumeAttachments,
            "volumes are detached before the pre-terminate hooks are waited for"
        );
        // Not once the VM is deleted.
        let o = hooked(
            &[],
            &["lb"],
            DeletionFacts {
                vm_deleted: true,
                ..drained.clone()
            },
        );
        assert_eq!(next_step(&o, &cfg(), at(3)), Step::DeleteNode);
        // With a timeout: the remaining time, then the hooks are given up on, once.
        let c = MachineConfig {
            hook_timeout: Some(10 * MIN),
            ..cfg()
        };
        let o = hooked(&[], &["lb"], drained.clone());
        assert_eq!(
            next_step(&o, &c, at(5)),
            wait(HookStage::PreTerminate, "lb", Some(7 * MIN)),
            "counted from the end of the drain"
        );
        assert_eq!(
            next_step(&o, &c, at(12)),
            Step::ExpireHooks {
                stage: HookStage::PreTerminate,
                hooks: vec!["lb".into()]
            }
        );
        let o = hooked(
            &[],
            &["lb"],
            DeletionFacts {
                pre_terminate_expired: true,
                ..drained
            },
        );
        assert_eq!(next_step(&o, &c, at(12)), Step::DeleteVm);
        let o = hooked(&["etcd"], &[], DeletionFacts::default());
        assert_eq!(
            next_step(&o, &c, at(10)),
            Step::ExpireHooks {
                stage: HookStage::PreDrain,
                hooks: vec!["etcd".into()]
            },
            "counted from the deletion request"
        );
    }
}
