//! Well-known labels, annotations, finalizers, taints, condition types and placeholders, with
//! the exact strings the Go machine-controller-manager uses.

/// Labels put on machine objects and Nodes.
pub mod labels {
    /// Label on a Machine naming its Node.
    pub const NODE: &str = "node";
    /// Label on Machines/MachineSets naming the MachineDeployment they belong to.
    pub const NAME: &str = "name";
    /// Label (and selector key) distinguishing the MachineSets of one MachineDeployment by
    /// template hash.
    pub const MACHINE_TEMPLATE_HASH: &str = "machine-template-hash";
    /// Label on a Machine (value `"True"`) that makes its drain and deletion forceful.
    pub const FORCE_DELETION: &str = "force-deletion";
    /// Label on a MachineSet/MachineDeployment (value `"True"`) set by the safety controller
    /// when it is frozen.
    pub const FREEZE: &str = "freeze";
    /// Value of [`FREEZE`] and [`FORCE_DELETION`] when set.
    pub const TRUE_VALUE: &str = "True";
    /// Label on a Node naming the Machine backing it.
    pub const NODE_MACHINE_NAME: &str = "node.gardener.cloud/machine-name";
    /// Label on a MachineSet disabling its scale-up.
    pub const MACHINE_SET_SCALE_UP_DISABLED: &str = "node.machine.sapcloud.io/scale-up-disabled";
    /// Label on a Node (value `"true"`) selecting it for a manual in-place update.
    pub const SELECTED_FOR_UPDATE: &str = "node.machine.sapcloud.io/selected-for-update";
    /// Node label: the node's machine belongs to an old MachineSet of an in-place rollout
    /// (set by the MachineDeployment controller).
    pub const CANDIDATE_FOR_UPDATE: &str = "node.machine.sapcloud.io/candidate-for-update";
    /// Node label set by the node agent after an in-place update (values in
    /// [`update_result`]); on a Machine while its ownership moves to the new MachineSet.
    pub const UPDATE_RESULT: &str = "node.machine.sapcloud.io/update-result";
    /// Values of [`UPDATE_RESULT`].
    pub mod update_result {
        /// The update succeeded.
        pub const SUCCESSFUL: &str = "successful";
        /// The update failed (the reason in the Node annotation
        /// [`super::super::annotations::UPDATE_FAILED_REASON`]).
        pub const FAILED: &str = "failed";
    }
    /// Machine label forcing the drain of an in-place update (`True`).
    pub const FORCE_DRAIN: &str = "force-drain";
}

