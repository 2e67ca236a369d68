//! The controllers of mcm-rs.
//!
//! Machine-controller side (one binary per provider): [`machine`] (lifecycle of each
//! Machine: create, health, delete), machine classes and their secrets, nodes, and safety
//! (orphan VMs, API-server freeze). Manager side (provider independent): [`machineset`] and
//! [`machinedeployment`] with Kubernetes Deployment semantics, and the overshooting guard.
//!
//! Every controller is a `kube_runtime::Controller` over shared reflector stores; the
//! decisions are pure functions (`decide` modules) and the effects are small async actions.
#![warn(missing_docs)]

pub mod events;
pub mod machine;
pub mod machine_controller;
pub mod machineclass;
pub mod machinedeployment;
pub mod machineset;
pub mod manager;
pub mod metrics;
pub mod safety;

/// Waits until a reflector store is ready, re-polling every 100 ms.
///
/// `Store::wait_until_ready` of kube-runtime 5 rests on a `futures` oneshot receiver that keeps
/// only the last waker: when a `Controller` and another task (a readiness probe) wait on the
/// same store, the one that polled first is never woken. Re-polling makes such a waiter see
/// the ready store within 100 ms; the controller's task is woken by its own watch stream.
pub async fn store_ready<K>(
    store: &kube::runtime::reflector::Store<K>,
) -> Result<(), kube::runtime::reflector::store::WriterDropped>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        let wait = store.wait_until_ready();
        if let Ok(result) = tokio::time::timeout(std::time::Duration::from_millis(100), wait).await
        {
            return result;
        }
    }
}
