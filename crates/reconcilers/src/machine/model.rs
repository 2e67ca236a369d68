//! What the machine controller's lifecycle decides from and what it can decide: the facts of
//! one Machine ([`Observed`], [`DeletionFacts`], [`NodeHealth`], [`VmReport`]), its effective
//! configuration ([`MachineConfig`]), the steps ([`Step`]), and the [`Snapshot`] one reconcile
//! decides from. Plain data; the rules are in [`decide`](super::decide) and
//! [`plan`](super::plan).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use mcm_api::constants::node_conditions;
use mcm_api::{Machine, MachinePhase};

use super::health::ConditionRule;
use super::hooks::HookStage;

/// The timeouts and health rules that apply to one Machine: the controller's flags,
/// overridden by the Machine's inline `spec` configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MachineConfig {
    /// `--machine-creation-timeout` / `spec.creationTimeout`.
    pub creation_timeout: Duration,
    /// `--machine-health-timeout` / `spec.healthTimeout`.
    pub health_timeout: Duration,
    /// `--machine-drain-timeout` / `spec.drainTimeout`.
    pub drain_timeout: Duration,
    /// `spec.disableHealthTimeout`: never fail a machine for being unhealthy.
    pub disable_health_timeout: bool,
    /// Node condition types that make a machine unhealthy when `True`
    /// (`--node-conditions` / `spec.nodeConditions`).
    pub bad_conditions: Vec<String>,
    /// Per-condition health rules (`--unhealthy-conditions` / the
    /// `health.mcm-rs.io/unhealthy-conditions` annotation).
    pub unhealthy_conditions: Vec<ConditionRule>,
    /// How long a created VM may take to register its Node (`--node-startup-timeout` / the
    /// `health.mcm-rs.io/node-startup-timeout` annotation); `None`: only the creation timeout.
    pub node_startup_timeout: Option<Duration>,
    /// How long a lifecycle hook may hold a deletion (`--machine-lifecycle-hook-timeout`);
    /// `None`: for as long as it is there.
    pub hook_timeout: Option<Duration>,
    /// How long past the health timeout a machine of a partitioned zone is held
    /// (`--machine-zone-partition-max-hold` / the deployment's
    /// `node.machine.sapcloud.io/zone-partition-max-hold`); zero: never held.
    pub zone_partition_max_hold: Duration,
}

/// A Node condition that matches a health rule, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleMatch {
    /// The rule.
    pub rule: ConditionRule,
    /// The condition's last transition (else the Node's creation).
    pub since: Timestamp,
}

/// What a warning announced once per machine is about (see the announcements of
/// [`act`](super::act)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topic {
    /// A health annotation of the Machine or its deployment that does not parse.
    HealthPolicy,
    /// A preserve value on the Node that upstream does not allow.
    PreserveValue,
}

impl Topic {
    /// Its place in a record per topic.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What the driver said of the VM of an unhealthy machine (the fast path).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum VmReport {
    /// Not asked, or the driver could not tell.
    #[default]
    NotAsked,
    /// The driver reported the VM gone (`NotFound`).
    Gone,
    /// The driver reported the VM stopped or failed (cloud-side health).
    Stopped {
        /// The driver's detail.
        message: String,
    },
    /// The VM exists and runs, as far as the driver knows.
    Present,
}

/// Why the machine's class cannot be used right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClassProblem {
    /// `spec.class` is empty or not a MachineClass.
    NoClassReference,
    /// The referenced MachineClass does not exist.
    ClassMissing {
        /// Its name.
        name: String,
    },
    /// A Secret the class references does not exist.
    SecretMissing {
        /// The class.
        class: String,
        /// The secret's name.
        secret: String,
    },
    /// The class failed validation.
    Invalid {
        /// The class.
        class: String,
        /// What is wrong, naming the field.
        message: String,
    },
}

impl std::fmt::Display for ClassProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClassProblem::NoClassReference => {
                f.write_str("spec.class must name a MachineClass (kind MachineClass)")
            }
            ClassProblem::ClassMissing { name } => write!(f, "MachineClass {name:?} not found"),
            ClassProblem::SecretMissing { class, secret } => {
                write!(
                    f,
                    "Secret {secret:?} referenced by MachineClass {class:?} not found"
                )
            }
            ClassProblem::Invalid { class, message } => {
                write!(f, "MachineClass {class:?} is invalid: {message}")
            }
        }
    }
}

/// What the controller saw of the Machine's Node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeHealth {
    /// `Ready` is `True`.
    pub ready: bool,
    /// Since when `Ready` has not been `True` (its last transition), if it is not.
    pub not_ready_since: Option<Timestamp>,
    /// Configured bad condition types that are `True`.
    pub bad_conditions: Vec<String>,
    /// `Ready` is `Unknown` (or missing): the kubelet stopped reporting, so pods on the node
    /// can never finish terminating.
    pub unreachable: bool,
    /// Conditions that match a per-condition health rule.
    pub rule_matches: Vec<RuleMatch>,
}

