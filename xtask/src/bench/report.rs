//! The results of a scale benchmark: per phase figures, the table printed at the end, the JSON
//! of `--json`, and the SVG plot of machines over time.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, anyhow};
use jiff::Timestamp;
use serde::Serialize;

use super::audit::Tally;

/// What the stores said at one moment of a phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the phase began.
    pub seconds: f64,
    /// Machines that exist.
    pub machines: usize,
    /// Machines in phase Running.
    pub running: usize,
    /// Running machines created during the phase.
    pub new_running: usize,
    /// Nodes that are Ready.
    pub ready_nodes: usize,
}

/// The figures of one phase.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// `scale-up`, `idle`, `scale-down`, `scale-up-again`, `rollout`.
    pub name: String,
    /// Machines at the start.
    pub from_machines: usize,
    /// Machines at the end.
    pub to_machines: usize,
    /// Wall time until the end condition held.
    pub wall_seconds: f64,
    /// When it began.
    pub from: Timestamp,
    /// When it ended.
    pub to: Timestamp,
    /// CPU seconds of the manager during the phase.
    pub manager_cpu_seconds: f64,
    /// CPU seconds of the machine controller during the phase.
    pub machine_controller_cpu_seconds: f64,
    /// Peak RSS of the manager so far (MiB).
    pub manager_peak_rss_mib: f64,
    /// Peak RSS of the machine controller so far (MiB).
    pub machine_controller_peak_rss_mib: f64,
    /// The controllers' requests, counted at the API server.
    pub requests: Tally,
    /// Both controllers' requests per machine created, deleted or replaced.
    pub requests_per_machine: Option<f64>,
    /// The lower bound the QPS budget sets: the writes of the busiest client-side rate
    /// limiter (each controller has one per cluster) beyond its burst, divided by the QPS.
    pub qps_bound_seconds: Option<f64>,
    /// `wall_seconds / qps_bound_seconds`.
    pub bound_ratio: Option<f64>,
    /// CPU of both controllers as a percentage of one core (the idle phase).
    pub cpu_percent_of_a_core: f64,
    /// Rollout: seconds until the first batch (maxSurge new machines) was Running.
    pub first_batch_seconds: Option<f64>,
    /// Rollout: batches of maxSurge machines.
    pub batches: Option<usize>,
    /// Rollout: `batches * first_batch_seconds`.
    pub ideal_seconds: Option<f64>,
    /// Samples over the phase.
    pub samples: Vec<Sample>,
}

impl Phase {
    /// A measured phase; requests and bounds are filled in later.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        from_machines: usize,
        to_machines: usize,
        wall_seconds: f64,
        from: Timestamp,
        to: Timestamp,
        cpu_seconds: [f64; 2],
        peak_rss_kib: [u64; 2],
        samples: Vec<Sample>,
    ) -> Phase {
        let mib = |kib: u64| kib as f64 / 1024.0;
        Phase {
            name: name.to_string(),
            from_machines,
            to_machines,
            wall_seconds,
            from,
            to,
            manager_cpu_seconds: cpu_seconds[0],
            machine_controller_cpu_seconds: cpu_seconds[1],
            manager_peak_rss_mib: mib(peak_rss_kib[0]),
            machine_controller_peak_rss_mib: mib(peak_rss_kib[1]),
            requests: Tally::default(),
            requests_per_machine: None,
            qps_bound_seconds: None,
            bound_ratio: None,
            cpu_percent_of_a_core: if wall_seconds > 0.0 {
                100.0 * (cpu_seconds[0] + cpu_seconds[1]) / wall_seconds
            } else {
                0.0
            },
            first_batch_seconds: None,
            batches: None,
            ideal_seconds: None,
            samples,
        }
    }

    /// Machines the phase created, deleted or replaced.
    pub fn machines_changed(&self) -> usize {
        match self.from_machines.abs_diff(self.to_machines) {
            0 if self.name == "rollout" || self.name == "rescale" => self.to_machines,
            d => d,
        }
    }

    /// Fills the per-machine figures, the QPS bound and the rollout ideal.
    pub fn fill_bounds(&mut self, qps: f32, burst: u32) {
        let changed = self.machines_changed();
        if changed == 0 {
            return;
        }
        self.requests_per_machine = Some(self.requests.total() as f64 / changed as f64);
        let busier = self.requests.busiest_limiter_writes();
        let bound = busier.saturating_sub(u64::from(burst)) as f64 / f64::from(qps);
        if bound > 0.0 {
            self.qps_bound_seconds = Some(bound);
            self.bound_ratio = Some(self.wall_seconds / bound);
        }
        if let (Some(first), Some(batches)) = (self.first_batch_seconds, self.batches) {
            self.ideal_seconds = Some(first * batches as f64);
        }
    }
}

