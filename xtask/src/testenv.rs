//! `cargo xtask testenv`: builds etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and the kubelet from their Go modules into the cache `mcm-testenv` looks in.
//!
//! `k8s.io/kubernetes` pins its staging modules (`k8s.io/api`, `k8s.io/client-go`, ...) at
//! `v0.0.0` with `replace` directives into its own `staging/` tree, so `go install
//! k8s.io/kubernetes/cmd/kube-apiserver@v1.x` fails. We generate a small wrapper module that
//! requires `k8s.io/kubernetes` and re-points each of those replace directives at the published
//! module of the matching version (`v0.<minor>.<patch>`). etcd's server module does the same with
//! relative paths (`../api`), which we re-point at the published modules of the same release.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use mcm_testenv::binaries::{
    self, Binary, ETCD_VERSION, KUBERNETES_VERSION, KWOK_STAGES_FILE, KWOK_VERSION,
};

/// Runs the command: builds what is missing (the control plane and kwok, which the tests
/// need), then reports where the binaries are.
pub fn run(print_env: bool, force: bool) -> Result<()> {
    let bin_dir = ensure_control_plane(force)?;
    let kwok_dir = ensure_kwok(force)?;
    if print_env {
        println!("KUBEBUILDER_ASSETS={}", bin_dir.display());
        println!("{}={}", binaries::KWOK_ENV, kwok_dir.display());
    } else {
        eprintln!("control-plane binaries in {}", bin_dir.display());
        eprintln!("kwok in {}", kwok_dir.display());
    }
    Ok(())
}

/// Builds the control plane into the cache unless it is there (or `force`); returns its
/// directory. The demo and the e2e scenarios need only this, not kwok.
pub fn ensure_control_plane(force: bool) -> Result<PathBuf> {
    let bin_dir = binaries::cache_bin_dir()?;
    let stamp = bin_dir.join(".complete");
    let complete = stamp.is_file()
        && Binary::ALL
            .iter()
            .all(|b| bin_dir.join(b.file_name()).is_file());
    if !complete || force {
        let began = Instant::now();
        build_all(&bin_dir)?;
        std::fs::write(&stamp, format!("{KUBERNETES_VERSION} {ETCD_VERSION}\n"))?;
        eprintln!(
            "built the control plane ({KUBERNETES_VERSION}, etcd {ETCD_VERSION}) in {:.0?}",
            began.elapsed()
        );
    }
    Ok(bin_dir)
}

/// Builds kwok into the cache unless it is there (or `force`); returns its directory.
pub fn ensure_kwok(force: bool) -> Result<PathBuf> {
    let kwok_dir = binaries::kwok_cache_dir()?;
    let kwok_stamp = kwok_dir.join(".complete");
    if force || !kwok_stamp.is_file() || binaries::find_kwok_dir().is_err() {
        let began = Instant::now();
        build_kwok(&kwok_dir)?;
        std::fs::write(&kwok_stamp, format!("{KWOK_VERSION}\n"))?;
        eprintln!("built kwok {KWOK_VERSION} in {:.0?}", began.elapsed());
    }
    Ok(kwok_dir)
}

/// The stages of kwok's own module that the kwok controller runs with: a Node becomes Ready
/// at once and heartbeats its Lease (as a kubelet with leases does), Pods become Ready, Jobs'
/// Pods complete, and deleted Pods go away.
const KWOK_STAGES: [&str; 5] = [
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
];

