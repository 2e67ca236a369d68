//! A `moto_server` for tests (also included by `machine-controller-aws`'s tests).
//!
//! [`moto()`] starts one server per test process on 127.0.0.1 and a free port: moto's server
//! through `ec2_moto.py`, which gives its EC2 what real EC2 does and moto does not (client
//! token idempotency, the multi-interface refusal of `ModifyInstanceAttribute`, and, in
//! [`lagging_moto()`], describe lag and late `RunInstances` answers). Without moto the test
//! fails naming `pip install 'moto[server]'`. The server runs in its own process group with
//! `PR_SET_PDEATHSIG` (via `mcm_testenv::process::ManagedProcess`), so it dies with the test
//! process even when a test panics or the process is killed. Tests share the server and stay
//! apart by unique cluster tags and VPCs ([`World`]).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use mcm_testenv::kit::free_port;
use mcm_testenv::process::ManagedProcess;

/// The region of the tests.
pub const REGION: &str = "eu-west-1";
/// What to install when moto is missing.
pub const INSTALL_HINT: &str = "pip install 'moto[server]'";

/// A TLS listener of a [`Moto`] besides its plain one on 127.0.0.1 (the same server state).
#[derive(Debug, Clone)]
pub struct TlsListener {
    /// The address it listens on (and the host of [`Moto::tls_url`]).
    pub host: std::net::IpAddr,
    /// Its serving certificate and key (PEM files).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A running moto server.
pub struct Moto {
    /// Its base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
    /// With a [`TlsListener`]: its base URL, e.g. `https://10.250.0.1:40124`.
    pub tls_url: Option<String>,
    /// Its port.
    pub port: u16,
    /// The process (killed with its group on drop, and by the kernel with the test process).
    pub process: ManagedProcess,
    _dir: tempfile::TempDir,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The EC2 behaviours of the wrapper script that moto does not have (see `ec2_moto.py`).
pub const EC2_MOTO_PY: &str = include_str!("ec2_moto.py");

/// A Python that can import moto's server (and botocore, which moto depends on).
pub fn python() -> PathBuf {
    for python in ["python3", "python"] {
        if let Some(p) = on_path(python) {
            let ok = std::process::Command::new(&p)
                .args(["-c", "import moto.server"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return p;
            }
        }
    }
    panic!(
        "moto is not installed: `python3 -c 'import moto.server'` fails; install it with {INSTALL_HINT}"
    );
}

/// How EC2 lags behind in a [`Moto`] (real EC2's eventual consistency, played by the wrapper).
#[derive(Debug, Clone, Copy, Default)]
pub struct Lag {
    /// `DescribeInstances` does not show an instance for this long after its launch.
    pub hide: Duration,
    /// `RunInstances` answers this long after it launched the instance.
    pub run_instances_delay: Duration,
}

/// What the wrapper counted (`GET /_ec2/stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `RunInstances` requests, replays included.
    pub run_instances_calls: u64,
    /// Instances launched.
    pub instances_launched: u64,
    /// `RunInstances` answered from an earlier request's client token.
    pub idempotent_replays: u64,
    /// Instances `DescribeInstances` left out or answered `NotFound` for (lag).
    pub hidden_describe_misses: u64,
}

/// One instance as the wrapper sees it (`GET /_ec2/instances`, never hidden).
#[derive(Debug, Clone)]
pub struct SeenInstance {
    /// `i-...`.
    pub id: String,
    /// `pending`, `running`, `terminated`, ...
    pub state: String,
    /// Its tags.
    pub tags: std::collections::BTreeMap<String, String>,
}

impl SeenInstance {
    /// Pending or running.
    pub fn is_live(&self) -> bool {
        matches!(self.state.as_str(), "pending" | "running")
    }
}

/// A blocking HTTP request to moto; returns (status, body).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.lines().next()?.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

impl std::fmt::Debug for Moto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moto").field("url", &self.url).finish()
    }
}

impl Moto {
    fn start(lag: Lag) -> Moto {
        Moto::start_with(lag, None)
    }

