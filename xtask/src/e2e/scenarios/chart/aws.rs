//! The AWS provider's image from the chart, against moto over TLS: a provider team's image
//! on the same node, with the chart's values for a cloud (the endpoint and an extra CA in
//! `extraEnv`/`extraVolumes`, the image's own CA bundle, its non-root user and read-only
//! root). Its VMs outlive the pod, so a pod deletion and an upgrade replace no machine and
//! launch no instance.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use mcm_testenv::node::KubeletNode;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use serde_json::json;

use super::{Cluster, Release, clean_logs, delete_pod, deployment, install, rbac, uninstall};
use crate::e2e::ctx::WAIT;
use crate::e2e::env::{Check, wait_for};
use crate::moto::{Lag, Moto, TlsListener, World};
use crate::vm_player::VmPlayer;

/// The AWS provider's release.
const RELEASE: &str = "mcm-aws";
/// The class of its machines.
const CLASS: &str = "chart-aws";
/// Where the chart's `extraVolumes` mount the CA that signed moto's certificate.
const EXTRA_CA_DIR: &str = "/etc/mcm-rs/extra-ca";
/// The image's own CA bundle (`cargo xtask image` copies the build host's there).
const IMAGE_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// What the AWS SDK's HTTP client logs when it cannot read a CA file, or finds none.
const CA_TROUBLE: [&str; 2] = [
    "root CA certificate loading errors",
    "no native root CA certificates found",
];

/// A CA and moto's serving certificate for `host`, written to `dir`: the listener and the
/// CA's PEM.
fn tls_files(dir: &Path, host: IpAddr) -> Result<(TlsListener, String)> {
    std::fs::create_dir_all(dir)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "mcm-rs chart scenario CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut serving = CertificateParams::new(Vec::<String>::new())?;
    serving.subject_alt_names.push(SanType::IpAddress(host));
    let key = KeyPair::generate()?;
    let cert = serving.signed_by(&key, &ca)?;
    let listener = TlsListener {
        host,
        cert: dir.join("moto.crt"),
        key: dir.join("moto.key"),
    };
    std::fs::write(&listener.cert, cert.pem())?;
    std::fs::write(&listener.key, key.serialize_pem())?;
    Ok((listener, ca.pem()))
}

/// The moto server of this process, listening with TLS on the node's host address too (it
/// lives as long as the process, and dies with it).
fn moto(tls: &TlsListener) -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| Moto::start_with(Lag::default(), Some(tls)))
}

/// Each machine's providerID, by uid.
async fn provider_ids(cluster: &Cluster, ns: &str) -> Result<BTreeMap<String, String>> {
    Ok(cluster
        .machines(ns)
        .await?
        .into_iter()
        .map(|m| {
            let id = m.spec.provider_id.clone().unwrap_or_default();
            (m.uid().unwrap_or_default(), id)
        })
        .collect())
}

/// Waits until the machine controller in `pod` has reconciled at least `n` times (its
/// `/metrics`, through the API server's pod proxy): it has seen the machines.
async fn reconciled(cluster: &Cluster, pod: &Pod, n: u64) -> Result<u64> {
    let ns = pod.namespace().unwrap_or_default();
    // The pod proxy takes a port number (a name is the Service proxy's).
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .map(|p| p.container_port)
        .context("the pod has no port named metrics")?;
    let path = format!(
        "/api/v1/namespaces/{ns}/pods/{}:{port}/proxy/metrics",
        pod.name_any()
    );
    wait_for("the new pod to reconcile the machines", WAIT, || async {
        let req = http::Request::get(path.as_str()).body(Vec::new())?;
        Ok(match cluster.client.request_text(req).await {
            Ok(text) => {
                let count = machine_reconciles(&text);
                if count >= n {
                    Check::Done(count)
                } else {
                    Check::Pending(format!("{count} machine reconciles"))
                }
            }
            Err(e) => Check::Pending(format!("{e}")),
        })
    })
    .await
}

