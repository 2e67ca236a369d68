//! `cargo xtask chaos`: random SIGKILLs of the controllers and injected cloud faults against
//! a real control plane, both controller binaries and local VMs, with the invariants checked
//! after every trial (see docs/reliability.md).
//!
//! Each trial picks, from a seeded generator, an operation on a MachineDeployment (scale
//! up, scale down, roll out, delete and recreate), a victim (the machine controller, the
//! manager, or both) and a moment (0 to 2.5 s after the operation started). The victim is
//! SIGKILLed and restarted, and the system must converge: every Machine that should exist
//! Running with exactly one VM, no VM without a Machine, MachineSet and MachineDeployment
//! counters equal to what the API holds, no controller exited. The same seed replays the
//! same trials.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{DeleteParams, ListParams};
use mcm_api::{MachineDeployment, MachineSet};
use mcm_testenv::kit::{Proxy, metric};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::e2e::ctx::{Ctx, Timings, WAIT};
use crate::e2e::env::{self, Check, wait_for};

mod corpus;
mod handover;
mod zone;

/// The MachineDeployment every trial works on.
const DEPLOYMENT: &str = "workers";
/// The class of its machines.
const CLASS: &str = "local";
/// At most this many machines (and at least 2), so a run fits a laptop.
const MOST: i32 = 6;
/// Longest a trial may take to converge.
const CONVERGE: Duration = Duration::from_secs(150);

/// What a trial does to the MachineDeployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Operation {
    ScaleUp,
    ScaleDown,
    Rollout,
    DeleteAndRecreate,
}

/// Which controller a trial kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Victim {
    MachineController,
    Manager,
    Both,
}

/// One trial, as drawn from the seed.
#[derive(Debug, Clone, Copy)]
struct Trial {
    operation: Operation,
    victim: Victim,
    delay: Duration,
    /// Machines to add or remove (scale operations).
    step: i32,
}

impl Trial {
    fn draw(rng: &mut StdRng) -> Trial {
        let operation = match rng.random_range(0..4) {
            0 => Operation::ScaleUp,
            1 => Operation::ScaleDown,
            2 => Operation::Rollout,
            _ => Operation::DeleteAndRecreate,
        };
        let victim = match rng.random_range(0..3) {
            0 => Victim::MachineController,
            1 => Victim::Manager,
            _ => Victim::Both,
        };
        Trial {
            operation,
            victim,
            delay: Duration::from_millis(rng.random_range(0..2500)),
            step: rng.random_range(1..=2),
        }
    }

