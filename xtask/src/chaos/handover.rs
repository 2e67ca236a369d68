//! Leader hand-over trials: two replicas of each binary with leader election. During an
//! operation on the MachineDeployment the leader of one binary or of both is SIGKILLed, or
//! paused (SIGSTOP) until the standby has taken the lease and then resumed; the standby
//! must take over, a resumed leader must exit without acting, and the API server's audit log
//! of writes must show that no two replicas of a binary ever acted at once: no replica
//! writes after another replica of its binary has written, and none after it was deposed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::{CLASS, DEPLOYMENT, Operation, Report, Trial, Victim, converge_fleet, operate};
use crate::e2e::ctx::{Ctx, WAIT};
use crate::e2e::env::{Check, Controller, ControllerKind, wait_for};

/// Lease duration of the replicas: short, so a hand-over takes seconds.
const LEASE_DURATION: &str = "4s";

/// Leader-election flags of every replica.
fn leader_flags() -> Vec<String> {
    [
        "--leader-elect=true".to_string(),
        format!("--leader-elect-lease-duration={LEASE_DURATION}"),
        "--leader-elect-renew-deadline=3s".into(),
        "--leader-elect-retry-period=1s".into(),
    ]
    .to_vec()
}

/// How a trial takes the leader out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// SIGKILL.
    Kill,
    /// SIGSTOP until the standby holds the lease and has had time to act, then SIGCONT.
    Pause,
}

/// Figures of the hand-over trials.
#[derive(Debug, Default)]
pub struct Figures {
    trials: usize,
    kills: usize,
    pauses: usize,
    handovers: usize,
    writes: usize,
    writers: usize,
}

impl Figures {
    /// Rows of the report table.
    pub fn print(&self) {
        println!("| leader hand-over trials | {} |", self.trials);
        println!(
            "| leaders SIGKILLed / paused beyond their lease | {} / {} |",
            self.kills, self.pauses
        );
        println!("| hand-overs to the standby | {} |", self.handovers);
        println!(
            "| audited writes of the replicas (replicas that wrote) | {} ({}) |",
            self.writes, self.writers
        );
    }
}

/// The replicas of one binary.
struct Replicas {
    kind: ControllerKind,
    /// The name of its Lease.
    lease: &'static str,
    /// Prefix of the replicas' names.
    prefix: &'static str,
    live: Vec<Controller>,
    /// Every replica's pid, in start order.
    pids: Vec<u32>,
}

impl Replicas {
    fn new(kind: ControllerKind, lease: &'static str, prefix: &'static str) -> Replicas {
        Replicas {
            kind,
            lease,
            prefix,
            live: Vec::new(),
            pids: Vec::new(),
        }
    }

    /// Starts one more replica and waits until it is ready (a standby is ready too).
    async fn add(&mut self, ctx: &Ctx<'_>) -> Result<()> {
        let name = format!("{}-{}", self.prefix, self.pids.len() + 1);
        let c = ctx.spawn_with(self.kind, &name, None, &super::timings(), &leader_flags())?;
        self.pids.push(c.pid());
        c.await_ready(WAIT).await?;
        self.live.push(c);
        Ok(())
    }

    /// The index in `live` of the replica holding the lease, once one does.
    async fn leader(&self, ctx: &Ctx<'_>) -> Result<usize> {
        let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        wait_for(
            &format!("a live replica to hold the lease {}", self.lease),
            WAIT,
            || async {
                let holder = leases
                    .get_opt(self.lease)
                    .await?
                    .and_then(|l| l.spec?.holder_identity)
                    .unwrap_or_default();
                let at = self
                    .live
                    .iter()
                    .position(|c| identity_pid(&holder) == Some(c.pid()));
                Ok(match at {
                    Some(i) => Check::Done(i),
                    None => Check::Pending(format!("holder {holder:?}")),
                })
            },
        )
        .await
    }

    /// Every live replica still runs.
    fn alive(&self) -> Result<()> {
        super::all_alive(&self.live)
    }
}

/// The pid at the end of a replica identity (`<host>_<pid>`).
fn identity_pid(identity: &str) -> Option<u32> {
    identity.rsplit_once('_')?.1.parse().ok()
}

