//! Kubernetes Events for state transitions and failures.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// `normal(reference, reason, action, note)` and `warning(...)`: [`EventPublisher::publish`]
/// with the type fixed.
macro_rules! typed_events {
    ($($(#[$doc:meta])* $name:ident => $type_:ident,)*) => {$(
        $(#[$doc])*
        pub async fn $name(&self, reference: &ObjectReference, reason: &str, action: &str, note: String) {
            self.publish(reference, EventType::$type_, reason, action, note).await
        }
    )*};
}

/// Publishes Events as one reporting controller. Failures to publish are logged, never
/// propagated: an Event is information, not a step of the lifecycle.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher").finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// Events reported as `controller` (e.g. `machine-controller`).
    pub fn new(client: kube::Client, controller: &str) -> Self {
        EventPublisher {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: controller.into(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            ),
        }
    }

    typed_events! {
        /// A `Normal` event.
        normal => Normal,
        /// A `Warning` event.
        warning => Warning,
    }

    /// An event of the given type.
    pub async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        // The events API limits notes to 1 KiB.
        let note = truncate(note, 1024);
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            tracing::warn!(error = %e, reason, "failed to publish an event");
        }
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
    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let s = "é".repeat(600);
        let t = super::truncate(s, 1024);
        assert!(t.len() <= 1024);
        assert!(t.ends_with("..."));
        assert_eq!(super::truncate("short".into(), 1024), "short");
    }
}