    /// A moto server with `lag`, listening with TLS too when `tls` is given.
    pub fn start_with(lag: Lag, tls: Option<&TlsListener>) -> Moto {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("ec2_moto.py");
        std::fs::write(&script, EC2_MOTO_PY).unwrap();
        let program = python();
        let port = free_port();
        let mut args: Vec<String> = vec![
            script.display().to_string(),
            "-H".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            format!("--hide-seconds={}", lag.hide.as_secs_f64()),
            format!(
                "--run-instances-delay-ms={}",
                lag.run_instances_delay.as_millis()
            ),
        ];
        let tls_addr = tls.map(|t| {
            let addr = std::net::SocketAddr::new(t.host, free_port());
            args.extend([
                format!("--tls-host={}", t.host),
                format!("--tls-port={}", addr.port()),
                format!("--tls-cert={}", t.cert.display()),
                format!("--tls-key={}", t.key.display()),
            ]);
            addr
        });
        let log = dir.path().join("moto.log");
        let process = ManagedProcess::spawn("moto_server", &program, &args, log, dir.path())
            .unwrap_or_else(|e| {
                panic!("cannot start {} ({INSTALL_HINT}?): {e}", program.display())
            });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http(port, "GET", "/moto-api/data.json", &[], "").is_some_and(|(s, _)| s == 200)
                && tls_addr.is_none_or(|a| TcpStream::connect(a).is_ok())
            {
                break;
            }
            assert!(
                process.is_running(),
                "moto_server exited at start:\n{}",
                process.log_tail(30)
            );
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer within 60s:\n{}",
                process.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto {
            url: format!("http://127.0.0.1:{port}"),
            tls_url: tls_addr.map(|a| format!("https://{a}")),
            port,
            process,
            _dir: dir,
        }
    }

    /// What the EC2 wrapper counted so far.
    pub fn stats(&self) -> Stats {
        let (status, body) = http(self.port, "GET", "/_ec2/stats", &[], "").expect("moto answers");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("stats");
        let n = |k: &str| {
            v[k].as_u64()
                .unwrap_or_else(|| panic!("stats lack {k}: {body}"))
        };
        Stats {
            run_instances_calls: n("run_instances_calls"),
            instances_launched: n("instances_launched"),
            idempotent_replays: n("idempotent_replays"),
            hidden_describe_misses: n("hidden_describe_misses"),
        }
    }

    /// Every instance moto holds (none hidden), e.g. to sample how many a machine has.
    pub fn instances(&self) -> Vec<SeenInstance> {
        let (status, body) =
            http(self.port, "GET", "/_ec2/instances", &[], "").expect("moto answers");
        assert_eq!(status, 200, "{body}");
        let v: Vec<serde_json::Value> = serde_json::from_str(&body).expect("instances");
        v.iter()
            .map(|i| SeenInstance {
                id: i["id"].as_str().unwrap_or_default().to_string(),
                state: i["state"].as_str().unwrap_or_default().to_string(),
                tags: i["tags"]
                    .as_object()
                    .map(|t| {
                        t.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// Resets all of moto's state (`POST /moto-api/reset`).
    pub fn reset(&self) {
        let (status, _) =
            http(self.port, "POST", "/moto-api/reset", &[], "").expect("moto answers");
        assert_eq!(status, 200);
    }

    /// An EC2 client for moto (any credentials work).
    pub fn ec2(&self) -> Client {
        let conf = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .endpoint_url(&self.url)
            .http_client(mcm_provider_aws::client::http_client())
            .build();
        Client::from_conf(conf)
    }

    /// Creates an IAM instance profile (moto checks that RunInstances names an existing one).
    /// moto routes by the credential scope of the Authorization header; it does not check
    /// signatures.
    pub fn create_instance_profile(&self, name: &str) {
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=test/20240101/{REGION}/iam/aws4_request, SignedHeaders=host, Signature=0"
        );
        let body =
            format!("Action=CreateInstanceProfile&InstanceProfileName={name}&Version=2010-05-08");
        let (status, text) = http(
            self.port,
            "POST",
            "/",
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &body,
        )
        .expect("moto answers");
        assert!(
            status == 200 || text.contains("EntityAlreadyExists"),
            "CreateInstanceProfile: {status} {text}"
        );
    }
}

/// The moto server of this test process (no lag).
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| Moto::start(Lag::default()))
}

/// How long [`lagging_moto`] hides a new instance from `DescribeInstances`.
pub const LAG_HIDE: Duration = Duration::from_secs(3);
/// How long [`lagging_moto`] holds a `RunInstances` answer after it launched the instance.
pub const LAG_RUN_INSTANCES: Duration = Duration::from_millis(1500);

/// A second moto server of this test process whose EC2 lags as real EC2 may: new instances
/// are hidden from `DescribeInstances` for [`LAG_HIDE`], and `RunInstances` answers
/// [`LAG_RUN_INSTANCES`] after it launched.
pub fn lagging_moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| {
        Moto::start(Lag {
            hide: LAG_HIDE,
            run_instances_delay: LAG_RUN_INSTANCES,
        })
    })
}