/// Builds `sigs.k8s.io/kwok/cmd/kwok` (its module has no local replace directives, so a plain
/// wrapper module does) into `dir`, and writes `dir/stages.yaml` from the stage files of
/// the same module version.
fn build_kwok(dir: &Path) -> Result<()> {
    let work = dir.join("src");
    wrapper_module(
        &work,
        "mcm-rs.local/testenv-kwok",
        "sigs.k8s.io/kwok",
        KWOK_VERSION,
        &["sigs.k8s.io/kwok/cmd/kwok"],
        |_| KWOK_VERSION.to_string(),
    )?;
    align_with_control_plane(&work, "kwok")?;
    go_build(&work, dir, "-s -w", &["sigs.k8s.io/kwok/cmd/kwok"])?;
    let module = go_output(&work, &["list", "-m", "-json", "sigs.k8s.io/kwok"])?;
    let module: serde_json::Value = serde_json::from_str(&module)
        .with_context(|| format!("unexpected output of go list -m: {module}"))?;
    let module_dir = PathBuf::from(
        module["Dir"]
            .as_str()
            .context("go list -m reported no directory for sigs.k8s.io/kwok")?,
    );
    let mut stages = String::new();
    for file in KWOK_STAGES {
        let path = module_dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading kwok's stage {}", path.display()))?;
        stages.push_str("---\n");
        stages.push_str(&text);
        if !text.ends_with('\n') {
            stages.push('\n');
        }
    }
    std::fs::write(dir.join(KWOK_STAGES_FILE), stages)?;
    Ok(())
}

/// A module as a build uses it: the module it comes from (itself, or what a `replace`
/// directive points at) and that module's version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Source {
    path: String,
    version: String,
}

/// Every module of the build list of the module in `dir` (`go list -m all`) but the main one.
fn build_list(dir: &Path) -> Result<BTreeMap<String, Source>> {
    let out = go_output(
        dir,
        &[
            "list",
            "-m",
            "-f",
            "{{.Path}} {{with .Replace}}{{.Path}} {{.Version}}{{else}}{{.Path}} {{.Version}}{{end}}",
            "all",
        ],
    )?;
    Ok(parse_build_list(&out))
}

fn parse_build_list(text: &str) -> BTreeMap<String, Source> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (module, path, version) = (w.next()?, w.next()?, w.next()?);
            Some((
                module.to_string(),
                Source {
                    path: path.to_string(),
                    version: version.to_string(),
                },
            ))
        })
        .collect()
}

/// The modules both builds use at different versions, each with the control plane's.
fn pins(
    control_plane: &BTreeMap<String, Source>,
    kwok: &BTreeMap<String, Source>,
) -> Vec<(String, Source)> {
    kwok.iter()
        .filter_map(|(module, own)| {
            let theirs = control_plane.get(module)?;
            (theirs != own).then(|| (module.clone(), theirs.clone()))
        })
        .collect()
}

/// Pins, in the wrapper module in `dir` (kwok's, helm's), every module the control plane's
/// build also uses to the version that build has (for kwok: client-go v0.36.3 for its v0.36.1,
/// golang.org/x/sys v0.40.0 for its v0.46.0, ...). Go's build cache then holds the packages
/// the two share (client-go, apimachinery, grpc, ...) from the control plane's build, instead
/// of compiling other versions of them. The versions are those of fixed releases, so the
/// result is the same on every machine that built the control plane first (as `cargo xtask
/// testenv` and CI do); without that build, `what` is built with its own versions.
pub(crate) fn align_with_control_plane(dir: &Path, what: &str) -> Result<()> {
    let kube = binaries::cache_bin_dir()?
        .parent()
        .context("the cache bin dir has no parent")?
        .join("src")
        .join("kubernetes");
    if !kube.join("go.mod").is_file() {
        eprintln!(
            "no control-plane build in {}: {what} is built with its own module versions",
            kube.display()
        );
        return Ok(());
    }
    let pinned = pins(&build_list(&kube)?, &build_list(dir)?);
    if pinned.is_empty() {
        return Ok(());
    }
    let mut go_mod = std::fs::read_to_string(dir.join("go.mod"))?;
    go_mod.push_str("\n// The control plane's versions (cargo xtask testenv): its build's packages serve kwok.\nreplace (\n");
    for (module, source) in &pinned {
        go_mod.push_str(&format!(
            "\t{module} => {} {}\n",
            source.path, source.version
        ));
    }
    go_mod.push_str(")\n");
    std::fs::write(dir.join("go.mod"), go_mod)?;
    // No `go mod tidy`: it resolves the imports of every package's tests too, and some of
    // those (helm's registry tests) need newer versions than the pins; the build resolves
    // only what it compiles (GOFLAGS=-mod=mod).
    eprintln!(
        "{what}: {} modules pinned to the control plane's versions, to share its compiled packages",
        pinned.len()
    );
    Ok(())
}

