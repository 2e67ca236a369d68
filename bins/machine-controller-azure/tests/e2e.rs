//! `machine-controller-azure` end to end: the real control plane (mcm-testenv with
//! kube-controller-manager and scheduler), the real binary with `--controllers=machine,manager`
//! pointed at the fake ARM of the provider's tests (`MCM_AZURE_ARM_ENDPOINT` and
//! `AZURE_AUTHORITY_HOST`, served over HTTPS from this test process, its CA in
//! `MCM_AZURE_CA_FILE`), and a "VM player" that boots every
//! provisioned VM of the cluster as a `local-node` hollow kubelet (Node name = VM name,
//! providerID `azure:///<location>/<name>`, the VM's `customData` with its bootstrap token), and
//! stops it when the VM is gone.
//!
//! Every process (controller, agents) runs in its own process group with `PR_SET_PDEATHSIG`
//! through `mcm_testenv::process::ManagedProcess`, and is killed on drop, so nothing outlives a
//! failing test.

use mcm_fake_arm as fake_arm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use fake_arm::{FakeArm, zonal_allocation_failed_message};
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
const SUB: &str = "00000000-0000-0000-0000-0000000000e2";
const TENANT: &str = "00000000-0000-0000-0000-0000000000e3";
const CLIENT: &str = "00000000-0000-0000-0000-0000000000e4";
const CLIENT_SECRET: &str = "e2e-secret";
const RG: &str = "shoot--e2e";
const LOCATION: &str = "westeurope";
/// The community gallery image of the machines' data disk.
const DATA_IMAGE: &str = "/CommunityGalleries/gardenlinux-13e998fe/Images/data/Versions/1.0.0";
const CLUSTER_TAG: &str = "kubernetes.io-cluster-shoot--e2e";
const ROLE_TAG: &str = "kubernetes.io-role-node";
const USER_DATA: &str = "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\n";

/// `local-node`, next to the controller binary (built on demand when missing).
fn node_binary() -> PathBuf {
    binary_beside(
        env!("CARGO_BIN_EXE_machine-controller-azure"),
        "local-node",
        "mcm-provider-local",
    )
}

fn is_ours(r: &Value) -> bool {
    let tags = r["tags"].as_object().cloned().unwrap_or_default();
    tags.contains_key(CLUSTER_TAG) && tags.contains_key(ROLE_TAG)
}

fn by_name(resources: Vec<Value>) -> BTreeMap<String, Value> {
    resources
        .into_iter()
        .filter(is_ours)
        .map(|r| (r["name"].as_str().unwrap_or_default().to_string(), r))
        .collect()
}

/// The VMs of the cluster in the fake, by name.
fn our_vms(fake: &FakeArm) -> BTreeMap<String, Value> {
    by_name(fake.vms(RG))
}

/// The NICs of the cluster in the fake, by name.
fn our_nics(fake: &FakeArm) -> BTreeMap<String, Value> {
    by_name(fake.nics(RG))
}

/// The user data a VM was created with: the `customData` of its last PUT (ARM never returns it).
fn custom_data(fake: &FakeArm, name: &str) -> Option<Vec<u8>> {
    fake.request_log()
        .into_iter()
        .rev()
        .filter(|r| r.method == "PUT" && r.path.ends_with(&format!("/virtualMachines/{name}")))
        .find_map(|r| {
            let data = r
                .body?
                .pointer("/properties/osProfile/customData")?
                .as_str()?
                .to_string();
            base64::engine::general_purpose::STANDARD.decode(data).ok()
        })
}

/// Plays the booted VMs: one `local-node` per provisioned VM of the cluster.
struct VmPlayer {
    task: tokio::task::JoinHandle<()>,
    agents: Arc<Mutex<BTreeMap<String, ManagedProcess>>>,
    dir: tempfile::TempDir,
}

