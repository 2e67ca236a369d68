//! Counting the controllers' requests where they arrive: the API server's audit log (one JSON
//! event per line, every request at level Metadata), not the controllers' own counters.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use jiff::Timestamp;
use serde::Deserialize;

/// Who sent a request, from its User-Agent (`<binary>/<version> ...`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sender {
    /// `machine-controller-manager`.
    Manager,
    /// `machine-controller-<provider>`.
    MachineController,
    /// Anything else (kwok, kube-controller-manager, the bench, the local cloud's driver
    /// standing for kubelets), by the first word of its User-Agent.
    Other(String),
}

impl Sender {
    /// Classifies a User-Agent.
    pub fn of(user_agent: &str) -> Sender {
        let program = user_agent.split('/').next().unwrap_or_default();
        match program {
            "machine-controller-manager" => Sender::Manager,
            p if p.starts_with("machine-controller-") => Sender::MachineController,
            p => Sender::Other(p.to_string()),
        }
    }
}

/// One request, as the audit log tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// When the API server received it.
    pub at: Timestamp,
    /// Who sent it.
    pub sender: Sender,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// `machines`, `machines/status`, `nodes`, ... or the path of a non-resource request.
    pub resource: String,
    /// The namespace of a namespaced request.
    pub namespace: Option<String>,
}

impl Request {
    /// Whether it changes state (what the QPS bound counts).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    request_uri: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    request_received_timestamp: Timestamp,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// Parses audit log lines into requests, one per audit id (a watch logs a start and an end).
/// Lines that are not audit events are skipped.
pub fn parse_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<Request> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for line in lines {
        let Ok(e) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        if !seen.insert(e.audit_id) {
            continue;
        }
        let namespace = e.object_ref.as_ref().and_then(|o| o.namespace.clone());
        let resource = match e.object_ref {
            Some(o) => match o.subresource {
                Some(sub) => format!("{}/{sub}", o.resource),
                None => o.resource,
            },
            None => e
                .request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        out.push(Request {
            at: e.request_received_timestamp,
            sender: Sender::of(&e.user_agent),
            verb: e.verb,
            resource,
            namespace,
        });
    }
    out
}

/// Follows a growing audit log: each [`AuditTail::poll`] reads what was appended since the
/// last one.
pub struct AuditTail {
    path: std::path::PathBuf,
    offset: u64,
    partial: String,
}

impl AuditTail {
    /// Follows `path` from its current end.
    pub fn from_end(path: &Path) -> Result<AuditTail> {
        let offset = std::fs::metadata(path)
            .with_context(|| format!("reading the size of {}", path.display()))?
            .len();
        Ok(AuditTail {
            path: path.to_path_buf(),
            offset,
            partial: String::new(),
        })
    }

    /// The requests appended since the last poll (a line still being written is kept for
    /// the next one).
    pub fn poll(&mut self) -> Result<Vec<Request>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.offset))
            .with_context(|| format!("seeking in {}", self.path.display()))?;
        let mut text = std::mem::take(&mut self.partial);
        let read = file
            .read_to_string(&mut text)
            .with_context(|| format!("reading {}", self.path.display()))?;
        self.offset += read as u64;
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.partial = text.split_off(complete);
        Ok(parse_lines(text.lines()))
    }
}

/// Whether a request is one of the controllers' own (a watch, which stays open, is not
/// activity).
pub fn is_controller_activity(r: &Request) -> bool {
    !matches!(r.sender, Sender::Other(_)) && r.verb != "watch"
}

/// Reads the whole audit log.
pub fn read(path: &Path) -> Result<Vec<Request>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(parse_lines(lines.iter().map(String::as_str)))
}

/// The controllers' requests of one phase.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Requests of the manager.
    pub manager: u64,
    /// Requests of the machine controller.
    pub machine_controller: u64,
    /// Writes of the manager.
    pub manager_writes: u64,
    /// Writes of the machine controller.
    pub machine_controller_writes: u64,
    /// Writes of the manager to the target cluster.
    pub manager_target_writes: u64,
    /// Writes of the machine controller to the target cluster.
    pub machine_controller_target_writes: u64,
    /// Requests of both, by `"<sender> <verb> <resource>"`.
    pub by_kind: BTreeMap<String, u64>,
}

impl Tally {
    /// Both controllers' requests.
    pub fn total(&self) -> u64 {
        self.manager + self.machine_controller
    }

