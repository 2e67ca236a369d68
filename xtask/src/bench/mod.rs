//! `cargo xtask bench`: the project's benchmarks.
//!
//! - `drain` (also what `cargo xtask bench` alone runs): the drain benchmark of `mcm-drain`.
//! - `scale`, `scale-down`, `rollout`, `soak`: both controllers (release builds, separate
//!   processes) against a real control plane, with kwok keeping the Nodes of N machines Ready;
//!   requests counted at the API server from its audit log. See docs/benchmarks.md.

mod audit;
mod drain;
mod report;
mod scale;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};

/// `cargo xtask bench [which]`.
#[derive(Debug, Args)]
pub struct Bench {
    /// Which benchmark (default: drain).
    #[command(subcommand)]
    which: Option<Which>,
}

#[derive(Debug, Subcommand)]
enum Which {
    /// Drain of a node with 50 pods with volumes, serial and parallel (mcm-drain).
    Drain,
    /// Scale a MachineDeployment 0 -> N, then measure the controllers idle at N.
    Scale(ScaleArgs),
    /// Scale 0 -> N, N -> 0, and 0 -> N again (the re-scale right after a scale-down).
    ScaleDown(ScaleArgs),
    /// Scale 0 -> N, then a rolling update of all N with --max-surge and maxUnavailable 0.
    Rollout(ScaleArgs),
    /// Churn: 0 -> N -> 0, --cycles times; the controllers' resident memory after each cycle
    /// (fails when the last is more than 10 % above the first).
    Soak(ScaleArgs),
}

/// What runs a machine's Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VmKind {
    /// Records plus Nodes kept Ready by kwok (thousands fit one machine).
    Kwok,
    /// `local-node` processes (~20 MiB each).
    Process,
}

/// Settings of the scale benchmarks.
#[derive(Debug, Clone, Args)]
pub struct ScaleArgs {
    /// Machines (default 1000; 100 for rollout).
    #[arg(long)]
    pub machines: Option<usize>,
    /// `--kube-api-qps` of both controllers (MCM's default).
    #[arg(long, default_value_t = 20.0)]
    pub qps: f32,
    /// `--kube-api-burst` of both controllers (MCM's default).
    #[arg(long, default_value_t = 30)]
    pub burst: u32,
    /// `--concurrent-syncs` of both controllers (default: the binaries' own).
    #[arg(long)]
    pub concurrent_syncs: Option<u16>,
    /// A further flag for both controllers (repeatable), e.g.
    /// `--controller-arg=--machine-safety-overshooting-period=5s`.
    #[arg(long = "controller-arg", allow_hyphen_values = true)]
    pub controller_args: Vec<String>,
    /// An environment variable for both controllers (repeatable), `KEY=VALUE`; `{name}` in
    /// the value becomes `manager` or `machine-controller`. For profilers, e.g. heaptrack:
    /// `--controller-env LD_PRELOAD=/usr/lib/heaptrack/libheaptrack_preload.so
    /// --controller-env 'DUMP_HEAPTRACK_OUTPUT=/tmp/{name}.raw'`.
    #[arg(long = "controller-env", value_parser = parse_env)]
    pub controller_env: Vec<(String, String)>,
    /// Rollout: the deployment's maxSurge, a number or a percentage of the machines (`10%`,
    /// rounded up as Kubernetes does); maxUnavailable is 0.
    #[arg(long, default_value = "10", value_parser = parse_surge)]
    pub max_surge: Surge,
    /// Soak: how many times 0 -> N -> 0.
    #[arg(long, default_value_t = 10)]
    pub cycles: usize,
    /// What runs the Nodes.
    #[arg(long, value_enum, default_value = "kwok")]
    pub vms: VmKind,
    /// Seconds the controllers are watched idle after the scale-up (`scale` only).
    #[arg(long, default_value_t = 60)]
    pub idle_seconds: u64,
    /// Seconds a phase may take before the benchmark fails.
    #[arg(long, default_value_t = 3600)]
    pub phase_timeout: u64,
    /// Print the results as JSON on stdout (progress and logs go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot of Running machines and Ready Nodes over time to this file (default
    /// `<target>/bench/<bench>-<N>.svg`).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Keep the logs directory.
    #[arg(long)]
    pub keep_logs: bool,
    /// Fail (after printing the results) when a phase took longer than this many times the
    /// bound its QPS budget sets: a stall, such as a scale-up queued behind a scale-down,
    /// shows as a ratio far above 1 whatever the machine's speed.
    #[arg(long)]
    pub max_bound_ratio: Option<f64>,
    /// Fail (after printing the results) when a phase sent more requests per machine than
    /// its path's target: creation 6, deletion 8, replacement (rollout, rescale) 14.
    #[arg(long)]
    pub check_request_targets: bool,
    /// Fail (after printing the results) when the phase sent more requests per machine than
    /// `N`: `--max-requests-per-machine scale-down=16.5` (repeatable). A regression guard at
    /// the figures reached so far, where the targets are not met yet.
    #[arg(long = "max-requests-per-machine", value_parser = parse_phase_limit)]
    pub max_requests_per_machine: Vec<(String, f64)>,
    /// Build the binaries in the `fast-release` profile (no LTO): for short runs that check
    /// ratios and requests; peak RSS is a release build's only in the default profile.
    #[arg(long, conflicts_with = "dev_build")]
    pub fast_build: bool,
    /// Use the `dev`-profile binaries (unoptimised; what `cargo xtask test` builds): for CI's
    /// short runs, which check bound ratios and requests per machine, not CPU or RSS.
    #[arg(long)]
    pub dev_build: bool,
    /// Build the controllers as the images ship them: static binaries for
    /// `x86_64-unknown-linux-musl`, with musl's allocator instead of glibc's (resident memory
    /// differs; needs musl-gcc, as `cargo xtask image` does).
    #[arg(long, conflicts_with = "dev_build")]
    pub musl: bool,
}