/// A test's own corner of moto: a VPC with a subnet and a security group, an AMI, an
/// instance profile and a unique cluster tag.
#[derive(Debug, Clone)]
pub struct World {
    /// The moto server it lives in.
    pub moto: &'static Moto,
    /// `kubernetes.io/cluster/<unique>`.
    pub cluster_tag: String,
    /// `kubernetes.io/role/node`.
    pub role_tag: String,
    /// The subnet.
    pub subnet: String,
    /// The security group.
    pub security_group: String,
    /// An AMI that exists in moto.
    pub ami: String,
    /// The instance profile name.
    pub profile: String,
}

static NEXT_NET: AtomicU8 = AtomicU8::new(1);

impl World {
    /// Creates the VPC (its own 10.N.0.0/16, so private DNS names differ between tests),
    /// subnet, security group and instance profile.
    pub async fn new(name: &str) -> World {
        World::new_in(moto(), name).await
    }

    /// [`World::new`] in moto server `m` (e.g. [`lagging_moto`]).
    pub async fn new_in(m: &'static Moto, name: &str) -> World {
        let ec2 = m.ec2();
        let n = NEXT_NET.fetch_add(1, Ordering::SeqCst);
        let vpc = ec2
            .create_vpc()
            .cidr_block(format!("10.{n}.0.0/16"))
            .send()
            .await
            .unwrap();
        let vpc_id = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
        let subnet = ec2
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block(format!("10.{n}.0.0/20"))
            .availability_zone(format!("{REGION}a"))
            .send()
            .await
            .unwrap();
        let sg = ec2
            .create_security_group()
            .group_name(format!("{name}-nodes"))
            .description("nodes")
            .vpc_id(&vpc_id)
            .send()
            .await
            .unwrap();
        let images = ec2.describe_images().send().await.unwrap();
        let ami = images
            .images()
            .iter()
            .find(|i| i.root_device_name().is_some())
            .and_then(|i| i.image_id())
            .expect("moto has AMIs")
            .to_string();
        let profile = format!("{name}-profile");
        m.create_instance_profile(&profile);
        let unique = format!(
            "{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        World {
            moto: m,
            cluster_tag: format!("kubernetes.io/cluster/{unique}"),
            role_tag: "kubernetes.io/role/node".into(),
            subnet: subnet.subnet().unwrap().subnet_id().unwrap().to_string(),
            security_group: sg.group_id().unwrap().to_string(),
            ami,
            profile,
        }
    }

    /// The live instances of this world per `Name` tag, as the wrapper sees them (never
    /// hidden by lag).
    pub fn live_per_machine(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for i in self.moto.instances() {
            if i.is_live() && i.tags.contains_key(&self.cluster_tag) {
                *out.entry(i.tags.get("Name").cloned().unwrap_or_default())
                    .or_default() += 1;
            }
        }
        out
    }

    /// How many instances were ever launched for each machine of this world (`Name` tag),
    /// terminated ones included.
    pub fn launched_per_machine(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for i in self.moto.instances() {
            if i.tags.contains_key(&self.cluster_tag) {
                *out.entry(i.tags.get("Name").cloned().unwrap_or_default())
                    .or_default() += 1;
            }
        }
        out
    }

    /// A valid providerSpec for this world.
    pub fn provider_spec(&self) -> serde_json::Value {
        serde_json::json!({
            "ami": self.ami,
            "region": REGION,
            "machineType": "m5.large",
            "iam": { "name": self.profile },
            "keyName": null,
            "networkInterfaces": [{ "subnetID": self.subnet, "securityGroupIDs": [self.security_group] }],
            "tags": { self.cluster_tag.clone(): "1", self.role_tag.clone(): "1", "team": "mcm" },
            "blockDevices": [
                { "deviceName": "/root", "ebs": { "volumeSize": 20, "volumeType": "gp3" } },
                { "deviceName": "/dev/sdb", "ebs": { "volumeSize": 10, "volumeType": "gp2" } }
            ],
        })
    }

    /// The live (not terminated) instances with this world's cluster tag.
    pub async fn live_instances(&self) -> Vec<aws_sdk_ec2::types::Instance> {
        let out = self
            .moto
            .ec2()
            .describe_instances()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("tag-key")
                    .values(&self.cluster_tag)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        out.reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter(|i| {
                !matches!(
                    i.state().and_then(|s| s.name()),
                    Some(
                        aws_sdk_ec2::types::InstanceStateName::Terminated
                            | aws_sdk_ec2::types::InstanceStateName::ShuttingDown
                    )
                )
            })
            .cloned()
            .collect()
    }
}