/// Annotations read or written by the controllers.
pub mod annotations {
    /// Deletion priority of a Machine (`"1"`..`"3"`, default 3); lower is deleted first, `"1"`
    /// means the machine was triggered for deletion.
    pub const MACHINE_PRIORITY: &str = "machinepriority.machine.sapcloud.io";
    /// Node annotation: the Node is not managed by the machine-controller-manager.
    pub const NOT_MANAGED_BY_MCM: &str = "node.machine.sapcloud.io/not-managed-by-mcm";
    /// MachineDeployment annotation set by the cluster-autoscaler: machines to delete, as
    /// `name~time` pairs separated by commas.
    pub const TRIGGER_DELETION_BY_MCM: &str = "node.machine.sapcloud.io/trigger-deletion-by-mcm";
    /// Node annotation holding the annotations, labels and taints last applied from the
    /// node template (JSON), so removed entries can be removed from the Node.
    pub const LAST_APPLIED_ANNO_LABELS_TAINTS: &str =
        "node.machine.sapcloud.io/last-applied-anno-labels-taints";
    /// Node annotation holding the virtual capacity last applied from the MachineClass (JSON).
    pub const LAST_APPLIED_VIRTUAL_CAPACITY: &str =
        "node.machine.sapcloud.io/last-applied-virtual-capacity";
    /// Machine annotation: when the machine was marked for deletion.
    pub const MARKED_FOR_DELETION_TIME: &str = "machine.sapcloud.io/marked-for-deletion-time";
    /// MachineDeployment annotation: when a scaler last changed the replicas.
    pub const LAST_DEPLOYMENT_REPLICA_CHANGE_BY_SCALER_TIME: &str =
        "machine.sapcloud.io/last-deployment-replica-change-by-scaler-time";
    /// Node annotation telling the cluster-autoscaler not to scale the Node down.
    pub const CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED: &str =
        "cluster-autoscaler.kubernetes.io/scale-down-disabled";
    /// Node annotation recording that [`CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED`] was set by
    /// the machine-controller-manager (so only it removes it again).
    pub const CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_BY_MCM: &str =
        "cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm";
    /// Value of both cluster-autoscaler annotations when set.
    pub const CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED_VALUE: &str = "true";
    /// Revision of a MachineDeployment / MachineSet (Deployment semantics).
    pub const REVISION: &str = "deployment.kubernetes.io/revision";
    /// Comma-separated former revisions of a MachineSet.
    pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
    /// Desired replicas of the MachineDeployment, recorded on its MachineSets.
    pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
    /// Maximum replicas (desired + surge) of the MachineDeployment, recorded on MachineSets.
    pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
    /// Deprecated rollback request annotation.
    pub const DEPRECATED_ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
    /// Annotation asking the safety controller to unfreeze a MachineSet/MachineDeployment.
    pub const UNFREEZE: &str = "safety.machine.sapcloud.io/unfreeze";
    /// Node annotation of the node agent: why an in-place update failed.
    pub const UPDATE_FAILED_REASON: &str = "node.machine.sapcloud.io/update-failed-reason";
    /// MachineDeployment annotation (a Go duration) that overrides the creation timeout of
    /// the machines it creates from now on; copied to its new MachineSet and to each new
    /// Machine (whose `spec.creationTimeout` it also sets).
    pub const EFFECTIVE_CREATION_TIMEOUT: &str =
        "node.machine.sapcloud.io/effective-creation-timeout";
    /// MachineDeployment annotation (mcm-rs; a Go duration): how long past its health timeout
    /// a machine of a partitioned zone is held instead of remediated (`0s`: no hold),
    /// overriding `--machine-zone-partition-max-hold`.
    pub const ZONE_PARTITION_MAX_HOLD: &str = "node.machine.sapcloud.io/zone-partition-max-hold";
    /// Machine annotation: how long the machine took from creation to its Node joining (a Go
    /// duration).
    pub const MACHINE_JOIN_DURATION: &str = "node.machine.sapcloud.io/machine-join-duration";
    /// MachineDeployment annotation (RFC 3339): when the MachineDeployment controller last
    /// set [`EFFECTIVE_CREATION_TIMEOUT`] (upstream PR #1156's key). Its presence tells a
    /// value the controller adapted from one a user set: only the former is lowered again
    /// and removed.
    pub const EFFECTIVE_CREATION_TIMEOUT_LAST_APPLIED_AT: &str =
        "node.machine.sapcloud.io/effective-creation-timeout-last-applied-at";
    /// MachineDeployment annotation (a decimal count): the replace cycles (effective-timeout
    /// windows in which a machine of the deployment did not join) counted towards the next
    /// raise of [`EFFECTIVE_CREATION_TIMEOUT`] (upstream PR #1156's key).
    pub const REPLACE_CYCLE_COUNT: &str = "node.machine.sapcloud.io/replace-cycle-count";
    /// MachineDeployment annotation (RFC 3339): when the last replace cycle was counted
    /// (upstream PR #1156's key).
    pub const REPLACE_CYCLE_COUNT_LAST_APPLIED_AT: &str =
        "node.machine.sapcloud.io/replace-cycle-count-last-applied-at";
    /// Machine/Node annotation requesting preservation (values in [`preserve_values`]).
    pub const PRESERVE: &str = "node.machine.sapcloud.io/preserve";
    /// Node annotation holding the preserve value last applied by the controller.
    pub const LAST_APPLIED_NODE_PRESERVE_VALUE: &str =
        "node.machine.sapcloud.io/last-applied-node-preserve-value";

