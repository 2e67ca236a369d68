//! Turning cluster objects into the [`Observed`] snapshot the decision is made from. Pure.

pub(crate) use super::model::node_conditions_of;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use mcm_api::constants::{annotations, labels};
use mcm_api::{Machine, MachineClass, MachinePhase};

use std::collections::BTreeMap;

use super::decide::{ClassProblem, DeletionFacts, MachineConfig, NodeHealth, Observed, VmReport};
use super::health::{self, ConditionRule};
use super::hooks::{HookStage, hooks_of};

/// The controller-wide defaults that a Machine's inline configuration may override.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// `--machine-creation-timeout`
    pub creation_timeout: Duration,
    /// `--machine-health-timeout`
    pub health_timeout: Duration,
    /// `--machine-drain-timeout`
    pub drain_timeout: Duration,
    /// `--machine-max-evict-retries`
    pub max_evict_retries: i32,
    /// `--node-conditions`
    pub bad_conditions: Vec<String>,
    /// `--machine-preserve-timeout`
    pub preserve_timeout: Duration,
    /// `--machine-inplace-update-timeout`
    pub inplace_timeout: Duration,
    /// `--unhealthy-conditions` (mcm-rs)
    pub unhealthy_conditions: Vec<ConditionRule>,
    /// `--node-startup-timeout` (mcm-rs; `None`: off)
    pub node_startup_timeout: Option<Duration>,
    /// `--machine-lifecycle-hook-timeout` (mcm-rs; `None`: hooks hold for as long as they
    /// are there)
    pub hook_timeout: Option<Duration>,
    /// `--machine-zone-partition-*` (mcm-rs)
    pub zone_partition: super::partition::PartitionRule,
}

/// The effective configuration of one machine (its `spec` overrides the defaults) with the health annotations of the Machine, else of its
/// MachineDeployment (`deployment`), over the flags. An annotation that does not parse is
/// returned as the second value, and the flags apply in its place (the caller reports it).
pub(crate) fn machine_config_in(
    machine: &Machine,
    deployment: Option<&BTreeMap<String, String>>,
    d: &Defaults,
) -> (MachineConfig, Option<String>) {
    let (overrides, problem) =
        match health::overrides(machine.metadata.annotations.as_ref(), deployment) {
            Ok(o) => (o, None),
            Err((annotation, e)) => (
                health::HealthOverrides::default(),
                Some(format!("annotation {annotation}: {e}")),
            ),
        };
    let c = &machine.spec.configuration;
    let bad_conditions = match c.node_conditions.as_deref() {
        Some(s) if !s.trim().is_empty() => split_list(s),
        _ => d.bad_conditions.clone(),
    };
    let cfg = MachineConfig {
        creation_timeout: effective_creation_timeout(machine)
            .or(c.creation_timeout.map(|g| g.0))
            .unwrap_or(d.creation_timeout),
        health_timeout: c.health_timeout.map(|g| g.0).unwrap_or(d.health_timeout),
        drain_timeout: c.drain_timeout.map(|g| g.0).unwrap_or(d.drain_timeout),
        disable_health_timeout: c.disable_health_timeout.unwrap_or(false),
        bad_conditions,
        unhealthy_conditions: overrides
            .unhealthy_conditions
            .unwrap_or_else(|| d.unhealthy_conditions.clone()),
        node_startup_timeout: overrides
            .node_startup_timeout
            .unwrap_or(d.node_startup_timeout),
        hook_timeout: d.hook_timeout,
        zone_partition_max_hold: d.zone_partition.max_hold,
    };
    // The deployment's hold bound (a value that does not parse is reported like the health
    // annotations, and the flag applies).
    let mut problem = problem;
    let mut cfg = cfg;
    if let Some(value) = deployment.and_then(|a| a.get(super::partition::MAX_HOLD_ANNOTATION)) {
        match mcm_api::duration::parse_go_duration(value) {
            Ok(d) => cfg.zone_partition_max_hold = d,
            Err(e) => {
                problem.get_or_insert_with(|| {
                    format!(
                        "annotation {}: {value:?} is not a duration: {e}",
                        super::partition::MAX_HOLD_ANNOTATION
                    )
                });
            }
        }
    }
    (cfg, problem)
}

