//! `chart`: mcm-rs installed from its Helm chart, as a platform team installs it, on a real
//! node (containerd, runc and a kubelet; `mcm_testenv::node`) with the images that `cargo
//! xtask image` builds, imported without a registry: first with the local provider (its VMs
//! run in the pod), then with the AWS provider against moto over TLS ([`aws`]); the API
//! server's audit log of both releases' ServiceAccounts is compared with the chart's RBAC
//! ([`rbac`]).

mod aws;
mod rbac;

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

/// The local provider's release.
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

/// The images of the manager, the local and the AWS provider, built as `cargo xtask image
/// --provider local --provider aws --dev-build` builds them (what CI builds before the
/// tests); their archives.
fn build_images() -> Result<Vec<(PathBuf, String)>> {
    let out = workspace_root().join("target").join("images");
    image::run(&image::Args {
        provider: vec![image::Provider::Local, image::Provider::Aws],
        all: false,
        out: Some(out.clone()),
        fast_build: false,
        dev_build: true,
    })
    .context(
        "building the images (cargo xtask image --provider local --provider aws --dev-build)",
    )?;
    let version = env!("CARGO_PKG_VERSION");
    Ok([
        "machine-controller-manager",
        "machine-controller-local",
        "machine-controller-aws",
    ]
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

/// A release of the chart: its name, namespace (release and machine namespace) and values.
struct Release {
    name: &'static str,
    ns: String,
    /// `--set`/`-f` arguments.
    values: Vec<String>,
}

impl Release {
    /// A release of `provider` in `ns` with the values a cluster without a registry needs,
    /// the pods pinned to `node`, and `more` (`--set`/`-f` arguments).
    ///
    /// The pin: this cluster is also the machines' target cluster, and their Nodes (played
    /// by `local-node`) look Ready to the scheduler without running anything, so a pod
    /// scheduled there would never start. In a real installation the controllers run in the
    /// control cluster, apart from the Nodes they make.
    fn new(
        name: &'static str,
        provider: &str,
        ns: &str,
        node: &KubeletNode,
        more: &[String],
    ) -> Release {
        let pin = json!({ "kubernetes.io/hostname": node.name() });
        let values = [
            format!("provider={provider}"),
            format!("image.registry={REGISTRY}"),
            "image.pullPolicy=Never".to_string(),
            format!("namespace={ns}"),
        ]
        .into_iter()
        .flat_map(|v| ["--set".to_string(), v])
        .chain(["--set-json".to_string(), format!("nodeSelector={pin}")])
        .chain(more.iter().cloned())
        .collect();
        Release {
            name,
            ns: ns.to_string(),
            values,
        }
    }

    fn selector(&self) -> String {
        format!("app.kubernetes.io/instance={}", self.name)
    }

    /// `helm <verb> <release> <chart> -n <ns> <values> <extra>`.
    fn helm(&self, cluster: &Cluster, verb: &str, extra: &[&str]) -> Result<String> {
        let chart = workspace_root().join("deploy").join("chart");
        let chart = chart.to_string_lossy().into_owned();
        let mut args = vec![verb, self.name, chart.as_str(), "-n", self.ns.as_str()];
        args.extend(self.values.iter().map(String::as_str));
        args.extend(extra);
        helm(cluster.cp.kubeconfig_path(), &args)
    }
}

/// The release's running pod, once every container of it is Ready (through the chart's
/// probes), other than `not`.
async fn ready_pod(pods: &Api<Pod>, release: &Release, not: Option<&str>) -> Result<Pod> {
    wait_for("the controller pod Ready", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels(&release.selector()))
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
/// credentials (the suite's does not) and audits every request (for [`rbac`]).
struct Cluster {
    cp: ControlPlane,
    client: kube::Client,
}

impl Cluster {
    async fn machines(&self, ns: &str) -> Result<Vec<Machine>> {
        let api: Api<Machine> = Api::namespaced(self.client.clone(), ns);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    async fn machine_uids(&self, ns: &str) -> Result<BTreeSet<String>> {
        Ok(self
            .machines(ns)
            .await?
            .iter()
            .filter_map(|m| m.uid())
            .collect())
    }

    /// Waits for `n` machines in `ns`, every one Running.
    async fn running(&self, ns: &str, n: usize) -> Result<Vec<Machine>> {
        wait_for(&format!("{n} Running machines"), WAIT, || async {
            let ms: Vec<Machine> = self.machines(ns).await?;
            let running = ms.iter().filter(|m| is_running(m)).count();
            Ok(if running == n && ms.len() == n {
                Check::Done(ms)
            } else {
                Check::Pending(format!("{running} of {} Running", ms.len()))
            })
        })
        .await
    }
}

pub async fn chart(ctx: &mut Ctx<'_>) -> Result<String> {
    let began = Instant::now();
    let images = tokio::task::spawn_blocking(build_images).await??;
    let built = began.elapsed();
    let cp = ControlPlane::start(Options {
        components: Components::ALL,
        service_account_admission: true,
        audit_writes: true,
        audit_reads: true,
        ..Options::default()
    })
    .await
    .context("starting the scenario's control plane")?;
    let client = cp.client().await?;
    let cluster = Cluster { cp, client };
    let node = KubeletNode::start(&cluster.cp, "chart-node")
        .await
        .context("starting the node")?;
    let result = on_the_node(&cluster, &node, &images, &ctx.bins().local_node).await;
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
    cluster: &Cluster,
    node: &KubeletNode,
    images: &[(PathBuf, String)],
    local_node: &Path,
) -> Result<String> {
    for (archive, name) in images {
        node.import_image(archive, name)
            .with_context(|| format!("importing {}", archive.display()))?;
    }
    let mut granted = rbac::Granted::default();
    let local = local_provider(cluster, node, &mut granted).await?;
    let aws = aws::aws_provider(cluster, node, local_node, &mut granted).await?;
    let rbac = rbac::check(cluster, &granted)?;
    Ok(format!(
        "{} images imported; local: {local}; aws: {aws}; {rbac}",
        images.len()
    ))
}

/// Installs `release`, waits for its pod, checks its container's user and root file system,
/// and records the rules it grants; the pod and the container's process.
async fn install(
    cluster: &Cluster,
    node: &KubeletNode,
    release: &Release,
    granted: &mut rbac::Granted,
) -> Result<(Pod, u32)> {
    release.helm(cluster, "install", &[])?;
    granted.record(cluster, release).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &release.ns);
    let pod = ready_pod(&pods, release, None).await?;
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
    Ok((pod, pid))
}

/// No log line of the release's containers contains `Forbidden` (the chart's RBAC is enough)
/// or any of `also`; with `wrote`, every container wrote more than a start-up's lines (a
/// check that reads nothing cannot fail: before pods are replaced, whose logs go with them).
fn clean_logs(node: &KubeletNode, ns: &str, also: &[&str], wrote: bool) -> Result<()> {
    let logs = node.container_logs(ns);
    ensure!(
        !logs.is_empty() && (!wrote || logs.values().all(|l| l.lines().count() > 3)),
        "the containers wrote (almost) no log: {logs:?}"
    );
    let bad = |line: &str| {
        line.contains("Forbidden")
            || line.contains("forbidden")
            || also.iter().any(|a| line.contains(a))
    };
    let found: Vec<String> = logs
        .iter()
        .filter_map(|(c, log)| log.lines().find(|l| bad(l)).map(|l| format!("{c}: {l}")))
        .collect();
    ensure!(found.is_empty(), "refused or failing: {found:?}");
    Ok(())
}

/// What a pod deletion took: the old pod's shutdown, and the hand-over of the Lease counted
/// from its end.
struct Handover {
    pod: Pod,
    shutdown: Duration,
    handover: Duration,
}

/// Deletes the release's pod `old`: the new pod is Ready and takes the Lease within its
/// duration, counted from the old pod's end (it finishes in-flight steps, then releases).
async fn delete_pod(cluster: &Cluster, release: &Release, old: &Pod) -> Result<Handover> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &release.ns);
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &release.ns);
    let old = old.name_any();
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
    let new = ready_pod(&pods, release, Some(&old)).await?;
    let new_name = new.name_any();
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
    Ok(Handover {
        pod: new,
        shutdown,
        handover,
    })
}