impl NodeHealth {
    /// The health of `node` under `bad_conditions` and the per-condition `rules`.
    pub(crate) fn of(
        node: &Node,
        bad_conditions: &[String],
        rules: &[ConditionRule],
    ) -> NodeHealth {
        let conditions = node_conditions_of(node);
        let ready_cond = conditions
            .iter()
            .find(|c| c.type_ == node_conditions::READY);
        let ready = ready_cond.is_some_and(|c| c.status == "True");
        let not_ready_since = if ready {
            None
        } else {
            ready_cond
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0)
                .or_else(|| node.metadata.creation_timestamp.as_ref().map(|t| t.0))
        };
        let bad = conditions
            .iter()
            .filter(|c| c.status == "True" && bad_conditions.contains(&c.type_))
            .map(|c| c.type_.clone())
            .collect();
        let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let rule_matches = rules
            .iter()
            .filter_map(|rule| {
                let c = conditions
                    .iter()
                    .find(|c| c.type_ == rule.type_ && c.status == rule.status)?;
                let since = c
                    .last_transition_time
                    .as_ref()
                    .map(|t| t.0)
                    .or(created)
                    .unwrap_or(Timestamp::UNIX_EPOCH);
                Some(RuleMatch {
                    rule: rule.clone(),
                    since,
                })
            })
            .collect();
        NodeHealth {
            ready,
            not_ready_since,
            bad_conditions: bad,
            unreachable: ready_cond.is_none_or(|c| c.status == "Unknown"),
            rule_matches,
        }
    }

    /// Ready and without bad conditions.
    pub(crate) fn healthy(&self) -> bool {
        self.ready && self.bad_conditions.is_empty() && self.rule_matches.is_empty()
    }

    /// A human-readable reason why the node is unhealthy.
    pub(crate) fn unhealthy_reason(&self) -> String {
        let mut parts = Vec::new();
        if !self.ready {
            parts.push("node is not Ready".to_string());
        }
        if !self.bad_conditions.is_empty() {
            parts.push(format!(
                "node conditions {} are True",
                self.bad_conditions.join(", ")
            ));
        }
        for m in &self.rule_matches {
            parts.push(format!(
                "node condition {}={} (health rule {})",
                m.rule.type_, m.rule.status, m.rule
            ));
        }
        parts.join("; ")
    }
}

/// Everything [`next_step`](super::decide::next_step) decides from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observed {
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// How the Machine carries our finalizer.
    pub finalizer: super::Finalizer,
    /// `status.currentStatus.phase`.
    pub phase: Option<MachinePhase>,
    /// When the phase began (`status.currentStatus.lastUpdateTime`), else creation time.
    pub phase_since: Timestamp,
    /// `spec.providerID`, when a VM was recorded.
    pub provider_id: Option<String>,
    /// The `node` label, when the VM's node name was recorded.
    pub node_name: Option<String>,
    /// Whether the class and its secrets are usable.
    pub class: Result<(), ClassProblem>,
    /// The Node, when it exists.
    pub node: Option<NodeHealth>,
    /// The safety controller froze the machine controller.
    pub frozen: bool,
    /// The `force-deletion` label is set.
    pub force_deletion: bool,
    /// Why this machine must not be marked Failed right now even if its health timeout
    /// expired (e.g. it belongs to an old MachineSet while a rollout is in progress).
    pub failure_protected: Option<String>,
    /// The partition of the machine's zone, if its zone is partitioned
    /// ([`super::partition`]); counted only for an Unknown machine whose Node is unreachable.
    pub zone_partition: Option<ZonePartition>,
    /// A VM may exist: a providerID is recorded, or creation was requested (the
    /// `vm-requested` progress annotation). Without either, the Machine never asked for a
    /// VM and is deleted without touching the driver (or needing its class).
    pub vm_requested: bool,
    /// There is a target cluster; without one a machine with a VM is `Available` and never
    /// has a Node.
    pub target_cluster: bool,
    /// The machine is preserved (`preserveExpiryTime` set): a Failed one whose node is
    /// healthy again goes back to Running.
    pub preserved: bool,
    /// What the driver said of the VM (asked only for an Unknown machine whose node is not
    /// Ready, and for a machine being deleted whose drain starts or whose node is not Ready
    /// during its drain: [`Probe::VmStatus`](super::decide::Probe::VmStatus)).
    pub vm: VmReport,
    /// What deletion has done so far (only meaningful while deleting).
    pub deletion: DeletionFacts,
}

