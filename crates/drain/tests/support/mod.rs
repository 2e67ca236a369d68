//! Test support: a fake kubelet (and attach/detach controller) for the real control plane, and
//! fixtures. Shared by the integration tests and the benchmark.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, Volume,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use mcm_testenv::kit::{TestNamespace, try_eventually};
use serde_json::json;
use tokio::task::JoinHandle;

/// The CSI driver name of the test volumes.
pub const CSI_DRIVER: &str = "fake.csi.mcm-rs.io";
/// Pods with this annotation are left alone by the fake kubelet.
pub const MANUAL: &str = "fake-kubelet.mcm-rs.io/manual";

/// A client and a fresh namespace on the shared control plane (all components).
pub async fn setup(prefix: &str) -> anyhow::Result<(kube::Client, String)> {
    let t = TestNamespace::new(mcm_testenv::Components::ALL, prefix).await;
    Ok((t.client, t.ns))
}

/// How the fake kubelet behaves.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// Node labels (besides `kubernetes.io/hostname`).
    pub labels: Vec<(String, String)>,
    /// Delay before a new pod is reported Running/Ready.
    pub ready_delay: Duration,
    /// Delay between a pod's deletionTimestamp and its final deletion.
    pub termination_delay: Duration,
    /// Attach the volumes of running pods (VolumeAttachment + node.status.volumesAttached).
    pub attach_volumes: bool,
    /// Detach the volumes of a deleted pod after this delay (`None`: never, the test does).
    pub detach_delay: Option<Duration>,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            labels: Vec::new(),
            ready_delay: Duration::ZERO,
            termination_delay: Duration::ZERO,
            attach_volumes: false,
            detach_delay: None,
        }
    }
}

/// The options of the tests' kubelets: the node labelled with the test's namespace.
pub fn kubelet_options(ns: &str) -> KubeletOptions {
    KubeletOptions {
        labels: vec![("drain-test".into(), ns.into())],
        ..Default::default()
    }
}

/// A node `n-<ns>` whose fake kubelet attaches volumes, and on it the Ready pod `db` mounting
/// the new volume `data`: returns the node, its kubelet and the PersistentVolume.
pub async fn pod_with_volume(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<(String, FakeKubelet, String)> {
    let node = node_name("n", ns);
    let kubelet = FakeKubelet::start(
        client.clone(),
        &node,
        KubeletOptions {
            attach_volumes: true,
            ..kubelet_options(ns)
        },
    )
    .await?;
    let (claim, pv) = create_volume(client, ns, "data").await?;
    create_pod(client, ns, "db", &node, &[], Some(&claim)).await?;
    wait_ready(client, ns, 1).await?;
    Ok((node, kubelet, pv))
}

/// A fake kubelet: registers a Ready node, renews its Lease, marks pods bound to it
/// Running/Ready, completes their deletion, and attaches/detaches their volumes.
pub struct FakeKubelet {
    pub node: String,
    client: kube::Client,
    tasks: Vec<JoinHandle<()>>,
    node_status: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

impl FakeKubelet {
    /// Registers the node and starts the kubelet loops.
    pub async fn start(
        client: kube::Client,
        node: &str,
        options: KubeletOptions,
    ) -> anyhow::Result<Self> {
        register_node(&client, node, &options.labels).await?;
        let node_status = Arc::new(tokio::sync::Mutex::new(()));
        let mut kubelet = FakeKubelet {
            node: node.to_string(),
            client: client.clone(),
            tasks: Vec::new(),
            node_status: node_status.clone(),
        };
        kubelet
            .tasks
            .push(tokio::spawn(heartbeat(client.clone(), node.to_string())));
        kubelet.tasks.push(tokio::spawn(pod_loop(
            client,
            node.to_string(),
            options,
            node_status,
        )));
        Ok(kubelet)
    }

    /// Detaches a PersistentVolume from this node (VolumeAttachment deleted, removed from
    /// node.status.volumesAttached), as the attach/detach controller would.
    pub async fn detach(&self, pv: &str) -> anyhow::Result<()> {
        detach(&self.client, &self.node, pv, &self.node_status).await
    }
}

async fn register_node(
    client: &kube::Client,
    name: &str,
    labels: &[(String, String)],
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut all_labels = serde_json::Map::new();
    all_labels.insert("kubernetes.io/hostname".into(), json!(name));
    for (k, v) in labels {
        all_labels.insert(k.clone(), json!(v));
    }
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": all_labels },
        "spec": {},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("create node"),
    }
    let status = json!({
        "status": {
            "capacity": { "cpu": "64", "memory": "256Gi", "pods": "500" },
            "allocatable": { "cpu": "64", "memory": "256Gi", "pods": "500" },
            "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" }],
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "fake kubelet is ready",
                "lastHeartbeatTime": now(), "lastTransitionTime": now(),
            }],
        }
    });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("patch node status")?;
    Ok(())
}

