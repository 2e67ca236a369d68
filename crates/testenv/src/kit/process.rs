//! Processes of a test: a free loopback port, a child process killed on drop that serves
//! HTTP on 127.0.0.1 (`/metrics`, `/healthz`, ...), plain HTTP GETs, and `/proc` checks.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::metrics;
use super::wait::eventually;

/// A free TCP port on 127.0.0.1 (free when asked; bind it soon).
pub fn free_port() -> u16 {
    crate::free_port().expect("a free port on 127.0.0.1")
}

/// The binary `name` of workspace package `package` beside `exe` (a binary under test, e.g.
/// `env!("CARGO_BIN_EXE_...")`), built with `cargo build -p <package> --bin <name>` when it
/// is missing.
pub fn binary_beside(exe: &str, name: &str, package: &str) -> PathBuf {
    let path = Path::new(exe).with_file_name(name);
    if !path.is_file() {
        let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
            .args(["build", "-p", package, "--bin", name])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building {name} failed");
    }
    path
}

/// A child process with an HTTP port on 127.0.0.1, SIGKILLed when dropped.
#[derive(Debug)]
pub struct ServedProcess {
    /// The process.
    pub child: tokio::process::Child,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
}

impl ServedProcess {
    /// Starts `command` (stdin closed, stdout and stderr appended to `log`) serving on `port`.
    pub fn spawn(mut command: tokio::process::Command, port: u16, log: &Path) -> ServedProcess {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open the log {}: {e}", log.display()));
        let err = out.try_clone().expect("a second handle of the log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        ServedProcess { child, port }
    }

    /// SIGKILL and reap.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// The pid (0 once reaped).
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// The text of `/metrics` (empty when it does not answer).
    pub async fn metrics(&self) -> String {
        metrics::scrape(self.port).await.unwrap_or_default()
    }

    /// One metric summed over its label sets, 0 when absent.
    pub async fn metric(&self, name: &str) -> f64 {
        metrics::metric(&self.metrics().await, name).unwrap_or(0.0)
    }

    /// Polls `/metrics` until `name` (summed over label sets, 0 when absent) satisfies
    /// `pred`; returns the value.
    pub async fn await_metric(
        &self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        eventually(timeout, &format!("metric {name}"), || async {
            let v = self.metric(name).await;
            if pred(v) { Ok(Some(v)) } else { Err(v) }
        })
        .await
    }

    /// The HTTP status code of a GET on `path`.
    pub async fn status_of(&self, path: &str) -> Option<u16> {
        http_status(self.port, path).await
    }
}

/// A plain HTTP/1.1 GET on 127.0.0.1:`port`: the whole response (status line, headers,
/// body); `None` when the connection fails or no answer comes within 5 s.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

/// The status code of a GET on 127.0.0.1:`port`.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let text = http_get(port, path).await?;
    text.lines().next()?.split(' ').nth(1)?.parse().ok()
}

/// [`crate::process::process_alive`] for a signed pid (as `nix` and `/proc` scans give them).
pub fn process_alive(pid: i32) -> bool {
    u32::try_from(pid).is_ok_and(crate::process::process_alive)
}

/// SIGKILLs a process (ignoring a process that is gone).
pub fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(process_alive(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[tokio::test]
    async fn a_served_process_is_killed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg("600");
        let p = ServedProcess::spawn(cmd, free_port(), &dir.path().join("sleep.log"));
        let pid = p.pid() as i32;
        assert!(process_alive(pid));
        drop(p);
        eventually(Duration::from_secs(5), "the child to die", || async {
            !process_alive(pid)
        })
        .await;
    }
}

/// A provider binary (`machine-controller-<provider>`) run as both halves
/// (`--controllers=machine,manager`) against the test control plane, with leader election off,
/// the short timeouts of end-to-end tests and a cloud endpoint in `env`. Killed with its process
/// group on drop; its log tail is printed when the test panics.
#[derive(Debug)]
pub struct ProviderController {
    /// The process.
    pub process: crate::process::ManagedProcess,
}

impl ProviderController {
    /// Starts binary `exe` (named `name` in logs) for namespace `ns` with `kubeconfig` as control
    /// and target cluster, `env` added to its environment, its log in `logs`.
    pub fn spawn(
        name: &str,
        exe: &str,
        env: &[(String, String)],
        kubeconfig: &Path,
        ns: &str,
        logs: &Path,
    ) -> ProviderController {
        Self::spawn_with_args(name, exe, env, kubeconfig, ns, logs, &[])
    }

