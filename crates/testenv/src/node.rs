//! A real node for the test control plane: containerd and runc (the Debian packages) run
//! containers for a kubelet built from `k8s.io/kubernetes`, registered as a Node.
//!
//! The node is a machine of its own inside this host, and leaves nothing behind:
//! - **Its own mount and network namespaces.** A holder process (`unshare --mount --net`)
//!   owns them; containerd and the kubelet are started in them (`nsenter`).
//!   - In the mount namespace, `/run`, `/var/lib` and `/var/log` are empty tmpfs, so no state
//!     lands on the host's file systems outside the run directory.
//!   - The kernel tunables the kubelet insists on (`vm.overcommit_memory=1`, `kernel.panic=10`,
//!     ...) are files bind-mounted over `/proc/sys` there. The kubelet finds them as it wants
//!     them and changes nothing on the host (`protectKernelDefaults: true`).
//!   - Every mount goes with the namespace when its last process exits.
//! - **The network namespace is joined to the host by a veth pair.** The host end is
//!   `10.250.<k>.1/30`, the node is `10.250.<k>.2`, and its pods are bridged in
//!   `10.251.<k>.0/24` (CNI `bridge`, `host-local`; a host route leads there).
//!   - The API server (on the host's 127.0.0.1) calls webhooks and proxies to Services at their
//!     endpoints (`--enable-aggregator-routing`).
//!   - The node reaches the API server at the `kubernetes` Service's address, `10.0.0.1:443`:
//!     the node's loopback carries that address, and a forwarder of this process accepts there
//!     and connects to the API server. That is what kube-proxy does on a real node, so pods use
//!     their ServiceAccount's in-cluster configuration unchanged.
//!   - The veth pair and the route go with the namespace.
//! - **Cgroups under a root of their own** (`cgroupRoot: /mcm-testenv-<pid>-<k>`): at the end,
//!   every process in them is killed and they are removed.
//! - A record in the run directory (`node-cleanup`) lets the next run sweep what a killed test
//!   process left: the namespace's processes (containerd's shims too) and the cgroups.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::binaries::Binary;
use crate::process::ManagedProcess;
use crate::{ControlPlane, TestEnvError};

/// The Debian packages a node needs, as `apt-get install` takes them.
pub const DEBIAN_PACKAGES: &str = "containerd runc containernetworking-plugins iproute2 util-linux";

/// Where Debian's containernetworking-plugins are.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The name the pod sandbox image must have in containerd ([`KubeletNode::import_image`] it
/// before pods start; no registry is reached).
pub const SANDBOX_IMAGE: &str = "mcm-rs.local/pause:1";

/// The `kubernetes` Service's address and port (the API server's serving certificate names
/// the address): the node's pods reach the API server there.
const SERVICE_HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const SERVICE_PORT: u16 = 443;

/// The kernel tunables the kubelet checks (`setupKernelTunables`), as it wants them.
const KERNEL_TUNABLES: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The file of a node's run directory from which a later run sweeps what it left.
const CLEANUP_RECORD: &str = "node-cleanup";

/// The programs a node runs (from the packages [`DEBIAN_PACKAGES`]).
const PROGRAMS: [&str; 7] = [
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "unshare",
    "nsenter",
    "ip",
];
/// The CNI plugins a node's pods are bridged with.
const CNI_PLUGINS: [&str; 3] = ["bridge", "host-local", "loopback"];

/// What [`preflight`] found on the host.
struct HostFacts {
    /// The [`PROGRAMS`] not found.
    missing_programs: Vec<&'static str>,
    /// The [`CNI_PLUGINS`] not found.
    missing_plugins: Vec<&'static str>,
    /// Where the kubelet is looked for, and whether it is there.
    kubelet: (PathBuf, bool),
    /// The cgroup mounts, or why they could not be read.
    cgroups: Result<Cgroups, String>,
    root: bool,
}

/// What a node needs from the host that is missing: one line each, with the fix.
pub fn preflight(bin_dir: &Path) -> Vec<String> {
    let kubelet = bin_dir.join(Binary::Kubelet.file_name());
    let found = kubelet.is_file();
    missing_on(&HostFacts {
        missing_programs: PROGRAMS
            .into_iter()
            .filter(|p| which(p).is_none())
            .collect(),
        missing_plugins: CNI_PLUGINS
            .into_iter()
            .filter(|p| !Path::new(CNI_BIN_DIR).join(p).is_file())
            .collect(),
        kubelet: (bin_dir.to_path_buf(), found),
        cgroups: cgroups().map_err(|e| e.to_string()),
        root: nix::unistd::Uid::effective().is_root(),
    })
}

/// The lines of [`preflight`] for what `host` lacks. Pure.
fn missing_on(host: &HostFacts) -> Vec<String> {
    let mut missing: Vec<String> = host
        .missing_programs
        .iter()
        .map(|program| {
            format!("`{program}` is not on the PATH (apt-get install {DEBIAN_PACKAGES})")
        })
        .collect();
    missing.extend(host.missing_plugins.iter().map(|plugin| {
        format!(
            "the CNI plugin {CNI_BIN_DIR}/{plugin} is missing (apt-get install containernetworking-plugins)"
        )
    }));
    if !host.kubelet.1 {
        missing.push(format!(
            "no kubelet in {} (cargo xtask testenv builds it)",
            host.kubelet.0.display()
        ));
    }
    match &host.cgroups {
        Ok(c) if c.is_empty() => missing.push(
            "no cgroup file system is mounted under /sys/fs/cgroup (the kubelet needs cgroups)"
                .into(),
        ),
        Ok(Cgroups::V1(h)) => {
            for needed in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
                if !h.iter().any(|p| hierarchy_has(p, needed)) {
                    missing.push(format!(
                        "the cgroup v1 controller `{needed}` is not mounted under /sys/fs/cgroup"
                    ));
                }
            }
        }
        Ok(Cgroups::V2(_)) => {}
        Err(e) => missing.push(format!("cannot read the mounts: {e}")),
    }
    if !host.root {
        missing.push("a node needs root (namespaces, mounts, cgroups)".into());
    }
    missing
}

