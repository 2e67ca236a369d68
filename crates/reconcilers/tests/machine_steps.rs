//! The machine controller in process (`machine_controller::run`) with `mcm_driver::FakeDriver`
//! (wrapped in `FaultInjecting`) against the real API server, one test per lifecycle step.
//! No kubelet runs: a test that needs a Ready Node creates it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use mcm_api::constants::annotations::progress;
use mcm_api::constants::{finalizers, labels};
use mcm_api::{Machine, MachineClass, MachinePhase};
use mcm_driver::{
    Code, Driver, DriverError, FakeDriver, FaultInjecting, FaultSpec, IdempotencyKey, Operation,
};
use mcm_reconcilers::clock::ManualClock;
use mcm_reconcilers::machine_controller::{self, Handles, MachineControllerConfig};
use mcm_reconcilers::settings::{Defaults, SafetySettings, Settings};
use mcm_reconcilers::{MachineMetrics, ReconcileMetrics};
use mcm_testenv::Components;
use mcm_testenv::kit::{
    MachineBuilder, MachineClassBuilder, TestNamespace, await_gone, await_object, create,
    create_class_with_secret, create_ready_node, events_for, eventually, node_events_for, secret,
    within,
};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Bound of every wait here.
const WAIT: Duration = Duration::from_secs(60);
/// The class of these tests.
const CLASS: &str = "fake";

/// The fake cloud, with faults injected on request.
type Cloud = FaultInjecting<FakeDriver>;

/// One namespace with the class `fake` and its secret, and the machine controller running on
/// it until the world is dropped.
struct World {
    client: Client,
    ns: String,
    cloud: Arc<Cloud>,
    handles: Handles,
    cancel: CancellationToken,
    controller: Option<tokio::task::JoinHandle<()>>,
    /// The controller's metrics.
    registry: Registry,
    /// Held for the World's life (see [`ONE_WORLD_AT_A_TIME`]).
    _alone: tokio::sync::MutexGuard<'static, ()>,
}

