//! `machine-controller-aws` end to end: the real control plane (mcm-testenv with
//! kube-controller-manager and scheduler), the real binary with `--controllers=machine,manager`
//! pointed at moto (`AWS_ENDPOINT_URL`), and a "VM player" that boots every instance that
//! appears in moto as a `local-node` hollow kubelet (Node name = the instance's private DNS
//! name, providerID `aws:///<region>/<id>`, the instance's user data with its bootstrap
//! token), and stops it when the instance is terminated.
//!
//! Every process (moto, controller, agents) runs in its own process group with
//! `PR_SET_PDEATHSIG` through `mcm_testenv::process::ManagedProcess`, and is killed on drop,
//! so nothing outlives a failing test.

#[path = "../../../providers/aws/tests/common/moto.rs"]
mod moto;
#[path = "../../../providers/aws/tests/common/vm_player.rs"]
mod vm_player;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::{InstanceStateName, ResourceType, Tag, TagSpecification};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use mcm_api::{Machine, MachineDeployment, MachinePhase};
use mcm_testenv::kit::{
    MachineClassBuilder, MachineDeploymentBuilder, ProviderController, TestNamespace,
    binary_beside, create_class_with_secret, eventually, secret,
};
use mcm_testenv::{Components, ControlPlane};
use moto::{REGION, World, lagging_moto, moto};
use serde_json::json;
use vm_player::VmPlayer;

const WAIT: Duration = Duration::from_secs(120);
const USER_DATA: &str = "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\n";

/// `local-node`, next to the controller binary (built on demand when missing).
fn node_binary() -> PathBuf {
    binary_beside(
        env!("CARGO_BIN_EXE_machine-controller-aws"),
        "local-node",
        "mcm-provider-local",
    )
}

/// The world of the test: control plane, namespace, class and secret.
struct Env {
    cp: Arc<ControlPlane>,
    client: kube::Client,
    ns: String,
    world: World,
    logs: tempfile::TempDir,
}

impl Env {
    async fn new(prefix: &str) -> Env {
        Env::new_in(moto(), prefix).await
    }