async fn heartbeat(client: kube::Client, node: String) {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    loop {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": { "name": node },
            "spec": { "holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string() },
        });
        if let Err(e) = leases
            .patch(
                &node,
                &PatchParams::apply("fake-kubelet").force(),
                &Patch::Apply(&lease),
            )
            .await
        {
            tracing::warn!(error = %e, "lease renewal failed");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn pod_loop(
    client: kube::Client,
    node: String,
    options: KubeletOptions,
    node_status: Arc<tokio::sync::Mutex<()>>,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let started: Arc<Mutex<HashSet<String>>> = Arc::default();
    let deleting: Arc<Mutex<HashSet<String>>> = Arc::default();
    let stream = watcher(
        pods,
        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
    )
    .default_backoff()
    .applied_objects();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let Ok(pod) = event else { continue };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let manual = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MANUAL));
        if manual {
            continue;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            if deleting.lock().map(|mut d| d.insert(uid)).unwrap_or(false) {
                tokio::spawn(finish_deletion(
                    client.clone(),
                    node.clone(),
                    pod,
                    options.clone(),
                    node_status.clone(),
                ));
            }
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        if matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
            continue;
        }
        if started.lock().map(|mut s| s.insert(uid)).unwrap_or(false) {
            tokio::spawn(start_pod(
                client.clone(),
                node.clone(),
                pod,
                options.clone(),
                node_status.clone(),
            ));
        }
    }
}

async fn start_pod(
    client: kube::Client,
    node: String,
    pod: Pod,
    options: KubeletOptions,
    node_status: Arc<tokio::sync::Mutex<()>>,
) {
    tokio::time::sleep(options.ready_delay).await;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    if options.attach_volumes {
        for pv in pod_pvs(&client, &pod).await {
            if let Err(e) = attach(&client, &node, &pv, &node_status).await {
                tracing::warn!(error = %e, pv, "attach failed");
            }
        }
    }
    let containers: Vec<serde_json::Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": true, "started": true, "restartCount": 0,
                "state": { "running": { "startedAt": now() } },
            })
        })
        .collect();
    let conditions: Vec<serde_json::Value> =
        ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
            .iter()
            .map(|t| json!({ "type": t, "status": "True", "lastTransitionTime": now() }))
            .collect();
    let status = json!({
        "status": {
            "phase": "Running", "podIP": "10.0.0.1", "podIPs": [{ "ip": "10.0.0.1" }],
            "hostIP": "127.0.0.1", "startTime": now(),
            "conditions": conditions, "containerStatuses": containers,
        }
    });
    let api: Api<Pod> = Api::namespaced(client, &ns);
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        tracing::debug!(error = %e, pod = name, "status patch failed");
    }
}

async fn finish_deletion(
    client: kube::Client,
    node: String,
    pod: Pod,
    options: KubeletOptions,
    node_status: Arc<tokio::sync::Mutex<()>>,
) {
    tokio::time::sleep(options.termination_delay).await;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pvs = if options.detach_delay.is_some() {
        pod_pvs(&client, &pod).await
    } else {
        Vec::new()
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(&name, &params).await {
        tracing::debug!(error = %e, pod = name, "final delete failed");
    }
    if let Some(delay) = options.detach_delay {
        tokio::time::sleep(delay).await;
        for pv in pvs {
            if let Err(e) = detach(&client, &node, &pv, &node_status).await {
                tracing::warn!(error = %e, pv, "detach failed");
            }
        }
    }
}

/// The PersistentVolumes bound to the pod's claims.
async fn pod_pvs(client: &kube::Client, pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let mut out = Vec::new();
    let claims: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            v.persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.clone())
        })
        .collect();
    for claim in claims {
        if let Ok(pvc) = pvcs.get(&claim).await
            && let Some(pv) = pvc.spec.and_then(|s| s.volume_name)
        {
            out.push(pv);
        }
    }
    out
}

/// The `node.status.volumesAttached` name of a test volume.
pub fn attached_name(handle: &str) -> String {
    format!("kubernetes.io/csi/{CSI_DRIVER}^{handle}")
}

/// The volume handle of a test PersistentVolume.
pub fn handle_of(pv: &str) -> String {
    format!("handle-{pv}")
}

fn va_name(pv: &str, node: &str) -> String {
    format!("va-{pv}-{node}")
}

/// Creates an attached VolumeAttachment for `pv` on `node`.
pub async fn create_attachment(client: &kube::Client, node: &str, pv: &str) -> anyhow::Result<()> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let name = va_name(pv, node);
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "attacher": CSI_DRIVER, "nodeName": node, "source": { "persistentVolumeName": pv } },
    }))?;
    match vas.create(&PostParams::default(), &va).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("create VolumeAttachment"),
    }
    vas.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": { "attached": true } })),
    )
    .await
    .context("mark VolumeAttachment attached")?;
    Ok(())
}

