//! Helpers shared by the integration tests: a local "cloud" per test (own state directory,
//! own class) whose guard kills every VM process it recorded, and Node waits on the kit's.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, Driver, DriverError,
    GetMachineStatusRequest, GetMachineStatusResponse, IdempotencyKey, ListMachinesRequest,
    ListMachinesResponse, RequestId, ResourceState, SecretData,
};
use mcm_provider_local::state::{self, StateDirectory};
use mcm_provider_local::{LocalDriver, LocalDriverConfig};
use mcm_testenv::kit::{await_object, is_ready, kubeconfig_text, try_eventually, within};
use serde_json::{Value, json};

/// Generous bound for anything the control plane does.
pub const WAIT: Duration = Duration::from_secs(60);

/// A local cloud for one test. Dropping it SIGKILLs every VM process recorded in its state
/// directory (pid and start time checked), so no test leaves a process behind, even when
/// it fails.
pub struct Cloud {
    pub dir: tempfile::TempDir,
    pub driver: LocalDriver,
    pub class: MachineClass,
    pub secret: SecretData,
}

impl Drop for Cloud {
    fn drop(&mut self) {
        let killed = state::kill_all_recorded(&self.state());
        if !killed.is_empty() {
            eprintln!("test guard killed leftover VM processes {killed:?}");
            // This process is their parent: give its reaper threads a moment to reap them, so
            // no zombie outlives the test process (bounded; a Drop cannot await).
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while killed
                .iter()
                .any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub fn node_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_local-node"))
}

impl Cloud {
    /// A cloud whose class has `spec` (plus its own `stateDirectory`) and whose secret holds
    /// the admin kubeconfig of the test control plane (and `user_data`, if any).
    pub fn new(kubeconfig: &str, spec: Value, user_data: Option<&str>) -> Cloud {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut spec = spec;
        spec["stateDirectory"] = json!(dir.path());
        let mut class = MachineClass::default();
        class.metadata.name = Some("local-class".into());
        class.provider = Some("local".into());
        class.provider_spec = spec;
        let mut pairs = vec![("kubeconfig", kubeconfig)];
        if let Some(ud) = user_data {
            pairs.push(("userData", ud));
        }
        Cloud {
            driver: LocalDriver::new(LocalDriverConfig {
                node_binary: node_binary(),
            }),
            secret: SecretData::from_pairs(pairs),
            class,
            dir,
        }
    }

    /// A cloud on the control plane of `env`.
    pub fn on(env: &mcm_testenv::ControlPlane, spec: Value) -> Cloud {
        Cloud::new(&kubeconfig_text(env), spec, None)
    }

    pub fn state(&self) -> StateDirectory {
        StateDirectory::new(self.dir.path())
    }

    pub async fn create(&self, name: &str) -> Result<CreateMachineResponse, DriverError> {
        self.driver
            .create_machine(CreateMachineRequest {
                machine: machine(name),
                machine_class: self.class.clone(),
                secret: self.secret.clone(),
                request_id: RequestId::generate(),
                idempotency_key: IdempotencyKey::random(),
            })
            .await
    }

    pub async fn delete(&self, name: &str) -> Result<(), DriverError> {
        self.driver
            .delete_machine(DeleteMachineRequest {
                machine: machine(name),
                machine_class: self.class.clone(),
                secret: self.secret.clone(),
                request_id: RequestId::generate(),
            })
            .await
            .map(drop)
    }

    pub async fn status(&self, name: &str) -> Result<GetMachineStatusResponse, DriverError> {
        self.driver
            .get_machine_status(GetMachineStatusRequest {
                machine: machine(name),
                machine_class: self.class.clone(),
                secret: self.secret.clone(),
                request_id: RequestId::generate(),
            })
            .await
    }

    pub async fn list_with(&self, driver: &LocalDriver) -> ListMachinesResponse {
        driver
            .list_machines(ListMachinesRequest {
                machine_class: self.class.clone(),
                secret: self.secret.clone(),
                request_id: RequestId::generate(),
            })
            .await
            .expect("list_machines")
    }

    pub async fn list(&self) -> ListMachinesResponse {
        self.list_with(&self.driver).await
    }

    /// The pid recorded for a machine.
    pub fn pid(&self, name: &str) -> i32 {
        self.state()
            .read(name)
            .expect("readable record")
            .expect("a record")
            .pid
    }

    /// The agent's log of a machine (for failure messages).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.state().work_dir(name).join(state::LOG_FILE))
            .unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    /// Waits until the VM's process has stopped. A process exit has no watch, so this looks
    /// at `/proc` (through the driver), bounded by `timeout`.
    pub async fn await_stopped(&self, name: &str, timeout: Duration) {
        let stopped = try_eventually(timeout, &format!("VM {name} to stop"), || async {
            let state = self.status(name).await.expect("status").resources[0].state;
            if state == ResourceState::Stopped {
                Ok(())
            } else {
                Err(state)
            }
        })
        .await;
        if let Err(e) = stopped {
            panic!("{e}; log:\n{}", self.log(name));
        }
    }
}

pub fn machine(name: &str) -> Machine {
    Machine::new(name, Default::default())
}

/// Waits (with a watch) until the Node exists and is Ready.
pub async fn await_node_ready(client: &kube::Client, name: &str, cloud: &Cloud) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    let waited = tokio::time::timeout(
        WAIT,
        await_condition(api, name, |n: Option<&Node>| n.is_some_and(is_ready)),
    )
    .await;
    match waited {
        Ok(Ok(Some(node))) => node,
        other => panic!(
            "Node {name} did not become Ready: {other:?}\nagent log:\n{}",
            cloud.log(name)
        ),
    }
}

/// Waits (with one watch) until `count` Nodes matching `selector` are Ready at the same time.
pub async fn await_all_ready(client: &kube::Client, selector: &str, count: usize) {
    let api: Api<Node> = Api::all(client.clone());
    let mut ready: BTreeMap<String, bool> = BTreeMap::new();
    let stream = watcher(api, watcher::Config::default().labels(selector));
    futures::pin_mut!(stream);
    within(WAIT, &format!("{count} Ready Nodes ({selector})"), async {
        while let Some(event) = stream.try_next().await.expect("node watch") {
            match event {
                watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                    ready.insert(n.metadata.name.clone().unwrap_or_default(), is_ready(&n));
                }
                watcher::Event::Delete(n) => {
                    ready.remove(n.metadata.name.as_deref().unwrap_or_default());
                }
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
            if ready.values().filter(|r| **r).count() == count {
                return;
            }
        }
    })
    .await;
}

/// Deletes Nodes (best effort; the controller would do this in real life).
pub async fn delete_nodes(client: &kube::Client, names: &[String]) {
    let api: Api<Node> = Api::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Pids of processes whose command line runs `local-node --machine-name <name>`.
pub fn agent_processes(machine_name: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let needle = format!("--machine-name\0{machine_name}\0");
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
                && state::read_proc_stat(*pid).is_some_and(|s| s.state != 'Z')
        })
        .collect()
}

/// Watches a stream of Nodes until `pred` holds for `name`.
pub async fn await_node(
    client: &kube::Client,
    name: &str,
    what: &str,
    pred: impl Fn(Option<&Node>) -> bool,
) -> Option<Node> {
    await_object(Api::all(client.clone()), name, WAIT, what, pred).await
}
