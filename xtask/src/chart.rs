//! `cargo xtask chart`: lints and renders the Helm chart in `deploy/chart` for every provider,
//! container layout and certificate mode, with `helm` built from its Go module.
//!
//! The chart carries copies of `deploy/crds/*.yaml` (its `crds/`) and of the monitoring files
//! (`files/`), because `helm package` takes only what is under the chart's directory. This
//! command fails when a copy differs from its source (`--sync` copies them; `cargo xtask crds`
//! writes both CRD directories), so they cannot drift.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use mcm_testenv::binaries::{HELM_ENV, HELM_VERSION, helm_binary, helm_cache_path};

use crate::crds::workspace_root;

/// The Go module and package `helm` is built from.
const HELM_MODULE: &str = "helm.sh/helm/v3";
const HELM_PACKAGE: &str = "helm.sh/helm/v3/cmd/helm";

/// The release name and namespace the chart is rendered with.
pub const RELEASE: &str = "mcm-rs";
/// See [`RELEASE`].
pub const RELEASE_NAMESPACE: &str = "mcm-system";

/// The providers the chart can run.
pub const PROVIDERS: [&str; 4] = ["local", "aws", "gcp", "azure"];

/// `deploy/chart`.
pub fn chart_dir() -> PathBuf {
    workspace_root().join("deploy").join("chart")
}

/// One rendering of the chart: a name and the `--set` values.
#[derive(Debug, Clone)]
pub struct Case {
    /// The file name (without `.yaml`) of its output under `--out`.
    pub name: String,
    /// `key=value` pairs passed with `--set`.
    pub set: Vec<String>,
}

/// Every provider x containers (one, two) x certificate mode (self-signed, cert-manager), each
/// with the ServiceMonitor, the dashboard, the PrometheusRule and the PDB on; then the
/// defaults alone, and the two other target-cluster modes.
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for provider in PROVIDERS {
        for containers in ["one", "two"] {
            for cert_manager in [false, true] {
                let mode = if cert_manager {
                    "cert-manager"
                } else {
                    "self-signed"
                };
                cases.push(Case {
                    name: format!("{provider}-{containers}-{mode}"),
                    set: vec![
                        format!("provider={provider}"),
                        format!("containers={containers}"),
                        format!("webhook.certManager.enabled={cert_manager}"),
                        "metrics.serviceMonitor.enabled=true".into(),
                        "monitoring.dashboard.enabled=true".into(),
                        "monitoring.prometheusRule.enabled=true".into(),
                        "podDisruptionBudget.enabled=true".into(),
                    ],
                });
            }
        }
    }
    cases.push(Case {
        name: "defaults".into(),
        set: Vec::new(),
    });
    cases.push(Case {
        name: "aws-target-secret".into(),
        set: vec![
            "provider=aws".into(),
            "namespace=machines".into(),
            "targetKubeconfig.secretName=target-kubeconfig".into(),
            "replicas=2".into(),
            "webhook.certManager.enabled=true".into(),
        ],
    });
    cases.push(Case {
        name: "local-no-target-no-webhook".into(),
        set: vec![
            "targetKubeconfig.secretName=none".into(),
            "webhook.enabled=false".into(),
        ],
    });
    cases
}

/// Runs the command: checks (or with `sync` writes) the chart's copies, makes sure `helm` is
/// there, then lints and renders every [`cases`] entry, writing `<out>/<case>.yaml` when asked.
pub fn run(out: Option<PathBuf>, sync: bool) -> Result<()> {
    sync_copies(!sync)?;
    check_app_version()?;
    let helm = ensure_helm()?;
    let chart = chart_dir();
    if let Some(dir) = &out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let began = Instant::now();
    let cases = cases();
    for case in &cases {
        lint(&helm, &chart, &case.set)
            .with_context(|| format!("helm lint of case {}", case.name))?;
        let text = template(&helm, &chart, &case.set)
            .with_context(|| format!("helm template of case {}", case.name))?;
        let docs = crate::e2e::env::yaml_documents(&text)
            .with_context(|| format!("the rendered manifests of case {}", case.name))?;
        let kinds = kinds(&docs).with_context(|| format!("case {}", case.name))?;
        eprintln!(
            "{:<28} {} objects: {}",
            case.name,
            docs.len(),
            kinds.join(", ")
        );
        if let Some(dir) = &out {
            std::fs::write(dir.join(format!("{}.yaml", case.name)), &text)?;
        }
    }
    eprintln!(
        "linted (--strict) and rendered {} cases of {} in {:.1?}",
        cases.len(),
        chart.display(),
        began.elapsed()
    );
    Ok(())
}

