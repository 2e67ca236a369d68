//! `cargo xtask image`: OCI images of the release binaries, built without a container engine.
//!
//! Each image is `FROM scratch`: one layer holding the static (musl) binaries at `/<name>`,
//! the build host's CA bundle at `/etc/ssl/certs/ca-certificates.crt`, an `/etc/passwd` and
//! `/etc/group` with the user `nonroot` (65532), its home `/home/nonroot` and a `/tmp` with
//! mode 1777. The image runs as `65532:65532` with the first binary as its entrypoint.
//!
//! The images are written as OCI image layouts (`<out>/<image>/`: `oci-layout`, `index.json`,
//! `blobs/sha256/<hex>`; the manifest tagged with the workspace version) and as `oci-archive`
//! tarballs of the same blobs (`<out>/<image>.tar`; the manifest named `<image>:<version>`,
//! which `podman load` turns into `localhost/<image>:<version>`), to be pushed with
//! `skopeo copy` or loaded with `podman load` (see docs/operations.md).
//!
//! The layers are reproducible: entries sorted, parent directories explicit, every mtime the
//! same (`$SOURCE_DATE_EPOCH`, else 0), owners root (except the home directory), no user or
//! group names, gzip without a name and with a zero mtime. The same binaries and CA bundle
//! give the same digests.
//!
//! After writing, each layout and archive is verified from disk (every blob's digest and size,
//! the manifest and config media types, the `diff_ids`, the entrypoint being a static ELF),
//! the binaries are extracted from the layer and run with `--help`, and, when `skopeo` is on
//! the `PATH`, `skopeo inspect` reads the layout and the archive as an independent check.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use flate2::{Compression, GzBuilder, read::GzDecoder};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::crds::workspace_root;
use crate::e2e::env::{cargo_command, target_dir};

/// The Rust target the binaries are built for: static, no libc in the image.
pub const TARGET: &str = "x86_64-unknown-linux-musl";

/// `mediaType` of an OCI image index (`index.json`).
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// `mediaType` of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// `mediaType` of an OCI image config.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// `mediaType` of a gzipped layer.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation of `index.json` naming a manifest's tag.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// uid and gid of the user the images run as (`nonroot`, as in distroless images).
const NONROOT: u64 = 65532;
/// The CA bundle of the build host (Debian's `ca-certificates` package), copied into the images.
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where the CA bundle is in an image (without the leading `/`, as in the layer).
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
/// The size an image should stay under (all its blobs, compressed).
const MAX_IMAGE_BYTES: u64 = 40 << 20;

/// `/etc/passwd` of the images.
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
                      nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
/// `/etc/group` of the images.
const GROUP: &str = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n";

/// The machine-controller providers that have an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// `machine-controller-local` with `local-node` (VMs are processes in the container).
    Local,
    /// `machine-controller-aws`.
    Aws,
    /// `machine-controller-gcp`.
    Gcp,
    /// `machine-controller-azure`.
    Azure,
}

/// Arguments of `cargo xtask image`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also build the image of this provider's machine controller (the image of
    /// machine-controller-manager is always built); repeat it for several providers.
    #[arg(long, value_enum, conflicts_with = "all")]
    pub provider: Vec<Provider>,
    /// Build every image: the manager and every provider.
    #[arg(long)]
    pub all: bool,
    /// Directory for the image layouts and archives [default: target/images in the workspace].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Build the binaries in the `fast-release` profile (optimised, no LTO, larger binaries);
    /// released images use the default profile (`release`).
    #[arg(long, conflicts_with = "dev_build")]
    pub fast_build: bool,
    /// Build the binaries in the `dev` profile (unoptimised, the quickest build): for CI's
    /// check that the images build, verify and run. The size limit is not applied to it.
    #[arg(long)]
    pub dev_build: bool,
}

impl Args {
    /// The cargo profile the binaries are built in.
    fn profile(&self) -> &'static str {
        if self.dev_build {
            "dev"
        } else if self.fast_build {
            "fast-release"
        } else {
            "release"
        }
    }
}

/// The directory under `target/<triple>/` that cargo writes a profile's binaries to.
fn profile_dir(profile: &str) -> &str {
    match profile {
        "dev" => "debug",
        other => other,
    }
}

/// A binary in an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binary {
    /// The file name, in the image at `/<name>`.
    pub name: &'static str,
    /// The cargo package that builds it.
    pub package: &'static str,
    /// A flag its `--help` must mention (the smoke test).
    pub help_mentions: &'static str,
}

/// An image: its binaries (the first one is the entrypoint), what the config says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSpec {
    /// Image name, also the name of the entrypoint binary.
    pub name: &'static str,
    /// The binaries, the entrypoint first; all at `/` (the local driver finds `local-node`
    /// next to its own executable).
    pub binaries: &'static [Binary],
    /// `org.opencontainers.image.description`.
    pub description: &'static str,
    /// TCP ports in `ExposedPorts`.
    pub ports: &'static [u16],
    /// The provider, `None` for the manager.
    pub provider: Option<Provider>,
}

/// A machine controller's binary.
const fn machine_controller(name: &'static str) -> Binary {
    Binary {
        name,
        package: name,
        help_mentions: "--control-kubeconfig",
    }
}

/// The manager's image.
const MANAGER: ImageSpec = ImageSpec {
    name: "machine-controller-manager",
    binaries: &[Binary {
        name: "machine-controller-manager",
        package: "machine-controller-manager",
        help_mentions: "--control-kubeconfig",
    }],
    description: "The provider-independent half of mcm-rs: MachineSet and MachineDeployment controllers",
    ports: &[10258],
    provider: None,
};

/// Ports of a machine controller: `/metrics` `/healthz` `/readyz`, and the webhook.
const MACHINE_CONTROLLER_PORTS: &[u16] = &[10259, 9443];

/// Every image, the manager first.
pub const IMAGES: [ImageSpec; 5] = [
    MANAGER,
    ImageSpec {
        name: "machine-controller-local",
        binaries: &[
            machine_controller("machine-controller-local"),
            Binary {
                name: "local-node",
                package: "mcm-provider-local",
                help_mentions: "--kubeconfig",
            },
        ],
        description: "Machine controller of mcm-rs for the local provider (VMs are local processes)",
        ports: MACHINE_CONTROLLER_PORTS,
        provider: Some(Provider::Local),
    },
    ImageSpec {
        name: "machine-controller-aws",
        binaries: &[machine_controller("machine-controller-aws")],
        description: "Machine controller of mcm-rs for AWS (EC2)",
        ports: MACHINE_CONTROLLER_PORTS,
        provider: Some(Provider::Aws),
    },
    ImageSpec {
        name: "machine-controller-gcp",
        binaries: &[machine_controller("machine-controller-gcp")],
        description: "Machine controller of mcm-rs for GCP (Compute Engine)",
        ports: MACHINE_CONTROLLER_PORTS,
        provider: Some(Provider::Gcp),
    },
    ImageSpec {
        name: "machine-controller-azure",
        binaries: &[machine_controller("machine-controller-azure")],
        description: "Machine controller of mcm-rs for Azure",
        ports: MACHINE_CONTROLLER_PORTS,
        provider: Some(Provider::Azure),
    },
];

