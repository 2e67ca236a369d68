//! Rollout scenarios replayed with the MachineDeployment and MachineSet decisions and a
//! simulated machine lifecycle running in a random order under fixed seeds (as Cluster API
//! does). Every scenario must converge within a bounded number of steps, and the surge and
//! availability invariants must hold after every single step.

use crate::machinedeployment::decide::{
    Action, SetState, Snapshot, Strategy, apply, decide, sets_to_prune,
};
use crate::machinedeployment::model::Rollout;
use crate::machineset::decide::{MachineView, SetInput, plan_replicas};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::MachinePhase;
use mcm_api::intstr::resolve_fenceposts;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
struct SimMachine {
    name: String,
    set: String,
    running: bool,
    terminating: bool,
    created: i64,
}

#[derive(Debug, Clone)]
struct SimSet {
    state: SetState,
    template: u32,
}

#[derive(Debug, Clone, Copy)]
enum Limits {
    Int(i32, i32),
    Percent(&'static str, &'static str),
    Recreate,
}

struct Sim {
    rng: StdRng,
    replicas: i32,
    limits: Limits,
    paused: bool,
    template: u32,
    sets: Vec<SimSet>,
    machines: Vec<SimMachine>,
    tick: i64,
    serial: u32,
    /// Upper bound of non-terminating machines, `None` while not checked.
    surge_bound: Option<i32>,
    /// Lower bound of available machines once reached, `None` while not checked.
    availability_floor: Option<i32>,
    floor_reached: bool,
}

impl Sim {
    fn new(seed: u64, replicas: i32, limits: Limits) -> Self {
        Sim {
            rng: StdRng::seed_from_u64(seed),
            replicas,
            limits,
            paused: false,
            template: 1,
            sets: Vec::new(),
            machines: Vec::new(),
            tick: 1,
            serial: 0,
            surge_bound: None,
            availability_floor: None,
            floor_reached: false,
        }
    }

    fn strategy(&self) -> Strategy {
        match self.limits {
            Limits::Recreate => Strategy::Recreate,
            Limits::Int(s, u) => {
                let (max_surge, max_unavailable) = resolve_fenceposts(
                    Some(&IntOrString::Int(s)),
                    Some(&IntOrString::Int(u)),
                    self.replicas,
                )
                .expect("valid limits");
                Strategy::RollingUpdate {
                    max_surge,
                    max_unavailable,
                }
            }
            Limits::Percent(s, u) => {
                let (max_surge, max_unavailable) = resolve_fenceposts(
                    Some(&IntOrString::String(s.into())),
                    Some(&IntOrString::String(u.into())),
                    self.replicas,
                )
                .expect("valid limits");
                Strategy::RollingUpdate {
                    max_surge,
                    max_unavailable,
                }
            }
        }
    }

    /// Arms the invariants for a rollout phase with fixed replicas.
    fn arm_invariants(&mut self) {
        let strategy = self.strategy();
        let current = self.active_machines();
        self.surge_bound = Some((self.replicas + strategy.max_surge()).max(current));
        self.availability_floor = match strategy {
            Strategy::Recreate => None,
            Strategy::RollingUpdate { .. } | Strategy::InPlaceUpdate { .. } => {
                Some(self.replicas - strategy.max_unavailable())
            }
        };
        self.floor_reached = false;
    }

    fn active_machines(&self) -> i32 {
        self.machines.iter().filter(|m| !m.terminating).count() as i32
    }

    fn available_machines(&self) -> i32 {
        self.machines
            .iter()
            .filter(|m| !m.terminating && m.running)
            .count() as i32
    }

    fn set_state(&self, set: &SimSet) -> SetState {
        let mut s = set.state.clone();
        let mine = self.machines.iter().filter(|m| m.set == s.name);
        s.machines = 0;
        s.terminating = 0;
        s.ready = 0;
        s.available = 0;
        for m in mine {
            if m.terminating {
                s.terminating += 1;
            } else {
                s.machines += 1;
                if m.running {
                    s.ready += 1;
                    s.available += 1;
                }
            }
        }
        s
    }

    fn snapshot(&self) -> Snapshot {
        let mut new_set = None;
        let mut old_sets = Vec::new();
        for set in &self.sets {
            let state = self.set_state(set);
            if set.template == self.template {
                new_set = Some(state);
            } else {
                old_sets.push(state);
            }
        }
        Snapshot {
            rollout: Rollout {
                replicas: self.replicas,
                strategy: self.strategy(),
                paused: self.paused,
                frozen: false,
            },
            new_set,
            old_sets,
        }
    }