/// One World at a time. Nodes are cluster-wide and every World's orphan collector (at its
/// start and after each deletion) releases the Node finalizer of Nodes whose machine its own
/// namespace does not have: a World running beside another would release the other's Nodes
/// (in production one namespace serves one target cluster).
static ONE_WORLD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl World {
    async fn start(prefix: &str) -> World {
        World::start_with(prefix, |_| {}, None).await
    }

    /// [`World::start`] with the settings `configure` changes, and the controller's time from
    /// `clock` when one is given.
    async fn start_with(
        prefix: &str,
        configure: impl FnOnce(&mut MachineControllerConfig),
        clock: Option<Arc<ManualClock>>,
    ) -> World {
        let alone = ONE_WORLD_AT_A_TIME.lock().await;
        let TestNamespace { client, ns, env } =
            TestNamespace::new(Components::API_SERVER, prefix).await;
        let evictions = env
            .client_without_retries()
            .await
            .expect("a client without retries");
        let class = MachineClassBuilder::new(CLASS)
            .provider("fake")
            .secret(&ns, "fake-secret")
            .build();
        let user_data = secret(
            "fake-secret",
            &[("userData", "#cloud-config\ntoken: <<BOOTSTRAP_TOKEN>>\n")],
        );
        create_class_with_secret(&client, &ns, &class, &user_data).await;

        let cloud = Arc::new(FaultInjecting::new(FakeDriver::new(), 7));
        let driver: Arc<dyn Driver> = cloud.clone();
        let mut registry = Registry::default();
        let reconciles = ReconcileMetrics::register(&mut registry);
        let metrics = MachineMetrics::register(&mut registry, reconciles);
        let cancel = CancellationToken::new();
        let mut handles = Handles::default();
        if let Some(clock) = clock {
            handles.clock = clock;
        }
        let mut config = config(&ns);
        configure(&mut config);
        let side = machine_controller::MachineSide {
            control: client.clone(),
            target: client.clone(),
            evictions,
            driver,
            config,
            metrics,
            handles: handles.clone(),
        };
        let controller = tokio::spawn(side.run(cancel.clone()));
        World {
            client,
            ns,
            cloud,
            handles,
            cancel,
            controller: Some(controller),
            registry,
            _alone: alone,
        }
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn fake(&self) -> &FakeDriver {
        self.cloud.inner()
    }

    /// The value of the unlabelled metric `name`.
    fn metric(&self, name: &str) -> Option<i64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("encode");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    async fn create_machine(&self, machine: Machine) {
        create(&self.machines(), &machine).await;
    }

    /// Changes an annotation of the machine nobody reads: its watch event wakes the
    /// controller at once (a test that stepped the clock does not wait for a requeue). A
    /// machine gone already needs no poke: a requeue got there first (a blocked drain comes
    /// back every eviction retry interval, and may finish the deletion before the poke).
    async fn poke(&self, name: &str) {
        let patch = serde_json::json!({ "metadata": { "annotations": {
            "test.mcm-rs.io/poke": jiff::Timestamp::now().to_string()
        }}});
        match self
            .machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("poke the machine: {e}"),
        }
    }

    /// Creates machine `name` and its Ready Node, and waits until it is Running.
    async fn running_machine(&self, name: &str) {
        self.create_machine(MachineBuilder::new(name).class(CLASS).build())
            .await;
        self.await_machine(name, "the VM to be recorded", |m| {
            m.spec.provider_id.is_some()
        })
        .await;
        create_ready_node(&self.client, name, &format!("fake:///{name}"), &[]).await;
        self.await_machine(name, "the machine to run", |m| {
            m.phase() == Some(&MachinePhase::Running)
        })
        .await;
    }

    /// Waits until the machine satisfies `pred`.
    async fn await_machine(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Machine) -> bool,
    ) -> Machine {
        await_object(self.machines(), name, WAIT, what, |m: Option<&Machine>| {
            m.is_some_and(&pred)
        })
        .await
        .expect("the machine exists")
    }

    /// Stops the controller and waits for it to return.
    async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(c) = self.controller.take() {
            within(WAIT, "the machine controller to stop", c)
                .await
                .expect("the controller task");
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Test settings: short timeouts and periods.
fn config(ns: &str) -> MachineControllerConfig {
    MachineControllerConfig {
        machine: Settings {
            namespace: ns.into(),
            defaults: Defaults {
                creation_timeout: Duration::from_secs(60),
                health_timeout: Duration::from_secs(60),
                drain_timeout: Duration::from_secs(30),
                max_evict_retries: 10,
                bad_conditions: vec![],
                preserve_timeout: Duration::from_secs(3600),
                inplace_timeout: Duration::from_secs(600),
                unhealthy_conditions: vec![],
                node_startup_timeout: None,
                hook_timeout: None,
                zone_partition: Default::default(),
            },
            pv_detach_timeout: Duration::from_secs(5),
            pv_reattach_timeout: Duration::from_secs(5),
            bootstrap_token_auth_extra_groups: String::new(),
            resource_exhausted_retry: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(2),
            eviction_retry_interval: Duration::from_secs(1),
            drain_parallelism: 4,
            resync: Duration::from_secs(5),
            target_cluster: true,
        },
        safety: SafetySettings {
            orphan_vms_period: Duration::from_secs(600),
            apiserver_statuscheck_period: Duration::from_secs(1),
            apiserver_statuscheck_timeout: Duration::from_secs(30),
        },
        concurrent_syncs: 4,
    }
}

fn node_label(m: &Machine) -> Option<&str> {
    m.labels().get(labels::NODE).map(String::as_str)
}

fn has_our_finalizer(m: &Machine) -> bool {
    m.finalizers()
        .iter()
        .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
}

/// A VM for the machine (its name, the class), and the Machine's providerID and `node`
/// label record it; once its Node is Ready the machine is Running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_records_the_vm_and_its_node_then_runs() {
    let w = World::start("steps-create").await;
    w.create_machine(MachineBuilder::new("m1").class(CLASS).build())
        .await;

    let m = w
        .await_machine("m1", "the VM and its node to be recorded", |m| {
            m.spec.provider_id.is_some() && node_label(m).is_some()
        })
        .await;
    assert_eq!(m.spec.provider_id.as_deref(), Some("fake:///m1"));
    assert_eq!(node_label(&m), Some("m1"));
    // The default deletion priority, as the Go machine controller records it.
    assert_eq!(
        m.annotations()
            .get(mcm_api::constants::annotations::MACHINE_PRIORITY)
            .map(String::as_str),
        Some("3")
    );
    assert!(has_our_finalizer(&m), "finalizer: {:?}", m.finalizers());
    let vms = w.fake().vms();
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(
        (vms[0].machine_name.as_str(), vms[0].class_name.as_str()),
        ("m1", CLASS)
    );
    assert_eq!(w.fake().call_count(Operation::CreateMachine), 1);
    assert_ne!(m.phase(), Some(&MachinePhase::Running), "no Node yet");
    // The driver's opaque state is kept in the status.
    w.await_machine("m1", "the driver's lastKnownState", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.last_known_state.as_deref())
            == Some("created fake:///m1")
    })
    .await;

    // The "kubelet" registers the Node: the machine runs.
    create_ready_node(&w.client, "m1", "fake:///m1", &[]).await;
    w.await_machine("m1", "the machine to run", |m| {
        m.phase() == Some(&MachinePhase::Running)
    })
    .await;
    eventually(WAIT, "a Running event", || async {
        !events_for(&w.client, &w.ns, "m1", "Running")
            .await
            .is_empty()
    })
    .await;
    // As the Go MCM, the Node is labelled with its machine's name.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(w.client.clone());
    await_object(
        nodes.clone(),
        "m1",
        WAIT,
        "the machine-name label",
        |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.is_some_and(|n| {
                n.labels()
                    .get(labels::NODE_MACHINE_NAME)
                    .map(String::as_str)
                    == Some("m1")
            })
        },
    )
    .await;
    let _ = nodes.delete("m1", &DeleteParams::default()).await;
    w.stop().await;
}