/// The chart's `appVersion` (the default tag of the images) must be the workspace version,
/// the tag `cargo xtask image` gives them.
pub fn check_app_version() -> Result<()> {
    let path = chart_dir().join("Chart.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let chart: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not YAML: {e}", path.display()))?;
    let want = env!("CARGO_PKG_VERSION");
    if chart["appVersion"].as_str() != Some(want) {
        bail!(
            "{}: appVersion is {}, the workspace version is {want}",
            path.display(),
            chart["appVersion"]
        );
    }
    Ok(())
}

/// The kinds of the rendered objects (an object without `apiVersion`/`kind` is an error).
fn kinds(docs: &[serde_json::Value]) -> Result<Vec<String>> {
    let mut kinds = Vec::new();
    for d in docs {
        let (Some(_), Some(kind)) = (d["apiVersion"].as_str(), d["kind"].as_str()) else {
            bail!("a rendered document without apiVersion or kind: {d}");
        };
        if !kinds.iter().any(|k| k == kind) {
            kinds.push(kind.to_string());
        }
    }
    Ok(kinds)
}

/// `helm lint --strict` with the values `set`.
pub fn lint(helm: &Path, chart: &Path, set: &[String]) -> Result<()> {
    let mut args = vec!["lint".to_string(), "--strict".to_string()];
    args.push(chart.display().to_string());
    args.extend(set_args(set));
    helm_output(helm, &args).map(|_| ())
}

/// `helm template` of the chart as release [`RELEASE`] in [`RELEASE_NAMESPACE`] with the
/// values `set` (the CRDs included): the rendered manifests.
pub fn template(helm: &Path, chart: &Path, set: &[String]) -> Result<String> {
    let mut args = vec![
        "template".to_string(),
        RELEASE.to_string(),
        chart.display().to_string(),
        "--namespace".to_string(),
        RELEASE_NAMESPACE.to_string(),
        "--include-crds".to_string(),
    ];
    args.extend(set_args(set));
    helm_output(helm, &args)
}

fn set_args(set: &[String]) -> Vec<String> {
    set.iter()
        .flat_map(|s| ["--set".to_string(), s.clone()])
        .collect()
}

