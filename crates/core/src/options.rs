//! Command-line options with the names and defaults of Gardener's machine-controller.
//!
//! Go's pflag accepts `--flag=value` and `--flag value`, durations in Go syntax (`20m`,
//! `1h30m`) and booleans as `--flag`, `--flag=true` or `--flag=false`; so do these.

use std::net::IpAddr;
use std::time::Duration;

use clap::{ArgAction, Args, Parser};
use mcm_reconcilers::machine_controller::MachineControllerConfig;
use mcm_reconcilers::manager::{ManagerConfig, TimeoutAdaptation};
use mcm_reconcilers::settings::SafetySettings;
use mcm_reconcilers::settings::Settings;
use mcm_reconcilers::settings::{Defaults, split_list};

use crate::webhook::WebhookConfig;

/// Parses a Go duration flag value.
pub fn go_duration(s: &str) -> Result<Duration, String> {
    mcm_api::duration::parse_go_duration(s).map_err(|e| e.to_string())
}

/// Flags shared by both binaries: clusters, API rate, HTTP endpoint, leader election, logs.
#[derive(Debug, Clone, Args)]
pub struct CommonOptions {
    /// Filepath to the control cluster's kubeconfig where machine objects would be created.
    /// `inClusterConfig` uses the pod's service account. (Default: same as --target-kubeconfig)
    #[arg(long, default_value = "")]
    pub control_kubeconfig: String,
    /// Filepath to the target cluster's kubeconfig where node objects are expected to join.
    #[arg(long, default_value = "")]
    pub target_kubeconfig: String,
    /// Name of the namespace in the control cluster where the controller looks for machine
    /// objects, classes and secrets.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// QPS to use while talking with the Kubernetes API servers.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,
    /// Burst to use while talking with the Kubernetes API servers.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,
    /// Content type of requests sent to the API server (accepted for compatibility; JSON is
    /// always used).
    #[arg(long, default_value = "application/vnd.kubernetes.protobuf")]
    pub kube_api_content_type: String,
    /// The IP address to serve /metrics, /healthz and /readyz on.
    #[arg(long, default_value = "0.0.0.0")]
    pub address: IpAddr,
    /// Interval between starting controller managers (accepted for compatibility).
    #[arg(long, default_value = "0s", value_parser = go_duration)]
    pub controller_start_interval: Duration,
    /// The resync period of reflectors (accepted for compatibility; watches are used).
    #[arg(long, default_value = "12h0m0s", value_parser = go_duration)]
    pub min_resync_period: Duration,
    /// Enable lock contention profiling (accepted for compatibility).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub contention_profiling: bool,
    /// Start a leader election client and gain leadership before executing the main loop.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    pub leader_elect: bool,
    /// The duration that non-leader candidates will wait before forcing to acquire
    /// leadership.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// The interval between attempts by the leader to renew its lease.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// The duration clients should wait between attempts to acquire and renew leadership.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub leader_elect_retry_period: Duration,
    /// The type of resource object used for locking (only `leases` is supported).
    #[arg(long, default_value = "leases")]
    pub leader_elect_resource_lock: String,
    /// The name of the lease object (default: the binary's name).
    #[arg(long, default_value = "")]
    pub leader_elect_resource_name: String,
    /// The namespace of the lease object (default: --namespace).
    #[arg(long, default_value = "")]
    pub leader_elect_resource_namespace: String,
    /// Log verbosity (klog style: 0-2 info, 3-4 debug, 5+ trace).
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    pub verbosity: u8,
    /// Log format: `text` or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// (mcm-rs) Zone partitions: the machine controller holds the remediation of a
    /// partitioned zone's machines, the manager shows the partition on the MachineDeployments.
    #[command(flatten)]
    pub zone_partition: ZonePartitionFlags,
}