    /// The replicas wanted after the operation, from `replicas` before.
    fn replicas_after(&self, replicas: i32) -> i32 {
        match self.operation {
            Operation::ScaleUp => (replicas + self.step).min(MOST),
            Operation::ScaleDown => (replicas - self.step).max(2),
            Operation::Rollout | Operation::DeleteAndRecreate => replicas,
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
struct Report {
    /// When the run began (cut times are also printed relative to it).
    started: jiff::Timestamp,
    trials: usize,
    kills: usize,
    by_operation: BTreeMap<String, usize>,
    by_victim: BTreeMap<String, usize>,
    violations: Vec<String>,
    worst_convergence: Duration,
    faults_injected: f64,
    fault_run: Option<String>,
    idle: Option<String>,
    cuts: BTreeMap<String, usize>,
    freezes: usize,
    unfreezes: usize,
    handover: Option<handover::Figures>,
    corpus: Option<corpus::Figures>,
    zone: Option<zone::Figures>,
    /// Samples of the VMs per machine taken during the kill trials, and the moments in them
    /// when a machine had two VMs.
    vm_samples: usize,
    doubled_vms: usize,
    /// The AWS creation kills' outcome.
    aws_creation_kills: Option<String>,
    /// Errors of the harness itself (a wait that timed out, a failed request), each of which
    /// stopped the part it names; the other parts still ran.
    errors: Vec<String>,
}

impl Report {
    fn print(&self, seed: u64) {
        println!();
        println!("chaos report (seed {seed}; replay with --seed {seed})");
        println!("| what | figure |");
        println!("|---|---|");
        println!("| kill trials | {} |", self.trials);
        println!("| controller processes SIGKILLed | {} |", self.kills);
        println!(
            "| moments with two VMs for one machine (of {} samples during the kill trials) | {} |",
            self.vm_samples, self.doubled_vms
        );
        for (op, n) in &self.by_operation {
            println!("| trials during {op} | {n} |");
        }
        for (victim, n) in &self.by_victim {
            println!("| trials killing {victim} | {n} |");
        }
        if let Some(run) = &self.fault_run {
            println!("| cloud-fault run | {run} |");
            println!("| cloud faults injected | {} |", self.faults_injected);
        }
        for (path, n) in &self.cuts {
            println!("| cuts of the {path} API | {n} |");
        }
        if !self.cuts.is_empty() {
            println!(
                "| freezes / unfreezes reported | {} / {} |",
                self.freezes, self.unfreezes
            );
        }
        if let Some(h) = &self.handover {
            h.print();
        }
        if let Some(c) = &self.corpus {
            c.print();
        }
        if let Some(z) = &self.zone {
            z.print();
        }
        if let Some(idle) = &self.idle {
            println!("| machine controller while idle | {idle} |");
        }
        if let Some(aws) = &self.aws_creation_kills {
            println!("| AWS creation kills | {aws} |");
        }
        println!("| invariant violations | {} |", self.violations.len());
        println!("| harness errors | {} |", self.errors.len());
        println!(
            "| worst convergence | {:.1}s |",
            self.worst_convergence.as_secs_f64()
        );
        for v in &self.violations {
            println!("violation: {v}");
        }
        for e in &self.errors {
            println!("harness error: {e}");
        }
    }
}

/// What a run does (`cargo xtask chaos --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct Plan {
    /// Kill trials.
    #[arg(long, default_value_t = 50)]
    pub trials: usize,
    /// Cuts of the machine controller's control or target API path.
    #[arg(long, default_value_t = 10)]
    pub partitions: usize,
    /// Leader hand-overs: two replicas of each binary with leader election, the leader
    /// SIGKILLed or paused at random.
    #[arg(long, default_value_t = 10)]
    pub handovers: usize,
    /// Zone partitions: the VMs of one of two zones SIGSTOPped beyond the health timeout;
    /// none of their machines may be failed, drained, deleted or replaced.
    #[arg(long, default_value_t = 3)]
    pub zone_partitions: usize,
    /// Machines of the rollout under cloud faults (0: skip it).
    #[arg(long, default_value_t = 30)]
    pub fault_machines: usize,
    /// SIGKILLs of `machine-controller-aws` right after a `RunInstances` reached EC2 (moto
    /// with EC2's describe lag), each checked for a second instance of one machine at any
    /// moment (0: skip them; the test suite runs 3).
    #[arg(long, default_value_t = 30)]
    pub aws_creation_kills: usize,
    /// Apply the bad-input corpus (`--corpus=false` skips it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub corpus: bool,
    /// Seed of the trials (printed; the same seed replays the same run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep the logs directory even when no invariant was violated.
    #[arg(long)]
    pub keep_logs: bool,
}

/// Runs the trials of `plan`: every part, whatever the others found, then the report. Fails
/// when an invariant was violated or a part stopped on an error of the harness.
pub fn run(plan: &Plan) -> Result<()> {
    env::plain_logs_for_children();
    let seed = plan
        .seed
        .unwrap_or_else(|| jiff::Timestamp::now().as_second().unsigned_abs());
    println!(
        "chaos: seed {seed}, {} kill trial(s), {} partition(s), {} zone partition(s), {} leader hand-over(s), cloud-fault run of {} machine(s), bad-input corpus: {}, AWS creation kills: {}",
        plan.trials,
        plan.partitions,
        plan.zone_partitions,
        plan.handovers,
        plan.fault_machines,
        plan.corpus,
        plan.aws_creation_kills
    );
    let mut report = Report {
        started: jiff::Timestamp::now(),
        ..Report::default()
    };
    let (logs, interrupted) = if Part::ALL.iter().any(|p| p.planned(plan)) {
        local_parts(plan, seed, &mut report)
    } else {
        (None, false)
    };
    if interrupted {
        println!("chaos: interrupted, the AWS creation kills do not run");
    } else {
        aws_creation_kills(plan.aws_creation_kills, &mut report);
    }
    report.print(seed);
    let failed = !report.violations.is_empty() || !report.errors.is_empty();
    if let Some(logs) = logs {
        if failed || plan.keep_logs {
            println!("logs: {}", logs.display());
        } else {
            let _ = std::fs::remove_dir_all(&logs);
        }
    }
    if failed {
        bail!(
            "{} invariant violation(s), {} harness error(s)",
            report.violations.len(),
            report.errors.len()
        );
    }
    Ok(())
}

/// The parts against a local control plane ([`suite`]). Returns the logs directory, once
/// made, and whether Ctrl-C interrupted the run; errors are recorded in `report`.
fn local_parts(plan: &Plan, seed: u64, report: &mut Report) -> (Option<PathBuf>, bool) {
    let bins = match env::prepare_binaries() {
        Ok(bins) => bins,
        Err(e) => {
            report
                .errors
                .push(format!("local parts: preparing the binaries: {e:#}"));
            return (None, false);
        }
    };
    let stamp = jiff::Timestamp::now().as_second();
    let logs = env::target_dir().join("chaos").join(format!("run-{stamp}"));
    if let Err(e) = std::fs::create_dir_all(&logs) {
        report
            .errors
            .push(format!("local parts: creating {}: {e}", logs.display()));
        return (None, false);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            report
                .errors
                .push(format!("local parts: starting a runtime: {e}"));
            return (Some(logs), false);
        }
    };
    let interrupted = runtime.block_on(async {
        let cp = match env::start_control_plane(plan.handovers > 0).await {
            Ok(cp) => cp,
            Err(e) => {
                report
                    .errors
                    .push(format!("local parts: starting the control plane: {e:#}"));
                return false;
            }
        };
        let interrupted = tokio::select! {
            () = suite(&cp, &bins, &logs, seed, plan, report) => false,
            _ = tokio::signal::ctrl_c() => true,
        };
        if interrupted {
            report.errors.push("interrupted (Ctrl-C)".into());
        }
        if !report.errors.is_empty() || !report.violations.is_empty() {
            let _ = env::preserve_control_plane_logs(&cp, &logs.join("control-plane"));
        }
        let run_dir = cp.run_dir().to_path_buf();
        drop(cp);
        let leftovers = env::await_no_process(&[&logs, &run_dir], Duration::from_secs(10)).await;
        if !leftovers.is_empty() {
            report
                .violations
                .push(format!("processes left behind: {leftovers:?}"));
        }
        interrupted
    });
    (Some(logs), interrupted)
}

/// The creation crash trial of the AWS provider against moto
/// (`bins/machine-controller-aws/tests/e2e.rs`), with `kills` SIGKILLs (none: skipped).
fn aws_creation_kills(kills: usize, report: &mut Report) {
    if kills == 0 {
        return;
    }
    println!("chaos: {kills} SIGKILL(s) of machine-controller-aws right after RunInstances");
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "test",
            "--locked",
            "-p",
            "machine-controller-aws",
            "--test",
            "e2e",
            "--",
            "--exact",
            "sigkills_after_run_instances_never_make_a_second_instance",
            "--nocapture",
        ])
        .env("MCM_AWS_CREATION_KILLS", kills.to_string())
        .status();
    match status {
        Ok(status) if status.success() => {
            report.aws_creation_kills = Some(format!("{kills} SIGKILLs, passed"));
        }
        Ok(status) => {
            report.aws_creation_kills = Some(format!("{kills} SIGKILLs, failed ({status})"));
            report.violations.push(format!(
                "AWS creation kills: the trial failed ({status}), its output is above"
            ));
        }
        Err(e) => report
            .errors
            .push(format!("AWS creation kills: running cargo test: {e}")),
    }
}

