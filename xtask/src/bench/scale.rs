//! The scale benchmarks: a control plane whose API server audits every request, kwok, both
//! controllers in release builds, one MachineDeployment scaled and rolled; per phase the wall
//! time, the controllers' requests counted at the API server, their CPU and peak RSS.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use mcm_testenv::kit::is_ready;
use mcm_testenv::{Components, ControlPlane, Options};
use serde_json::json;

use super::report::{self, Phase, Results, Sample};
use super::{ScaleArgs, VmKind, audit};
use crate::e2e::ctx::{Ctx, RUN_LABEL, SECRET};
use crate::e2e::env::{self, Controller, ControllerKind, ControllerSpec, Profile};

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 0 -> N, idle.
    Scale,
    /// 0 -> N, N -> 0, 0 -> N.
    ScaleDown,
    /// 0 -> N, rolling update.
    Rollout,
    /// (0 -> N -> 0) x cycles, resident memory after each.
    Soak,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Scale => "scale",
            Kind::ScaleDown => "scale-down",
            Kind::Rollout => "rollout",
            Kind::Soak => "soak",
        }
    }
}

/// The deployment the benchmark scales.
const DEPLOYMENT: &str = "bench";
/// Its class.
const CLASS: &str = "bench";
/// The soak's limit: resident memory after the last cycle at most this much above the first's.
const MAX_RSS_GROWTH: f64 = 0.10;
/// How often the sampler looks at its stores.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Linux's USER_HZ: the unit of utime/stime in /proc/<pid>/stat.
const TICKS_PER_SECOND: f64 = 100.0;

/// Runs one scale benchmark and prints its results.
pub fn run(kind: Kind, args: ScaleArgs) -> Result<()> {
    env::plain_logs_for_children();
    let profile = if args.dev_build {
        Profile::Debug
    } else if args.fast_build {
        Profile::FastRelease
    } else {
        Profile::Release
    };
    let target = args.musl.then_some(crate::image::TARGET);
    let bins = env::prepare_binaries_for(profile, target)?;
    if std::env::var_os(mcm_testenv::binaries::KWOK_ENV).is_none() {
        // `prepare_binaries_in` ran `cargo xtask testenv` unless KUBEBUILDER_ASSETS is set;
        // kwok must be there either way.
        mcm_testenv::binaries::find_kwok_dir().or_else(|_| {
            crate::testenv::run(false, false)?;
            mcm_testenv::binaries::find_kwok_dir().map_err(anyhow::Error::from)
        })?;
    }
    let machines = args
        .machines
        .unwrap_or(if kind == Kind::Rollout { 100 } else { 1000 });
    let logs = env::target_dir().join("bench").join(format!(
        "{}-{machines}-{}",
        kind.name(),
        std::process::id()
    ));
    let runtime = tokio::runtime::Runtime::new()?;
    let results = runtime.block_on(bench(kind, &args, machines, &bins, &logs));
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("logs kept in {}", logs.display());
            return Err(e);
        }
    };
    let plot = args
        .plot
        .clone()
        .unwrap_or_else(|| default_plot(kind, machines));
    if kind == Kind::Soak {
        report::plot_rss(&results, &plot)?;
    } else {
        report::plot(&results, &plot)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", report::table(&results));
        println!("plot: {}", plot.display());
    }
    if args.keep_logs {
        eprintln!("logs kept in {}", logs.display());
    } else {
        let _ = std::fs::remove_dir_all(&logs);
    }
    if let Some(limit) = args.max_bound_ratio {
        let over = report::phases_above_ratio(&results, limit);
        if !over.is_empty() {
            bail!(
                "phases beyond {limit}x their QPS bound: {}",
                over.join(", ")
            );
        }
    }
    let over = report::phases_above_request_limits(&results, &args.max_requests_per_machine);
    if !over.is_empty() {
        bail!(
            "phases above their requests-per-machine limit: {}",
            over.join(", ")
        );
    }
    if let Some(growth) = report::rss_growth(&results)
        && growth > MAX_RSS_GROWTH
    {
        bail!(
            "the controllers' resident memory at rest after the last cycle is {:.1} % above the first's (at most {:.0} %)",
            growth * 100.0,
            MAX_RSS_GROWTH * 100.0
        );
    }
    if args.check_request_targets {
        let over = report::phases_above_request_target(&results);
        if !over.is_empty() {
            bail!(
                "phases above their requests-per-machine target: {}",
                over.join(", ")
            );
        }
    }
    Ok(())
}

