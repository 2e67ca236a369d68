//! `cargo xtask publish-check`: the library crates as crates.io would receive them, packaged
//! and compiled from their packages.
//!
//! `cargo publish --dry-run` verifies each crate it packages with a debug build of the crate
//! and its dependencies in a workspace of its own: six crates, six resolutions, each
//! dependency built again for each (kube's client five times), and code generation a
//! library's check does not need. This packages the same way (`cargo publish --dry-run
//! --no-verify`, then `cargo package --no-verify` for the `.crate` files, which a dry run does
//! not leave behind), unpacks them into one workspace whose `[patch.crates-io]` points each
//! crate's dependencies on its siblings at their packages, and runs `cargo check` once per
//! crate with only that crate selected, siblings first. Its dependencies' features are then
//! resolved for it alone, as for a user who depends on it alone: a crate that compiles only
//! with features a sibling turns on fails here as it fails for that user. The packages'
//! workspace takes the repository's resolver and profiles, so the dependencies' checked
//! metadata is shared with the documentation build before it.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::crds::workspace_root;
use crate::e2e::env::{cargo_command, target_dir};

/// A publishable package of the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Package {
    name: String,
    version: String,
    /// `None`: publishable anywhere; `Some([])`: `publish = false`.
    publish: Option<Vec<String>>,
    #[serde(default)]
    dependencies: Vec<Dependency>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Dependency {
    name: String,
}

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

/// Packages the library crates and checks each from its package.
pub fn run() -> Result<()> {
    let root = workspace_root();
    let packages = dependencies_first(publishable(&root)?);
    if packages.is_empty() {
        bail!("the workspace has no publishable package");
    }
    let names: Vec<&str> = packages.iter().map(|p| p.name.as_str()).collect();
    println!("packaging {}", names.join(", "));
    let package_dir = target_dir().join("package");
    for p in &packages {
        // A `.crate` left by an earlier run must not stand in for one this run did not write.
        let _ = std::fs::remove_file(package_dir.join(crate_file(p)));
    }
    // The packages named one by one: `--workspace` would name the unpublishable ones too.
    // `--allow-dirty`: this checks the working tree as it is, committed or not.
    let mut selected: Vec<&str> = names.iter().flat_map(|n| ["--package", n]).collect();
    selected.push("--allow-dirty");
    let status = cargo_command()
        .current_dir(&root)
        .args(["publish", "--dry-run", "--locked", "--no-verify"])
        .args(&selected)
        .status()
        .context("running cargo publish --dry-run")?;
    if !status.success() {
        bail!("cargo publish --dry-run failed ({status})");
    }
    // `publish --dry-run` leaves no `.crate` behind; `package` writes the same ones to
    // `<target>/package/`.
    let status = cargo_command()
        .current_dir(&root)
        .args(["package", "--locked", "--no-verify"])
        .args(&selected)
        .status()
        .context("running cargo package")?;
    if !status.success() {
        bail!("cargo package failed ({status})");
    }

    let dir = target_dir().join("publish-check");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    for p in &packages {
        unpack(&package_dir.join(crate_file(p)), &dir)?;
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    std::fs::write(
        dir.join("Cargo.toml"),
        packages_workspace(&packages, &manifest),
    )?;
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).context("copying Cargo.lock")?;

    for p in &packages {
        println!("checking {} {} from its package, alone", p.name, p.version);
        // `--offline`: every dependency comes from the lock file the workspace has, already
        // downloaded; the lock file is rewritten for the packages' workspace, never re-resolved
        // from the index.
        // Compiled, not linted: these are the workspace's own sources, which its build lints
        // (CI runs every workspace build through clippy's driver).
        let status = cargo_command()
            .current_dir(&dir)
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .args(["check", "--offline", "--package", &p.name])
            .status()
            .with_context(|| format!("running cargo check of {}", p.name))?;
        if !status.success() {
            bail!(
                "{} {} does not compile from its package ({status}); its sources are in {}",
                p.name,
                p.version,
                dir.join(package_dir_name(p)).display()
            );
        }
    }
    println!(
        "{} crates packaged and checked from their packages",
        packages.len()
    );
    Ok(())
}

/// The workspace's packages that may be published, in `cargo metadata`'s order.
fn publishable(root: &Path) -> Result<Vec<Package>> {
    let out = cargo_command()
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: Metadata = serde_json::from_slice(&out.stdout).context("reading cargo metadata")?;
    Ok(meta.packages.into_iter().filter(is_publishable).collect())
}

/// The packages ordered so that each comes after the siblings it depends on: a crate that
/// does not compile from its package is named itself, not the first crate above it.
fn dependencies_first(mut rest: Vec<Package>) -> Vec<Package> {
    let mut ordered: Vec<Package> = Vec::with_capacity(rest.len());
    while !rest.is_empty() {
        let ready = rest
            .iter()
            .position(|p| {
                p.dependencies.iter().all(|d| {
                    d.name == p.name
                        || ordered.iter().any(|o| o.name == d.name)
                        || !rest.iter().any(|r| r.name == d.name)
                })
            })
            // A cycle (which cargo refuses anyway): keep the remaining order.
            .unwrap_or(0);
        ordered.push(rest.remove(ready));
    }
    ordered
}

/// Whether a package may be published: `publish` absent, or naming a registry.
fn is_publishable(p: &Package) -> bool {
    p.publish
        .as_ref()
        .is_none_or(|registries| !registries.is_empty())
}

fn package_dir_name(p: &Package) -> String {
    format!("{}-{}", p.name, p.version)
}

fn crate_file(p: &Package) -> String {
    format!("{}.crate", package_dir_name(p))
}

