//! `cargo xtask features`: keeps the `xtask-features` crate (`xtask/features`) in step with
//! the features the workspace's test build gives its dependencies.
//!
//! Cargo resolves a dependency's features for the packages one command selects. `cargo xtask`
//! (`-p xtask`) and the debug builds of the controllers it makes for the demo, the scenarios,
//! chaos and the benchmarks (`-p xtask -p <binaries>`) enable fewer features of tokio, hyper,
//! tower, serde_json and others than the workspace's test build (`cargo test --workspace`), so
//! those crates, and every crate above them (kube, the workspace's own crates, the
//! binaries), were compiled a second and a third time in the same target directory.
//!
//! `xtask-features` is a dependency of xtask only. It enables, in those selections, exactly
//! the features the test build gives each crate that would differ, so one build of the
//! dependency tree serves all of them. The published crates do not depend on it, and neither
//! do the release builds: what they resolve is unchanged.
//!
//! Without `--write` the command fails when a selection still resolves a crate differently
//! from the test build (a dependency added or changed without `--write`); CI runs it. With
//! `--write` it regenerates the crate's manifest from scratch (and so drops entries that are
//! no longer needed).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::crds::workspace_root;
use crate::e2e::env::{BINARY_PACKAGES, cargo_command};

/// The platform the features are resolved for and the crate's dependencies apply to: CI's.
/// Elsewhere the crate has no dependencies and changes nothing.
pub const PLATFORM: &str = "x86_64-unknown-linux-gnu";

/// The crate's package name and its directory under the workspace root.
const CRATE: &str = "xtask-features";
const CRATE_DIR: &str = "xtask/features";

/// Where a crate is compiled for: the build's target, or the host (build scripts,
/// proc-macros and what they use), whose features cargo resolves apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Target,
    Host,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Target => "target",
            Side::Host => "host",
        })
    }
}

/// A package as `cargo tree` names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Package {
    name: String,
    version: String,
    /// From crates.io (`cargo tree` shows a source in parentheses for anything else: the
    /// workspace's own packages by their path).
    registry: bool,
}

impl fmt::Display for Package {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} v{}", self.name, self.version)
    }
}

/// The features of every package on each side, as one cargo command resolves them.
type Resolution = BTreeMap<(Package, Side), BTreeSet<String>>;

/// One cargo command's packages, and whether it builds targets that use dev-dependencies.
struct Selection {
    /// What it is, for messages.
    what: &'static str,
    packages: Vec<&'static str>,
    dev: bool,
}

impl Selection {
    fn args(&self) -> Vec<String> {
        let mut args = vec![
            // Not `--offline`: cargo tree reads every package's manifest, and on a fresh
            // machine a build of xtask alone has downloaded only xtask's dependencies.
            "tree".to_string(),
            "--target".to_string(),
            PLATFORM.to_string(),
            "--charset".to_string(),
            "ascii".to_string(),
            "--prefix".to_string(),
            "indent".to_string(),
            "--format".to_string(),
            "{p}|{f}".to_string(),
            "--edges".to_string(),
            if self.dev {
                "normal,build,dev"
            } else {
                "normal,build"
            }
            .to_string(),
        ];
        if self.packages.is_empty() {
            args.push("--workspace".to_string());
        }
        for p in &self.packages {
            args.push("--package".to_string());
            args.push(p.to_string());
        }
        args
    }
}

/// The test build (`cargo test --workspace`, every target): the features every other
/// selection is brought to.
fn test_build() -> Selection {
    Selection {
        what: "the workspace's test build",
        packages: Vec::new(),
        dev: true,
    }
}

/// The other debug builds in the same target directory, each with xtask in its selection.
fn xtask_builds() -> Vec<Selection> {
    let mut binaries: Vec<&'static str> = BINARY_PACKAGES.to_vec();
    binaries.push("xtask");
    vec![
        Selection {
            what: "cargo xtask",
            packages: vec!["xtask"],
            dev: false,
        },
        Selection {
            what: "the binaries of the demo, the scenarios, chaos and the benchmarks",
            packages: binaries,
            dev: false,
        },
        Selection {
            what: "the provider skeleton's demo",
            packages: vec![crate::demo::SKELETON_PACKAGE, "xtask"],
            dev: false,
        },
    ]
}