/// A part of the run against the local control plane, in a namespace of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Partitions,
    ZonePartitions,
    Kills,
    Handovers,
    Corpus,
    Faults,
}

impl Part {
    /// Every part, in the order they run.
    const ALL: [Part; 6] = [
        Part::Partitions,
        Part::ZonePartitions,
        Part::Kills,
        Part::Handovers,
        Part::Corpus,
        Part::Faults,
    ];

    fn name(self) -> &'static str {
        match self {
            Part::Partitions => "partitions",
            Part::ZonePartitions => "zone partitions",
            Part::Kills => "kill trials",
            Part::Handovers => "leader hand-overs",
            Part::Corpus => "bad-input corpus",
            Part::Faults => "cloud-fault run",
        }
    }

    fn namespace(self) -> &'static str {
        match self {
            Part::Partitions => "chaos-partition",
            Part::ZonePartitions => "chaos-zone",
            Part::Kills => "chaos-kill",
            Part::Handovers => "chaos-leader",
            Part::Corpus => "chaos-corpus",
            Part::Faults => "chaos-faults",
        }
    }

    /// Whether `plan` asks for this part.
    fn planned(self, plan: &Plan) -> bool {
        match self {
            Part::Partitions => plan.partitions > 0,
            Part::ZonePartitions => plan.zone_partitions > 0,
            Part::Kills => plan.trials > 0,
            Part::Handovers => plan.handovers > 0,
            Part::Corpus => plan.corpus,
            Part::Faults => plan.fault_machines > 0,
        }
    }

    async fn run(
        self,
        ctx: &mut Ctx<'_>,
        seed: u64,
        plan: &Plan,
        report: &mut Report,
    ) -> Result<()> {
        match self {
            Part::Partitions => partition_trials(ctx, seed, plan.partitions, report).await,
            Part::ZonePartitions => {
                let figures = report.zone.insert(zone::Figures::default());
                zone::trials(
                    ctx,
                    seed,
                    plan.zone_partitions,
                    figures,
                    &mut report.violations,
                )
                .await
            }
            Part::Kills => kill_trials(ctx, seed, plan.trials, report).await,
            Part::Handovers => handover::trials(ctx, seed, plan.handovers, report).await,
            Part::Corpus => corpus::run(ctx, report).await,
            Part::Faults => fault_run(ctx, seed, plan.fault_machines, report).await,
        }
    }
}

/// Runs every planned part. A part stopped by an error of the harness (a wait that timed out,
/// a failed request) is recorded as such, and the next part still runs; the violations a
/// part found are named after it.
async fn suite(
    cp: &mcm_testenv::ControlPlane,
    bins: &env::Binaries,
    logs: &Path,
    seed: u64,
    plan: &Plan,
    report: &mut Report,
) {
    for part in Part::ALL.into_iter().filter(|p| p.planned(plan)) {
        let violations = report.violations.len();
        let outcome = match Ctx::new(cp, bins, part.namespace(), logs).await {
            Ok(mut ctx) => {
                let outcome = part.run(&mut ctx, seed, plan, report).await;
                ctx.cleanup().await;
                outcome
            }
            Err(e) => Err(e.context("setting up its namespace")),
        };
        name_violations(&mut report.violations[violations..], part);
        if let Err(e) = outcome {
            println!(
                "chaos: {} stopped on an error of the harness (the other parts still run): {e:#}",
                part.name()
            );
            report.errors.push(format!("{}: {e:#}", part.name()));
        }
    }
}

/// Prefixes each of `found` (the violations of `part`) with the part's name.
fn name_violations(found: &mut [String], part: Part) {
    for v in found {
        *v = format!("{}: {v}", part.name());
    }
}

fn timings() -> Timings {
    Timings {
        orphan_period: "5s",
        ..Timings::default()
    }
}

async fn kill_trials(
    ctx: &mut Ctx<'_>,
    seed: u64,
    trials: usize,
    report: &mut Report,
) -> Result<()> {
    let violations = report.violations.len();
    let mut rng = StdRng::seed_from_u64(seed);
    ctx.create_class(CLASS, json!({})).await?;
    ctx.start_controllers(&timings(), None).await?;
    let replicas = 3;
    ctx.create_deployment(DEPLOYMENT, replicas, CLASS).await?;
    ctx.await_fleet(replicas as usize, None).await?;
    // Sampled all along, not only after each trial: a second VM that a later deletion
    // removes would be invisible at the end.
    let sampler = VmSampler::start(ctx.state.root().to_path_buf());
    let outcome = run_kill_trials(ctx, &mut rng, trials, replicas, report).await;
    let (samples, doubled) = sampler.stop().await;
    report.vm_samples += samples;
    report.doubled_vms += doubled.len();
    report.violations.extend(
        doubled
            .into_iter()
            .map(|d| format!("two VMs for one machine: {d}")),
    );
    outcome?;
    // Idle is measured on a converged system only (the earlier parts' violations do not
    // matter here).
    if report.violations.len() == violations {
        idle_requests(ctx, report).await?;
    }
    Ok(())
}