/// What the sampler keeps: the stores and the samples of the phase running.
struct Sampler {
    machines: Store<Machine>,
    nodes: Store<Node>,
    samples: Arc<Mutex<Vec<Sample>>>,
}

/// What the stores say now.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    machines: usize,
    running: usize,
    /// Running machines created at or after the phase began.
    new_running: usize,
    nodes: usize,
    ready: usize,
}

impl Counts {
    /// Exactly `n` Machines, all Running, with `n` Ready Nodes.
    fn fleet_of(&self, n: usize) -> bool {
        self.machines == n && self.running == n && self.ready == n
    }
}

impl Sampler {
    /// The UIDs of the Machines the store holds now: what a phase starts from.
    fn machine_uids(&self) -> HashSet<String> {
        self.machines
            .state()
            .iter()
            .filter_map(|m| m.metadata.uid.clone())
            .collect()
    }

    /// The counts now; a Machine is new when its UID is not in `before`. (Not by its
    /// creation timestamp: that has whole seconds, so a machine created in the second the
    /// phase began would count as old, and a rollout's end would never be seen.)
    fn counts(&self, before: &HashSet<String>) -> Counts {
        let machines = self.machines.state();
        let running = |m: &Arc<Machine>| {
            m.status
                .as_ref()
                .and_then(|s| s.current_status.as_ref())
                .and_then(|c| c.phase.clone())
                == Some(MachinePhase::Running)
        };
        let nodes = self.nodes.state();
        Counts {
            machines: machines.len(),
            running: machines.iter().filter(|m| running(m)).count(),
            new_running: machines
                .iter()
                .filter(|m| running(m))
                .filter(|m| {
                    m.metadata
                        .uid
                        .as_ref()
                        .is_some_and(|uid| !before.contains(uid))
                })
                .count(),
            nodes: nodes.len(),
            ready: nodes.iter().filter(|n| is_ready(n)).count(),
        }
    }
}

/// The two controller processes.
struct Controllers {
    manager: Controller,
    machine: Controller,
}

impl Controllers {
    fn pids(&self) -> [i32; 2] {
        [self.manager.pid() as i32, self.machine.pid() as i32]
    }
}

async fn bench(
    kind: Kind,
    args: &ScaleArgs,
    n: usize,
    bins: &env::Binaries,
    logs: &Path,
) -> Result<Results> {
    let began = Instant::now();
    // kube-controller-manager as in a real cluster (node lifecycle, garbage collection of
    // Leases); no scheduler: the benchmark runs no pods.
    let cp = ControlPlane::start(Options {
        components: Components {
            controller_manager: true,
            scheduler: false,
        },
        node_monitor_grace_period: Duration::from_secs(40),
        audit_writes: true,
        audit_reads: true,
        ..Options::default()
    })
    .await
    .context("starting the control plane")?;
    if args.vms == VmKind::Kwok {
        cp.start_kwok().await.context("starting kwok")?;
    }
    eprintln!(
        "control plane{} up in {:.1}s",
        if args.vms == VmKind::Kwok {
            " and kwok"
        } else {
            ""
        },
        began.elapsed().as_secs_f64()
    );
    let result = run_phases(kind, args, n, &cp, bins, logs).await;
    if result.is_err() {
        let _ = env::preserve_control_plane_logs(&cp, logs);
    }
    result
}