fn build_all(bin_dir: &Path) -> Result<()> {
    let work = bin_dir
        .parent()
        .context("the cache bin dir has no parent")?
        .join("src");
    std::fs::create_dir_all(bin_dir)?;

    let kube = work.join("kubernetes");
    let kube_minor_patch = KUBERNETES_VERSION
        .strip_prefix("v1.")
        .context("KUBERNETES_VERSION must look like v1.<minor>.<patch>")?;
    let staging_version = format!("v0.{kube_minor_patch}");
    wrapper_module(
        &kube,
        "mcm-rs.local/testenv-kubernetes",
        "k8s.io/kubernetes",
        KUBERNETES_VERSION,
        &[
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubelet",
        ],
        |_| staging_version.clone(),
    )?;
    let mut ldflags = vec!["-s".to_string(), "-w".to_string()];
    let minor = kube_minor_patch
        .split('.')
        .next()
        .context("no minor version")?;
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (var, value) in [
            ("gitVersion", KUBERNETES_VERSION),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            ldflags.push(format!("-X={pkg}.{var}={value}"));
        }
    }
    go_build(
        &kube,
        bin_dir,
        &ldflags.join(" "),
        &[
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubelet",
        ],
    )?;

    let etcd = work.join("etcd");
    wrapper_module(
        &etcd,
        "mcm-rs.local/testenv-etcd",
        "go.etcd.io/etcd/server/v3",
        ETCD_VERSION,
        &["go.etcd.io/etcd/server/v3"],
        |_| ETCD_VERSION.to_string(),
    )?;
    let tmp_out = etcd.join("out");
    std::fs::create_dir_all(&tmp_out)?;
    go_build(&etcd, &tmp_out, "-s -w", &["go.etcd.io/etcd/server/v3"])?;
    // The main package of the server module is named after its directory ("v3").
    let built = ["v3", "server", "etcd"]
        .iter()
        .map(|n| tmp_out.join(n))
        .find(|p| p.is_file())
        .context("go build of go.etcd.io/etcd/server/v3 produced no binary")?;
    std::fs::rename(&built, bin_dir.join("etcd"))?;
    Ok(())
}

/// Writes `dir/go.mod` requiring `module@version`, with the local-path replace directives of
/// that module's own go.mod re-pointed at published versions, plus a `tools.go` importing
/// `packages`, then resolves the module graph. Returns the upstream go.mod.
pub(crate) fn wrapper_module(
    dir: &Path,
    name: &str,
    module: &str,
    version: &str,
    packages: &[&str],
    published_version: impl Fn(&str) -> String,
) -> Result<String> {
    std::fs::create_dir_all(dir)?;
    let upstream_mod = download_go_mod(dir, module, version)?;
    let replaces = local_replaces(&upstream_mod);
    if replaces.is_empty() && module == "k8s.io/kubernetes" {
        bail!("found no staging replace directives in {module}@{version}'s go.mod");
    }
    let mut go_mod = format!(
        "module {name}\n\ngo {}\n\nrequire {module} {version}\n",
        go_directive(&upstream_mod)
    );
    if !replaces.is_empty() {
        go_mod.push_str("\nreplace (\n");
        for m in &replaces {
            go_mod.push_str(&format!("\t{m} => {m} {}\n", published_version(m)));
        }
        go_mod.push_str(")\n");
    }
    std::fs::write(dir.join("go.mod"), go_mod)?;
    let _ = std::fs::remove_file(dir.join("go.sum"));
    let mut tools = String::from("//go:build tools\n\npackage tools\n\nimport (\n");
    for p in packages {
        tools.push_str(&format!("\t_ \"{p}\"\n"));
    }
    tools.push_str(")\n");
    std::fs::write(dir.join("tools.go"), tools)?;
    go(dir, &["mod", "tidy"])?;
    Ok(upstream_mod)
}