/// Samples the live VMs of a state directory every 100 ms and keeps the moments when a
/// machine had more than one.
struct VmSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl VmSampler {
    fn start(root: std::path::PathBuf) -> VmSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::task::spawn_blocking(move || {
            let (mut samples, mut doubled) = (0, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                for (machine, n) in env::vm_processes_per_machine(&root) {
                    if n > 1 {
                        doubled.push(format!("{machine} had {n} live VMs"));
                    }
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            (samples, doubled)
        });
        VmSampler { stop, task }
    }

    async fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.unwrap_or_default()
    }
}

async fn run_kill_trials(
    ctx: &mut Ctx<'_>,
    rng: &mut StdRng,
    trials: usize,
    mut replicas: i32,
    report: &mut Report,
) -> Result<()> {
    // The template revision of the last rollout (a recreated deployment has none).
    let mut rev: Option<String> = None;
    for i in 0..trials {
        let trial = Trial::draw(rng);
        let began = Instant::now();
        replicas = trial.replicas_after(replicas);
        println!(
            "trial {:>3}: {:?} to {replicas}, SIGKILL {:?} after {}ms",
            i + 1,
            trial.operation,
            trial.victim,
            trial.delay.as_millis()
        );
        operate(ctx, &trial, i, replicas).await?;
        tokio::time::sleep(trial.delay).await;
        report.kills += kill(ctx, trial.victim)?;
        restart(ctx, trial.victim).await?;
        if trial.operation == Operation::DeleteAndRecreate {
            recreate(ctx, replicas).await?;
            rev = None;
        }
        if trial.operation == Operation::Rollout {
            rev = Some(i.to_string());
        }
        let took = match converge(ctx, replicas, rev.as_deref()).await {
            Ok(()) => began.elapsed(),
            Err(e) => {
                report
                    .violations
                    .push(format!("trial {} ({trial:?}): {e:#}", i + 1));
                // Later trials need a converged system: this part stops here (the other
                // parts still run).
                break;
            }
        };
        report.worst_convergence = report.worst_convergence.max(took);
        report.trials += 1;
        *report
            .by_operation
            .entry(format!("{:?}", trial.operation))
            .or_default() += 1;
        *report
            .by_victim
            .entry(format!("{:?}", trial.victim))
            .or_default() += 1;
        println!("           converged in {:.1}s", took.as_secs_f64());
    }
    Ok(())
}

/// Starts the trial's operation.
async fn operate(ctx: &Ctx<'_>, trial: &Trial, index: usize, replicas: i32) -> Result<()> {
    match trial.operation {
        Operation::ScaleUp | Operation::ScaleDown => {
            ctx.patch_deployment(DEPLOYMENT, json!({ "spec": { "replicas": replicas } }))
                .await
        }
        Operation::Rollout => {
            let labels = json!({ "rev": index.to_string() });
            ctx.patch_deployment(
                DEPLOYMENT,
                json!({ "spec": { "template": { "metadata": { "labels": labels } } } }),
            )
            .await
        }
        Operation::DeleteAndRecreate => {
            let api: kube::Api<MachineDeployment> =
                kube::Api::namespaced(ctx.client.clone(), &ctx.ns);
            api.delete(DEPLOYMENT, &DeleteParams::foreground())
                .await
                .context("deleting the MachineDeployment")?;
            Ok(())
        }
    }
}

/// SIGKILLs the victim(s); returns how many processes were killed.
fn kill(ctx: &mut Ctx<'_>, victim: Victim) -> Result<usize> {
    Ok(match victim {
        Victim::MachineController => {
            ctx.kill_machine_controller()?;
            1
        }
        Victim::Manager => {
            ctx.kill_manager()?;
            1
        }
        Victim::Both => {
            ctx.kill_machine_controller()?;
            ctx.kill_manager()?;
            2
        }
    })
}

async fn restart(ctx: &mut Ctx<'_>, victim: Victim) -> Result<()> {
    if matches!(victim, Victim::Manager | Victim::Both) {
        ctx.start_manager(&timings()).await?;
    }
    if matches!(victim, Victim::MachineController | Victim::Both) {
        ctx.start_machine_controller(&timings(), None).await?;
    }
    Ok(())
}

/// Waits for the deleted MachineDeployment to be gone with all its machines and VMs, then
/// creates it again.
async fn recreate(ctx: &Ctx<'_>, replicas: i32) -> Result<()> {
    let api: kube::Api<MachineDeployment> = kube::Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for(
        "the MachineDeployment, its machines and VMs to be gone",
        CONVERGE,
        || async {
            let left = ctx.machines().await?.len();
            let deployment = api.get_opt(DEPLOYMENT).await?.is_some();
            let vms = ctx.vm_records().len();
            Ok(if left == 0 && !deployment && vms == 0 {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "deployment present: {deployment}, {left} machines, {vms} VM records"
                ))
            })
        },
    )
    .await?;
    ctx.create_deployment(DEPLOYMENT, replicas, CLASS).await
}

/// Waits for the fleet of `replicas` (all of template revision `rev` when given), then
/// checks the invariants.
async fn converge(ctx: &Ctx<'_>, replicas: i32, rev: Option<&str>) -> Result<()> {
    converge_fleet(ctx, replicas, rev).await?;
    controllers_alive(ctx)
}