/// A rollout's maxSurge: a count or a percentage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Surge {
    /// Machines.
    Count(u32),
    /// Percent of the machines.
    Percent(u32),
}

impl Surge {
    /// The machines it allows above `n` (a percentage rounded up, at least 1).
    pub fn of(self, n: usize) -> usize {
        match self {
            Surge::Count(c) => c as usize,
            Surge::Percent(p) => (n * p as usize).div_ceil(100),
        }
        .max(1)
    }

    /// As the MachineDeployment's `maxSurge` (an int or a string with `%`).
    pub fn to_json(self) -> serde_json::Value {
        match self {
            Surge::Count(c) => serde_json::json!(c),
            Surge::Percent(p) => serde_json::json!(format!("{p}%")),
        }
    }
}

/// Parses `10` or `10%`.
fn parse_surge(value: &str) -> Result<Surge, String> {
    let (digits, percent) = match value.trim().strip_suffix('%') {
        Some(d) => (d, true),
        None => (value.trim(), false),
    };
    let n: u32 = digits
        .parse()
        .map_err(|e| format!("{value:?} is not a number or a percentage: {e}"))?;
    Ok(if percent {
        Surge::Percent(n)
    } else {
        Surge::Count(n)
    })
}

/// Parses `phase=N` (a phase name and a number of requests per machine).
fn parse_phase_limit(value: &str) -> Result<(String, f64), String> {
    let (phase, n) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not phase=N"))?;
    let n: f64 = n
        .trim()
        .parse()
        .map_err(|e| format!("{value:?}: {n:?} is no number: {e}"))?;
    Ok((phase.trim().to_owned(), n))
}

/// Parses `KEY=VALUE` (an environment variable for the controllers).
fn parse_env(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((key, v)) if !key.is_empty() => Ok((key.to_owned(), v.to_owned())),
        _ => Err(format!("{value:?} is not KEY=VALUE")),
    }
}

/// The controller `name`'s value of a `--controller-env` variable: `{name}` replaced.
pub(crate) fn env_value_for(value: &str, name: &str) -> String {
    value.replace("{name}", name)
}

/// Runs the chosen benchmark.
pub fn run(bench: Bench) -> Result<()> {
    match bench.which.unwrap_or(Which::Drain) {
        Which::Drain => drain::run(),
        Which::Scale(args) => scale::run(scale::Kind::Scale, args),
        Which::ScaleDown(args) => scale::run(scale::Kind::ScaleDown, args),
        Which::Rollout(args) => scale::run(scale::Kind::Rollout, args),
        Which::Soak(args) => scale::run(scale::Kind::Soak, args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_env_is_key_equals_value_with_the_controllers_name_filled_in() {
        let (key, value) = parse_env("DUMP_HEAPTRACK_OUTPUT=/tmp/{name}.raw").unwrap();
        assert_eq!(key, "DUMP_HEAPTRACK_OUTPUT");
        assert_eq!(env_value_for(&value, "manager"), "/tmp/manager.raw");
        assert_eq!(
            env_value_for(&value, "machine-controller"),
            "/tmp/machine-controller.raw"
        );
        // A value may hold '=' and may be empty; a key may not.
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert_eq!(parse_env("A=").unwrap(), ("A".into(), String::new()));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("no-equals").is_err());
    }

    #[test]
    fn a_surge_is_a_count_or_a_percentage_rounded_up() {
        assert_eq!(parse_surge("10"), Ok(Surge::Count(10)));
        assert_eq!(parse_surge("10%"), Ok(Surge::Percent(10)));
        assert!(parse_surge("ten").is_err());
        assert_eq!(Surge::Percent(10).of(1000), 100);
        assert_eq!(Surge::Percent(10).of(15), 2);
        assert_eq!(Surge::Count(0).of(100), 1);
        assert_eq!(Surge::Percent(10).to_json(), serde_json::json!("10%"));
        assert_eq!(Surge::Count(5).to_json(), serde_json::json!(5));
    }
}