async fn attach(
    client: &kube::Client,
    node: &str,
    pv: &str,
    node_status: &tokio::sync::Mutex<()>,
) -> anyhow::Result<()> {
    create_attachment(client, node, pv).await?;
    let name = attached_name(&handle_of(pv));
    update_attached(client, node, node_status, |list| {
        if !list.iter().any(|v| v["name"] == name.as_str()) {
            list.push(json!({ "name": name, "devicePath": "" }));
        }
    })
    .await
}

async fn detach(
    client: &kube::Client,
    node: &str,
    pv: &str,
    node_status: &tokio::sync::Mutex<()>,
) -> anyhow::Result<()> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    match vas
        .delete(&va_name(pv, node), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e).context("delete VolumeAttachment"),
    }
    let name = attached_name(&handle_of(pv));
    update_attached(client, node, node_status, |list| {
        list.retain(|v| v["name"] != name.as_str());
    })
    .await
}

/// Read-modify-write of node.status.volumesAttached, serialised per kubelet and guarded by
/// the resourceVersion.
async fn update_attached(
    client: &kube::Client,
    node: &str,
    lock: &tokio::sync::Mutex<()>,
    change: impl Fn(&mut Vec<serde_json::Value>),
) -> anyhow::Result<()> {
    let _guard = lock.lock().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..10 {
        let current = nodes.get(node).await.context("get node")?;
        let mut list: Vec<serde_json::Value> = current
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|v| json!({ "name": v.name, "devicePath": v.device_path }))
            .collect();
        change(&mut list);
        let patch = json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "status": { "volumesAttached": list },
        });
        match nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e).context("patch volumesAttached"),
        }
    }
    anyhow::bail!("too many conflicts updating volumesAttached of {node}")
}

/// Creates a PV (CSI, handle `handle-<pv>`) and a PVC bound to it; returns (claim, pv).
pub async fn create_volume(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let pv_name = format!("{ns}-{name}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": { "name": pv_name },
        "spec": {
            "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "csi": { "driver": CSI_DRIVER, "volumeHandle": handle_of(&pv_name) },
            "claimRef": { "namespace": ns, "name": name },
        },
    }))?;
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .context("create PV")?;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .context("create PVC")?;
    Ok((name.to_string(), pv_name))
}

/// A pod spec with one container, bound to `node`, optionally mounting `claim`.
pub fn pod_spec(node: Option<&str>, claim: Option<&str>) -> PodSpec {
    PodSpec {
        node_name: node.map(str::to_string),
        containers: vec![Container {
            name: "app".into(),
            image: Some("registry.invalid/app:1".into()),
            ..Default::default()
        }],
        termination_grace_period_seconds: Some(5),
        volumes: claim.map(|c| {
            vec![
                serde_json::from_value::<Volume>(json!({
                    "name": "data", "persistentVolumeClaim": { "claimName": c },
                }))
                .unwrap_or_default(),
            ]
        }),
        ..Default::default()
    }
}

/// Creates a bare pod bound to `node`.
pub async fn create_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
    claim: Option<&str>,
) -> anyhow::Result<Pod> {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some(ns.into());
    pod.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    pod.spec = Some(pod_spec(Some(node), claim));
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("create pod {name}"))
}

/// Waits until every pod of the namespace matching `labels` is Running and Ready.
pub async fn wait_ready(client: &kube::Client, ns: &str, count: usize) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    try_eventually(Duration::from_secs(60), "pods ready", || {
        let api = api.clone();
        async move {
            let pods = api.list(&Default::default()).await?;
            let ready = pods.items.iter().filter(|p| is_ready(p)).count();
            anyhow::Ok(ready >= count)
        }
    })
    .await?;
    Ok(())
}

/// Waits until `node.status.volumesAttached` lists the test volume of `pv`.
pub async fn await_attached(client: &kube::Client, node: &str, pv: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let attached = attached_name(&handle_of(pv));
    try_eventually(Duration::from_secs(10), "volume attached", || {
        let (nodes, attached) = (nodes.clone(), attached.clone());
        async move {
            let n = nodes.get(node).await?;
            anyhow::Ok(
                n.status
                    .and_then(|s| s.volumes_attached)
                    .is_some_and(|v| v.iter().any(|a| a.name == attached)),
            )
        }
    })
    .await?;
    Ok(())
}

/// Whether a pod has condition Ready=True.
pub fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A unique node name.
pub fn node_name(prefix: &str, ns: &str) -> String {
    format!("{prefix}-{ns}")
}

/// Drain options of the per-pass tests: a drain timeout no test reaches, evictions retried
/// every second.
pub fn pass_options() -> mcm_drain::Options {
    let mut o = mcm_drain::Options::new(Arc::new(mcm_driver::FakeDriver::new()));
    o.timeout = Duration::from_secs(600);
    o.eviction_retry_interval = Duration::from_secs(1);
    o.max_evict_retries = 30;
    o.pv_detach_timeout = Duration::from_secs(30);
    o
}