/// Runs `n` hand-over trials and checks the audit log.
pub async fn trials(ctx: &mut Ctx<'_>, seed: u64, n: usize, report: &mut Report) -> Result<()> {
    let audit = ctx
        .cp
        .audit_log_path()
        .context("the control plane does not audit writes")?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1eade7);
    ctx.create_class(CLASS, json!({})).await?;
    let mut sets = [
        Replicas::new(ControllerKind::Machine, "machine-controller", "mc"),
        Replicas::new(ControllerKind::Manager, "machine-controller-manager", "mcm"),
    ];
    for set in &mut sets {
        set.add(ctx).await?;
        set.add(ctx).await?;
    }
    let mut figures = Figures::default();
    // When each deposed replica was seen to have lost its lease, by pid.
    let mut deposed = BTreeMap::new();
    let mut replicas = 3;
    let mut rev: Option<String> = None;
    ctx.create_deployment(DEPLOYMENT, replicas, CLASS).await?;
    ctx.await_fleet(3, None).await?;
    for i in 0..n {
        let trial = Trial::draw(&mut rng);
        let mode = if rng.random_bool(0.5) {
            Mode::Pause
        } else {
            Mode::Kill
        };
        let began = Instant::now();
        replicas = trial.replicas_after(replicas);
        println!(
            "hand-over {:>2}: {:?} to {replicas}, {mode:?} the leader of {:?} after {}ms",
            i + 1,
            trial.operation,
            trial.victim,
            trial.delay.as_millis()
        );
        operate(ctx, &trial, 100 + i, replicas).await?;
        tokio::time::sleep(trial.delay).await;
        let victims: &[usize] = match trial.victim {
            Victim::MachineController => &[0],
            Victim::Manager => &[1],
            Victim::Both => &[0, 1],
        };
        let mut paused = Vec::new();
        for &v in victims {
            let at = sets[v].leader(ctx).await?;
            let leader = sets[v].live.remove(at);
            match mode {
                Mode::Kill => {
                    leader.kill();
                    figures.kills += 1;
                }
                Mode::Pause => {
                    leader.pause();
                    figures.pauses += 1;
                    paused.push(leader);
                }
            }
        }
        // The standbys take over; from then on the old leaders hold no lease.
        for &v in victims {
            sets[v].leader(ctx).await?;
            figures.handovers += 1;
        }
        let now = Timestamp::now();
        for c in &paused {
            deposed.insert(c.pid(), now);
        }
        if !paused.is_empty() {
            // The fault: the old leaders stay paused while the new ones act.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        for c in paused {
            c.resume();
            let exited = wait_for(
                &format!("{} to exit after resuming without its lease", c.name),
                Duration::from_secs(30),
                || async {
                    Ok(if c.is_running() {
                        Check::Pending("still running".into())
                    } else {
                        Check::Done(())
                    })
                },
            )
            .await;
            if let Err(e) = exited {
                report
                    .violations
                    .push(format!("hand-over {}: {e:#}", i + 1));
            }
        }
        for &v in victims {
            sets[v].add(ctx).await?;
        }
        if trial.operation == Operation::DeleteAndRecreate {
            super::recreate(ctx, replicas).await?;
            rev = None;
        }
        if trial.operation == Operation::Rollout {
            rev = Some((100 + i).to_string());
        }
        let converged = converge_fleet(ctx, replicas, rev.as_deref())
            .await
            .and_then(|()| sets.iter().try_for_each(Replicas::alive));
        if let Err(e) = converged {
            report
                .violations
                .push(format!("hand-over {} ({trial:?}, {mode:?}): {e:#}", i + 1));
            break;
        }
        let took = began.elapsed();
        report.worst_convergence = report.worst_convergence.max(took);
        figures.trials += 1;
        println!("              converged in {:.1}s", took.as_secs_f64());
    }
    let ours: BTreeSet<u32> = sets.iter().flat_map(|s| s.pids.iter().copied()).collect();
    let writes: Vec<Write> = read_audit(&audit)?
        .into_iter()
        .filter(|w| ours.contains(&w.pid))
        .collect();
    figures.writes = writes.len();
    figures.writers = writes.iter().map(|w| w.pid).collect::<BTreeSet<_>>().len();
    if figures.writes == 0 {
        report
            .violations
            .push("the audit log holds no write of the replicas".into());
    }
    report
        .violations
        .extend(concurrent_writes(&writes, &deposed));
    report.handover = Some(figures);
    Ok(())
}

/// One write request of a replica, from the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    at: Timestamp,
    /// The binary, from the user agent.
    binary: String,
    pid: u32,
    verb: String,
    /// `<resource>/<name>` (or `<resource>/` for a create with a generated name).
    object: String,
}

/// The writes of the replicas in the audit log at `path` (other requests are skipped).
fn read_audit(path: &Path) -> Result<Vec<Write>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.lines().filter_map(parse_audit_event).collect())
}

/// A replica's write from one audit event (a JSON line); `None` for anything else.
fn parse_audit_event(line: &str) -> Option<Write> {
    let event: Value = serde_json::from_str(line).ok()?;
    let verb = event["verb"].as_str()?;
    if !matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    ) {
        return None;
    }
    let agent = event["userAgent"].as_str()?;
    let (binary, _) = agent.split_once('/')?;
    let (_, identity) = agent.split_once(" replica/")?;
    let object = &event["objectRef"];
    Some(Write {
        at: event["requestReceivedTimestamp"].as_str()?.parse().ok()?,
        binary: binary.to_string(),
        pid: identity_pid(identity)?,
        verb: verb.to_string(),
        object: format!(
            "{}/{}",
            object["resource"].as_str()?,
            object["name"].as_str().unwrap_or_default()
        ),
    })
}