async fn run_phases(
    kind: Kind,
    args: &ScaleArgs,
    n: usize,
    cp: &ControlPlane,
    bins: &env::Binaries,
    logs: &Path,
) -> Result<Results> {
    let ctx = Ctx::new(cp, bins, "bench", logs).await?;
    let mut provider_spec = json!({
        "labels": { RUN_LABEL: ctx.ns },
        "stateDirectory": ctx.state.root(),
    });
    match args.vms {
        VmKind::Kwok => provider_spec["node"] = json!("kwok"),
        VmKind::Process => provider_spec["heartbeatInterval"] = json!("10s"),
    }
    ctx.apply(&json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
        "metadata": { "name": CLASS },
        "provider": "local",
        "providerSpec": provider_spec,
        "secretRef": { "name": SECRET, "namespace": ctx.ns },
    }))
    .await?;
    ctx.create_deployment(DEPLOYMENT, 0, CLASS).await?;

    let controllers = start_controllers(args, cp, bins, &ctx).await?;
    let sampler = start_sampler(&ctx).await?;
    let deployments: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let timeout = Duration::from_secs(args.phase_timeout);

    let mut phases = Vec::new();
    let mut cycles = Vec::new();
    let scale = |replicas: usize| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch(
                    DEPLOYMENT,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
                )
                .await
                .map(drop)
                .context("scaling the MachineDeployment")
        }
    };

    let up = Step {
        name: "scale-up",
        from: 0,
        to: n,
    };
    phases.push(
        measure(
            &up,
            &controllers,
            &sampler,
            timeout,
            || scale(n),
            |c, _| c.fleet_of(n),
        )
        .await?,
    );
    match kind {
        Kind::Scale => {
            let audit_log = cp
                .audit_log_path()
                .context("the control plane has no audit log")?;
            phases.push(idle(args, n, &controllers, &sampler, &audit_log).await?);
        }
        Kind::ScaleDown => {
            let down = Step {
                name: "scale-down",
                from: n,
                to: 0,
            };
            phases.push(
                measure(
                    &down,
                    &controllers,
                    &sampler,
                    timeout,
                    || scale(0),
                    |c, _| c.machines == 0 && c.nodes == 0,
                )
                .await?,
            );
            let again = Step {
                name: "scale-up-again",
                from: 0,
                to: n,
            };
            phases.push(
                measure(
                    &again,
                    &controllers,
                    &sampler,
                    timeout,
                    || scale(n),
                    |c, _| c.fleet_of(n),
                )
                .await?,
            );
            // What an operator does: scale to 0, and back up as soon as the deployment
            // reports no replicas, while the old machines are still being deleted.
            let rescale = Step {
                name: "rescale",
                from: n,
                to: n,
            };
            let deployments_for_rescale = deployments.clone();
            phases.push(
                measure(
                    &rescale,
                    &controllers,
                    &sampler,
                    timeout,
                    || async move {
                        scale(0).await?;
                        env::wait_for("the deployment to report 0 replicas", timeout, || {
                            let api = deployments_for_rescale.clone();
                            async move {
                                let d = api.get(DEPLOYMENT).await?;
                                let replicas =
                                    d.status.as_ref().and_then(|s| s.replicas).unwrap_or(-1);
                                Ok(if replicas == 0 {
                                    env::Check::Done(())
                                } else {
                                    env::Check::Pending(format!("{replicas} replicas"))
                                })
                            }
                        })
                        .await?;
                        scale(n).await
                    },
                    |c, _| c.machines == n && c.new_running == n && c.ready == n,
                )
                .await?,
            );
        }
        Kind::Soak => {
            let audit_log = cp
                .audit_log_path()
                .context("the control plane has no audit log")?;
            let down_to_zero = |c: &Counts, _: Duration| c.machines == 0 && c.nodes == 0;
            for cycle in 1..=args.cycles.max(1) {
                if cycle > 1 {
                    let up = Step {
                        name: leak(format!("up-{cycle}")),
                        from: 0,
                        to: n,
                    };
                    phases.push(
                        measure(
                            &up,
                            &controllers,
                            &sampler,
                            timeout,
                            || scale(n),
                            |c, _| c.fleet_of(n),
                        )
                        .await?,
                    );
                }
                let down = Step {
                    name: if cycle == 1 {
                        "scale-down"
                    } else {
                        leak(format!("down-{cycle}"))
                    },
                    from: n,
                    to: 0,
                };
                phases.push(
                    measure(
                        &down,
                        &controllers,
                        &sampler,
                        timeout,
                        || scale(0),
                        down_to_zero,
                    )
                    .await?,
                );
                let c = after_cycle(cycle, &controllers, &audit_log, timeout).await?;
                eprintln!(
                    "cycle {cycle}: resident {:.1} + {:.1} MiB when the fleet was gone, {:.1} + {:.1} MiB at rest {:.1}s later, machine controller tracking {} entries",
                    c.gone.manager_mib,
                    c.gone.machine_controller_mib,
                    c.manager_rss_mib,
                    c.machine_controller_rss_mib,
                    c.settled_seconds,
                    opt_count(c.tracked_entries),
                );
                cycles.push(c);
            }
        }
        Kind::Rollout => {
            deployments
                .patch(
                    DEPLOYMENT,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "strategy": { "rollingUpdate": {
                        "maxSurge": args.max_surge.to_json(), "maxUnavailable": 0 } } } })),
                )
                .await
                .context("setting maxSurge")?;
            let roll = Step {
                name: "rollout",
                from: n,
                to: n,
            };
            let deployments_for_roll = deployments.clone();
            let mut phase = measure(
                &roll,
                &controllers,
                &sampler,
                timeout,
                || async move {
                    deployments_for_roll
                        .patch(
                            DEPLOYMENT,
                            &PatchParams::default(),
                            &Patch::Merge(json!({ "spec": { "template": { "metadata": {
                                "labels": { "bench.mcm-rs.io/revision": "2" } } } } })),
                        )
                        .await
                        .map(drop)
                        .context("changing the template")
                },
                |c, _| c.machines == n && c.new_running == n && c.ready == n,
            )
            .await?;
            let surge = args.max_surge.of(n);
            phase.first_batch_seconds = phase
                .samples
                .iter()
                .find(|s| s.new_running >= surge.min(n))
                .map(|s| s.seconds);
            phase.batches = Some(n.div_ceil(surge));
            phases.push(phase);
        }
    }

    for c in [controllers.manager, controllers.machine] {
        c.stop(Duration::from_secs(10)).await;
    }
    // The last requests are in the log: the API server writes each event before it answers.
    let audit_log = cp
        .audit_log_path()
        .context("the control plane has no audit log")?;
    let requests = audit::read(&audit_log)?;
    for p in &mut phases {
        p.requests = audit::tally(&requests, p.from, p.to, &ctx.ns);
        p.fill_bounds(args.qps, args.burst);
    }
    Ok(Results {
        bench: kind.name().to_string(),
        machines: n,
        qps: args.qps,
        burst: args.burst,
        vms: format!("{:?}", args.vms).to_lowercase(),
        phases,
        cycles,
    })
}