/// The images the arguments select: every one with `all`, else the manager and the provider's.
pub fn selected(providers: &[Provider], all: bool) -> Vec<&'static ImageSpec> {
    IMAGES
        .iter()
        .filter(|i| all || i.provider.is_none_or(|p| providers.contains(&p)))
        .collect()
}

/// What an image's numbers came out as, for the table.
struct Report {
    name: &'static str,
    build: Duration,
    binaries_bytes: u64,
    image_bytes: u64,
    manifest_digest: String,
    skopeo: String,
}

/// Runs the command: build, pack, verify, smoke-test each selected image; print the table.
pub fn run(args: &Args) -> Result<()> {
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => workspace_root().join("target").join("images"),
    };
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let ca_bundle = fs::read(HOST_CA_BUNDLE).with_context(|| {
        format!("reading the CA bundle {HOST_CA_BUNDLE} (Debian package ca-certificates)")
    })?;
    let epoch = source_date_epoch()?;
    let mut reports = Vec::new();
    let specs = selected(&args.provider, args.all);
    let profile = args.profile();
    // A dev build (CI's check that the images build, verify and run) builds every selected
    // image's packages in one cargo invocation: one feature resolution, so the workspace's
    // crates are compiled once instead of once per image. A release build keeps one
    // invocation per image, so an image's binaries do not depend on which other images were
    // selected with it (features are unified across the packages of one invocation).
    let mut shared_build = None;
    if args.dev_build {
        let began = Instant::now();
        build(&specs, profile)?;
        shared_build = Some(began.elapsed());
    }
    for spec in specs {
        let build_time = match shared_build {
            Some(took) => took,
            None => {
                let began = Instant::now();
                build(&[spec], profile)?;
                began.elapsed()
            }
        };
        let bin_dir = target_dir().join(TARGET).join(profile_dir(profile));
        let report = pack_and_check(spec, &bin_dir, &out, &ca_bundle, epoch, build_time)
            .with_context(|| format!("image {}", spec.name))?;
        reports.push(report);
    }
    print_table(&reports, &out);
    if args.dev_build {
        eprintln!(
            "unoptimised binaries (--dev-build): the {} MiB size limit is not checked",
            MAX_IMAGE_BYTES >> 20
        );
        return Ok(());
    }
    let too_big: Vec<_> = reports
        .iter()
        .filter(|r| r.image_bytes >= MAX_IMAGE_BYTES)
        .map(|r| r.name)
        .collect();
    ensure!(
        too_big.is_empty(),
        "images at or over {} MiB: {}",
        MAX_IMAGE_BYTES >> 20,
        too_big.join(", ")
    );
    Ok(())
}

/// `$SOURCE_DATE_EPOCH` (the reproducible-builds convention), else 0: the mtime of every
/// layer entry and the `created` time of the config.
fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(s) if !s.trim().is_empty() => s
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={s:?} is not a number of seconds")),
        _ => Ok(0),
    }
}

/// `cargo build --profile <profile> --locked --target <musl> -p <package>...` for the
/// binaries of `specs`.
fn build(specs: &[&ImageSpec], profile: &str) -> Result<()> {
    let mut args = vec![
        "build",
        "--profile",
        profile,
        "--locked",
        "--target",
        TARGET,
    ];
    let mut packages: Vec<&str> = Vec::new();
    for p in specs
        .iter()
        .flat_map(|s| s.binaries.iter().map(|b| b.package))
    {
        if !packages.contains(&p) {
            packages.push(p);
        }
    }
    for p in packages {
        args.extend(["-p", p]);
    }
    let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    eprintln!("building {}: cargo {}", names.join(", "), args.join(" "));
    let status = cargo_command()
        .current_dir(workspace_root())
        .args(&args)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!(
            "cargo {} failed ({status}); the target needs `rustup target add {TARGET}` and \
             ring's C code needs musl-gcc (Debian package musl-tools)",
            args.join(" ")
        );
    }
    Ok(())
}

/// Packs the built binaries of `spec` into `<out>/<name>/` and `<out>/<name>.tar`, then
/// verifies and smoke-tests the result.
fn pack_and_check(
    spec: &ImageSpec,
    bin_dir: &Path,
    out: &Path,
    ca_bundle: &[u8],
    epoch: u64,
    build: Duration,
) -> Result<Report> {
    let began = Instant::now();
    let mut binaries = Vec::new();
    for b in spec.binaries {
        let path = bin_dir.join(b.name);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        binaries.push((b.name.to_string(), bytes));
    }
    let binaries_bytes = binaries.iter().map(|(_, b)| b.len() as u64).sum();
    let layer = layer_tar(&root_filesystem(binaries, ca_bundle.to_vec()), epoch)?;
    let layout = build_layout(&image_config(spec, epoch), &layer)?;
    let dir = out.join(spec.name);
    let archive = out.join(format!("{}.tar", spec.name));
    write_layout(&layout, &dir)?;
    write_archive(&layout, &archive, epoch)?;
    eprintln!(
        "{}: wrote {} and {} in {:.1?}",
        spec.name,
        dir.display(),
        archive.display(),
        began.elapsed()
    );

    let verified = verify_layout(&dir, &version())?;
    ensure!(
        verified.manifest_digest == layout.manifest_digest,
        "the layout on disk has manifest {}, the one written was {}",
        verified.manifest_digest,
        layout.manifest_digest
    );
    let from_archive = verify_archive(&archive, &format!("{}:{}", spec.name, version()))?;
    ensure!(
        from_archive.manifest_digest == layout.manifest_digest,
        "{} has manifest {}, the layout {}",
        archive.display(),
        from_archive.manifest_digest,
        layout.manifest_digest
    );
    let entrypoint = format!("/{}", spec.binaries[0].name);
    ensure!(
        verified.entrypoint == entrypoint,
        "the config's entrypoint is {}, expected {entrypoint}",
        verified.entrypoint
    );
    smoke_run(spec, &verified.layer)?;
    let skopeo = skopeo_check(&dir, &archive, &verified)?;
    Ok(Report {
        name: spec.name,
        build,
        binaries_bytes,
        image_bytes: verified.image_bytes,
        manifest_digest: verified.manifest_digest,
        skopeo,
    })
}

