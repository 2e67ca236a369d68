//! The safety controller of the machine-controller side:
//! - orphan VMs: VMs the driver lists for a class that no Machine owns are deleted,
//!   periodically and on demand;
//! - API-server reachability: when the control or target API server stays unreachable longer
//!   than the status-check timeout, the machine controller freezes (no machine is marked
//!   Failed, no deletion starts); on recovery it unfreezes and restarts the health timers of
//!   Unknown machines, since their nodes could not report while the path was cut.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use mcm_api::{Machine, MachinePhase};
use mcm_driver::{DeleteMachineRequest, ListMachinesRequest, RequestId};
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::machine::{Ctx, Error, act};

/// Periods and timeouts of the safety controller.
#[derive(Debug, Clone)]
pub struct SafetySettings {
    /// `--machine-safety-orphan-vms-period`
    pub orphan_vms_period: Duration,
    /// `--machine-safety-apiserver-statuscheck-period`
    pub apiserver_statuscheck_period: Duration,
    /// `--machine-safety-apiserver-statuscheck-timeout`
    pub apiserver_statuscheck_timeout: Duration,
}

/// The orphans among the VMs a driver listed: `(provider id, machine name)` pairs whose
/// machine name no Machine has.
pub fn orphans<'a>(
    listed: &'a std::collections::BTreeMap<String, String>,
    machine_names: &std::collections::BTreeSet<String>,
) -> Vec<(&'a str, &'a str)> {
    listed
        .iter()
        .filter(|(_, name)| !machine_names.contains(*name))
        .map(|(id, name)| (id.as_str(), name.as_str()))
        .collect()
}

/// One orphan-collection pass over every class. Returns the number of VMs deleted.
pub async fn collect_orphans(ctx: &Ctx) -> Result<usize, Error> {
    if ctx.freeze.is_frozen() {
        return Ok(0);
    }
    let mut deleted = 0;
    for class in ctx.classes.state() {
        let class_name = class.name_any();
        let probe = Machine::new("orphan-probe", Default::default());
        let (class, secret) = match act::class_and_secret(ctx, &class_probe(&probe, &class_name))
            .await
        {
            Ok(x) => x,
            Err(Error::Class(p)) => {
                tracing::debug!(class = %class_name, problem = %p, "skipping class in orphan collection");
                continue;
            }
            Err(e) => return Err(e),
        };
        let request_id = RequestId::generate();
        let listed = ctx
            .driver
            .list_machines(ListMachinesRequest {
                machine_class: class.clone(),
                secret: secret.clone(),
                request_id: request_id.clone(),
            })
            .await
            .map_err(|e| Error::driver("list_machines", e))?;
        if listed.machines.is_empty() {
            continue;
        }
        // Read the Machines from the API server, not the store: a stale store must never
        // make a VM look orphaned.
        let names = act::list_machines(ctx).await?.into_keys().collect();
        for (provider_id, machine_name) in orphans(&listed.machines, &names) {
            let mut vm_machine = Machine::new(machine_name, Default::default());
            vm_machine.metadata.namespace = Some(ctx.settings.namespace.clone());
            vm_machine.spec.provider_id = Some(provider_id.to_string());
            tracing::info!(%provider_id, machine = machine_name, %request_id, "deleting orphan VM");
            ctx.driver
                .delete_machine(DeleteMachineRequest {
                    machine: vm_machine,
                    machine_class: class.clone(),
                    secret: secret.clone(),
                    request_id: request_id.clone(),
                })
                .await
                .or_else(|e| {
                    if e.is_not_found() {
                        Ok(Default::default())
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| Error::driver("delete_machine", e))?;
            ctx.events
                .warning(
                    &kube::Resource::object_ref(&class, &()),
                    "OrphanVMDeleted",
                    "OrphanCollection",
                    format!(
                        "deleted orphan VM {provider_id} (machine {machine_name} does not exist)"
                    ),
                )
                .await;
            deleted += 1;
        }
    }
    Ok(deleted)
}

fn class_probe(probe: &Machine, class_name: &str) -> Machine {
    let mut m = probe.clone();
    m.spec.class = Some(mcm_api::ClassSpec {
        api_group: None,
        kind: Some(mcm_api::constants::MACHINE_CLASS_KIND.into()),
        name: Some(class_name.into()),
    });
    m
}

/// Collects orphans every `period` and whenever `trigger` is notified, until `shutdown`.
pub async fn run_orphan_collector(
    ctx: Arc<Ctx>,
    period: Duration,
    trigger: Arc<Notify>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let work = async {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = trigger.notified() => {}
            }
            match collect_orphans(&ctx).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "orphan collection deleted VMs"),
                Err(e) => {
                    tracing::warn!(error = %e, cause = ?std::error::Error::source(&e), "orphan collection failed")
                }
            }
        }
    };
    tokio::select! {
        _ = work => {}
        _ = shutdown => {}
    }
}