/// Everything a benchmark run found.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// `scale`, `scale-down`, `rollout`.
    pub bench: String,
    /// N.
    pub machines: usize,
    /// `--kube-api-qps` of both controllers.
    pub qps: f32,
    /// `--kube-api-burst` of both controllers.
    pub burst: u32,
    /// `kwok` or `process`.
    pub vms: String,
    /// The phases in order.
    pub phases: Vec<Phase>,
    /// Soak: what each cycle left behind.
    pub cycles: Vec<Cycle>,
}

/// What one soak cycle (0 -> N -> 0) left behind.
#[derive(Debug, Clone, Serialize)]
pub struct Cycle {
    /// 1, 2, ...
    pub cycle: usize,
    /// The manager's resident memory (VmRSS) at rest after the cycle: the fleet gone and the
    /// controllers quiet.
    pub manager_rss_mib: f64,
    /// The machine controller's.
    pub machine_controller_rss_mib: f64,
    /// Both controllers' resident memory the moment the last Machine and Node were gone.
    pub gone: Resident,
    /// How long after that the controllers were at rest.
    pub settled_seconds: f64,
    /// `mcm_machine_controller_tracked_entries` at rest (`None`: not read).
    pub tracked_entries: Option<f64>,
}

/// Both controllers' resident memory (VmRSS) at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Resident {
    /// The manager's, MiB.
    pub manager_mib: f64,
    /// The machine controller's, MiB.
    pub machine_controller_mib: f64,
}

impl Resident {
    /// Both together, MiB.
    pub fn total_mib(&self) -> f64 {
        self.manager_mib + self.machine_controller_mib
    }
}

impl Cycle {
    /// Both controllers' resident memory at rest.
    pub fn total_mib(&self) -> f64 {
        self.manager_rss_mib + self.machine_controller_rss_mib
    }
}

/// Soak: how much more both controllers held at rest after the last cycle than after the
/// first (0.1 is 10 %); `None` with fewer than two cycles.
pub fn rss_growth(r: &Results) -> Option<f64> {
    growth(r, Cycle::total_mib)
}

/// Soak: the same for the resident memory the moment each cycle's fleet was gone.
pub fn rss_growth_when_gone(r: &Results) -> Option<f64> {
    growth(r, |c| c.gone.total_mib())
}

fn growth(r: &Results, value: fn(&Cycle) -> f64) -> Option<f64> {
    let (first, last) = (r.cycles.first()?, r.cycles.last()?);
    (r.cycles.len() >= 2 && value(first) > 0.0).then(|| value(last) / value(first) - 1.0)
}

fn opt(v: Option<f64>, precision: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.precision$}"))
}

/// The phases whose wall time exceeds `limit` times their QPS bound, as `name (ratio)`.
pub fn phases_above_ratio(r: &Results, limit: f64) -> Vec<String> {
    r.phases
        .iter()
        .filter_map(|p| {
            p.bound_ratio
                .filter(|ratio| *ratio > limit)
                .map(|ratio| format!("{} ({ratio:.2}x: {:.1}s)", p.name, p.wall_seconds))
        })
        .collect()
}

/// The requests-per-machine target of a phase, both controllers together, Events included:
/// creating a machine 6, deleting one 8, replacing one (a rollout, or a rescale while the old
/// machines are deleted) 14. `None` for the idle phase.
pub fn request_target(phase: &str) -> Option<f64> {
    match phase {
        "scale-up" | "scale-up-again" => Some(6.0),
        "scale-down" => Some(8.0),
        p if p.starts_with("up-") => Some(6.0),
        p if p.starts_with("down-") => Some(8.0),
        "rollout" | "rescale" => Some(14.0),
        _ => None,
    }
}

/// The phases whose requests per machine exceed [`request_target`], described.
pub fn phases_above_request_target(r: &Results) -> Vec<String> {
    r.phases
        .iter()
        .filter_map(|p| {
            let target = request_target(&p.name)?;
            let per = p.requests_per_machine?;
            (per > target).then(|| format!("{} ({per:.1} > {target})", p.name))
        })
        .collect()
}