    /// Values of the [`PRESERVE`] annotation.
    pub mod preserve_values {
        /// Preserve now, whatever the phase.
        pub const NOW: &str = "now";
        /// Preserve if and when the machine fails.
        pub const WHEN_FAILED: &str = "when-failed";
        /// Set by the controllers on failed machines they preserve automatically.
        pub const AUTO_PRESERVED: &str = "auto-preserved";
        /// Never preserve automatically; stops an ongoing preservation.
        pub const FALSE: &str = "false";
    }

    /// Machine annotations in which the machine controller records its progress durably
    /// (mcm-rs additions; values are RFC 3339 times). They are metadata, so no CRD schema
    /// can prune them, and each step of creation and deletion decides from them after a
    /// restart instead of parsing `status.lastOperation`.
    pub mod progress {
        /// Written before the first `create_machine` call: a VM may exist from then on,
        /// even if the Machine never recorded a providerID. Removed again only when the
        /// driver refused that first request as `InvalidArgument` (nothing was created).
        /// A Machine without it and without a providerID never asked for a VM, so it can be
        /// deleted without its class.
        pub const VM_REQUESTED: &str = "progress.machine.sapcloud.io/vm-requested";
        /// When the drain of the Machine's Node started (the node was cordoned): the drain
        /// timeout and the eviction retries count from here, across restarts.
        pub const DRAIN_STARTED: &str = "progress.machine.sapcloud.io/drain-started";
        /// When the drain first found no pod left to wait for: the wait for volumes to
        /// detach counts from here.
        pub const PODS_DRAINED: &str = "progress.machine.sapcloud.io/pods-drained";
        /// When the drain finished.
        pub const DRAINED: &str = "progress.machine.sapcloud.io/drained";
        /// When `delete_machine` succeeded.
        pub const VM_DELETED: &str = "progress.machine.sapcloud.io/vm-deleted";
        /// When the pre-drain hooks were given up on after `--machine-lifecycle-hook-timeout`
        /// (the deletion went on with them still present).
        pub const PRE_DRAIN_HOOKS_EXPIRED: &str =
            "progress.machine.sapcloud.io/pre-drain-hooks-expired";
        /// When the pre-terminate hooks were given up on after
        /// `--machine-lifecycle-hook-timeout`.
        pub const PRE_TERMINATE_HOOKS_EXPIRED: &str =
            "progress.machine.sapcloud.io/pre-terminate-hooks-expired";
    }

    /// Lifecycle hooks (Cluster API's semantics and prefixes, in MCM's group): while a
    /// Machine being deleted carries an annotation with one of these prefixes, its deletion
    /// waits at that stage. The part after the prefix names the hook; the value names its
    /// owner. The owner removes the annotation when it is done.
    pub mod hooks {
        /// Holds the deletion before the node is drained.
        pub const PRE_DRAIN_PREFIX: &str = "pre-drain.delete.hook.machine.sapcloud.io/";
        /// Holds the deletion after the drain, before the VM is deleted.
        pub const PRE_TERMINATE_PREFIX: &str = "pre-terminate.delete.hook.machine.sapcloud.io/";
    }

