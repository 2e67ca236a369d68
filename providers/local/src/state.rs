//! The state directory of the local "cloud": one JSON record per VM, plus a working
//! directory per VM, and the `/proc` reading that tells whether a VM's process still lives.
//!
//! Layout:
//!
//! ```text
//! <stateDirectory>/vms/<machine-name>.json   the VM record (VmRecord), written atomically
//! <stateDirectory>/vms/<machine-name>/       working directory of the VM's agent:
//!     kubeconfig   target cluster kubeconfig (mode 0600)
//!     userData     the machine's user data, when the secret has one (mode 0600)
//!     spec.json    the validated providerSpec, normalized
//!     agent.log    stdout and stderr of the agent
//! ```

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::spec::NodeKind;

/// Name of the kubeconfig file in a VM's working directory.
pub const KUBECONFIG_FILE: &str = "kubeconfig";
/// Name of the user-data file in a VM's working directory.
pub const USER_DATA_FILE: &str = "userData";
/// Name of the spec file in a VM's working directory.
pub const SPEC_FILE: &str = "spec.json";
/// Name of the agent's log file in a VM's working directory.
pub const LOG_FILE: &str = "agent.log";

/// What the local cloud knows about one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmRecord {
    /// The Machine the VM was created for.
    pub machine_name: String,
    /// The MachineClass it was created from (list_machines filters on it).
    pub class_name: String,
    /// `local:///<machine-name>`.
    pub provider_id: String,
    /// The Node name the agent registers (the machine name).
    pub node_name: String,
    /// The pid of the agent process.
    pub pid: i32,
    /// The process start time in clock ticks since boot (`/proc/<pid>/stat` field 22), to
    /// tell the agent from a later process that reuses its pid.
    pub start_time: u64,
    /// When the VM was created.
    pub created_at: Timestamp,
    /// The request id of the create call that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// What runs its Node. A kwok VM has no process: its `pid` and `start_time` are 0 and
    /// never used.
    #[serde(default, skip_serializing_if = "NodeKind::is_process")]
    pub node: NodeKind,
}

impl VmRecord {
    /// The pid of the VM's process, `None` for a VM without one (kwok) or whose launch has
    /// not finished.
    pub fn process_pid(&self) -> Option<i32> {
        (self.node == NodeKind::Process && self.pid > 0).then_some(self.pid)
    }

    /// Whether this is the record of a process VM whose launch did not finish: it is written
    /// (with pid 0) before the process starts and completed right after, so a crash in
    /// between leaves this record, never an unrecorded process. The process may or may not
    /// have started; see [`processes_with_arg`].
    pub fn launch_pending(&self) -> bool {
        self.node == NodeKind::Process && self.pid <= 0
    }
}

/// The pids of the processes whose command line has the argument `arg` (exactly), read
/// from `/proc`. A VM's agent is started with the path of its spec file, unique to the VM,
/// so this finds the process of a launch that was interrupted before its pid was recorded.
pub fn processes_with_arg(arg: &Path) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return vec![];
    };
    let needle = arg.as_os_str().as_encoded_bytes();
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|raw| raw.split(|b| *b == 0).any(|a| a == needle))
        })
        .collect()
}

/// The provider id of a local VM: `local:///<machine-name>`.
pub fn provider_id(machine_name: &str) -> String {
    format!("local:///{machine_name}")
}

/// The fields of `/proc/<pid>/stat` this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process state (field 3): `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// User-mode CPU time in clock ticks (field 14).
    pub utime: u64,
    /// Kernel-mode CPU time in clock ticks (field 15).
    pub stime: u64,
    /// Start time in clock ticks since boot (field 22).
    pub start_time: u64,
}

/// Parses the content of `/proc/<pid>/stat`. The command name (field 2) may contain spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_proc_stat(content: &str) -> Option<ProcStat> {
    let after = &content[content.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is field 3 of the file.
    let field = |n: usize| fields.get(n - 3).copied();
    Some(ProcStat {
        state: field(3)?.chars().next()?,
        utime: field(14)?.parse().ok()?,
        stime: field(15)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
    })
}

/// Reads `/proc/<pid>/stat`; `None` when the process does not exist (or cannot be read).
pub fn read_proc_stat(pid: i32) -> Option<ProcStat> {
    if pid <= 0 {
        return None;
    }
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_proc_stat(&s))
}

