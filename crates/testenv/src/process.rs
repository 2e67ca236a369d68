//! Starting control-plane processes so that none outlives the test process.
//!
//! Three layers make sure no process is left behind:
//! - every process leads its own process group, and [`ManagedProcess`]'s `Drop` kills the group;
//! - every process is spawned by one long-lived supervisor thread with `PR_SET_PDEATHSIG =
//!   SIGKILL`, so the kernel kills it when the test process dies, even by `SIGKILL` or a panic
//!   with `panic = "abort"` (the signal fires when the *spawning thread* exits, which is why a
//!   dedicated thread that lives as long as the process does the spawning, never a tokio worker);
//! - every run directory records its owner's pid and its process groups; [`sweep_stale_runs`]
//!   at the next start kills the groups of runs whose owner is gone.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::TestEnvError;

/// File in a run directory holding the pid of the process that owns the run.
const OWNER_FILE: &str = "owner.pid";
/// File in a run directory listing the process groups started for the run, one per line.
const GROUPS_FILE: &str = "process-groups";

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<std::io::Result<u32>>,
}

fn supervisor() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SUPERVISOR: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SUPERVISOR.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("mcm-testenv-supervisor".into())
            .spawn(move || supervise(rx))
            .expect("the OS refused to start the mcm-testenv supervisor thread");
        Mutex::new(tx)
    })
}

fn supervise(requests: mpsc::Receiver<SpawnRequest>) {
    let mut children: Vec<Child> = Vec::new();
    // The sender lives in a static, so this loop ends only with the process.
    while let Ok(SpawnRequest { mut command, reply }) = requests.recv() {
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (setpgid, prctl, getppid).
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // The parent may have died between fork and prctl.
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::other("parent exited during spawn"));
                }
                Ok(())
            });
        }
        let result = command.spawn().map(|child| {
            let pid = child.id();
            children.push(child);
            pid
        });
        // Reap the children that have exited so they do not linger as zombies.
        children.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        let _ = reply.send(result);
    }
}

/// A control-plane process: its own process group, killed with the group on drop.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    pid: u32,
    log: PathBuf,
}

impl ManagedProcess {
    /// Starts `program args...` with stdout and stderr appended to `log`, and records its
    /// process group in `run_dir`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        run_dir: &Path,
    ) -> Result<Self, TestEnvError> {
        Self::spawn_with_env(name, program, args, &[], log, run_dir)
    }

    /// [`ManagedProcess::spawn`] with extra environment variables for the child.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: PathBuf,
        run_dir: &Path,
    ) -> Result<Self, TestEnvError> {
        let out = File::create(&log).map_err(|e| TestEnvError::io("create a log file", e))?;
        let err = out
            .try_clone()
            .map_err(|e| TestEnvError::io("duplicate a log file handle", e))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let (reply, answer) = mpsc::channel();
        supervisor()
            .lock()
            .map_err(|_| TestEnvError::Supervisor)?
            .send(SpawnRequest { command, reply })
            .map_err(|_| TestEnvError::Supervisor)?;
        let pid = answer
            .recv()
            .map_err(|_| TestEnvError::Supervisor)?
            .map_err(|source| TestEnvError::Spawn {
                program: program.to_path_buf(),
                source,
            })?;
        record_group(run_dir, pid)?;
        Ok(ManagedProcess {
            name: name.to_string(),
            pid,
            log,
        })
    }

    /// The component name, e.g. `kube-apiserver`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether the process still runs (a zombie counts as gone).
    pub fn is_running(&self) -> bool {
        process_alive(self.pid)
    }

    /// The last `lines` lines of its log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Kills the whole process group with SIGKILL.
    pub fn kill(&self) {
        let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file, or a note that it could not be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Whether a process exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Marks `run_dir` as owned by this process.
pub fn claim_run_dir(run_dir: &Path) -> Result<(), TestEnvError> {
    std::fs::write(run_dir.join(OWNER_FILE), std::process::id().to_string())
        .map_err(|e| TestEnvError::io("write the run owner file", e))
}

fn record_group(run_dir: &Path, pid: u32) -> Result<(), TestEnvError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(run_dir.join(GROUPS_FILE))
        .map_err(|e| TestEnvError::io("open the process-group record", e))?;
    writeln!(f, "{pid}").map_err(|e| TestEnvError::io("record a process group", e))
}

/// Kills the process groups of earlier runs under `base` whose owning process is gone, and
/// removes their directories. Returns how many runs were swept.
///
/// A recorded group is only killed when its leader's command line still names the run
/// directory, so a recycled pid is never hit.
pub fn sweep_stale_runs(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut swept = 0;
    for entry in entries.flatten() {
        let dir = entry.path();
        let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        match owner {
            Some(pid) if process_alive(pid) => continue,
            // A directory without an owner file is being set up right now, or is not ours.
            None => continue,
            Some(_) => {}
        }
        // A node's shims and containers leave its process groups: swept by its record.
        crate::node::sweep_run_dir(&dir);
        let groups = std::fs::read_to_string(dir.join(GROUPS_FILE)).unwrap_or_default();
        let marker = dir.to_string_lossy().into_owned();
        for pid in groups.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&marker) {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        swept += 1;
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_is_killed_with_its_group_on_drop() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        claim_run_dir(&run).unwrap();
        let p = ManagedProcess::spawn(
            "sleeper",
            Path::new("/bin/sh"),
            &["-c".into(), "sleep 300 & wait".into()],
            run.join("sleeper.log"),
            &run,
        )
        .unwrap();
        let pid = p.pid();
        assert!(process_alive(pid));
        drop(p);
        wait_until(|| !process_alive(pid));
    }

    #[test]
    fn stale_runs_are_swept_only_when_their_owner_is_gone() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("stale");
        std::fs::create_dir_all(&run).unwrap();
        // The command line names the run directory, as every control-plane process's does.
        let p = ManagedProcess::spawn(
            "sleeper",
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "sleep 300; : marker".into(),
                run.to_string_lossy().into_owned(),
            ],
            run.join("sleeper.log"),
            &run,
        )
        .unwrap();
        let pid = p.pid();
        std::mem::forget(p);

        // Owned by a live process (this one): kept.
        claim_run_dir(&run).unwrap();
        assert_eq!(sweep_stale_runs(base.path()), 0);
        assert!(process_alive(pid));

        // Owned by a pid that does not exist: swept, process killed.
        std::fs::write(run.join(OWNER_FILE), "4194304").unwrap();
        assert_eq!(sweep_stale_runs(base.path()), 1);
        wait_until(|| !process_alive(pid));
        assert!(!run.exists());
    }

    fn wait_until(cond: impl Fn() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("condition not reached within 5s");
    }
}
