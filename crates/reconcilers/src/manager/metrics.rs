//! MCM's `mcm_machine_set_*` and `mcm_machine_deployment_*` metrics, read from the stores at
//! scrape time.

use std::borrow::Cow;

use kube::runtime::reflector::Store;
use mcm_api::{ConditionStatus, MachineDeployment, MachineSet, MachineSummary};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Collects MCM's MachineSet and MachineDeployment metrics from the stores at scrape time.
#[derive(Clone)]
pub struct StoreMetrics {
    /// The MachineSets.
    pub sets: Store<MachineSet>,
    /// The MachineDeployments.
    pub deployments: Store<MachineDeployment>,
    /// `--machine-creation-timeout`: the creation timeout of a deployment that declares
    /// none and has no effective one.
    pub default_creation_timeout: std::time::Duration,
}

impl std::fmt::Debug for StoreMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreMetrics").finish_non_exhaustive()
    }
}

type Labels = Vec<(Cow<'static, str>, String)>;

fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, i64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if let [(labels, value)] = samples
        && labels.is_empty()
    {
        return ConstGauge::new(*value).encode(metric);
    }
    for (labels, value) in samples {
        let family = metric.encode_family(labels)?;
        ConstGauge::new(*value).encode(family)?;
    }
    Ok(())
}

fn base_labels<K: kube::Resource>(obj: &K) -> Labels {
    let meta = obj.meta();
    vec![
        ("name".into(), meta.name.clone().unwrap_or_default()),
        (
            "namespace".into(),
            meta.namespace.clone().unwrap_or_default(),
        ),
        ("uid".into(), meta.uid.clone().unwrap_or_default()),
    ]
}

fn created<K: kube::Resource>(obj: &K) -> String {
    obj.meta()
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second().to_string())
        .unwrap_or_default()
}

fn failed_samples<K: kube::Resource>(
    obj: &K,
    failed: Option<&Vec<MachineSummary>>,
) -> Vec<(Labels, i64)> {
    failed
        .into_iter()
        .flatten()
        .map(|f| {
            let mut l = base_labels(obj);
            let op = f.last_operation.as_ref();
            l.push((
                "failed_machine_name".into(),
                f.name.clone().unwrap_or_default(),
            ));
            l.push((
                "failed_machine_provider_id".into(),
                f.provider_id.clone().unwrap_or_default(),
            ));
            l.push((
                "failed_machine_owner_ref".into(),
                f.owner_ref.clone().unwrap_or_default(),
            ));
            l.push((
                "failed_machine_last_operation_state".into(),
                op.and_then(|o| o.state.as_ref())
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ));
            l.push((
                "failed_machine_last_operation_machine_operation_type".into(),
                op.and_then(|o| o.type_.as_ref())
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ));
            (l, 1)
        })
        .collect()
}

/// One sample per condition of `obj`: 1 when it is True.
fn condition_samples<'a, K: kube::Resource>(
    obj: &K,
    conditions: impl Iterator<Item = (String, &'a ConditionStatus)>,
) -> Vec<(Labels, i64)> {
    conditions
        .map(|(type_, status)| {
            let mut l = base_labels(obj);
            l.push(("condition".into(), type_));
            (l, i64::from(matches!(status, ConditionStatus::True)))
        })
        .collect()
}

/// A gauge with one sample per object.
type PerObject<K> = (&'static str, &'static str, fn(&K) -> i64);

/// MCM's metric families of one kind.
struct KindMetrics<K: 'static> {
    /// `..._items_total`: the number of objects.
    items: (&'static str, &'static str),
    /// `..._info`: 1 per object, labelled with its creation time and `info_labels`.
    info: (&'static str, &'static str),
    info_labels: fn(&K) -> Labels,
    gauges: &'static [PerObject<K>],
    /// `..._status_condition`: 1 per True condition, 0 per other.
    conditions: (&'static str, &'static str),
    /// `..._failed_machines`: 1 per failed machine summary.
    failed: (&'static str, &'static str),
}

/// The status parts of sets and deployments that MCM's metrics report.
trait StatusMetrics {
    /// `(type, status)` of each condition.
    fn condition_list(&self) -> Vec<(String, ConditionStatus)>;
    /// The failed machines.
    fn failed_list(&self) -> Option<&Vec<MachineSummary>>;
}

macro_rules! status_metrics {
    ($($kind:ty),*) => {$(
        impl StatusMetrics for $kind {
            fn condition_list(&self) -> Vec<(String, ConditionStatus)> {
                let all = self.status.iter().flat_map(|st| st.conditions.iter().flatten());
                all.map(|c| (c.type_.to_string(), c.status.clone())).collect()
            }
            fn failed_list(&self) -> Option<&Vec<MachineSummary>> {
                self.status.as_ref().and_then(|st| st.failed_machines.as_ref())
            }
        }
    )*};
}
status_metrics!(MachineSet, MachineDeployment);

