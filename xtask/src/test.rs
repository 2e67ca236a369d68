//! `cargo xtask test`: the workspace's tests, with the test binaries run side by side.
//!
//! Most integration tests wait on a control plane and on controllers, not on a CPU: run one
//! after another (as `cargo test` runs them), the suite's wall time is the sum of all the
//! waiting. Each test binary starts its own control plane (one per process), so binaries
//! share nothing but the machine and can run at once. The binaries are built first
//! (`cargo test --no-run`), then run `--jobs` at a time, the slowest of the previous run
//! first, each from its package's directory as `cargo test` runs it. A binary's output is
//! printed whole when it fails; each one's result line and duration always.
//!
//! The end-to-end scenarios (`cargo xtask e2e`) run as more jobs, in shards on control planes
//! of their own (`--shard K/N`), their output printed whole. With arguments (`cargo xtask test
//! -p mcm-api some_test`) it is plain `cargo test` with those arguments, without the scenarios.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::e2e::env::{cargo_command, command_without_cargo_run_env, target_dir};

/// How many parts the end-to-end scenarios run in (`cargo xtask e2e --shard K/N`).
const E2E_SHARDS: usize = 2;

/// One thing to run: a test binary, the workspace's doc tests, or a shard of the end-to-end
/// scenarios.
#[derive(Debug, Clone)]
struct Job {
    /// `package tests/file.rs`, `package (lib)`, or `doc tests`: the key of its duration.
    label: String,
    /// What runs, from where, with which package variables.
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    package: Option<String>,
    /// Print its whole output even when it passes.
    verbose: bool,
}

/// What one job did.
#[derive(Debug)]
struct Outcome {
    label: String,
    took: Duration,
    passed: bool,
    /// The `test result:` lines of its output.
    results: Vec<String>,
}

/// The part of cargo's JSON messages this reads.
#[derive(Deserialize)]
struct Message {
    reason: String,
    #[serde(default)]
    executable: Option<PathBuf>,
    #[serde(default)]
    profile: Option<ArtifactProfile>,
    #[serde(default)]
    target: Option<Target>,
    #[serde(default)]
    manifest_path: Option<PathBuf>,
}

#[derive(Deserialize)]
struct ArtifactProfile {
    test: bool,
}

#[derive(Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
    src_path: PathBuf,
}