/// (mcm-rs) When a zone counts as partitioned and how long its machines are held (see
/// docs/operations.md, "Zone partitions"). Both binaries take them: the machine controller
/// holds, the manager reports the partition on the MachineDeployments.
#[derive(Debug, Clone, Args)]
pub struct ZonePartitionFlags {
    /// (mcm-rs) How long past its health timeout a machine of a partitioned zone (its Node
    /// unreachable, its VM running, the other zones healthy) is held instead of drained,
    /// deleted and replaced (0s: no hold, the Go MCM's behaviour). The MachineDeployment
    /// annotation `node.machine.sapcloud.io/zone-partition-max-hold` overrides it.
    #[arg(long, default_value = "30m", value_parser = go_duration)]
    pub machine_zone_partition_max_hold: Duration,
    /// (mcm-rs) Fewest machines of a zone whose Nodes are unreachable for a zone partition.
    #[arg(long, default_value_t = 2)]
    pub machine_zone_partition_min_unreachable: usize,
    /// (mcm-rs) Share of a zone's machines (percent) whose Nodes are unreachable for a zone
    /// partition.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub machine_zone_partition_min_unreachable_percent: u32,
    /// (mcm-rs) Share of the other zones' machines (percent) that must be healthy for a zone
    /// partition.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub machine_zone_partition_min_healthy_elsewhere_percent: u32,
}

impl ZonePartitionFlags {
    /// The rule these flags describe.
    pub fn rule(&self) -> mcm_reconcilers::settings::PartitionRule {
        mcm_reconcilers::settings::PartitionRule {
            min_unreachable: self.machine_zone_partition_min_unreachable.max(1),
            min_unreachable_percent: self.machine_zone_partition_min_unreachable_percent,
            min_healthy_elsewhere_percent: self
                .machine_zone_partition_min_healthy_elsewhere_percent,
            max_hold: self.machine_zone_partition_max_hold,
        }
    }
}

/// (mcm-rs) The validating admission webhook of a provider binary: MachineClass
/// `providerSpec` by the provider's rules and the checks CEL cannot express on Machines,
/// MachineSets and MachineDeployments (see `mcm_core::webhook`).
#[derive(Debug, Clone, Args)]
pub struct WebhookFlags {
    /// (mcm-rs) The port the validating admission webhook is served on (HTTPS, path
    /// `/validate`); 0 serves none.
    #[arg(long, default_value_t = 0)]
    pub webhook_port: u16,
    /// (mcm-rs) The IP address the webhook listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub webhook_bind_address: IpAddr,
    /// (mcm-rs) A directory with `tls.crt` and `tls.key` (e.g. cert-manager's Secret) for the
    /// webhook; without it the binary makes its own CA and certificate.
    #[arg(long, default_value = "")]
    pub webhook_cert_dir: String,
    /// (mcm-rs) The Service in front of the webhook: its DNS names go into the self-signed
    /// certificate.
    #[arg(long, default_value = "")]
    pub webhook_service_name: String,
    /// (mcm-rs) The namespace of that Service (default: --namespace).
    #[arg(long, default_value = "")]
    pub webhook_service_namespace: String,
    /// (mcm-rs) More DNS names or IP addresses for the self-signed certificate, comma
    /// separated.
    #[arg(long, default_value = "", value_delimiter = ',')]
    pub webhook_cert_hosts: Vec<String>,
    /// (mcm-rs) The ValidatingWebhookConfiguration whose webhooks get the self-signed CA as
    /// `caBundle`; the certificate is kept in the Secret `<name>-tls` of --namespace, shared
    /// by the replicas.
    #[arg(long, default_value = "")]
    pub webhook_configuration_name: String,
}

impl WebhookFlags {
    /// The webhook's configuration, or `None` when `--webhook-port` is 0.
    pub fn config(&self, namespace: &str, target_cluster: bool) -> Option<WebhookConfig> {
        if self.webhook_port == 0 {
            return None;
        }
        let service_namespace = if self.webhook_service_namespace.is_empty() {
            namespace
        } else {
            &self.webhook_service_namespace
        };
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Some(WebhookConfig {
            addr: std::net::SocketAddr::new(self.webhook_bind_address, self.webhook_port),
            cert_dir: non_empty(&self.webhook_cert_dir).map(Into::into),
            hosts: crate::webhook::certs::hosts(
                &self.webhook_service_name,
                service_namespace,
                &self.webhook_cert_hosts,
            ),
            configuration: non_empty(&self.webhook_configuration_name),
            namespace: namespace.to_string(),
            target_cluster,
        })
    }
}