/// The `go` directive of an upstream go.mod (the wrapper needs at least that language version).
fn go_directive(go_mod: &str) -> String {
    go_mod
        .lines()
        .find_map(|l| l.strip_prefix("go ").map(|v| v.trim().to_string()))
        .unwrap_or_else(|| "1.22".to_string())
}

/// Modules a go.mod replaces with a local path (`=> ./staging/...` or `=> ../api`).
fn local_replaces(go_mod: &str) -> Vec<String> {
    go_mod
        .lines()
        .map(|l| l.trim().trim_start_matches("replace").trim())
        .filter_map(|l| {
            let (from, to) = l.split_once("=>")?;
            let to = to.trim();
            let from = from.split_whitespace().next()?;
            let local = to.starts_with("./") || to.starts_with("../");
            (local && !to.contains("FORBIDDEN")).then(|| from.to_string())
        })
        .collect()
}

fn download_go_mod(dir: &Path, module: &str, version: &str) -> Result<String> {
    // A throwaway module so `go mod download` has somewhere to run.
    std::fs::write(
        dir.join("go.mod"),
        "module mcm-rs.local/download\n\ngo 1.22\n",
    )?;
    let out = go_output(
        dir,
        &["mod", "download", "-json", &format!("{module}@{version}")],
    )?;
    let info: serde_json::Value = serde_json::from_str(&out)
        .with_context(|| format!("unexpected output of go mod download: {out}"))?;
    let path = info["GoMod"]
        .as_str()
        .with_context(|| format!("go mod download reported no GoMod for {module}@{version}"))?;
    Ok(std::fs::read_to_string(PathBuf::from(path))?)
}

/// Compiles Go packages without DWARF: the binaries are linked with `-s -w`, which drops it
/// anyway (etcd came out the same size), and a cold build of etcd took 16 % less CPU (94 s
/// against 112 s of user time).
pub(crate) const GO_NO_DWARF: &str = "-gcflags=all=-dwarf=false";

