//! `machine-controller-gcp` end to end: the real control plane (mcm-testenv with
//! kube-controller-manager and scheduler), the real binary with `--controllers=machine,manager`
//! pointed at the fake Compute API of the provider's tests (`MCM_GCP_COMPUTE_ENDPOINT`,
//! served from this test process), and a "VM player" that boots every RUNNING instance of the
//! cluster as a `local-node` hollow kubelet (Node name = instance name, providerID
//! `gce:///<project>/<zone>/<name>`, the instance's `user-data` metadata with its bootstrap
//! token), and stops it when the instance is gone.
//!
//! Every process (controller, agents) runs in its own process group with `PR_SET_PDEATHSIG`
//! through `mcm_testenv::process::ManagedProcess`, and is killed on drop, so nothing outlives a
//! failing test.

use mcm_fake_compute as fake_compute;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_compute::{FakeCompute, Fault, service_account_json};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use mcm_testenv::kit::{
    LocalNodeVm, MachineClassBuilder, MachineDeploymentBuilder, ProviderController, TestNamespace,
    await_event, binary_beside, boot_local_node, create_class_with_secret, eventually, secret,
    stop_agents,
};
use mcm_testenv::process::ManagedProcess;
use mcm_testenv::{Components, ControlPlane};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const PROJECT: &str = "mcm-e2e-project";
const EMAIL: &str = "mcm@mcm-e2e-project.iam.gserviceaccount.com";
const ZONE: &str = "europe-west1-b";
const CLUSTER_TAG: &str = "kubernetes-io-cluster-shoot--e2e";
const ROLE_TAG: &str = "kubernetes-io-role-node";
const USER_DATA: &str = "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\n";

/// `local-node`, next to the controller binary (built on demand when missing).
fn node_binary() -> PathBuf {
    binary_beside(
        env!("CARGO_BIN_EXE_machine-controller-gcp"),
        "local-node",
        "mcm-provider-local",
    )
}

fn is_ours(i: &Value) -> bool {
    let tags = i["tags"]["items"].as_array().cloned().unwrap_or_default();
    tags.contains(&json!(CLUSTER_TAG)) && tags.contains(&json!(ROLE_TAG))
}

/// The instances of the cluster in the fake, by name.
fn our_instances(fake: &FakeCompute) -> BTreeMap<String, Value> {
    fake.instances()
        .into_iter()
        .filter(is_ours)
        .map(|i| (i["name"].as_str().unwrap_or_default().to_string(), i))
        .collect()
}

/// Plays the booted VMs: one `local-node` per RUNNING instance of the cluster.
struct VmPlayer {
    task: tokio::task::JoinHandle<()>,
    agents: Arc<Mutex<BTreeMap<String, ManagedProcess>>>,
    dir: tempfile::TempDir,
}