/// A phase name made at run time (a soak's `up-3`): the few a run makes live as long as it.
fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

fn opt_count(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.0}"))
}

/// What a soak cycle left behind: both controllers' resident memory (VmRSS) the moment the
/// fleet is gone and again at rest (once they have been quiet for [`QUIET`], at most
/// `limit` later: the last deletions' writes and the allocator's return of freed pages are
/// then done), and the machine controller's per-machine records still kept.
async fn after_cycle(
    cycle: usize,
    controllers: &Controllers,
    audit_log: &Path,
    limit: Duration,
) -> Result<report::Cycle> {
    let resident = || {
        let rss = controllers.pids().map(resident_kib);
        report::Resident {
            manager_mib: rss[0] as f64 / 1024.0,
            machine_controller_mib: rss[1] as f64 / 1024.0,
        }
    };
    let gone = resident();
    let settled = settle(audit_log, controllers.pids(), limit).await?;
    let rest = resident();
    let tracked = controllers
        .machine
        .metric("mcm_machine_controller_tracked_entries")
        .await;
    Ok(report::Cycle {
        cycle,
        manager_rss_mib: rest.manager_mib,
        machine_controller_rss_mib: rest.machine_controller_mib,
        gone,
        settled_seconds: settled.as_secs_f64(),
        tracked_entries: tracked,
    })
}

/// The resident set (VmRSS, KiB) of a process now.
fn resident_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A phase to measure: its name and the machine counts it goes between.
struct Step {
    name: &'static str,
    from: usize,
    to: usize,
}

async fn start_controllers(
    args: &ScaleArgs,
    cp: &ControlPlane,
    bins: &env::Binaries,
    ctx: &Ctx<'_>,
) -> Result<Controllers> {
    let spec = |kind: ControllerKind, name: &str| ControllerSpec {
        kind,
        name: name.to_string(),
        namespace: ctx.ns.clone(),
        control_kubeconfig: cp.kubeconfig_path().to_path_buf(),
        target_kubeconfig: cp.kubeconfig_path().to_path_buf(),
        extra: [
            format!("--kube-api-qps={}", args.qps),
            format!("--kube-api-burst={}", args.burst),
        ]
        .into_iter()
        .chain(
            args.concurrent_syncs
                .map(|n| format!("--concurrent-syncs={n}")),
        )
        .chain(args.controller_args.iter().cloned())
        .collect(),
        env: [(
            mcm_provider_local::NODE_BINARY_ENV.to_string(),
            bins.local_node.display().to_string(),
        )]
        .into_iter()
        .chain(
            args.controller_env
                .iter()
                .map(|(key, value)| (key.clone(), super::env_value_for(value, name))),
        )
        .collect(),
    };
    let manager = Controller::spawn(
        bins,
        cp,
        &ctx.dir,
        &spec(ControllerKind::Manager, "manager"),
    )?;
    let machine = Controller::spawn(
        bins,
        cp,
        &ctx.dir,
        &spec(ControllerKind::Machine, "machine-controller"),
    )?;
    manager.await_ready(Duration::from_secs(120)).await?;
    machine.await_ready(Duration::from_secs(120)).await?;
    Ok(Controllers { manager, machine })
}