/// A program's path on the `PATH` (and in the sbin directories, which a non-login shell may
/// leave out).
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// The cgroup file systems of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cgroups {
    /// cgroup v1: one mount per hierarchy.
    V1(Vec<PathBuf>),
    /// cgroup v2: the unified mount.
    V2(PathBuf),
}

impl Cgroups {
    fn is_empty(&self) -> bool {
        matches!(self, Cgroups::V1(h) if h.is_empty())
    }

    /// The directories a cgroup named `root` has (one per hierarchy).
    fn dirs(&self, root: &str) -> Vec<PathBuf> {
        match self {
            Cgroups::V1(h) => h.iter().map(|p| p.join(root)).collect(),
            Cgroups::V2(p) => vec![p.join(root)],
        }
    }
}

fn hierarchy_has(path: &Path, controller: &str) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.split(',').any(|c| c == controller))
}

/// The host's cgroup mounts under /sys/fs/cgroup, from its mount table. Pure over the text.
fn parse_cgroup_mounts(mountinfo: &str) -> Cgroups {
    let mut v1 = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split_whitespace().nth(4).unwrap_or_default();
        let fstype = right.split_whitespace().next().unwrap_or_default();
        if !mount_point.starts_with("/sys/fs/cgroup") {
            continue;
        }
        match fstype {
            "cgroup2" if mount_point == "/sys/fs/cgroup" => {
                return Cgroups::V2(PathBuf::from(mount_point));
            }
            // A hybrid host's unified hierarchy (`/sys/fs/cgroup/unified`): runc makes the
            // containers' cgroups there too.
            "cgroup" | "cgroup2" => v1.push(PathBuf::from(mount_point)),
            _ => {}
        }
    }
    Cgroups::V1(v1)
}

fn cgroups() -> std::io::Result<Cgroups> {
    Ok(parse_cgroup_mounts(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// The addresses of one node: `10.250.<k>.1` on the host's end, `10.250.<k>.2` the node,
/// `10.251.<k>.0/24` its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeNetwork {
    k: u8,
}

impl NodeNetwork {
    /// The host's end of the veth pair.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.k, 1)
    }

    /// The node's address (its `InternalIP`, and every host-network pod's).
    pub fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, self.k, 2)
    }

    /// The pods' subnet.
    pub fn pod_cidr(&self) -> String {
        format!("10.251.{}.0/24", self.k)
    }

    /// The host's end of the veth pair.
    fn host_link(&self) -> String {
        format!("mcm{}h", self.k)
    }
}

/// Picks a network no interface or route of the host uses yet. Pure over the host's
/// addresses and routes (`ip -4 -o addr`, `ip -4 route`).
fn free_network(addresses: &str, routes: &str, start: u8) -> Option<NodeNetwork> {
    (0..=254u16)
        .map(|i| ((u16::from(start) + i) % 254 + 1) as u8)
        .map(|k| NodeNetwork { k })
        .find(|n| {
            let node = format!("10.250.{}.", n.k);
            let pods = format!("10.251.{}.", n.k);
            ![addresses, routes]
                .iter()
                .any(|t| t.contains(&node) || t.contains(&pods))
        })
}

/// What a killed run leaves for the next one to sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CleanupRecord {
    /// The mount namespace (`mnt:[<inode>]`) of the node's processes.
    mount_ns: String,
    /// The cgroup root's name.
    cgroup_root: String,
}

impl CleanupRecord {
    fn render(&self) -> String {
        format!("{}\n{}\n", self.mount_ns, self.cgroup_root)
    }

    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let mount_ns = lines.next()?.trim().to_string();
        let cgroup_root = lines.next()?.trim().to_string();
        (mount_ns.starts_with("mnt:[") && cgroup_root.starts_with("mcm-testenv-")).then_some(
            CleanupRecord {
                mount_ns,
                cgroup_root,
            },
        )
    }
}

/// A node of a test control plane: containerd, runc and a kubelet that runs pods in
/// containers. Dropping it stops it and removes what it made.
pub struct KubeletNode {
    name: String,
    dir: PathBuf,
    network: NodeNetwork,
    record: CleanupRecord,
    holder: Option<ManagedProcess>,
    containerd: Option<ManagedProcess>,
    kubelet: Option<ManagedProcess>,
    forwarder: Option<Forwarder>,
}

impl std::fmt::Debug for KubeletNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletNode")
            .field("name", &self.name)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

fn node_error(what: impl Into<String>) -> TestEnvError {
    TestEnvError::Node(what.into())
}

