//! A real node (containerd, runc, a kubelet) for the test control plane: pods run in
//! containers, reach the API server as in a cluster, and nothing is left on the host after.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use mcm_testenv::kit::eventually;
use mcm_testenv::node::{KubeletNode, SANDBOX_IMAGE};
use mcm_testenv::{Components, ControlPlane, Options};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn pod(name: &str, node: &str, host_network: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "hostNetwork": host_network,
            "containers": [{
                "name": "main",
                "image": SANDBOX_IMAGE,
                "imagePullPolicy": "Never",
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "runAsNonRoot": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": { "drop": ["ALL"] },
                },
            }],
        },
    }))
    .expect("a pod")
}

/// Every line of the host's mount table that names `dir`.
fn host_mounts_under(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&*dir.to_string_lossy()))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_in_containers_and_the_node_leaves_nothing_behind() {
    let cp = ControlPlane::start(Options {
        components: Components::ALL,
        ..Options::default()
    })
    .await
    .expect("control plane");
    let node = KubeletNode::start(&cp, "testenv-node")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let network = node.network();
    let dir = node.dir().to_path_buf();
    let client = cp.client().await.expect("client");

    // An image that does not import fails at once, naming the archive.
    let bad = dir.join("not-an-archive.tar");
    std::fs::write(&bad, "not a tar").expect("write");
    let refused = node
        .import_image(&bad, "mcm-rs.local/bad:1")
        .expect_err("a file that is no archive does not import");
    assert!(
        refused.to_string().contains("not-an-archive.tar"),
        "{refused}"
    );

    let pods: Api<Pod> = Api::namespaced(client, "default");
    for (name, host) in [("bridged", false), ("host-network", true)] {
        pods.create(&PostParams::default(), &pod(name, node.name(), host))
            .await
            .expect("create");
    }
    let ips = eventually(WAIT, "both pods running", || async {
        let mut ips = Vec::new();
        for name in ["bridged", "host-network"] {
            let p = pods.get(name).await.ok()?;
            let status = p.status?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            ips.push(status.pod_ip?);
        }
        Some(ips)
    })
    .await;
    let pod_prefix = network.pod_cidr().trim_end_matches("0/24").to_string();
    assert!(ips[0].starts_with(&pod_prefix), "{ips:?} {pod_prefix}");
    assert_eq!(ips[1], network.node_ip().to_string());

    let cgroup_root_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|h| std::fs::read_dir(h.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    n.to_string_lossy()
                        .starts_with(&format!("mcm-testenv-{}-", std::process::id()))
                })
            })
            .collect()
    };
    assert!(!cgroup_root_dirs().is_empty(), "the node has cgroups");
    assert!(
        host_mounts_under(&dir).is_empty(),
        "the node's mounts are its namespace's only"
    );
    node.stop();
    assert!(
        cgroup_root_dirs().is_empty(),
        "cgroups left: {:?}",
        cgroup_root_dirs()
    );
    let link = format!("mcm{}h", network.node_ip().octets()[2]);
    let links = std::process::Command::new("ip")
        .args(["-br", "link"])
        .output()
        .expect("ip link");
    let links = String::from_utf8_lossy(&links.stdout).into_owned();
    assert!(
        !links
            .lines()
            .any(|l| l.split(['@', ' ']).next() == Some(link.as_str())),
        "the veth pair {link} is gone: {links}"
    );
    let processes: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&*dir.to_string_lossy()) || c.trim() == "/pause")
        .collect();
    assert!(processes.is_empty(), "left running: {processes:?}");
}