/// Runs the command: checks, or with `write` regenerates, the crate's manifest.
pub fn run(write: bool) -> Result<()> {
    let root = workspace_root();
    if write {
        return regenerate(&root);
    }
    let missing = missing_features(&root, true)?;
    if missing.is_empty() {
        println!(
            "{CRATE}: every debug build with xtask resolves its dependencies' features as the test build does"
        );
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|((p, side), f)| format!("  {p} ({side}): {}", join(f)))
        .collect();
    bail!(
        "these crates would be built a second time, with other features than the test build \
         gives them:\n{}\nrun `cargo xtask features --write` and commit {CRATE_DIR}/Cargo.toml \
         and Cargo.lock",
        list.join("\n")
    )
}

/// Writes the manifest with no entries, then adds what the selections lack until none does.
fn regenerate(root: &Path) -> Result<()> {
    let manifest = root.join(CRATE_DIR).join("Cargo.toml");
    let mut entries = Resolution::new();
    // A few rounds at most: an entry can enable an optional dependency, which then needs its
    // own entry.
    for round in 1..=6 {
        std::fs::write(&manifest, render_manifest(&entries))
            .with_context(|| format!("writing {}", manifest.display()))?;
        let missing = missing_features(root, false)?;
        if missing.is_empty() {
            println!(
                "{}: {} entries ({} rounds)",
                manifest.display(),
                entries.len(),
                round
            );
            return Ok(());
        }
        entries.extend(missing);
    }
    bail!("the entries did not settle after 6 rounds")
}

/// Every package (and side) some xtask selection resolves with other features than the test
/// build, with the test build's features.
fn missing_features(root: &Path, locked: bool) -> Result<Resolution> {
    let workspace = resolve(root, &test_build(), locked)?;
    let mut missing = Resolution::new();
    for selection in xtask_builds() {
        let resolved = resolve(root, &selection, locked)?;
        for (key, want) in differences(&workspace, &resolved)
            .with_context(|| format!("comparing {} with the test build", selection.what))?
        {
            missing.insert(key, want);
        }
    }
    Ok(missing)
}

fn resolve(root: &Path, selection: &Selection, locked: bool) -> Result<Resolution> {
    let mut args = selection.args();
    if locked {
        args.push("--locked".to_string());
    }
    let out = cargo_command()
        .current_dir(root)
        .args(&args)
        .output()
        .context("cannot run cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout).context("cargo tree printed non-UTF-8")?;
    parse_tree(&text).with_context(|| format!("reading cargo tree of {}", selection.what))
}

/// The packages `selection` resolves with other features than `workspace`, each with the
/// workspace's features.
fn differences(workspace: &Resolution, selection: &Resolution) -> Result<Resolution> {
    let mut out = Resolution::new();
    for (key, features) in selection {
        let (package, side) = key;
        let Some(want) = workspace.get(key) else {
            bail!("{package} ({side}) is not in the test build's tree");
        };
        if want == features {
            continue;
        }
        if !package.registry {
            bail!(
                "the workspace's package {package} has features {} here and {} in the test \
                 build: {CRATE} can align only crates.io packages",
                join(features),
                join(want)
            );
        }
        if let Some(extra) = features.difference(want).next() {
            bail!("{package} ({side}) has feature {extra:?}, which the test build does not enable");
        }
        out.insert(key.clone(), want.clone());
    }
    Ok(out)
}

fn join(features: &BTreeSet<String>) -> String {
    let v: Vec<&str> = features.iter().map(String::as_str).collect();
    format!("[{}]", v.join(", "))
}

/// Which dependencies of the package above a line of `cargo tree` are listed next.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Normal,
    Build,
    Dev,
}

struct Frame {
    host: bool,
    section: Section,
}