/// Runs `program args` to completion; an error names the command and its output.
fn run(program: &str, args: &[&str]) -> Result<String, TestEnvError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| node_error(format!("{program} {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(node_error(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl KubeletNode {
    /// Starts a node named `name` for `cp` and waits until it is Ready. `cp` runs the
    /// scheduler and kube-controller-manager for pods to be placed and Services to have
    /// endpoints.
    ///
    /// # Errors
    /// What the host lacks ([`preflight`]) at once, each item with its fix; a process that
    /// does not come up, with the end of its log.
    pub async fn start(cp: &ControlPlane, name: &str) -> Result<Self, TestEnvError> {
        let missing = preflight(cp.bin_dir());
        if !missing.is_empty() {
            return Err(node_error(format!(
                "this host cannot run a node:\n- {}",
                missing.join("\n- ")
            )));
        }
        let dir = cp.run_dir().join(format!("node-{name}"));
        std::fs::create_dir_all(&dir).map_err(|e| TestEnvError::io("create the node dir", e))?;
        let network = free_network(
            &run("ip", &["-4", "-o", "addr"])?,
            &run("ip", &["-4", "route"])?,
            rand::random::<u8>(),
        )
        .ok_or_else(|| node_error("no free 10.250.<k>.0/30 network on this host"))?;
        let cgroup_root = format!("mcm-testenv-{}-{}", std::process::id(), network.k);

        // The namespaces' holder; everything else of the node joins it.
        let holder = ManagedProcess::spawn(
            "node-namespaces",
            &which("unshare").unwrap_or_else(|| "unshare".into()),
            &[
                "--mount".into(),
                "--net".into(),
                "--propagation".into(),
                "private".into(),
                "--".into(),
                "sleep".into(),
                "infinity".into(),
            ],
            dir.join("holder.log"),
            cp.run_dir(),
        )?;
        let holder_pid = holder.pid();
        let mount_ns = wait_for_namespace(holder_pid)?;
        let record = CleanupRecord {
            mount_ns,
            cgroup_root,
        };
        std::fs::write(dir.join(CLEANUP_RECORD), record.render())
            .map_err(|e| TestEnvError::io("write the node's cleanup record", e))?;
        let mut node = KubeletNode {
            name: name.to_string(),
            dir,
            network,
            record,
            holder: Some(holder),
            containerd: None,
            kubelet: None,
            forwarder: None,
        };
        node.set_up_namespaces()?;
        node.set_up_cgroups()?;
        node.forwarder = Some(Forwarder::start(
            holder_pid,
            SocketAddr::from((SERVICE_HOST, SERVICE_PORT)),
            api_server_address(cp.server_url())?,
        )?);
        node.start_containerd(cp)?;
        let sandbox = build_sandbox_image(&node.dir)?;
        node.import_image(&sandbox, SANDBOX_IMAGE)?;
        node.start_kubelet(cp)?;
        node.await_ready(cp).await?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's addresses.
    pub fn network(&self) -> NodeNetwork {
        self.network
    }

    /// The node's directory: containerd's and the kubelet's state, their logs, pod logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    fn holder_pid(&self) -> Result<u32, TestEnvError> {
        self.holder
            .as_ref()
            .map(ManagedProcess::pid)
            .ok_or_else(|| node_error("the node is stopped"))
    }

    /// Runs `program args` in the node's namespaces (mount and network) to completion.
    fn run_inside(&self, program: &str, args: &[&str]) -> Result<String, TestEnvError> {
        let target = self.holder_pid()?.to_string();
        let mut all = vec!["-t", target.as_str(), "-m", "-n", "--", program];
        all.extend_from_slice(args);
        run("nsenter", &all)
    }

    /// `ctr` against the node's containerd, in the `k8s.io` namespace (the kubelet's).
    fn ctr(&self, args: &[&str]) -> Result<String, TestEnvError> {
        let socket = self.socket();
        let socket = socket.to_string_lossy();
        let mut all = vec!["--address", socket.as_ref(), "-n", "k8s.io"];
        all.extend_from_slice(args);
        self.run_inside("ctr", &all)
    }

    fn set_up_namespaces(&self) -> Result<(), TestEnvError> {
        let sysctl = self.dir.join("sysctl");
        std::fs::create_dir_all(&sysctl).map_err(|e| TestEnvError::io("create a dir", e))?;
        let mut script = String::from(
            "set -e\nmount -t tmpfs -o mode=755 tmpfs /run\nmount -t tmpfs -o mode=755 tmpfs /var/lib\nmount -t tmpfs -o mode=755 tmpfs /var/log\n",
        );
        for (name, value) in KERNEL_TUNABLES {
            let file = sysctl.join(name.replace('/', "."));
            std::fs::write(&file, format!("{value}\n"))
                .map_err(|e| TestEnvError::io("write a kernel tunable's file", e))?;
            script.push_str(&format!(
                "mount --bind {} /proc/sys/{name}\n",
                file.display()
            ));
        }
        let n = self.network;
        // The veth pair: the node's end moves into its namespace.
        run(
            "ip",
            &[
                "link",
                "add",
                &n.host_link(),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &self.holder_pid()?.to_string(),
            ],
        )?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/30", n.host_ip()),
                "dev",
                &n.host_link(),
            ],
        )?;
        run("ip", &["link", "set", &n.host_link(), "up"])?;
        script.push_str(&format!(
            "ip link set lo up\nip addr add {SERVICE_HOST}/32 dev lo\nip addr add {}/30 dev eth0\nip link set eth0 up\nip route add default via {}\necho 1 > /proc/sys/net/ipv4/ip_forward\n",
            n.node_ip(),
            n.host_ip()
        ));
        self.run_inside("sh", &["-c", &script])?;
        run(
            "ip",
            &[
                "route",
                "add",
                &n.pod_cidr(),
                "via",
                &n.node_ip().to_string(),
                "dev",
                &n.host_link(),
            ],
        )?;
        Ok(())
    }

    fn set_up_cgroups(&self) -> Result<(), TestEnvError> {
        let groups = cgroups().map_err(|e| TestEnvError::io("read the mounts", e))?;
        for dir in groups.dirs(&self.record.cgroup_root) {
            std::fs::create_dir_all(&dir)
                .map_err(|e| node_error(format!("create the cgroup {}: {e}", dir.display())))?;
            // A new cpuset has no CPUs and no memory nodes: its parent's.
            if dir.parent().is_some_and(|p| hierarchy_has(p, "cpuset")) {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = dir.parent().map(|p| p.join(file)).unwrap_or_default();
                    let value = std::fs::read_to_string(&parent).unwrap_or_default();
                    std::fs::write(dir.join(file), value.trim())
                        .map_err(|e| node_error(format!("set {}/{file}: {e}", dir.display())))?;
                }
            }
        }
        if let Cgroups::V2(root) = &groups {
            let controllers =
                std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            let enable: Vec<String> = controllers
                .split_whitespace()
                .map(|c| format!("+{c}"))
                .collect();
            let _ = std::fs::write(
                root.join(&self.record.cgroup_root)
                    .join("cgroup.subtree_control"),
                enable.join(" "),
            );
        }
        Ok(())
    }

    fn start_containerd(&mut self, cp: &ControlPlane) -> Result<(), TestEnvError> {
        let d = self.dir.join("containerd");
        let cni = self.dir.join("cni");
        for sub in [&d, &cni.join("net.d"), &cni.join("ipam")] {
            std::fs::create_dir_all(sub).map_err(|e| TestEnvError::io("create a dir", e))?;
        }
        let config = d.join("config.toml");
        std::fs::write(&config, containerd_config(&d, &cni))
            .map_err(|e| TestEnvError::io("write containerd's config", e))?;
        std::fs::write(
            cni.join("net.d/10-pods.conflist"),
            cni_config(&self.network, &cni.join("ipam")),
        )
        .map_err(|e| TestEnvError::io("write the CNI config", e))?;
        let process = self.spawn_inside(
            cp,
            "containerd",
            vec![
                "containerd".into(),
                format!("--config={}", config.display()),
            ],
        )?;
        self.containerd = Some(process);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.ctr(&["version"]).is_err() {
            if Instant::now() > deadline
                || !self.containerd.as_ref().is_some_and(|p| p.is_running())
            {
                return Err(self.not_ready("containerd", "its socket does not answer"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Starts `command` (program and arguments) in the node's namespaces, its output in
    /// `<name>.log` of the node's directory.
    fn spawn_inside(
        &self,
        cp: &ControlPlane,
        name: &str,
        command: Vec<String>,
    ) -> Result<ManagedProcess, TestEnvError> {
        let mut args: Vec<String> = vec![
            "-t".into(),
            self.holder_pid()?.to_string(),
            "-m".into(),
            "-n".into(),
            "--".into(),
        ];
        args.extend(command);
        ManagedProcess::spawn(
            name,
            &which("nsenter").unwrap_or_else(|| "nsenter".into()),
            &args,
            self.dir.join(format!("{name}.log")),
            cp.run_dir(),
        )
    }

    fn not_ready(&self, component: &str, reason: &str) -> TestEnvError {
        let log = self.dir.join(format!("{component}.log"));
        TestEnvError::NotReady {
            component: component.into(),
            waited: Duration::from_secs(30),
            reason: reason.into(),
            log_tail: crate::process::log_tail(&log, 20),
            log,
        }
    }

    fn start_kubelet(&mut self, cp: &ControlPlane) -> Result<(), TestEnvError> {
        let k = self.dir.join("kubelet");
        std::fs::create_dir_all(k.join("pod-logs"))
            .map_err(|e| TestEnvError::io("create the kubelet dir", e))?;
        let kubeconfig = std::fs::read_to_string(cp.kubeconfig_path())
            .map_err(|e| TestEnvError::io("read the kubeconfig", e))?
            .replace(
                cp.server_url(),
                &format!("https://{SERVICE_HOST}:{SERVICE_PORT}"),
            );
        std::fs::write(k.join("kubeconfig"), kubeconfig)
            .map_err(|e| TestEnvError::io("write the kubelet's kubeconfig", e))?;
        let config = k.join("config.yaml");
        std::fs::write(
            &config,
            kubelet_config(
                &self.socket(),
                &self.record.cgroup_root,
                &self.network,
                &k.join("pod-logs"),
                cp.ca_cert_path(),
            ),
        )
        .map_err(|e| TestEnvError::io("write the kubelet's config", e))?;
        let kubelet = cp.bin_dir().join(Binary::Kubelet.file_name());
        let process = self.spawn_inside(
            cp,
            "kubelet",
            vec![
                kubelet.to_string_lossy().into_owned(),
                format!("--config={}", config.display()),
                format!("--kubeconfig={}", k.join("kubeconfig").display()),
                format!("--root-dir={}", k.join("root").display()),
                format!("--hostname-override={}", self.name),
                format!("--node-ip={}", self.network.node_ip()),
                "--v=1".into(),
            ],
        )?;
        self.kubelet = Some(process);
        Ok(())
    }

    async fn await_ready(&self, cp: &ControlPlane) -> Result<(), TestEnvError> {
        let nodes: Api<Node> = Api::all(cp.client().await?);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = nodes
                .get_opt(&self.name)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                return Ok(());
            }
            if !self.kubelet.as_ref().is_some_and(|p| p.is_running()) {
                return Err(self.not_ready("kubelet", "it exited"));
            }
            if Instant::now() > deadline {
                return Err(self.not_ready("kubelet", "the Node is not Ready"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Imports an image archive (an `oci-archive`, as `cargo xtask image` writes) into the
    /// node's containerd under the name `name` alone, as a cluster without a registry needs.
    ///
    /// The archive is imported from a copy whose index names the image `name`: the same
    /// manifest and blobs (the same digests). A name given after the import (`ctr images
    /// tag`) is not enough: containerd's CRI plugin keeps resolving the image by the name it
    /// was imported under until it restarts.
    ///
    /// # Errors
    /// The archive cannot be read or does not import (with `ctr`'s message).
    pub fn import_image(&self, archive: &Path, name: &str) -> Result<(), TestEnvError> {
        let bytes =
            std::fs::read(archive).map_err(|e| TestEnvError::io("read an image archive", e))?;
        let renamed = rename_archive(&bytes, name)
            .map_err(|e| node_error(format!("{}: {e}", archive.display())))?;
        let copy = self
            .dir
            .join(format!("import-{}.tar", name.replace(['/', ':'], "_")));
        std::fs::write(&copy, renamed)
            .map_err(|e| TestEnvError::io("write an image archive", e))?;
        let path = copy.to_string_lossy();
        let out = self.ctr(&["images", "import", path.as_ref()])?;
        let _ = std::fs::remove_file(&copy);
        let imported = imported_names(&out);
        if imported != [name] {
            return Err(node_error(format!(
                "{} imported as {imported:?}, not {name} (ctr: {})",
                archive.display(),
                out.trim()
            )));
        }
        Ok(())
    }

    /// An admin kubeconfig as the node's pods reach the API server (at the `kubernetes`
    /// Service's address), e.g. for processes a pod starts.
    pub fn pod_kubeconfig(&self) -> Result<String, TestEnvError> {
        std::fs::read_to_string(self.dir.join("kubelet/kubeconfig"))
            .map_err(|e| TestEnvError::io("read the node's kubeconfig", e))
    }

    /// The host pid of a container's first process (`containerID` of a pod's status, with or
    /// without its `containerd://`).
    pub fn container_pid(&self, container_id: &str) -> Option<u32> {
        let id = container_id.trim_start_matches("containerd://");
        self.ctr(&["tasks", "ls"])
            .ok()?
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?, f.next()?))
            })
            .find(|(task, _)| *task == id)
            .and_then(|(_, pid)| pid.parse().ok())
    }

    /// The logs of the containers of the pods of `namespace` (every namespace: `""`), by
    /// `<pod>/<container>`, as the kubelet keeps them.
    pub fn container_logs(&self, namespace: &str) -> BTreeMap<String, String> {
        let mut logs = BTreeMap::new();
        let root = self.dir.join("kubelet/pod-logs");
        let prefix = format!("{namespace}_");
        for pod in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let pod_dir = pod.file_name().to_string_lossy().into_owned();
            let rest = if namespace.is_empty() {
                pod_dir.as_str()
            } else if let Some(rest) = pod_dir.strip_prefix(&prefix) {
                rest
            } else {
                continue;
            };
            let pod_name = rest.rsplit_once('_').map_or(rest, |(n, _)| n);
            for container in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let mut text = String::new();
                let mut files: Vec<PathBuf> = std::fs::read_dir(container.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|f| f.path())
                    .collect();
                files.sort();
                for f in files {
                    if let Ok(mut file) = File::open(&f) {
                        let _ = file.read_to_string(&mut text);
                    }
                }
                logs.insert(
                    format!("{pod_name}/{}", container.file_name().to_string_lossy()),
                    text,
                );
            }
        }
        logs
    }

    /// Copies the node's logs (containerd's, the kubelet's, every container's) to `dest`.
    pub fn copy_logs(&self, dest: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dest)?;
        for f in ["containerd.log", "kubelet.log"] {
            let from = self.dir.join(f);
            if from.is_file() {
                std::fs::copy(&from, dest.join(f))?;
            }
        }
        for (container, log) in self.container_logs("") {
            let name = container.replace('/', "_");
            std::fs::write(dest.join(format!("container-{name}.log")), log)?;
        }
        Ok(())
    }

    /// Stops the node and removes what it made (also done on drop).
    pub fn stop(mut self) {
        self.clean_up();
    }

    fn clean_up(&mut self) {
        if let Some(f) = self.forwarder.take() {
            f.stop();
        }
        for p in [self.kubelet.take(), self.containerd.take()]
            .into_iter()
            .flatten()
        {
            p.kill();
        }
        sweep(&self.record);
        if let Some(h) = self.holder.take() {
            h.kill();
        }
        // The pair would go with the namespace, but the kernel tears a namespace down later:
        // deleting the host's end removes both now.
        let _ = run("ip", &["link", "delete", &self.network.host_link()]);
        let _ = std::fs::remove_file(self.dir.join(CLEANUP_RECORD));
    }
}