/// The machine controller's reconcile count in a `/metrics` text.
fn machine_reconciles(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("mcm_controller_reconcile_duration_seconds_count")
                && l.contains("controller=\"machine\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The AWS release: install, 2 Running machines whose instances live in moto (played by
/// `local-node` on the host), a pod deletion and an upgrade that replace no machine and
/// launch no instance, an uninstall.
pub(super) async fn aws_provider(
    cluster: &Cluster,
    node: &KubeletNode,
    local_node: &Path,
    granted: &mut rbac::Granted,
) -> Result<String> {
    let host = IpAddr::V4(node.network().host_ip());
    let (tls, ca_pem) = tls_files(&cluster.cp.run_dir().join("moto-tls"), host)?;
    let moto = tokio::task::spawn_blocking(move || moto(&tls)).await?;
    let endpoint = moto.tls_url.clone().context("moto has no TLS listener")?;
    let world = World::new_in(moto, "chart").await;
    let ns = cluster.cp.namespace("chart-aws").await?;

    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &ns);
    let ca: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "extra-ca" },
        "data": { "ca.crt": ca_pem },
    }))?;
    let apply = PatchParams::apply("e2e").force();
    configmaps
        .patch("extra-ca", &apply, &Patch::Apply(&ca))
        .await?;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": CLASS },
        "stringData": {
            "providerAccessKeyId": "AKIDCHART",
            "providerSecretAccessKey": "secret",
            "userData": "#cloud-config\nbootstrapToken: <<BOOTSTRAP_TOKEN>>\n",
        },
    }))?;
    secrets.patch(CLASS, &apply, &Patch::Apply(&secret)).await?;

    // The chart's values for a cloud provider behind a CA of its own: the endpoint, the
    // image's CA bundle and the extra CA (both read: SSL_CERT_FILE and SSL_CERT_DIR).
    let values = json!({
        "extraEnv": [
            { "name": "AWS_ENDPOINT_URL", "value": endpoint },
            { "name": "SSL_CERT_FILE", "value": IMAGE_CA_BUNDLE },
            { "name": "SSL_CERT_DIR", "value": EXTRA_CA_DIR },
        ],
        "extraVolumes": [{ "name": "extra-ca", "configMap": { "name": "extra-ca" } }],
        "extraVolumeMounts": [{ "name": "extra-ca", "mountPath": EXTRA_CA_DIR, "readOnly": true }],
    });
    let file = cluster.cp.run_dir().join("aws-values.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&values)?)?;
    let release = Release::new(
        RELEASE,
        "aws",
        &ns,
        node,
        &["-f".to_string(), file.display().to_string()],
    );
    let (pod, _) = install(cluster, node, &release, granted).await?;

    let class = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": { "name": CLASS },
        "provider": "AWS",
        "providerSpec": world.provider_spec(),
        "secretRef": { "name": CLASS, "namespace": ns },
    });
    crate::e2e::env::apply(&cluster.client, &ns, &class).await?;
    crate::e2e::env::apply(&cluster.client, &ns, &deployment(CLASS)).await?;
    let player = VmPlayer::start(
        &world,
        local_node.to_path_buf(),
        cluster.cp.kubeconfig_path().to_path_buf(),
    );
    cluster.running(&ns, 2).await?;
    let before = provider_ids(cluster, &ns).await?;
    let launched = world.launched_per_machine();
    ensure!(
        launched.len() == 2 && launched.values().all(|n| *n == 1),
        "instances launched per machine: {launched:?}"
    );
    clean_logs(node, &ns, &CA_TROUBLE, true)?;

    // The VMs outlive the pod: nothing is replaced, nothing launched again.
    let unchanged = |what: &'static str| {
        let before = &before;
        let launched = &launched;
        let world = &world;
        let ns = &ns;
        async move {
            let now = provider_ids(cluster, ns).await?;
            ensure!(
                &now == before,
                "machines or providerIDs changed by {what}: {before:?} -> {now:?}"
            );
            let again = world.launched_per_machine();
            ensure!(
                &again == launched,
                "instances launched again by {what}: {launched:?} -> {again:?}"
            );
            cluster.running(ns, 2).await?;
            Ok::<_, anyhow::Error>(())
        }
    };
    let moved = delete_pod(cluster, &release, &pod).await?;
    let after_deletion = reconciled(cluster, &moved.pod, 2).await?;
    unchanged("the pod's deletion").await?;
    let rolled = super::upgrade(cluster, &release, &moved.pod).await?;
    let after_upgrade = reconciled(cluster, &rolled, 2).await?;
    unchanged("the upgrade").await?;
    clean_logs(node, &ns, &CA_TROUBLE, false)?;
    uninstall(cluster, &release, granted).await?;
    let played = player.running();
    drop(player);
    Ok(format!(
        "pod Ready as uid 65532 on a read-only root; EC2 at {endpoint} through the extra CA; 2 machines Running on {played} instances; the deleted pod gone in {:.1}s, its Lease taken {:.1}s after; the new pod ({after_deletion} machine reconciles) and the upgraded one ({after_upgrade}) replaced no machine and launched no instance; no Forbidden, no CA error",
        moved.shutdown.as_secs_f64(),
        moved.handover.as_secs_f64()
    ))
}