/// The options of a machine-controller binary (`machine-controller-<provider>`).
#[derive(Debug, Clone, Parser)]
#[command(
    about = "Machine controller of mcm-rs: creates, watches and deletes the VMs of Machines",
    // Like Go's pflag: a repeated flag is not an error, the last value wins.
    args_override_self = true
)]
pub struct MachineControllerOptions {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonOptions,
    /// The port the HTTP endpoints run on.
    #[arg(long, default_value_t = 10259)]
    pub port: u16,
    /// The provider for cloud services (accepted for compatibility; the binary decides).
    #[arg(long, default_value = "")]
    pub cloud_provider: String,
    /// Enable profiling via web interface (accepted for compatibility; not served).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub profiling: bool,
    /// The number of machines that are allowed to sync concurrently.
    #[arg(long, default_value_t = 50)]
    pub concurrent_syncs: u16,
    /// (mcm-rs) Controllers to run in this process: `machine` (this binary's own), `manager`
    /// (MachineSet, MachineDeployment, overshooting safety) or both, comma separated. Both
    /// halves in one process replace the two containers of a Gardener MCM pod.
    #[arg(long, default_value = "machine", value_delimiter = ',', value_parser = ["machine", "manager"])]
    pub controllers: Vec<String>,
    /// Flags of the manager half (used with `--controllers=...,manager`).
    #[command(flatten)]
    pub manager: ManagerFlags,
    /// Flags of the validating admission webhook.
    #[command(flatten)]
    pub webhook: WebhookFlags,
    /// Timeout used while joining (during creation) of a machine before it is declared
    /// as failed.
    #[arg(long, default_value = "20m", value_parser = go_duration)]
    pub machine_creation_timeout: Duration,
    /// Timeout used while re-joining (in case of temporary health issues) of a machine before
    /// it is declared as failed.
    #[arg(long, default_value = "10m", value_parser = go_duration)]
    pub machine_health_timeout: Duration,
    /// Timeout used while draining a machine before deletion, beyond which pods are forcefully
    /// deleted.
    #[arg(long, default_value = "2h", value_parser = go_duration)]
    pub machine_drain_timeout: Duration,
    /// Duration for which a failed machine should be preserved if it has the appropriate
    /// preserve annotation set (`spec.machinePreserveTimeout` overrides it per machine).
    #[arg(long = "machine-preserve-timeout", default_value = "96h", value_parser = go_duration)]
    pub machine_preserve_timeout: Duration,
    /// Timeout used while in-place updating a machine (`spec.inPlaceUpdateTimeout` overrides
    /// it per machine).
    #[arg(long = "machine-inplace-update-timeout", default_value = "20m", value_parser = go_duration)]
    pub machine_inplace_update_timeout: Duration,
    /// Maximum number of times evicts would be attempted on a pod before it is forcibly
    /// deleted during draining of a machine.
    #[arg(long, default_value_t = 360)]
    pub machine_max_evict_retries: i32,
    /// Timeout used while waiting for detach of PVs while evicting/deleting pods.
    #[arg(long, default_value = "2m", value_parser = go_duration)]
    pub machine_pv_detach_timeout: Duration,
    /// Timeout used while waiting for reattach of PVs onto a different node.
    #[arg(long, default_value = "90s", value_parser = go_duration)]
    pub machine_pv_reattach_timeout: Duration,
    /// Timeout for which the API server can be down before the machine controller is frozen
    /// by the safety controller.
    #[arg(long, default_value = "30s", value_parser = go_duration)]
    pub machine_safety_apiserver_statuscheck_timeout: Duration,
    /// Time period used to poll for orphan VMs by the safety controller.
    #[arg(long, default_value = "15m", value_parser = go_duration)]
    pub machine_safety_orphan_vms_period: Duration,
    /// Time period used to poll for the API servers' health by the safety controller.
    #[arg(long, default_value = "1m", value_parser = go_duration)]
    pub machine_safety_apiserver_statuscheck_period: Duration,
    /// Comma-separated, case-sensitive node conditions which, when True, change a machine to
    /// Unknown and, after the health timeout, Failed.
    #[arg(
        long,
        default_value = "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable"
    )]
    pub node_conditions: String,
    /// (mcm-rs) Per-condition health rules, `Type=Status:duration` separated by commas
    /// (e.g. `Ready=Unknown:5m,KernelDeadlock=True:1m`): a node whose condition has had that
    /// status for that long fails its machine without waiting for the health timeout. The
    /// `health.mcm-rs.io/unhealthy-conditions` annotation of a Machine or its
    /// MachineDeployment overrides it.
    #[arg(long, default_value = "", value_parser = unhealthy_conditions)]
    pub unhealthy_conditions: UnhealthyConditions,
    /// (mcm-rs) How long a created VM may take to register its Node before its machine
    /// fails (0s: only the creation timeout applies). The
    /// `health.mcm-rs.io/node-startup-timeout` annotation overrides it.
    #[arg(long, default_value = "0s", value_parser = go_duration)]
    pub node_startup_timeout: Duration,
    /// (mcm-rs) How long a lifecycle hook annotation may hold a machine's deletion before
    /// the deletion goes on without it (0s: for as long as it is there, Cluster API's rule).
    #[arg(long, default_value = "0s", value_parser = go_duration)]
    pub machine_lifecycle_hook_timeout: Duration,
    /// Comma-separated list of groups to set the bootstrap token's "auth-extra-groups" to.
    #[arg(long, default_value = "")]
    pub bootstrap_token_auth_extra_groups: String,
    /// (mcm-rs) Retry period after the provider reported ResourceExhausted (quota, capacity).
    #[arg(long, default_value = "10m", value_parser = go_duration)]
    pub resource_exhausted_retry: Duration,
    /// (mcm-rs) Longest retry period after repeated failures of one machine.
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub machine_backoff_max: Duration,
    /// (mcm-rs) Pods evicted at the same time while draining a node.
    #[arg(long, default_value_t = 10)]
    pub machine_drain_parallelism: usize,
    /// (mcm-rs) Pause between evictions refused by a PodDisruptionBudget.
    #[arg(long, default_value = "20s", value_parser = go_duration)]
    pub machine_eviction_retry_interval: Duration,
    /// (mcm-rs) Period in which healthy machines are re-checked without a change event
    /// (the Go MCM's machine controller re-queues a healthy machine after 10 minutes).
    #[arg(long, default_value = "10m", value_parser = go_duration)]
    pub machine_resync_period: Duration,
}