/// The workspace version: the tag of every image.
fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// One entry of a layer. Paths are relative to `/` (`etc/passwd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path without a leading `/`.
    pub path: String,
    /// Permission bits (with setuid/setgid/sticky).
    pub mode: u32,
    /// Owner uid and gid.
    pub owner: u64,
    /// `None` for a directory, else the file's content.
    pub content: Option<Vec<u8>>,
}

impl Entry {
    /// A root-owned regular file.
    fn file(path: &str, mode: u32, content: Vec<u8>) -> Entry {
        Entry {
            path: path.into(),
            mode,
            owner: 0,
            content: Some(content),
        }
    }

    /// A directory.
    fn dir(path: &str, mode: u32, owner: u64) -> Entry {
        Entry {
            path: path.into(),
            mode,
            owner,
            content: None,
        }
    }
}

/// The root filesystem of an image: the binaries at `/`, the CA bundle, the users, `/tmp`.
pub fn root_filesystem(binaries: Vec<(String, Vec<u8>)>, ca_bundle: Vec<u8>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = binaries
        .into_iter()
        .map(|(name, bytes)| Entry::file(&name, 0o755, bytes))
        .collect();
    entries.extend([
        Entry::file(CA_BUNDLE, 0o644, ca_bundle),
        Entry::file("etc/passwd", 0o644, PASSWD.as_bytes().to_vec()),
        Entry::file("etc/group", 0o644, GROUP.as_bytes().to_vec()),
        Entry::dir("home/nonroot", 0o700, NONROOT),
        Entry::dir("tmp", 0o1777, 0),
    ]);
    entries
}

/// A tar of `entries`, reproducibly: sorted by path, with every parent directory (0755,
/// root), ustar headers with `mtime` and no user or group names.
pub fn layer_tar(entries: &[Entry], mtime: u64) -> Result<Vec<u8>> {
    let mut all: BTreeMap<String, &Entry> = BTreeMap::new();
    let parents: Vec<Entry> = entries
        .iter()
        .flat_map(|e| {
            let parts: Vec<&str> = e.path.split('/').collect();
            (1..parts.len())
                .map(|n| Entry::dir(&parts[..n].join("/"), 0o755, 0))
                .collect::<Vec<_>>()
        })
        .collect();
    for e in entries {
        ensure!(
            !e.path.is_empty()
                && !e.path.starts_with('/')
                && !e.path.ends_with('/')
                && !e
                    .path
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == ".."),
            "bad layer path {:?}",
            e.path
        );
        ensure!(
            all.insert(e.path.clone(), e).is_none(),
            "{} is twice in the layer",
            e.path
        );
    }
    for p in &parents {
        if let Some(existing) = all.get(&p.path) {
            ensure!(
                existing.content.is_none(),
                "{} is a file and a parent directory",
                p.path
            );
        } else {
            all.insert(p.path.clone(), p);
        }
    }
    let mut builder = tar::Builder::new(Vec::new());
    for (path, e) in all {
        let mut header = tar::Header::new_ustar();
        header.set_mode(e.mode);
        header.set_uid(e.owner);
        header.set_gid(e.owner);
        header.set_mtime(mtime);
        let data: &[u8] = match &e.content {
            Some(bytes) => {
                header.set_entry_type(tar::EntryType::Regular);
                bytes
            }
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                &[]
            }
        };
        header.set_size(data.len() as u64);
        let name = if e.content.is_none() {
            format!("{path}/")
        } else {
            path.clone()
        };
        builder
            .append_data(&mut header, &name, data)
            .with_context(|| format!("adding {name} to the layer"))?;
    }
    builder.into_inner().context("finishing the layer tar")
}

/// `bytes` gzipped with a fixed header: no file name, mtime 0, OS "unknown" (255).
pub fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), Compression::best());
    encoder.write_all(bytes).context("gzip")?;
    encoder.finish().context("gzip")
}

/// The OCI digest (`sha256:<hex>`) of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// What goes into an image config besides the layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageConfig {
    /// Image name (`org.opencontainers.image.title`).
    pub name: String,
    /// The tag (`org.opencontainers.image.version`, the `ref.name` in `index.json`).
    pub version: String,
    /// `org.opencontainers.image.description`.
    pub description: String,
    /// `org.opencontainers.image.source`.
    pub source: String,
    /// `org.opencontainers.image.licenses`.
    pub licenses: String,
    /// The entrypoint, an absolute path in the image.
    pub entrypoint: String,
    /// TCP ports in `ExposedPorts`.
    pub ports: Vec<u16>,
    /// `created` and `history[].created`, seconds since the epoch.
    pub created: u64,
}

/// The config of `spec`'s image, with the workspace version, license and repository.
fn image_config(spec: &ImageSpec, created: u64) -> ImageConfig {
    ImageConfig {
        name: spec.name.into(),
        version: version(),
        description: spec.description.into(),
        source: env!("CARGO_PKG_REPOSITORY").into(),
        licenses: env!("CARGO_PKG_LICENSE").into(),
        entrypoint: format!("/{}", spec.binaries[0].name),
        ports: spec.ports.to_vec(),
        created,
    }
}

/// An image layout in memory: the blobs by digest and `index.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Every blob (layer, config, manifest) by digest.
    pub blobs: BTreeMap<String, Vec<u8>>,
    /// The content of `index.json` in the layout directory: the manifest tagged with the
    /// version alone (`oci:<dir>:<version>`).
    pub index: Vec<u8>,
    /// The content of `index.json` in the `oci-archive`: the manifest named `<name>:<version>`,
    /// the name `podman load` gives the image (`localhost/<name>:<version>`; with the bare
    /// version it would be `localhost/<version>:latest`).
    pub archive_index: Vec<u8>,
    /// Digest of the manifest.
    pub manifest_digest: String,
}

/// A descriptor (`mediaType`, `digest`, `size`) of `bytes`.
fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({ "mediaType": media_type, "digest": digest(bytes), "size": bytes.len() })
}

/// RFC 3339 of `seconds` since the epoch.
fn rfc3339(seconds: u64) -> Result<String> {
    let seconds = i64::try_from(seconds).context("timestamp out of range")?;
    Ok(jiff::Timestamp::from_second(seconds)
        .context("timestamp out of range")?
        .to_string())
}

