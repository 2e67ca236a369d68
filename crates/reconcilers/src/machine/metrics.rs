//! The metrics of the machine controller.

use prometheus_client::metrics::counter::Counter;
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
    /// `mcm_machine_controller_frozen`: 1 while the safety controller froze the controller.
    pub frozen: Gauge,
    /// `mcm_machine_items_total`: Machines in the namespace.
    pub items: Gauge,
    /// Reconcile metrics of every controller of the process (`controller="machine"` here).
    pub reconciles: ReconcileMetrics,
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
        ];
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.clone());
        }
        let counters = [
            ("mcm_machine_vm_creations", "VMs created", &m.created),
            (
                "mcm_machine_vm_adoptions",
                "Existing VMs adopted",
                &m.adopted,
            ),
            ("mcm_machine_failed", "Machines marked Failed", &m.failed),
            ("mcm_machine_deletions", "Machines deleted", &m.deleted),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        m
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
}