/// The phases whose requests per machine exceed the limit given for them (`(phase, limit)`;
/// a limit for a phase this benchmark has not run is an error, so a renamed phase is never
/// silently unguarded).
pub fn phases_above_request_limits(r: &Results, limits: &[(String, f64)]) -> Vec<String> {
    limits
        .iter()
        .filter_map(|(name, limit)| {
            let Some(p) = r.phases.iter().find(|p| &p.name == name) else {
                return Some(format!("{name} (no such phase)"));
            };
            match p.requests_per_machine {
                Some(per) if per > *limit => Some(format!("{name} ({per:.1} > {limit})")),
                Some(_) => None,
                None => Some(format!("{name} (no requests counted)")),
            }
        })
        .collect()
}

/// The results table and, per phase, the requests by kind (most frequent first).
pub fn table(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} of {} machines ({} VMs), both controllers at --kube-api-qps {} --kube-api-burst {}\n",
        r.bench, r.machines, r.vms, r.qps, r.burst
    );
    let _ = writeln!(
        out,
        "{:<15} {:>11} {:>8} {:>8} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "phase",
        "machines",
        "wall s",
        "bound s",
        "ratio",
        "requests",
        "req/m",
        "mcm",
        "mc",
        "cpu s",
        "%core",
        "mcmMiB",
        "mcMiB"
    );
    for p in &r.phases {
        let _ = writeln!(
            out,
            "{:<15} {:>11} {:>8.1} {:>8} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7.1} {:>7.2} {:>7.1} {:>7.1}",
            p.name,
            format!("{}→{}", p.from_machines, p.to_machines),
            p.wall_seconds,
            opt(p.qps_bound_seconds, 1),
            opt(p.bound_ratio, 2),
            p.requests.total(),
            opt(p.requests_per_machine, 2),
            p.requests.manager,
            p.requests.machine_controller,
            p.manager_cpu_seconds + p.machine_controller_cpu_seconds,
            p.cpu_percent_of_a_core,
            p.manager_peak_rss_mib,
            p.machine_controller_peak_rss_mib,
        );
    }
    if !r.cycles.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<6} {:>10} {:>10} {:>10} {:>9} {:>10} {:>8}",
            "cycle", "mcm RSS", "mc RSS", "both MiB", "rest in s", "when gone", "tracked"
        );
        for c in &r.cycles {
            let _ = writeln!(
                out,
                "{:<6} {:>10.1} {:>10.1} {:>10.1} {:>9.1} {:>10.1} {:>8}",
                c.cycle,
                c.manager_rss_mib,
                c.machine_controller_rss_mib,
                c.total_mib(),
                c.settled_seconds,
                c.gone.total_mib(),
                c.tracked_entries.map_or("-".into(), |t| format!("{t:.0}")),
            );
        }
        if let Some(g) = rss_growth(r) {
            let _ = writeln!(
                out,
                "at rest after the last cycle vs the first: {:+.1} %",
                g * 100.0
            );
        }
        if let Some(g) = rss_growth_when_gone(r) {
            let _ = writeln!(
                out,
                "the moment the last fleet was gone vs the first: {:+.1} %",
                g * 100.0
            );
        }
    }
    for p in r.phases.iter().filter(|p| p.ideal_seconds.is_some()) {
        let _ = writeln!(
            out,
            "\n{}: {} batches x first batch {}s = ideal {}s; took {:.1}s ({}x the ideal)",
            p.name,
            p.batches.unwrap_or_default(),
            opt(p.first_batch_seconds, 1),
            opt(p.ideal_seconds, 1),
            p.wall_seconds,
            opt(p.ideal_seconds.map(|i| p.wall_seconds / i), 2),
        );
    }
    for p in &r.phases {
        let changed = p.machines_changed().max(1) as f64;
        let _ = writeln!(
            out,
            "\n{}: requests by controller, verb and resource (per machine)",
            p.name
        );
        let mut kinds: Vec<_> = p.requests.by_kind.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (kind, count) in kinds {
            let _ = writeln!(
                out,
                "  {:<60} {:>7} {:>7.2}",
                kind,
                count,
                *count as f64 / changed
            );
        }
    }
    out
}

