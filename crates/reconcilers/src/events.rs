//! Kubernetes Events for state transitions and failures.
//!
//! Events are rate-limited per object as client-go's recorder (which the Go MCM uses) does:
//! a burst of [`SPAM_BURST`] Events per object and type, then one per [`SPAM_REFILL`]. A
//! machine has a handful of Events in its life and is never limited; a MachineDeployment or
//! MachineSet in a rollout of hundreds of machines would otherwise spend a request of the
//! controller's QPS budget on every scaling step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Events an object may have at once (client-go's `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// The time in which one more Event per object becomes allowed after the burst (client-go's
/// `defaultSpamQPS` of 1/300).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);

/// A token bucket: `tokens` left as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Self {
        Bucket {
            tokens: f64::from(SPAM_BURST),
            at: now,
        }
    }

    /// Refills for the time since the last look, then takes a token if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let refilled =
            now.saturating_duration_since(self.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        self.tokens = (self.tokens + refilled).min(f64::from(SPAM_BURST));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket would be full at `now` (it can be forgotten).
    fn refilled_by(&self, now: Instant) -> bool {
        self.tokens
            + now.saturating_duration_since(self.at).as_secs_f64() / SPAM_REFILL.as_secs_f64()
            >= f64::from(SPAM_BURST)
    }
}

/// The per-object Event budget of one publisher.
#[derive(Debug, Default)]
struct SpamFilter {
    /// Keyed by the object ([`object_key`]) and whether the Events are Warnings.
    buckets: HashMap<(String, bool), Bucket>,
}

/// Buckets kept before full ones are forgotten.
const SPAM_FORGET_ABOVE: usize = 1024;

impl SpamFilter {
    /// Whether an Event of `type_` on `reference` may be published at `now`.
    fn allow(&mut self, reference: &ObjectReference, type_: EventType, now: Instant) -> bool {
        if self.buckets.len() > SPAM_FORGET_ABOVE {
            self.buckets.retain(|_, b| !b.refilled_by(now));
        }
        self.buckets
            .entry((object_key(reference), type_ == EventType::Warning))
            .or_insert_with(|| Bucket::full(now))
            .take(now)
    }

    /// Keeps only the budgets of objects `live` (UIDs) names, and those of objects without a
    /// UID.
    fn retain(&mut self, live: &std::collections::HashSet<String>) {
        self.buckets
            .retain(|(key, _), _| key.contains('/') || live.contains(key));
    }

    /// Drops the budgets of the object with this UID (it is gone).
    fn forget(&mut self, uid: &str) {
        for warning in [false, true] {
            self.buckets.remove(&(uid.to_owned(), warning));
        }
    }
}

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
    client: kube::Client,
    reporter: Reporter,
    spam: Arc<Mutex<SpamFilter>>,
}

