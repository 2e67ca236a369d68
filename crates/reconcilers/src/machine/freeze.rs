//! The freeze flag the API-server safety check sets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the safety controller froze the machine controller.
#[derive(Debug, Clone, Default)]
pub struct Freeze(Arc<AtomicBool>);

impl Freeze {
    /// Whether frozen now.
    pub fn is_frozen(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Sets the state; returns the previous one.
    pub fn set(&self, frozen: bool) -> bool {
        self.0.swap(frozen, Ordering::SeqCst)
    }
}