/// A line of the soak plot: its label, colour and value per cycle.
type Series = (&'static str, plotters::style::RGBColor, fn(&Cycle) -> f64);

/// Draws the soak's resident memory after each cycle: the manager, the machine controller and
/// both together, with the 10 % band above the first cycle.
pub fn plot_rss(r: &Results, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let n = r.cycles.len().max(1);
    let y_max = r
        .cycles
        .iter()
        .map(|c| c.total_mib().max(c.gone.total_mib()))
        .fold(1.0f64, f64::max)
        * 1.25;
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "resident memory after each 0 -> {} -> 0 cycle, --kube-api-qps {}",
                    r.machines, r.qps
                ),
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.5f64..(n as f64 + 0.5), 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("cycle")
            .y_desc("MiB (VmRSS)")
            .draw()?;
        let series: [Series; 4] = [
            ("both, at rest", BLUE, Cycle::total_mib),
            ("manager, at rest", GREEN, |c| c.manager_rss_mib),
            ("machine controller, at rest", RED, |c| {
                c.machine_controller_rss_mib
            }),
            ("both, the moment the fleet was gone", CYAN, |c| {
                c.gone.total_mib()
            }),
        ];
        for (label, colour, value) in series {
            let points: Vec<(f64, f64)> = r
                .cycles
                .iter()
                .map(|c| (c.cycle as f64, value(c)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
        }
        if let Some(first) = r.cycles.first() {
            let limit = first.total_mib() * 1.1;
            chart
                .draw_series(LineSeries::new(
                    [(0.5, limit), (n as f64 + 0.5, limit)],
                    BLACK.stroke_width(1),
                ))?
                .label("first cycle at rest + 10 %")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}

/// Draws machines over time, one line per phase (Running machines while scaling up, machines
/// left while scaling down, new Running machines in a rollout), with the QPS bound of each
/// scale-up as a dashed line.
pub fn plot(r: &Results, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let phases: Vec<&Phase> = r.phases.iter().filter(|p| p.name != "idle").collect();
    let x_max = phases
        .iter()
        .flat_map(|p| [p.wall_seconds, p.qps_bound_seconds.unwrap_or(0.0)])
        .fold(1.0f64, f64::max)
        * 1.05;
    let y_max = (r.machines as f64 * 1.05).max(1.0);
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{} machines ({} VMs), --kube-api-qps {}",
                    r.machines, r.vms, r.qps
                ),
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the phase began")
            .y_desc("machines")
            .draw()?;
        let colours = [BLUE, RED, GREEN, MAGENTA, CYAN];
        for (i, p) in phases.iter().enumerate() {
            let colour = colours[i % colours.len()];
            let value = |s: &Sample| match p.name.as_str() {
                "scale-down" => s.machines,
                "rollout" | "rescale" => s.new_running,
                _ => s.running,
            };
            let label = match p.name.as_str() {
                "scale-down" => format!("{}: machines left", p.name),
                "rollout" | "rescale" => format!("{}: new machines Running", p.name),
                _ => format!("{}: machines Running", p.name),
            };
            chart
                .draw_series(LineSeries::new(
                    p.samples.iter().map(|s| (s.seconds, value(s) as f64)),
                    colour.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
            if let Some(bound) = p.qps_bound_seconds {
                let (start, end) = if p.to_machines >= p.from_machines {
                    (0.0, r.machines as f64)
                } else {
                    (r.machines as f64, 0.0)
                };
                chart
                    .draw_series(DashedLineSeries::new(
                        [(0.0, start), (bound, end)],
                        6,
                        4,
                        colour.stroke_width(1),
                    ))?
                    .label(format!("{}: QPS bound {:.0}s", p.name, bound))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow!("drawing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, from: usize, to: usize, wall: f64, writes: [u64; 2]) -> Phase {
        let t: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut p = Phase::new(
            name,
            from,
            to,
            wall,
            t,
            t,
            [1.0, 2.0],
            [10240, 20480],
            vec![],
        );
        p.requests = Tally {
            manager: writes[0] + 5,
            machine_controller: writes[1] + 5,
            manager_writes: writes[0],
            machine_controller_writes: writes[1],
            ..Tally::default()
        };
        p
    }

    /// Results of kwok VMs at qps 20, burst 30.
    fn results(bench: &str, machines: usize, phases: Vec<Phase>) -> Results {
        Results {
            bench: bench.into(),
            machines,
            qps: 20.0,
            burst: 30,
            vms: "kwok".into(),
            phases,
            cycles: vec![],
        }
    }

    #[test]
    fn the_soak_compares_the_last_cycle_with_the_first_and_is_plotted() {
        let cycle = |cycle, mc: f64| Cycle {
            cycle,
            manager_rss_mib: 20.0,
            machine_controller_rss_mib: mc,
            gone: Resident {
                manager_mib: 20.0,
                machine_controller_mib: mc + 10.0,
            },
            settled_seconds: 5.0,
            tracked_entries: Some(0.0),
        };
        let mut r = results("soak", 10, vec![]);
        assert_eq!(rss_growth(&r), None);
        r.cycles = vec![cycle(1, 30.0)];
        assert_eq!(rss_growth(&r), None, "one cycle compares with nothing");
        r.cycles.push(cycle(2, 35.0));
        let growth = rss_growth(&r).expect("two cycles");
        assert!((growth - 0.10).abs() < 1e-9, "{growth}");
        assert!(table(&r).contains("+10.0 %"));
        // 60 -> 65 the moment each fleet was gone.
        let when_gone = rss_growth_when_gone(&r).expect("two cycles");
        assert!((when_gone - 5.0 / 60.0).abs() < 1e-9, "{when_gone}");
        assert!(table(&r).contains("+8.3 %"));
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("soak.svg");
        plot_rss(&r, &path).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("svg");
        assert!(svg.contains("machine controller"));
    }

    #[test]
    fn the_bound_is_the_busier_controllers_writes_beyond_its_burst() {
        let mut p = phase("scale-up", 0, 100, 40.0, [130, 530]);
        p.fill_bounds(20.0, 30);
        assert_eq!(p.qps_bound_seconds, Some(25.0));
        assert_eq!(p.bound_ratio, Some(1.6));
        assert_eq!(p.requests_per_machine, Some(6.7));
        assert_eq!(p.manager_peak_rss_mib, 10.0);
        assert!((p.cpu_percent_of_a_core - 7.5).abs() < 1e-9);
    }

    #[test]
    fn requests_per_machine_are_checked_against_targets_and_limits() {
        let mut up = phase("scale-up", 0, 100, 30.0, [100, 500]);
        up.fill_bounds(20.0, 30);
        let mut down = phase("scale-down", 100, 0, 30.0, [100, 500]);
        down.fill_bounds(20.0, 30);
        let r = results("scale-down", 100, vec![up, down]);
        // 6.1 requests per machine: above creation's 6, within deletion's 8.
        assert_eq!(
            phases_above_request_target(&r),
            vec!["scale-up (6.1 > 6)".to_string()]
        );
        let limits = |l: &[(&str, f64)]| -> Vec<(String, f64)> {
            l.iter().map(|(p, n)| (p.to_string(), *n)).collect()
        };
        assert!(phases_above_request_limits(&r, &limits(&[("scale-up", 6.5)])).is_empty());
        assert_eq!(
            phases_above_request_limits(&r, &limits(&[("scale-down", 6.0), ("rollout", 9.0)])),
            vec![
                "scale-down (6.1 > 6)".to_string(),
                "rollout (no such phase)".to_string()
            ]
        );
    }

    #[test]
    fn only_phases_beyond_the_ratio_limit_are_reported() {
        let mut slow = phase("rescale", 50, 50, 60.0, [130, 530]);
        slow.fill_bounds(20.0, 30);
        let mut fine = phase("scale-up", 0, 100, 30.0, [130, 530]);
        fine.fill_bounds(20.0, 30);
        let r = results("scale-down", 50, vec![fine, slow]);
        assert_eq!(
            phases_above_ratio(&r, 2.0),
            vec!["rescale (2.40x: 60.0s)".to_string()]
        );
        assert!(phases_above_ratio(&r, 2.5).is_empty());
    }

    #[test]
    fn a_rollout_counts_every_machine_and_has_an_ideal() {
        let mut p = phase("rollout", 100, 100, 90.0, [10, 10]);
        p.first_batch_seconds = Some(6.0);
        p.batches = Some(10);
        p.fill_bounds(20.0, 30);
        assert_eq!(p.machines_changed(), 100);
        assert_eq!(p.ideal_seconds, Some(60.0));
        // Writes within the burst set no bound.
        assert_eq!(p.qps_bound_seconds, None);
        let mut idle = phase("idle", 100, 100, 60.0, [0, 0]);
        idle.fill_bounds(20.0, 30);
        assert_eq!(idle.requests_per_machine, None);
    }

    #[test]
    fn the_table_names_every_phase_and_the_plot_is_written() {
        let mut p = phase("scale-up", 0, 10, 4.0, [40, 60]);
        p.samples = vec![
            Sample {
                seconds: 0.0,
                machines: 0,
                running: 0,
                new_running: 0,
                ready_nodes: 0,
            },
            Sample {
                seconds: 4.0,
                machines: 10,
                running: 10,
                new_running: 10,
                ready_nodes: 10,
            },
        ];
        p.requests
            .by_kind
            .insert("machine-controller patch machines/status".into(), 20);
        p.fill_bounds(20.0, 30);
        let r = results("scale", 10, vec![p]);
        let t = table(&r);
        assert!(t.contains("scale-up") && t.contains("0→10"), "{t}");
        assert!(
            t.contains("machine-controller patch machines/status"),
            "{t}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        plot(&r, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg") && svg.contains("polyline"), "{svg}");
    }
}