    /// [`ProviderController::spawn`] with `extra` flags after the usual ones (e.g.
    /// [`crate::kit::webhook_args`]).
    pub fn spawn_with_args(
        name: &str,
        exe: &str,
        env: &[(String, String)],
        kubeconfig: &Path,
        ns: &str,
        logs: &Path,
        extra: &[String],
    ) -> ProviderController {
        let kc = kubeconfig.display().to_string();
        let mut args: Vec<String> = vec![
            format!("--control-kubeconfig={kc}"),
            format!("--target-kubeconfig={kc}"),
            format!("--namespace={ns}"),
            format!("--port={}", free_port()),
            "--address=127.0.0.1".into(),
            "--leader-elect=false".into(),
            "--controllers=machine,manager".into(),
            "--machine-creation-timeout=90s".into(),
            "--machine-health-timeout=90s".into(),
            "--machine-drain-timeout=30s".into(),
            "--machine-safety-orphan-vms-period=2s".into(),
            "--machine-backoff-max=2s".into(),
            // Long enough to see a capacity error on the Machine, short enough to recover.
            "--resource-exhausted-retry=4s".into(),
            "--machine-pv-detach-timeout=5s".into(),
            "--machine-resync-period=5s".into(),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
        ];
        args.extend_from_slice(extra);
        let process = crate::process::ManagedProcess::spawn_with_env(
            name,
            Path::new(exe),
            &args,
            env,
            logs.join(format!("{name}.log")),
            logs,
        )
        .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        ProviderController { process }
    }
}

impl Drop for ProviderController {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {} ---\n{}",
                self.process.name(),
                self.process.log_tail(80)
            );
        }
    }
}

/// One booted VM of a cloud test, played by a `local-node` hollow kubelet (see
/// [`boot_local_node`]).
#[derive(Debug, Clone, Copy)]
pub struct LocalNodeVm<'a> {
    /// What names the VM's files in the directory (`<key>.user-data`, `<key>.log`) and its
    /// process (`vm-<key>`): the instance id, or the VM's name.
    pub key: &'a str,
    /// The Machine the VM belongs to.
    pub machine: &'a str,
    /// The Node it registers.
    pub node: &'a str,
    /// The Node's providerID, as the cloud's provider writes it.
    pub provider_id: &'a str,
    /// The user data the controller gave the VM (with its bootstrap token).
    pub user_data: &'a [u8],
}

/// Starts `binary` (`local-node`) for `vm` through `kubeconfig`, its user data, spec
/// (`<dir>/spec.json`) and log in `dir`; `None` when it cannot start (a VM player tries
/// again on its next look).
pub fn boot_local_node(
    binary: &Path,
    kubeconfig: &Path,
    dir: &Path,
    vm: &LocalNodeVm<'_>,
) -> Option<crate::process::ManagedProcess> {
    let user_data_file = dir.join(format!("{}.user-data", vm.key));
    std::fs::write(&user_data_file, vm.user_data).ok()?;
    let args: Vec<String> = vec![
        "--machine-name".into(),
        vm.machine.into(),
        "--node-name".into(),
        vm.node.into(),
        "--provider-id".into(),
        vm.provider_id.into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--user-data".into(),
        user_data_file.display().to_string(),
        "--spec".into(),
        dir.join("spec.json").display().to_string(),
    ];
    let log = dir.join(format!("{}.log", vm.key));
    crate::process::ManagedProcess::spawn(&format!("vm-{}", vm.key), binary, &args, log, dir).ok()
}

/// Stops a VM player's agents (the `local-node` processes by VM key, killed when dropped),
/// printing the end of each one's log first when the test is panicking.
pub fn stop_agents(
    agents: &std::sync::Mutex<std::collections::BTreeMap<String, crate::process::ManagedProcess>>,
) {
    let agents = std::mem::take(&mut *agents.lock().unwrap_or_else(|e| e.into_inner()));
    if std::thread::panicking() {
        for (key, agent) in &agents {
            eprintln!("--- agent of {key} ---\n{}", agent.log_tail(20));
        }
    }
}