/// [`converge`] without the check of the scenario's own controller processes.
async fn converge_fleet(ctx: &Ctx<'_>, replicas: i32, rev: Option<&str>) -> Result<()> {
    let n = usize::try_from(replicas).unwrap_or(0);
    if let Some(rev) = rev {
        wait_for(
            &format!("every machine at template revision {rev}"),
            CONVERGE,
            || async {
                let machines = ctx.machines().await?;
                let rolled = machines.iter().filter(|m| rev_of(m) == Some(rev)).count();
                Ok(if rolled == n && machines.len() == n {
                    Check::Done(())
                } else {
                    Check::Pending(format!("{rolled} of {} machines rolled", machines.len()))
                })
            },
        )
        .await?;
    }
    ctx.await_fleet(n, None).await?;
    one_vm_per_machine(ctx).await?;
    counters_match(ctx).await
}

/// The `rev` template label of a machine.
fn rev_of(m: &mcm_api::Machine) -> Option<&str> {
    m.metadata.labels.as_ref()?.get("rev").map(String::as_str)
}

/// Every Machine has exactly one VM record, and every VM record belongs to a Machine.
async fn one_vm_per_machine(ctx: &Ctx<'_>) -> Result<()> {
    let machines: BTreeSet<String> = ctx
        .machines()
        .await?
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    let mut per_machine = BTreeMap::<String, usize>::new();
    for name in ctx.vm_records() {
        *per_machine.entry(name).or_default() += 1;
    }
    let duplicated: Vec<_> = per_machine.iter().filter(|(_, n)| **n > 1).collect();
    let orphans: Vec<_> = per_machine
        .keys()
        .filter(|m| !machines.contains(*m))
        .collect();
    let missing: Vec<_> = machines
        .iter()
        .filter(|m| !per_machine.contains_key(*m))
        .collect();
    if !duplicated.is_empty() || !orphans.is_empty() || !missing.is_empty() {
        bail!(
            "VMs: duplicated {duplicated:?}, without a Machine {orphans:?}, Machines without a VM {missing:?}"
        );
    }
    Ok(())
}

/// MachineSet and MachineDeployment status counters equal what the API holds (they are
/// written after the machines change, so a short settling time is allowed).
async fn counters_match(ctx: &Ctx<'_>) -> Result<()> {
    let sets: kube::Api<MachineSet> = kube::Api::namespaced(ctx.client.clone(), &ctx.ns);
    let deployments: kube::Api<MachineDeployment> =
        kube::Api::namespaced(ctx.client.clone(), &ctx.ns);
    wait_for("status counters to match the API", WAIT, || async {
        let machines = ctx.machines().await?;
        let mut problems = Vec::new();
        let mut total = 0;
        for set in sets.list(&ListParams::default()).await?.items {
            let uid = set.metadata.uid.clone().unwrap_or_default();
            let owned = machines
                .iter()
                .filter(|m| {
                    mcm_api::owner::controller_of(&m.metadata).is_some_and(|o| o.uid == uid)
                })
                .count();
            let replicas = set.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            total += owned;
            if usize::try_from(replicas).ok() != Some(owned) {
                problems.push(format!(
                    "MachineSet {} says {replicas} replicas, {owned} machines",
                    set.metadata.name.clone().unwrap_or_default()
                ));
            }
        }
        for d in deployments.list(&ListParams::default()).await?.items {
            let status = d.status.clone().unwrap_or_default();
            let replicas = status.replicas.unwrap_or(0);
            let ready = status.ready_replicas.unwrap_or(0);
            let updated = status.updated_replicas.unwrap_or(0);
            let observed = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
            if usize::try_from(replicas).ok() != Some(total)
                || ready != replicas
                || updated != d.spec.replicas()
                || !observed
            {
                problems.push(format!(
                    "MachineDeployment {} says {replicas} replicas ({ready} ready, {updated} updated, generation observed: {observed}), {total} machines",
                    d.metadata.name.clone().unwrap_or_default()
                ));
            }
        }
        Ok(if problems.is_empty() {
            Check::Done(())
        } else {
            Check::Pending(problems.join("; "))
        })
    })
    .await
}

/// No controller exited on its own.
fn controllers_alive(ctx: &Ctx<'_>) -> Result<()> {
    all_alive([ctx.machine_controller()?, ctx.manager()?])
}

/// Each of `controllers` still runs; the error names the first that exited and its log.
fn all_alive<'c>(controllers: impl IntoIterator<Item = &'c env::Controller>) -> Result<()> {
    for c in controllers {
        if !c.is_running() {
            bail!(
                "{} (pid {}) exited; log {}",
                c.name,
                c.pid(),
                c.log().display()
            );
        }
    }
    Ok(())
}

/// The requests the machine controller sends per second when nothing changes: its two
/// API-server probes per status-check period (`--machine-safety-apiserver-statuscheck-period`,
/// 1 s here) and one LIST of Machines per class and orphan period (5 s here).
const IDLE_EXPECTED_PER_SECOND: f64 = 2.0 / 1.0 + 1.0 / 5.0;

/// Requests of the machine controller while nothing changes: no more than its periodic
/// checks explain, plus a little (no hot loop).
async fn idle_requests(ctx: &Ctx<'_>, report: &mut Report) -> Result<()> {
    const NAME: &str = "mcm_kube_client_requests_total";
    const WINDOW: Duration = Duration::from_secs(15);
    const SLACK: f64 = 5.0;
    // Let the last trial's status writes settle first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mc = ctx.machine_controller()?;
    let before = mc
        .metric(NAME)
        .await
        .context("the machine controller's request count")?;
    tokio::time::sleep(WINDOW).await;
    let after = mc
        .metric(NAME)
        .await
        .context("the machine controller's request count")?;
    let sent = after - before;
    let bound = IDLE_EXPECTED_PER_SECOND * WINDOW.as_secs_f64() + SLACK;
    println!(
        "idle: the machine controller sent {sent:.0} requests in {}s (periodic checks explain {:.0}; bound {bound:.0})",
        WINDOW.as_secs(),
        IDLE_EXPECTED_PER_SECOND * WINDOW.as_secs_f64()
    );
    report.idle = Some(format!(
        "{sent:.0} requests in {}s (bound {bound:.0})",
        WINDOW.as_secs()
    ));
    if sent > bound {
        report.violations.push(format!(
            "hot loop: the machine controller sent {sent:.0} requests in {}s while idle (bound {bound:.0})",
            WINDOW.as_secs()
        ));
    }
    Ok(())
}