/// Whether to be frozen, given since when the API servers are unreachable (`None`:
/// reachable). Pure.
pub fn should_freeze(unreachable_since: Option<Instant>, now: Instant, timeout: Duration) -> bool {
    unreachable_since.is_some_and(|since| now.duration_since(since) >= timeout)
}

async fn reachable(client: &kube::Client, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, client.apiserver_version()).await,
        Ok(Ok(_))
    )
}

/// Restarts the health timer of every Unknown machine (after an outage their nodes could
/// not report). Called while still frozen, and returns once the store shows the new timers
/// (bounded): a reconcile between unfreezing and the reset, or one reading the old timer from
/// the store, would mark the machine Failed at once.
async fn reset_health_timers(ctx: &Ctx) {
    let api: Api<Machine> = Api::namespaced(ctx.control.clone(), &ctx.settings.namespace);
    let now = Timestamp::now().to_string();
    let mut written = Vec::new();
    for m in ctx.machines.state() {
        if m.phase() == Some(&MachinePhase::Unknown) {
            let patch = json!({ "status": { "currentStatus": {
                "phase": "Unknown", "timeoutActive": true, "lastUpdateTime": now
            }}});
            match api
                .patch_status(
                    &m.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(updated) => written.push((
                    kube::runtime::reflector::ObjectRef::from_obj(&updated),
                    updated.resource_version(),
                )),
                Err(e) => {
                    tracing::warn!(machine = %m.name_any(), error = %e, "failed to reset the health timer")
                }
            }
        }
    }
    let reflected = async {
        for (r, version) in &written {
            while ctx
                .machines
                .get(r)
                .is_some_and(|m| m.resource_version() != *version && !newer(&m, version))
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), reflected)
        .await
        .is_err()
    {
        tracing::warn!("the machine store did not show the reset health timers within 5s");
    }
}

/// Whether the store's object is newer than `version` (resource versions are opaque, but
/// etcd's are increasing integers; anything unparsable counts as not newer).
fn newer(m: &Machine, version: &Option<String>) -> bool {
    let parse = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
    matches!(
        (parse(m.metadata.resource_version.as_deref()), parse(version.as_deref())),
        (Some(a), Some(b)) if a > b
    )
}

/// Probes both API servers every `period`; freezes after `timeout` of unreachability and
/// unfreezes on recovery. Runs until `shutdown`.
pub async fn run_apiserver_check(
    ctx: Arc<Ctx>,
    settings: SafetySettings,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let work = async {
        let mut unreachable_since: Option<Instant> = None;
        // A slow answer is not an outage: a probe may take as long as the freeze timeout.
        let probe_timeout = settings
            .apiserver_statuscheck_timeout
            .clamp(Duration::from_secs(1), Duration::from_secs(30));
        let mut tick = tokio::time::interval(settings.apiserver_statuscheck_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ok = reachable(&ctx.control, probe_timeout).await
                && reachable(&ctx.target, probe_timeout).await;
            let now = Instant::now();
            unreachable_since = if ok {
                None
            } else {
                Some(unreachable_since.unwrap_or(now))
            };
            let freeze = should_freeze(
                unreachable_since,
                now,
                settings.apiserver_statuscheck_timeout,
            );
            if !freeze && ctx.freeze.is_frozen() {
                // Still frozen: restart the health timers first, then unfreeze.
                reset_health_timers(&ctx).await;
            }
            let was = ctx.freeze.set(freeze);
            ctx.metrics.frozen.set(i64::from(freeze));
            match (was, freeze) {
                (false, true) => tracing::error!(
                    timeout = ?settings.apiserver_statuscheck_timeout,
                    "an API server is unreachable beyond the status-check timeout: machine controller frozen"
                ),
                (true, false) => {
                    tracing::info!("API servers reachable again: machine controller unfrozen");
                }
                _ => {}
            }
            ctx.metrics
                .items
                .set(i64::try_from(ctx.machines.state().len()).unwrap_or(i64::MAX));
        }
    };
    tokio::select! {
        _ = work => {}
        _ = shutdown => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn orphans_are_vms_without_a_machine_of_that_name() {
        let listed = BTreeMap::from([
            ("local:///a".to_string(), "a".to_string()),
            ("local:///b".to_string(), "b".to_string()),
        ]);
        let names = BTreeSet::from(["a".to_string()]);
        assert_eq!(orphans(&listed, &names), vec![("local:///b", "b")]);
        assert!(orphans(&listed, &BTreeSet::from(["a".into(), "b".into()])).is_empty());
    }

    #[test]
    fn freeze_only_after_the_timeout() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(30);
        assert!(!should_freeze(None, t0 + timeout * 10, timeout));
        assert!(!should_freeze(
            Some(t0),
            t0 + Duration::from_secs(29),
            timeout
        ));
        assert!(should_freeze(Some(t0), t0 + timeout, timeout));
    }
}
