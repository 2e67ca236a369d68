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

impl Collector for StoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sets = self.sets.state();
        let per_set = |f: &dyn Fn(&MachineSet) -> i64| -> Vec<(Labels, i64)> {
            sets.iter()
                .map(|s| (base_labels(s.as_ref()), f(s)))
                .collect()
        };
        gauge_family(
            &mut encoder,
            "mcm_machineset_items_total",
            "Count of machinesets currently managed by the mcm.",
            &[(Vec::new(), i64::try_from(sets.len()).unwrap_or(i64::MAX))],
        )?;
        let info: Vec<(Labels, i64)> = sets
            .iter()
            .map(|s| {
                let class = s
                    .spec
                    .template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .and_then(|sp| sp.class.as_ref());
                let mut l = base_labels(s.as_ref());
                l.push(("created".into(), created(s.as_ref())));
                l.push((
                    "spec_machine_class_api_group".into(),
                    class.and_then(|c| c.api_group.clone()).unwrap_or_default(),
                ));
                l.push((
                    "spec_machine_class_kind".into(),
                    class.and_then(|c| c.kind.clone()).unwrap_or_default(),
                ));
                l.push((
                    "spec_machine_class_name".into(),
                    class.and_then(|c| c.name.clone()).unwrap_or_default(),
                ));
                (l, 1)
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_info",
            "Information of the Machinesets currently managed by the mcm.",
            &info,
        )?;
        let status = |s: &MachineSet| s.status.clone().unwrap_or_default();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_info_spec_replicas",
            "Count of the Machinesets' spec replicas.",
            &per_set(&|s| i64::from(s.spec.replicas())),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_info_spec_min_ready_seconds",
            "Information of the Machinesets currently managed by the mcm.",
            &per_set(&|s| i64::from(s.spec.min_ready_seconds.unwrap_or(0))),
        )?;
        // The misspelt name is MCM's.
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_availabla_replicas",
            "Information of the mcm managed Machinesets' status for available replicas.",
            &per_set(&|s| i64::from(status(s).available_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_fully_labelled_replicas",
            "Information of the mcm managed Machinesets' status for fully labelled replicas.",
            &per_set(&|s| i64::from(status(s).fully_labeled_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_ready_replicas",
            "Information of the mcm managed Machinesets' status for ready replicas.",
            &per_set(&|s| i64::from(status(s).ready_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_replicas",
            "Information of the mcm managed Machinesets' status for replicas.",
            &per_set(&|s| i64::from(status(s).replicas.unwrap_or(0))),
        )?;
        let conditions: Vec<(Labels, i64)> = sets
            .iter()
            .flat_map(|s| {
                let conditions = s
                    .status
                    .iter()
                    .flat_map(|st| st.conditions.iter().flatten());
                condition_samples(
                    s.as_ref(),
                    conditions.map(|c| (c.type_.to_string(), &c.status)),
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_status_condition",
            "Information of the mcm managed Machinesets' status conditions.",
            &conditions,
        )?;
        let failed: Vec<(Labels, i64)> = sets
            .iter()
            .flat_map(|s| {
                failed_samples(
                    s.as_ref(),
                    s.status.as_ref().and_then(|st| st.failed_machines.as_ref()),
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_set_failed_machines",
            "Information of the mcm managed Machinesets' failed machines.",
            &failed,
        )?;

        let ds = self.deployments.state();
        let per_d = |f: &dyn Fn(&MachineDeployment) -> i64| -> Vec<(Labels, i64)> {
            ds.iter().map(|d| (base_labels(d.as_ref()), f(d))).collect()
        };
        gauge_family(
            &mut encoder,
            "mcm_machinedeployment_items_total",
            "Count of machinedeployments currently managed by the mcm.",
            &[(Vec::new(), i64::try_from(ds.len()).unwrap_or(i64::MAX))],
        )?;
        let info: Vec<(Labels, i64)> = ds
            .iter()
            .map(|d| {
                let mut l = base_labels(d.as_ref());
                l.push(("created".into(), created(d.as_ref())));
                l.push((
                    "spec_strategy_type".into(),
                    d.spec
                        .strategy
                        .as_ref()
                        .and_then(|s| s.type_.as_ref())
                        .map(|t| t.to_string())
                        .unwrap_or_default(),
                ));
                (l, 1)
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info",
            "Information of the Machinedeployments currently managed by the mcm.",
            &info,
        )?;
        let dstatus = |d: &MachineDeployment| d.status.clone().unwrap_or_default();
        // As written (unset: 0), resolved for the deployment's replicas.
        let limit = |d: &MachineDeployment, surge: bool| -> i64 {
            let (max_surge, max_unavailable) = d.rolling_update_limits();
            let v = if surge { max_surge } else { max_unavailable };
            v.and_then(|v| mcm_api::intstr::scaled_value(v, d.spec.replicas(), surge).ok())
                .map_or(0, i64::from)
        };
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_paused",
            "Information of the Machinedeployments paused status.",
            &per_d(&|d| i64::from(d.spec.paused.unwrap_or(false))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_replicas",
            "Information of the Machinedeployments spec replicas.",
            &per_d(&|d| i64::from(d.spec.replicas())),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_min_ready_seconds",
            "Information of the Machinedeployments spec min ready seconds.",
            &per_d(&|d| i64::from(d.spec.min_ready_seconds.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_rolling_update_max_surge",
            "Information of the Machinedeployments spec rolling update max surge.",
            &per_d(&|d| limit(d, true)),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_rolling_update_max_unavailable",
            "Information of the Machinedeployments spec rolling update max unavailable.",
            &per_d(&|d| limit(d, false)),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_revision_history_limit",
            "Information of the Machinedeployments spec revision history limit.",
            &per_d(&|d| i64::from(d.spec.revision_history_limit.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_info_spec_progress_deadline_seconds",
            "Information of the Machinedeployments spec deadline seconds.",
            &per_d(&|d| i64::from(d.spec.progress_deadline_seconds.unwrap_or(0))),
        )?;
        let conditions: Vec<(Labels, i64)> = ds
            .iter()
            .flat_map(|d| {
                let conditions = d
                    .status
                    .iter()
                    .flat_map(|st| st.conditions.iter().flatten());
                condition_samples(
                    d.as_ref(),
                    conditions.map(|c| (c.type_.to_string(), &c.status)),
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_condition",
            "Information of the mcm managed Machinedeployments' status conditions.",
            &conditions,
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_available_replicas",
            "Count of the mcm managed Machinedeployments available replicas.",
            &per_d(&|d| i64::from(dstatus(d).available_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_unavailable_replicas",
            "Count of the mcm managed Machinedeployments unavailable replicas.",
            &per_d(&|d| i64::from(dstatus(d).unavailable_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_ready_replicas",
            "Count of the mcm managed Machinedeployments ready replicas.",
            &per_d(&|d| i64::from(dstatus(d).ready_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_updated_replicas",
            "Count of the mcm managed Machinedeployments updated replicas.",
            &per_d(&|d| i64::from(dstatus(d).updated_replicas.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_collision_count",
            "Mcm managed Machinedeployments collision count.",
            &per_d(&|d| i64::from(dstatus(d).collision_count.unwrap_or(0))),
        )?;
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_status_replicas",
            "Count of the mcm managed Machinedeployments replicas.",
            &per_d(&|d| i64::from(dstatus(d).replicas.unwrap_or(0))),
        )?;
        let failed: Vec<(Labels, i64)> = ds
            .iter()
            .flat_map(|d| {
                failed_samples(
                    d.as_ref(),
                    d.status.as_ref().and_then(|st| st.failed_machines.as_ref()),
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            "mcm_machine_deployment_failed_machines",
            "Information of the mcm managed Machinedeployments' failed machines.",
            &failed,
        )?;
        Ok(())
    }
}