impl VmPlayer {
    fn start(fake: Arc<FakeCompute>, kubeconfig: PathBuf) -> VmPlayer {
        let dir = tempfile::tempdir().unwrap();
        let agents: Arc<Mutex<BTreeMap<String, ManagedProcess>>> = Default::default();
        let (a, d, binary) = (agents.clone(), dir.path().to_path_buf(), node_binary());
        std::fs::write(d.join("spec.json"), r#"{"heartbeatInterval":"1s"}"#).unwrap();
        let task = tokio::spawn(async move {
            loop {
                let instances = our_instances(&fake);
                for (name, i) in &instances {
                    let running = i["status"] == "RUNNING";
                    let known = a.lock().unwrap().contains_key(name);
                    if running && !known {
                        if let Some(agent) = boot(i, &d, &binary, &kubeconfig) {
                            a.lock().unwrap().insert(name.clone(), agent);
                        }
                    } else if !running && known {
                        // Stopping or being deleted: the VM is gone.
                        a.lock().unwrap().remove(name);
                    }
                }
                a.lock()
                    .unwrap()
                    .retain(|name, _| instances.contains_key(name));
                // Wake on the fake's next change, or after a second at the latest.
                fake.wait_for(Duration::from_secs(1), |f| our_instances(f) != instances)
                    .await;
            }
        });
        VmPlayer { task, agents, dir }
    }

    fn running(&self) -> usize {
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

/// Boots one instance: its `user-data` (with the bootstrap token the controller put there) and
/// a `local-node` registering the Node under the instance name.
fn boot(i: &Value, dir: &Path, binary: &Path, kubeconfig: &Path) -> Option<ManagedProcess> {
    let name = i["name"].as_str()?;
    let zone = i["zone"].as_str()?.rsplit('/').next()?;
    let user_data = i["metadata"]["items"]
        .as_array()?
        .iter()
        .find(|m| m["key"] == "user-data")
        .and_then(|m| m["value"].as_str())
        .unwrap_or_default();
    let provider_id = format!("gce:///{PROJECT}/{zone}/{name}");
    let vm = LocalNodeVm {
        key: name,
        machine: name,
        node: name,
        provider_id: &provider_id,
        user_data: user_data.as_bytes(),
    };
    boot_local_node(binary, kubeconfig, dir, &vm)
}

fn provider_spec() -> Value {
    json!({
        "machineType": "n1-standard-2",
        "region": "europe-west1",
        "zone": ZONE,
        "disks": [{"boot": true, "sizeGb": 20, "type": "pd-balanced",
                   "image": "projects/debian-cloud/global/images/family/debian-12"}],
        "networkInterfaces": [{"network": "shoot--e2e", "subnetwork": "shoot--e2e-nodes",
                               "disableExternalIP": true}],
        "scheduling": {"automaticRestart": true, "onHostMaintenance": "MIGRATE"},
        "tags": [CLUSTER_TAG, ROLE_TAG],
    })
}

/// The world of the test: control plane, namespace, fake Compute API, class and secret.
struct Env {
    cp: Arc<ControlPlane>,
    client: kube::Client,
    ns: String,
    fake: Arc<FakeCompute>,
    logs: tempfile::TempDir,
}

impl Env {
    async fn new(prefix: &str) -> Env {
        let TestNamespace {
            env: cp,
            client,
            ns,
        } = TestNamespace::new(Components::ALL, prefix).await;
        let fake = Arc::new(FakeCompute::start(PROJECT, EMAIL).await);
        let class = MachineClassBuilder::new("gcp")
            .provider("GCP")
            .spec(provider_spec())
            .secret(&ns, "gcp-secret")
            .build();
        let key = service_account_json(PROJECT, EMAIL).to_string();
        let credentials = secret(
            "gcp-secret",
            &[
                ("serviceAccountJSON", key.as_str()),
                ("userData", USER_DATA),
            ],
        );
        create_class_with_secret(&client, &ns, &class, &credentials).await;
        Env {
            cp,
            client,
            ns,
            fake,
            logs: tempfile::tempdir().unwrap(),
        }
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Starts `machine-controller-gcp --controllers=machine,manager` against the fake.
    fn spawn_controller(&self) -> ProviderController {
        self.spawn_controller_with(&[])
    }

    /// [`Env::spawn_controller`] with `extra` flags.
    fn spawn_controller_with(&self, extra: &[String]) -> ProviderController {
        let env: Vec<(String, String)> = vec![
            ("MCM_GCP_COMPUTE_ENDPOINT".into(), self.fake.url()),
            (
                "RUST_LOG".into(),
                "info,mcm_reconcilers=debug,mcm_provider_gcp=debug".into(),
            ),
        ];
        ProviderController::spawn_with_args(
            "machine-controller-gcp",
            env!("CARGO_BIN_EXE_machine-controller-gcp"),
            &env,
            self.cp.kubeconfig_path(),
            &self.ns,
            self.logs.path(),
            extra,
        )
    }

    async fn machine_list(&self) -> Vec<Machine> {
        self.machines()
            .list(&Default::default())
            .await
            .unwrap()
            .items
    }
}

fn provider_id(name: &str) -> String {
    format!("gce:///{PROJECT}/{ZONE}/{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deployment_runs_on_the_fake_compute_api_through_quota_scale_down_and_orphans() {
    let env = Env::new("gcp-e2e").await;
    let player = VmPlayer::start(env.fake.clone(), env.cp.kubeconfig_path().to_path_buf());
    // The first insert runs out of capacity in its zone operation.
    env.fake.fail_next_inserts(1, Fault::ZoneExhausted);
    let controller = env.spawn_controller();

    let md = MachineDeploymentBuilder::new("workers")
        .replicas(3)
        .class("gcp")
        .match_label("pool", "workers")
        .rolling(1, 0)
        .build();
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), &env.ns);
    mds.create(&PostParams::default(), &md).await.unwrap();

    // The machine whose VM could not be made says why, in its status and an Event.
    let exhausted = eventually(WAIT, "a Machine reporting ResourceExhausted", || async {
        env.machine_list().await.into_iter().find(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.last_operation.as_ref())
                .and_then(|op| op.error_code.as_deref())
                == Some("ResourceExhausted")
        })
    })
    .await;
    let status = exhausted.status.clone().unwrap_or_default();
    assert_eq!(
        status
            .current_status
            .as_ref()
            .and_then(|c| c.phase.as_ref()),
        Some(&MachinePhase::CrashLoopBackOff)
    );
    let description = status
        .last_operation
        .unwrap_or_default()
        .description
        .unwrap_or_default();
    assert!(
        description.contains("ZONE_RESOURCE_POOL_EXHAUSTED"),
        "{description}"
    );
    let name = exhausted.metadata.name.clone().unwrap();
    await_event(
        &env.client,
        &env.ns,
        &name,
        "CreationFailed",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        WAIT,
    )
    .await;

    // Capacity is back: three machines Running, each backed by one instance whose Node joined.
    let running = eventually(WAIT, "3 machines Running", || async {
        let ms = env.machine_list().await;
        (ms.len() == 3 && ms.iter().all(|m| m.phase() == Some(&MachinePhase::Running)))
            .then_some(ms)
    })
    .await;
    let live = our_instances(&env.fake);
    assert_eq!(live.len(), 3, "one instance per machine: {:?}", live.keys());
    let mut machine_ids: Vec<String> = running
        .iter()
        .map(|m| m.spec.provider_id.clone().unwrap_or_default())
        .collect();
    machine_ids.sort();
    let mut instance_ids: Vec<String> = live.keys().map(|n| provider_id(n)).collect();
    instance_ids.sort();
    assert_eq!(machine_ids, instance_ids);
    // One insert per machine, and a second one for the machine whose first failed.
    let mut counts = env.fake.insert_counts();
    assert_eq!(counts.remove(&name), Some(2), "{counts:?}");
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    let nodes: Api<Node> = Api::all(env.client.clone());
    for name in live.keys() {
        let node = nodes.get(name).await.unwrap();
        assert_eq!(
            node.spec.and_then(|s| s.provider_id),
            Some(provider_id(name))
        );
    }
    assert_eq!(player.running(), 3);

    // Scale down to 1: two instances are deleted, their machines and Nodes go.
    mds.patch(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
    )
    .await
    .unwrap();
    let (remaining, left) = eventually(WAIT, "scale-down to 1 instance", || async {
        let ms = env.machine_list().await;
        let live = our_instances(&env.fake);
        (ms.len() == 1 && live.len() == 1).then_some((ms, live))
    })
    .await;
    let kept = left.keys().next().unwrap().clone();
    assert_eq!(
        remaining[0].spec.provider_id.clone().unwrap_or_default(),
        provider_id(&kept)
    );
    for name in live.keys().filter(|n| **n != kept) {
        eventually(WAIT, "the Node of a deleted instance to go", || async {
            nodes.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
    assert!(
        env.fake.disks().len() == 1,
        "the deleted instances' boot disks went with them: {:?}",
        env.fake.disks()
    );

    // An orphan: an instance with the class's cluster and role tags but no Machine.
    env.fake.insert_instance_directly(
        ZONE,
        json!({
            "name": "orphan-vm",
            "machineType": format!("zones/{ZONE}/machineTypes/n1-standard-2"),
            "disks": [{"boot": true, "autoDelete": true,
                       "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/shoot--e2e"}],
            "tags": {"items": [CLUSTER_TAG, ROLE_TAG]},
        }),
    );
    // Another cluster's instance in the same zone is never touched.
    env.fake.insert_instance_directly(
        ZONE,
        json!({
            "name": "someone-elses-vm",
            "machineType": format!("zones/{ZONE}/machineTypes/n1-standard-2"),
            "disks": [{"boot": true, "autoDelete": true,
                       "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/other"}],
            "tags": {"items": ["kubernetes-io-cluster-other", ROLE_TAG]},
        }),
    );
    eventually(WAIT, "the orphan instance to be deleted", || async {
        env.fake.instance(ZONE, "orphan-vm").is_none().then_some(())
    })
    .await;
    assert_eq!(
        our_instances(&env.fake).len(),
        1,
        "the machine's instance stays"
    );
    assert!(env.fake.instance(ZONE, "someone-elses-vm").is_some());

    // Deleting the deployment deletes the last instance.
    mds.delete("workers", &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "all machines and instances to go", || async {
        let ms = env.machine_list().await;
        (ms.is_empty() && our_instances(&env.fake).is_empty()).then_some(())
    })
    .await;
    drop(controller);
    drop(player);
}

/// What the API server answered a raw `POST` of `class` into the namespace: the status and
/// the `Warning` headers (what `kubectl apply` prints as `Warning: ...`).
async fn post_class(env: &Env, class: &Value) -> (u16, Vec<String>) {
    let uri = format!(
        "/apis/machine.sapcloud.io/v1alpha1/namespaces/{}/machineclasses",
        env.ns
    );
    let request = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(class).unwrap()))
        .unwrap();
    let response = env
        .client
        .send(request)
        .await
        .expect("the API server answers");
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .collect();
    (response.status().as_u16(), warnings)
}

/// A GCP class named `name` whose first network interface sets `key` to `true`.
fn class_with_nic_key(name: &str, ns: &str, key: &str) -> Value {
    let mut spec = provider_spec();
    let nic = spec["networkInterfaces"][0].as_object_mut().unwrap();
    nic.remove("disableExternalIP");
    nic.insert(key.to_string(), json!(true));
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": {"name": name, "namespace": ns},
        "provider": "GCP",
        "providerSpec": spec,
        "secretRef": {"name": "gcp-secret", "namespace": ns},
        "credentialsSecretRef": {"name": "gcp-secret", "namespace": ns},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_warns_of_keys_gardeners_driver_would_ignore() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use mcm_testenv::kit::{free_port, webhook_args, webhook_configuration};

    let env = Env::new("gcp-webhook").await;
    let name = format!("mcm-{}", env.ns);
    let port = free_port();
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let cfg: ValidatingWebhookConfiguration =
        serde_json::from_value(webhook_configuration(&name, &env.ns, port, "Fail")).unwrap();
    configs.create(&PostParams::default(), &cfg).await.unwrap();
    let _controller = env.spawn_controller_with(&webhook_args(port, &name));

    // An unknown key: stored (Gardener's driver ignores it too), with a warning naming the key
    // and the field it is nearest to. The configuration takes a moment to be in effect, so
    // fresh classes are posted until the webhook answers.
    let attempt = std::sync::atomic::AtomicU32::new(0);
    let warnings = eventually(WAIT, "a warning for disableExternalIPs", || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let class = class_with_nic_key(&format!("typo-{n}"), &env.ns, "disableExternalIPs");
        match post_class(&env, &class).await {
            (201, w) if !w.is_empty() => Ok(Some(w)),
            (201, _) => Err(format!(
                "typo-{n} stored without a warning: webhook not in effect yet"
            )),
            (status, w) => Err(format!("typo-{n}: HTTP {status} {w:?}")),
        }
    })
    .await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("providerSpec.networkInterfaces[0].disableExternalIPs")
            && warnings[0].contains("did you mean disableExternalIP?"),
        "{warnings:?}"
    );

    // The wrong case of a known key: Go matches it, so do we: stored, no warning.
    let (status, warnings) = post_class(
        &env,
        &class_with_nic_key("wrong-case", &env.ns, "disableExternalIp"),
    )
    .await;
    assert_eq!((status, warnings), (201, Vec::<String>::new()));
}