/// Runs the suite: `cargo test` with `args` when there are any, else every test binary of
/// the workspace `jobs` at a time and the doc tests.
pub fn run(args: &[String], jobs: usize) -> Result<()> {
    if !args.is_empty() {
        let status = cargo_command()
            .current_dir(crate::crds::workspace_root())
            .args(["test", "--workspace", "--locked"])
            .args(args)
            .status()?;
        if !status.success() {
            bail!("cargo test failed ({status})");
        }
        return Ok(());
    }
    let began = Instant::now();
    let mut queue = test_binaries()?;
    let cargo: PathBuf = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| "cargo".into());
    queue.push(Job {
        label: "doc tests".into(),
        program: cargo.clone(),
        args: ["test", "--workspace", "--locked", "--doc"]
            .map(String::from)
            .to_vec(),
        dir: crate::crds::workspace_root(),
        package: None,
        verbose: false,
    });
    // The end-to-end scenarios (`cargo xtask e2e`) are more jobs, in shards: each its own
    // control plane, both controllers as processes; they mostly wait on the timeouts they
    // exercise, and one after another they were the suite's longest job by far. Through
    // cargo: the build above replaced this very binary.
    // A scenario that runs alone (the chart's, the longest) is a job of its own.
    let e2e = |label: String, selection: [&str; 2]| Job {
        label,
        program: cargo.clone(),
        args: [
            "run",
            "--quiet",
            "--locked",
            "--package",
            "xtask",
            "--",
            "e2e",
        ]
        .into_iter()
        .chain(selection)
        .map(String::from)
        .collect(),
        dir: crate::crds::workspace_root(),
        package: None,
        verbose: true,
    };
    for shard in crate::e2e::Shard::all(E2E_SHARDS) {
        let label = format!("end-to-end scenarios {shard}");
        queue.push(e2e(label, ["--shard", &shard.to_string()]));
    }
    let alone = crate::e2e::alone();
    for s in &alone {
        let label = format!("end-to-end scenario {}", s.name());
        queue.push(e2e(label, ["--scenario", s.name()]));
    }
    let history = durations_file();
    let before = read_durations(&history);
    order_slowest_first(&mut queue, &before);
    let jobs = jobs.max(1);
    println!(
        "running {} test binaries, the doc tests and the end-to-end scenarios ({E2E_SHARDS} parts and {} alone), {jobs} at a time",
        queue.len() - 1 - E2E_SHARDS - alone.len(),
        alone.len()
    );
    let queue = Mutex::new(VecDeque::from(queue));
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while let Some(job) = pop(&queue) {
                    let outcome = run_job(&job);
                    outcomes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(outcome);
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    // This run's jobs only: a job that no longer exists (a test file removed, the scenarios
    // split into shards) leaves no entry behind.
    let after: BTreeMap<String, f64> = outcomes
        .iter()
        .map(|o| (o.label.clone(), o.took.as_secs_f64()))
        .collect();
    let _ = std::fs::write(
        &history,
        serde_json::to_string_pretty(&after).unwrap_or_default(),
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| o.label.as_str())
        .collect();
    let busy: f64 = outcomes.iter().map(|o| o.took.as_secs_f64()).sum();
    let tests: u64 = outcomes
        .iter()
        .flat_map(|o| &o.results)
        .map(|r| passed_count(r))
        .sum();
    println!(
        "{} jobs in {:.0}s ({busy:.0}s of test time, {jobs} at a time): {tests} tests passed, {} job(s) failed",
        outcomes.len(),
        began.elapsed().as_secs_f64(),
        failed.len()
    );
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

fn pop(queue: &Mutex<VecDeque<Job>>) -> Option<Job> {
    queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
}

/// Builds every test target of the workspace and returns its binaries.
fn test_binaries() -> Result<Vec<Job>> {
    let root = crate::crds::workspace_root();
    let out = cargo_command()
        .current_dir(&root)
        .args([
            "test",
            "--workspace",
            "--locked",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed ({})", out.status);
    }
    let mut jobs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(m) = serde_json::from_str::<Message>(line) else {
            continue;
        };
        if m.reason != "compiler-artifact" || !m.profile.is_some_and(|p| p.test) {
            continue;
        }
        let (Some(exe), Some(target), Some(manifest)) = (m.executable, m.target, m.manifest_path)
        else {
            continue;
        };
        let dir = manifest.parent().unwrap_or(&root).to_path_buf();
        let package = package_name(&manifest).unwrap_or_else(|| target.name.clone());
        jobs.push(Job {
            label: label(&package, &target, &dir),
            program: exe,
            args: Vec::new(),
            dir,
            package: Some(package),
            verbose: false,
        });
    }
    if jobs.is_empty() {
        bail!("cargo test --no-run reported no test binary");
    }
    Ok(jobs)
}

/// `package tests/file.rs` for an integration test, `package (lib)` / `package (bin name)`
/// for unit tests.
fn label(package: &str, target: &Target, dir: &Path) -> String {
    if target.kind.iter().any(|k| k == "test") {
        let file = target
            .src_path
            .strip_prefix(dir)
            .unwrap_or(&target.src_path);
        format!("{package} {}", file.display())
    } else if target.kind.iter().any(|k| k == "bin") {
        format!("{package} (bin {})", target.name)
    } else {
        format!("{package} (lib)")
    }
}

/// The `name` of the `[package]` in a Cargo.toml.
fn package_name(manifest: &Path) -> Option<String> {
    let text = std::fs::read_to_string(manifest).ok()?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(rest) = line.strip_prefix("name") {
            let value = rest.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_string());
        }
    }
    None
}

