//! Golden files: a test's output compared with a reviewed file of the repository.

use std::path::Path;

/// The variable that makes [`assert_golden`] write the files instead of comparing them (a
/// rewrite is a change to review line by line, not a way to make a test pass).
pub const GOLDEN_UPDATE_ENV: &str = "MCM_GOLDEN_UPDATE";

/// Compares `got` with the file at `path` (what `what` produced), or writes it there when
/// [`GOLDEN_UPDATE_ENV`] is set. Panics with the difference, or when the file is missing.
pub fn assert_golden(path: &Path, got: &str, what: &str) {
    if std::env::var_os(GOLDEN_UPDATE_ENV).is_some() {
        std::fs::write(path, got)
            .unwrap_or_else(|e| panic!("write the golden file {}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} ({GOLDEN_UPDATE_ENV}=1 writes it)", path.display()));
    pretty_assertions::assert_eq!(got, want, "{what}");
}
