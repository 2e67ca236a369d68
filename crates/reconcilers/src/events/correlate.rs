//! Which write an Event becomes, as client-go's `EventCorrelator` decides it for the Go MCM:
//!
//! - the same Event again (same object, type, reason and message) is counted into the Event
//!   that reported it first: a patch of its `count`, `lastTimestamp` and `message`;
//! - an Event with a new message is a new Event;
//! - once [`AGGREGATE_AFTER`] different messages of the same object, type and reason came
//!   within [`AGGREGATE_WINDOW`] of each other, the next ones are counted into one aggregate
//!   Event whose message is the latest, prefixed with [`AGGREGATE_PREFIX`].
//!
//! Pure: the caller passes the time and performs the [`Write`].

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::events::EventType;

/// Different messages of one object, type and reason after which they are aggregated
/// (client-go's `defaultAggregateMaxEvents`).
pub(crate) const AGGREGATE_AFTER: usize = 10;
/// The time since the last similar Event after which similar Events are counted afresh
/// (client-go's `defaultAggregateIntervalInSeconds`).
pub(crate) const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// What client-go puts before the latest message of an aggregate Event.
pub(crate) const AGGREGATE_PREFIX: &str = "(combined from similar events): ";

/// Objects whose Events are remembered (client-go keeps 4096 Events, whatever the object).
const OBJECTS_KEPT: usize = 4096;
/// Events remembered per object; the least recently seen one is forgotten first.
const EVENTS_KEPT_PER_OBJECT: usize = 64;

/// One Event as a controller reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Occurrence<'a> {
    /// The object's budget key ([`super::object_key`]).
    pub(crate) object: &'a str,
    /// The path of the field the Event is about, if any.
    pub(crate) field_path: &'a str,
    /// Normal or Warning.
    pub(crate) type_: EventType,
    /// The reason (`ScalingMachineSet`, ...).
    pub(crate) reason: &'a str,
    /// The action (`Scale`, ...).
    pub(crate) action: &'a str,
    /// The message.
    pub(crate) message: &'a str,
}

/// What to write to the API server for an [`Occurrence`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    /// A new Event (`Create`) or one more of an Event written before (`Patch`).
    pub(crate) kind: WriteKind,
    /// The Event's name (for `Create`: a new name; for `Patch`: the first one's).
    pub(crate) name_suffix: String,
    /// The Event's message (an aggregate's is prefixed).
    pub(crate) message: String,
    /// How many times it happened.
    pub(crate) count: i32,
    /// When it first happened.
    pub(crate) first: Timestamp,
}

/// Whether a [`Write`] creates an Event or counts into one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// A new Event.
    Create,
    /// A patch of the Event written before under this name (create it if it is gone: the
    /// API server deletes Events after an hour).
    Patch,
}

/// The Events with the same object, type, reason and action seen lately.
#[derive(Debug)]
struct Similar {
    /// Their messages (hashed), at most [`AGGREGATE_AFTER`].
    messages: HashSet<u64>,
    /// When the last of them came.
    last: Timestamp,
}

/// An Event written before.
#[derive(Debug)]
struct Seen {
    name_suffix: String,
    count: i32,
    first: Timestamp,
    used: u64,
}

/// What one object's Events have been.
#[derive(Debug, Default)]
struct ObjectLog {
    similar: HashMap<u64, Similar>,
    seen: HashMap<u64, Seen>,
    used: u64,
}

/// The correlation state of one publisher.
#[derive(Debug, Default)]
pub(crate) struct Correlator {
    objects: HashMap<String, ObjectLog>,
    /// A counter that orders uses (least recently used is forgotten first).
    tick: u64,
    /// The last name suffix handed out, in nanoseconds: names stay unique when the clock
    /// stands still or goes back.
    last_nanos: i128,
}

