//! `chart`: mcm-rs installed from its Helm chart, as a platform team installs it, on a real
//! node (containerd, runc and a kubelet; `mcm_testenv::node`) with the images that `cargo
//! xtask image` builds, imported without a registry.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use mcm_api::Machine;
use mcm_testenv::node::KubeletNode;
use serde_json::json;

use crate::crds::workspace_root;
use crate::e2e::ctx::{Ctx, RUN_LABEL, WAIT, is_running};
use crate::e2e::env::{Check, wait_for};
use crate::image;
use mcm_testenv::{Components, ControlPlane, Options};

/// The release's name.
const RELEASE: &str = "mcm";
/// Where the node finds the images (nothing is pulled: `pullPolicy: Never`).
const REGISTRY: &str = "mcm-rs.local";
/// The class and deployment of the scenario.
const CLASS: &str = "chart-class";
const MD: &str = "chart-pool";
/// The chart's default `leaderElection.leaseDuration`.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// The metric names `/metrics` must show (one of each controller family).
const METRICS: [&str; 3] = [
    "mcm_controller_reconcile_duration_seconds",
    "mcm_machine_controller_tracked_entries",
    "mcm_machine_items_total",
];

/// The images of the manager and the local provider, built as `cargo xtask image
/// --provider local --dev-build` builds them (what CI's image step builds); their archives.
fn build_images() -> Result<Vec<(PathBuf, String)>> {
    let out = workspace_root().join("target").join("images");
    image::run(&image::Args {
        provider: Some(image::Provider::Local),
        all: false,
        out: Some(out.clone()),
        fast_build: false,
        dev_build: true,
    })
    .context("building the images (cargo xtask image --provider local --dev-build)")?;
    let version = env!("CARGO_PKG_VERSION");
    Ok(["machine-controller-manager", "machine-controller-local"]
        .iter()
        .map(|name| {
            (
                out.join(format!("{name}.tar")),
                format!("{REGISTRY}/{name}:{version}"),
            )
        })
        .collect())
}

/// `helm <args>` against the scenario's control plane; its output, or an error with it.
fn helm(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let helm =
        mcm_testenv::binaries::helm_binary().context("helm (cargo xtask chart builds it)")?;
    let out = Command::new(&helm)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("mcm-e2e-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("mcm-e2e-helm/config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("mcm-e2e-helm/data"),
        )
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    ensure!(
        out.status.success(),
        "helm {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The values a cluster without a registry needs, and nothing else.
fn values(ns: &str) -> Vec<String> {
    [
        "provider=local".to_string(),
        format!("image.registry={REGISTRY}"),
        "image.pullPolicy=Never".to_string(),
        format!("namespace={ns}"),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

/// The release's running pod, once every container of it is Ready (through the chart's
/// probes), other than `not`.
async fn ready_pod(pods: &Api<Pod>, not: Option<&str>) -> Result<Pod> {
    wait_for("the controller pod Ready", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
            .await?;
        let ready = list.items.into_iter().find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && Some(p.name_any().as_str()) != not
                && p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready))
        });
        Ok(match ready {
            Some(p) => Check::Done(p),
            None => Check::Pending("no pod with every container Ready".into()),
        })
    })
    .await
}

/// The uid a process runs as, and whether its root file system is mounted read-only.
fn process_identity(pid: u32) -> Result<(u32, bool)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .context("no effective uid in the process status")?;
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let root_ro = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(4) == Some(&"/") && f.get(5).is_some_and(|o| o.split(',').any(|x| x == "ro"))
    });
    Ok((uid, root_ro))
}

/// Processes whose mount namespace is the container process `pid`'s, other than it.
fn processes_beside(pid: u32) -> Vec<String> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p != pid)
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/mnt")).is_ok_and(|l| l == ns))
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .collect()
}

/// The holder of each Lease of the namespace.
async fn lease_holder(leases: &Api<Lease>) -> Result<Vec<String>> {
    Ok(leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|l| {
            let name = l.name_any();
            let spec = l.spec.unwrap_or_default();
            format!(
                "{name}: {} (renewed {:?})",
                spec.holder_identity.unwrap_or_default(),
                spec.renew_time.map(|t| t.0.to_string())
            )
        })
        .collect())
}