/// The facts deletion decides from: the durable progress record on the Machine, plus what
/// was seen of the node's VolumeAttachments and of the VM.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DeletionFacts {
    /// When the drain started (the node was cordoned).
    pub drain_started: Option<Timestamp>,
    /// When the drain first found no pod left to wait for.
    pub pods_drained: Option<Timestamp>,
    /// The drain finished.
    pub drained: bool,
    /// `delete_machine` succeeded.
    pub vm_deleted: bool,
    /// VolumeAttachments to the machine's node that still exist.
    pub attachments_left: usize,
    /// When the deletion was requested (`metadata.deletionTimestamp`).
    pub requested: Option<Timestamp>,
    /// When the drain finished, if it did.
    pub drained_at: Option<Timestamp>,
    /// Pre-drain hooks on the Machine (`name (owner ...)`).
    pub pre_drain_hooks: Vec<String>,
    /// Pre-terminate hooks on the Machine.
    pub pre_terminate_hooks: Vec<String>,
    /// The pre-drain hooks were given up on after the hook timeout.
    pub pre_drain_expired: bool,
    /// The pre-terminate hooks were given up on after the hook timeout.
    pub pre_terminate_expired: bool,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Put our finalizer on the Machine.
    AddFinalizer,
    /// Record the class problem (lastOperation Failed, Event) and retry later.
    ReportClassProblem(ClassProblem),
    /// Find the VM (adopt) or create it (with its bootstrap token, initialized when the
    /// driver needs it), then record providerID and the node label.
    CreateVm,
    /// The VM is recorded but its creation did not finish (no phase yet, or
    /// CrashLoopBackOff after a failed initialization): ask the driver, initialize the VM when
    /// it needs that, then move on as creation does (Pending, Running or Available).
    FinishCreation,
    /// The VM is recorded and there is no target cluster to join: `Available`.
    MarkAvailable,
    /// Pending: wait for the Node; the creation timeout expires in `remaining`.
    AwaitNode {
        /// Time left before the machine fails.
        remaining: Duration,
    },
    /// The Node is Ready and healthy: Running.
    MarkRunning,
    /// The Node is missing or unhealthy: Unknown (the health timeout starts).
    MarkUnknown {
        /// Why.
        reason: String,
    },
    /// Unknown: wait for recovery; the health timeout expires in `remaining` (`None`: never).
    AwaitRecovery {
        /// Time left before the machine fails.
        remaining: Option<Duration>,
    },
    /// The machine is beyond repair: Failed (the MachineSet replaces it), unless its
    /// deployment's replacement budget is used up. The budget is counted by the action,
    /// under the deployment's permit: counted here, the answer could be stale by the time
    /// the failure is written.
    MarkFailed {
        /// Why.
        reason: String,
    },
    /// The machine would fail or start deleting, but the controller is frozen.
    Frozen,
    /// Deletion waits for lifecycle hooks of a stage to be removed by their owners.
    AwaitHooks {
        /// The stage.
        stage: HookStage,
        /// The hooks (`name (owner ...)`).
        hooks: Vec<String>,
        /// Time left before the hook timeout gives up on them (`None`: no timeout).
        remaining: Option<Duration>,
    },
    /// The hook timeout passed: record that the stage's hooks are given up on (Warning) and
    /// go on.
    ExpireHooks {
        /// The stage.
        stage: HookStage,
        /// The hooks left.
        hooks: Vec<String>,
    },
    /// The machine would fail, but its deployment's replacement budget is used up (why, and
    /// the reason it would fail): recorded, and looked at again later. Chosen by the plan
    /// from [`Snapshot::replacement`].
    ThrottleReplacement {
        /// Why the replacement is throttled.
        throttled: String,
        /// Why the machine would fail.
        reason: String,
    },
    /// The machine would fail, but another reconcile holds its deployment's replacement
    /// permit: look again shortly (the permit serialises the failures of a deployment, so
    /// each counts those written before it).
    AwaitReplacementPermit,
    /// The machine would fail, but it is protected (see [`Observed::failure_protected`]).
    Protected {
        /// Why.
        reason: String,
    },
    /// Healthy and Running: keep Node conditions, node template and bootstrap token tidy.
    KeepRunning,
    /// Nothing to do (Failed machines wait for their owner; foreign objects are left alone).
    Nothing,
    /// Past its health timeout, but its zone is partitioned and its VM runs: not marked
    /// Failed (no drain, no deletion, no replacement) for up to `remaining`.
    HeldByPartition {
        /// The partition, as counted.
        partition: ZonePartition,
        /// How long the hold may still last.
        remaining: Duration,
    },
    /// Deletion requested: set Terminating.
    MarkTerminating,
    /// One pass of the drain (cordon, evictions or deletions of this round, then requeue).
    /// The first pass also marks the node Terminating and records when the drain started.
    DrainPass {
        /// The first pass: the drain has not started yet.
        first: bool,
        /// Delete pods instead of evicting them.
        force: bool,
        /// Why force was chosen, if it was.
        force_reason: Option<String>,
        /// The node is unreachable: pods whose deletion was requested are not waited for.
        unreachable: bool,
        /// The node is not Ready and the driver reports its VM gone or stopped (why, in
        /// words): its pods run nowhere and are deleted, not evicted.
        vm_dead: Option<String>,
        /// Time since the drain started.
        elapsed: Duration,
        /// Time since the drain first found no pod left, if it did.
        pods_gone_for: Option<Duration>,
    },
    /// Drained (or nothing to drain): delete the VolumeAttachments of the node.
    DeleteVolumeAttachments,
    /// Delete the VM through the driver (always called when a VM may exist, so leftovers
    /// such as disks or NICs go too).
    DeleteVm,
    /// A VM may exist but the class cannot be used to delete it: keep the finalizer, say so,
    /// and continue once the class is fixed.
    DeletionBlocked(ClassProblem),
    /// The VM is gone: delete the Node.
    DeleteNode,
    /// Everything is gone: delete the bootstrap token and remove the finalizer.
    RemoveFinalizer,
}