/// A MachineDeployment of `n` machines created and rolled out while the driver fails 30 %
/// of its calls with `Unavailable` after 0-2 s of latency: it converges with no leaked and
/// no duplicated VM.
async fn fault_run(ctx: &mut Ctx<'_>, seed: u64, n: usize, report: &mut Report) -> Result<()> {
    ctx.machine_env = vec![
        (
            "MCM_DRIVER_FAULTS".into(),
            "all:rate=0.3,code=Unavailable,latency=0s..2s".into(),
        ),
        ("MCM_DRIVER_FAULTS_SEED".into(), seed.to_string()),
    ];
    ctx.create_class(CLASS, json!({})).await?;
    ctx.start_controllers(&timings(), None).await?;
    let began = Instant::now();
    let replicas = i32::try_from(n).unwrap_or(MOST);
    ctx.create_deployment(DEPLOYMENT, replicas, CLASS).await?;
    converge_slowly(ctx, replicas).await?;
    let created = began.elapsed();
    ctx.patch_deployment(
        DEPLOYMENT,
        json!({ "spec": { "template": { "metadata": { "labels": { "rev": "faults" } } } } }),
    )
    .await?;
    let rollout = Instant::now();
    wait_for("the rollout under cloud faults", CONVERGE * 4, || async {
        let machines = ctx.machines().await?;
        let new = machines
            .iter()
            .filter(|m| rev_of(m) == Some("faults"))
            .count();
        Ok(if new == n && machines.len() == n {
            Check::Done(())
        } else {
            Check::Pending(format!("{new} of {} machines rolled", machines.len()))
        })
    })
    .await?;
    converge_slowly(ctx, replicas).await?;
    let rolled = rollout.elapsed();
    report.faults_injected = ctx
        .machine_controller()?
        .metric("mcm_cloud_api_driver_requests_failed_total")
        .await
        .unwrap_or(0.0);
    let run = format!(
        "{n} machines created in {:.0}s and rolled out in {:.0}s, 30% Unavailable, 0-2s latency",
        created.as_secs_f64(),
        rolled.as_secs_f64()
    );
    report.worst_convergence = report.worst_convergence.max(rolled);
    if let Err(e) = converge(ctx, replicas, Some("faults")).await {
        report.violations.push(format!("cloud-fault run: {e:#}"));
    }
    report.fault_run = Some(run);
    Ok(())
}

/// [`Ctx::await_fleet`] with the longer bound a faulty cloud needs.
async fn converge_slowly(ctx: &Ctx<'_>, replicas: i32) -> Result<()> {
    let n = usize::try_from(replicas).unwrap_or(0);
    wait_for(
        &format!("{n} Running machines under cloud faults"),
        CONVERGE * 4,
        || async {
            let machines = ctx.machines().await?;
            let running = machines
                .iter()
                .filter(|m| crate::e2e::ctx::is_running(m))
                .count();
            let vms = ctx.vm_records().len();
            Ok(if running == n && machines.len() == n && vms == n {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "{} machines, {running} Running, {vms} VM records",
                    machines.len()
                ))
            })
        },
    )
    .await
}

/// Which API path a partition cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApiPath {
    Control,
    Target,
    Both,
}

/// The machine controller's gauge: when (Unix time, seconds) its last status check that
/// reached every API server finished. Only such a check ends an outage as the freeze counts
/// it.
const REACHABLE: &str = "mcm_machine_controller_apiservers_reachable_timestamp_seconds";
/// The machine controller's freeze flag (1 frozen).
const FROZEN: &str = "mcm_machine_controller_frozen";
/// `--machine-safety-apiserver-statuscheck-timeout` of the partition part.
const STATUSCHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// `--machine-safety-apiserver-statuscheck-period` ([`Timings`] sets 1 s).
const STATUSCHECK_PERIOD: Duration = Duration::from_secs(1);

/// Freeze expectation of a cut, from the freeze flag read while the path was still cut:
/// - `down`: how long the path had been cut when the flag was read. The first check after the
///   cut fails within a status-check `period`, and the check that freezes comes at most a
///   period after the `timeout` from that one: from `timeout + 2 * period` on it must be
///   frozen, `Some(true)`.
/// - `seen`: from the controller's last check that reached every API server before the cut
///   to the end of the read, at least the outage as the controller saw it. A freeze needs two
///   failed checks `timeout` apart, both after that check and before the read: below `timeout`
///   it cannot be frozen, `Some(false)`.
///
/// `None` in between. Pure.
fn must_freeze(
    down: Duration,
    seen: Duration,
    timeout: Duration,
    period: Duration,
) -> Option<bool> {
    if seen < timeout {
        Some(false)
    } else if down >= timeout + 2 * period {
        Some(true)
    } else {
        None
    }
}

/// `t` as RFC 3339 with milliseconds, and how long after `started` it was.
fn moment(t: jiff::Timestamp, started: jiff::Timestamp) -> String {
    format!(
        "{t:.3} (run +{:.1}s)",
        t.duration_since(started).as_secs_f64()
    )
}