/// The Machine's `node.machine.sapcloud.io/effective-creation-timeout` annotation, when it
/// is a duration: it wins over `spec.creationTimeout` (upstream's order; a value that does
/// not parse is ignored, and the MachineSet that copied it warned about it).
pub(crate) fn effective_creation_timeout(machine: &Machine) -> Option<Duration> {
    let value = machine
        .metadata
        .annotations
        .as_ref()?
        .get(annotations::EFFECTIVE_CREATION_TIMEOUT)?;
    mcm_api::duration::parse_go_duration(value).ok()
}

/// Splits a comma-separated flag value, dropping blanks.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

/// The name of the class a Machine references ([`Machine::class_name`]), or the problem
/// with the reference.
pub(crate) fn class_name(machine: &Machine) -> Result<&str, ClassProblem> {
    machine.class_name().ok_or(ClassProblem::NoClassReference)
}

/// A Secret a class references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretRef {
    /// Its namespace (the class's own when the reference names none).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// The secrets a class references: `secretRef`, then `credentialsSecretRef` (`None` where a
/// reference is absent).
pub(crate) fn class_secret_refs(class: &MachineClass) -> [Option<SecretRef>; 2] {
    let own = class.metadata.namespace.clone().unwrap_or_default();
    [&class.secret_ref, &class.credentials_secret_ref].map(|r| {
        let r = r.as_ref()?;
        Some(SecretRef {
            namespace: r
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| own.clone()),
            name: r.name.clone().filter(|n| !n.is_empty())?,
        })
    })
}

/// The node name recorded on a Machine ([`Machine::node_name`], its `node` label).
pub(crate) fn node_name(machine: &Machine) -> Option<&str> {
    machine.node_name()
}

/// Whether the Node is excluded from MCM's management.
pub(crate) fn node_not_managed(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::NOT_MANAGED_BY_MCM))
}

/// The health of a machine's Node under the machine's configuration: `Ready`, the bad
/// conditions and the per-condition rules. The one health every decision about a machine
/// reads ([`NodeHealth::healthy`]): the lifecycle, preservation, in-place updates and what a
/// created VM settles into. (The remediation census counts otherwise, see
/// [`super::remediation::Member`].)
pub(crate) fn health(node: &Node, cfg: &MachineConfig) -> NodeHealth {
    node_health_with(node, &cfg.bad_conditions, &cfg.unhealthy_conditions)
}

/// The health of `node` as far as `Ready` and the `bad_conditions` tell (no per-condition
/// rules): for callers without a machine's configuration.
pub(crate) fn node_health(node: &Node, bad_conditions: &[String]) -> NodeHealth {
    node_health_with(node, bad_conditions, &[])
}

/// The health of a Node under the configured bad conditions and health rules.
pub(crate) fn node_health_with(
    node: &Node,
    bad_conditions: &[String],
    rules: &[ConditionRule],
) -> NodeHealth {
    NodeHealth::of(node, bad_conditions, rules)
}

/// When the current phase began: `currentStatus.lastUpdateTime`, else the creation time.
pub fn phase_since(machine: &Machine) -> Timestamp {
    machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.as_ref())
        .and_then(|c| c.last_update_time.as_ref())
        .or(machine.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Inputs of [`observe`] that come from other objects than the Machine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    /// Whether the class and its secrets are usable.
    pub class: &'a Result<(), ClassProblem>,
    /// The Machine's Node, if it exists and is managed by MCM.
    pub node: Option<&'a Node>,
    /// The safety controller froze the machine controller.
    pub frozen: bool,
    /// Why the machine must not be failed now, if it must not.
    pub failure_protected: Option<&'a str>,
    /// The partition of the machine's zone, if counted and found.
    pub zone_partition: Option<&'a super::partition::ZonePartition>,
    /// What the driver said of the VM (the fast path of an Unknown machine; the drain of a
    /// machine being deleted).
    pub vm: &'a VmReport,
    /// VolumeAttachments to the machine's node.
    pub attachments_left: usize,
    /// There is a target cluster.
    pub target_cluster: bool,
}