/// Reads `cargo tree --charset ascii --prefix indent --format '{p}|{f}'`: a package's side is
/// the host when it is a proc-macro, a build-dependency, or under one.
fn parse_tree(text: &str) -> Result<Resolution> {
    let mut out = Resolution::new();
    let mut stack: Vec<Frame> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            stack.clear();
            continue;
        }
        let body = line.trim_start_matches(['|', '`', '-', ' ']);
        let depth = (line.len() - body.len()) / 4;
        if let Some(header) = body.strip_prefix('[') {
            let section = match header.trim_end_matches(']') {
                "build-dependencies" => Section::Build,
                "dev-dependencies" => Section::Dev,
                "dependencies" => Section::Normal,
                other => bail!("unexpected section [{other}] in: {line}"),
            };
            let frame = stack
                .get_mut(depth)
                .with_context(|| format!("a section without a package: {line}"))?;
            frame.section = section;
            continue;
        }
        let (p, f) = body
            .split_once('|')
            .with_context(|| format!("no '|' in: {line}"))?;
        let package = parse_package(p).with_context(|| format!("in: {line}"))?;
        let proc_macro = p.contains("(proc-macro)");
        let host = match depth.checked_sub(1) {
            None => false,
            Some(parent) => {
                let parent = stack
                    .get(parent)
                    .with_context(|| format!("a package without a parent: {line}"))?;
                parent.host || parent.section == Section::Build || proc_macro
            }
        };
        stack.truncate(depth);
        stack.push(Frame {
            host,
            section: Section::Normal,
        });
        let features: BTreeSet<String> = f
            .trim()
            .trim_end_matches("(*)")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let side = if host { Side::Host } else { Side::Target };
        match out.get(&(package.clone(), side)) {
            Some(seen) if *seen != features => bail!(
                "{package} ({side}) appears with features {} and {}",
                join(seen),
                join(&features)
            ),
            Some(_) => {}
            None => {
                out.insert((package, side), features);
            }
        }
    }
    Ok(out)
}

/// `name v1.2.3`, then optionally `(proc-macro)` and a source in parentheses.
fn parse_package(p: &str) -> Result<Package> {
    let mut words = p.split_whitespace();
    let name = words.next().context("no package name")?;
    let version = words
        .next()
        .and_then(|v| v.strip_prefix('v'))
        .context("no version")?;
    let rest: Vec<&str> = words.collect();
    let registry = rest.iter().all(|w| *w == "(proc-macro)");
    Ok(Package {
        name: name.to_string(),
        version: version.to_string(),
        registry,
    })
}