    /// Health and remediation policy (mcm-rs additions, on a Machine or on the
    /// MachineDeployment that owns it; the Machine's value wins).
    pub mod policy {
        /// Per-condition health rules: `Type=Status:duration` separated by commas, e.g.
        /// `Ready=Unknown:5m,KernelDeadlock=True:1m`. A node whose condition has had that
        /// status for that long fails its machine without waiting for the health timeout.
        pub const UNHEALTHY_CONDITIONS: &str = "health.mcm-rs.io/unhealthy-conditions";
        /// How long a created VM may take to register its Node (a Go duration); the
        /// creation timeout still bounds the time until the Node is Ready.
        pub const NODE_STARTUP_TIMEOUT: &str = "health.mcm-rs.io/node-startup-timeout";
        /// On a MachineDeployment: how many of its machines may be Failed or being replaced
        /// at once (a count or a percentage of its replicas, rounded up). Default: its
        /// resolved maxSurge, at least 1.
        pub const MAX_IN_FLIGHT: &str = "remediation.mcm-rs.io/max-in-flight";
        /// On a MachineDeployment: the short-circuit. When more of its machines than this
        /// (a count or a percentage of its machines, rounded down) are unhealthy at once, none
        /// is marked Failed. Default: none.
        pub const MAX_UNHEALTHY: &str = "remediation.mcm-rs.io/max-unhealthy";
    }
}

/// Descriptions the machine controllers write into a Machine's `status.lastOperation` that
/// other controllers recognise (a part of the description, which also names the machine and
/// the timeout).
pub mod operations {
    /// mcm-rs: a machine `Failed` because its Node did not join (was not Ready and healthy)
    /// within its creation timeout.
    pub const NOT_JOINED_WITHIN_CREATION_TIMEOUT: &str =
        "machine did not join the cluster within the creation timeout";
    /// The Go MCM's wording of the same failure (`Machine <name> failed to join the cluster
    /// in <timeout> minutes.`).
    pub const GO_FAILED_TO_JOIN: &str = "failed to join the cluster in";
}

/// Finalizers.
pub mod finalizers {
    /// The finalizer the Go MCM puts on Machines, MachineClasses, MachineSets and
    /// MachineDeployments (both its machine controller and its manager use it).
    pub const MACHINE_CONTROLLER_MANAGER: &str = "machine.sapcloud.io/machine-controller-manager";
    /// The finalizer the Go machine controller puts on the Secrets that MachineClasses
    /// reference (only there). Earlier mcm-rs releases put it on Machines and MachineClasses
    /// too: it is taken off them as a legacy name.
    pub const MACHINE_CONTROLLER: &str = "machine.sapcloud.io/machine-controller";
    /// The finalizer the Go machine controller (since 0.61) puts on the Node of every machine
    /// that is not being deleted, so that deleting the Node first deletes its machine (drain,
    /// VM deletion); it is removed just before the machine's deletion deletes the Node, and
    /// from Nodes no machine claims.
    pub const NODE: &str = "node.machine.sapcloud.io/machine-controller";
}

/// Node taints.
pub mod taints {
    /// `PreferNoSchedule` taint put on the Nodes of old MachineSets during a rolling update.
    pub const PREFER_NO_SCHEDULE: &str = "deployment.machine.sapcloud.io/prefer-no-schedule";
    /// Kubernetes' cordon taint (`NoSchedule`), added together with `spec.unschedulable`.
    pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
    /// Gardener taint: critical components of the Node are not ready yet.
    pub const CRITICAL_COMPONENTS_NOT_READY: &str =
        "node.gardener.cloud/critical-components-not-ready";
    /// Taint cordoning the Node of a preserved failed machine.
    pub const NODE_PRESERVED: &str = "node.machine.sapcloud.io/preserved";
}