/// A create that fails after the cloud may have acted is retried as the same creation
/// attempt (the same idempotency key, from the Machine's UID and its `vm-requested` record).
/// The providerID is recorded before `initialize_machine` runs; a failed initialization is a
/// creation failure (CrashLoopBackOff with the error) and is finished later: the driver says
/// `Uninitialized`, the VM is initialized, and the machine moves on to Pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_creation_keeps_its_key_and_an_unfinished_one_is_initialized_later() {
    let w = World::start("steps-finish").await;
    w.fake().require_initialization();
    w.fake().fail_next(
        Operation::CreateMachine,
        DriverError::new(Code::Unavailable, "the answer was lost"),
    );
    w.fake().fail_next(
        Operation::InitializeMachine,
        DriverError::new(Code::Unavailable, "interfaces not attached yet"),
    );
    // Nodes are cluster-wide: a name no other test's Node has.
    w.create_machine(MachineBuilder::new("finish-m1").class(CLASS).build())
        .await;

    // The failures are announced (one Event series per reason: a repeated reason counts up
    // the first Event's series and keeps its note).
    eventually(WAIT, "a CreationFailed event", || async {
        !events_for(&w.client, &w.ns, "finish-m1", "CreationFailed")
            .await
            .is_empty()
    })
    .await;
    let m = w
        .await_machine("finish-m1", "the creation to be finished", |m| {
            m.phase() == Some(&MachinePhase::Pending)
        })
        .await;
    assert!(w.fake().vms()[0].initialized);
    // Both create calls were one attempt: one key, the one the Machine's record gives.
    let requested = m
        .annotations()
        .get(mcm_api::constants::annotations::progress::VM_REQUESTED)
        .expect("the vm-requested record")
        .clone();
    let expected = IdempotencyKey::for_creation(m.uid().as_deref().unwrap(), &requested);
    assert_eq!(
        w.fake().idempotency_keys(),
        vec![expected.clone(), expected]
    );
    // Every initialization ran with the providerID recorded.
    let inits: Vec<_> = w
        .fake()
        .provider_ids_seen()
        .into_iter()
        .filter(|(op, _)| *op == Operation::InitializeMachine)
        .collect();
    assert_eq!(
        inits,
        vec![
            (
                Operation::InitializeMachine,
                Some("fake:///finish-m1".to_string())
            ),
            (
                Operation::InitializeMachine,
                Some("fake:///finish-m1".to_string())
            ),
        ]
    );
    assert_eq!(w.fake().call_count(Operation::CreateMachine), 2);
    w.stop().await;
}

/// `InvalidArgument` from `create_machine` is on the Machine (`lastOperation` Failed with the
/// code and the driver's message) and in an Event; no VM exists. Once the driver accepts the
/// request the machine is created without further help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_argument_is_reported_in_the_status_and_an_event() {
    let w = World::start("steps-invalid").await;
    w.cloud.set(
        Operation::CreateMachine,
        FaultSpec::always(Code::InvalidArgument),
    );
    w.create_machine(MachineBuilder::new("bad").class(CLASS).build())
        .await;

    let m = w
        .await_machine("bad", "the InvalidArgument to be reported", |m| {
            m.status
                .as_ref()
                .and_then(|s| s.last_operation.as_ref())
                .is_some_and(|o| o.error_code.as_deref() == Some("InvalidArgument"))
        })
        .await;
    let op = m
        .status
        .and_then(|s| s.last_operation)
        .expect("lastOperation");
    assert_eq!(op.state.as_ref().map(|s| s.as_str()), Some("Failed"));
    let description = op.description.unwrap_or_default();
    assert!(description.contains("fault injected into"), "{description}");
    let notes = eventually(WAIT, "a CreationFailed event", || async {
        let notes = events_for(&w.client, &w.ns, "bad", "CreationFailed").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes.iter().any(|n| n.contains("fault injected into")),
        "{notes:?}"
    );
    assert!(w.fake().vms().is_empty(), "no VM for a rejected request");
    assert_eq!(
        w.fake().call_count(Operation::CreateMachine),
        0,
        "the fault is injected before the cloud"
    );

    w.cloud.clear(Operation::CreateMachine);
    w.await_machine("bad", "the VM to be created after the fix", |m| {
        m.spec.provider_id.as_deref() == Some("fake:///bad")
    })
    .await;
    assert_eq!(w.fake().vms().len(), 1);
    w.stop().await;
}