/// Whether an Event is published through the shared recorder, which keeps every Event it
/// published for 6 minutes to count a repeat into a series (one patch instead of a new
/// Event). A Machine's Normal Events are its transitions (`Running`, `Deleted`, ...): one
/// each per machine, never a series; kept, they only grew the machine controller by the
/// Events of the last 6 minutes of churn (a few MiB while 1000 machines come and go). They
/// go through a recorder of their own that keeps nothing. Warnings (a failure that repeats)
/// and other kinds' Events (a MachineSet's per-batch Events) keep their series. Pure.
fn keeps_series(reference: &ObjectReference, type_: EventType) -> bool {
    !(type_ == EventType::Normal && reference.kind.as_deref() == Some("Machine"))
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher").finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// Events reported as `controller` (e.g. `machine-controller`).
    pub fn new(client: kube::Client, controller: &str) -> Self {
        let reporter = Reporter {
            controller: controller.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        EventPublisher {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            spam: Arc::default(),
        }
    }

    typed_events! {
        /// A `Normal` event.
        normal => Normal,
        /// A `Warning` event.
        warning => Warning,
    }

    /// Forgets the Event budgets of the object with this UID (call it when the object is
    /// deleted: a budget is otherwise kept until it has refilled, up to an hour).
    pub fn forget(&self, uid: &str) {
        if let Ok(mut f) = self.spam.lock() {
            f.forget(uid);
        }
    }

    /// Keeps only the Event budgets of the objects `live` names by UID (a sweep after Events
    /// of objects published once they were gone).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        if let Ok(mut f) = self.spam.lock() {
            f.retain(live);
        }
    }

    /// How many Event budgets are kept.
    pub fn budgets(&self) -> usize {
        self.spam.lock().map_or(0, |f| f.buckets.len())
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
        let allowed = self
            .spam
            .lock()
            .map(|mut f| f.allow(reference, type_, Instant::now()))
            .unwrap_or(true);
        if !allowed {
            tracing::debug!(
                reason,
                %note,
                "event not published: the object's event budget is spent"
            );
            return;
        }
        // The events API limits notes to 1 KiB.
        let note = truncate(note, 1024);
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        let published = if keeps_series(reference, type_) {
            self.recorder.publish(&ev, reference).await
        } else {
            Recorder::new(self.client.clone(), self.reporter.clone())
                .publish(&ev, reference)
                .await
        };
        if let Err(e) = published {
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
    use super::*;

    fn reference(name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("machine.sapcloud.io/v1alpha1".into()),
            kind: Some("MachineDeployment".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn an_object_has_a_burst_of_events_then_one_per_refill_period() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        let d = reference("d", "1");
        let allowed = (0..40)
            .filter(|_| f.allow(&d, EventType::Normal, t0))
            .count();
        assert_eq!(allowed, SPAM_BURST as usize);
        // Just short of a refill: still nothing; after one: exactly one more.
        assert!(!f.allow(&d, EventType::Normal, t0 + SPAM_REFILL / 2));
        let later = t0 + SPAM_REFILL + Duration::from_secs(1);
        assert!(f.allow(&d, EventType::Normal, later));
        assert!(!f.allow(&d, EventType::Normal, later));
    }

    #[test]
    fn budgets_are_per_object_and_type() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        let d = reference("d", "1");
        for _ in 0..SPAM_BURST {
            assert!(f.allow(&d, EventType::Normal, t0));
        }
        assert!(!f.allow(&d, EventType::Normal, t0));
        // A Warning on the same object, another object, and a new object of the same name.
        assert!(f.allow(&d, EventType::Warning, t0));
        assert!(f.allow(&reference("e", "2"), EventType::Normal, t0));
        assert!(f.allow(&reference("d", "3"), EventType::Normal, t0));
    }

    #[test]
    fn refilled_buckets_are_forgotten_once_there_are_many() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        for i in 0..=SPAM_FORGET_ABOVE {
            f.allow(
                &reference(&format!("m{i}"), &format!("u{i}")),
                EventType::Normal,
                t0,
            );
        }
        let spent = reference("spent", "s");
        for _ in 0..SPAM_BURST {
            f.allow(&spent, EventType::Normal, t0);
        }
        // Long after, every bucket has refilled (the spent one too): the next look forgets
        // them all and keeps only the new one.
        let later = t0 + SPAM_REFILL * (SPAM_BURST + 1);
        assert!(f.allow(&reference("fresh", "f"), EventType::Normal, later));
        assert_eq!(f.buckets.len(), 1);
    }

    #[test]
    fn a_deleted_objects_budgets_are_forgotten() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        let d = reference("d", "1");
        assert!(f.allow(&d, EventType::Normal, t0));
        assert!(f.allow(&d, EventType::Warning, t0));
        assert!(f.allow(&reference("e", "2"), EventType::Normal, t0));
        assert_eq!(f.buckets.len(), 3);
        f.forget("1");
        assert_eq!(f.buckets.len(), 1);
        assert!(f.allow(&reference("g", "3"), EventType::Normal, t0));
        f.retain(&["3".to_string()].into());
        assert_eq!(f.buckets.len(), 1, "only the live object's budget is kept");
    }

    #[test]
    fn only_a_machines_transitions_go_without_a_series() {
        let mut machine = reference("m", "1");
        machine.kind = Some("Machine".into());
        assert!(!keeps_series(&machine, EventType::Normal));
        assert!(keeps_series(&machine, EventType::Warning));
        assert!(keeps_series(&reference("d", "1"), EventType::Normal));
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
