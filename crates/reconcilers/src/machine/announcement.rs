//! Announcements, as data: a record on the Machine (its `lastOperation`, and a phase) and
//! the Events that tell of it, with what makes it new ([`Novelty`]). [`plan`](super::plan)
//! and the actions build them; [`act::announce`](super::act::announce) is the one place that
//! carries them out, publishing only what [`Announcement::is_new_for`] calls new.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use mcm_api::{Machine, MachinePhase};

use super::model::Topic;
use super::status::{Operation, last_description};

/// What makes an announcement new (and so its Events published).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Novelty {
    /// The `lastOperation` it records differs from the one the Machine shows: kept on the
    /// Machine, so a restart does not announce it again.
    NewRecord,
    /// Its text differs from what was last announced under the topic for this machine (kept
    /// in memory, forgotten with the machine; an announcement without Events forgets it, so
    /// the problem's return is announced again).
    Remembered(Topic),
    /// Every time: a retried failure, whose Event series counts the retries.
    Every,
}

/// Where an Event goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    /// The Machine.
    Machine,
    /// The Node of this name (looked up by name, as the kubelet's Events are).
    Node(String),
    /// Another object of the control cluster (the machine's MachineDeployment).
    Object(ObjectReference),
}

/// One Event of an announcement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Note {
    pub target: Target,
    pub kind: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub text: String,
}

impl Note {
    /// A Normal Event on the Machine.
    pub(crate) fn normal(reason: &'static str, action: &'static str, text: String) -> Self {
        Note {
            target: Target::Machine,
            kind: EventType::Normal,
            reason,
            action,
            text,
        }
    }

    /// A Warning Event on the Machine.
    pub(crate) fn warning(reason: &'static str, action: &'static str, text: String) -> Self {
        Note {
            kind: EventType::Warning,
            ..Note::normal(reason, action, text)
        }
    }

    /// The same Event on `target`.
    pub(crate) fn on(self, target: Target) -> Self {
        Note { target, ..self }
    }
}

/// A record on the Machine and the Events that tell of it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Announcement {
    /// The phase to record with the operation.
    pub phase: Option<MachinePhase>,
    /// The operation to record (`None`: Events only).
    pub op: Option<Operation>,
    /// The Events, published when the announcement is new.
    pub notes: Vec<Note>,
    /// What makes it new.
    pub novelty: Novelty,
}

impl Announcement {
    /// Records `op` (with `phase`) and tells `notes` when the record is new.
    pub(crate) fn record(phase: Option<MachinePhase>, op: Operation, notes: Vec<Note>) -> Self {
        Announcement {
            phase,
            op: Some(op),
            notes,
            novelty: Novelty::NewRecord,
        }
    }

    /// Records `op` (with `phase`) and tells `notes` every time.
    pub(crate) fn every(phase: Option<MachinePhase>, op: Operation, notes: Vec<Note>) -> Self {
        Announcement {
            novelty: Novelty::Every,
            ..Announcement::record(phase, op, notes)
        }
    }

    /// Events only, told every time (a one-off: the step that tells them does not repeat).
    pub(crate) fn events(notes: Vec<Note>) -> Self {
        Announcement {
            phase: None,
            op: None,
            notes,
            novelty: Novelty::Every,
        }
    }

    /// Tells `note` (none: forgets the topic) when it differs from the last of `topic`.
    pub(crate) fn remembered(topic: Topic, note: Option<Note>) -> Self {
        Announcement {
            phase: None,
            op: None,
            notes: note.into_iter().collect(),
            novelty: Novelty::Remembered(topic),
        }
    }

    /// Whether it is new for `m`, whose last announcement under `topic` (if remembered) was
    /// `remembered`. Pure.
    pub(crate) fn is_new_for(&self, m: &Machine, remembered: Option<&str>) -> bool {
        match self.novelty {
            Novelty::Every => true,
            Novelty::NewRecord => self
                .op
                .as_ref()
                .is_none_or(|op| last_description(m) != Some(op.description.as_str())),
            Novelty::Remembered(_) => match self.notes.first() {
                Some(n) => remembered != Some(n.text.as_str()),
                None => false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use mcm_api::MachineOperationType;

    fn machine(last: Option<&str>) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m", "uid": "u" }, "spec": {},
            "status": { "lastOperation": { "description": last } }
        }))
        .unwrap()
    }

    #[test]
    fn each_novelty_says_when_an_announcement_is_new() {
        let op = |d: &str| Operation::processing(MachineOperationType::Delete, d.to_string());
        let note = || Note::warning("R", "A", "text".into());
        let recorded = Announcement::record(None, op("blocked"), vec![note()]);
        // (case, announcement, machine's lastOperation, remembered) -> new
        let cases = [
            (
                "a record the Machine shows",
                recorded.clone(),
                Some("blocked"),
                None,
                false,
            ),
            (
                "a record it does not show",
                recorded.clone(),
                Some("other"),
                None,
                true,
            ),
            ("a first record", recorded, None, None, true),
            (
                "every time",
                Announcement::every(None, op("failed"), vec![note()]),
                Some("failed"),
                None,
                true,
            ),
            (
                "remembered, the same",
                Announcement::remembered(Topic::HealthPolicy, Some(note())),
                None,
                Some("text"),
                false,
            ),
            (
                "remembered, another",
                Announcement::remembered(Topic::HealthPolicy, Some(note())),
                None,
                Some("old"),
                true,
            ),
            (
                "remembered, first",
                Announcement::remembered(Topic::PreserveValue, Some(note())),
                None,
                None,
                true,
            ),
            (
                "remembered, fixed: nothing to tell",
                Announcement::remembered(Topic::PreserveValue, None),
                None,
                Some("text"),
                false,
            ),
        ];
        for (case, a, last, remembered, want) in cases {
            assert_eq!(a.is_new_for(&machine(last), remembered), want, "{case}");
        }
    }
}