/// `helm upgrade --reuse-values` with a changed pod annotation: the pod rolls; the new one.
async fn upgrade(cluster: &Cluster, release: &Release, old: &Pod) -> Result<Pod> {
    release.helm(
        cluster,
        "upgrade",
        &[
            "--reuse-values",
            "--set-string",
            "podAnnotations.e2e-rollout=2",
        ],
    )?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &release.ns);
    let rolled = ready_pod(&pods, release, Some(&old.name_any())).await?;
    ensure!(
        rolled.annotations().get("e2e-rollout").map(String::as_str) == Some("2"),
        "the pod after the upgrade has not the changed value"
    );
    Ok(rolled)
}

/// `helm uninstall`: the CRDs and the machine objects stay (docs/operations.md); then the
/// finalizers the uninstalled controllers leave are taken off, so the namespace can go.
async fn uninstall(
    cluster: &Cluster,
    release: &Release,
    granted: &mut rbac::Granted,
) -> Result<()> {
    let before = cluster.machine_uids(&release.ns).await?;
    granted.uninstalling(release);
    helm(
        cluster.cp.kubeconfig_path(),
        &[
            "uninstall",
            release.name,
            "-n",
            release.ns.as_str(),
            "--wait",
        ],
    )?;
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
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
        cluster.machine_uids(&release.ns).await? == before,
        "the machine objects changed with helm uninstall"
    );
    release_machines(cluster, &release.ns).await
}