/// Reflectors over the namespace's Machines and the run's Nodes; each [`measure`] samples
/// them.
async fn start_sampler(ctx: &Ctx<'_>) -> Result<Sampler> {
    let machines_api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let nodes_api: Api<Node> = Api::all(ctx.client.clone());
    let (machines, machines_writer) = reflector::store();
    let (nodes, nodes_writer) = reflector::store();
    tokio::spawn(
        reflector::reflector(
            machines_writer,
            watcher(machines_api, watcher::Config::default()),
        )
        .default_backoff()
        .for_each(|_| async {}),
    );
    tokio::spawn(
        reflector::reflector(
            nodes_writer,
            watcher(
                nodes_api,
                watcher::Config::default().labels(&format!("{RUN_LABEL}={}", ctx.ns)),
            ),
        )
        .default_backoff()
        .for_each(|_| async {}),
    );
    machines
        .wait_until_ready()
        .await
        .context("the Machine reflector stopped")?;
    nodes
        .wait_until_ready()
        .await
        .context("the Node reflector stopped")?;
    Ok(Sampler {
        machines,
        nodes,
        samples: Arc::default(),
    })
}

/// CPU ticks and peak RSS of a process.
#[derive(Debug, Clone, Copy, Default)]
struct ProcUsage {
    ticks: u64,
    peak_rss_kib: u64,
}

fn usage(pid: i32) -> ProcUsage {
    let ticks = mcm_provider_local::state::read_proc_stat(pid).map_or(0, |s| s.utime + s.stime);
    let peak_rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    ProcUsage {
        ticks,
        peak_rss_kib,
    }
}

