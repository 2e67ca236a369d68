//! `cargo xtask crds`: writes `deploy/crds/machine.sapcloud.io_<plural>.yaml` from mcm-api,
//! and the same files into the Helm chart's `deploy/chart/crds/`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Writes the generated CRDs (into `deploy/crds` and the chart's `crds/`), or with `check`
/// fails when a committed file differs.
pub fn run(check: bool) -> Result<()> {
    let dirs = [
        workspace_root().join("deploy").join("crds"),
        crate::chart::chart_dir().join("crds"),
    ];
    let mut stale = Vec::new();
    for dir in &dirs {
        std::fs::create_dir_all(dir)?;
        for crd in mcm_api::crds::all() {
            let path = dir.join(mcm_api::crds::file_name(&crd));
            let text = mcm_api::crds::render(&crd)
                .with_context(|| format!("rendering {}", path.display()))?;
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current == text {
                continue;
            }
            if check {
                stale.push(path.display().to_string());
            } else {
                std::fs::write(&path, text)?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    if !stale.is_empty() {
        bail!("out of date (run `cargo xtask crds`): {}", stale.join(", "));
    }
    Ok(())
}
