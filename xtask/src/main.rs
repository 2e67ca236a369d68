//! Project automation: `cargo xtask <command>`.

mod bench;
mod chaos;
mod chart;
mod crds;
mod demo;
mod deps;
mod e2e;
mod features;
mod image;
// The moto server and VM player of the AWS provider's tests, for the chart scenario's AWS part.
#[path = "../../providers/aws/tests/common/moto.rs"]
mod moto;
mod publish;
mod test;
mod testenv;
#[path = "../../providers/aws/tests/common/vm_player.rs"]
mod vm_player;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "mcm-rs project automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write the CRDs generated from mcm-api into deploy/crds (or check they are current).
    Crds {
        /// Fail instead of writing when a file differs.
        #[arg(long)]
        check: bool,
    },
    /// Lint (`helm lint --strict`) and render (`helm template`) the Helm chart in
    /// deploy/chart for every provider, container layout and certificate mode, with helm
    /// built from its Go module into the cache unless HELM names a binary; fails when the
    /// chart's copies of the CRDs or monitoring files differ from their sources.
    Chart {
        /// Write the rendered manifests of each case to DIR/<case>.yaml.
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
        /// Copy the CRDs and monitoring files into the chart instead of failing on a
        /// difference.
        #[arg(long)]
        sync: bool,
    },
    /// Build the test control plane (etcd, kube-apiserver, kube-controller-manager,
    /// kube-scheduler) from Go modules into the cache, unless it is there already.
    Testenv {
        /// Print `KUBEBUILDER_ASSETS=<dir>` on stdout.
        #[arg(long)]
        print_env: bool,
        /// Rebuild even when the cache is complete.
        #[arg(long)]
        force: bool,
    },
    /// Run the whole test suite: builds the control plane if needed (unless
    /// KUBEBUILDER_ASSETS names one) and helm (unless HELM names one), then every test
    /// binary of the workspace, the doc tests and the end-to-end scenarios, `--jobs` at a
    /// time. With arguments it is `cargo test --workspace <args>`.
    Test {
        /// Jobs run at once (each starts its own control plane; they mostly wait on it).
        /// Default: twice the CPUs, at most 8.
        #[arg(long)]
        jobs: Option<usize>,
        /// Extra arguments passed to `cargo test` (after `--`, e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Start a local cluster with both controllers, 3 local machines and a workload, and
    /// show them live until Ctrl-C (see docs/demo.md). Everything lives in `target/demo/`,
    /// or in the directory `$MCM_DEMO_DIR` names.
    Demo {
        /// Exit 0 once the machines are Running and the workload is available, non-zero
        /// after the timeout; clean up either way.
        #[arg(long)]
        exit_when_ready: bool,
        /// Seconds `--exit-when-ready` waits.
        #[arg(long, default_value_t = 180)]
        timeout: u64,
        /// Whose machine controller runs: `local` (VMs are processes running the workload)
        /// or `skeleton` (examples/provider-skeleton, an out-of-tree provider on mcm-core).
        #[arg(long, value_enum, default_value = "local")]
        provider: demo::Provider,
    },
    /// Run the end-to-end scenarios (control plane, both controllers, local VMs).
    E2e {
        /// Run only this scenario.
        #[arg(long, value_enum)]
        scenario: Option<e2e::Scenario>,
        /// Run one of N parts of the suite (K/N, e.g. 1/2), on its own control plane:
        /// `cargo xtask test` runs the parts side by side.
        #[arg(long, value_name = "K/N")]
        shard: Option<e2e::Shard>,
        /// Keep the logs directory even when every scenario passes.
        #[arg(long)]
        keep_logs: bool,
    },
    /// Run a benchmark: drain (the default), or scale / scale-down / rollout of N machines on
    /// kwok Nodes with requests counted at the API server (see docs/benchmarks.md).
    Bench(bench::Bench),
    /// Random SIGKILLs of the controllers during scale-up, scale-down, rollout and deletion,
    /// partitions, leader hand-overs, a rollout under injected cloud faults and a corpus of
    /// bad input, with invariants checked after every trial (see docs/reliability.md).
    Chaos(chaos::Plan),
    /// Build OCI images FROM scratch of static (musl) release binaries, without a container
    /// engine: machine-controller-manager, plus a provider's (--provider) or all (--all),
    /// written to target/images/<name>/ (layout) and <name>.tar (oci-archive), then verified
    /// and smoke-tested.
    Image(image::Args),
    /// Check that every debug build with xtask in it (`cargo xtask`, the binaries of the
    /// demo, the scenarios, chaos and the benchmarks) resolves its dependencies' features as
    /// the workspace's test build does, so one build of the dependency tree serves them all;
    /// with --write, regenerate xtask/features/Cargo.toml, which makes them so.
    Features {
        /// Regenerate the crate's manifest (and Cargo.lock) instead of checking.
        #[arg(long)]
        write: bool,
    },
    /// Check the dependency tree: no workspace dependency declared and unused, no more crates
    /// locked in several versions than `.ci/duplicate-crates-ceiling` allows, and every
    /// member's rust-version at least what its locked dependencies need.
    Deps,
    /// Package the library crates as `cargo publish` would (`--dry-run`) and check each one
    /// from its package alone, its dependencies' features resolved for it alone: what
    /// `cargo publish`'s own verification catches, without a debug build per crate.
    PublishCheck,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Crds { check } => crds::run(check),
        Cmd::Chart { out, sync } => chart::run(out, sync),
        Cmd::Testenv { print_env, force } => testenv::run(print_env, force),
        Cmd::Test { jobs, args } => test(jobs, &args),
        Cmd::Demo {
            exit_when_ready,
            timeout,
            provider,
        } => demo::run(
            exit_when_ready,
            std::time::Duration::from_secs(timeout),
            provider,
        ),
        Cmd::E2e {
            scenario,
            shard,
            keep_logs,
        } => e2e::run(scenario, shard, keep_logs),
        Cmd::Bench(b) => bench::run(b),
        Cmd::Chaos(plan) => chaos::run(&plan),
        Cmd::Image(args) => image::run(&args),
        Cmd::Features { write } => features::run(write),
        Cmd::Deps => deps::run(),
        Cmd::PublishCheck => publish::run(),
    }
}

fn test(jobs: Option<usize>, args: &[String]) -> Result<()> {
    if std::env::var_os(mcm_testenv::binaries::ASSETS_ENV).is_none() {
        testenv::run(false, false)?;
    }
    // The chart test renders with helm; it fails (never skips) without it.
    chart::ensure_helm()?;
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let jobs = jobs.unwrap_or((2 * cpus).min(8));
    test::run(args, jobs)
}
