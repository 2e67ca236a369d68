//! `cargo xtask e2e`: end-to-end scenarios against a real control plane, both controller
//! binaries and local VMs.
//!
//! One control plane serves the suite; each scenario gets a fresh namespace, its own VM state
//! directory and its own controller processes (see [`ctx::Ctx`]), all killed when the
//! scenario ends, passed or not. Logs of every process go to `target/e2e/run-<time>/`,
//! kept when something fails (or with `--keep-logs`).

pub mod ctx;
pub mod env;
mod scenarios;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use mcm_testenv::ControlPlane;

pub use scenarios::Scenario;

use ctx::Ctx;
use env::Binaries;

/// Upper bound of one scenario, its clean-up excluded.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs the suite (or one scenario).
pub fn run(only: Option<Scenario>, keep_logs: bool) -> Result<()> {
    env::plain_logs_for_children();
    let bins = env::prepare_binaries()?;
    let selected: Vec<Scenario> = match only {
        Some(s) => vec![s],
        None => Scenario::ALL.to_vec(),
    };
    let stamp = jiff::Timestamp::now().as_second();
    let logs = env::target_dir().join("e2e").join(format!("run-{stamp}"));
    std::fs::create_dir_all(&logs)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let outcome = runtime.block_on(suite(&bins, &selected, &logs));
    let failed = match &outcome {
        Ok(n) => *n,
        Err(e) => {
            println!("e2e suite aborted: {e:#}");
            1
        }
    };
    if failed > 0 || keep_logs {
        println!("logs: {}", logs.display());
    } else {
        let _ = std::fs::remove_dir_all(&logs);
    }
    if failed > 0 {
        bail!("{failed} e2e scenario(s) failed");
    }
    Ok(())
}

/// Runs the scenarios on one control plane; returns how many failed (the leak check counts
/// as one). Ctrl-C stops the suite; every process is killed either way.
async fn suite(bins: &Binaries, selected: &[Scenario], logs: &Path) -> Result<usize> {
    let began = Instant::now();
    let cp = env::start_control_plane(false).await?;
    let run_dir = cp.run_dir().to_path_buf();
    let results = tokio::select! {
        r = run_all(&cp, bins, selected, logs) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
    };
    let mut failed = match &results {
        Ok(n) => *n,
        Err(_) => 1,
    };
    if failed > 0
        && let Err(e) = env::preserve_control_plane_logs(&cp, &logs.join("control-plane"))
    {
        println!("could not keep the control-plane logs: {e:#}");
    }
    drop(cp);
    let leftovers = env::await_no_process(&[logs, &run_dir], Duration::from_secs(10)).await;
    if leftovers.is_empty() {
        println!("process check: no process of the suite is left");
    } else {
        failed += 1;
        println!("process check FAILED: {} processes left:", leftovers.len());
        for p in &leftovers {
            println!("  {} {}", p.pid, p.cmdline);
        }
    }
    let passed = match &results {
        Ok(n) => selected.len() - n,
        Err(_) => 0,
    };
    println!(
        "{passed} passed, {} failed (wall time {:.0}s)",
        selected.len() - passed,
        began.elapsed().as_secs_f64()
    );
    results.map(|_| failed)
}

/// Runs each scenario and prints its line; returns the number of failures.
async fn run_all(
    cp: &ControlPlane,
    bins: &Binaries,
    selected: &[Scenario],
    logs: &Path,
) -> Result<usize> {
    let mut failed = 0;
    for &s in selected {
        let began = Instant::now();
        let result = run_one(cp, bins, s, logs).await;
        let secs = began.elapsed().as_secs_f64();
        match result {
            Ok(detail) => println!("PASS {:<20} {secs:>5.1}s  {detail}", s.name()),
            Err(e) => {
                failed += 1;
                println!("FAIL {:<20} {secs:>5.1}s  {e:#}", s.name());
                println!(
                    "     logs of {}: {}",
                    s.name(),
                    scenario_dir(logs, s).display()
                );
            }
        }
    }
    Ok(failed)
}

fn scenario_dir(logs: &Path, s: Scenario) -> PathBuf {
    logs.join(s.name())
}

/// Sets up the scenario's world, runs it within [`SCENARIO_TIMEOUT`], and cleans up.
async fn run_one(cp: &ControlPlane, bins: &Binaries, s: Scenario, logs: &Path) -> Result<String> {
    let mut ctx = Ctx::new(cp, bins, s.name(), logs).await?;
    let result = tokio::time::timeout(SCENARIO_TIMEOUT, s.run(&mut ctx)).await;
    ctx.cleanup().await;
    match result {
        Ok(r) => r,
        Err(_) => bail!("timed out after {SCENARIO_TIMEOUT:?}"),
    }
}