pub(crate) fn go_build(dir: &Path, out: &Path, ldflags: &str, packages: &[&str]) -> Result<()> {
    let mut args = vec![
        "build".to_string(),
        "-trimpath".to_string(),
        GO_NO_DWARF.to_string(),
        format!("-ldflags={ldflags}"),
        "-o".to_string(),
        format!("{}/", out.display()),
    ];
    args.extend(packages.iter().map(|p| p.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    eprintln!(
        "go build {} (this takes several minutes on a cold cache)",
        packages.join(" ")
    );
    go(dir, &args)
}

/// The Go garbage collector's settings for the compiler and linker processes a build starts,
/// unless the environment sets its own: no collection until a process's heap reaches
/// [`GO_MEMORY_LIMIT`]. A cold build of kube-apiserver took 16 % less CPU with them (537 s
/// against 641 s of user and system time); its largest process peaked at 955 MB, below the
/// limit, which keeps a build on many cores from growing without bound.
const GO_GC: &str = "off";
/// See [`GO_GC`].
const GO_MEMORY_LIMIT: &str = "2GiB";

/// `GOGC` and `GOMEMLIMIT` for a Go build: the environment's when it sets `GOGC` (a user's
/// choice wins), else [`GO_GC`] and [`GO_MEMORY_LIMIT`] (or the environment's `GOMEMLIMIT`).
fn go_gc_env(gogc: Option<&OsStr>, memory_limit: Option<&OsStr>) -> Vec<(&'static str, OsString)> {
    match gogc {
        Some(_) => Vec::new(),
        None => vec![
            ("GOGC", GO_GC.into()),
            (
                "GOMEMLIMIT",
                memory_limit.map_or_else(|| GO_MEMORY_LIMIT.into(), OsStr::to_os_string),
            ),
        ],
    }
}

fn go_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("go");
    c.args(args)
        .current_dir(dir)
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .envs(go_gc_env(
            std::env::var_os("GOGC").as_deref(),
            std::env::var_os("GOMEMLIMIT").as_deref(),
        ));
    c
}

fn go(dir: &Path, args: &[&str]) -> Result<()> {
    let status = go_command(dir, args)
        .status()
        .context("cannot run `go`: is the Go toolchain installed and on PATH?")?;
    if !status.success() {
        bail!(
            "`go {}` in {} failed with {status}",
            args.join(" "),
            dir.display()
        );
    }
    Ok(())
}

/// Runs `go <args>` in `dir` and returns its standard output (its error output in the error).
pub(crate) fn go_output(dir: &Path, args: &[&str]) -> Result<String> {
    let out = go_command(dir, args)
        .output()
        .context("cannot run `go`: is the Go toolchain installed and on PATH?")?;
    if !out.status.success() {
        bail!(
            "`go {}` failed with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_builds_collect_no_garbage_below_the_limit_unless_the_environment_says_otherwise() {
        let names = |env: Vec<(&str, OsString)>| -> Vec<(String, String)> {
            env.into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string_lossy().into_owned()))
                .collect()
        };
        assert_eq!(
            names(go_gc_env(None, None)),
            [
                ("GOGC".into(), "off".into()),
                ("GOMEMLIMIT".into(), "2GiB".into())
            ]
        );
        assert_eq!(
            names(go_gc_env(None, Some(OsStr::new("512MiB")))),
            [
                ("GOGC".into(), "off".into()),
                ("GOMEMLIMIT".into(), "512MiB".into())
            ]
        );
        // A GOGC of the user's own: Go's defaults and theirs, nothing set here.
        assert!(go_gc_env(Some(OsStr::new("100")), None).is_empty());
    }

    #[test]
    fn kwok_takes_the_control_planes_version_of_every_module_both_use() {
        let kube = parse_build_list(
            "mcm-rs.local/testenv-kubernetes mcm-rs.local/testenv-kubernetes \n\
             k8s.io/api k8s.io/api v0.36.3\n\
             golang.org/x/sys golang.org/x/sys v0.40.0\n\
             github.com/spf13/cobra github.com/spf13/cobra v1.10.0\n\
             k8s.io/kubernetes k8s.io/kubernetes v1.36.3\n",
        );
        let kwok = parse_build_list(
            "mcm-rs.local/testenv-kwok mcm-rs.local/testenv-kwok \n\
             k8s.io/api k8s.io/api v0.36.1\n\
             golang.org/x/sys golang.org/x/sys v0.46.0\n\
             github.com/spf13/cobra github.com/spf13/cobra v1.10.0\n\
             sigs.k8s.io/kwok sigs.k8s.io/kwok v0.8.0\n",
        );
        // The main modules (no version) are not in the lists.
        assert!(!kube.contains_key("mcm-rs.local/testenv-kubernetes"));
        let pinned = pins(&kube, &kwok);
        let names: Vec<(&str, &str)> = pinned
            .iter()
            .map(|(m, s)| (m.as_str(), s.version.as_str()))
            .collect();
        // Same version: nothing to pin; kwok's own modules and the control plane's others:
        // untouched.
        assert_eq!(
            names,
            [("golang.org/x/sys", "v0.40.0"), ("k8s.io/api", "v0.36.3")]
        );
    }

    #[test]
    fn local_replaces_are_found_and_forbidden_ones_skipped() {
        let go_mod = "module x\n\ngo 1.26.0\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\
                      \tk8s.io/client-go => ./staging/src/k8s.io/client-go\n)\n\
                      replace go.etcd.io/etcd/api/v3 => ../api\n\
                      replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY\n\
                      replace github.com/a/b => github.com/c/d v1.0.0\n";
        assert_eq!(
            local_replaces(go_mod),
            vec!["k8s.io/api", "k8s.io/client-go", "go.etcd.io/etcd/api/v3"]
        );
        assert_eq!(go_directive(go_mod), "1.26.0");
    }
}