/// Out of capacity: the cluster-autoscaler reads a machine without a Node by its
/// `lastOperation` (`type: Create`, `state: Failed`, `errorCode: ResourceExhausted`) to back
/// off the node group; the description says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_exhausted_is_reported_as_the_autoscaler_reads_it() {
    let w = World::start("steps-exhausted").await;
    w.cloud.set(
        Operation::CreateMachine,
        FaultSpec::always(Code::ResourceExhausted),
    );
    w.create_machine(MachineBuilder::new("full").class(CLASS).build())
        .await;
    let m = w
        .await_machine("full", "the ResourceExhausted to be reported", |m| {
            m.status
                .as_ref()
                .and_then(|s| s.last_operation.as_ref())
                .is_some_and(|o| o.error_code.as_deref() == Some("ResourceExhausted"))
        })
        .await;
    let op = m
        .status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .expect("lastOperation");
    assert_eq!(op.type_.as_ref().map(|t| t.as_str()), Some("Create"));
    assert_eq!(op.state.as_ref().map(|s| s.as_str()), Some("Failed"));
    assert!(
        op.description
            .as_deref()
            .is_some_and(|d| d.contains("fault injected into")),
        "{op:?}"
    );
    assert_eq!(
        node_label(&m),
        None,
        "no node: the autoscaler looks at the operation"
    );
    w.stop().await;
}

/// Deleting a running machine deletes its VM, then the finalizer goes and the Machine with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_removes_the_vm_and_the_finalizer() {
    let w = World::start("steps-delete").await;
    w.create_machine(MachineBuilder::new("d1").class(CLASS).build())
        .await;
    w.await_machine("d1", "the VM to be recorded", |m| {
        m.spec.provider_id.is_some() && has_our_finalizer(m)
    })
    .await;
    create_ready_node(&w.client, "d1", "fake:///d1", &[]).await;
    w.await_machine("d1", "the machine to run", |m| {
        m.phase() == Some(&MachinePhase::Running)
    })
    .await;
    assert_eq!(w.fake().vms().len(), 1);

    w.machines()
        .delete("d1", &DeleteParams::default())
        .await
        .expect("delete");
    await_gone(w.machines(), "d1", WAIT).await;
    assert!(w.fake().vms().is_empty(), "VM left: {:?}", w.fake().vms());
    assert!(w.fake().call_count(Operation::DeleteMachine) >= 1);
    // The state create returned came back to the driver with the deletion.
    let seen = w.fake().states_seen();
    assert!(
        seen.iter()
            .any(|(op, state)| *op == Operation::DeleteMachine
                && state.as_deref() == Some("created fake:///d1")),
        "{seen:?}"
    );
    w.stop().await;
}

/// The deletion of a machine whose node has nothing to move: the cordon and the Node
/// finalizer's release are one write, the drain is not recorded (the VM's deletion follows in
/// the same reconcile), and the node gets no `DrainStarted` Event. Seen with the VM's deletion
/// failing once, which leaves the machine between the drain and the VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_node_is_cordoned_and_released_at_once_and_its_drain_not_recorded() {
    let w = World::start("steps-emptydrain").await;
    w.create_machine(MachineBuilder::new("e1").class(CLASS).build())
        .await;
    w.await_machine("e1", "the VM to be recorded", |m| {
        m.spec.provider_id.is_some()
    })
    .await;
    create_ready_node(&w.client, "e1", "fake:///e1", &[]).await;
    w.await_machine("e1", "the machine to run", |m| {
        m.phase() == Some(&MachinePhase::Running)
    })
    .await;
    let nodes: Api<Node> = Api::all(w.client.clone());
    await_object(
        nodes.clone(),
        "e1",
        WAIT,
        "the node finalizer",
        |n: Option<&Node>| n.is_some_and(holds_node_finalizer),
    )
    .await;
    // The VM's deletion fails until the test has looked at the machine between the drain
    // and the VM.
    w.cloud.set(
        Operation::DeleteMachine,
        FaultSpec::always(Code::Unavailable),
    );
    w.machines()
        .delete("e1", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(WAIT, "the VM's deletion to be tried", || async {
        (w.cloud.injected(Operation::DeleteMachine) >= 1).then_some(())
    })
    .await;
    let m = w
        .machines()
        .get("e1")
        .await
        .expect("the machine is still there");
    let node = nodes.get("e1").await.expect("the node is still there");
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "cordoned"
    );
    assert!(!holds_node_finalizer(&node), "released with the cordon");
    for key in [progress::DRAIN_STARTED, progress::DRAINED] {
        assert!(!m.annotations().contains_key(key), "{key} recorded");
    }
    assert!(
        node_events_for(&w.client, "e1", "DrainStarted")
            .await
            .is_empty(),
        "nothing was drained, yet the node got DrainStarted"
    );
    w.cloud.clear(Operation::DeleteMachine);
    await_gone(w.machines(), "e1", WAIT).await;
    await_gone(nodes, "e1", WAIT).await;
    assert!(w.fake().vms().is_empty(), "VM left: {:?}", w.fake().vms());
    w.stop().await;
}