/// The scenario's own cluster: a control plane that gives pods their ServiceAccount's
/// credentials (the suite's does not), and its namespace.
struct Cluster {
    cp: ControlPlane,
    client: kube::Client,
    ns: String,
}

impl Cluster {
    async fn machines(&self) -> Result<Vec<Machine>> {
        let api: Api<Machine> = Api::namespaced(self.client.clone(), &self.ns);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    async fn machine_uids(&self) -> Result<BTreeSet<String>> {
        Ok(self
            .machines()
            .await?
            .iter()
            .filter_map(|m| m.uid())
            .collect())
    }
}

pub async fn chart(ctx: &mut Ctx<'_>) -> Result<String> {
    let began = Instant::now();
    let images = tokio::task::spawn_blocking(build_images).await??;
    let built = began.elapsed();
    let cp = ControlPlane::start(Options {
        components: Components::ALL,
        service_account_admission: true,
        ..Options::default()
    })
    .await
    .context("starting the scenario's control plane")?;
    let client = cp.client().await?;
    let ns = cp.namespace("chart").await?;
    let cluster = Cluster { cp, client, ns };
    let node = KubeletNode::start(&cluster.cp, "chart-node")
        .await
        .context("starting the node")?;
    let result = on_the_node(&cluster, &node, &images).await;
    if result.is_err() {
        let _ = node.copy_logs(&ctx.dir.join("node"));
        let _ = crate::e2e::env::preserve_control_plane_logs(
            &cluster.cp,
            &ctx.dir.join("control-plane"),
        );
    }
    drop(node);
    result.map(|r| {
        format!(
            "{r}; images built in {:.0}s, total {:.0}s",
            built.as_secs_f64(),
            began.elapsed().as_secs_f64()
        )
    })
}

async fn on_the_node(
    ctx: &Cluster,
    node: &KubeletNode,
    images: &[(PathBuf, String)],
) -> Result<String> {
    for (archive, name) in images {
        node.import_image(archive, name)
            .with_context(|| format!("importing {}", archive.display()))?;
    }
    let kubeconfig = ctx.cp.kubeconfig_path().to_path_buf();
    let chart = workspace_root().join("deploy").join("chart");
    let chart = chart.to_string_lossy().into_owned();
    let ns = ctx.ns.clone();
    let set = values(&ns);
    let mut install = vec!["install", RELEASE, chart.as_str(), "-n", ns.as_str()];
    install.extend(set.iter().map(String::as_str));
    helm(&kubeconfig, &install)?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod = ready_pod(&pods, None).await?;

    // The chart's user and read-only root file system, on the running process.
    let status = pod.status.clone().unwrap_or_default();
    let container = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .next()
        .context("the pod has no container status")?;
    let id = container.container_id.clone().context("no container id")?;
    let pid = node.container_pid(&id).context("the container's process")?;
    let (uid, read_only) = process_identity(pid)?;
    ensure!(
        uid == 65532 && read_only,
        "the controller runs as uid {uid}, root file system read-only: {read_only}"
    );

    // The webhook, called by the API server through the chart's Service.
    let bad = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": { "name": "bad" },
        "provider": "local",
        "providerSpec": { "capacity": { "cpu": "lots" } },
        "secretRef": { "name": "chart-local", "namespace": ns },
    });
    let refused = crate::e2e::env::apply(&ctx.client, &ns, &bad).await;
    let message = match refused {
        Ok(_) => bail!("a class with capacity.cpu \"lots\" was admitted"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        message.contains("admission webhook") && message.contains("capacity.cpu"),
        "the refusal is not the webhook's naming the field: {message}"
    );

    // The machines: local-node VMs started inside the pod, registering as Nodes.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "chart-local" },
        "stringData": {
            "kubeconfig": node.pod_kubeconfig()?,
            "userData": "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\n",
        },
    }))?;
    secrets
        .patch(
            "chart-local",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    let class = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": { "name": CLASS },
        "provider": "local",
        "providerSpec": {
            "capacity": { "cpu": "2", "memory": "4Gi", "pods": "110" },
            "labels": { RUN_LABEL: ns },
            "heartbeatInterval": "2s",
            "stateDirectory": "/var/lib/mcm-local",
        },
        "secretRef": { "name": "chart-local", "namespace": ns },
    });
    crate::e2e::env::apply(&ctx.client, &ns, &class).await?;
    let md = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": { "name": MD },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "pool": MD } },
            "template": {
                "metadata": { "labels": { "pool": MD } },
                "spec": { "class": { "kind": "MachineClass", "name": CLASS } },
            },
        },
    });
    crate::e2e::env::apply(&ctx.client, &ns, &md).await?;
    wait_for("2 Running machines", WAIT, || async {
        let ms: Vec<Machine> = ctx.machines().await?;
        let running = ms.iter().filter(|m| is_running(m)).count();
        Ok(if running == 2 && ms.len() == 2 {
            Check::Done(())
        } else {
            Check::Pending(format!("{running} of {} Running", ms.len()))
        })
    })
    .await?;
    let vms: Vec<String> = processes_beside(pid)
        .into_iter()
        .filter(|c| c.contains("local-node"))
        .collect();
    ensure!(vms.len() == 2, "local-node processes in the pod: {vms:?}");
    let before = ctx.machine_uids().await?;

    // /metrics through the chart's Service (the API server's service proxy).
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(ctx.client.clone(), &ns);
    let svc = services
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
        .await?
        .items
        .into_iter()
        .map(|s| s.name_any())
        .find(|n| n.ends_with("-metrics"))
        .context("the chart's metrics Service")?;
    let path = format!("/api/v1/namespaces/{ns}/services/{svc}:metrics/proxy/metrics");
    let metrics = wait_for("/metrics through the Service", WAIT, || async {
        let req = http::Request::get(path.as_str()).body(Vec::new())?;
        Ok(match ctx.client.request_text(req).await {
            Ok(text) if METRICS.iter().all(|m| text.contains(m)) => Check::Done(text),
            Ok(text) => Check::Pending(format!("{} bytes without every metric", text.len())),
            Err(e) => Check::Pending(format!("{e}")),
        })
    })
    .await?;

    // The chart's RBAC is enough: no Forbidden in any container's log.
    let logs = node.container_logs(&ns);
    ensure!(
        !logs.is_empty() && logs.values().all(|l| l.lines().count() > 3),
        "the containers wrote (almost) no log: {logs:?}"
    );
    let forbidden: Vec<String> = logs
        .into_iter()
        .filter(|(_, log)| log.contains("Forbidden") || log.contains("forbidden"))
        .map(|(c, log)| {
            let line = log
                .lines()
                .find(|l| l.contains("orbidden"))
                .unwrap_or_default();
            format!("{c}: {line}")
        })
        .collect();
    ensure!(
        forbidden.is_empty(),
        "refused by the chart's RBAC: {forbidden:?}"
    );

    // A deleted pod: the new one takes the Lease within its duration. The local provider's VMs
    // are the pod's processes and go with it: the new pod's controller finds them gone and
    // replaces those machines (a cloud's VMs outlive the pod). The pool converges to 2
    // Running machines again, with their VMs in the new pod.
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
    let old = pod.name_any();
    ensure!(
        lease_holder(&leases)
            .await?
            .iter()
            .any(|h| h.contains(&old)),
        "the Lease is not held by {old}: {:?}",
        lease_holder(&leases).await?
    );
    let deleted = Instant::now();
    pods.delete(&old, &DeleteParams::default()).await?;
    let new = ready_pod(&pods, Some(&old)).await?;
    let new_name = new.name_any();
    // The old leader's shutdown (it finishes in-flight steps, then releases the Lease), then
    // the hand-over, counted from its end: within the lease duration.
    let shutdown = wait_for("the deleted pod to be gone", WAIT, || async {
        Ok(match pods.get_opt(&old).await? {
            None => Check::Done(deleted.elapsed()),
            Some(_) => Check::Pending(format!("{old} still terminating")),
        })
    })
    .await?;
    let gone = Instant::now();
    let handover = wait_for(
        "the new pod to hold the Lease",
        LEASE_DURATION * 2,
        || async {
            let holders = lease_holder(&leases).await?;
            Ok(if holders.iter().any(|h| h.contains(&new_name)) {
                Check::Done(gone.elapsed())
            } else {
                Check::Pending(format!("holders {holders:?}"))
            })
        },
    )
    .await?;
    ensure!(
        handover <= LEASE_DURATION,
        "the new pod took the Lease {handover:?} after the old one was gone"
    );
    let replaced_by_deletion = no_more_than_2(ctx, &before).await?;

    // helm upgrade with a changed value rolls the pod; the pool converges again.
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        chart.as_str(),
        "-n",
        ns.as_str(),
        "--reuse-values",
        "--set-string",
        "podAnnotations.e2e-rollout=2",
    ];
    upgrade.extend(set.iter().map(String::as_str));
    helm(&kubeconfig, &upgrade)?;
    let rolled = ready_pod(&pods, Some(&new_name)).await?;
    ensure!(
        rolled.annotations().get("e2e-rollout").map(String::as_str) == Some("2"),
        "the pod after the upgrade has not the changed value"
    );
    let before = ctx.machine_uids().await?;
    let replaced_by_upgrade = no_more_than_2(ctx, &before).await?;
    let before = ctx.machine_uids().await?;

    // helm uninstall: the CRDs and the machine objects stay (docs/operations.md).
    helm(
        &kubeconfig,
        &["uninstall", RELEASE, "-n", ns.as_str(), "--wait"],
    )?;
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    for crd in [
        "machines",
        "machinesets",
        "machinedeployments",
        "machineclasses",
    ] {
        crds.get(&format!("{crd}.machine.sapcloud.io"))
            .await
            .with_context(|| format!("the CRD {crd} after helm uninstall"))?;
    }
    ensure!(
        ctx.machine_uids().await? == before,
        "the machine objects changed with helm uninstall"
    );
    release_machines(ctx).await?;
    Ok(format!(
        "{} images imported; pod Ready as uid {uid} on a read-only root; webhook refused capacity.cpu; 2 machines Running with their VMs in the pod; {} metric lines through the Service; no Forbidden; the deleted pod gone in {:.1}s, its Lease taken {:.1}s after; after the pod's deletion and the upgrade no more than 2 machines ({replaced_by_deletion} and {replaced_by_upgrade} already replaced: the local VMs go with the pod); uninstall kept the CRDs and every machine object",
        images.len(),
        metrics.lines().count(),
        shutdown.as_secs_f64(),
        handover.as_secs_f64()
    ))
}