/// A progress annotation of the Machine (see [`annotations::progress`]) as a time.
/// An unparsable value counts as present, at the Machine's creation time.
pub(crate) fn progress(machine: &Machine, key: &str) -> Option<Timestamp> {
    let value = machine.metadata.annotations.as_ref()?.get(key)?;
    Some(value.parse().unwrap_or_else(|_| {
        machine
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }))
}

/// Whether a VM may exist for the Machine: a providerID is recorded, or creation was
/// requested.
pub(crate) fn vm_requested(machine: &Machine) -> bool {
    machine
        .spec
        .provider_id
        .as_deref()
        .is_some_and(|p| !p.is_empty())
        || progress(machine, annotations::progress::VM_REQUESTED).is_some()
}

/// Builds the decision snapshot of a Machine.
pub(crate) fn observe(machine: &Machine, cfg: &MachineConfig, ctx: Context<'_>) -> Observed {
    let m = &machine.metadata;
    Observed {
        deleting: m.deletion_timestamp.is_some(),
        finalizer: crate::machine::Finalizer::of(m.finalizers.as_deref().unwrap_or_default()),
        phase: machine.phase().cloned(),
        phase_since: phase_since(machine),
        provider_id: machine.spec.provider_id.clone().filter(|p| !p.is_empty()),
        node_name: machine.node_name().map(String::from),
        class: ctx.class.clone(),
        node: ctx.node.map(|n| health(n, cfg)),
        frozen: ctx.frozen,
        force_deletion: m
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::FORCE_DELETION))
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        failure_protected: ctx.failure_protected.map(String::from),
        zone_partition: ctx.zone_partition.cloned(),
        vm_requested: vm_requested(machine),
        target_cluster: ctx.target_cluster,
        preserved: mcm_api::preservation::expiry(machine).is_some(),
        vm: ctx.vm.clone(),
        deletion: DeletionFacts {
            drain_started: progress(machine, annotations::progress::DRAIN_STARTED),
            pods_drained: progress(machine, annotations::progress::PODS_DRAINED),
            drained: progress(machine, annotations::progress::DRAINED).is_some(),
            vm_deleted: progress(machine, annotations::progress::VM_DELETED).is_some(),
            attachments_left: ctx.attachments_left,
            requested: m.deletion_timestamp.as_ref().map(|t| t.0),
            drained_at: progress(machine, annotations::progress::DRAINED),
            pre_drain_hooks: hooks_of(m.annotations.as_ref(), HookStage::PreDrain),
            pre_terminate_hooks: hooks_of(m.annotations.as_ref(), HookStage::PreTerminate),
            pre_drain_expired: progress(machine, annotations::progress::PRE_DRAIN_HOOKS_EXPIRED)
                .is_some(),
            pre_terminate_expired: progress(
                machine,
                annotations::progress::PRE_TERMINATE_HOOKS_EXPIRED,
            )
            .is_some(),
        },
    }
}