/// The flags of the manager half (MachineSet, MachineDeployment, overshooting safety).
#[derive(Debug, Clone, Args)]
pub struct ManagerFlags {
    /// The number of excess machine objects permitted for any MachineSet/MachineDeployment
    /// beyond its desired replicas (+ maxSurge) before it is frozen.
    #[arg(long, default_value_t = 2)]
    pub safety_up: i32,
    /// Upper limit minus safety-down gives the lower limit below which a frozen
    /// MachineSet/MachineDeployment is unfrozen.
    #[arg(long, default_value_t = 1)]
    pub safety_down: i32,
    /// Time period used to poll for overshooting of machine objects by the safety controller.
    #[arg(long, default_value = "1m", value_parser = go_duration)]
    pub machine_safety_overshooting_period: Duration,
    /// Add the cluster-autoscaler scale-down-disabled annotation to nodes during a rollout.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = true, default_missing_value = "true")]
    pub autoscaler_scaledown_annotation_during_rollout: bool,
    /// Percent by which a MachineDeployment's effective creation timeout grows once its
    /// machines failed to join in enough replace cycles (upstream PR #1156); 0 disables the
    /// adaptation.
    #[arg(long, default_value_t = 50)]
    pub machine_creation_timeout_growth_percent: u32,
    /// Replace cycles (effective-creation-timeout windows in which a machine of the
    /// MachineDeployment failed to join) after which its effective creation timeout grows
    /// (upstream PR #1156).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub machine_replace_cycle_count_threshold: u32,
    /// (mcm-rs) Upper bound of the adapted effective creation timeout; 0s: the declared
    /// creation timeout grown 4 times by the growth percent (upstream's bound: 20m with 50 %
    /// gives 1h41m15s). Never below the declared timeout.
    #[arg(long, default_value = "0s", value_parser = go_duration)]
    pub machine_creation_timeout_max: Duration,
}

