//! `cargo xtask deps`: the dependency tree without dead weight, checked in CI.
//!
//! - Every entry of the root manifest's `[workspace.dependencies]` is used by a member (what
//!   `cargo machete`, which CI runs for the members' own manifests, does not look at).
//! - Crates locked in more than one version: printed, and their number may go down but never
//!   up: it may not exceed the ceiling in [`CEILING_FILE`] (lower the ceiling when it falls).
//! - Each member's declared `rust-version` is at least the highest `rust-version` among the
//!   locked packages it builds with (its normal and build dependencies, transitively): what it
//!   declares is what its lock needs.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::crds::workspace_root;

/// The file holding the most crates that may be locked in more than one version.
pub const CEILING_FILE: &str = ".ci/duplicate-crates-ceiling";

/// Runs the three checks and fails with every problem found.
pub fn run() -> Result<()> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).context("Cargo.toml")?;
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).context("Cargo.lock")?;
    let ceiling: usize = std::fs::read_to_string(root.join(CEILING_FILE))
        .with_context(|| CEILING_FILE.to_string())?
        .trim()
        .parse()
        .with_context(|| format!("{CEILING_FILE} holds a number"))?;
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(&root)
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let metadata: Value = serde_json::from_slice(&out.stdout).context("cargo metadata JSON")?;

    let mut problems = Vec::new();
    let unused = unused_workspace_dependencies(&manifest, &metadata);
    println!(
        "workspace dependencies declared and not used by any member: {}",
        if unused.is_empty() {
            "none".to_string()
        } else {
            unused.join(", ")
        }
    );
    if !unused.is_empty() {
        problems.push(format!(
            "[workspace.dependencies] declares what no member uses: {}",
            unused.join(", ")
        ));
    }

    let duplicates = duplicates(&lock);
    println!(
        "crates locked in more than one version: {} (ceiling {ceiling})",
        duplicates.len()
    );
    for (name, versions) in &duplicates {
        println!("  {name}: {}", versions.join(", "));
    }
    if duplicates.len() > ceiling {
        problems.push(format!(
            "{} crates are locked in more than one version, more than the {ceiling} of {CEILING_FILE}: \
             align the new one (cargo tree -d -i <crate> shows who pulls each)",
            duplicates.len()
        ));
    } else if duplicates.len() < ceiling {
        println!(
            "  (fewer than the ceiling: lower {CEILING_FILE} to {})",
            duplicates.len()
        );
    }

    for RustVersion {
        member,
        declared,
        needed,
        by,
    } in rust_versions(&metadata)?
    {
        let ok = declared
            .as_deref()
            .is_some_and(|d| version_key(d) >= version_key(&needed));
        println!(
            "{member}: rust-version {} (its dependencies need {needed}: {by})",
            declared.as_deref().unwrap_or("undeclared")
        );
        if !ok {
            problems.push(format!(
                "{member} declares rust-version {} but {by} needs {needed}",
                declared.as_deref().unwrap_or("none")
            ));
        }
    }

    if problems.is_empty() {
        Ok(())
    } else {
        bail!("dependency problems:\n- {}", problems.join("\n- "))
    }
}

/// The keys of `[workspace.dependencies]` in the root manifest `text`, in order. Pure.
pub fn workspace_dependency_names(text: &str) -> Vec<String> {
    let mut inside = false;
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[workspace.dependencies]";
            continue;
        }
        if !inside || line.starts_with('#') {
            continue;
        }
        if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                names.push(key.to_string());
            }
        }
    }
    names
}

/// The workspace dependencies no member depends on (by package name or rename). Pure.
fn unused_workspace_dependencies(manifest: &str, metadata: &Value) -> Vec<String> {
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut used = BTreeSet::new();
    for p in metadata["packages"].as_array().into_iter().flatten() {
        if !p["id"].as_str().is_some_and(|id| members.contains(id)) {
            continue;
        }
        for d in p["dependencies"].as_array().into_iter().flatten() {
            for key in ["name", "rename"] {
                if let Some(n) = d[key].as_str() {
                    used.insert(n.to_string());
                }
            }
        }
    }
    workspace_dependency_names(manifest)
        .into_iter()
        .filter(|n| !used.contains(n))
        .collect()
}

/// The crates `Cargo.lock` (`lock`) holds in more than one version, with the versions. Pure.
pub fn duplicates(lock: &str) -> BTreeMap<String, Vec<String>> {
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("version = ")
            && let Some(n) = name.take()
        {
            versions
                .entry(n)
                .or_default()
                .push(v.trim_matches('"').to_string());
        }
    }
    versions.retain(|_, v| v.len() > 1);
    versions
}

/// A version as numbers, for comparing `1.94.1` with `1.94`. Pure.
fn version_key(v: &str) -> Vec<u64> {
    let mut key: Vec<u64> = v.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    while key.last() == Some(&0) {
        key.pop();
    }
    key
}

/// What a member declares and what its dependencies need.
struct RustVersion {
    member: String,
    declared: Option<String>,
    needed: String,
    /// A dependency that declares `needed`.
    by: String,
}

/// Per member: its declared rust-version, the highest its normal and build dependencies
/// (transitively) declare, and one package that declares it.
fn rust_versions(metadata: &Value) -> Result<Vec<RustVersion>> {
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata without resolve")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut out = Vec::new();
    for member in metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let mut seen = BTreeSet::new();
        let mut todo = vec![member];
        let mut needed = (String::from("0"), String::from("nothing"));
        while let Some(id) = todo.pop() {
            let Some(node) = nodes.get(id) else { continue };
            for dep in node["deps"].as_array().into_iter().flatten() {
                let normal_or_build = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].as_str() != Some("dev"));
                let Some(dep_id) = dep["pkg"].as_str() else {
                    continue;
                };
                if !normal_or_build || !seen.insert(dep_id) {
                    continue;
                }
                if let Some(p) = packages.get(dep_id)
                    && let Some(v) = p["rust_version"].as_str()
                    && version_key(v) > version_key(&needed.0)
                {
                    needed = (
                        v.to_string(),
                        format!("{} {}", p["name"].as_str().unwrap_or("?"), p["version"]),
                    );
                }
                todo.push(dep_id);
            }
        }
        let p = packages.get(member).context("a member's package")?;
        out.push(RustVersion {
            member: p["name"].as_str().unwrap_or("?").to_string(),
            declared: p["rust_version"].as_str().map(String::from),
            needed: needed.0,
            by: needed.1.replace('"', ""),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_dependencies_are_read_from_their_table_only() {
        let manifest = "[workspace]\nmembers = [\"a\"]\n\n[workspace.dependencies]\n# a comment = 1\nkube = { version = \"5\" }\nserde_json = \"1\"\n\n[profile.dev]\ndebug = \"line-tables-only\"\n";
        assert_eq!(workspace_dependency_names(manifest), ["kube", "serde_json"]);
    }

    #[test]
    fn duplicates_are_the_names_locked_twice() {
        let lock = "[[package]]\nname = \"rand\"\nversion = \"0.8.5\"\n\n[[package]]\nname = \"rand\"\nversion = \"0.9.2\"\n\n[[package]]\nname = \"serde\"\nversion = \"1.0.0\"\n";
        let d = duplicates(lock);
        assert_eq!(d.len(), 1);
        assert_eq!(d["rand"], ["0.8.5", "0.9.2"]);
    }

    #[test]
    fn versions_compare_as_numbers() {
        assert!(version_key("1.94.1") > version_key("1.94"));
        assert_eq!(version_key("1.94.0"), version_key("1.94"));
        assert!(version_key("1.100") > version_key("1.94.1"));
    }
}