/// The VM of a running machine is deleted, and the controller crashes before the Node and
/// the finalizer go (one step, nothing recorded in between): the deletion asks the driver
/// again, takes its NotFound as done, and deletes the Node and the Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_deleted_before_a_crash_is_not_found_and_the_deletion_finishes() {
    let w = World::start("steps-vm-gone").await;
    w.create_machine(MachineBuilder::new("vg1").class(CLASS).build())
        .await;
    w.await_machine("vg1", "the VM to be recorded", |m| {
        m.spec.provider_id.is_some() && has_our_finalizer(m)
    })
    .await;
    create_ready_node(&w.client, "vg1", "fake:///vg1", &[]).await;
    w.await_machine("vg1", "the machine to run", |m| {
        m.phase() == Some(&MachinePhase::Running)
    })
    .await;
    assert!(w.fake().remove_vm("vg1"));
    w.machines()
        .delete("vg1", &DeleteParams::default())
        .await
        .expect("delete");
    await_gone(w.machines(), "vg1", WAIT).await;
    let nodes: Api<Node> = Api::all(w.client.clone());
    await_gone(nodes, "vg1", WAIT).await;
    assert!(w.fake().vms().is_empty(), "VM left: {:?}", w.fake().vms());
    w.stop().await;
}

/// Swapped in for the Go MCM (or for an earlier mcm-rs): a Machine holding the Go MCM's
/// finalizer is finished by us, one holding the earlier `machine-controller` name gets the Go
/// name instead (so the Go MCM can finish it after a swap back) and is finished with both
/// gone; the class carries the Go name, its Secret the Go machine controller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_of_a_go_fleet_or_an_earlier_release_are_finished() {
    let w = World::start("steps-swap").await;
    let held_with = |name: &str, finalizer: &str| {
        let mut m = MachineBuilder::new(name).class(CLASS).build();
        m.metadata.finalizers = Some(vec![finalizer.to_owned()]);
        m
    };
    w.create_machine(held_with("go1", finalizers::MACHINE_CONTROLLER_MANAGER))
        .await;
    w.create_machine(held_with("old1", finalizers::MACHINE_CONTROLLER))
        .await;
    for name in ["go1", "old1"] {
        let m = w
            .await_machine(name, "the VM and the Go finalizer alone", |m| {
                m.spec.provider_id.is_some()
                    && m.finalizers() == [finalizers::MACHINE_CONTROLLER_MANAGER]
            })
            .await;
        let provider_id = m.spec.provider_id.clone().unwrap_or_default();
        create_ready_node(&w.client, name, &provider_id, &[]).await;
        w.await_machine(name, "the machine to run", |m| {
            m.phase() == Some(&MachinePhase::Running)
        })
        .await;
    }
    let classes: Api<MachineClass> = Api::namespaced(w.client.clone(), &w.ns);
    await_object(
        classes,
        CLASS,
        WAIT,
        "the class's Go finalizer",
        |c: Option<&MachineClass>| {
            c.is_some_and(|c| c.finalizers() == [finalizers::MACHINE_CONTROLLER_MANAGER])
        },
    )
    .await;
    for name in ["go1", "old1"] {
        w.machines()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        await_gone(w.machines(), name, WAIT).await;
    }
    assert!(w.fake().vms().is_empty(), "VM left: {:?}", w.fake().vms());
    w.stop().await;
}

/// A finalizer of someone else's.
const FOREIGN: &str = "example.com/keep";

fn holds_node_finalizer(n: &Node) -> bool {
    n.finalizers().iter().any(|f| f == finalizers::NODE)
}

/// As the Go MCM since 0.61: the Node of a running machine carries the Node finalizer and the
/// `node.gardener.cloud/machine-name` label; `kubectl delete node` deletes the machine, whose
/// deletion drains the Node (which the finalizer keeps until then: its Terminating condition
/// is set) and deletes the VM, and only then the Node object goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_node_deletes_its_machine_with_a_drain_first() {
    let w = World::start("steps-nodedel").await;
    w.create_machine(MachineBuilder::new("nd1").class(CLASS).build())
        .await;
    w.await_machine("nd1", "the VM to be recorded", |m| {
        m.spec.provider_id.is_some()
    })
    .await;
    create_ready_node(&w.client, "nd1", "fake:///nd1", &[]).await;
    w.await_machine("nd1", "the machine to run", |m| {
        m.phase() == Some(&MachinePhase::Running)
    })
    .await;
    let nodes: Api<Node> = Api::all(w.client.clone());
    await_object(
        nodes.clone(),
        "nd1",
        WAIT,
        "the node finalizer and the machine-name label",
        |n: Option<&Node>| {
            n.is_some_and(|n| {
                holds_node_finalizer(n)
                    && n.labels()
                        .get(labels::NODE_MACHINE_NAME)
                        .map(String::as_str)
                        == Some("nd1")
            })
        },
    )
    .await;

    nodes
        .delete("nd1", &DeleteParams::default())
        .await
        .expect("delete the node");
    // The Node stays while the machine's deletion drains it.
    let node = await_object(
        nodes.clone(),
        "nd1",
        WAIT,
        "the drain to mark the node Terminating",
        |n: Option<&Node>| {
            n.is_some_and(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.type_ == "Terminating" && c.status == "True")
                    })
            })
        },
    )
    .await
    .expect("the node exists while its machine drains it");
    assert!(node.metadata.deletion_timestamp.is_some());
    await_gone(w.machines(), "nd1", WAIT).await;
    await_gone(nodes, "nd1", WAIT).await;
    assert!(w.fake().vms().is_empty(), "VM left: {:?}", w.fake().vms());
    assert!(
        !events_for(&w.client, &w.ns, "nd1", "NodeDeleted")
            .await
            .is_empty(),
        "a NodeDeleted Event on the machine"
    );
    w.stop().await;
}