impl ManagerFlags {
    /// The manager configuration these flags describe.
    pub fn manager_config(&self, namespace: &str, concurrent_syncs: u16) -> ManagerConfig {
        ManagerConfig {
            namespace: namespace.to_string(),
            concurrent_syncs: concurrent_syncs.max(1),
            safety_up: self.safety_up,
            safety_down: self.safety_down,
            overshooting_period: self.machine_safety_overshooting_period,
            autoscaler_annotations: self.autoscaler_scaledown_annotation_during_rollout,
            creation_timeouts: TimeoutAdaptation {
                growth_percent: self.machine_creation_timeout_growth_percent,
                cycle_threshold: self.machine_replace_cycle_count_threshold,
                max: nonzero(self.machine_creation_timeout_max),
                ..TimeoutAdaptation::default()
            },
            ..ManagerConfig::default()
        }
    }
}

/// The options of `machine-controller-manager` (the provider-independent half).
#[derive(Debug, Clone, Parser)]
#[command(
    about = "Machine controller manager of mcm-rs: MachineSets and MachineDeployments",
    args_override_self = true
)]
pub struct ManagerOptions {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonOptions,
    /// The port the HTTP endpoints run on.
    #[arg(long, default_value_t = 10258)]
    pub port: u16,
    /// The provider for cloud services (accepted for compatibility).
    #[arg(long, default_value = "")]
    pub cloud_provider: String,
    /// Enable profiling via web interface (accepted for compatibility; not served).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    pub profiling: bool,
    /// The number of objects that are allowed to sync concurrently.
    #[arg(long, default_value_t = 10)]
    pub concurrent_syncs: u16,
    /// Manager flags.
    #[command(flatten)]
    pub manager: ManagerFlags,
    /// Timeout used while joining (during creation) of a machine before it is declared as
    /// failed: here the declared creation timeout of a MachineDeployment whose template
    /// sets none, from which its effective creation timeout is adapted (the machine
    /// controller's flag of the same name applies the timeout).
    #[arg(long, default_value = "20m", value_parser = go_duration)]
    pub machine_creation_timeout: Duration,
}

/// The parsed `--unhealthy-conditions`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnhealthyConditions(pub Vec<mcm_api::policy::health::ConditionRule>);

fn unhealthy_conditions(value: &str) -> Result<UnhealthyConditions, String> {
    mcm_api::policy::health::parse_rules(value)
        .map(UnhealthyConditions)
        .map_err(|e| e.to_string())
}

