//! `cargo xtask demo | tee demo.log`, then Ctrl-C: the terminal sends SIGINT to the whole
//! foreground process group, so `tee` dies too and the demo's stdout becomes a pipe nobody
//! reads. The demo must still kill its VMs: they are detached `local-node` processes that
//! nothing else kills.
//!
//! This runs the real demo (control plane, both controllers, three VMs) in a directory of its
//! own (`MCM_DEMO_DIR`), reads its stdout through a pipe until the `ready:` line, closes the
//! pipe, sends SIGINT to the demo's process group as a terminal does, and checks that the
//! demo exits cleanly and that no VM of its state directory is left. It needs the
//! control-plane binaries (`cargo xtask testenv`), like the other control-plane tests.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcm_provider_local::StateDirectory;
use mcm_provider_local::state::check_liveness;
use mcm_testenv::binaries::{ASSETS_ENV, Binary, find_bin_dir};
use mcm_testenv::process::{log_tail, process_alive};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// From starting the demo (binaries already built) to its `ready:` line.
const READY_WITHIN: Duration = Duration::from_secs(240);
/// From SIGINT to the demo's exit (its shutdown waits at most 5 s for the controllers and
/// 10 s for the process check).
const EXIT_WITHIN: Duration = Duration::from_secs(60);
/// From the demo's exit until its VMs are gone (SIGKILLed VMs go at once).
const VMS_GONE_WITHIN: Duration = Duration::from_secs(10);
/// How often the bounded waits look again.
const POLL: Duration = Duration::from_millis(50);

#[test]
fn ctrl_c_with_stdout_a_closed_pipe_leaves_no_vm() {
    let assets = find_bin_dir(&Binary::ALL)
        .unwrap_or_else(|e| panic!("the demo needs the control-plane binaries: {e}"));
    build_demo_binaries();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("demo-shutdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stderr_path = dir.with_extension("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();

    let began = Instant::now();
    let child = without_package_env(&mut Command::new(env!("CARGO_BIN_EXE_xtask")))
        .arg("demo")
        .env("MCM_DEMO_DIR", &dir)
        .env(ASSETS_ENV, &assets)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        // Its own process group, like a terminal's foreground job.
        .process_group(0)
        .spawn()
        .expect("starting xtask demo");
    let mut demo = Demo {
        child,
        dir: dir.clone(),
    };
    let diagnostics = |what: &str, stdout: &[String]| {
        format!(
            "{what}\n--- demo stdout:\n{}\n--- demo stderr ({}):\n{}",
            stdout.join("\n"),
            stderr_path.display(),
            log_tail(&stderr_path, 40)
        )
    };

    // Read stdout until the ready line, then close the pipe (the reader thread drops it).
    let out = demo.child.stdout.take().unwrap();
    let (lines, seen) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            let ready = line.starts_with("ready:");
            if lines.send(line).is_err() || ready {
                return;
            }
        }
    });
    let mut stdout = Vec::new();
    loop {
        let left = READY_WITHIN.saturating_sub(began.elapsed());
        match seen.recv_timeout(left) {
            Ok(line) => {
                let ready = line.starts_with("ready:");
                stdout.push(line);
                if ready {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "{}",
                diagnostics(&format!("no ready line within {READY_WITHIN:?}"), &stdout)
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                "{}",
                diagnostics(
                    &format!(
                        "the demo closed its stdout before the ready line (exit: {:?})",
                        demo.child.try_wait()
                    ),
                    &stdout
                )
            ),
        }
    }
    // The thread returns right after sending the ready line: the pipe is closed after this.
    reader.join().unwrap();
    let ready_after = began.elapsed();
    let vms = live_vms(&dir);
    assert!(
        !vms.is_empty(),
        "{}",
        diagnostics("no VM runs although the demo said ready", &stdout)
    );

    // Ctrl-C in a terminal: SIGINT to the whole foreground group.
    let group = Pid::from_raw(demo.child.id() as i32);
    killpg(group, Signal::SIGINT).expect("sending SIGINT to the demo's group");
    let interrupted = Instant::now();
    let status = demo.wait(EXIT_WITHIN).unwrap_or_else(|| {
        panic!(
            "{}",
            diagnostics(
                &format!("the demo did not exit within {EXIT_WITHIN:?} of SIGINT"),
                &stdout
            )
        )
    });
    let exited_after = interrupted.elapsed();

    let deadline = Instant::now() + VMS_GONE_WITHIN;
    let mut left = live_vms(&dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(POLL);
        left = live_vms(&dir);
    }
    assert!(
        left.is_empty(),
        "{}",
        diagnostics(
            &format!(
                "VMs {left:?} of {} outlived the demo ({status}; VMs at ready: {vms:?})",
                dir.display()
            ),
            &stdout
        )
    );
    assert!(
        status.success(),
        "{}",
        diagnostics(&format!("the demo exited with {status}"), &stdout)
    );
    eprintln!(
        "ready after {:.1}s ({} VMs), exited {:.1}s after SIGINT, no VM left; the demo's last \
         words on stderr: {:?}",
        ready_after.as_secs_f64(),
        vms.len(),
        exited_after.as_secs_f64(),
        log_tail(&stderr_path, 1)
    );
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&stderr_path);
}