/// A Node left holding the Node finalizer by a machine that is gone (its finalizer removed
/// by hand) is released, so that deleting it completes once another holder lets go too (the
/// release removes our name only); a machine's deletion releases its Node's finalizer before
/// it deletes the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_no_machine_claims_is_released_from_the_node_finalizer() {
    let w = World::start("steps-nodefree").await;
    let nodes: Api<Node> = Api::all(w.client.clone());
    create_ready_node(
        &w.client,
        "stray",
        "fake:///stray",
        &[(labels::NODE_MACHINE_NAME, "gone-machine")],
    )
    .await;
    nodes
        .patch(
            "stray",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": { "finalizers": [finalizers::NODE, FOREIGN] }
            })),
        )
        .await
        .expect("hold the node");
    nodes
        .delete("stray", &DeleteParams::default())
        .await
        .expect("delete the node");
    // A collection pass releases it (asked for again until the store has seen the deletion);
    // the other holder's finalizer stays.
    eventually(WAIT, "the stray node to be released by us", || async {
        w.handles.orphan_trigger.notify_one();
        nodes
            .get_opt("stray")
            .await
            .map(|n| n.is_some_and(|n| n.finalizers() == [FOREIGN.to_string()]))
    })
    .await;
    nodes
        .patch(
            "stray",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("the other holder lets go");
    await_gone(nodes, "stray", WAIT).await;
    w.stop().await;
}

/// A Machine whose class does not exist never requested a VM: it gets the finalizer and a
/// class problem, and its deletion completes without the class and without the driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_never_requested_a_vm_is_deleted_without_its_class() {
    let w = World::start("steps-noclass").await;
    w.create_machine(MachineBuilder::new("orphan").class("absent").build())
        .await;
    let m = w
        .await_machine("orphan", "the finalizer and the class problem", |m| {
            has_our_finalizer(m)
                && m.status
                    .as_ref()
                    .and_then(|s| s.last_operation.as_ref())
                    .and_then(|o| o.description.as_deref())
                    .is_some_and(|d| d.contains("absent"))
        })
        .await;
    assert!(m.spec.provider_id.is_none());

    w.machines()
        .delete("orphan", &DeleteParams::default())
        .await
        .expect("delete");
    await_gone(w.machines(), "orphan", WAIT).await;
    assert_eq!(w.fake().call_count(Operation::CreateMachine), 0);
    assert_eq!(w.fake().call_count(Operation::DeleteMachine), 0);
    assert!(w.fake().vms().is_empty());
    w.stop().await;
}

/// What the controller keeps per machine between reconciles (its backoff after failed
/// attempts, its own last write, announcements) is forgotten once the Machine is deleted,
/// also when it is taken away by hand (its finalizer removed): kept, it would grow with the
/// machines that ever failed until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_kept_for_a_machine_is_forgotten_when_it_is_deleted() {
    const TRACKED: &str = "mcm_machine_controller_tracked_entries";
    let w = World::start("steps-forget").await;
    w.cloud.set(
        Operation::CreateMachine,
        FaultSpec::always(Code::Unavailable),
    );
    w.create_machine(MachineBuilder::new("failing").class(CLASS).build())
        .await;
    w.await_machine("failing", "the failed creation to be reported", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.last_operation.as_ref())
            .is_some_and(|o| o.error_code.as_deref() == Some("Unavailable"))
    })
    .await;
    eventually(WAIT, "a backoff on record", || async {
        w.metric(TRACKED).is_some_and(|n| n > 0)
    })
    .await;

    // Taken away by hand: deleted, and its finalizer removed at once.
    w.machines()
        .delete("failing", &DeleteParams::default())
        .await
        .expect("delete");
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    let _ = w
        .machines()
        .patch(
            "failing",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await;
    await_gone(w.machines(), "failing", WAIT).await;
    eventually(WAIT, "nothing kept for the deleted machine", || async {
        w.metric(TRACKED) == Some(0)
    })
    .await;
    w.stop().await;
}