impl Drop for KubeletNode {
    fn drop(&mut self) {
        self.clean_up();
    }
}

/// An `oci-archive` with every manifest of its index named `name`: the other entries as
/// they are. Pure.
fn rename_archive(archive: &[u8], name: &str) -> Result<Vec<u8>, String> {
    let mut entries: Vec<(String, Vec<u8>, u32)> = Vec::new();
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry
            .path()
            .map_err(|e| e.to_string())?
            .to_string_lossy()
            .into_owned();
        let mode = entry.header().mode().unwrap_or(0o644);
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        entries.push((path, bytes, mode));
    }
    let index = entries
        .iter_mut()
        .find(|(p, _, _)| p.trim_start_matches("./") == "index.json")
        .ok_or("not an OCI archive: no index.json")?;
    let mut json: serde_json::Value =
        serde_json::from_slice(&index.1).map_err(|e| format!("index.json: {e}"))?;
    let manifests = json["manifests"]
        .as_array_mut()
        .filter(|m| !m.is_empty())
        .ok_or("index.json lists no manifest")?;
    for m in manifests {
        m["annotations"]["org.opencontainers.image.ref.name"] = name.into();
    }
    index.1 = json.to_string().into_bytes();
    tar_of(
        &entries
            .iter()
            .map(|(p, b, m)| (p.as_str(), b.as_slice(), *m))
            .collect::<Vec<_>>(),
    )
    .map_err(|e| e.to_string())
}