/// Builds the binaries the demo builds (`cargo build --bins -p ...` in xtask's `e2e::env`),
/// so that the bounded wait for the ready line measures the demo, not the compiler (the
/// demo's own build is then a no-op).
fn build_demo_binaries() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let status = without_package_env(&mut Command::new(&cargo))
        .current_dir(root)
        .args([
            "build",
            "--bins",
            "-p",
            "machine-controller-manager",
            "-p",
            "machine-controller-local",
            "-p",
            "mcm-provider-local",
            // xtask in the selection, as the demo's own build has it: the dependencies'
            // features are then the test build's (`cargo xtask features`) and nothing is
            // compiled again (without it, a cold run rebuilt the binaries' whole tree here).
            "-p",
            "xtask",
        ])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(status.success(), "building the demo's binaries: {status}");
}

/// Removes what Cargo sets for this test process about the xtask package
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...) from a command's environment: build scripts
/// track some of them (ring's tracks `CARGO_MANIFEST_DIR`), so a `cargo build` that inherits
/// them rebuilds those crates and their dependents, and so does the next plain `cargo build`.
fn without_package_env(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_by_cargo = name.starts_with("CARGO_PKG_")
            || matches!(
                &*name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
            );
        if set_by_cargo {
            command.env_remove(&*name);
        }
    }
    command
}

/// The demo process, and its VMs: killed on drop, so that a failing test leaves nothing
/// behind. (The control plane and the controllers die with the demo: they are started with
/// `PR_SET_PDEATHSIG`.)
struct Demo {
    child: Child,
    dir: PathBuf,
}

impl Demo {
    /// Waits (bounded) for the demo to exit.
    fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => return None,
                Err(e) => panic!("waiting for the demo: {e}"),
            }
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // Only while it is not reaped: afterwards its group id may belong to someone else.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
        for pid in live_vms(&self.dir) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The live VMs of the demo in `dir`: the recorded ones whose process still runs, and any
/// `local-node` process whose command line names the state directory.
fn live_vms(dir: &Path) -> Vec<i32> {
    let state = StateDirectory::new(dir.join("vms"));
    let mut pids: Vec<i32> = state
        .list()
        .map(|(records, _)| records)
        .unwrap_or_default()
        .iter()
        .filter(|r| check_liveness(r).is_alive())
        .map(|r| r.pid)
        .collect();
    let needle = state.root().to_string_lossy().into_owned();
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    for pid in entries.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()) {
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_vm = args.first().is_some_and(|a| a.ends_with("local-node"))
            && args.iter().any(|a| a.contains(&needle));
        if is_vm && process_alive(pid as u32) && !pids.contains(&pid) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}