/// A failure that says when to try again (a cloud's throttling, an endpoint that cannot be
/// reached) is not tried again before then, although its own status write wakes the machine
/// at once: retried on that wake, a failing cloud made every machine write its status about
/// once a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_with_a_retry_time_is_not_retried_before_it() {
    const AFTER: Duration = Duration::from_secs(4);
    let w = World::start("steps-retry-after").await;
    w.fake().fail_next(
        Operation::CreateMachine,
        DriverError::new(Code::Unavailable, "the endpoint cannot be reached")
            .with_retry_after(AFTER),
    );
    w.create_machine(MachineBuilder::new("waits").class(CLASS).build())
        .await;
    w.await_machine("waits", "the failed creation to be reported", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.last_operation.as_ref())
            .is_some_and(|o| o.error_code.as_deref() == Some("Unavailable"))
    })
    .await;
    let reported = std::time::Instant::now();
    assert_eq!(w.fake().call_count(Operation::CreateMachine), 1);
    eventually(WAIT, "the second creation attempt", || async {
        (w.fake().call_count(Operation::CreateMachine) >= 2).then_some(())
    })
    .await;
    let waited = reported.elapsed();
    // The attempt came at the time the failure named (less the moments between the failure
    // and its report), not on the status write's wake.
    assert!(
        waited >= AFTER - Duration::from_secs(1),
        "retried after {waited:?}, the failure asked for {AFTER:?}"
    );
    w.await_machine("waits", "the machine's VM", |m| {
        m.spec.provider_id.is_some()
    })
    .await;
    w.stop().await;
}

/// A VM the driver cannot delete (an unreachable cloud) keeps the machine with its finalizer
/// and says why: `lastOperation` is `Delete`/`Failed` with the error and its code, and a
/// `DeletionFailed` Event; the retry deletes it. It was only a log line before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_that_cannot_be_deleted_is_reported_and_retried() {
    let w = World::start("steps-delete-fails").await;
    w.create_machine(MachineBuilder::new("stuck").class(CLASS).build())
        .await;
    w.await_machine("stuck", "its VM", |m| m.spec.provider_id.is_some())
        .await;
    w.fake().fail_next(
        Operation::DeleteMachine,
        DriverError::new(Code::Unavailable, "the endpoint cannot be reached")
            .with_retry_after(Duration::from_secs(2)),
    );
    w.machines()
        .delete("stuck", &DeleteParams::default())
        .await
        .expect("delete");
    let m = w
        .await_machine("stuck", "the failed deletion to be reported", |m| {
            m.status
                .as_ref()
                .and_then(|s| s.last_operation.as_ref())
                .is_some_and(|o| o.error_code.as_deref() == Some("Unavailable"))
        })
        .await;
    let op = m.status.unwrap().last_operation.unwrap();
    assert_eq!(
        op.type_.as_ref().map(|t| format!("{t:?}")).as_deref(),
        Some("Delete")
    );
    assert!(
        op.description
            .as_deref()
            .is_some_and(|d| d.contains("the endpoint cannot be reached")
                && d.contains("keeps its finalizer")),
        "{op:?}"
    );
    eventually(WAIT, "a DeletionFailed event", || async {
        (!events_for(&w.client, &w.ns, "stuck", "DeletionFailed")
            .await
            .is_empty())
        .then_some(())
    })
    .await;
    await_gone(w.machines(), "stuck", WAIT).await;
    assert_eq!(w.fake().call_count(Operation::DeleteMachine), 2);
    assert!(w.fake().vms().is_empty());
    w.stop().await;
}

// Timeouts, stepped by a ManualClock: each runs out in a step of the clock, not in real
// time (the timeouts are set to [`LONG`] and more, far beyond any wait of these tests).

/// A timeout no test waits for in real time.
const LONG: Duration = Duration::from_secs(3600);

/// The test settings with the creation, health and drain timeouts at [`LONG`].
fn long_timeouts(c: &mut MachineControllerConfig) {
    c.machine.defaults.creation_timeout = LONG;
    c.machine.defaults.health_timeout = LONG;
    c.machine.defaults.drain_timeout = LONG;
}

/// The last operation's description.
fn last_description(m: &Machine) -> String {
    m.status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|o| o.description.clone())
        .unwrap_or_default()
}

/// A VM whose Node never joins: Pending until the creation timeout has passed on the clock,
/// then Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creation_timeout_runs_on_the_clock() {
    let clock = Arc::new(ManualClock::starting_now());
    let w = World::start_with("clock-create", long_timeouts, Some(clock.clone())).await;
    w.create_machine(MachineBuilder::new("ct1").class(CLASS).build())
        .await;
    w.await_machine("ct1", "Pending", |m| {
        m.phase() == Some(&MachinePhase::Pending)
    })
    .await;
    // Just before the timeout: still Pending.
    clock.advance(LONG - Duration::from_secs(10));
    w.poke("ct1").await;
    let m = w
        .await_machine("ct1", "the poke seen", |m| {
            m.annotations().contains_key("test.mcm-rs.io/poke")
        })
        .await;
    assert_eq!(m.phase(), Some(&MachinePhase::Pending));
    clock.advance(Duration::from_secs(11));
    w.poke("ct1").await;
    let m = w
        .await_machine("ct1", "Failed after the creation timeout", |m| {
            m.phase() == Some(&MachinePhase::Failed)
        })
        .await;
    let d = last_description(&m);
    assert!(d.contains("failed"), "{d}");
    w.stop().await;
}