/// Unix time of `t` in seconds, as the machine controller's gauges give it.
fn unix_seconds(t: jiff::Timestamp) -> f64 {
    t.as_duration().as_secs_f64()
}

/// Waits (at most [`WAIT`]) until the machine controller reports a check that reached every
/// API server and finished after `after` (Unix seconds), and is not frozen; returns that
/// check's time.
async fn await_reachable_after(mc: &env::Controller, after: f64) -> Result<f64> {
    wait_for(
        "the machine controller to reach both API servers again, unfrozen",
        WAIT,
        || async {
            let text = mc
                .metrics_text()
                .await
                .context("the machine controller's /metrics")?;
            let (reachable, frozen) = (metric(&text, REACHABLE), metric(&text, FROZEN));
            Ok(match (reachable, frozen) {
                (Some(r), Some(f)) if r > after && f < 0.5 => Check::Done(r),
                _ => Check::Pending(format!(
                    "{REACHABLE} {reachable:?} (wanted after {after:.3}), {FROZEN} {frozen:?}"
                )),
            })
        },
    )
    .await
}

/// Cuts the machine controller's path to the control API, the target API or both for
/// random periods: no Machine may be Failed or replaced, a cut beyond the status-check
/// timeout must freeze the controller, one that the controller saw shorter than the timeout
/// must not, and the restore must unfreeze it.
async fn partition_trials(
    ctx: &mut Ctx<'_>,
    seed: u64,
    cuts: usize,
    report: &mut Report,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00c0_ffee);
    ctx.create_class(CLASS, json!({})).await?;
    let (control, control_via) = ctx.proxied_kubeconfig("control-via-proxy.kubeconfig")?;
    let (target, target_via) = ctx.proxied_kubeconfig("target-via-proxy.kubeconfig")?;
    ctx.machine_control_kubeconfig = Some(control_via);
    let timings = Timings {
        health_timeout: "20s",
        statuscheck_timeout: "5s",
        orphan_period: "5s",
        ..Timings::default()
    };
    ctx.start_controllers(&timings, Some(target_via)).await?;
    ctx.create_deployment(DEPLOYMENT, 3, CLASS).await?;
    let before = machine_names(&ctx.await_fleet(3, None).await?);
    let (recorder, log) = crate::e2e::ctx::record_phases(ctx.machines_api());
    let proxies = Proxies { control, target };
    let cutting = cut_repeatedly(ctx, &mut rng, cuts, &proxies, before, report).await;
    recorder.abort();
    let failed: Vec<String> = crate::e2e::ctx::phases(&log)
        .into_iter()
        .filter(|(_, p)| p.iter().any(|x| x == "Failed"))
        .map(|(m, _)| m)
        .collect();
    if !failed.is_empty() {
        report
            .violations
            .push(format!("machines Failed during partitions: {failed:?}"));
    }
    // After an error of the harness the fleet may be anywhere: only the error is reported.
    if cutting.is_ok()
        && let Err(e) = counters_match(ctx).await
    {
        report.violations.push(format!("after the cuts: {e:#}"));
    }
    if let Err(e) = controllers_alive(ctx) {
        report.violations.push(format!("after the cuts: {e:#}"));
    }
    ctx.machine_control_kubeconfig = None;
    cutting
}

/// The proxies in front of the machine controller's control and target API paths.
struct Proxies {
    control: Proxy,
    target: Proxy,
}

impl Proxies {
    /// The proxies `path` goes through.
    fn of(&self, path: ApiPath) -> Vec<&Proxy> {
        match path {
            ApiPath::Control => vec![&self.control],
            ApiPath::Target => vec![&self.target],
            ApiPath::Both => vec![&self.control, &self.target],
        }
    }
}

/// The cuts of [`partition_trials`], each judged against the outage the controller saw. Every
/// cut starts after the controller reached both API servers following the previous restore,
/// so that no outage it sees spans two cuts.
async fn cut_repeatedly(
    ctx: &Ctx<'_>,
    rng: &mut StdRng,
    cuts: usize,
    proxies: &Proxies,
    mut before: BTreeSet<String>,
    report: &mut Report,
) -> Result<()> {
    let mc = ctx.machine_controller()?;
    await_reachable_after(mc, 0.0)
        .await
        .context("before the first cut")?;
    for i in 0..cuts {
        let path = match rng.random_range(0..3) {
            0 => ApiPath::Control,
            1 => ApiPath::Target,
            _ => ApiPath::Both,
        };
        let length = Duration::from_millis(rng.random_range(1000..15000));
        let mc = ctx.machine_controller()?;
        // A lower bound of the controller's last check that reached every API server before
        // the cut (another may still finish before the cut takes effect).
        let reachable = mc
            .metric(REACHABLE)
            .await
            .with_context(|| format!("{REACHABLE} before cut {}", i + 1))?;
        let began = jiff::Timestamp::now();
        for proxy in proxies.of(path) {
            proxy.cut().await;
        }
        let cut_at = Instant::now();
        println!(
            "cut {:>3}: {path:?} API for {:.1}s, cut at {}",
            i + 1,
            length.as_secs_f64(),
            moment(began, report.started)
        );
        // The fault itself lasts `length`.
        tokio::time::sleep(length).await;
        let read_at = Instant::now();
        let frozen = mc.metric(FROZEN).await == Some(1.0);
        let read = jiff::Timestamp::now();
        // Every proxy of the path, even after one failed.
        let restored: Vec<std::io::Result<()>> =
            proxies.of(path).into_iter().map(Proxy::restore).collect();
        let ended = jiff::Timestamp::now();
        restored
            .into_iter()
            .collect::<std::io::Result<()>>()
            .with_context(|| format!("restoring the proxy after cut {}", i + 1))?;
        let down = read_at.duration_since(cut_at);
        let seen = Duration::from_secs_f64((unix_seconds(read) - reachable).max(0.0));
        let want = must_freeze(down, seen, STATUSCHECK_TIMEOUT, STATUSCHECK_PERIOD);
        println!(
            "         restored at {}: down {:.2}s when the freeze was read, outage as the controller saw it at most {:.2}s; frozen {frozen}, expected {}",
            moment(ended, report.started),
            down.as_secs_f64(),
            seen.as_secs_f64(),
            want.map_or("either".to_string(), |w| w.to_string())
        );
        *report
            .cuts
            .entry(format!("{path:?}").to_lowercase())
            .or_default() += 1;
        if let Some(want) = want
            && want != frozen
        {
            report.violations.push(format!(
                "cut {} ({path:?}, {:.1}s, {began:.3} to {ended:.3}): frozen {frozen}, expected {want} (down {:.2}s when read, outage as the controller saw it at most {:.2}s)",
                i + 1,
                length.as_secs_f64(),
                down.as_secs_f64(),
                seen.as_secs_f64()
            ));
        }
        if frozen {
            report.freezes += 1;
        }
        // The outage is over for the controller too (which also means unfrozen): the next
        // cut starts a new one.
        await_reachable_after(mc, unix_seconds(ended))
            .await
            .with_context(|| format!("after cut {}", i + 1))?;
        if frozen {
            report.unfreezes += 1;
        }
        let after = machine_names(&ctx.await_fleet(3, None).await?);
        if after != before {
            report.violations.push(format!(
                "cut {}: machines replaced: {before:?} -> {after:?}",
                i + 1
            ));
            before = after;
        }
    }
    Ok(())
}