/// The pool has no more than 2 machines that are not being deleted (a replacement never adds
/// one); returns how many of them are not among `before` (replaced so far).
async fn no_more_than_2(ctx: &Cluster, before: &BTreeSet<String>) -> Result<usize> {
    let live: Vec<Machine> = ctx
        .machines()
        .await?
        .into_iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    ensure!(live.len() <= 2, "{} machines not being deleted", live.len());
    Ok(live
        .iter()
        .filter_map(|m| m.uid())
        .filter(|u| !before.contains(u))
        .count())
}

/// Takes the finalizers off what the uninstalled controllers leave (their VMs went with the
/// pod), so the namespace can go.
async fn release_machines(ctx: &Cluster) -> Result<()> {
    let release = json!({ "metadata": { "finalizers": null } });
    let pp = PatchParams::default();
    for m in ctx.machines().await? {
        let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        let _ = api.patch(&m.name_any(), &pp, &Patch::Merge(&release)).await;
    }
    for (kind, plural) in [
        ("MachineSet", "machinesets"),
        ("MachineDeployment", "machinedeployments"),
        ("MachineClass", "machineclasses"),
    ] {
        let gvk = kube::api::GroupVersionKind::gvk("machine.sapcloud.io", "v1alpha1", kind);
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &ctx.ns, &resource);
        for o in api.list(&ListParams::default()).await?.items {
            let _ = api.patch(&o.name_any(), &pp, &Patch::Merge(&release)).await;
        }
    }
    Ok(())
}