    fn deployment_step(&mut self) -> Vec<Action> {
        let mut snap = self.snapshot();
        let actions = decide(&snap);
        self.serial += 1;
        let new_name = format!("set-v{}-{}", self.template, self.serial);
        apply(
            &mut snap,
            &actions,
            &new_name,
            Timestamp::from_second(self.tick).ok(),
        );
        for a in &actions {
            if let Action::CreateNewSet { .. } = a {
                let state = snap.new_set.clone().expect("created");
                self.sets.push(SimSet {
                    state,
                    template: self.template,
                });
            }
        }
        for set in &mut self.sets {
            if let Some(s) = snap
                .new_set
                .iter()
                .chain(snap.old_sets.iter())
                .find(|s| s.name == set.state.name)
            {
                set.state.replicas = s.replicas;
                set.state.desired_annotation = s.desired_annotation;
                set.state.max_annotation = s.max_annotation;
            }
        }
        if actions.is_empty() && !self.paused && snap.is_complete() {
            let prune = sets_to_prune(&snap.old_sets, 1);
            self.sets.retain(|s| !prune.contains(&s.state.name));
        }
        actions
    }

    fn views(&self, set: &str) -> Vec<MachineView> {
        self.machines
            .iter()
            .filter(|m| m.set == set)
            .map(|m| MachineView {
                name: m.name.clone(),
                phase: Some(if m.terminating {
                    MachinePhase::Terminating
                } else if m.running {
                    MachinePhase::Running
                } else {
                    MachinePhase::Pending
                }),
                priority: 3,
                marked_for_deletion: None,
                created: Timestamp::from_second(m.created).ok(),
                deleting: m.terminating,
                phase_since: None,
                fully_labeled: true,
                preserved: false,
                auto_preserved: false,
                preserve_expiry: None,
                keep_if_failed: false,
                failure: None,
                update_successful: false,
            })
            .collect()
    }

    /// Reconciles one set; returns whether it changed anything.
    fn set_step(&mut self, idx: usize) -> bool {
        let name = self.sets[idx].state.name.clone();
        let plan = plan_replicas(
            &SetInput {
                replicas: self.sets[idx].state.replicas,
                ..SetInput::default()
            },
            &self.views(&name),
        );
        for _ in 0..plan.create {
            self.serial += 1;
            self.tick += 1;
            self.machines.push(SimMachine {
                name: format!("{name}-m{}", self.serial),
                set: name.clone(),
                running: false,
                terminating: false,
                created: self.tick,
            });
        }
        for d in &plan.delete {
            if let Some(m) = self.machines.iter_mut().find(|m| &m.name == d) {
                m.terminating = true;
            }
        }
        plan.create > 0 || !plan.delete.is_empty()
    }

    fn random_step(&mut self) {
        self.tick += 1;
        match self.rng.random_range(0..4) {
            0 => {
                self.deployment_step();
            }
            1 => {
                if !self.sets.is_empty() {
                    let i = self.rng.random_range(0..self.sets.len());
                    self.set_step(i);
                }
            }
            2 => {
                let pending: Vec<usize> = (0..self.machines.len())
                    .filter(|i| !self.machines[*i].running && !self.machines[*i].terminating)
                    .collect();
                if !pending.is_empty() {
                    let i = pending[self.rng.random_range(0..pending.len())];
                    self.machines[i].running = true;
                }
            }
            _ => {
                let term: Vec<usize> = (0..self.machines.len())
                    .filter(|i| self.machines[*i].terminating)
                    .collect();
                if !term.is_empty() {
                    let i = term[self.rng.random_range(0..term.len())];
                    self.machines.remove(i);
                }
            }
        }
        self.check_invariants();
    }

    fn check_invariants(&mut self) {
        let active = self.active_machines();
        if let Some(bound) = self.surge_bound {
            assert!(
                active <= bound,
                "surge violated: {active} machines > {bound}; sets {:?}",
                self.sets
            );
        }
        if let Some(floor) = self.availability_floor {
            let available = self.available_machines();
            if self.floor_reached {
                assert!(
                    available >= floor,
                    "availability violated: {available} < {floor}; sets {:?} machines {:?}",
                    self.sets,
                    self.machines
                );
            } else if available >= floor {
                self.floor_reached = true;
            }
        }
    }

    /// Quiescent and complete: every machine is a running machine of the current template,
    /// exactly `replicas` of them, and no controller wants to act.
    fn converged(&mut self) -> bool {
        let snap = self.snapshot();
        if !decide(&snap).is_empty() {
            return false;
        }
        let all_new_running = self.machines.iter().all(|m| {
            !m.terminating
                && m.running
                && self
                    .sets
                    .iter()
                    .any(|s| s.state.name == m.set && s.template == self.template)
        });
        let idle_sets = (0..self.sets.len()).all(|i| {
            let set = &self.sets[i];
            let plan = plan_replicas(
                &SetInput {
                    replicas: set.state.replicas,
                    ..SetInput::default()
                },
                &self.views(&set.state.name),
            );
            plan.create == 0 && plan.delete.is_empty()
        });
        all_new_running && idle_sets && self.machines.len() as i32 == self.replicas
    }