/// Writes that show two replicas of one binary acting at once: a replica writing after
/// another replica of its binary has written, or after it was `deposed` (seen to have lost
/// its lease). Lease writes are the election itself and do not count. Pure.
fn concurrent_writes(writes: &[Write], deposed: &BTreeMap<u32, Timestamp>) -> Vec<String> {
    let mut sorted: Vec<&Write> = writes
        .iter()
        .filter(|w| !w.object.starts_with("leases/"))
        .collect();
    sorted.sort_by_key(|w| w.at);
    let mut problems = Vec::new();
    // Per binary: the replica writing now and those that wrote before it.
    let mut current: BTreeMap<&str, u32> = BTreeMap::new();
    let mut former: BTreeSet<(&str, u32)> = BTreeSet::new();
    for w in sorted {
        if let Some(&since) = deposed.get(&w.pid)
            && w.at > since
        {
            problems.push(format!(
                "{} pid {} wrote after losing its lease (at {since}): {} {} at {}",
                w.binary, w.pid, w.verb, w.object, w.at
            ));
        }
        if former.contains(&(w.binary.as_str(), w.pid)) {
            problems.push(format!(
                "{} pid {} wrote after another replica had taken over: {} {} at {}",
                w.binary, w.pid, w.verb, w.object, w.at
            ));
        }
        if let Some(before) = current.insert(&w.binary, w.pid)
            && before != w.pid
        {
            former.insert((w.binary.as_str(), before));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(at: &str, binary: &str, pid: u32, object: &str) -> Write {
        Write {
            at: at.parse().unwrap(),
            binary: binary.into(),
            pid,
            verb: "patch".into(),
            object: object.into(),
        }
    }

    const MC: &str = "machine-controller-local";
    const MCM: &str = "machine-controller-manager";

    #[test]
    fn an_audit_line_of_a_replica_is_a_write() {
        let line = r#"{"kind":"Event","level":"Metadata","stage":"ResponseComplete","verb":"patch","userAgent":"machine-controller-local/0.1.0 (linux/x86_64) replica/host_4242","objectRef":{"resource":"machines","namespace":"ns","name":"m-1","apiGroup":"machine.sapcloud.io"},"requestReceivedTimestamp":"2026-11-23T10:00:00.123456Z"}"#;
        assert_eq!(
            parse_audit_event(line),
            Some(write(
                "2026-11-23T10:00:00.123456Z",
                MC,
                4242,
                "machines/m-1"
            ))
        );
        // Reads, and requests of other clients, are not.
        assert_eq!(parse_audit_event(&line.replace("patch", "get")), None);
        assert_eq!(
            parse_audit_event(&line.replace(" replica/host_4242", "")),
            None
        );
    }

    #[test]
    fn a_clean_hand_over_has_no_concurrent_writes() {
        let writes = [
            write("2026-11-23T10:00:00Z", MC, 1, "machines/a"),
            write("2026-11-23T10:00:01Z", MCM, 7, "machines/a"),
            write("2026-11-23T10:00:02Z", MC, 2, "machines/a"),
            write("2026-11-23T10:00:03Z", MC, 2, "machines/b"),
        ];
        assert!(concurrent_writes(&writes, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_former_leader_writing_again_is_reported() {
        let writes = [
            write("2026-11-23T10:00:00Z", MC, 1, "machines/a"),
            write("2026-11-23T10:00:02Z", MC, 2, "machines/b"),
            write("2026-11-23T10:00:03Z", MC, 1, "machines/c"),
            // Lease writes of candidates are the election, not acting.
            write("2026-11-23T10:00:04Z", MC, 2, "leases/machine-controller"),
            write("2026-11-23T10:00:05Z", MC, 1, "leases/machine-controller"),
        ];
        let problems = concurrent_writes(&writes, &BTreeMap::new());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("pid 1") && problems[0].contains("machines/c"));
    }

    #[test]
    fn a_write_after_being_deposed_is_reported_even_if_nobody_else_wrote() {
        let writes = [
            write("2026-11-23T10:00:00Z", MC, 1, "machines/a"),
            write("2026-11-23T10:00:09Z", MC, 1, "machines/a"),
        ];
        let deposed = BTreeMap::from([(1, "2026-11-23T10:00:05Z".parse().unwrap())]);
        let problems = concurrent_writes(&writes, &deposed);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("after losing its lease"));
    }
}
