//! Kubernetes Events for state transitions and failures, written as client-go's recorder
//! (which the Go MCM uses) writes them: `core/v1` Events with a `source`, a `count` and a
//! `message` that `kubectl describe` shows.
//!
//! - The same Event again is counted into the first one; a new message is a new Event; after
//!   ten different messages of one reason in ten minutes they are aggregated into one Event
//!   that shows the latest message ([`correlate`]).
//! - Events are rate-limited per object and type ([`spam`]): a burst of 25, then one per five
//!   minutes. A machine has a handful of Events in its life and is never limited; a
//!   MachineDeployment or MachineSet in a rollout of hundreds of machines would otherwise
//!   spend a request of the controller's QPS budget on every scaling step.
//!
//! Why `core/v1` and not `events.k8s.io/v1`: the newer API makes an Event's note immutable,
//! so an aggregate could not show the latest message, and its series would show the first
//! message of a reason for six minutes, which is what the Go MCM's users never see.

mod correlate;
mod spam;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::clock::SharedClock;
use correlate::{Correlator, Occurrence, Write, WriteKind};
use spam::SpamFilter;

/// The object an Event budget belongs to: its UID (a new object of the same name has a
/// budget of its own), or without one its kind, namespace and name. A burst of Normal
/// Events does not silence a Warning: each type has its own budget.
fn object_key(r: &ObjectReference) -> String {
    match r.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(uid) => uid.to_owned(),
        None => format!(
            "{}/{}/{}/{}",
            r.api_version.as_deref().unwrap_or_default(),
            r.kind.as_deref().unwrap_or_default(),
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default(),
        ),
    }
}

/// What one publisher remembers: the budgets and the Events written.
#[derive(Debug, Default)]
struct State {
    spam: SpamFilter,
    correlator: Correlator,
}