/// The layout of a single-layer image: `layer_tar` gzipped, its config, manifest and index.
pub fn build_layout(config: &ImageConfig, layer_tar: &[u8]) -> Result<Layout> {
    let layer = gzip(layer_tar)?;
    let created = rfc3339(config.created)?;
    let labels = json!({
        "org.opencontainers.image.title": config.name,
        "org.opencontainers.image.description": config.description,
        "org.opencontainers.image.licenses": config.licenses,
        "org.opencontainers.image.source": config.source,
        "org.opencontainers.image.version": config.version,
    });
    let exposed: serde_json::Map<String, Value> = config
        .ports
        .iter()
        .map(|p| (format!("{p}/tcp"), json!({})))
        .collect();
    let config_json = json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": format!("{NONROOT}:{NONROOT}"),
            "ExposedPorts": exposed,
            "Env": [format!("SSL_CERT_FILE=/{CA_BUNDLE}")],
            "Entrypoint": [config.entrypoint],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": { "type": "layers", "diff_ids": [digest(layer_tar)] },
        "history": [{ "created": created, "created_by": "cargo xtask image" }],
    });
    let config_bytes = serde_json::to_vec(&config_json)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor(CONFIG_MEDIA_TYPE, &config_bytes),
        "layers": [descriptor(LAYER_MEDIA_TYPE, &layer)],
        "annotations": labels,
    });
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let index = |ref_name: &str| {
        let mut manifest_descriptor = descriptor(MANIFEST_MEDIA_TYPE, &manifest_bytes);
        manifest_descriptor["annotations"] = json!({ REF_NAME_ANNOTATION: ref_name });
        manifest_descriptor["platform"] = json!({ "architecture": "amd64", "os": "linux" });
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [manifest_descriptor],
        }))
    };
    let layout_index = index(&config.version)?;
    let archive_index = index(&format!("{}:{}", config.name, config.version))?;
    let manifest_digest = digest(&manifest_bytes);
    let blobs = [layer, config_bytes, manifest_bytes]
        .into_iter()
        .map(|b| (digest(&b), b))
        .collect();
    Ok(Layout {
        blobs,
        index: layout_index,
        archive_index,
        manifest_digest,
    })
}

/// `oci-layout` of every layout.
const OCI_LAYOUT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// The files of a layout with `index` as `index.json`, paths relative to its directory.
fn layout_files(layout: &Layout, index: &[u8]) -> Vec<Entry> {
    let mut files = vec![
        Entry::file("oci-layout", 0o644, OCI_LAYOUT.as_bytes().to_vec()),
        Entry::file("index.json", 0o644, index.to_vec()),
    ];
    for (digest, bytes) in &layout.blobs {
        let hex = digest.trim_start_matches("sha256:");
        files.push(Entry::file(
            &format!("blobs/sha256/{hex}"),
            0o644,
            bytes.clone(),
        ));
    }
    files
}

