//! The metrics of the machine controller.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::ReconcileMetrics;

/// Metrics of the machine controller.
#[derive(Clone, Default)]
pub struct MachineMetrics {
    created: Counter,
    adopted: Counter,
    failed: Counter,
    deleted: Counter,
    drain_blocked: Counter,
    hook_waits: Counter,
    remediation_held: Counter,
    /// `mcm_machine_zone_partition_held_machines{zone}`: machines held by a zone partition.
    partition_held: Family<ZoneLabel, Gauge>,
    /// `mcm_machine_controller_frozen`: 1 while the safety controller froze the controller.
    pub frozen: Gauge,
    /// `mcm_machine_items_total`: Machines in the namespace.
    pub items: Gauge,
    /// `mcm_machine_controller_apiservers_reachable_timestamp_seconds`: when (Unix time,
    /// seconds) the last API-server status check that reached every API server finished (0
    /// before the first). Only such a check ends an outage: the freeze's timeout counts from
    /// the first failed check after it.
    pub apiservers_reachable_at: Seconds,
    /// `mcm_machine_controller_tracked_entries`: entries of the records this process keeps
    /// per Machine between reconciles (backoff, its own last write, announcements).
    pub tracked: Gauge,
    /// Reconcile metrics of every controller of the process (`controller="machine"` here).
    pub reconciles: ReconcileMetrics,
    durations: Durations,
}

/// The labels of upstream's per-machine duration metrics. Upstream leaves out
/// `instance_type` and `zone` when the class has no node template (and its client then
/// panics); they are empty here instead.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PlacementLabels {
    /// The Machine's namespace.
    pub namespace: String,
    /// Its MachineDeployment (the Machine's `name` label).
    pub machine_deployment: String,
    /// The class's `nodeTemplate.instanceType`.
    pub instance_type: String,
    /// The Machine's `topology.kubernetes.io/zone` node-template label.
    pub zone: String,
}

/// The label of the zone-partition gauge.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ZoneLabel {
    /// The partitioned zone.
    pub zone: String,
}

/// The labels of the drain duration.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DeploymentLabels {
    /// The Machine's namespace.
    pub namespace: String,
    /// Its MachineDeployment.
    pub machine_deployment: String,
}

type Seconds = Gauge<f64, AtomicU64>;

/// Upstream's `mcm_machine_*_duration_seconds` gauges (the last machine's duration per
/// deployment, rounded to seconds) and the failed-join count.
#[derive(Clone, Default)]
struct Durations {
    create: Family<PlacementLabels, Seconds>,
    initialize: Family<PlacementLabels, Seconds>,
    join: Family<PlacementLabels, Seconds>,
    delete: Family<PlacementLabels, Seconds>,
    drain: Family<DeploymentLabels, Seconds>,
    failed_join: Family<PlacementLabels, Seconds>,
}

/// A machine step whose duration upstream reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timed {
    /// From the Machine's creation to its VM's creation.
    Create,
    /// `initialize_machine`.
    Initialize,
    /// From the Machine's creation to its Node joining.
    Join,
    /// From the deletion request to the VM's deletion.
    Delete,
}

impl std::fmt::Debug for MachineMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineMetrics").finish_non_exhaustive()
    }
}

