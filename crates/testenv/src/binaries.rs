//! Where the control-plane binaries come from.
//!
//! Two sources, in this order:
//! 1. `KUBEBUILDER_ASSETS` (the envtest convention): a directory holding `etcd`, `kube-apiserver`,
//!    and, when asked for, `kube-controller-manager` and `kube-scheduler`.
//! 2. The cache that `cargo xtask testenv` fills: [`cache_bin_dir`].

use std::path::{Path, PathBuf};

use crate::TestEnvError;

/// The Kubernetes release the tests run against (k8s-openapi feature `v1_36`).
pub const KUBERNETES_VERSION: &str = "v1.36.3";

/// The etcd release the tests run against.
pub const ETCD_VERSION: &str = "v3.6.16";

/// The environment variable that names a directory of control-plane binaries.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// The kwok release (sigs.k8s.io/kwok) that keeps the Nodes of kwok-backed local VMs alive.
pub const KWOK_VERSION: &str = "v0.8.0";

/// The environment variable that names a directory holding `kwok` and its stages file
/// ([`KWOK_STAGES_FILE`]), instead of the one `cargo xtask testenv` fills.
pub const KWOK_ENV: &str = "MCM_KWOK_DIR";

/// The file of kwok `Stage` objects (node initialize, node heartbeat with lease, pod ready,
/// complete and delete), taken from kwok's own module by `cargo xtask testenv`.
pub const KWOK_STAGES_FILE: &str = "stages.yaml";

/// The Helm release (`helm.sh/helm/v3`) that renders and lints the chart in `deploy/chart`:
/// the newest built on the Kubernetes minor of [`KUBERNETES_VERSION`] (its client-go is
/// v0.36), so `helm template` renders for the tested minor and its build shares the control
/// plane's compiled packages.
pub const HELM_VERSION: &str = "v3.21.4";

/// The environment variable that names a `helm` binary to use instead of the one
/// `cargo xtask chart` builds into [`helm_cache_path`].
pub const HELM_ENV: &str = "HELM";

/// One control-plane binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binary {
    /// `etcd`
    Etcd,
    /// `kube-apiserver`
    KubeApiserver,
    /// `kube-controller-manager`
    KubeControllerManager,
    /// `kube-scheduler`
    KubeScheduler,
    /// `kubelet` (for a [`crate::node`] that runs pods in containers)
    Kubelet,
}

impl Binary {
    /// Every binary `cargo xtask testenv` provides.
    pub const ALL: [Binary; 5] = [
        Binary::Etcd,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
        Binary::Kubelet,
    ];

    /// The file name of the binary.
    pub fn file_name(self) -> &'static str {
        match self {
            Binary::Etcd => "etcd",
            Binary::KubeApiserver => "kube-apiserver",
            Binary::KubeControllerManager => "kube-controller-manager",
            Binary::KubeScheduler => "kube-scheduler",
            Binary::Kubelet => "kubelet",
        }
    }
}

/// The root of this project's cache: `$XDG_CACHE_HOME/mcm-rs`, else `$HOME/.cache/mcm-rs`.
pub fn cache_root() -> Result<PathBuf, TestEnvError> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("mcm-rs"));
    }
    std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .map(|home| PathBuf::from(home).join(".cache").join("mcm-rs"))
        .ok_or(TestEnvError::NoCacheDir)
}

/// The directory `cargo xtask testenv` installs the binaries of this release set into.
pub fn cache_bin_dir() -> Result<PathBuf, TestEnvError> {
    Ok(cache_root()?
        .join("testenv")
        .join(format!(
            "kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"
        ))
        .join("bin"))
}

/// The directory `cargo xtask testenv` installs kwok and its stages into.
pub fn kwok_cache_dir() -> Result<PathBuf, TestEnvError> {
    Ok(cache_root()?
        .join("testenv")
        .join(format!("kwok-{KWOK_VERSION}")))
}

/// Where `cargo xtask chart` installs `helm` [`HELM_VERSION`], built from its Go module.
pub fn helm_cache_path() -> Result<PathBuf, TestEnvError> {
    Ok(cache_root()?.join("helm").join(HELM_VERSION).join("helm"))
}

/// The `helm` binary: `$HELM` when set (one that is not an executable file is an error, not
/// a fall-back), else [`helm_cache_path`]. Missing: an error that says to run
/// `cargo xtask chart`, which builds it.
pub fn helm_binary() -> Result<PathBuf, TestEnvError> {
    let (path, source_name) = match std::env::var_os(HELM_ENV).filter(|p| !p.is_empty()) {
        Some(p) => (PathBuf::from(p), HELM_ENV),
        None => (helm_cache_path()?, "the cargo xtask chart cache"),
    };
    if is_executable(&path) {
        Ok(path)
    } else {
        Err(TestEnvError::HelmMissing {
            path,
            source_name,
            version: HELM_VERSION,
        })
    }
}