/// Whether the process of a VM record is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The recorded process runs.
    Alive,
    /// No process has the recorded pid: it exited (and was reaped).
    Exited,
    /// The recorded process exited but was not reaped yet.
    Zombie,
    /// The pid belongs to another process now (different start time).
    PidReused,
}

impl Liveness {
    /// Only [`Liveness::Alive`] counts as a running VM.
    pub fn is_alive(self) -> bool {
        self == Liveness::Alive
    }
}

/// Decides the liveness of a record from what `/proc` says about its pid.
pub fn liveness(record: &VmRecord, stat: Option<&ProcStat>) -> Liveness {
    match stat {
        None => Liveness::Exited,
        Some(s) if s.start_time != record.start_time => Liveness::PidReused,
        Some(s) if matches!(s.state, 'Z' | 'X' | 'x') => Liveness::Zombie,
        Some(_) => Liveness::Alive,
    }
}

/// Reads `/proc` and decides the liveness of a record.
///
/// A VM without a process (kwok) lives as long as its record does; a process VM whose
/// launch did not finish has no running process on record.
pub fn check_liveness(record: &VmRecord) -> Liveness {
    if record.launch_pending() {
        return Liveness::Exited;
    }
    let Some(pid) = record.process_pid() else {
        return Liveness::Alive;
    };
    liveness(record, read_proc_stat(pid).as_ref())
}

/// Errors of the state directory. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file-system operation failed.
    #[error("failed to {action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A VM record cannot be parsed.
    #[error("VM record {} is corrupt", path.display())]
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

impl StateError {
    fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        StateError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A state directory (see the module documentation for the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDirectory {
    root: PathBuf,
}

impl StateDirectory {
    /// A state directory rooted at `root` (nothing is created yet).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        StateDirectory { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/vms`.
    pub fn vms_dir(&self) -> PathBuf {
        self.root.join("vms")
    }

    /// `<root>/vms/<machine-name>.json`.
    pub fn record_path(&self, machine_name: &str) -> PathBuf {
        self.vms_dir().join(format!("{machine_name}.json"))
    }

    /// `<root>/vms/<machine-name>/`.
    pub fn work_dir(&self, machine_name: &str) -> PathBuf {
        self.vms_dir().join(machine_name)
    }

    /// The record of a machine, `None` when it has none.
    pub fn read(&self, machine_name: &str) -> Result<Option<VmRecord>, StateError> {
        read_record(&self.record_path(machine_name))
    }

    /// Writes a record atomically (temporary file, fsync, rename).
    pub fn write(&self, record: &VmRecord) -> Result<(), StateError> {
        let dir = self.vms_dir();
        fs::create_dir_all(&dir).map_err(|e| StateError::io("create directory", &dir, e))?;
        let path = self.record_path(&record.machine_name);
        let tmp = dir.join(format!(".{}.json.tmp", record.machine_name));
        let body = serde_json::to_vec_pretty(record).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let mut file = fs::File::create(&tmp).map_err(|e| StateError::io("create", &tmp, e))?;
        file.write_all(&body)
            .and_then(|()| file.sync_all())
            .map_err(|e| StateError::io("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| StateError::io("rename into place", &path, e))
    }

    /// Removes a machine's record and working directory (absent files are fine). The
    /// working directory goes first, so a crash in between leaves a record that a later
    /// delete cleans up.
    pub fn remove(&self, machine_name: &str) -> Result<(), StateError> {
        let work = self.work_dir(machine_name);
        match fs::remove_dir_all(&work) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StateError::io("remove", &work, e)),
        }
        let record = self.record_path(machine_name);
        match fs::remove_file(&record) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::io("remove", &record, e)),
        }
    }