impl<K: kube::Resource + StatusMetrics> KindMetrics<K> {
    fn encode(
        &self,
        encoder: &mut DescriptorEncoder,
        objs: &[std::sync::Arc<K>],
    ) -> Result<(), std::fmt::Error> {
        let count = i64::try_from(objs.len()).unwrap_or(i64::MAX);
        gauge_family(encoder, self.items.0, self.items.1, &[(Vec::new(), count)])?;
        let info: Vec<(Labels, i64)> = objs
            .iter()
            .map(|o| {
                let mut l = base_labels(o.as_ref());
                l.push(("created".into(), created(o.as_ref())));
                l.extend((self.info_labels)(o));
                (l, 1)
            })
            .collect();
        gauge_family(encoder, self.info.0, self.info.1, &info)?;
        for (name, help, value) in self.gauges {
            let samples: Vec<(Labels, i64)> = objs
                .iter()
                .map(|o| (base_labels(o.as_ref()), value(o)))
                .collect();
            gauge_family(encoder, name, help, &samples)?;
        }
        let conditions: Vec<(Labels, i64)> = objs
            .iter()
            .flat_map(|o| {
                let list = o.condition_list();
                condition_samples(o.as_ref(), list.iter().map(|(t, s)| (t.clone(), s)))
            })
            .collect();
        gauge_family(encoder, self.conditions.0, self.conditions.1, &conditions)?;
        let failed: Vec<(Labels, i64)> = objs
            .iter()
            .flat_map(|o| failed_samples(o.as_ref(), o.failed_list()))
            .collect();
        gauge_family(encoder, self.failed.0, self.failed.1, &failed)
    }
}

fn set_status(s: &MachineSet) -> mcm_api::MachineSetStatus {
    s.status.clone().unwrap_or_default()
}

fn deployment_status(d: &MachineDeployment) -> mcm_api::MachineDeploymentStatus {
    d.status.clone().unwrap_or_default()
}

/// maxSurge or maxUnavailable as written (unset: 0), resolved for the deployment's replicas.
fn limit(d: &MachineDeployment, surge: bool) -> i64 {
    let (max_surge, max_unavailable) = d.rolling_update_limits();
    let v = if surge { max_surge } else { max_unavailable };
    v.and_then(|v| mcm_api::intstr::scaled_value(v, d.spec.replicas(), surge).ok())
        .map_or(0, i64::from)
}

fn label(name: &'static str, value: Option<String>) -> (Cow<'static, str>, String) {
    (name.into(), value.unwrap_or_default())
}