    fn run_until_converged(&mut self, max_steps: usize) -> usize {
        for step in 0..max_steps {
            if self.converged() {
                return step;
            }
            self.random_step();
        }
        panic!(
            "did not converge within {max_steps} steps: replicas {} sets {:?} machines {:?}",
            self.replicas, self.sets, self.machines
        );
    }

    fn run_steps(&mut self, n: usize) {
        for _ in 0..n {
            self.random_step();
        }
    }
}

const MAX_STEPS: usize = 4000;
const SEEDS: [u64; 6] = [1, 2, 3, 42, 1234, 98765];

#[test]
fn scale_up_and_down() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 0, Limits::Int(1, 0));
        sim.run_until_converged(MAX_STEPS);
        sim.replicas = 5;
        sim.run_until_converged(MAX_STEPS);
        assert_eq!(sim.available_machines(), 5);
        sim.replicas = 2;
        sim.run_until_converged(MAX_STEPS);
        assert_eq!(sim.sets.len(), 1, "a scale keeps the single set");
    }
}

fn rolling_update(seed: u64, replicas: i32, limits: Limits) {
    let mut sim = Sim::new(seed, replicas, limits);
    sim.run_until_converged(MAX_STEPS);
    sim.template = 2;
    sim.arm_invariants();
    let steps = sim.run_until_converged(MAX_STEPS);
    assert!(steps > 0);
    assert_eq!(sim.available_machines(), replicas);
}

#[test]
fn rolling_updates_with_int_limits() {
    for seed in SEEDS {
        for (s, u) in [(1, 0), (0, 1), (2, 1), (3, 3), (1, 1), (0, 0)] {
            rolling_update(seed, 4, Limits::Int(s, u));
            rolling_update(seed, 7, Limits::Int(s, u));
        }
    }
}

#[test]
fn rolling_updates_with_percentages() {
    for seed in SEEDS {
        for (s, u) in [("25%", "25%"), ("50%", "0%"), ("0%", "30%"), ("100%", "0%")] {
            rolling_update(seed, 4, Limits::Percent(s, u));
            rolling_update(seed, 10, Limits::Percent(s, u));
        }
    }
}

#[test]
fn recreate() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 3, Limits::Recreate);
        sim.run_until_converged(MAX_STEPS);
        sim.template = 2;
        sim.arm_invariants();
        sim.run_until_converged(MAX_STEPS);
        assert_eq!(sim.available_machines(), 3);
    }
}

#[test]
fn scale_during_rollout_finishes_both() {
    for seed in SEEDS {
        for (new_replicas, s, u) in [(8, 1, 0), (2, 1, 0), (6, 2, 1), (3, 0, 1)] {
            let mut sim = Sim::new(seed, 4, Limits::Int(s, u));
            sim.run_until_converged(MAX_STEPS);
            sim.template = 2;
            sim.run_steps(15);
            sim.replicas = new_replicas;
            sim.run_until_converged(MAX_STEPS);
            assert_eq!(sim.available_machines(), new_replicas);
        }
    }
}

#[test]
fn template_change_and_scale_up_together_with_two_active_sets() {
    // MCM #816: more than one active set, then a new template and a scale-up at once.
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 4, Limits::Int(1, 0));
        sim.run_until_converged(MAX_STEPS);
        sim.template = 2;
        // Advance until two sets are active.
        for _ in 0..MAX_STEPS {
            if sim.sets.iter().filter(|s| s.state.replicas > 0).count() >= 2 {
                break;
            }
            sim.random_step();
        }
        sim.template = 3;
        sim.replicas = 6;
        sim.run_until_converged(MAX_STEPS);
        assert_eq!(sim.available_machines(), 6);
    }
}

#[test]
fn pause_stops_and_resume_finishes_a_rollout() {
    for seed in SEEDS {
        let mut sim = Sim::new(seed, 4, Limits::Int(1, 0));
        sim.run_until_converged(MAX_STEPS);
        sim.template = 2;
        sim.arm_invariants();
        sim.run_steps(10);
        sim.paused = true;
        // Let the sets settle on their paused replicas.
        sim.run_steps(300);
        let replicas: Vec<i32> = sim.sets.iter().map(|s| s.state.replicas).collect();
        for _ in 0..500 {
            sim.random_step();
            let now: Vec<i32> = sim.sets.iter().map(|s| s.state.replicas).collect();
            assert_eq!(now, replicas, "a paused deployment must not scale its sets");
        }
        sim.paused = false;
        sim.run_until_converged(MAX_STEPS);
        assert_eq!(sim.available_machines(), 4);
    }
}

#[test]
fn paused_deployment_still_scales() {
    let mut sim = Sim::new(7, 3, Limits::Int(1, 0));
    sim.run_until_converged(MAX_STEPS);
    sim.paused = true;
    sim.replicas = 5;
    sim.run_until_converged(MAX_STEPS);
    assert_eq!(sim.available_machines(), 5);
}
