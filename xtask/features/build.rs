//! Nothing to build: the script exists because cargo resolves a package's
//! build-dependencies (here, the host-side feature entries) only when it has one.

fn main() {}