/// Whether a Machine is in one of the phases counted as "being replaced" for meltdown
/// protection.
pub(crate) fn is_being_replaced(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
        || machine.phase() == Some(&MachinePhase::Terminating)
        // A preserved Failed machine is kept, not replaced (upstream's rule).
        || (machine.phase() == Some(&MachinePhase::Failed)
            && mcm_api::preservation::expiry(machine).is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeCondition;

    fn machine_config(machine: &Machine, d: &Defaults) -> MachineConfig {
        machine_config_in(machine, None, d).0
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use mcm_api::{ClassSpec, GoDuration, MachineSpec};

    fn defaults() -> Defaults {
        Defaults {
            creation_timeout: Duration::from_secs(1200),
            health_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(7200),
            max_evict_retries: 10,
            bad_conditions: split_list("KernelDeadlock,ReadonlyFilesystem"),
            preserve_timeout: Duration::from_secs(96 * 3600),
            inplace_timeout: Duration::from_secs(20 * 60),
            unhealthy_conditions: vec![],
            node_startup_timeout: None,
            hook_timeout: None,
            zone_partition: Default::default(),
        }
    }

    fn cond(type_: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
            ..Default::default()
        }
    }

    fn node(conds: Vec<NodeCondition>) -> Node {
        serde_json::from_value(serde_json::json!({ "status": { "conditions": conds } })).unwrap()
    }

    #[test]
    fn inline_configuration_overrides_flags() {
        let mut m = Machine::new("m", MachineSpec::default());
        m.spec.configuration.health_timeout = Some(GoDuration(Duration::from_secs(30)));
        m.spec.configuration.node_conditions = Some("DiskPressure".into());
        let c = machine_config(&m, &defaults());
        assert_eq!(c.health_timeout, Duration::from_secs(30));
        assert_eq!(c.creation_timeout, Duration::from_secs(1200));
        assert_eq!(c.bad_conditions, vec!["DiskPressure".to_string()]);
    }

    #[test]
    fn the_effective_creation_timeout_annotation_wins() {
        let mut m = Machine::new("m", MachineSpec::default());
        m.spec.configuration.creation_timeout = Some(GoDuration(Duration::from_secs(300)));
        assert_eq!(
            machine_config(&m, &defaults()).creation_timeout,
            Duration::from_secs(300)
        );
        m.metadata.annotations = Some(
            [(
                annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
                "1h30m".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            machine_config(&m, &defaults()).creation_timeout,
            Duration::from_secs(5400)
        );
        // Not a duration: ignored.
        m.metadata.annotations = Some(
            [(
                annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
                "soon".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            machine_config(&m, &defaults()).creation_timeout,
            Duration::from_secs(300)
        );
    }

    #[test]
    fn node_health_reads_ready_and_bad_conditions() {
        let bad = split_list("KernelDeadlock");
        let h = node_health(&node(vec![cond("Ready", "True")]), &bad);
        assert!(h.healthy());
        let h = node_health(
            &node(vec![cond("Ready", "True"), cond("KernelDeadlock", "True")]),
            &bad,
        );
        assert_eq!(h.bad_conditions, vec!["KernelDeadlock".to_string()]);
        assert!(!h.healthy());
        let h = node_health(&node(vec![cond("Ready", "False")]), &bad);
        assert!(
            !h.ready && !h.unreachable,
            "a reporting kubelet is reachable"
        );
        let h = node_health(&node(vec![cond("Ready", "Unknown")]), &bad);
        assert!(!h.ready && h.unreachable);
        assert_eq!(
            h.not_ready_since,
            Some("2026-01-01T00:00:00Z".parse().unwrap())
        );
        // No conditions at all: not ready, and unreachable.
        let h = node_health(&Node::default(), &bad);
        assert!(!h.ready && h.unreachable);
    }

    #[test]
    fn class_references_are_checked() {
        let mut m = Machine::new("m", MachineSpec::default());
        assert_eq!(class_name(&m), Err(ClassProblem::NoClassReference));
        m.spec.class = Some(ClassSpec {
            kind: Some("MachineClass".into()),
            name: Some("c".into()),
            api_group: None,
        });
        assert_eq!(class_name(&m), Ok("c"));
        m.spec.class.as_mut().unwrap().kind = Some("AWSMachineClass".into());
        assert_eq!(class_name(&m), Err(ClassProblem::NoClassReference));
    }
}