    /// The most writes one client-side rate limiter let through: each controller has one for
    /// the control cluster and one for the target cluster.
    pub fn busiest_limiter_writes(&self) -> u64 {
        [
            self.manager_writes - self.manager_target_writes,
            self.manager_target_writes,
            self.machine_controller_writes - self.machine_controller_target_writes,
            self.machine_controller_target_writes,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

/// Counts the controllers' requests received in `[from, to]`. Requests in
/// `control_namespace` went to the control cluster, all others to the target cluster (in the
/// benchmark both are one API server).
pub fn tally(
    requests: &[Request],
    from: Timestamp,
    to: Timestamp,
    control_namespace: &str,
) -> Tally {
    let mut t = Tally::default();
    for r in requests.iter().filter(|r| r.at >= from && r.at <= to) {
        let (count, writes, target_writes, who) = match r.sender {
            Sender::Manager => (
                &mut t.manager,
                &mut t.manager_writes,
                &mut t.manager_target_writes,
                "manager",
            ),
            Sender::MachineController => (
                &mut t.machine_controller,
                &mut t.machine_controller_writes,
                &mut t.machine_controller_target_writes,
                "machine-controller",
            ),
            Sender::Other(_) => continue,
        };
        *count += 1;
        if r.is_write() {
            *writes += 1;
            if r.namespace.as_deref() != Some(control_namespace) {
                *target_writes += 1;
            }
        }
        *t.by_kind
            .entry(format!("{who} {} {}", r.verb, r.resource))
            .or_default() += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(
        id: &str,
        stage: &str,
        verb: &str,
        agent: &str,
        res: &str,
        sub: Option<&str>,
        at: &str,
    ) -> String {
        let mut object = serde_json::json!({"resource": res, "namespace": "ns"});
        if let Some(s) = sub {
            object["subresource"] = s.into();
        }
        serde_json::json!({
            "kind": "Event", "level": "Metadata", "auditID": id, "stage": stage,
            "requestURI": format!("/apis/x/{res}?watch=true"), "verb": verb,
            "userAgent": agent, "objectRef": object,
            "requestReceivedTimestamp": at, "stageTimestamp": at,
        })
        .to_string()
    }

    #[test]
    fn a_tail_reads_what_was_appended_and_keeps_a_partial_line() {
        use std::io::Write;
        let mc = "machine-controller-local/0.1.0 (linux/amd64) replica/a";
        let t = "2026-01-01T00:00:01Z";
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let mut log = std::fs::File::create(&path).expect("create");
        writeln!(
            log,
            "{}",
            line("0", "ResponseComplete", "get", mc, "machines", None, t)
        )
        .expect("write");
        let mut tail = AuditTail::from_end(&path).expect("tail");
        assert!(
            tail.poll().expect("poll").is_empty(),
            "only what comes after"
        );
        let patch = line("1", "ResponseComplete", "patch", mc, "machines", None, t);
        let (head, rest) = patch.split_at(20);
        write!(
            log,
            "{}",
            line("2", "ResponseStarted", "watch", mc, "nodes", None, t)
        )
        .expect("write");
        writeln!(log).expect("write");
        write!(log, "{head}").expect("write");
        let first = tail.poll().expect("poll");
        assert_eq!(first.len(), 1);
        assert!(!is_controller_activity(&first[0]), "a watch is no activity");
        writeln!(log, "{rest}").expect("write");
        let second = tail.poll().expect("poll");
        assert_eq!(second.len(), 1, "the partial line, once complete");
        assert!(is_controller_activity(&second[0]));
    }

    #[test]
    fn counts_each_request_once_by_sender_and_kind_within_the_window() {
        let mc = "machine-controller-local/0.1.0 (linux/amd64) replica/a";
        let mcm = "machine-controller-manager/0.1.0 (linux/amd64) replica/b";
        let lines = [
            line(
                "1",
                "ResponseStarted",
                "watch",
                mc,
                "machines",
                None,
                "2026-01-01T00:00:01Z",
            ),
            line(
                "1",
                "ResponseComplete",
                "watch",
                mc,
                "machines",
                None,
                "2026-01-01T00:00:01Z",
            ),
            line(
                "2",
                "ResponseComplete",
                "patch",
                mc,
                "machines",
                Some("status"),
                "2026-01-01T00:00:02Z",
            ),
            line(
                "3",
                "ResponseComplete",
                "create",
                mcm,
                "machines",
                None,
                "2026-01-01T00:00:03Z",
            ),
            line(
                "4",
                "ResponseComplete",
                "update",
                "kwok/v0.8.0",
                "leases",
                None,
                "2026-01-01T00:00:03Z",
            ),
            line(
                "5",
                "ResponseComplete",
                "patch",
                mc,
                "machines",
                Some("status"),
                "2026-01-01T00:00:09Z",
            ),
            "not json".to_string(),
        ];
        let requests = parse_lines(lines.iter().map(String::as_str));
        assert_eq!(requests.len(), 5);
        assert_eq!(requests[3].sender, Sender::Other("kwok".into()));
        let t = tally(
            &requests,
            "2026-01-01T00:00:00Z".parse().unwrap(),
            "2026-01-01T00:00:05Z".parse().unwrap(),
            "ns",
        );
        assert_eq!(t.machine_controller_target_writes, 0);
        assert_eq!(t.busiest_limiter_writes(), 1);
        assert_eq!((t.machine_controller, t.machine_controller_writes), (2, 1));
        assert_eq!((t.manager, t.manager_writes), (1, 1));
        assert_eq!(t.total(), 3);
        assert_eq!(t.by_kind["machine-controller patch machines/status"], 1);
        assert_eq!(t.by_kind["machine-controller watch machines"], 1);
        assert_eq!(t.by_kind["manager create machines"], 1);
    }

    #[test]
    fn senders_are_told_apart_by_their_program() {
        assert_eq!(
            Sender::of("machine-controller-aws/0.1.0"),
            Sender::MachineController
        );
        assert_eq!(
            Sender::of("machine-controller-manager/0.1.0 x"),
            Sender::Manager
        );
        assert_eq!(
            Sender::of("kube-controller-manager/v1.36.3"),
            Sender::Other("kube-controller-manager".into())
        );
        assert_eq!(
            Sender::of("mcm-local-cloud/0.1.0"),
            Sender::Other("mcm-local-cloud".into())
        );
    }
}