/// Writes `layout` into `dir`, replacing a layout there (and refusing to replace anything
/// else).
pub fn write_layout(layout: &Layout, dir: &Path) -> Result<()> {
    if dir.exists() {
        ensure!(
            dir.join("oci-layout").is_file(),
            "{} exists and is not an image layout; not replacing it",
            dir.display()
        );
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    for f in layout_files(layout, &layout.index) {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let content = f.content.as_deref().unwrap_or_default();
        fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes `layout` as an `oci-archive` (a tar of a layout directory, with
/// [`Layout::archive_index`]) to `path`.
pub fn write_archive(layout: &Layout, path: &Path, mtime: u64) -> Result<()> {
    let tar = layer_tar(&layout_files(layout, &layout.archive_index), mtime)?;
    fs::write(path, tar).with_context(|| format!("writing {}", path.display()))
}

/// A layout read back and checked.
#[derive(Debug, Clone)]
pub struct Verified {
    /// Digest of the manifest `index.json` names.
    pub manifest_digest: String,
    /// Digest of the config.
    pub config_digest: String,
    /// The (single) layer, uncompressed.
    pub layer: Vec<u8>,
    /// The size of every blob of the image (manifest, config, layer).
    pub image_bytes: u64,
    /// The entrypoint (`/<name>`).
    pub entrypoint: String,
}

/// Reads the blob `descriptor` names from `dir`, checking its digest and size.
fn read_blob(dir: &Path, descriptor: &Value) -> Result<Vec<u8>> {
    let digest_field = descriptor["digest"]
        .as_str()
        .context("descriptor without digest")?;
    let hex = digest_field
        .strip_prefix("sha256:")
        .with_context(|| format!("{digest_field}: not a sha256 digest"))?;
    ensure!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{digest_field}: malformed digest"
    );
    let size = descriptor["size"]
        .as_u64()
        .with_context(|| format!("descriptor of {digest_field} without size"))?;
    let path = dir.join("blobs").join("sha256").join(hex);
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.len() as u64 == size,
        "blob {digest_field}: {} bytes, the descriptor says {size}",
        bytes.len()
    );
    let actual = digest(&bytes);
    ensure!(
        actual == digest_field,
        "blob {digest_field} has digest {actual}"
    );
    Ok(bytes)
}

/// Checks that `value[field]` is `expected`.
fn expect_str(value: &Value, field: &str, expected: &str, what: &str) -> Result<()> {
    let actual = value[field].as_str();
    ensure!(
        actual == Some(expected),
        "{what}: {field} is {actual:?}, expected {expected:?}"
    );
    Ok(())
}

/// Reads the image tagged `tag` from the layout in `dir` and checks it: every blob's name is
/// its digest, descriptors' digests and sizes match, media types, `diff_ids` (sha256 of the
/// uncompressed layers), a static ELF entrypoint, `/tmp` with mode 1777, the CA bundle and
/// the `nonroot` user.
pub fn verify_layout(dir: &Path, tag: &str) -> Result<Verified> {
    let oci_layout: Value =
        serde_json::from_slice(&fs::read(dir.join("oci-layout")).context("reading oci-layout")?)
            .context("parsing oci-layout")?;
    expect_str(&oci_layout, "imageLayoutVersion", "1.0.0", "oci-layout")?;
    let blob_dir = dir.join("blobs").join("sha256");
    for f in fs::read_dir(&blob_dir).with_context(|| format!("listing {}", blob_dir.display()))? {
        let f = f?;
        let name = f.file_name().to_string_lossy().into_owned();
        let actual = digest(&fs::read(f.path())?);
        ensure!(
            actual == format!("sha256:{name}"),
            "blob {name} has digest {actual}"
        );
    }

    let index: Value =
        serde_json::from_slice(&fs::read(dir.join("index.json")).context("reading index.json")?)
            .context("parsing index.json")?;
    ensure!(
        index["schemaVersion"] == 2,
        "index.json: schemaVersion is not 2"
    );
    let manifests = index["manifests"]
        .as_array()
        .context("index.json without manifests")?;
    let tagged: Vec<&Value> = manifests
        .iter()
        .filter(|m| m["annotations"][REF_NAME_ANNOTATION] == tag)
        .collect();
    let [manifest_descriptor] = tagged[..] else {
        bail!(
            "index.json: {} manifests tagged {tag:?}, expected 1",
            tagged.len()
        );
    };
    expect_str(
        manifest_descriptor,
        "mediaType",
        MANIFEST_MEDIA_TYPE,
        "index.json",
    )?;
    let manifest_bytes = read_blob(dir, manifest_descriptor)?;
    let manifest: Value =
        serde_json::from_slice(&manifest_bytes).context("parsing the manifest")?;
    ensure!(
        manifest["schemaVersion"] == 2,
        "manifest: schemaVersion is not 2"
    );
    expect_str(&manifest, "mediaType", MANIFEST_MEDIA_TYPE, "manifest")?;
    expect_str(
        &manifest["config"],
        "mediaType",
        CONFIG_MEDIA_TYPE,
        "manifest config",
    )?;
    let config_bytes = read_blob(dir, &manifest["config"])?;
    let config: Value = serde_json::from_slice(&config_bytes).context("parsing the config")?;
    expect_str(&config, "os", "linux", "config")?;
    expect_str(&config, "architecture", "amd64", "config")?;
    expect_str(&config["rootfs"], "type", "layers", "config rootfs")?;
    let layers = manifest["layers"]
        .as_array()
        .context("manifest without layers")?;
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .context("config without diff_ids")?;
    let [layer_descriptor] = &layers[..] else {
        bail!("manifest: {} layers, expected 1", layers.len());
    };
    ensure!(
        diff_ids.len() == 1,
        "config: {} diff_ids for 1 layer",
        diff_ids.len()
    );
    expect_str(layer_descriptor, "mediaType", LAYER_MEDIA_TYPE, "layer")?;
    let compressed = read_blob(dir, layer_descriptor)?;
    let mut layer = Vec::new();
    GzDecoder::new(&compressed[..])
        .read_to_end(&mut layer)
        .context("gunzipping the layer")?;
    let diff_id = digest(&layer);
    ensure!(
        diff_ids[0] == diff_id.as_str(),
        "config: diff_id {} but the uncompressed layer is {diff_id}",
        diff_ids[0]
    );

    let entrypoint = match config["config"]["Entrypoint"].as_array().map(Vec::as_slice) {
        Some([Value::String(e)]) => e.clone(),
        other => bail!("config: Entrypoint is {other:?}, expected one path"),
    };
    expect_str(&config["config"], "User", "65532:65532", "config")?;
    let files = layer_entries(&layer)?;
    let (mode, binary) = files
        .get(entrypoint.trim_start_matches('/'))
        .with_context(|| format!("the entrypoint {entrypoint} is not in the layer"))?;
    let binary = binary
        .as_ref()
        .with_context(|| format!("the entrypoint {entrypoint} is a directory"))?;
    ensure!(
        mode & 0o111 == 0o111,
        "the entrypoint {entrypoint} has mode {mode:o}"
    );
    check_static_elf(binary).with_context(|| format!("the entrypoint {entrypoint}"))?;
    match files.get("tmp") {
        Some((0o1777, None)) => {}
        other => bail!(
            "/tmp is {:?}, expected a directory with mode 1777",
            other.map(|(m, c)| (format!("{m:o}"), c.is_some()))
        ),
    }
    ensure!(
        matches!(files.get(CA_BUNDLE), Some((_, Some(c))) if !c.is_empty()),
        "/{CA_BUNDLE} is missing or empty"
    );
    ensure!(
        matches!(files.get("etc/passwd"), Some((_, Some(c))) if String::from_utf8_lossy(c).contains("nonroot:x:65532:65532:")),
        "/etc/passwd lacks the user nonroot (65532)"
    );
    let image_bytes = (manifest_bytes.len() + config_bytes.len() + compressed.len()) as u64;
    Ok(Verified {
        manifest_digest: digest(&manifest_bytes),
        config_digest: digest(&config_bytes),
        layer,
        image_bytes,
        entrypoint,
    })
}

/// Unpacks the `oci-archive` at `path` into a temporary directory and verifies it as a
/// layout ([`verify_layout`]) with the manifest named `ref_name`.
pub fn verify_archive(path: &Path, ref_name: &str) -> Result<Verified> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    for (name, (_, content)) in layer_entries(&bytes)? {
        ensure!(
            !name.split('/').any(|c| c == ".."),
            "{}: entry {name} leaves the directory",
            path.display()
        );
        let dest = dir.path().join(&name);
        match content {
            None => fs::create_dir_all(&dest),
            Some(content) => fs::write(&dest, content),
        }
        .with_context(|| format!("unpacking {name} of {}", path.display()))?;
    }
    verify_layout(dir.path(), ref_name).with_context(|| format!("the archive {}", path.display()))
}

/// The entries of a tar: path (without `/`, `./` or a trailing `/`) to mode and content
/// (`None`: a directory).
#[allow(clippy::type_complexity)]
fn layer_entries(tar_bytes: &[u8]) -> Result<BTreeMap<String, (u32, Option<Vec<u8>>)>> {
    let mut entries = BTreeMap::new();
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().context("reading the layer")? {
        let mut entry = entry.context("reading the layer")?;
        let path = entry.path()?.to_string_lossy().into_owned();
        let path = path
            .trim_start_matches("./")
            .trim_start_matches('/')
            .trim_end_matches('/')
            .to_string();
        let mode = entry.header().mode()?;
        let content = match entry.header().entry_type() {
            tar::EntryType::Directory => None,
            tar::EntryType::Regular => {
                let mut bytes = Vec::new();
                entry
                    .read_to_end(&mut bytes)
                    .with_context(|| format!("reading {path} from the layer"))?;
                Some(bytes)
            }
            other => bail!("{path}: unexpected entry type {other:?}"),
        };
        entries.insert(path, (mode, content));
    }
    Ok(entries)
}

/// `PT_INTERP`: the program header naming the dynamic loader.
const PT_INTERP: u32 = 3;

/// Checks that `bytes` is an x86-64 ELF executable without a dynamic loader (`PT_INTERP`), so
/// that it runs in an image without a libc.
pub fn check_static_elf(bytes: &[u8]) -> Result<()> {
    let u16_at = |at: usize| -> Result<u16> {
        let b = bytes.get(at..at + 2).context("truncated ELF file")?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| -> Result<u32> {
        let b = bytes.get(at..at + 4).context("truncated ELF file")?;
        Ok(u32::from_le_bytes(b.try_into()?))
    };
    let u64_at = |at: usize| -> Result<u64> {
        let b = bytes.get(at..at + 8).context("truncated ELF file")?;
        Ok(u64::from_le_bytes(b.try_into()?))
    };
    ensure!(bytes.starts_with(b"\x7fELF"), "not an ELF file");
    ensure!(
        bytes.get(4) == Some(&2) && bytes.get(5) == Some(&1),
        "not a 64-bit little-endian ELF file"
    );
    let kind = u16_at(0x10)?;
    ensure!(
        kind == 2 || kind == 3,
        "ELF type {kind} is not an executable"
    );
    let machine = u16_at(0x12)?;
    ensure!(machine == 0x3e, "ELF machine {machine:#x} is not x86-64");
    let phoff = usize::try_from(u64_at(0x20)?)?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    ensure!(
        phentsize >= 56,
        "ELF program header size {phentsize} is too small"
    );
    ensure!(phnum > 0, "ELF file without program headers");
    ensure!(
        phoff
            .checked_add(phnum * phentsize)
            .is_some_and(|end| end <= bytes.len()),
        "truncated ELF file: program headers past the end"
    );
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        if u32_at(at)? == PT_INTERP {
            let offset = usize::try_from(u64_at(at + 8)?)?;
            let size = usize::try_from(u64_at(at + 32)?)?;
            let interp = bytes
                .get(offset..offset + size)
                .map(|b| {
                    String::from_utf8_lossy(b)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default();
            bail!("dynamically linked (PT_INTERP {interp:?}): it needs a libc the image lacks");
        }
    }
    Ok(())
}

/// Extracts the binaries of `spec` from the layer into a temporary directory (side by side,
/// as in the image) and runs each with `--help` and an empty environment: it must exit 0 and
/// mention its flag.
fn smoke_run(spec: &ImageSpec, layer: &[u8]) -> Result<()> {
    let files = layer_entries(layer)?;
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    for b in spec.binaries {
        let Some((_, Some(bytes))) = files.get(b.name) else {
            bail!("/{} is not a file in the layer", b.name);
        };
        check_static_elf(bytes).with_context(|| format!("/{}", b.name))?;
        let path = dir.path().join(b.name);
        fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    }
    for b in spec.binaries {
        let output = Command::new(dir.path().join(b.name))
            .arg("--help")
            .env_clear()
            .current_dir(dir.path())
            .output()
            .with_context(|| format!("running /{} --help", b.name))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(
            output.status.success(),
            "/{} --help: {}\n{stdout}{}",
            b.name,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        ensure!(
            stdout.contains(b.help_mentions),
            "/{} --help does not mention {}:\n{stdout}",
            b.name,
            b.help_mentions
        );
        eprintln!(
            "{}: /{} --help exits 0 and mentions {}",
            spec.name, b.name, b.help_mentions
        );
    }
    Ok(())
}

/// When `skopeo` is on the `PATH`: `skopeo inspect` of the layout must report the manifest
/// digest, and the raw config it reads from the archive must be the config blob. Returns what
/// to show in the table.
fn skopeo_check(dir: &Path, archive: &Path, verified: &Verified) -> Result<String> {
    if Command::new("skopeo").arg("--version").output().is_err() {
        return Ok("skipped (no skopeo)".into());
    }
    let inspect = |args: &[&str], reference: &str| -> Result<Vec<u8>> {
        let output = Command::new("skopeo")
            .arg("inspect")
            .args(args)
            .arg(reference)
            .output()
            .context("running skopeo")?;
        ensure!(
            output.status.success(),
            "skopeo inspect {} {reference}: {}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(output.stdout)
    };
    let layout_ref = format!("oci:{}:{}", dir.display(), version());
    let inspected: Value = serde_json::from_slice(&inspect(&[], &layout_ref)?)
        .with_context(|| format!("parsing skopeo inspect {layout_ref}"))?;
    ensure!(
        inspected["Digest"] == verified.manifest_digest.as_str(),
        "skopeo inspect {layout_ref}: Digest {}, expected {}",
        inspected["Digest"],
        verified.manifest_digest
    );
    let archive_ref = format!("oci-archive:{}", archive.display());
    let raw_config = inspect(&["--raw", "--config"], &archive_ref)?;
    ensure!(
        digest(&raw_config) == verified.config_digest,
        "skopeo inspect --raw --config {archive_ref}: config {}, expected {}",
        digest(&raw_config),
        verified.config_digest
    );
    Ok("ok (layout, archive)".into())
}

/// `bytes` in MiB.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// Prints one line per image: build time, sizes against the limit, digest, skopeo's verdict.
fn print_table(reports: &[Report], out: &Path) {
    println!(
        "\n{:<26} {:>6} {:>17} {:>21}  {:<71}  skopeo",
        "image",
        "build",
        "binaries (raw)",
        format!("image (gz, < {} MiB)", MAX_IMAGE_BYTES >> 20),
        "manifest"
    );
    for r in reports {
        let mark = if r.image_bytes < MAX_IMAGE_BYTES {
            ""
        } else {
            " OVER"
        };
        println!(
            "{:<26} {:>5.0}s {:>17} {:>21}  {:<71}  {}",
            r.name,
            r.build.as_secs_f64(),
            mib(r.binaries_bytes),
            format!("{}{mark}", mib(r.image_bytes)),
            r.manifest_digest,
            r.skopeo
        );
    }
    println!(
        "\nlayouts and oci-archives in {} (tag {})",
        out.display(),
        version()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal x86-64 ELF header with program headers of the given types.
    fn elf(program_types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // 64-bit
        b[5] = 1; // little-endian
        b[6] = 1;
        b[0x10..0x12].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN (static-pie)
        b[0x12..0x14].copy_from_slice(&0x3eu16.to_le_bytes());
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&(program_types.len() as u16).to_le_bytes());
        let interp = b"/lib/ld-musl-x86_64.so.1\0";
        let interp_at = 64 + 56 * program_types.len();
        for &t in program_types {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&t.to_le_bytes());
            if t == PT_INTERP {
                ph[8..16].copy_from_slice(&(interp_at as u64).to_le_bytes());
                ph[32..40].copy_from_slice(&(interp.len() as u64).to_le_bytes());
            }
            b.extend(ph);
        }
        b.extend(interp);
        b
    }

    fn config() -> ImageConfig {
        ImageConfig {
            name: "machine-controller-test".into(),
            version: "1.2.3".into(),
            description: "a test image".into(),
            source: "https://example.invalid/mcm-rs".into(),
            licenses: "Apache-2.0".into(),
            entrypoint: "/machine-controller-test".into(),
            ports: vec![10259, 9443],
            created: 0,
        }
    }

    fn layer(binary: &[u8]) -> Vec<u8> {
        let fs = root_filesystem(
            vec![("machine-controller-test".into(), binary.to_vec())],
            b"-----BEGIN CERTIFICATE-----\n".to_vec(),
        );
        layer_tar(&fs, 0).expect("layer")
    }

    fn blob_json(layout: &Layout, digest: &str) -> Value {
        serde_json::from_slice(&layout.blobs[digest]).expect("json blob")
    }

    fn manifest(layout: &Layout) -> Value {
        blob_json(layout, &layout.manifest_digest)
    }

    #[test]
    fn each_build_flag_names_its_profile_and_where_cargo_puts_its_binaries() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let profile = |flags: &[&str]| {
            let cli = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("image").chain(flags.iter().copied()),
            )
            .expect("flags parse");
            let p = cli.args.profile();
            (p, profile_dir(p).to_string())
        };
        assert_eq!(profile(&[]), ("release", "release".into()));
        assert_eq!(
            profile(&["--fast-build"]),
            ("fast-release", "fast-release".into())
        );
        assert_eq!(profile(&["--dev-build"]), ("dev", "debug".into()));
        assert!(
            <Cli as clap::Parser>::try_parse_from(["image", "--dev-build", "--fast-build"])
                .is_err(),
            "one profile at a time"
        );
    }

    #[test]
    fn the_same_input_gives_the_same_bytes_whatever_the_order() {
        let binary = elf(&[1]);
        let mut fs = root_filesystem(
            vec![
                ("b-bin".into(), binary.clone()),
                ("a-bin".into(), vec![1, 2, 3]),
            ],
            b"ca".to_vec(),
        );
        let first = layer_tar(&fs, 7).expect("layer");
        fs.reverse();
        assert_eq!(first, layer_tar(&fs, 7).expect("layer"));
        assert_ne!(
            first,
            layer_tar(&fs, 8).expect("layer"),
            "mtime is in the tar"
        );

        let one = build_layout(&config(), &first).expect("layout");
        let two = build_layout(&config(), &first).expect("layout");
        assert_eq!(one, two);
        let other = build_layout(&config(), &layer_tar(&fs, 8).expect("layer")).expect("layout");
        assert_ne!(one.manifest_digest, other.manifest_digest);
    }

    #[test]
    fn layer_entries_are_sorted_with_parents_root_owned_and_fixed_mtime() {
        let tar_bytes = layer(&elf(&[1]));
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut seen = Vec::new();
        for e in archive.entries().expect("entries") {
            let e = e.expect("entry");
            let h = e.header();
            let path = e.path().expect("path").to_string_lossy().into_owned();
            assert_eq!(h.mtime().expect("mtime"), 0, "{path}");
            assert_eq!(h.username_bytes(), Some(&b""[..]), "{path}");
            let owner = if path == "home/nonroot/" { NONROOT } else { 0 };
            assert_eq!(
                (h.uid().expect("uid"), h.gid().expect("gid")),
                (owner, owner),
                "{path}"
            );
            seen.push((path, h.mode().expect("mode")));
        }
        let paths: Vec<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc/",
                "etc/group",
                "etc/passwd",
                "etc/ssl/",
                "etc/ssl/certs/",
                "etc/ssl/certs/ca-certificates.crt",
                "home/",
                "home/nonroot/",
                "machine-controller-test",
                "tmp/",
            ]
        );
        let mode = |p: &str| seen.iter().find(|(q, _)| q == p).expect(p).1;
        assert_eq!(mode("tmp/"), 0o1777);
        assert_eq!(mode("machine-controller-test"), 0o755);
        assert_eq!(mode("etc/passwd"), 0o644);
        assert_eq!(mode("home/nonroot/"), 0o700);
    }

    #[test]
    fn bad_layer_paths_and_duplicates_are_refused() {
        for path in ["/abs", "a/../b", "a//b", "dir/", ""] {
            let e = Entry::file(path, 0o644, vec![]);
            assert!(layer_tar(&[e], 0).is_err(), "{path:?}");
        }
        let twice = [
            Entry::file("a", 0o644, vec![1]),
            Entry::file("a", 0o644, vec![2]),
        ];
        assert!(layer_tar(&twice, 0).is_err());
        let file_as_parent = [
            Entry::file("a", 0o644, vec![1]),
            Entry::file("a/b", 0o644, vec![2]),
        ];
        assert!(layer_tar(&file_as_parent, 0).is_err());
    }

    #[test]
    fn gzip_header_has_no_name_no_mtime_and_a_fixed_os() {
        let gz = gzip(b"hello").expect("gzip");
        assert_eq!(&gz[..3], &[0x1f, 0x8b, 8], "gzip magic, deflate");
        assert_eq!(gz[3], 0, "no FNAME/FCOMMENT/FEXTRA flags");
        assert_eq!(&gz[4..8], &[0, 0, 0, 0], "mtime 0");
        assert_eq!(gz[9], 255, "OS unknown");
        assert_eq!(gz, gzip(b"hello").expect("gzip"));
    }

    #[test]
    fn digests_and_sizes_are_consistent_and_diff_id_is_the_uncompressed_layer() {
        let tar_bytes = layer(&elf(&[1]));
        let layout = build_layout(&config(), &tar_bytes).expect("layout");
        assert_eq!(layout.blobs.len(), 3);
        for (d, bytes) in &layout.blobs {
            assert_eq!(d, &digest(bytes));
        }
        let manifest = manifest(&layout);
        for descriptor in [&manifest["config"], &manifest["layers"][0]] {
            let d = descriptor["digest"].as_str().expect("digest");
            assert_eq!(
                descriptor["size"].as_u64(),
                Some(layout.blobs[d].len() as u64)
            );
        }
        let config = blob_json(&layout, manifest["config"]["digest"].as_str().expect("d"));
        let layer_digest = manifest["layers"][0]["digest"].as_str().expect("d");
        assert_eq!(config["rootfs"]["diff_ids"], json!([digest(&tar_bytes)]));
        assert_ne!(config["rootfs"]["diff_ids"][0], layer_digest);
        let mut gunzipped = Vec::new();
        GzDecoder::new(&layout.blobs[layer_digest][..])
            .read_to_end(&mut gunzipped)
            .expect("gunzip");
        assert_eq!(gunzipped, tar_bytes);

        let index: Value = serde_json::from_slice(&layout.index).expect("index");
        assert_eq!(index["manifests"][0]["digest"], layout.manifest_digest);
        assert_eq!(
            index["manifests"][0]["size"].as_u64(),
            Some(layout.blobs[&layout.manifest_digest].len() as u64)
        );
    }

    #[test]
    fn manifest_config_and_index_have_the_oci_shapes() {
        let layout = build_layout(&config(), &layer(&elf(&[1]))).expect("layout");
        let index: Value = serde_json::from_slice(&layout.index).expect("index");
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(index["mediaType"], INDEX_MEDIA_TYPE);
        assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1));
        let m = &index["manifests"][0];
        assert_eq!(m["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(m["annotations"][REF_NAME_ANNOTATION], "1.2.3");
        assert_eq!(
            m["platform"],
            json!({"architecture": "amd64", "os": "linux"})
        );

        let manifest = manifest(&layout);
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest["config"]["mediaType"], CONFIG_MEDIA_TYPE);
        assert_eq!(manifest["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(manifest["layers"].as_array().map(Vec::len), Some(1));

        let config = blob_json(&layout, manifest["config"]["digest"].as_str().expect("d"));
        assert_eq!(config["os"], "linux");
        assert_eq!(config["architecture"], "amd64");
        assert_eq!(config["created"], "1970-01-01T00:00:00Z");
        assert_eq!(config["rootfs"]["type"], "layers");
        let c = &config["config"];
        assert_eq!(c["Entrypoint"], json!(["/machine-controller-test"]));
        assert_eq!(c["User"], "65532:65532");
        assert_eq!(c["ExposedPorts"], json!({"10259/tcp": {}, "9443/tcp": {}}));
        assert_eq!(
            c["Labels"],
            json!({
                "org.opencontainers.image.title": "machine-controller-test",
                "org.opencontainers.image.description": "a test image",
                "org.opencontainers.image.licenses": "Apache-2.0",
                "org.opencontainers.image.source": "https://example.invalid/mcm-rs",
                "org.opencontainers.image.version": "1.2.3",
            })
        );
        assert!(c.get("Cmd").is_none());
    }

    #[test]
    fn a_written_layout_verifies_and_a_corrupted_one_does_not() {
        let binary = elf(&[1, 2]);
        let tar_bytes = layer(&binary);
        let layout = build_layout(&config(), &tar_bytes).expect("layout");
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("machine-controller-test");
        write_layout(&layout, &dir).expect("write");
        // Rewriting over an existing layout works; over anything else it is refused.
        write_layout(&layout, &dir).expect("rewrite");
        fs::create_dir(tmp.path().join("other")).expect("mkdir");
        assert!(write_layout(&layout, &tmp.path().join("other")).is_err());

        let verified = verify_layout(&dir, "1.2.3").expect("verify");
        assert_eq!(verified.manifest_digest, layout.manifest_digest);
        assert_eq!(verified.layer, tar_bytes);
        assert_eq!(verified.entrypoint, "/machine-controller-test");
        assert_eq!(
            verified.image_bytes,
            layout.blobs.values().map(|b| b.len() as u64).sum::<u64>()
        );
        let err = verify_layout(&dir, "9.9.9").expect_err("wrong tag");
        assert!(format!("{err:#}").contains("0 manifests tagged"), "{err:#}");

        let config_digest = manifest(&layout)["config"]["digest"]
            .as_str()
            .expect("d")
            .to_string();
        let config_path = dir
            .join("blobs/sha256")
            .join(config_digest.trim_start_matches("sha256:"));
        let mut bytes = fs::read(&config_path).expect("read");
        bytes[0] ^= 1;
        fs::write(&config_path, &bytes).expect("write");
        let err = verify_layout(&dir, "1.2.3").expect_err("corrupted");
        assert!(format!("{err:#}").contains("has digest"), "{err:#}");
    }

    #[test]
    fn a_dynamically_linked_entrypoint_fails_verification() {
        let layout = build_layout(&config(), &layer(&elf(&[1, PT_INTERP]))).expect("layout");
        let tmp = tempfile::tempdir().expect("tempdir");
        write_layout(&layout, tmp.path().join("img").as_path()).expect("write");
        let err = verify_layout(&tmp.path().join("img"), "1.2.3").expect_err("dynamic");
        assert!(format!("{err:#}").contains("PT_INTERP"), "{err:#}");
    }

    #[test]
    fn the_archive_holds_the_layout() {
        let layout = build_layout(&config(), &layer(&elf(&[1]))).expect("layout");
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("img.tar");
        write_archive(&layout, &path, 0).expect("archive");
        let entries = layer_entries(&fs::read(&path).expect("read")).expect("entries");
        let mut expected = vec![
            "blobs".to_string(),
            "blobs/sha256".into(),
            "index.json".into(),
            "oci-layout".into(),
        ];
        expected.extend(
            layout
                .blobs
                .keys()
                .map(|d| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"))),
        );
        expected.sort();
        assert_eq!(entries.keys().cloned().collect::<Vec<_>>(), expected);
        let verified = verify_archive(&path, "machine-controller-test:1.2.3").expect("verify");
        assert_eq!(verified.manifest_digest, layout.manifest_digest);
        let index: Value =
            serde_json::from_slice(entries["index.json"].1.as_deref().expect("file"))
                .expect("index");
        assert_eq!(
            index["manifests"][0]["annotations"][REF_NAME_ANNOTATION],
            "machine-controller-test:1.2.3"
        );
        assert_eq!(index["manifests"][0]["digest"], layout.manifest_digest);
        assert_eq!(
            entries["oci-layout"].1.as_deref(),
            Some(OCI_LAYOUT.as_bytes())
        );
    }

    #[test]
    fn static_elf_check() {
        check_static_elf(&elf(&[1, 2, 4])).expect("static");
        let err = check_static_elf(&elf(&[6, PT_INTERP, 1])).expect_err("dynamic");
        assert!(
            format!("{err:#}").contains("/lib/ld-musl-x86_64.so.1"),
            "{err:#}"
        );
        assert!(check_static_elf(b"#!/bin/sh\n").is_err());
        assert!(check_static_elf(&elf(&[1])[..70]).is_err(), "truncated");
        let mut arm = elf(&[1]);
        arm[0x12] = 0xb7;
        assert!(check_static_elf(&arm).is_err(), "aarch64");
    }

    #[test]
    fn selection_of_images() {
        let names = |p: &[Provider], all| -> Vec<&str> {
            selected(p, all).iter().map(|i| i.name).collect()
        };
        assert_eq!(names(&[], false), ["machine-controller-manager"]);
        assert_eq!(
            names(&[Provider::Aws], false),
            ["machine-controller-manager", "machine-controller-aws"]
        );
        assert_eq!(
            names(&[Provider::Aws, Provider::Local], false),
            [
                "machine-controller-manager",
                "machine-controller-local",
                "machine-controller-aws"
            ]
        );
        assert_eq!(names(&[], true).len(), IMAGES.len());
        let local = selected(&[Provider::Local], false)[1];
        let bins: Vec<&str> = local.binaries.iter().map(|b| b.name).collect();
        assert_eq!(bins, ["machine-controller-local", "local-node"]);
        assert_eq!(
            image_config(local, 0).entrypoint,
            "/machine-controller-local"
        );
        assert_eq!(MANAGER.ports, [10258]);
    }
}