fn machine_names(machines: &[mcm_api::Machine]) -> BTreeSet<String> {
    machines
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_trials() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..20)
                .map(|_| {
                    let t = Trial::draw(&mut rng);
                    (t.operation, t.victim, t.delay, t.step)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // Every operation and victim comes up within 20 draws.
        let ops: BTreeSet<_> = draw(7).iter().map(|t| t.0).collect();
        let victims: BTreeSet<_> = draw(7).iter().map(|t| t.1).collect();
        assert_eq!(ops.len(), 4, "{ops:?}");
        assert_eq!(victims.len(), 3, "{victims:?}");
    }

    #[test]
    fn freezing_is_expected_only_clearly_beyond_the_timeout() {
        let (t, p) = (Duration::from_secs(5), Duration::from_secs(1));
        let ms = Duration::from_millis;
        // Down long enough: the controller saw at least as long.
        assert_eq!(must_freeze(ms(7000), ms(7600), t, p), Some(true));
        // Seen shorter than the timeout: no two failed checks could be 5 s apart.
        assert_eq!(must_freeze(ms(3000), ms(3900), t, p), Some(false));
        assert_eq!(must_freeze(ms(4200), ms(4999), t, p), Some(false));
        // In between either may happen.
        assert_eq!(must_freeze(ms(5500), ms(6000), t, p), None);
        assert_eq!(must_freeze(ms(4200), ms(5000), t, p), None);
    }

    #[test]
    fn a_short_cut_after_an_outage_the_controller_never_saw_end_may_freeze() {
        // Issue 56's cut 3: 3.4 s of its own, but the controller had not reached both API
        // servers since cut 2 (4.1 s, about a second before): its outage was about 8.5 s.
        let (t, p) = (Duration::from_secs(5), Duration::from_secs(1));
        let down = Duration::from_millis(3400);
        assert_eq!(must_freeze(down, Duration::from_millis(8500), t, p), None);
        // With a check that reached both in between, it must not.
        assert_eq!(
            must_freeze(down, Duration::from_millis(4100), t, p),
            Some(false)
        );
    }

    #[test]
    fn moments_are_rfc3339_with_millis_and_the_offset_into_the_run() {
        let started: jiff::Timestamp = "2026-11-28T10:00:00Z".parse().unwrap();
        let t: jiff::Timestamp = "2026-11-28T10:00:52.123456Z".parse().unwrap();
        assert_eq!(moment(t, started), "2026-11-28T10:00:52.123Z (run +52.1s)");
        assert!((unix_seconds(t) - 1_795_860_052.123_456).abs() < 1e-3);
    }

    #[test]
    fn every_planned_part_runs_and_its_violations_carry_its_name() {
        let plan = Plan {
            trials: 0,
            partitions: 6,
            zone_partitions: 0,
            handovers: 0,
            fault_machines: 1,
            aws_creation_kills: 0,
            corpus: false,
            seed: None,
            keep_logs: false,
        };
        let planned: Vec<Part> = Part::ALL.into_iter().filter(|p| p.planned(&plan)).collect();
        assert_eq!(planned, [Part::Partitions, Part::Faults]);
        let mut found = vec!["cut 3: frozen true, expected false".to_string()];
        name_violations(&mut found, Part::Partitions);
        assert_eq!(found, ["partitions: cut 3: frozen true, expected false"]);
    }

    #[test]
    fn scaling_stays_between_one_and_the_most() {
        let t = |operation, step| Trial {
            operation,
            victim: Victim::Manager,
            delay: Duration::ZERO,
            step,
        };
        assert_eq!(t(Operation::ScaleUp, 2).replicas_after(5), MOST);
        assert_eq!(t(Operation::ScaleDown, 2).replicas_after(3), 2);
        assert_eq!(t(Operation::Rollout, 2).replicas_after(4), 4);
    }
}