fn hash_of(parts: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

fn type_name(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

impl Correlator {
    /// The write that reports `o` at `now`.
    pub(crate) fn observe(&mut self, o: &Occurrence<'_>, now: Timestamp) -> Write {
        self.tick += 1;
        let tick = self.tick;
        let similar_key = hash_of(&[type_name(o.type_), o.reason, o.action]);
        let event_key = hash_of(&[
            o.field_path,
            type_name(o.type_),
            o.reason,
            o.action,
            o.message,
        ]);
        let log = self.objects.entry(o.object.to_owned()).or_default();
        log.used = tick;

        let similar = log.similar.entry(similar_key).or_insert_with(|| Similar {
            messages: HashSet::new(),
            last: now,
        });
        if now.duration_since(similar.last).as_secs_f64() > AGGREGATE_WINDOW.as_secs_f64() {
            similar.messages.clear();
        }
        similar.messages.insert(hash_of(&[o.message]));
        similar.last = now;
        let (key, message) = if similar.messages.len() < AGGREGATE_AFTER {
            (event_key, o.message.to_owned())
        } else {
            // Keep the set below the threshold's size, as client-go does: one more new
            // message is aggregated again, a message of the set is its own Event's again.
            if let Some(any) = similar.messages.iter().next().copied() {
                similar.messages.remove(&any);
            }
            (similar_key, format!("{AGGREGATE_PREFIX}{}", o.message))
        };

        let write = match log.seen.get_mut(&key) {
            Some(seen) => {
                seen.count = seen.count.saturating_add(1);
                seen.used = tick;
                Write {
                    kind: WriteKind::Patch,
                    name_suffix: seen.name_suffix.clone(),
                    message,
                    count: seen.count,
                    first: seen.first,
                }
            }
            None => {
                let nanos = now.as_nanosecond().max(self.last_nanos + 1);
                self.last_nanos = nanos;
                let name_suffix = format!("{nanos:x}");
                log.seen.insert(
                    key,
                    Seen {
                        name_suffix: name_suffix.clone(),
                        count: 1,
                        first: now,
                        used: tick,
                    },
                );
                Write {
                    kind: WriteKind::Create,
                    name_suffix,
                    message,
                    count: 1,
                    first: now,
                }
            }
        };
        if log.seen.len() > EVENTS_KEPT_PER_OBJECT
            && let Some(oldest) = log.seen.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| *k)
        {
            log.seen.remove(&oldest);
        }
        if self.objects.len() > OBJECTS_KEPT + OBJECTS_KEPT / 8 {
            self.forget_least_used(OBJECTS_KEPT);
        }
        write
    }

    /// Keeps the `keep` most recently used objects.
    fn forget_least_used(&mut self, keep: usize) {
        let mut uses: Vec<u64> = self.objects.values().map(|l| l.used).collect();
        let cut = uses.len().saturating_sub(keep);
        if cut == 0 {
            return;
        }
        let (_, threshold, _) = uses.select_nth_unstable(cut - 1);
        let threshold = *threshold;
        self.objects.retain(|_, l| l.used > threshold);
    }

    /// Forgets the Events of the object with this key (it is gone).
    pub(crate) fn forget(&mut self, object: &str) {
        self.objects.remove(object);
    }

    /// Keeps only the objects `live` names by UID, and those without a UID.
    pub(crate) fn retain(&mut self, live: &HashSet<String>) {
        self.objects
            .retain(|key, _| key.contains('/') || live.contains(key));
    }

    /// How many objects' Events are remembered.
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> Timestamp {
        "2026-11-29T10:00:00Z".parse::<Timestamp>().unwrap() + Duration::from_secs(secs)
    }

    fn scaled<'a>(object: &'a str, message: &'a str) -> Occurrence<'a> {
        Occurrence {
            object,
            field_path: "",
            type_: EventType::Normal,
            reason: "ScalingMachineSet",
            action: "Scale",
            message,
        }
    }

    #[test]
    fn the_same_event_is_counted_into_the_first() {
        let mut c = Correlator::default();
        let o = scaled("md", "Scaled up machine set s to 3");
        let first = c.observe(&o, t(0));
        assert_eq!(first.kind, WriteKind::Create);
        assert_eq!(first.count, 1);
        let again = c.observe(&o, t(30));
        assert_eq!(
            again,
            Write {
                kind: WriteKind::Patch,
                name_suffix: first.name_suffix.clone(),
                message: "Scaled up machine set s to 3".into(),
                count: 2,
                first: t(0),
            }
        );
        // Long after, still the same Event (client-go keeps no time limit on a series).
        let later = c.observe(&o, t(7200));
        assert_eq!((later.kind, later.count), (WriteKind::Patch, 3));
    }

    #[test]
    fn a_new_message_is_a_new_event() {
        let mut c = Correlator::default();
        let notes = ["to 3", "to 5", "to 4", "to 6"];
        let writes: Vec<Write> = notes
            .iter()
            .enumerate()
            .map(|(i, n)| c.observe(&scaled("md", n), t(i as u64)))
            .collect();
        assert!(writes.iter().all(|w| w.kind == WriteKind::Create));
        let names: HashSet<_> = writes.iter().map(|w| &w.name_suffix).collect();
        assert_eq!(names.len(), 4, "each Event has a name of its own");
        assert_eq!(
            writes
                .iter()
                .map(|w| w.message.as_str())
                .collect::<Vec<_>>(),
            notes
        );
    }

    #[test]
    fn events_differing_in_type_reason_action_field_or_object_are_not_the_same() {
        let mut c = Correlator::default();
        let base = scaled("md", "m");
        assert_eq!(c.observe(&base, t(0)).kind, WriteKind::Create);
        let variants = [
            Occurrence {
                type_: EventType::Warning,
                ..base
            },
            Occurrence {
                reason: "Other",
                ..base
            },
            Occurrence {
                action: "Other",
                ..base
            },
            Occurrence {
                field_path: "spec",
                ..base
            },
            Occurrence {
                object: "other",
                ..base
            },
        ];
        for v in variants {
            assert_eq!(c.observe(&v, t(1)).kind, WriteKind::Create, "{v:?}");
        }
    }

    #[test]
    fn the_tenth_different_message_within_the_window_starts_an_aggregate_of_the_latest() {
        let mut c = Correlator::default();
        let writes: Vec<Write> = (1..=12)
            .map(|i| c.observe(&scaled("md", &format!("to {i}")), t(i)))
            .collect();
        for w in &writes[..9] {
            assert_eq!((w.kind, w.count), (WriteKind::Create, 1), "{w:?}");
            assert!(!w.message.starts_with(AGGREGATE_PREFIX));
        }
        assert_eq!(writes[9].kind, WriteKind::Create);
        assert_eq!(
            writes[9].message, "(combined from similar events): to 10",
            "client-go's prefix"
        );
        for (w, n) in writes[10..].iter().zip([11, 12]) {
            assert_eq!(w.kind, WriteKind::Patch);
            assert_eq!(
                w.name_suffix, writes[9].name_suffix,
                "the aggregate counts up"
            );
            assert_eq!(
                w.message,
                format!("{AGGREGATE_PREFIX}to {n}"),
                "latest message"
            );
        }
        assert_eq!(writes[11].count, 3);
    }

    #[test]
    fn similar_events_further_apart_than_the_window_are_counted_afresh() {
        let mut c = Correlator::default();
        let step = AGGREGATE_WINDOW.as_secs() + 1;
        for i in 1..=20 {
            let w = c.observe(&scaled("md", &format!("to {i}")), t(i * step));
            assert_eq!(w.kind, WriteKind::Create);
            assert!(!w.message.starts_with(AGGREGATE_PREFIX), "{w:?}");
        }
    }

    #[test]
    fn names_stay_unique_when_the_clock_stands_still_or_goes_back() {
        let mut c = Correlator::default();
        let a = c.observe(&scaled("md", "a"), t(10));
        let b = c.observe(&scaled("md", "b"), t(10));
        let d = c.observe(&scaled("md", "d"), t(5));
        let names: HashSet<_> = [a.name_suffix, b.name_suffix, d.name_suffix].into();
        assert_eq!(names.len(), 3);
    }

    #[test]
    fn memory_is_bounded_per_object_and_in_objects() {
        let mut c = Correlator::default();
        // Messages far apart (no aggregation): each one is remembered, up to the bound.
        let step = AGGREGATE_WINDOW.as_secs() + 1;
        for i in 0..(EVENTS_KEPT_PER_OBJECT as u64 * 2) {
            c.observe(&scaled("md", &format!("m{i}")), t(i * step));
        }
        assert!(c.objects["md"].seen.len() <= EVENTS_KEPT_PER_OBJECT);
        // The latest is still counted into its Event.
        let last = format!("m{}", EVENTS_KEPT_PER_OBJECT * 2 - 1);
        assert_eq!(c.observe(&scaled("md", &last), t(0)).kind, WriteKind::Patch);
        for i in 0..(OBJECTS_KEPT * 2) {
            c.observe(&scaled(&format!("o{i}"), "m"), t(0));
        }
        assert!(c.len() <= OBJECTS_KEPT + OBJECTS_KEPT / 8);
        assert!(
            c.objects
                .contains_key(&format!("o{}", OBJECTS_KEPT * 2 - 1))
        );
    }

    #[test]
    fn gone_objects_are_forgotten() {
        let mut c = Correlator::default();
        c.observe(&scaled("u1", "m"), t(0));
        c.observe(&scaled("u2", "m"), t(0));
        c.observe(&scaled("v1/Node//n", "m"), t(0));
        c.forget("u1");
        assert_eq!(c.observe(&scaled("u1", "m"), t(1)).kind, WriteKind::Create);
        c.retain(&["u1".to_string()].into());
        assert_eq!(c.len(), 2, "u1 and the object without a UID");
    }
}