/// `None` for a zero duration (turned off).
fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl MachineControllerOptions {
    /// Whether `--controllers` includes `name`.
    pub fn runs(&self, name: &str) -> bool {
        self.controllers.iter().any(|c| c == name)
    }

    /// The controller configuration these flags describe.
    pub fn controller_config(&self) -> MachineControllerConfig {
        MachineControllerConfig {
            machine: Settings {
                namespace: self.common.namespace.clone(),
                defaults: Defaults {
                    creation_timeout: self.machine_creation_timeout,
                    health_timeout: self.machine_health_timeout,
                    drain_timeout: self.machine_drain_timeout,
                    max_evict_retries: self.machine_max_evict_retries,
                    bad_conditions: split_list(&self.node_conditions),
                    preserve_timeout: self.machine_preserve_timeout,
                    inplace_timeout: self.machine_inplace_update_timeout,
                    unhealthy_conditions: self.unhealthy_conditions.0.clone(),
                    node_startup_timeout: nonzero(self.node_startup_timeout),
                    hook_timeout: nonzero(self.machine_lifecycle_hook_timeout),
                    zone_partition: self.common.zone_partition.rule(),
                },
                pv_detach_timeout: self.machine_pv_detach_timeout,
                pv_reattach_timeout: self.machine_pv_reattach_timeout,
                bootstrap_token_auth_extra_groups: self.bootstrap_token_auth_extra_groups.clone(),
                resource_exhausted_retry: self.resource_exhausted_retry,
                backoff_initial: Duration::from_secs(5).min(self.machine_backoff_max),
                backoff_max: self.machine_backoff_max,
                eviction_retry_interval: self.machine_eviction_retry_interval,
                drain_parallelism: self.machine_drain_parallelism.max(1),
                resync: self.machine_resync_period,
                target_cluster: self.common.target_kubeconfig != crate::clients::NONE,
            },
            safety: SafetySettings {
                orphan_vms_period: self.machine_safety_orphan_vms_period,
                apiserver_statuscheck_period: self.machine_safety_apiserver_statuscheck_period,
                apiserver_statuscheck_timeout: self.machine_safety_apiserver_statuscheck_timeout,
            },
            concurrent_syncs: self.concurrent_syncs.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_gardener_machine_controller() {
        let o = MachineControllerOptions::parse_from(["mc"]);
        assert_eq!(o.port, 10259);
        assert_eq!(o.common.namespace, "default");
        assert_eq!(o.concurrent_syncs, 50);
        assert_eq!(o.machine_creation_timeout, Duration::from_secs(20 * 60));
        assert_eq!(o.machine_health_timeout, Duration::from_secs(10 * 60));
        assert_eq!(o.machine_drain_timeout, Duration::from_secs(2 * 3600));
        assert_eq!(o.machine_preserve_timeout, Duration::from_secs(96 * 3600));
        assert_eq!(
            o.machine_inplace_update_timeout,
            Duration::from_secs(20 * 60)
        );
        assert_eq!(o.resource_exhausted_retry, Duration::from_secs(10 * 60));
        // A healthy machine is re-checked as often as upstream re-queues it (LongRetry).
        assert_eq!(o.machine_resync_period, Duration::from_secs(10 * 60));
        assert!(!o.profiling, "upstream's default since 2025");
        assert_eq!(o.machine_pv_detach_timeout, Duration::from_secs(120));
        assert_eq!(o.machine_pv_reattach_timeout, Duration::from_secs(90));
        assert_eq!(
            o.machine_safety_orphan_vms_period,
            Duration::from_secs(15 * 60)
        );
        assert_eq!(
            o.machine_safety_apiserver_statuscheck_period,
            Duration::from_secs(60)
        );
        assert_eq!(
            o.machine_safety_apiserver_statuscheck_timeout,
            Duration::from_secs(30)
        );
        assert_eq!(o.common.kube_api_qps, 20.0);
        assert_eq!(o.common.kube_api_burst, 30);
        assert!(o.common.leader_elect);
        assert_eq!(
            o.node_conditions,
            "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable"
        );
    }

    #[test]
    fn go_style_values_parse() {
        let o = MachineControllerOptions::parse_from([
            "mc",
            "--control-kubeconfig=inClusterConfig",
            "--target-kubeconfig",
            "/var/run/kubeconfig",
            "--machine-drain-timeout=1h30m",
            "--leader-elect=false",
            "--v=3",
            "--namespace=shoot--a--b",
        ]);
        assert_eq!(o.common.control_kubeconfig, "inClusterConfig");
        assert_eq!(o.common.target_kubeconfig, "/var/run/kubeconfig");
        assert_eq!(o.machine_drain_timeout, Duration::from_secs(5400));
        assert!(!o.common.leader_elect);
        assert_eq!(o.common.verbosity, 3);
        let cfg = o.controller_config();
        assert_eq!(cfg.machine.namespace, "shoot--a--b");
        assert_eq!(cfg.machine.defaults.bad_conditions.len(), 4);
    }

    #[test]
    fn manager_defaults_match_gardener_machine_controller_manager() {
        let o = ManagerOptions::parse_from(["mcm"]);
        assert_eq!(o.port, 10258);
        assert_eq!(o.concurrent_syncs, 10);
        assert!(!o.profiling);
        assert_eq!(o.manager.safety_up, 2);
        assert_eq!(o.manager.safety_down, 1);
        assert_eq!(
            o.manager.machine_safety_overshooting_period,
            Duration::from_secs(60)
        );
        assert!(o.manager.autoscaler_scaledown_annotation_during_rollout);
        let c = o.manager.manager_config("ns", o.concurrent_syncs);
        assert_eq!(c.namespace, "ns");
        assert!(c.autoscaler_annotations);
    }

    #[test]
    fn the_creation_timeout_adaptation_flags() {
        let o = ManagerOptions::parse_from(["mcm"]);
        assert_eq!(o.machine_creation_timeout, Duration::from_secs(20 * 60));
        let c = o.manager.manager_config("ns", 1).creation_timeouts;
        assert_eq!((c.growth_percent, c.cycle_threshold, c.max), (50, 2, None));
        let o = ManagerOptions::parse_from([
            "mcm",
            "--machine-creation-timeout=30m",
            "--machine-creation-timeout-growth-percent=0",
            "--machine-replace-cycle-count-threshold=1",
            "--machine-creation-timeout-max=2h",
        ]);
        assert_eq!(o.machine_creation_timeout, Duration::from_secs(30 * 60));
        let c = o.manager.manager_config("ns", 1).creation_timeouts;
        assert_eq!(
            (c.growth_percent, c.cycle_threshold, c.max),
            (0, 1, Some(Duration::from_secs(7200)))
        );
        assert!(
            ManagerOptions::try_parse_from(["mcm", "--machine-replace-cycle-count-threshold=0"])
                .is_err()
        );
        // Both halves in one process: the machine controller's flag, the manager's flags.
        let o = MachineControllerOptions::parse_from([
            "mc",
            "--controllers=machine,manager",
            "--machine-creation-timeout-growth-percent=25",
        ]);
        assert_eq!(o.manager.machine_creation_timeout_growth_percent, 25);
    }

    #[test]
    fn both_halves_are_a_flag_away() {
        let o = MachineControllerOptions::parse_from(["mc"]);
        assert!(o.runs("machine") && !o.runs("manager"));
        let o = MachineControllerOptions::parse_from(["mc", "--controllers=machine,manager"]);
        assert!(o.runs("machine") && o.runs("manager"));
        assert!(MachineControllerOptions::try_parse_from(["mc", "--controllers=bogus"]).is_err());
    }

    #[test]
    fn the_webhook_is_off_by_default_and_names_its_service() {
        let o = MachineControllerOptions::parse_from(["mc", "--namespace=machines"]);
        assert!(o.webhook.config("machines", true).is_none());
        let o = MachineControllerOptions::parse_from([
            "mc",
            "--webhook-port=9443",
            "--webhook-service-name=mcm-webhook",
            "--webhook-cert-hosts=127.0.0.1,localhost",
            "--webhook-configuration-name=mcm",
        ]);
        let c = o.webhook.config("machines", true).unwrap();
        assert_eq!(c.addr.port(), 9443);
        assert_eq!(c.hosts[2], "mcm-webhook.machines.svc");
        assert_eq!(&c.hosts[4..], ["127.0.0.1", "localhost"]);
        assert_eq!(c.configuration.as_deref(), Some("mcm"));
        assert!(c.cert_dir.is_none());
    }

    #[test]
    fn a_repeated_flag_takes_the_last_value_like_pflag() {
        let o = MachineControllerOptions::parse_from([
            "mc",
            "--machine-health-timeout=10m",
            "--machine-health-timeout=5s",
        ]);
        assert_eq!(o.machine_health_timeout, Duration::from_secs(5));
    }

    #[test]
    fn bad_durations_are_rejected_with_the_flag_named() {
        let err = MachineControllerOptions::try_parse_from(["mc", "--machine-health-timeout=ten"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--machine-health-timeout"), "{err}");
    }
}