/// The local provider's release: the webhook through its Service, machines whose
/// `local-node` VMs run in the pod, `/metrics` through the Service, a pod deletion and an
/// upgrade (the VMs go with the pod: the pool stays bounded), an uninstall.
async fn local_provider(
    cluster: &Cluster,
    node: &KubeletNode,
    granted: &mut rbac::Granted,
) -> Result<String> {
    let ns = cluster.cp.namespace("chart").await?;
    let release = Release::new(RELEASE, "local", &ns, node, &[]);
    let (pod, pid) = install(cluster, node, &release, granted).await?;

    // The webhook, called by the API server through the chart's Service.
    let bad = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": { "name": "bad" },
        "provider": "local",
        "providerSpec": { "capacity": { "cpu": "lots" } },
        "secretRef": { "name": "chart-local", "namespace": ns },
    });
    let refused = crate::e2e::env::apply(&cluster.client, &ns, &bad).await;
    let message = match refused {
        Ok(_) => bail!("a class with capacity.cpu \"lots\" was admitted"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        message.contains("admission webhook") && message.contains("capacity.cpu"),
        "the refusal is not the webhook's naming the field: {message}"
    );

    // The machines: local-node VMs started inside the pod, registering as Nodes.
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &ns);
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
    crate::e2e::env::apply(&cluster.client, &ns, &class).await?;
    crate::e2e::env::apply(&cluster.client, &ns, &deployment(CLASS)).await?;
    cluster.running(&ns, 2).await?;
    let vms: Vec<String> = processes_beside(pid)
        .into_iter()
        .filter(|c| c.contains("local-node"))
        .collect();
    ensure!(vms.len() == 2, "local-node processes in the pod: {vms:?}");
    let before = cluster.machine_uids(&ns).await?;

    // /metrics through the chart's Service (the API server's service proxy).
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(cluster.client.clone(), &ns);
    let svc = services
        .list(&ListParams::default().labels(&release.selector()))
        .await?
        .items
        .into_iter()
        .map(|s| s.name_any())
        .find(|n| n.ends_with("-metrics"))
        .context("the chart's metrics Service")?;
    let path = format!("/api/v1/namespaces/{ns}/services/{svc}:metrics/proxy/metrics");
    let metrics = wait_for("/metrics through the Service", WAIT, || async {
        let req = http::Request::get(path.as_str()).body(Vec::new())?;
        Ok(match cluster.client.request_text(req).await {
            Ok(text) if METRICS.iter().all(|m| text.contains(m)) => Check::Done(text),
            Ok(text) => Check::Pending(format!("{} bytes without every metric", text.len())),
            Err(e) => Check::Pending(format!("{e}")),
        })
    })
    .await?;
    clean_logs(node, &ns, &[], true)?;

    // A deleted pod: the new one takes the Lease within its duration. The local provider's
    // VMs are the pod's processes and go with it: the new pod's controller finds them gone
    // and replaces those machines (a cloud's VMs outlive the pod: [`aws`]). The pool stays
    // bounded meanwhile.
    let moved = delete_pod(cluster, &release, &pod).await?;
    let replaced_by_deletion = no_more_than_2(cluster, &ns, &before).await?;
    let rolled = upgrade(cluster, &release, &moved.pod).await?;
    let before = cluster.machine_uids(&ns).await?;
    let replaced_by_upgrade = no_more_than_2(cluster, &ns, &before).await?;
    clean_logs(node, &ns, &[], false)?;
    drop(rolled);
    uninstall(cluster, &release, granted).await?;
    Ok(format!(
        "pod Ready as uid 65532 on a read-only root; webhook refused capacity.cpu; 2 machines Running with their VMs in the pod; {} metric lines through the Service; no Forbidden; the deleted pod gone in {:.1}s, its Lease taken {:.1}s after; after the pod's deletion and the upgrade no more than 2 machines ({replaced_by_deletion} and {replaced_by_upgrade} already replaced: the local VMs go with the pod); uninstall kept the CRDs and every machine object",
        metrics.lines().count(),
        moved.shutdown.as_secs_f64(),
        moved.handover.as_secs_f64()
    ))
}

/// The scenario's MachineDeployment of 2 machines of `class`.
fn deployment(class: &str) -> serde_json::Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": { "name": MD },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "pool": MD } },
            "template": {
                "metadata": { "labels": { "pool": MD } },
                "spec": { "class": { "kind": "MachineClass", "name": class } },
            },
        },
    })
}

/// The pool has no more than 2 machines that are not being deleted (a replacement never adds
/// one); returns how many of them are not among `before` (replaced so far).
async fn no_more_than_2(cluster: &Cluster, ns: &str, before: &BTreeSet<String>) -> Result<usize> {
    let live: Vec<Machine> = cluster
        .machines(ns)
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

/// Takes the finalizers off what the uninstalled controllers leave, so the namespace can go.
async fn release_machines(cluster: &Cluster, ns: &str) -> Result<()> {
    let release = json!({ "metadata": { "finalizers": null } });
    let pp = PatchParams::default();
    for m in cluster.machines(ns).await? {
        let api: Api<Machine> = Api::namespaced(cluster.client.clone(), ns);
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
            Api::namespaced_with(cluster.client.clone(), ns, &resource);
        for o in api.list(&ListParams::default()).await?.items {
            let _ = api.patch(&o.name_any(), &pp, &Patch::Merge(&release)).await;
        }
    }
    Ok(())
}