/// Node condition types and reasons used by the controllers.
pub mod node_conditions {
    /// Condition set on a Node while its machine is being deleted.
    pub const TERMINATING: &str = "Terminating";
    /// Reason of [`TERMINATING`] when an unhealthy machine is replaced.
    pub const REASON_UNHEALTHY: &str = "Unhealthy";
    /// Reason of [`TERMINATING`] when a healthy machine is scaled down.
    pub const REASON_SCALE_DOWN: &str = "ScaleDown";
    /// Kernel deadlock detected (node-problem-detector).
    pub const KERNEL_DEADLOCK: &str = "KernelDeadlock";
    /// Read-only root filesystem detected (node-problem-detector).
    pub const READONLY_FILESYSTEM: &str = "ReadonlyFilesystem";
    /// Kubelet reports disk pressure.
    pub const DISK_PRESSURE: &str = "DiskPressure";
    /// The Node's network is not configured.
    pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
    /// The kubelet's readiness condition.
    pub const READY: &str = "Ready";
    /// Condition tracking an in-place update of the Node.
    pub const IN_PLACE_UPDATE: &str = "InPlaceUpdate";
    /// Reasons of the [`IN_PLACE_UPDATE`] condition, in the order an update goes through them.
    pub mod in_place {
        /// The node's machine belongs to an old set.
        pub const CANDIDATE_FOR_UPDATE: &str = "CandidateForUpdate";
        /// The node was selected (label `selected-for-update`).
        pub const SELECTED_FOR_UPDATE: &str = "SelectedForUpdate";
        /// The node was cordoned and drained.
        pub const DRAIN_SUCCESSFUL: &str = "DrainSuccessful";
        /// The node agent may update the node.
        pub const READY_FOR_UPDATE: &str = "ReadyForUpdate";
        /// The node agent reported success.
        pub const UPDATE_SUCCESSFUL: &str = "UpdateSuccessful";
        /// The node agent reported failure.
        pub const UPDATE_FAILED: &str = "UpdateFailed";
    }
    /// Condition showing that the Node is preserved (upstream's type name).
    pub const NODE_PRESERVED: &str = "Preserved";
    /// Reason of [`NODE_PRESERVED`]: preserved automatically (`auto-preserved`).
    pub const PRESERVED_BY_MCM: &str = "Preserved by MCM.";
    /// Reason of [`NODE_PRESERVED`]: preserved by a user's annotation.
    pub const PRESERVED_BY_USER: &str = "Preserved by user.";
    /// Reason of [`NODE_PRESERVED`] `False`: preservation ended.
    pub const PRESERVATION_STOPPED: &str = "Preservation stopped.";
    /// Message prefix of [`NODE_PRESERVED`] when the Failed machine's node was drained.
    pub const PRESERVED_NODE_DRAIN_SUCCESSFUL: &str = "Preserved node drained successfully.";
    /// Message prefix of [`NODE_PRESERVED`] when the drain failed.
    pub const PRESERVED_NODE_DRAIN_UNSUCCESSFUL: &str = "Preserved node could not be drained.";
    /// The default of `--node-conditions`: types that make a machine unhealthy when `True`.
    pub const DEFAULT_UNHEALTHY: &[&str] = &[
        KERNEL_DEADLOCK,
        READONLY_FILESYSTEM,
        DISK_PRESSURE,
        NETWORK_UNAVAILABLE,
    ];
}

/// Placeholders replaced in the MachineClass user data before a VM is created.
pub mod placeholders {
    /// Replaced by the bootstrap token created for the machine.
    pub const BOOTSTRAP_TOKEN: &str = "<<BOOTSTRAP_TOKEN>>";
    /// Replaced by the machine's name.
    pub const MACHINE_NAME: &str = "<<MACHINE_NAME>>";
}

/// Reasons with which the safety controller freezes objects.
pub mod freeze_reasons {
    /// More machines than desired exist (overshooting).
    pub const OVERSHOOTING_REPLICA_COUNT: &str = "OverShootingReplicaCount";
    /// The MachineDeployment was found in an inconsistent state.
    pub const MACHINE_DEPLOYMENT_STATE_SYNC: &str = "MachineDeploymentStateSync";
    /// A MachineSet timed out.
    pub const TIMEOUT_OCCURRED: &str = "MachineSetTimeoutOccurred";
}

/// Default deletion priority of a machine (value of the machine priority annotation).
pub const DEFAULT_MACHINE_PRIORITY: &str = "3";
/// The `kind` a Machine's `spec.class.kind` names for generic machine classes.
pub const MACHINE_CLASS_KIND: &str = "MachineClass";
