//! `cargo xtask bench drain`: runs the drain benchmark and passes its output through.
//!
//! The drain benchmark of `mcm-drain`: a node with 50 pods with volumes, drained serially and
//! in parallel against a real control plane; it prints its own wall times.

use anyhow::{Context, Result, bail};

/// The benchmarks run, as `(package, bench target)`.
const BENCHES: [(&str, &str); 1] = [("mcm-drain", "drain")];

/// Makes sure the control plane exists, then runs every benchmark.
pub fn run() -> Result<()> {
    if std::env::var_os(mcm_testenv::binaries::ASSETS_ENV).is_none() {
        crate::testenv::run(false, false)?;
    }
    for (package, bench) in BENCHES {
        println!("== cargo bench -p {package} --bench {bench}");
        let status = crate::e2e::env::cargo_command()
            .current_dir(crate::crds::workspace_root())
            .args(["bench", "-p", package, "--bench", bench])
            .status()
            .context("cannot run cargo")?;
        if !status.success() {
            bail!("benchmark {package}/{bench} failed ({status})");
        }
    }
    Ok(())
}