    /// Every record, sorted by machine name. Corrupt records are reported in the second
    /// list instead of failing the whole listing.
    pub fn list(&self) -> Result<(Vec<VmRecord>, Vec<StateError>), StateError> {
        let dir = self.vms_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((vec![], vec![])),
            Err(e) => return Err(StateError::io("read directory", &dir, e)),
        };
        let mut records = Vec::new();
        let mut broken = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StateError::io("read directory", &dir, e))?;
            let path = entry.path();
            let is_record = path.extension().is_some_and(|e| e == "json")
                && !entry.file_name().to_string_lossy().starts_with('.');
            if !is_record {
                continue;
            }
            match read_record(&path) {
                Ok(Some(r)) => records.push(r),
                Ok(None) => {} // removed meanwhile
                Err(e) => broken.push(e),
            }
        }
        records.sort_by(|a, b| a.machine_name.cmp(&b.machine_name));
        Ok((records, broken))
    }
}

fn read_record(path: &Path) -> Result<Option<VmRecord>, StateError> {
    match fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StateError::Corrupt {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateError::io("read", path, e)),
    }
}

/// SIGKILLs every VM process recorded in a state directory whose pid and start time still
/// match (for test guards and emergency clean-up). Returns the pids killed.
pub fn kill_all_recorded(state: &StateDirectory) -> Vec<i32> {
    let Ok((records, _)) = state.list() else {
        return vec![];
    };
    records
        .iter()
        .filter(|r| check_liveness(r) == Liveness::Alive)
        .filter_map(VmRecord::process_pid)
        .filter(|pid| {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, pid: i32, start_time: u64) -> VmRecord {
        VmRecord {
            machine_name: name.into(),
            class_name: "cls".into(),
            provider_id: provider_id(name),
            node_name: name.into(),
            pid,
            start_time,
            created_at: Timestamp::UNIX_EPOCH,
            request_id: Some("r1".into()),
            node: NodeKind::Process,
        }
    }

    #[test]
    fn parses_proc_stat_with_odd_command_names() {
        let line = "4242 (local node) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 3 0 0 20 0 \
                    4 0 987654 12345678 900 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        let s = parse_proc_stat(line).expect("parses");
        assert_eq!(
            s,
            ProcStat {
                state: 'S',
                utime: 17,
                stime: 3,
                start_time: 987654
            }
        );
        assert_eq!(parse_proc_stat("garbage"), None);
        assert_eq!(parse_proc_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn reads_our_own_process() {
        let me = std::process::id() as i32;
        let s = read_proc_stat(me).expect("own stat");
        assert!(matches!(s.state, 'R' | 'S'));
        assert!(read_proc_stat(0).is_none());
    }

    #[test]
    fn liveness_decisions() {
        let r = record("a", 10, 500);
        let stat = |state, start_time| ProcStat {
            state,
            utime: 0,
            stime: 0,
            start_time,
        };
        assert_eq!(liveness(&r, None), Liveness::Exited);
        assert_eq!(liveness(&r, Some(&stat('S', 500))), Liveness::Alive);
        assert_eq!(liveness(&r, Some(&stat('R', 500))), Liveness::Alive);
        assert_eq!(liveness(&r, Some(&stat('Z', 500))), Liveness::Zombie);
        assert_eq!(liveness(&r, Some(&stat('S', 501))), Liveness::PidReused);
        assert!(!Liveness::Zombie.is_alive());
    }

    #[test]
    fn records_round_trip_and_list() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDirectory::new(dir.path());
        assert_eq!(state.list().expect("lists").0, vec![]);
        assert_eq!(state.read("a").expect("reads"), None);
        state.write(&record("b", 2, 2)).expect("writes");
        state.write(&record("a", 1, 1)).expect("writes");
        fs::create_dir_all(state.work_dir("a")).expect("mkdir");
        fs::write(state.vms_dir().join("junk.json"), "{").expect("write");
        let (records, broken) = state.list().expect("lists");
        assert_eq!(
            records
                .iter()
                .map(|r| r.machine_name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(broken.len(), 1);
        assert_eq!(state.read("a").expect("reads"), Some(record("a", 1, 1)));
        state.remove("a").expect("removes");
        state.remove("a").expect("removing twice is fine");
        assert!(!state.work_dir("a").exists());
        assert_eq!(state.read("a").expect("reads"), None);
        let json = fs::read_to_string(state.record_path("b")).expect("read");
        for key in [
            "machineName",
            "className",
            "providerId",
            "nodeName",
            "pid",
            "startTime",
            "createdAt",
        ] {
            assert!(json.contains(key), "{key} missing in {json}");
        }
    }
}