fn helm_output(helm: &Path, args: &[String]) -> Result<String> {
    let out = Command::new(helm)
        .args(args)
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !out.status.success() {
        bail!(
            "`helm {}` failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `helm` binary: `$HELM`, or the cached build, built first when missing.
pub fn ensure_helm() -> Result<PathBuf> {
    if std::env::var_os(HELM_ENV).is_some_and(|v| !v.is_empty()) {
        return Ok(helm_binary()?);
    }
    if let Ok(helm) = helm_binary() {
        return Ok(helm);
    }
    let dest = helm_cache_path()?;
    let began = Instant::now();
    build_helm(&dest)?;
    eprintln!(
        "built helm {HELM_VERSION} into {} in {:.0?}",
        dest.display(),
        began.elapsed()
    );
    Ok(helm_binary()?)
}

/// Builds `helm` in a wrapper module requiring helm's (which has no replace directives of its
/// own), its shared modules pinned to the control plane's versions when that was built here
/// (see [`crate::testenv::align_with_control_plane`]), with the version and Kubernetes-version
/// ldflags of helm's Makefile, into a scratch directory first and then renamed to `dest`, so
/// that an interrupted build never leaves a binary that looks complete.
fn build_helm(dest: &Path) -> Result<()> {
    let dir = dest.parent().context("the helm cache path has no parent")?;
    let work = dir.join("src");
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let go_mod = crate::testenv::wrapper_module(
        &work,
        "mcm-rs.local/helm",
        HELM_MODULE,
        HELM_VERSION,
        &[HELM_PACKAGE],
        |_| HELM_VERSION.to_string(),
    )?;
    crate::testenv::align_with_control_plane(&work, "helm")?;
    let (major, minor) = kubernetes_version(&go_mod)?;
    let mut ldflags = vec![
        "-s".to_string(),
        "-w".to_string(),
        format!("-X=helm.sh/helm/v3/internal/version.version={HELM_VERSION}"),
        "-X=helm.sh/helm/v3/internal/version.metadata=".to_string(),
        "-X=helm.sh/helm/v3/internal/version.gitTreeState=clean".to_string(),
    ];
    for pkg in [
        "helm.sh/helm/v3/pkg/lint/rules",
        "helm.sh/helm/v3/pkg/chartutil",
    ] {
        ldflags.push(format!("-X={pkg}.k8sVersionMajor={major}"));
        ldflags.push(format!("-X={pkg}.k8sVersionMinor={minor}"));
    }
    crate::testenv::go_build(&work, &out, &ldflags.join(" "), &[HELM_PACKAGE])?;
    std::fs::rename(out.join("helm"), dest)
        .with_context(|| format!("moving the built helm to {}", dest.display()))?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The Kubernetes version helm's Makefile builds in (for `.Capabilities.KubeVersion` and the
/// deprecation lint): `1.<minor>` from the `k8s.io/client-go v0.<minor>.<patch>` helm requires.
fn kubernetes_version(go_mod: &str) -> Result<(u32, u32)> {
    let version = go_mod
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("k8s.io/client-go "))
        .context("helm's go.mod requires no k8s.io/client-go")?;
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let major: u32 = parts.next().unwrap_or_default().parse()?;
    let minor: u32 = parts
        .next()
        .context("no minor version of k8s.io/client-go")?
        .parse()?;
    Ok((major + 1, minor))
}

/// The files the chart carries copies of: (source, copy in the chart). The CRDs are every
/// `deploy/crds/*.yaml`.
pub fn copies() -> Result<Vec<(PathBuf, PathBuf)>> {
    let root = workspace_root();
    let chart = chart_dir();
    let mut pairs = Vec::new();
    let crds = root.join("deploy").join("crds");
    let mut names: Vec<_> = std::fs::read_dir(&crds)
        .with_context(|| format!("reading {}", crds.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| n.to_string_lossy().ends_with(".yaml"))
        .collect();
    names.sort();
    for name in names {
        pairs.push((crds.join(&name), chart.join("crds").join(&name)));
    }
    for file in ["dashboard.json", "alerts.yaml"] {
        pairs.push((
            root.join("deploy").join("monitoring").join(file),
            chart.join("files").join(file),
        ));
    }
    Ok(pairs)
}

/// With `check`, fails naming every copy that differs from its source and every file in the
/// chart's `crds/` without a source; otherwise makes the copies equal (and removes those).
pub fn sync_copies(check: bool) -> Result<()> {
    let pairs = copies()?;
    let mut stale = Vec::new();
    for (source, copy) in &pairs {
        let want =
            std::fs::read(source).with_context(|| format!("reading {}", source.display()))?;
        if std::fs::read(copy).ok().as_deref() == Some(want.as_slice()) {
            continue;
        }
        if check {
            stale.push(copy.display().to_string());
        } else {
            if let Some(dir) = copy.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(copy, &want)?;
            eprintln!("wrote {}", copy.display());
        }
    }
    let chart_crds = chart_dir().join("crds");
    if let Ok(entries) = std::fs::read_dir(&chart_crds) {
        for entry in entries.flatten() {
            let path = entry.path();
            if pairs.iter().any(|(_, copy)| *copy == path) {
                continue;
            }
            if check {
                stale.push(format!("{} (no source)", path.display()));
            } else {
                std::fs::remove_file(&path)?;
                eprintln!("removed {}", path.display());
            }
        }
    }
    if !stale.is_empty() {
        bail!(
            "the chart's copies differ from their sources (run `cargo xtask chart --sync`): {}",
            stale.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubernetes_version_follows_helms_client_go() {
        let go_mod = "module helm.sh/helm/v3\n\ngo 1.26.0\n\nrequire (\n\
                      \tk8s.io/api v0.37.0\n\tk8s.io/client-go v0.37.2\n)\n";
        assert_eq!(kubernetes_version(go_mod).unwrap(), (1, 37));
        assert!(kubernetes_version("module x\n").is_err());
    }

    #[test]
    fn every_provider_and_mode_is_rendered() {
        let cases = cases();
        for provider in PROVIDERS {
            for containers in ["one", "two"] {
                for mode in ["self-signed", "cert-manager"] {
                    let name = format!("{provider}-{containers}-{mode}");
                    assert!(cases.iter().any(|c| c.name == name), "{name}");
                }
            }
        }
    }

    #[test]
    fn the_chart_copies_match_their_sources() {
        sync_copies(true).unwrap();
    }

    #[test]
    fn the_charts_app_version_is_the_workspace_version() {
        check_app_version().unwrap();
    }
}