macro_rules! typed_events {
    ($($(#[$doc:meta])* $name:ident => $type_:ident,)*) => {$(
        $(#[$doc])*
        pub(crate) async fn $name(&self, reference: &ObjectReference, reason: &str, action: &str, note: String) {
            self.publish(reference, EventType::$type_, reason, action, note).await
        }
    )*};
}

/// Publishes Events as one reporting controller. Failures to publish are logged, never
/// propagated: an Event is information, not a step of the lifecycle.
#[derive(Clone)]
pub(crate) struct EventPublisher {
    client: kube::Client,
    /// The reporting controller (`source.component`, `reportingComponent`).
    controller: String,
    /// The reporting instance (the pod's name), if known.
    instance: Option<String>,
    clock: SharedClock,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("controller", &self.controller)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// Events reported as `controller` (e.g. `machine-controller`).
    pub(crate) fn new(client: kube::Client, controller: &str) -> Self {
        EventPublisher {
            client,
            controller: controller.into(),
            instance: std::env::var("POD_NAME").ok().filter(|p| !p.is_empty()),
            clock: crate::clock::system(),
            state: Arc::default(),
        }
    }

    /// The same publisher taking the time from `clock`.
    pub(crate) fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    typed_events! {
        /// A `Normal` event.
        normal => Normal,
        /// A `Warning` event.
        warning => Warning,
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the Event budgets and Events of the object with this UID (call it when the
    /// object is deleted: a budget is otherwise kept until it has refilled, up to an hour).
    pub(crate) fn forget(&self, uid: &str) {
        let mut s = self.state();
        s.spam.forget(uid);
        s.correlator.forget(uid);
    }

    /// Keeps only the Event budgets and Events of the objects `live` names by UID (a sweep
    /// after Events of objects published once they were gone).
    pub(crate) fn retain(&self, live: &HashSet<String>) {
        let mut s = self.state();
        s.spam.retain(live);
        s.correlator.retain(live);
    }

    /// How many per-object records are kept (budgets and remembered Events).
    pub(crate) fn tracked(&self) -> usize {
        let s = self.state();
        s.spam.len() + s.correlator.len()
    }

    /// An event of the given type.
    pub(crate) async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let now = self.clock.now();
        let object = object_key(reference);
        // The events API limits notes to 1 KiB; the Go MCM's are shorter.
        let message = truncate(note, 1024);
        let write = {
            let mut s = self.state();
            if !s.spam.allow(&object, type_, now) {
                tracing::debug!(
                    reason,
                    %message,
                    "event not published: the object's event budget is spent"
                );
                return;
            }
            s.correlator.observe(
                &Occurrence {
                    object: &object,
                    field_path: reference.field_path.as_deref().unwrap_or_default(),
                    type_,
                    reason,
                    action,
                    message: &message,
                },
                now,
            )
        };
        let event = self.event(reference, type_, reason, action, &write, now);
        if let Err(e) = self.write(event, write.kind).await {
            tracing::warn!(error = %e, reason, "failed to publish an event");
        }
    }

    /// The `core/v1` Event of `write`, as client-go's recorder makes it.
    fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        write: &Write,
        now: jiff::Timestamp,
    ) -> CoreEvent {
        let instance = self.instance.clone();
        CoreEvent {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{}",
                    reference.name.as_deref().unwrap_or(&self.controller),
                    write.name_suffix
                )),
                // A cluster-scoped object's Events are in `default`, as client-go puts them.
                namespace: Some(
                    reference
                        .namespace
                        .clone()
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| "default".into()),
                ),
                ..ObjectMeta::default()
            },
            involved_object: reference.clone(),
            reason: Some(reason.into()),
            message: Some(write.message.clone()),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            action: Some(action.into()),
            count: Some(write.count),
            first_timestamp: Some(Time(write.first)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(self.controller.clone()),
                host: None,
            }),
            reporting_component: Some(self.controller.clone()),
            reporting_instance: instance,
            ..CoreEvent::default()
        }
    }

    /// Creates the Event, or counts into it: a patch of its count, last time and message,
    /// and a create if it is gone (the API server keeps Events for an hour).
    async fn write(&self, event: CoreEvent, kind: WriteKind) -> Result<(), kube::Error> {
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &ns);
        if kind == WriteKind::Patch {
            let name = event.metadata.name.clone().unwrap_or_default();
            let patch = json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                other => return other.map(drop),
            }
        }
        api.create(&PostParams::default(), &event).await.map(drop)
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use kube::api::ListParams;
    use std::time::Duration;

    /// The Events about `name` in `ns`, oldest first: (message, count).
    async fn events_about(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, i32)> {
        let mut events: Vec<CoreEvent> = Api::<CoreEvent>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect();
        // Names end in the nanoseconds of their first occurrence, in hexadecimal.
        let created = |e: &CoreEvent| {
            let name = e.metadata.name.as_deref().unwrap_or_default();
            i128::from_str_radix(name.rsplit('.').next().unwrap_or_default(), 16).unwrap_or(0)
        };
        events.sort_by_key(created);
        events
            .into_iter()
            .map(|e| (e.message.unwrap_or_default(), e.count.unwrap_or(0)))
            .collect()
    }

    #[tokio::test]
    async fn events_read_back_as_client_go_writes_them() {
        let cp = mcm_testenv::shared(mcm_testenv::Components::API_SERVER)
            .await
            .expect("control plane");
        let ns = cp.namespace("events").await.expect("namespace");
        let client = cp.client().await.expect("client");
        let clock = Arc::new(ManualClock::new("2026-11-29T10:00:00Z".parse().unwrap()));
        let events = EventPublisher::new(client.clone(), "machine-controller-manager")
            .with_clock(clock.clone());
        let md = ObjectReference {
            api_version: Some("machine.sapcloud.io/v1alpha1".into()),
            kind: Some("MachineDeployment".into()),
            namespace: Some(ns.clone()),
            name: Some("md".into()),
            uid: Some("uid-md".into()),
            ..ObjectReference::default()
        };
        let scale = |to: u32| format!("Scaled up machine set s to {to}");
        // The same message twice is one Event counted twice; each new one is an Event.
        for to in [3, 3, 5] {
            events
                .normal(&md, "ScalingMachineSet", "Scale", scale(to))
                .await;
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(
            events_about(&client, &ns, "md").await,
            [(scale(3), 2), (scale(5), 1)]
        );
        // Ten different messages within ten minutes: the tenth and later ones are one
        // aggregate Event showing the latest.
        for to in 6..=15 {
            events
                .normal(&md, "ScalingMachineSet", "Scale", scale(to))
                .await;
            clock.advance(Duration::from_secs(1));
        }
        let read = events_about(&client, &ns, "md").await;
        let expected: Vec<(String, i32)> = [(scale(3), 2), (scale(5), 1)]
            .into_iter()
            .chain((6..=12).map(|to| (scale(to), 1)))
            .chain([(format!("(combined from similar events): {}", scale(15)), 3)])
            .collect();
        assert_eq!(read, expected);
        // The API server deletes Events after an hour: the next one is written again.
        let api = Api::<CoreEvent>::namespaced(client.clone(), &ns);
        let list = api.list(&ListParams::default()).await.expect("list").items;
        for e in list {
            api.delete(e.metadata.name.as_deref().unwrap(), &Default::default())
                .await
                .expect("delete");
        }
        // (Past the aggregation window, so the message is its own Event's again.)
        clock.advance(correlate::AGGREGATE_WINDOW + Duration::from_secs(1));
        events
            .normal(&md, "ScalingMachineSet", "Scale", scale(3))
            .await;
        assert_eq!(events_about(&client, &ns, "md").await, [(scale(3), 3)]);
        // A cluster-scoped object's Events are in `default`, with the source set.
        let node_name = format!("events-node-{}", rand::random::<u32>());
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node_name.clone()),
            ..ObjectReference::default()
        };
        events
            .warning(&node, "NodeNotReady", "Check", "gone".into())
            .await;
        let on_node = Api::<CoreEvent>::namespaced(client.clone(), "default")
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .find(|e| e.involved_object.name.as_deref() == Some(node_name.as_str()))
            .expect("the Node's Event");
        assert_eq!(on_node.type_.as_deref(), Some("Warning"));
        assert_eq!(
            on_node.source.and_then(|s| s.component).as_deref(),
            Some("machine-controller-manager")
        );
        assert_eq!(
            on_node.reporting_component.as_deref(),
            Some("machine-controller-manager")
        );
        assert_eq!(on_node.action.as_deref(), Some("Check"));
    }

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let s = "é".repeat(600);
        let t = super::truncate(s, 1024);
        assert!(t.len() <= 1024);
        assert!(t.ends_with("..."));
        assert_eq!(super::truncate("short".into(), 1024), "short");
    }
}
