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

/// One of `count` parts of the suite (`--shard 1/2`): the scenarios whose place in
/// [`Scenario::ALL`] is `index - 1` modulo `count`. Parts run on control planes of their own,
/// so `cargo xtask test` runs them side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 1-based.
    index: usize,
    count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a shard: expected K/N with 1 <= K <= N, e.g. 1/2");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = k.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// The first of `count` shards, and so on: `Shard::all(2)` is 1/2 and 2/2.
    pub fn all(count: usize) -> Vec<Shard> {
        (1..=count).map(|index| Shard { index, count }).collect()
    }
}

/// The scenarios a run takes: one by name, a shard's, or all of them. Shards share the
/// scenarios that do not run [alone](Scenario::alone) among them.
fn selection(only: Option<Scenario>, shard: Option<Shard>) -> Vec<Scenario> {
    let in_shard = |i: usize, sh: Shard| i % sh.count == sh.index - 1;
    match shard {
        None => Scenario::ALL
            .iter()
            .filter(|s| only.is_none_or(|o| o == **s))
            .copied()
            .collect(),
        Some(sh) => Scenario::ALL
            .iter()
            .filter(|s| !s.alone())
            .enumerate()
            .filter(|&(i, s)| only.is_none_or(|o| o == *s) && in_shard(i, sh))
            .map(|(_, s)| *s)
            .collect(),
    }
}

/// The scenarios that run as jobs of their own, beside the shards.
pub fn alone() -> Vec<Scenario> {
    Scenario::ALL.into_iter().filter(|s| s.alone()).collect()
}

/// Runs the suite, one scenario, or a shard of the suite.
pub fn run(only: Option<Scenario>, shard: Option<Shard>, keep_logs: bool) -> Result<()> {
    env::plain_logs_for_children();
    let selected = selection(only, shard);
    if selected.is_empty() {
        // Only a named scenario outside the named shard selects nothing.
        let name = only.map_or("the scenario", Scenario::name);
        let shard = shard.map(|s| s.to_string()).unwrap_or_default();
        bail!("no scenario is selected: {name} is not in shard {shard}");
    }
    let bins = env::prepare_binaries()?;
    let stamp = jiff::Timestamp::now().as_second();
    // Shards and the scenarios run alone run at once: each its own directory, which the
    // process check looks in.
    let name = match (shard, only) {
        (Some(sh), _) => format!("run-{stamp}-shard-{}-of-{}", sh.index, sh.count),
        (None, Some(s)) => format!("run-{stamp}-{}", s.name()),
        (None, None) => format!("run-{stamp}"),
    };
    let logs = env::target_dir().join("e2e").join(name);
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
    // The chart scenario builds two container images first (minutes on a cold target).
    let limit = if s == Scenario::Chart {
        SCENARIO_TIMEOUT * 3
    } else {
        SCENARIO_TIMEOUT
    };
    let result = tokio::time::timeout(limit, s.run(&mut ctx)).await;
    ctx.cleanup().await;
    match result {
        Ok(r) => r,
        Err(_) => bail!("timed out after {limit:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_and_the_scenarios_run_alone_take_every_scenario_once() {
        assert_eq!(alone(), vec![Scenario::Chart]);
        for count in 1..=4 {
            let mut taken: Vec<Scenario> = Shard::all(count)
                .into_iter()
                .flat_map(|sh| selection(None, Some(sh)))
                .chain(alone())
                .collect();
            taken.sort_by_key(|s| s.name());
            let mut all = Scenario::ALL.to_vec();
            all.sort_by_key(|s| s.name());
            assert_eq!(taken, all, "{count} shards");
        }
        assert_eq!(selection(None, None), Scenario::ALL.to_vec());
        let first = selection(None, Some("1/2".parse().unwrap()));
        assert_eq!(first[0], Scenario::ALL[0]);
        assert_eq!(first[1], Scenario::ALL[2]);
    }

    #[test]
    fn a_scenario_outside_its_shard_is_not_selected() {
        let second = Scenario::ALL[1];
        assert_eq!(selection(Some(second), None), vec![second]);
        assert_eq!(
            selection(Some(second), Some("2/2".parse().unwrap())),
            vec![second]
        );
        assert!(selection(Some(second), Some("1/2".parse().unwrap())).is_empty());
    }

    #[test]
    fn shards_are_parsed_and_bad_ones_refused() {
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard { index: 2, count: 3 }));
        assert_eq!("2/3".parse::<Shard>().unwrap().to_string(), "2/3");
        for bad in ["0/2", "3/2", "1", "a/2", "1/0", ""] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains("K/N"), "{bad}: {e}");
        }
    }
}