/// A Running machine whose Node stops being Ready: Unknown, and Failed once the health
/// timeout has passed on the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_timeout_runs_on_the_clock() {
    let clock = Arc::new(ManualClock::starting_now());
    let w = World::start_with("clock-health", long_timeouts, Some(clock.clone())).await;
    w.running_machine("ht1").await;
    let nodes: Api<Node> = Api::all(w.client.clone());
    let not_ready = serde_json::json!({ "status": { "conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady",
        "message": "stopped by the test",
        "lastHeartbeatTime": clock_now(&clock), "lastTransitionTime": clock_now(&clock),
    }]}});
    nodes
        .patch_status(
            "ht1",
            &PatchParams::default(),
            &Patch::Strategic(&not_ready),
        )
        .await
        .expect("Node NotReady");
    w.await_machine("ht1", "Unknown", |m| {
        m.phase() == Some(&MachinePhase::Unknown)
    })
    .await;
    clock.advance(LONG + Duration::from_secs(1));
    w.poke("ht1").await;
    let m = w
        .await_machine("ht1", "Failed after the health timeout", |m| {
            m.phase() == Some(&MachinePhase::Failed)
        })
        .await;
    assert!(last_description(&m).contains("failed"), "{m:?}");
    let _ = nodes.delete("ht1", &DeleteParams::default()).await;
    w.stop().await;
}

/// The wall time of `clock`, as the API writes it.
fn clock_now(clock: &ManualClock) -> String {
    mcm_reconcilers::clock::Clock::now(clock).to_string()
}

/// A machine preserved `now` keeps its preservation until the preserve timeout has passed on
/// the clock; then the preservation stops and its annotation goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preservation_expires_on_the_clock() {
    let clock = Arc::new(ManualClock::starting_now());
    let w = World::start_with("clock-preserve", |_| {}, Some(clock.clone())).await;
    w.running_machine("pe1").await;
    let preserve = serde_json::json!({ "metadata": { "annotations": {
        mcm_api::constants::annotations::PRESERVE: "now"
    }}});
    w.machines()
        .patch("pe1", &PatchParams::default(), &Patch::Merge(&preserve))
        .await
        .expect("preserve the machine");
    let expiry = |m: &Machine| {
        m.status
            .as_ref()
            .and_then(|s| s.current_status.as_ref())
            .and_then(|c| c.preserve_expiry_time.clone())
    };
    let m = w
        .await_machine("pe1", "the preserve expiry", |m| expiry(m).is_some())
        .await;
    // The expiry is the clock's now plus the preserve timeout (an hour).
    let until = expiry(&m).expect("expiry").0;
    let want = mcm_reconcilers::clock::Clock::now(&*clock) + jiff::SignedDuration::from_secs(3600);
    assert_eq!(until.as_second(), want.as_second());
    clock.advance(Duration::from_secs(3601));
    w.poke("pe1").await;
    w.await_machine("pe1", "the preservation to stop", |m| {
        expiry(m).is_none()
            && !m
                .annotations()
                .contains_key(mcm_api::constants::annotations::PRESERVE)
    })
    .await;
    let nodes: Api<Node> = Api::all(w.client.clone());
    let _ = nodes.delete("pe1", &DeleteParams::default()).await;
    w.stop().await;
}

/// A deletion whose drain a PodDisruptionBudget blocks waits while the drain timeout runs on
/// the clock; past it, the pod is deleted and the deletion finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_timeout_runs_on_the_clock() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let clock = Arc::new(ManualClock::starting_now());
    // Evictions are retried for longer than the drain timeout: only the timeout ends them.
    let w = World::start_with(
        "clock-drain",
        |c| {
            long_timeouts(c);
            c.machine.defaults.max_evict_retries = 100_000;
        },
        Some(clock.clone()),
    )
    .await;
    w.running_machine("dt1").await;
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &w.ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "guarded", "labels": { "app": "guarded" } },
        "spec": { "nodeName": "dt1", "containers": [{ "name": "c", "image": "pause" }] },
    }))
    .unwrap();
    create(&pods, &pod).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(w.client.clone(), &w.ns);
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "guarded" },
        "spec": { "maxUnavailable": 0, "selector": { "matchLabels": { "app": "guarded" } } },
    }))
    .unwrap();
    create(&pdbs, &pdb).await;
    w.machines()
        .delete("dt1", &DeleteParams::default())
        .await
        .expect("delete the machine");
    let m = w
        .await_machine("dt1", "the drain blocked by the budget", |m| {
            last_description(m).contains("Drain of node dt1")
        })
        .await;
    assert_eq!(m.phase(), Some(&MachinePhase::Terminating));
    assert!(pods.get_opt("guarded").await.expect("read").is_some());
    // Past the drain timeout: the pod is deleted, the deletion finishes.
    clock.advance(LONG + Duration::from_secs(1));
    w.poke("dt1").await;
    await_gone(w.machines(), "dt1", WAIT).await;
    assert!(pods.get_opt("guarded").await.expect("read").is_none());
    assert!(w.fake().vms().is_empty(), "VM left: {:?}", w.fake().vms());
    w.stop().await;
}