/// Whether the instance view of VM `name` says it runs.
fn powered_on(fake: &FakeArm, name: &str) -> bool {
    fake.vm_instance_view(RG, name)
        .and_then(|v| v["statuses"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|s| s["code"] == "PowerState/running")
}

impl VmPlayer {
    fn start(fake: Arc<FakeArm>, kubeconfig: PathBuf) -> VmPlayer {
        let dir = tempfile::tempdir().unwrap();
        let agents: Arc<Mutex<BTreeMap<String, ManagedProcess>>> = Default::default();
        let (a, d, binary) = (agents.clone(), dir.path().to_path_buf(), node_binary());
        std::fs::write(d.join("spec.json"), r#"{"heartbeatInterval":"1s"}"#).unwrap();
        let task = tokio::spawn(async move {
            loop {
                let vms = our_vms(&fake);
                for (name, vm) in &vms {
                    // A VM runs once provisioned, and keeps running when a later operation
                    // on it fails (provisioningState Failed, power state running).
                    let running = vm["properties"]["provisioningState"] == "Succeeded"
                        || powered_on(&fake, name);
                    let known = a.lock().unwrap().contains_key(name);
                    if running && !known {
                        let user_data = custom_data(&fake, name).unwrap_or_default();
                        if let Some(agent) = boot(name, &user_data, &d, &binary, &kubeconfig) {
                            a.lock().unwrap().insert(name.clone(), agent);
                        }
                    } else if !running && known {
                        a.lock().unwrap().remove(name);
                    }
                }
                a.lock().unwrap().retain(|name, _| vms.contains_key(name));
                // Wake on the fake's next change, or after a second at the latest.
                fake.wait_for(Duration::from_secs(1), |f| our_vms(f) != vms)
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

/// Boots one VM: its user data and a `local-node` registering the Node under the VM name.
fn boot(
    name: &str,
    user_data: &[u8],
    dir: &Path,
    binary: &Path,
    kubeconfig: &Path,
) -> Option<ManagedProcess> {
    let provider_id = format!("azure:///{LOCATION}/{name}");
    let vm = LocalNodeVm {
        key: name,
        machine: name,
        node: name,
        provider_id: &provider_id,
        user_data,
    };
    boot_local_node(binary, kubeconfig, dir, &vm)
}

fn provider_spec() -> Value {
    json!({
        "location": LOCATION,
        "resourceGroup": RG,
        "subnetInfo": {"vnetName": "shoot--e2e", "subnetName": "shoot--e2e-nodes"},
        "tags": {"Name": "shoot--e2e", CLUSTER_TAG: "1", ROLE_TAG: "1"},
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_D2s_v5"},
            "storageProfile": {
                "imageReference": {"urn": "sap:gardenlinux:greatest:1443.3.0"},
                "osDisk": {"caching": "None", "diskSizeGB": 50, "createOption": "FromImage",
                           "managedDisk": {"storageAccountType": "Premium_LRS"}},
                // A data disk made from an image (made before its VM, which attaches it).
                "dataDisks": [{"name": "image", "lun": 0, "storageAccountType": "Premium_LRS",
                               "diskSizeGB": 16,
                               "imageRef": {"communityGalleryImageID": DATA_IMAGE}}]
            },
            "osProfile": {"adminUsername": "core", "linuxConfiguration": {
                "disablePasswordAuthentication": true,
                "ssh": {"publicKeys": {"path": "/home/core/.ssh/authorized_keys", "keyData": "ssh-rsa AAAAB3NzaC1yc2E e2e"}}}},
            "zone": 1
        }
    })
}

/// The world of the test: control plane, namespace, fake ARM, class and secret.
struct Env {
    cp: Arc<ControlPlane>,
    client: kube::Client,
    ns: String,
    fake: Arc<FakeArm>,
    logs: tempfile::TempDir,
}

impl Env {
    async fn new(prefix: &str) -> Env {
        let TestNamespace {
            env: cp,
            client,
            ns,
        } = TestNamespace::new(Components::ALL, prefix).await;
        let fake = Arc::new(FakeArm::start(SUB, TENANT, CLIENT, CLIENT_SECRET).await);
        fake.add_subnet(RG, "shoot--e2e", "shoot--e2e-nodes");
        // The class's marketplace image has a plan whose terms are not accepted yet.
        fake.add_vm_image(
            LOCATION,
            "sap:gardenlinux:greatest:1443.3.0",
            Some(("greatest", "gardenlinux", "sap")),
        );
        let class = MachineClassBuilder::new("azure")
            .provider("Azure")
            .spec(provider_spec())
            .secret(&ns, "azure-secret")
            .build();
        let credentials = secret(
            "azure-secret",
            &[
                ("clientID", CLIENT),
                ("clientSecret", CLIENT_SECRET),
                ("tenantID", TENANT),
                ("subscriptionID", SUB),
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

    /// Starts `machine-controller-azure --controllers=machine,manager` against the fake, whose
    /// CA only the controller's Azure client trusts (`MCM_AZURE_CA_FILE`).
    fn spawn_controller(&self) -> ProviderController {
        let ca_file = self.logs.path().join("fake-arm-ca.pem");
        std::fs::write(&ca_file, self.fake.ca_pem()).unwrap();
        let env: Vec<(String, String)> = vec![
            ("MCM_AZURE_ARM_ENDPOINT".into(), self.fake.url()),
            ("AZURE_AUTHORITY_HOST".into(), self.fake.url()),
            ("MCM_AZURE_CA_FILE".into(), ca_file.display().to_string()),
            (
                "RUST_LOG".into(),
                "info,mcm_reconcilers=debug,mcm_provider_azure=debug".into(),
            ),
        ];
        ProviderController::spawn(
            "machine-controller-azure",
            env!("CARGO_BIN_EXE_machine-controller-azure"),
            &env,
            self.cp.kubeconfig_path(),
            &self.ns,
            self.logs.path(),
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
    format!("azure:///{LOCATION}/{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deployment_runs_on_the_fake_arm_through_failures_scale_down_and_orphans() {
    let env = Env::new("azure-e2e").await;
    let player = VmPlayer::start(env.fake.clone(), env.cp.kubeconfig_path().to_path_buf());
    // The first VM runs out of zonal capacity; the second fails for another reason and is left
    // half-made (VM Failed, its NIC and disk attached), as Azure leaves it.
    env.fake.fail_next_vm_creates(
        1,
        "ZonalAllocationFailed",
        &zonal_allocation_failed_message(),
    );
    env.fake.fail_next_vm_creates(
        1,
        "InternalExecutionError",
        "An internal execution error occurred. Please retry later.",
    );
    let controller = env.spawn_controller();

    let md = MachineDeploymentBuilder::new("workers")
        .replicas(3)
        .class("azure")
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
    let name = exhausted.metadata.name.clone().unwrap();
    await_event(
        &env.client,
        &env.ns,
        &name,
        "CreationFailed",
        "ZonalAllocationFailed",
        WAIT,
    )
    .await;

    // Both recover: three machines Running, each backed by one VM and one NIC.
    let running = eventually(WAIT, "3 machines Running", || async {
        let ms = env.machine_list().await;
        (ms.len() == 3 && ms.iter().all(|m| m.phase() == Some(&MachinePhase::Running)))
            .then_some(ms)
    })
    .await;
    let vms = our_vms(&env.fake);
    assert_eq!(vms.len(), 3, "one VM per machine: {:?}", vms.keys());
    // Made from the marketplace image with its plan, its terms accepted on the way, each with
    // its data disk made from the gallery image and attached.
    assert!(vms.values().all(|vm| vm["plan"]["name"] == "greatest"));
    for name in vms.keys() {
        let disk = env
            .fake
            .disk(RG, &format!("{name}-image-0-data-disk"))
            .expect("the data disk made from its image");
        assert_eq!(
            disk["properties"]["creationData"]["galleryImageReference"]["communityGalleryImageId"],
            DATA_IMAGE
        );
        assert_eq!(
            disk["managedBy"]
                .as_str()
                .map(|m| m.ends_with(name.as_str())),
            Some(true)
        );
    }
    assert!(
        env.fake
            .agreement_accepted("greatest", "gardenlinux", "sap")
    );
    let mut machine_ids: Vec<String> = running
        .iter()
        .map(|m| m.spec.provider_id.clone().unwrap_or_default())
        .collect();
    machine_ids.sort();
    let vm_ids: Vec<String> = vms.keys().map(|n| provider_id(n)).collect();
    assert_eq!(machine_ids, vm_ids);
    let nic_names: Vec<String> = our_nics(&env.fake).into_keys().collect();
    let want: Vec<String> = vms.keys().map(|n| format!("{n}-nic")).collect();
    assert_eq!(nic_names, want);
    let nodes: Api<Node> = Api::all(env.client.clone());
    for name in vms.keys() {
        let node = nodes.get(name).await.unwrap();
        assert_eq!(
            node.spec.and_then(|s| s.provider_id),
            Some(provider_id(name))
        );
    }
    assert_eq!(player.running(), 3);

    // A VM that failed a later operation but still runs (a failed extension) is reported as
    // there, not gone: deleting its machine drains the node first.
    let failed = running[0].metadata.name.clone().unwrap();
    assert!(env.fake.fail_vm_directly(
        RG,
        &failed,
        "VMExtensionProvisioningError",
        "VM has reported a failure when processing extension 'node-agent'.",
    ));
    env.machines()
        .delete(&failed, &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "the failed VM's machine gone with its VM", || async {
        (env.machines().get_opt(&failed).await.unwrap().is_none()
            && !our_vms(&env.fake).contains_key(&failed))
        .then_some(())
    })
    .await;
    // Its node had nothing to move: the deletion's one Event on the Machine tells what went.
    await_event(
        &env.client,
        &env.ns,
        &failed,
        "Deleted",
        "VM and node deleted",
        WAIT,
    )
    .await;
    eventually(WAIT, "3 machines Running again", || async {
        let ms = env.machine_list().await;
        (ms.len() == 3
            && ms.iter().all(|m| m.phase() == Some(&MachinePhase::Running))
            && our_vms(&env.fake).len() == 3)
            .then_some(())
    })
    .await;

    // Scale down to 1: two VMs go with their NICs and disks.
    mds.patch(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
    )
    .await
    .unwrap();
    let kept = eventually(WAIT, "scale-down to 1 VM", || async {
        let ms = env.machine_list().await;
        let vms = our_vms(&env.fake);
        (ms.len() == 1 && vms.len() == 1).then(|| vms.into_keys().next().unwrap())
    })
    .await;
    eventually(
        WAIT,
        "the deleted machines' NICs and disks to go",
        || async {
            let nics: Vec<String> = our_nics(&env.fake).into_keys().collect();
            let disks: Vec<String> = env
                .fake
                .disks(RG)
                .iter()
                .map(|d| d["name"].as_str().unwrap_or_default().to_string())
                .collect();
            let want = vec![
                format!("{kept}-image-0-data-disk"),
                format!("{kept}-os-disk"),
            ];
            (nics == vec![format!("{kept}-nic")] && disks == want).then_some(())
        },
    )
    .await;

    // An orphan NIC (a machine whose VM never came) is collected; another cluster's is not.
    let subnet = env.fake.subnet_id(RG, "shoot--e2e", "shoot--e2e-nodes");
    for (name, cluster) in [
        ("orphan-nic", CLUSTER_TAG),
        ("other-nic", "kubernetes.io-cluster-other"),
    ] {
        env.fake.put_nic_directly(
            RG,
            json!({"name": name, "location": LOCATION, "tags": {cluster: "1", ROLE_TAG: "1"},
                   "properties": {"ipConfigurations": [{"name": "ip", "properties": {"subnet": {"id": subnet}}}]}}),
        );
    }
    eventually(WAIT, "the orphan NIC to be deleted", || async {
        env.fake.nic(RG, "orphan-nic").is_none().then_some(())
    })
    .await;
    assert!(env.fake.nic(RG, "other-nic").is_some());
    assert_eq!(our_vms(&env.fake).len(), 1, "the machine's VM stays");

    // Deleting the deployment deletes the last VM, NIC and disk.
    mds.delete("workers", &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "all machines and their resources to go", || async {
        let ms = env.machine_list().await;
        (ms.is_empty()
            && our_vms(&env.fake).is_empty()
            && our_nics(&env.fake).is_empty()
            && env.fake.disks(RG).is_empty())
        .then_some(())
    })
    .await;
    drop(controller);
    drop(player);
}