/// Starts a phase with `action`, samples until `done` holds, and measures it.
async fn measure<A, Fut>(
    step: &Step,
    controllers: &Controllers,
    sampler: &Sampler,
    timeout: Duration,
    action: A,
    done: impl Fn(&Counts, Duration) -> bool,
) -> Result<Phase>
where
    A: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let pids = controllers.pids();
    let before = pids.map(usage);
    let bar = ProgressBar::new(step.from.abs_diff(step.to).max(step.to) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>15} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(step.name);
    let before_uids = sampler.machine_uids();
    let from = Timestamp::now();
    let start = Instant::now();
    sampler.samples.lock().map(|mut s| s.clear()).ok();
    action().await?;
    loop {
        let elapsed = start.elapsed();
        let c = sampler.counts(&before_uids);
        let sample = Sample {
            seconds: elapsed.as_secs_f64(),
            machines: c.machines,
            running: c.running,
            new_running: c.new_running,
            ready_nodes: c.ready,
        };
        if let Ok(mut s) = sampler.samples.lock() {
            s.push(sample);
        }
        let progress = if step.to >= step.from {
            if step.from == step.to {
                c.new_running
            } else {
                c.running.min(c.ready)
            }
        } else {
            step.from.saturating_sub(c.machines.max(c.nodes))
        };
        bar.set_position(progress as u64);
        bar.set_message(format!(
            "machines {} running {} nodes ready {}",
            c.machines, c.running, c.ready
        ));
        if done(&c, elapsed) {
            break;
        }
        if elapsed > timeout {
            bar.abandon();
            bail!(
                "{} did not finish within {timeout:?}: {} machines, {} Running, {} Nodes ({} Ready)",
                step.name,
                c.machines,
                c.running,
                c.nodes,
                c.ready
            );
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let wall = start.elapsed();
    let to = Timestamp::now();
    bar.finish_and_clear();
    let after = pids.map(usage);
    eprintln!(
        "{} {}→{}: {:.1}s",
        step.name,
        step.from,
        step.to,
        wall.as_secs_f64()
    );
    let samples = sampler
        .samples
        .lock()
        .map(|s| s.clone())
        .unwrap_or_default();
    Ok(Phase::new(
        step.name,
        step.from,
        step.to,
        wall.as_secs_f64(),
        from,
        to,
        cpu_seconds(before, after),
        after.map(|u| u.peak_rss_kib),
        samples,
    ))
}

fn cpu_seconds(before: [ProcUsage; 2], after: [ProcUsage; 2]) -> [f64; 2] {
    [0, 1].map(|i| after[i].ticks.saturating_sub(before[i].ticks) as f64 / TICKS_PER_SECOND)
}

/// How long the controllers must have been quiet before the idle window begins.
const QUIET: Duration = Duration::from_secs(5);
/// CPU ticks per second of both controllers together that still count as quiet (1 % of a
/// core).
const QUIET_TICKS_PER_SECOND: f64 = 1.0;

/// Waits (at most `limit`) until the controllers have been quiet for [`QUIET`]: no request
/// (other than their open watches) and CPU below [`QUIET_TICKS_PER_SECOND`]. The last
/// machines of a scale-up still have writes in flight (their Running status and Event) when
/// the fleet is counted complete, and the new Nodes keep changing for a while after a burst
/// of joins (updates by the cluster's own components), which the machine controller looks at
/// without a request: all of that belongs to the scale-up, not to the idle window. Returns
/// how long it waited.
async fn settle(audit_log: &Path, pids: [i32; 2], limit: Duration) -> Result<Duration> {
    let mut tail = audit::AuditTail::from_end(audit_log)?;
    let ticks = || pids.map(usage).iter().map(|u| u.ticks).sum::<u64>();
    let began = Instant::now();
    let mut last_activity = Instant::now();
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    while began.elapsed() < limit {
        let now = Instant::now();
        if tail.poll()?.iter().any(audit::is_controller_activity) {
            last_activity = now;
        }
        window.push_back((now, ticks()));
        while window
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > QUIET)
        {
            window.pop_front();
        }
        if let (Some((t0, first)), Some((t1, last))) = (window.front(), window.back()) {
            let seconds = t1.duration_since(*t0).as_secs_f64();
            if seconds >= 1.0 && (last - first) as f64 > QUIET_TICKS_PER_SECOND * seconds {
                last_activity = now;
            }
        }
        if last_activity.elapsed() >= QUIET {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(began.elapsed())
}

/// The controllers left alone at `n` machines for `--idle-seconds`: their CPU and requests.
async fn idle(
    args: &ScaleArgs,
    n: usize,
    controllers: &Controllers,
    sampler: &Sampler,
    audit_log: &Path,
) -> Result<Phase> {
    let settled = settle(
        audit_log,
        controllers.pids(),
        Duration::from_secs(args.idle_seconds),
    )
    .await?;
    if settled >= Duration::from_secs(args.idle_seconds) {
        eprintln!(
            "the controllers were not quiet {:.1}s after the fleet was complete: idle from now",
            settled.as_secs_f64()
        );
    } else {
        eprintln!(
            "the controllers went quiet {:.1}s after the fleet was complete",
            settled.as_secs_f64()
        );
    }
    let pids = controllers.pids();
    let before = pids.map(usage);
    let before_uids = sampler.machine_uids();
    let from = Timestamp::now();
    let window = Duration::from_secs(args.idle_seconds);
    eprintln!("idle at {n} machines for {}s", window.as_secs());
    // Deliberate: this is the measurement window, not a synchronization.
    tokio::time::sleep(window).await;
    let to = Timestamp::now();
    let after = pids.map(usage);
    let c = sampler.counts(&before_uids);
    Ok(Phase::new(
        "idle",
        n,
        n,
        window.as_secs_f64(),
        from,
        to,
        cpu_seconds(before, after),
        after.map(|u| u.peak_rss_kib),
        vec![Sample {
            seconds: window.as_secs_f64(),
            machines: c.machines,
            running: c.running,
            new_running: c.new_running,
            ready_nodes: c.ready,
        }],
    ))
}

/// The default plot path of a benchmark.
pub fn default_plot(kind: Kind, n: usize) -> PathBuf {
    env::target_dir()
        .join("bench")
        .join(format!("{}-{n}.svg", kind.name()))
}