/// Runs one job with its output in a file, and reports it.
fn run_job(job: &Job) -> Outcome {
    let began = Instant::now();
    let result = (|| -> Result<(bool, String)> {
        let mut log = tempfile::tempfile()?;
        let mut cmd: Command = command_without_cargo_run_env(&job.program);
        cmd.args(&job.args)
            .current_dir(&job.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?);
        if let Some(package) = &job.package {
            cmd.env("CARGO_MANIFEST_DIR", &job.dir)
                .env("CARGO_PKG_NAME", package);
        }
        let status = cmd
            .status()
            .with_context(|| format!("cannot run {}", job.program.display()))?;
        use std::io::{Read, Seek};
        log.rewind()?;
        let mut text = String::new();
        log.read_to_string(&mut text)?;
        Ok((status.success(), text))
    })();
    let took = began.elapsed();
    let (passed, text) = result.unwrap_or_else(|e| (false, format!("{e:#}")));
    let results: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("test result:"))
        .map(str::to_string)
        .collect();
    let summary = match results.as_slice() {
        [one] => one.clone(),
        [] => String::new(),
        many => format!("{} results, e.g. {}", many.len(), many[0]),
    };
    if passed && job.verbose {
        println!(
            "ok     {:>6.1}s  {}\n{text}--- end of {}",
            took.as_secs_f64(),
            job.label,
            job.label
        );
    } else if passed {
        println!(
            "ok     {:>6.1}s  {}  {summary}",
            took.as_secs_f64(),
            job.label
        );
    } else {
        println!(
            "FAILED {:>6.1}s  {}\n{text}\n--- end of {}",
            took.as_secs_f64(),
            job.label,
            job.label
        );
    }
    Outcome {
        label: job.label.clone(),
        took,
        passed,
        results,
    }
}

/// The `N` of `test result: ok. N passed; ...`.
fn passed_count(result: &str) -> u64 {
    result
        .split(';')
        .find_map(|part| part.trim().strip_suffix(" passed"))
        .and_then(|n| n.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The slowest of the last run first, so the long ones do not start last; binaries with no
/// figure yet count as slow.
fn order_slowest_first(jobs: &mut [Job], durations: &BTreeMap<String, f64>) {
    jobs.sort_by(|a, b| {
        let da = durations.get(&a.label).copied().unwrap_or(f64::INFINITY);
        let db = durations.get(&b.label).copied().unwrap_or(f64::INFINITY);
        db.total_cmp(&da).then_with(|| a.label.cmp(&b.label))
    });
}

fn durations_file() -> PathBuf {
    target_dir().join("xtask-test-durations.json")
}

fn read_durations(path: &Path) -> BTreeMap<String, f64> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(label: &str) -> Job {
        Job {
            label: label.into(),
            program: "x".into(),
            args: Vec::new(),
            dir: ".".into(),
            package: None,
            verbose: false,
        }
    }

    #[test]
    fn the_slowest_run_first_and_unknown_ones_before_them() {
        let mut jobs = vec![job("a"), job("b"), job("new"), job("c")];
        let durations = BTreeMap::from([
            ("a".to_string(), 3.0),
            ("b".to_string(), 70.0),
            ("c".to_string(), 10.0),
        ]);
        order_slowest_first(&mut jobs, &durations);
        let order: Vec<&str> = jobs.iter().map(|j| j.label.as_str()).collect();
        assert_eq!(order, ["new", "b", "c", "a"]);
    }

    #[test]
    fn passed_tests_are_counted_from_the_result_line() {
        let line = "test result: ok. 165 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.09s";
        assert_eq!(passed_count(line), 165);
        assert_eq!(passed_count("test result: FAILED. 0 passed; 1 failed"), 0);
    }

    #[test]
    fn the_package_name_is_read_from_its_section() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("Cargo.toml");
        std::fs::write(
            &manifest,
            "[package]\nname = \"mcm-api\"\nversion.workspace = true\n\n[dependencies]\nname = \"x\"\n",
        )
        .unwrap();
        assert_eq!(package_name(&manifest).as_deref(), Some("mcm-api"));
    }
}