/// Finds the directory holding `kwok` and [`KWOK_STAGES_FILE`]: `$MCM_KWOK_DIR` when set (an
/// incomplete one is an error, not a fall-back), else [`kwok_cache_dir`].
pub fn find_kwok_dir() -> Result<PathBuf, TestEnvError> {
    let (dir, source) = match std::env::var_os(KWOK_ENV).filter(|d| !d.is_empty()) {
        Some(dir) => (PathBuf::from(dir), KWOK_ENV),
        None => (kwok_cache_dir()?, "the cargo xtask testenv cache"),
    };
    check_kwok_dir(&dir, source).map(|()| dir)
}

fn check_kwok_dir(dir: &Path, source: &'static str) -> Result<(), TestEnvError> {
    let mut missing = Vec::new();
    if !is_executable(&dir.join("kwok")) {
        missing.push("kwok");
    }
    if !dir.join(KWOK_STAGES_FILE).is_file() {
        missing.push(KWOK_STAGES_FILE);
    }
    all_present(dir, &missing, source)
}

/// `Ok` when nothing is `missing` from `dir`, else the error that names what is.
fn all_present(dir: &Path, missing: &[&str], source: &'static str) -> Result<(), TestEnvError> {
    if missing.is_empty() {
        return Ok(());
    }
    Err(TestEnvError::BinariesMissing {
        dir: dir.to_path_buf(),
        source_name: source,
        missing: missing.join(", "),
    })
}

/// Finds the directory holding every binary in `needed`.
///
/// `KUBEBUILDER_ASSETS` wins when set; a set variable that lacks a binary is an error rather
/// than a silent fall-back to the cache, so a misconfigured environment is noticed.
pub fn find_bin_dir(needed: &[Binary]) -> Result<PathBuf, TestEnvError> {
    if let Some(dir) = std::env::var_os(ASSETS_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return check_dir(&dir, needed, ASSETS_ENV).map(|()| dir);
    }
    let dir = cache_bin_dir()?;
    check_dir(&dir, needed, "the cargo xtask testenv cache").map(|()| dir)
}

fn check_dir(dir: &Path, needed: &[Binary], source: &'static str) -> Result<(), TestEnvError> {
    let missing: Vec<&'static str> = needed
        .iter()
        .filter(|b| !is_executable(&dir.join(b.file_name())))
        .map(|b| b.file_name())
        .collect();
    all_present(dir, &missing, source)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_are_named_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd"), b"").unwrap();
        let err = check_dir(
            dir.path(),
            &[Binary::Etcd, Binary::KubeApiserver],
            "the cargo xtask testenv cache",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("etcd, kube-apiserver"), "{msg}");
        assert!(msg.contains("cargo xtask testenv"), "{msg}");
    }

    #[test]
    fn executable_binaries_are_accepted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for b in Binary::ALL {
            let p = dir.path().join(b.file_name());
            std::fs::write(&p, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        check_dir(dir.path(), &Binary::ALL, "test").unwrap();
    }

    #[test]
    fn a_missing_helm_names_the_command_that_builds_it() {
        let err = TestEnvError::HelmMissing {
            path: PathBuf::from("/nowhere/helm"),
            source_name: HELM_ENV,
            version: HELM_VERSION,
        };
        let msg = err.to_string();
        assert!(msg.contains("cargo xtask chart"), "{msg}");
        assert!(
            msg.contains("/nowhere/helm") && msg.contains(HELM_VERSION),
            "{msg}"
        );
    }

    #[test]
    fn an_incomplete_kwok_directory_names_what_is_missing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let msg = check_kwok_dir(dir.path(), KWOK_ENV)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("kwok, stages.yaml"), "{msg}");
        let kwok = dir.path().join("kwok");
        std::fs::write(&kwok, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&kwok, std::fs::Permissions::from_mode(0o755)).unwrap();
        let msg = check_kwok_dir(dir.path(), KWOK_ENV)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("stages.yaml") && msg.contains(KWOK_ENV),
            "{msg}"
        );
        std::fs::write(dir.path().join(KWOK_STAGES_FILE), b"").unwrap();
        check_kwok_dir(dir.path(), KWOK_ENV).unwrap();
    }
}