/// The verdict of a machine's deployment on one more replacement, taken under the
/// deployment's permit (see [`gather`](super::gather::gather)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Replacement {
    /// Not asked (the machine is not about to fail), or the machine has no deployment.
    #[default]
    NotAsked,
    /// Another reconcile holds the deployment's permit.
    Busy,
    /// The budget allows it: the permit is held for this reconcile.
    Allowed,
    /// The budget is used up, or the remediation policy holds (why).
    Throttled(String),
}

/// A partition of one zone, as counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZonePartition {
    /// The zone.
    pub zone: String,
    /// Its machines whose Nodes are unreachable.
    pub unreachable: usize,
    /// Its machines.
    pub machines: usize,
    /// Healthy machines of the other zones.
    pub healthy_elsewhere: usize,
    /// Machines of the other zones.
    pub elsewhere: usize,
}

impl ZonePartition {
    /// The reason a held machine gives, naming the zone.
    pub(crate) fn describe(&self) -> String {
        format!(
            "zone {} is partitioned: the Nodes of {} of its {} machines are unreachable while \
             {} of the {} machines of the other zones are healthy",
            self.zone, self.unreachable, self.machines, self.healthy_elsewhere, self.elsewhere
        )
    }
}

/// What the Node store says about the Node a Machine records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// The machine records no node.
    NotRecorded,
    /// The Node exists (or is not managed by MCM: deleting it is not ours to act on).
    Present,
    /// The Node is being deleted: our finalizer (or another) holds it.
    Deleting,
    /// The Node is gone.
    Gone,
}

/// Everything one reconcile of a Machine decides from: what
/// [`gather`](super::gather::gather) read, for [`plan`](super::plan::plan).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The Machine, as the store holds it.
    pub machine: Arc<Machine>,
    /// Now, taken once from the context's clock.
    pub now: Timestamp,
    /// The safety controller froze the machine controller.
    pub frozen: bool,
    /// The state of the machine's Node.
    pub node_state: NodeState,
    /// The machine's effective configuration (flags, overridden by its own and its
    /// deployment's annotations).
    pub cfg: MachineConfig,
    /// A health annotation that does not parse and has not been announced for this machine.
    pub policy_problem: Option<String>,
    /// The machine's MachineDeployment (through its MachineSet), from the store.
    pub deployment: Option<Arc<mcm_api::MachineDeployment>>,
    /// The deployment's verdict on replacing the machine, when it is about to fail.
    pub replacement: Replacement,
    /// The deployment's replacement permit, held until the reconcile ends when
    /// [`Replacement::Allowed`].
    pub permit: Option<Arc<mcm_permits::Permit>>,
    /// The Node store's copy predates our own last write of the Node: a node write planned
    /// from it would repeat that write.
    pub node_copy_behind: bool,
    /// Whether the class exists (its secrets are read when a step needs them).
    pub class: Result<(), ClassProblem>,
    /// The machine's Node, when it exists and MCM manages it.
    pub node: Option<Arc<Node>>,
    /// Why the machine must not be marked Failed now (a rollout protects it).
    pub protection: Option<String>,
    /// VolumeAttachments still pointing at the node of a machine being deleted.
    pub attachments_left: usize,
    /// What the driver said of the VM ([`Probe::VmStatus`](super::decide::Probe::VmStatus)).
    pub vm: VmReport,
    /// The partition of the machine's zone, counted for an Unknown machine whose Node is
    /// unreachable ([`super::partition`]).
    pub zone_partition: Option<ZonePartition>,
}

/// The Node's conditions (empty when it has no status yet).
pub(crate) fn node_conditions_of(node: &Node) -> &[NodeCondition] {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
}