/// Unpacks a `.crate` (a gzipped tar whose entries lie under `<name>-<version>/`) into `dir`.
fn unpack(file: &Path, dir: &Path) -> Result<()> {
    let f = std::fs::File::open(file)
        .with_context(|| format!("opening {} (was it packaged?)", file.display()))?;
    tar::Archive::new(flate2::read::GzDecoder::new(f))
        .unpack(dir)
        .with_context(|| format!("unpacking {}", file.display()))
}

/// The manifest of the packages' workspace: the unpacked packages as members, each sibling
/// dependency patched to its package, the repository's resolver and profiles.
fn packages_workspace(packages: &[Package], repo_manifest: &str) -> String {
    let mut out = String::from(
        "# Written by `cargo xtask publish-check`: the packaged library crates, unpacked.\n\
         [workspace]\n",
    );
    if let Some(resolver) = workspace_resolver(repo_manifest) {
        out.push_str(&format!("resolver = \"{resolver}\"\n"));
    }
    out.push_str("members = [\n");
    for p in packages {
        out.push_str(&format!("    \"{}\",\n", package_dir_name(p)));
    }
    out.push_str("]\n\n[patch.crates-io]\n");
    for p in packages {
        out.push_str(&format!(
            "{} = {{ path = \"{}\" }}\n",
            p.name,
            package_dir_name(p)
        ));
    }
    let profiles = profile_sections(repo_manifest);
    if !profiles.is_empty() {
        out.push('\n');
        out.push_str(&profiles);
    }
    out
}

/// The `resolver` of the manifest's `[workspace]` table.
fn workspace_resolver(manifest: &str) -> Option<String> {
    let mut in_workspace = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_workspace = t == "[workspace]";
        } else if in_workspace
            && let Some(value) = t.strip_prefix("resolver")
            && let Some(value) = value.trim_start().strip_prefix('=')
        {
            return Some(value.trim().trim_matches('"').to_string());
        }
    }
    None
}

/// Every `[profile.*]` table of the manifest, with its lines, in order.
fn profile_sections(manifest: &str) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in manifest.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            keep = t.starts_with("[profile.");
            if keep && !out.is_empty() && !out.ends_with("\n\n") {
                out.push('\n');
            }
        }
        if keep && !line.trim().is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"[workspace]
resolver = "3"
members = ["a"]

[workspace.dependencies]
serde = "1"

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false

[patch.crates-io]
x = { path = "x" }

[profile.release]
lto = "fat"
"#;

    fn package(name: &str, publish: Option<Vec<String>>) -> Package {
        Package {
            name: name.into(),
            version: "0.1.0".into(),
            publish,
            dependencies: Vec::new(),
        }
    }

    fn depending_on(name: &str, deps: &[&str]) -> Package {
        Package {
            dependencies: deps
                .iter()
                .map(|d| Dependency {
                    name: d.to_string(),
                })
                .collect(),
            ..package(name, None)
        }
    }

    #[test]
    fn each_crate_is_checked_after_the_siblings_it_depends_on() {
        let packages = vec![
            depending_on("core", &["reconcilers", "api", "tokio"]),
            depending_on("api", &["serde"]),
            depending_on("reconcilers", &["driver", "api"]),
            depending_on("driver", &["api"]),
            depending_on("permits", &[]),
        ];
        let order: Vec<String> = dependencies_first(packages)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(order, ["api", "driver", "reconcilers", "core", "permits"]);
    }

    #[test]
    fn the_resolver_is_read_from_the_workspace_table_only() {
        assert_eq!(workspace_resolver(MANIFEST).as_deref(), Some("3"));
        assert_eq!(
            workspace_resolver("[package]\nresolver = \"2\"\n[workspace]\n"),
            None
        );
    }

    #[test]
    fn every_profile_table_is_kept_and_nothing_else() {
        assert_eq!(
            profile_sections(MANIFEST),
            "[profile.dev]\ndebug = \"line-tables-only\"\n\n\
             [profile.dev.package.\"*\"]\ndebug = false\n\n\
             [profile.release]\nlto = \"fat\"\n"
        );
    }

    #[test]
    fn the_packages_workspace_patches_each_sibling_to_its_package() {
        let packages = [package("mcm-api", None), package("mcm-core", None)];
        let m = packages_workspace(&packages, MANIFEST);
        assert!(m.contains("[workspace]\nresolver = \"3\"\n"), "{m}");
        assert!(
            m.contains("members = [\n    \"mcm-api-0.1.0\",\n    \"mcm-core-0.1.0\",\n]"),
            "{m}"
        );
        assert!(
            m.contains(
                "[patch.crates-io]\nmcm-api = { path = \"mcm-api-0.1.0\" }\n\
                 mcm-core = { path = \"mcm-core-0.1.0\" }\n"
            ),
            "{m}"
        );
        assert!(m.contains("[profile.release]\nlto = \"fat\"\n"), "{m}");
        assert!(
            !m.contains("x = { path"),
            "the repository's own patches stay out: {m}"
        );
    }

    #[test]
    fn a_package_with_publish_false_is_not_published() {
        let meta: Metadata = serde_json::from_str(
            r#"{"packages": [
                {"name": "a", "version": "0.1.0", "publish": null},
                {"name": "b", "version": "0.1.0", "publish": []},
                {"name": "c", "version": "0.1.0", "publish": ["crates-io"]}
            ]}"#,
        )
        .unwrap();
        let names: Vec<String> = meta
            .packages
            .into_iter()
            .filter(is_publishable)
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["a", "c"]);
    }
}