impl MachineMetrics {
    /// Creates and registers the metrics; reconciles are recorded in `reconciles` (registered
    /// once per process, see [`ReconcileMetrics::register`]).
    pub fn register(registry: &mut Registry, reconciles: ReconcileMetrics) -> Self {
        let m = MachineMetrics {
            reconciles,
            ..MachineMetrics::default()
        };
        let gauges = [
            (
                "mcm_machine_controller_frozen",
                "1 when the machine controller is frozen by the safety controller",
                &m.frozen,
            ),
            ("mcm_machine_items_total", "Number of Machines", &m.items),
            (
                "mcm_machine_controller_tracked_entries",
                "Entries of the records the machine controller keeps per Machine between \
                 reconciles (backoff, its own last write, announcements); a deleted Machine's \
                 are forgotten",
                &m.tracked,
            ),
        ];
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.clone());
        }
        registry.register(
            "mcm_machine_controller_apiservers_reachable_timestamp_seconds",
            "Unix time of the last API-server status check that reached every API server of \
             the machine controller (an outage, as the freeze counts it, starts after it)",
            m.apiservers_reachable_at.clone(),
        );
        let counters = [
            ("mcm_machine_vm_creations", "VMs created", &m.created),
            (
                "mcm_machine_vm_adoptions",
                "Existing VMs adopted",
                &m.adopted,
            ),
            ("mcm_machine_failed", "Machines marked Failed", &m.failed),
            ("mcm_machine_deletions", "Machines deleted", &m.deleted),
            (
                "mcm_machine_drain_blocked_by_pdb",
                "Drain passes that ended with an eviction refused by a PodDisruptionBudget",
                &m.drain_blocked,
            ),
            (
                "mcm_machine_lifecycle_hook_waits",
                "Deletions that began waiting for the lifecycle hooks of a stage",
                &m.hook_waits,
            ),
            (
                "mcm_machine_remediation_held",
                "Machines not marked Failed because their deployment's remediation budget was used up or short-circuited",
                &m.remediation_held,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        let d = &m.durations;
        let placement = [
            (
                "mcm_machine_create_duration_seconds",
                "Duration in seconds to create a Machine of a MachineDeployment.",
                &d.create,
            ),
            (
                "mcm_machine_initialize_duration_seconds",
                "Duration in seconds to initialize a Machine of a MachineDeployment.",
                &d.initialize,
            ),
            (
                "mcm_machine_join_duration_seconds",
                "Duration in seconds for a Machine of a MachineDeployment to join the cluster",
                &d.join,
            ),
            (
                "mcm_machine_delete_duration_seconds",
                "Duration in seconds to delete a Machine of a MachineDeployment.",
                &d.delete,
            ),
            // A counter upstream; prometheus-client would append `_total` to a counter, so
            // it is a gauge that only goes up, under upstream's exact name.
            (
                "mcm_machine_num_failed_join",
                "Number of Machines of a MachineDeployment that failed to join the cluster.",
                &d.failed_join,
            ),
        ];
        for (name, help, family) in placement {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "mcm_machine_zone_partition_held_machines",
            "Machines past their health timeout held instead of remediated because their zone \
             is partitioned (their Nodes unreachable, their VMs running, the other zones healthy)",
            m.partition_held.clone(),
        );
        registry.register(
            "mcm_machine_drain_duration_seconds",
            "Duration in seconds to drain a Machine of a MachineDeployment.",
            d.drain.clone(),
        );
        m
    }

    /// Records how long `step` took for a machine of these labels (upstream keeps the last
    /// value, rounded to seconds, and nothing for a zero duration).
    pub(crate) fn timed(&self, step: Timed, labels: &PlacementLabels, took: Duration) {
        let family = match step {
            Timed::Create => &self.durations.create,
            Timed::Initialize => &self.durations.initialize,
            Timed::Join => &self.durations.join,
            Timed::Delete => &self.durations.delete,
        };
        if !took.is_zero() {
            family.get_or_create(labels).set(took.as_secs_f64().round());
        }
    }

    /// Records a drain's duration.
    pub(crate) fn drained(&self, labels: &DeploymentLabels, took: Duration) {
        if !took.is_zero() {
            self.durations
                .drain
                .get_or_create(labels)
                .set(took.as_secs_f64().round());
        }
    }

    /// Sets the machines held by a zone partition, by zone (zones without one disappear).
    pub(crate) fn partition_holds<'a>(&self, zones: impl IntoIterator<Item = &'a String>) {
        let mut counts = std::collections::BTreeMap::<&str, i64>::new();
        for z in zones {
            *counts.entry(z).or_default() += 1;
        }
        self.partition_held.clear();
        for (zone, n) in counts {
            self.partition_held
                .get_or_create(&ZoneLabel { zone: zone.into() })
                .set(n);
        }
    }

    /// Counts a machine that did not join within its creation timeout.
    pub(crate) fn failed_join(&self, labels: &PlacementLabels) {
        self.durations.failed_join.get_or_create(labels).inc();
    }

    pub(crate) fn created(&self, adopted: bool) {
        if adopted {
            self.adopted.inc();
        } else {
            self.created.inc();
        }
    }

    pub(crate) fn failed(&self) {
        self.failed.inc();
    }

    pub(crate) fn deleted(&self) {
        self.deleted.inc();
    }

    /// Counts a deletion that began waiting for the hooks of `stage`.
    pub(crate) fn hook_wait(&self) {
        self.hook_waits.inc();
    }

    /// Counts a machine whose failure the remediation budget or short-circuit held.
    pub(crate) fn remediation_held(&self) {
        self.remediation_held.inc();
    }

    /// Counts a drain pass that a PodDisruptionBudget held up.
    pub(crate) fn drain_blocked(&self) {
        self.drain_blocked.inc();
    }
}