const SETS: KindMetrics<MachineSet> = KindMetrics {
    items: (
        "mcm_machineset_items_total",
        "Count of machinesets currently managed by the mcm.",
    ),
    info: (
        "mcm_machine_set_info",
        "Information of the Machinesets currently managed by the mcm.",
    ),
    info_labels: |s| {
        let class = s.template_class();
        vec![
            label(
                "spec_machine_class_api_group",
                class.and_then(|c| c.api_group.clone()),
            ),
            label(
                "spec_machine_class_kind",
                class.and_then(|c| c.kind.clone()),
            ),
            label(
                "spec_machine_class_name",
                class.and_then(|c| c.name.clone()),
            ),
        ]
    },
    gauges: &[
        (
            "mcm_machine_set_info_spec_replicas",
            "Count of the Machinesets' spec replicas.",
            |s| i64::from(s.spec.replicas()),
        ),
        (
            "mcm_machine_set_info_spec_min_ready_seconds",
            "Information of the Machinesets currently managed by the mcm.",
            |s| i64::from(s.spec.min_ready_seconds.unwrap_or(0)),
        ),
        // The misspelt name is MCM's.
        (
            "mcm_machine_set_status_availabla_replicas",
            "Information of the mcm managed Machinesets' status for available replicas.",
            |s| i64::from(set_status(s).available_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_set_status_fully_labelled_replicas",
            "Information of the mcm managed Machinesets' status for fully labelled replicas.",
            |s| i64::from(set_status(s).fully_labeled_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_set_status_ready_replicas",
            "Information of the mcm managed Machinesets' status for ready replicas.",
            |s| i64::from(set_status(s).ready_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_set_status_replicas",
            "Information of the mcm managed Machinesets' status for replicas.",
            |s| i64::from(set_status(s).replicas.unwrap_or(0)),
        ),
    ],
    conditions: (
        "mcm_machine_set_status_condition",
        "Information of the mcm managed Machinesets' status conditions.",
    ),
    failed: (
        "mcm_machine_set_failed_machines",
        "Information of the mcm managed Machinesets' failed machines.",
    ),
};

const DEPLOYMENTS: KindMetrics<MachineDeployment> = KindMetrics {
    items: (
        "mcm_machinedeployment_items_total",
        "Count of machinedeployments currently managed by the mcm.",
    ),
    info: (
        "mcm_machine_deployment_info",
        "Information of the Machinedeployments currently managed by the mcm.",
    ),
    info_labels: |d| {
        let strategy = d.spec.strategy.as_ref().and_then(|s| s.type_.as_ref());
        vec![label("spec_strategy_type", strategy.map(|t| t.to_string()))]
    },
    gauges: &[
        (
            "mcm_machine_deployment_info_spec_paused",
            "Information of the Machinedeployments paused status.",
            |d| i64::from(d.spec.paused.unwrap_or(false)),
        ),
        (
            "mcm_machine_deployment_info_spec_replicas",
            "Information of the Machinedeployments spec replicas.",
            |d| i64::from(d.spec.replicas()),
        ),
        (
            "mcm_machine_deployment_info_spec_min_ready_seconds",
            "Information of the Machinedeployments spec min ready seconds.",
            |d| i64::from(d.spec.min_ready_seconds.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_info_spec_rolling_update_max_surge",
            "Information of the Machinedeployments spec rolling update max surge.",
            |d| limit(d, true),
        ),
        (
            "mcm_machine_deployment_info_spec_rolling_update_max_unavailable",
            "Information of the Machinedeployments spec rolling update max unavailable.",
            |d| limit(d, false),
        ),
        (
            "mcm_machine_deployment_info_spec_revision_history_limit",
            "Information of the Machinedeployments spec revision history limit.",
            |d| i64::from(d.spec.revision_history_limit.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_info_spec_rollback_to_revision",
            "Information of the Machinedeployments spec rollback to revision.",
            |d| {
                d.spec
                    .rollback_to
                    .as_ref()
                    .and_then(|r| r.revision)
                    .unwrap_or(0)
            },
        ),
        (
            "mcm_machine_deployment_info_spec_progress_deadline_seconds",
            "Information of the Machinedeployments spec deadline seconds.",
            |d| i64::from(d.spec.progress_deadline_seconds.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_status_available_replicas",
            "Count of the mcm managed Machinedeployments available replicas.",
            |d| i64::from(deployment_status(d).available_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_status_unavailable_replicas",
            "Count of the mcm managed Machinedeployments unavailable replicas.",
            |d| i64::from(deployment_status(d).unavailable_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_status_ready_replicas",
            "Count of the mcm managed Machinedeployments ready replicas.",
            |d| i64::from(deployment_status(d).ready_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_status_updated_replicas",
            "Count of the mcm managed Machinedeployments updated replicas.",
            |d| i64::from(deployment_status(d).updated_replicas.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_status_collision_count",
            "Mcm managed Machinedeployments collision count.",
            |d| i64::from(deployment_status(d).collision_count.unwrap_or(0)),
        ),
        (
            "mcm_machine_deployment_status_replicas",
            "Count of the mcm managed Machinedeployments replicas.",
            |d| i64::from(deployment_status(d).replicas.unwrap_or(0)),
        ),
    ],
    conditions: (
        "mcm_machine_deployment_status_condition",
        "Information of the mcm managed Machinedeployments' status conditions.",
    ),
    failed: (
        "mcm_machine_deployment_failed_machines",
        "Information of the mcm managed Machinedeployments' failed machines.",
    ),
};

/// The gauge of each deployment's effective creation timeout (mcm-rs): the annotation
/// `effective-creation-timeout` when it is a duration, else the declared timeout (the
/// template's `creationTimeout`, else `default`), in whole seconds.
const EFFECTIVE_CREATION_TIMEOUT: (&str, &str) = (
    "mcm_machine_deployment_effective_creation_timeout_seconds",
    "The creation timeout the Machinedeployments' new machines get (effective-creation-timeout, else the declared one).",
);

fn effective_creation_timeouts(
    deployments: &[std::sync::Arc<MachineDeployment>],
    default: std::time::Duration,
) -> Vec<(Labels, i64)> {
    use crate::machinedeployment::creation_timeout::effective_timeout;
    deployments
        .iter()
        .map(|d| {
            let secs = effective_timeout(d, default).as_secs();
            (
                base_labels(d.as_ref()),
                i64::try_from(secs).unwrap_or(i64::MAX),
            )
        })
        .collect()
}

impl Collector for StoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        SETS.encode(&mut encoder, &self.sets.state())?;
        let deployments = self.deployments.state();
        DEPLOYMENTS.encode(&mut encoder, &deployments)?;
        let (name, help) = EFFECTIVE_CREATION_TIMEOUT;
        let samples = effective_creation_timeouts(&deployments, self.default_creation_timeout);
        gauge_family(&mut encoder, name, help, &samples)
    }
}