    /// An environment whose EC2 is moto server `m` (e.g. [`lagging_moto`]).
    async fn new_in(m: &'static moto::Moto, prefix: &str) -> Env {
        let TestNamespace {
            env: cp,
            client,
            ns,
        } = TestNamespace::new(Components::ALL, prefix).await;
        let world = World::new_in(m, prefix).await;
        let class = MachineClassBuilder::new("aws")
            .provider("AWS")
            .spec(world.provider_spec())
            .secret(&ns, "aws-secret")
            .build();
        let credentials = secret(
            "aws-secret",
            &[
                ("providerAccessKeyId", "AKIDTEST"),
                ("providerSecretAccessKey", "secret"),
                ("userData", USER_DATA),
            ],
        );
        create_class_with_secret(&client, &ns, &class, &credentials).await;
        Env {
            cp,
            client,
            ns,
            world,
            logs: tempfile::tempdir().unwrap(),
        }
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Starts `machine-controller-aws --controllers=machine,manager` against the fake.
    fn spawn_controller(&self) -> ProviderController {
        let env: Vec<(String, String)> = vec![
            ("AWS_ENDPOINT_URL".into(), self.world.moto.url.clone()),
            ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
            (
                "RUST_LOG".into(),
                "info,mcm_reconcilers=debug,mcm_provider_aws=debug".into(),
            ),
        ];
        ProviderController::spawn(
            "machine-controller-aws",
            env!("CARGO_BIN_EXE_machine-controller-aws"),
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

fn provider_ids_of(instances: &[aws_sdk_ec2::types::Instance]) -> Vec<String> {
    let mut ids: Vec<String> = instances
        .iter()
        .map(|i| format!("aws:///{REGION}/{}", i.instance_id().unwrap()))
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deployment_runs_on_moto_scales_down_and_orphans_are_collected() {
    let env = Env::new("aws-e2e").await;
    let player = VmPlayer::start(
        &env.world,
        node_binary(),
        env.cp.kubeconfig_path().to_path_buf(),
    );
    let controller = env.spawn_controller();

    let md = MachineDeploymentBuilder::new("workers")
        .replicas(3)
        .class("aws")
        .match_label("pool", "workers")
        .rolling(1, 0)
        .build();
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), &env.ns);
    mds.create(&PostParams::default(), &md).await.unwrap();

    // Three machines Running, each backed by one instance in moto whose Node joined.
    let running = eventually(WAIT, "3 machines Running", || async {
        let ms = env.machine_list().await;
        (ms.len() == 3 && ms.iter().all(|m| m.phase() == Some(&MachinePhase::Running)))
            .then_some(ms)
    })
    .await;
    let live = env.world.live_instances().await;
    assert_eq!(live.len(), 3, "one instance per machine");
    let mut machine_ids: Vec<String> = running
        .iter()
        .map(|m| m.spec.provider_id.clone().unwrap_or_default())
        .collect();
    machine_ids.sort();
    assert_eq!(machine_ids, provider_ids_of(&live));
    let nodes: Api<Node> = Api::all(env.client.clone());
    for i in &live {
        let name = i.private_dns_name().unwrap();
        let node = nodes.get(name).await.unwrap();
        assert_eq!(
            node.spec.and_then(|s| s.provider_id),
            Some(format!("aws:///{REGION}/{}", i.instance_id().unwrap()))
        );
    }
    assert_eq!(player.running(), 3);

    // Scale down to 1: two instances are terminated in moto, their machines and Nodes go.
    mds.patch(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": 1 } })),
    )
    .await
    .unwrap();
    let remaining = eventually(WAIT, "scale-down to 1 instance", || async {
        let ms = env.machine_list().await;
        let live = env.world.live_instances().await;
        (ms.len() == 1 && live.len() == 1).then_some((ms, live))
    })
    .await;
    assert_eq!(
        remaining.0[0].spec.provider_id.clone().unwrap_or_default(),
        provider_ids_of(&remaining.1)[0]
    );
    let terminated: Vec<_> = live
        .iter()
        .filter(|i| {
            !provider_ids_of(&remaining.1).contains(&provider_ids_of(std::slice::from_ref(i))[0])
        })
        .map(|i| i.instance_id().unwrap().to_string())
        .collect();
    assert_eq!(terminated.len(), 2);
    let states = moto()
        .ec2()
        .describe_instances()
        .set_instance_ids(Some(terminated.clone()))
        .send()
        .await
        .unwrap();
    for i in states.reservations().iter().flat_map(|r| r.instances()) {
        assert_eq!(
            i.state().and_then(|s| s.name()),
            Some(&InstanceStateName::Terminated),
            "{:?}",
            i.instance_id()
        );
        let name = i.private_dns_name().unwrap_or_default();
        eventually(WAIT, "the Node of a terminated instance to go", || async {
            nodes.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }

    // An orphan: an instance with the class's cluster and role tags but no Machine.
    let orphan = moto()
        .ec2()
        .run_instances()
        .image_id(&env.world.ami)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(&env.world.subnet)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(Tag::builder().key("Name").value("orphan-vm").build())
                .tags(
                    Tag::builder()
                        .key(&env.world.cluster_tag)
                        .value("1")
                        .build(),
                )
                .tags(Tag::builder().key(&env.world.role_tag).value("1").build())
                .build(),
        )
        .send()
        .await
        .unwrap();
    let orphan_id = orphan.instances()[0].instance_id().unwrap().to_string();
    eventually(WAIT, "the orphan instance to be terminated", || async {
        let live = env.world.live_instances().await;
        (!live
            .iter()
            .any(|i| i.instance_id() == Some(orphan_id.as_str())))
        .then_some(())
    })
    .await;
    assert_eq!(
        env.world.live_instances().await.len(),
        1,
        "the machine's instance stays"
    );

    // Deleting the deployment terminates the last instance.
    mds.delete("workers", &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "all machines and instances to go", || async {
        let ms = env.machine_list().await;
        let live = env.world.live_instances().await;
        (ms.is_empty() && live.is_empty()).then_some(())
    })
    .await;
    drop(controller);
    drop(player);
}

/// Crash trials of creation: how many (`MCM_AWS_CREATION_KILLS`, 3 unless set;
/// `cargo xtask chaos --aws-creation-kills 30` runs 30).
fn creation_kills() -> usize {
    std::env::var("MCM_AWS_CREATION_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// The machine controller is SIGKILLed right after a `RunInstances` reached EC2 and before
/// its answer came back (so before the providerID could be recorded), while EC2 still hides
/// the new instance from `DescribeInstances`. The restarted controller finds nothing by tags
/// and creates again: the same creation attempt, the same client token, the same instance.
/// The cloud is sampled all along: at no moment may a machine have two live instances, and
/// no machine may ever have had two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkills_after_run_instances_never_make_a_second_instance() {
    let m = lagging_moto();
    let env = Env::new_in(m, "aws-crash").await;
    let kills = creation_kills();
    let mut controller = env.spawn_controller();
    let mds: Api<MachineDeployment> = Api::namespaced(env.client.clone(), &env.ns);
    let md = MachineDeploymentBuilder::new("crash")
        .replicas(0)
        .class("aws")
        .match_label("pool", "crash")
        .rolling(1, 0)
        .build();
    mds.create(&PostParams::default(), &md).await.unwrap();

    // The sampler: how many live instances each machine has, every 50 ms.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (world, stop) = (env.world.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let (mut samples, mut doubled) = (0usize, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for (machine, n) in world.live_per_machine() {
                    if n > 1 {
                        doubled.push(format!("{machine}: {n} live instances"));
                    }
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            (samples, doubled)
        })
    };

    // One machine per trial, deleted again before the next one (machines without a Node
    // would otherwise reach the creation timeout and be replaced during a long run).
    let mut created = Vec::new();
    for trial in 1..=kills {
        let calls = m.stats().run_instances_calls;
        scale(&mds, 1).await;
        // EC2 launched the instance and holds its answer: kill now.
        eventually(WAIT, "RunInstances to reach EC2", || async {
            (m.stats().run_instances_calls > calls).then_some(())
        })
        .await;
        controller.process.kill();
        eprintln!("trial {trial}: SIGKILL after RunInstances reached EC2");
        controller = env.spawn_controller();
        let machine = eventually(WAIT, "the machine's providerID to be recorded", || async {
            let ms = env.machine_list().await;
            match ms.as_slice() {
                [m] if m.spec.provider_id.is_some() => Some(m.clone()),
                _ => None,
            }
        })
        .await;
        let live = env.world.live_instances().await;
        assert_eq!(
            machine
                .spec
                .provider_id
                .clone()
                .into_iter()
                .collect::<Vec<_>>(),
            provider_ids_of(&live),
            "trial {trial}: the recorded instance is the one live instance"
        );
        created.push(machine.metadata.name.clone().unwrap_or_default());
        scale(&mds, 0).await;
        eventually(WAIT, "the machine and its instance to go", || async {
            let ms = env.machine_list().await;
            let live = env.world.live_instances().await;
            (ms.is_empty() && live.is_empty()).then_some(())
        })
        .await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (samples, doubled) = sampler.await.unwrap();
    let launched = env.world.launched_per_machine();
    eprintln!(
        "{kills} kill(s), {samples} samples of the cloud, {} moment(s) with two instances for one machine, instances launched per machine: {:?}",
        doubled.len(),
        launched.values().collect::<Vec<_>>()
    );
    assert!(samples > 0);
    assert!(doubled.is_empty(), "{doubled:?}");
    created.sort();
    assert_eq!(
        launched.keys().cloned().collect::<Vec<_>>(),
        created,
        "instances only for the trials' machines"
    );
    assert!(launched.values().all(|n| *n == 1), "{launched:?}");

    mds.delete("crash", &DeleteParams::default()).await.unwrap();
    drop(controller);
}

async fn scale(mds: &Api<MachineDeployment>, replicas: i32) {
    mds.patch(
        "crash",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
    )
    .await
    .unwrap();
}
