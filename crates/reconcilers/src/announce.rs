//! "Announce once": a note (an Event, a warning) is published when it is new for an object,
//! not on every reconcile that sees the same thing. One record per object (by uid), forgotten
//! when the object goes or the problem is fixed, so that its return is announced again.

use std::collections::HashMap;
use std::sync::Mutex;

/// The note last announced per object (by uid).
#[derive(Debug, Default)]
pub(crate) struct Announced(Mutex<HashMap<String, String>>);

impl Announced {
    /// Records `note` for `uid`; whether it differs from the note last announced for it
    /// (then it is to be announced). An empty note is nothing to announce: the record of
    /// `uid` is forgotten (so the next problem is new) and the answer is `false`.
    pub(crate) fn is_new(&self, uid: &str, note: &str) -> bool {
        if note.is_empty() {
            self.forget(uid);
            return false;
        }
        let mut notes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        notes.insert(uid.to_owned(), note.to_owned()).as_deref() != Some(note)
    }

    /// What was last announced for `uid`.
    pub(crate) fn last(&self, uid: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// Forgets what was announced for `uid` (the object is gone, or all is well again);
    /// whether there was a record.
    pub(crate) fn forget(&self, uid: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid)
            .is_some()
    }

    /// How many objects have a note on record.
    pub(crate) fn count(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// How many objects have a note on record.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.count()
    }

    /// Whether no object has a note on record.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_new_once_until_it_changes_or_is_forgotten() {
        let a = Announced::default();
        assert!(a.is_new("u1", "bad value x"));
        assert!(!a.is_new("u1", "bad value x"));
        assert!(a.is_new("u2", "bad value x"), "per object");
        assert!(a.is_new("u1", "bad value y"), "a changed note");
        a.forget("u1");
        assert!(
            a.is_new("u1", "bad value y"),
            "announced again after it was fixed"
        );
        assert!(!a.is_new("u1", ""), "an empty note is nothing to announce");
        assert!(
            a.is_new("u1", "bad value y"),
            "and the problem after it is new"
        );
        a.forget("u1");
        a.forget("u2");
        assert!(a.is_empty());
    }
}