/// The names `ctr images import` reported (`unpacking <name> (sha256:...)...done`). Pure.
fn imported_names(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("unpacking "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Waits for the holder to be in a mount namespace of its own; returns it (`mnt:[<inode>]`).
fn wait_for_namespace(pid: u32) -> Result<String, TestEnvError> {
    let own = std::fs::read_link("/proc/self/ns/mnt")
        .map_err(|e| TestEnvError::io("read this process's mount namespace", e))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
            && ns != own
        {
            return Ok(ns.to_string_lossy().into_owned());
        }
        if Instant::now() > deadline {
            return Err(node_error(
                "unshare did not make a mount namespace within 10s (does this host allow namespaces?)",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills what a node left: every process in its mount namespace (containerd's shims too,
/// which leave its process group) and in its cgroups (the containers), then removes the
/// cgroups.
fn sweep(record: &CleanupRecord) {
    // Never the host's namespace (a record gone wrong, an inode reused).
    let host = ["/proc/self/ns/mnt", "/proc/1/ns/mnt"]
        .iter()
        .filter_map(|p| std::fs::read_link(p).ok())
        .any(|l| l.to_string_lossy() == record.mount_ns);
    if host {
        tracing::warn!(
            ns = record.mount_ns,
            "a node record names the host's mount namespace: not swept"
        );
        return;
    }
    for _ in 0..50 {
        let mut killed = 0;
        for pid in processes_in_namespace(&record.mount_ns)
            .into_iter()
            .chain(processes_in_cgroups(&record.cgroup_root))
        {
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
            {
                killed += 1;
            }
        }
        if killed == 0 && remove_cgroups(&record.cgroup_root) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::warn!(
        cgroup_root = record.cgroup_root,
        "some of the node's cgroups could not be removed"
    );
}

fn processes_in_namespace(ns: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .is_ok_and(|l| l.to_string_lossy() == ns)
        })
        .collect()
}

fn processes_in_cgroups(root: &str) -> Vec<u32> {
    let Ok(groups) = cgroups() else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for dir in groups.dirs(root) {
        walk(&dir, &mut |d| {
            if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        });
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Visits `dir` and its subdirectories, children first.
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), visit);
            }
        }
    }
    if dir.is_dir() {
        visit(dir);
    }
}

/// Removes the cgroups under `root` in every hierarchy; whether none is left.
fn remove_cgroups(root: &str) -> bool {
    let Ok(groups) = cgroups() else {
        return true;
    };
    let mut left = false;
    for dir in groups.dirs(root) {
        walk(&dir, &mut |d| {
            if std::fs::remove_dir(d).is_err() && d.exists() {
                left = true;
            }
        });
    }
    !left
}

/// Sweeps the node of a run directory whose owner is gone (see
/// [`crate::process::sweep_stale_runs`]).
pub(crate) fn sweep_run_dir(run_dir: &Path) {
    for entry in std::fs::read_dir(run_dir).into_iter().flatten().flatten() {
        let record = std::fs::read_to_string(entry.path().join(CLEANUP_RECORD))
            .ok()
            .and_then(|t| CleanupRecord::parse(&t));
        if let Some(r) = record {
            sweep(&r);
        }
    }
}

/// The sandbox ("pause") program: it sleeps until stopped and reaps the zombies of the pod's
/// other processes, as the pod sandbox must.
const PAUSE_C: &str = r#"#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"#;

/// Builds the sandbox image into `dir` (a static `pause` compiled with the host's C compiler,
/// in an `oci-archive` named [`SANDBOX_IMAGE`]); returns the archive.
fn build_sandbox_image(dir: &Path) -> Result<PathBuf, TestEnvError> {
    let source = dir.join("pause.c");
    let binary = dir.join("pause");
    std::fs::write(&source, PAUSE_C).map_err(|e| TestEnvError::io("write pause.c", e))?;
    let compiler = ["musl-gcc", "cc"]
        .into_iter()
        .find(|c| which(c).is_some())
        .ok_or_else(|| node_error("no C compiler (cc or musl-gcc) for the sandbox image"))?;
    run(
        compiler,
        &[
            "-static",
            "-Os",
            "-o",
            &binary.to_string_lossy(),
            &source.to_string_lossy(),
        ],
    )
    .map_err(|e| {
        node_error(format!(
            "the sandbox image's pause does not build statically: {e}"
        ))
    })?;
    let pause = std::fs::read(&binary).map_err(|e| TestEnvError::io("read pause", e))?;
    let archive = dir.join("pause.tar");
    std::fs::write(
        &archive,
        oci_archive(SANDBOX_IMAGE, "/pause", &[("pause", &pause)])?,
    )
    .map_err(|e| TestEnvError::io("write the sandbox image", e))?;
    Ok(archive)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tar of `files` (executable, owned by root, mtime 0). Pure.
fn tar_of(files: &[(&str, &[u8], u32)]) -> Result<Vec<u8>, TestEnvError> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes, mode) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, name, *bytes)
            .map_err(|e| TestEnvError::io("write a tar entry", e))?;
    }
    builder
        .into_inner()
        .map_err(|e| TestEnvError::io("finish a tar", e))
}

