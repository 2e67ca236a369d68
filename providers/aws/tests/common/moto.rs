//! A `moto_server` for tests (also included by `machine-controller-aws`'s tests).
//!
//! [`moto()`] starts one server per test process on 127.0.0.1 and a free port: `moto_server`
//! from `PATH`, else `python3 -m moto.server`; without either the test fails naming
//! `pip install 'moto[server]'`. The server runs in its own process group with
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

/// A running moto server.
pub struct Moto {
    /// Its base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
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

/// How to start moto: `moto_server`, or `python3 -m moto.server`.
fn moto_command() -> (PathBuf, Vec<String>) {
    if let Some(p) = on_path("moto_server") {
        return (p, vec![]);
    }
    for python in ["python3", "python"] {
        if let Some(p) = on_path(python) {
            let ok = std::process::Command::new(&p)
                .args(["-c", "import moto.server"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return (p, vec!["-m".into(), "moto.server".into()]);
            }
        }
    }
    panic!(
        "moto is not installed: neither `moto_server` on PATH nor `python3 -m moto.server` works; install it with {INSTALL_HINT}"
    );
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

impl Moto {
    fn start() -> Moto {
        let (program, mut args) = moto_command();
        let port = free_port();
        args.extend([
            "-H".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("moto.log");
        let process = ManagedProcess::spawn("moto_server", &program, &args, log, dir.path())
            .unwrap_or_else(|e| {
                panic!("cannot start {} ({INSTALL_HINT}?): {e}", program.display())
            });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http(port, "GET", "/moto-api/data.json", &[], "").is_some_and(|(s, _)| s == 200) {
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
            port,
            process,
            _dir: dir,
        }
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

/// The moto server of this test process.
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(Moto::start)
}

/// A test's own corner of moto: a VPC with a subnet and a security group, an AMI, an
/// instance profile and a unique cluster tag.
#[derive(Debug, Clone)]
pub struct World {
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
        let m = moto();
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
            cluster_tag: format!("kubernetes.io/cluster/{unique}"),
            role_tag: "kubernetes.io/role/node".into(),
            subnet: subnet.subnet().unwrap().subnet_id().unwrap().to_string(),
            security_group: sg.group_id().unwrap().to_string(),
            ami,
            profile,
        }
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
        let out = moto()
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