/// The crate's manifest with `entries`.
fn render_manifest(entries: &Resolution) -> String {
    let mut out = String::from(
        "# Generated by `cargo xtask features --write` (xtask/src/features.rs explains why); \
         CI fails when\n# it is out of date. Do not edit by hand.\n\
         [package]\n\
         name = \"xtask-features\"\n\
         description = \"Aligns the dependency features of xtask's debug builds with the \
         workspace's test build\"\n\
         version.workspace = true\n\
         edition.workspace = true\n\
         rust-version.workspace = true\n\
         license.workspace = true\n\
         repository.workspace = true\n\
         publish = false\n\
         # Build-dependencies are resolved only for a package with a build script.\n\
         build = \"build.rs\"\n",
    );
    for (side, table) in [
        (Side::Target, "dependencies"),
        (Side::Host, "build-dependencies"),
    ] {
        let on_side: Vec<(&Package, &BTreeSet<String>)> = entries
            .iter()
            .filter(|((_, s), _)| *s == side)
            .map(|((p, _), f)| (p, f))
            .collect();
        out.push_str(&format!("\n[target.{PLATFORM}.{table}]\n"));
        for (package, features) in &on_side {
            let versions = on_side
                .iter()
                .filter(|(p, _)| p.name == package.name)
                .count();
            // Two versions of one crate need keys of their own (`rand-0_8_5`).
            let key = if versions > 1 {
                format!(
                    "{}-{} = {{ package = \"{}\", ",
                    package.name,
                    package.version.replace('.', "_"),
                    package.name
                )
            } else {
                format!("{} = {{ ", package.name)
            };
            let list: Vec<String> = features.iter().map(|f| format!("{f:?}")).collect();
            out.push_str(&format!(
                "{key}version = \"{}\", default-features = false, features = [{}] }}\n",
                package.version,
                list.join(", ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "\
xtask v0.1.0 (/w/xtask)|
|-- serde v1.0.228|default,derive,serde_derive,std
|   `-- serde_derive v1.0.228 (proc-macro)|default
|       `-- syn v2.0.119|derive,parsing
|-- tokio v1.54.1|macros,rt (*)
`-- ring v0.17.14|alloc
    [build-dependencies]
    `-- cc v1.2.0|
        `-- shlex v1.3.0|default,std
[dev-dependencies]
`-- tokio v1.54.1|macros,rt

mcm-api v0.1.0 (/w/crates/api)|
`-- serde v1.0.228|default,derive,serde_derive,std (*)
";

    fn key(name: &str, version: &str, side: Side) -> (Package, Side) {
        (
            Package {
                name: name.into(),
                version: version.into(),
                registry: true,
            },
            side,
        )
    }

    fn set(f: &[&str]) -> BTreeSet<String> {
        f.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn proc_macros_build_dependencies_and_what_they_use_are_on_the_host() {
        let r = parse_tree(TREE).unwrap();
        assert_eq!(
            r[&key("serde", "1.0.228", Side::Target)],
            set(&["default", "derive", "serde_derive", "std"])
        );
        assert_eq!(
            r[&key("serde_derive", "1.0.228", Side::Host)],
            set(&["default"])
        );
        assert_eq!(
            r[&key("syn", "2.0.119", Side::Host)],
            set(&["derive", "parsing"])
        );
        assert_eq!(r[&key("cc", "1.2.0", Side::Host)], set(&[]));
        assert_eq!(
            r[&key("shlex", "1.3.0", Side::Host)],
            set(&["default", "std"])
        );
        // A dev-dependency (the section at the root's level) is on the target again.
        assert_eq!(
            r[&key("tokio", "1.54.1", Side::Target)],
            set(&["macros", "rt"])
        );
        assert!(!r.contains_key(&key("syn", "2.0.119", Side::Target)));
        let local = r
            .keys()
            .find(|(p, _)| p.name == "mcm-api")
            .expect("the second root");
        assert!(!local.0.registry);
    }

    #[test]
    fn a_package_with_two_feature_sets_on_one_side_is_an_error() {
        let tree = "a v0.1.0 (/w/a)|\n|-- x v1.0.0|std\n`-- y v1.0.0|\n    `-- x v1.0.0|alloc\n";
        let err = parse_tree(tree).unwrap_err().to_string();
        assert!(err.contains("x v1.0.0 (target)"), "{err}");
    }

    #[test]
    fn differences_carry_the_test_builds_features() {
        let mut ws = Resolution::new();
        ws.insert(
            key("tokio", "1.54.1", Side::Target),
            set(&["rt", "test-util"]),
        );
        ws.insert(key("syn", "2.0.119", Side::Host), set(&["full"]));
        let mut sel = Resolution::new();
        sel.insert(key("tokio", "1.54.1", Side::Target), set(&["rt"]));
        sel.insert(key("syn", "2.0.119", Side::Host), set(&["full"]));
        let d = differences(&ws, &sel).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[&key("tokio", "1.54.1", Side::Target)],
            set(&["rt", "test-util"])
        );
        // A feature the test build lacks cannot be aligned by adding features.
        sel.insert(key("syn", "2.0.119", Side::Host), set(&["full", "fold"]));
        assert!(differences(&ws, &sel).is_err());
    }

    #[test]
    fn the_manifest_names_two_versions_of_a_crate_apart() {
        let mut e = Resolution::new();
        e.insert(key("rand", "0.8.5", Side::Target), set(&["std"]));
        e.insert(key("rand", "0.9.2", Side::Target), set(&["default"]));
        e.insert(key("syn", "2.0.119", Side::Host), set(&["fold"]));
        let m = render_manifest(&e);
        assert!(m.contains("rand-0_8_5 = { package = \"rand\", version = \"0.8.5\", default-features = false, features = [\"std\"] }"), "{m}");
        assert!(m.contains("rand-0_9_2 = { package = \"rand\""), "{m}");
        let host = m
            .split(&format!("[target.{PLATFORM}.build-dependencies]"))
            .nth(1)
            .unwrap();
        assert!(host.contains("syn = { version = \"2.0.119\""), "{m}");
        assert!(!host.contains("rand"), "{m}");
    }
}