/// An `oci-archive` of one image: one uncompressed layer of `files` (executables), the
/// entrypoint `entrypoint`, its manifest named `name`. Pure.
fn oci_archive(
    name: &str,
    entrypoint: &str,
    files: &[(&str, &[u8])],
) -> Result<Vec<u8>, TestEnvError> {
    let layer = tar_of(
        &files
            .iter()
            .map(|(n, b)| (*n, *b, 0o755))
            .collect::<Vec<_>>(),
    )?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Entrypoint": [entrypoint], "User": "65535:65535" },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{}", sha256_hex(&layer))] },
    })
    .to_string()
    .into_bytes();
    let descriptor = |media: &str, bytes: &[u8]| {
        serde_json::json!({
            "mediaType": media,
            "digest": format!("sha256:{}", sha256_hex(bytes)),
            "size": bytes.len(),
        })
    };
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
    })
    .to_string()
    .into_bytes();
    let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    entry["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": name });
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [entry] })
        .to_string()
        .into_bytes();
    let blob = |b: &[u8]| format!("blobs/sha256/{}", sha256_hex(b));
    let (l, c, m) = (blob(&layer), blob(&config), blob(&manifest));
    tar_of(&[
        (
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
            0o644,
        ),
        ("index.json", &index, 0o644),
        (&l, &layer, 0o644),
        (&c, &config, 0o644),
        (&m, &manifest, 0o644),
    ])
}

/// `host:port` of the API server from its URL.
fn api_server_address(url: &str) -> Result<SocketAddr, TestEnvError> {
    url.trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| node_error(format!("the API server URL {url}: {e}")))
}

/// containerd's configuration: its state in `dir`, the CRI plugin with runc (cgroupfs), the
/// local sandbox image, CNI from Debian's plugins. Pure.
fn containerd_config(dir: &Path, cni: &Path) -> String {
    let d = dir.display();
    let c = cni.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  # Without CAP_SYS_RESOURCE (a container host), runc cannot lower a sandbox's
  # oom_score_adj to the kubelet's -998: keep every container at or above containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{c}/net.d"
"#
    )
}

