//! A "VM player" for tests against moto (included with `#[path]` beside `moto.rs`, as
//! `crate::moto`): it boots every live instance of a [`World`] as a `local-node` hollow
//! kubelet (Node name = the instance's private DNS name, providerID `aws:///<region>/<id>`,
//! the instance's user data with the bootstrap token the controller put there), and stops
//! it when the instance is terminated.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, InstanceStateName};
use base64::Engine as _;
use mcm_testenv::kit::{LocalNodeVm, boot_local_node, stop_agents};
use mcm_testenv::process::ManagedProcess;

use crate::moto::{REGION, World};

/// Plays the booted VMs: one `local-node` per live instance of the cluster in moto.
pub struct VmPlayer {
    task: tokio::task::JoinHandle<()>,
    agents: Arc<Mutex<BTreeMap<String, ManagedProcess>>>,
    dir: tempfile::TempDir,
}

impl VmPlayer {
    /// Plays the instances of `world` with `binary` (`local-node`), registering their Nodes
    /// through `kubeconfig`.
    pub fn start(world: &World, binary: PathBuf, kubeconfig: PathBuf) -> VmPlayer {
        let dir = tempfile::tempdir().unwrap();
        let agents: Arc<Mutex<BTreeMap<String, ManagedProcess>>> = Default::default();
        let (a, d, cluster_tag, moto) = (
            agents.clone(),
            dir.path().to_path_buf(),
            world.cluster_tag.clone(),
            world.moto,
        );
        std::fs::write(d.join("spec.json"), r#"{"heartbeatInterval":"1s"}"#).unwrap();
        let task = tokio::spawn(async move {
            let ec2 = moto.ec2();
            loop {
                if let Ok(out) = ec2
                    .describe_instances()
                    .filters(
                        Filter::builder()
                            .name("tag-key")
                            .values(&cluster_tag)
                            .build(),
                    )
                    .send()
                    .await
                {
                    for i in out.reservations().iter().flat_map(|r| r.instances()) {
                        let id = i.instance_id().unwrap_or_default().to_string();
                        let live = matches!(
                            i.state().and_then(|s| s.name()),
                            Some(InstanceStateName::Pending | InstanceStateName::Running)
                        );
                        let known = a.lock().unwrap().contains_key(&id);
                        if live && !known {
                            if let Some(agent) = boot(&ec2, i, &d, &binary, &kubeconfig).await {
                                a.lock().unwrap().insert(id, agent);
                            }
                        } else if !live && known {
                            // Terminated: the VM is gone (dropping kills its process group).
                            a.lock().unwrap().remove(&id);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        VmPlayer { task, agents, dir }
    }

    /// How many instances are played (booted, not terminated).
    pub fn running(&self) -> usize {
        self.agents.lock().unwrap().len()
    }
}

impl Drop for VmPlayer {
    fn drop(&mut self) {
        self.task.abort();
        stop_agents(&self.agents);
        let _ = self.dir.path();
    }
}

/// Boots one instance: its user data (with the bootstrap token the controller put there) and
/// a `local-node` registering the Node under the private DNS name.
async fn boot(
    ec2: &aws_sdk_ec2::Client,
    i: &aws_sdk_ec2::types::Instance,
    dir: &Path,
    binary: &Path,
    kubeconfig: &Path,
) -> Option<ManagedProcess> {
    let id = i.instance_id()?;
    let name = i
        .tags()
        .iter()
        .find(|t| t.key() == Some("Name"))
        .and_then(|t| t.value())?;
    let node_name = i.private_dns_name().filter(|n| !n.is_empty())?;
    let attr = ec2
        .describe_instance_attribute()
        .instance_id(id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .ok()?;
    let user_data = attr
        .user_data()
        .and_then(|u| u.value())
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .unwrap_or_default();
    let provider_id = format!("aws:///{REGION}/{id}");
    let vm = LocalNodeVm {
        key: id,
        machine: name,
        node: node_name,
        provider_id: &provider_id,
        user_data: &user_data,
    };
    boot_local_node(binary, kubeconfig, dir, &vm)
}
