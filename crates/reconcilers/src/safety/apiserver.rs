//! API-server reachability: the machine controller freezes while the control or target API
//! server stays unreachable beyond the status-check timeout.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use mcm_api::{Machine, MachinePhase};
use serde_json::json;
use std::time::Instant;

use super::SafetySettings;
use crate::machine::Ctx;

/// Whether to be frozen, given since when the API servers are unreachable (`None`:
/// reachable). Pure.
pub(crate) fn should_freeze(
    unreachable_since: Option<Instant>,
    now: Instant,
    timeout: Duration,
) -> bool {
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
    let now = ctx.clock.now().to_string();
    let mut written = Vec::new();
    for m in ctx.stores.machines.state() {
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
                Ok(_) => written.push((ObjectRef::from_obj(m.as_ref()), timer_of(&m))),
                Err(e) => {
                    tracing::warn!(machine = %m.name_any(), error = %e, "failed to reset the health timer")
                }
            }
        }
    }
    // The store shows a reset once the machine's timer is no longer the one it had before
    // (ours, or a later phase change), or the machine is gone.
    let reflected = async {
        for (r, before) in &written {
            while ctx
                .stores
                .machines
                .get(r)
                .is_some_and(|m| timer_of(&m) == *before)
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

/// A machine's phase and when it began, as recorded in its status.
fn timer_of(m: &Machine) -> (Option<MachinePhase>, Option<String>) {
    let current = m.status.as_ref().and_then(|s| s.current_status.as_ref());
    (
        current.and_then(|c| c.phase.clone()),
        current
            .and_then(|c| c.last_update_time.as_ref())
            .map(|t| t.0.to_string()),
    )
}

/// Probes both API servers every `period`; freezes after `timeout` of unreachability and
/// unfreezes on recovery. Runs until `shutdown`.
pub(crate) async fn run_apiserver_check(
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
                && (!ctx.settings.target_cluster || reachable(&ctx.target, probe_timeout).await);
            let now = ctx.clock.instant();
            let wall = ctx.clock.now();
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
            if ok {
                // After the freeze flag: a reader that sees this check sees its unfreeze.
                ctx.metrics
                    .apiservers_reachable_at
                    .set(wall.as_duration().as_secs_f64());
            }
            ctx.metrics
                .items
                .set(i64::try_from(ctx.stores.machines.state().len()).unwrap_or(i64::MAX));
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