/// The pods' network: a bridge in the node's namespace, addresses from `10.251.<k>.0/24`.
/// Pure.
fn cni_config(network: &NodeNetwork, ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "mcm-testenv-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ipam_dir.display().to_string(),
                    "ranges": [[{ "subnet": network.pod_cidr() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                },
            },
            { "type": "loopback" },
        ],
    })
    .to_string()
}

/// The kubelet's configuration. Pure.
fn kubelet_config(
    socket: &Path,
    cgroup_root: &str,
    network: &NodeNetwork,
    pod_logs: &Path,
    ca: &Path,
) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The host has cgroup v1 and no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
podLogsDir: {logs}
address: {ip}
readOnlyPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: AlwaysAllow
# The namespace shows the tunables as the kubelet wants them: it checks, never writes.
protectKernelDefaults: true
makeIPTablesUtilChains: false
failSwapOn: false
# A test host's disk and memory are not the node's to guard.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%"
  imagefs.available: "0%"
  nodefs.inodesFree: "0%"
localStorageCapacityIsolation: false
serializeImagePulls: false
resolvConf: ""
staticPodPath: ""
"#,
        socket = socket.display(),
        logs = pod_logs.display(),
        ip = network.node_ip(),
        ca = ca.display(),
    )
}

/// Accepts connections on an address of the node's network namespace and connects each to
/// an address of the host's (what kube-proxy does for the `kubernetes` Service).
struct Forwarder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    fn start(holder: u32, listen: SocketAddr, target: SocketAddr) -> Result<Self, TestEnvError> {
        let node_ns = File::open(format!("/proc/{holder}/ns/net"))
            .map_err(|e| TestEnvError::io("open the node's network namespace", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, bound) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mcm-testenv-node-forwarder".into())
            .spawn(move || {
                let listener = match bind_in(&node_ns, listen) {
                    Ok(l) => {
                        let _ = ready.send(Ok(()));
                        l
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                accept_loop(&listener, target, &flag);
            })
            .map_err(|e| TestEnvError::io("start the node's forwarder", e))?;
        bound
            .recv()
            .map_err(|_| node_error("the forwarder thread ended"))?
            .map_err(|e| node_error(format!("the forwarder cannot listen on {listen}: {e}")))?;
        Ok(Forwarder {
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A listener on `addr` in the namespace `ns`; the thread returns to its own namespace
/// (sockets keep the namespace they were made in).
fn bind_in(ns: &File, addr: SocketAddr) -> std::io::Result<TcpListener> {
    let own = File::open("/proc/thread-self/ns/net")?;
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
    let listener = TcpListener::bind(addr);
    nix::sched::setns(own.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
    let listener = listener?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((inbound, _)) => {
                let _ = inbound.set_nonblocking(false);
                if let Ok(outbound) = TcpStream::connect(target) {
                    pipe(inbound, outbound);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Copies both ways until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Both);
            let _ = from.shutdown(std::net::Shutdown::Both);
        }
    };
    let _ = std::thread::Builder::new().spawn(copy(a, b2));
    let _ = std::thread::Builder::new().spawn(copy(b, a2));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with everything a node needs (cgroup v1, as this project's CI host).
    fn complete_host() -> HostFacts {
        HostFacts {
            missing_programs: Vec::new(),
            missing_plugins: Vec::new(),
            kubelet: ("/cache/bin".into(), true),
            cgroups: Ok(Cgroups::V1(
                ["cpu,cpuacct", "cpuset", "memory", "pids"]
                    .iter()
                    .map(|h| Path::new("/sys/fs/cgroup").join(h))
                    .collect(),
            )),
            root: true,
        }
    }

    #[test]
    fn preflight_names_each_missing_part_with_its_fix() {
        assert_eq!(missing_on(&complete_host()), Vec::<String>::new());
        let v2 = HostFacts {
            cgroups: Ok(Cgroups::V2("/sys/fs/cgroup".into())),
            ..complete_host()
        };
        assert_eq!(missing_on(&v2), Vec::<String>::new());

        let bare = HostFacts {
            missing_programs: vec!["containerd", "runc"],
            missing_plugins: vec!["bridge"],
            kubelet: ("/cache/bin".into(), false),
            cgroups: Ok(Cgroups::V1(vec!["/sys/fs/cgroup/cpu,cpuacct".into()])),
            root: false,
        };
        let lines = missing_on(&bare);
        assert_eq!(
            lines,
            [
                format!("`containerd` is not on the PATH (apt-get install {DEBIAN_PACKAGES})"),
                format!("`runc` is not on the PATH (apt-get install {DEBIAN_PACKAGES})"),
                "the CNI plugin /usr/lib/cni/bridge is missing (apt-get install containernetworking-plugins)".to_string(),
                "no kubelet in /cache/bin (cargo xtask testenv builds it)".to_string(),
                "the cgroup v1 controller `cpuset` is not mounted under /sys/fs/cgroup".to_string(),
                "the cgroup v1 controller `memory` is not mounted under /sys/fs/cgroup".to_string(),
                "the cgroup v1 controller `pids` is not mounted under /sys/fs/cgroup".to_string(),
                "a node needs root (namespaces, mounts, cgroups)".to_string(),
            ]
        );
        let no_cgroups = HostFacts {
            cgroups: Ok(Cgroups::V1(Vec::new())),
            ..complete_host()
        };
        assert_eq!(
            missing_on(&no_cgroups),
            ["no cgroup file system is mounted under /sys/fs/cgroup (the kubelet needs cgroups)"]
        );
        let unreadable = HostFacts {
            cgroups: Err("permission denied".into()),
            ..complete_host()
        };
        assert_eq!(
            missing_on(&unreadable),
            ["cannot read the mounts: permission denied"]
        );
    }

    #[test]
    fn cgroup_mounts_are_read_from_the_mount_table() {
        let v1 = "35 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                  36 25 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                  37 25 0:32 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                  38 22 0:5 / /proc rw - proc proc rw\n";
        assert_eq!(
            parse_cgroup_mounts(v1),
            Cgroups::V1(vec![
                "/sys/fs/cgroup/cpu,cpuacct".into(),
                "/sys/fs/cgroup/memory".into(),
                "/sys/fs/cgroup/unified".into()
            ])
        );
        assert!(hierarchy_has(
            Path::new("/sys/fs/cgroup/cpu,cpuacct"),
            "cpuacct"
        ));
        let v2 = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_cgroup_mounts(v2),
            Cgroups::V2("/sys/fs/cgroup".into())
        );
        assert!(parse_cgroup_mounts("38 22 0:5 / /proc rw - proc proc rw\n").is_empty());
    }

    #[test]
    fn a_network_is_one_no_address_or_route_of_the_host_uses() {
        let addresses = "2: eth0    inet 10.250.7.1/30 scope global mcm7h\n";
        let routes = "10.251.8.0/24 via 10.250.8.2 dev mcm8h\n";
        assert_eq!(
            free_network(addresses, routes, 6),
            Some(NodeNetwork { k: 9 })
        );
        assert_eq!(free_network("", "", 0), Some(NodeNetwork { k: 1 }));
        let all: String = (1..=255).map(|k| format!("10.250.{k}.1 ")).collect();
        assert_eq!(free_network(&all, "", 0), None);
        let n = NodeNetwork { k: 9 };
        assert_eq!(n.node_ip(), Ipv4Addr::new(10, 250, 9, 2));
        assert_eq!(n.pod_cidr(), "10.251.9.0/24");
    }

    #[test]
    fn the_cleanup_record_reads_back_and_refuses_what_is_not_ours() {
        let r = CleanupRecord {
            mount_ns: "mnt:[4026532177]".into(),
            cgroup_root: "mcm-testenv-12-9".into(),
        };
        assert_eq!(CleanupRecord::parse(&r.render()), Some(r));
        assert_eq!(CleanupRecord::parse("mnt:[1]\n/\n"), None);
        assert_eq!(CleanupRecord::parse(""), None);
    }

    #[test]
    fn the_sandbox_archive_is_an_oci_layout_with_its_name() {
        let archive = oci_archive(SANDBOX_IMAGE, "/pause", &[("pause", b"\x7fELF")]).unwrap();
        let mut entries = tar::Archive::new(archive.as_slice());
        let mut files = BTreeMap::new();
        for e in entries.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            files.insert(name, bytes);
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let manifest = &index["manifests"][0];
        assert_eq!(
            manifest["annotations"]["org.opencontainers.image.ref.name"],
            SANDBOX_IMAGE
        );
        // Every blob is where its digest says, with its size.
        let digest = manifest["digest"].as_str().unwrap();
        let blob = &files[&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))];
        assert_eq!(format!("sha256:{}", sha256_hex(blob)), digest);
        assert_eq!(manifest["size"], blob.len());
        let m: serde_json::Value = serde_json::from_slice(blob).unwrap();
        for d in [&m["config"], &m["layers"][0]] {
            let hex = d["digest"].as_str().unwrap().trim_start_matches("sha256:");
            assert_eq!(sha256_hex(&files[&format!("blobs/sha256/{hex}")]), hex);
        }
    }

    #[test]
    fn an_archive_is_renamed_in_its_index_only() {
        let archive = oci_archive("short:1", "/pause", &[("pause", b"x")]).unwrap();
        let renamed = rename_archive(&archive, "mcm-rs.local/short:1").unwrap();
        let read = |a: &[u8]| -> BTreeMap<String, Vec<u8>> {
            let mut files = BTreeMap::new();
            for e in tar::Archive::new(a).entries().unwrap() {
                let mut e = e.unwrap();
                let mut b = Vec::new();
                e.read_to_end(&mut b).unwrap();
                files.insert(e.path().unwrap().to_string_lossy().into_owned(), b);
            }
            files
        };
        let (before, after) = (read(&archive), read(&renamed));
        assert_eq!(before.len(), after.len());
        for (path, bytes) in &before {
            if path != "index.json" {
                assert_eq!(&after[path], bytes, "{path} unchanged");
            }
        }
        let index: serde_json::Value = serde_json::from_slice(&after["index.json"]).unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "mcm-rs.local/short:1"
        );
        assert!(rename_archive(b"not a tar", "x").is_err());
    }

    #[test]
    fn imported_names_are_read_from_ctr() {
        let out = "unpacking machine-controller-manager:0.1.0 (sha256:e86e...)...done\n";
        assert_eq!(imported_names(out), ["machine-controller-manager:0.1.0"]);
        assert!(imported_names("").is_empty());
    }

    #[test]
    fn the_configs_name_the_run_directory_only() {
        let n = NodeNetwork { k: 3 };
        let c = containerd_config(Path::new("/run-dir/containerd"), Path::new("/run-dir/cni"));
        assert!(c.contains("root = \"/run-dir/containerd/root\""));
        assert!(c.contains("restrict_oom_score_adj = true"));
        let k = kubelet_config(
            Path::new("/run-dir/containerd/containerd.sock"),
            "mcm-testenv-1-3",
            &n,
            Path::new("/run-dir/kubelet/pod-logs"),
            Path::new("/run-dir/ca.crt"),
        );
        assert!(k.contains("cgroupRoot: /mcm-testenv-1-3"));
        assert!(k.contains("protectKernelDefaults: true"));
        assert!(k.contains("address: 10.250.3.2"));
        let cni: serde_json::Value =
            serde_json::from_str(&cni_config(&n, Path::new("/run-dir/cni/ipam"))).unwrap();
        assert_eq!(
            cni["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.251.3.0/24"
        );
    }
}
