//! The Pods bound to a local VM: marked Running/Ready, deleted after their grace period, and
//! their PersistentVolumes reported in `node.status.volumesAttached` / `volumesInUse`.
//!
//! Everything is driven by watches: a watch of the Pods with `spec.nodeName=<node>`, and
//! reflectors of PersistentVolumeClaims and PersistentVolumes to resolve claims. Each
//! terminating Pod gets its own timer.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::pin::Pin;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    AttachedVolume, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStatus, HostIP, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodCondition,
    PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::{AbortHandle, JoinSet};
use tracing::{debug, info, warn};

/// The IP of every local VM and of every Pod on it.
pub const LOCAL_IP: &str = "127.0.0.1";
/// How often a failed Pod status update is tried before it waits for the next event.
const STATUS_ATTEMPTS: u32 = 5;
/// Delay before a failed volume report is retried.
const VOLUME_RETRY: Duration = Duration::from_secs(1);

/// Whether the Pod has finished (`Succeeded` or `Failed`): such Pods are left alone.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether the Pod still needs to be marked Running: it is not finished, not terminating,
/// and has no running status for every container yet.
pub fn needs_running_status(pod: &Pod) -> bool {
    if is_terminal(pod) || pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let status = pod.status.clone().unwrap_or_default();
    if status.phase.as_deref() != Some("Running") {
        return true;
    }
    let containers = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let ready = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .filter(|c| c.ready)
        .count();
    ready < containers
}

/// The status of a Pod whose containers all run: phase Running, conditions PodScheduled,
/// PodReadyToStartContainers, Initialized, ContainersReady and Ready True, running
/// container statuses (completed init containers), pod and host IP 127.0.0.1.
pub fn running_pod_status(pod: &Pod, now: Timestamp) -> PodStatus {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let start = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .unwrap_or(Time(now));
    let spec = pod.spec.clone().unwrap_or_default();
    let existing = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    // A condition that is True already keeps its transition time (e.g. the scheduler's).
    let condition = |type_: &str| PodCondition {
        type_: type_.into(),
        status: "True".into(),
        last_transition_time: existing
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
            .and_then(|c| c.last_transition_time.clone())
            .or(Some(Time(now))),
        ..Default::default()
    };
    let container_status =
        |name: &str, image: Option<String>, state: ContainerState, ready| ContainerStatus {
            name: name.into(),
            image: image.unwrap_or_default(),
            image_id: String::new(),
            container_id: Some(format!("local://{uid}/{name}")),
            ready,
            started: Some(ready),
            restart_count: 0,
            state: Some(state),
            ..Default::default()
        };
    let running = ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(start.clone()),
        }),
        ..Default::default()
    };
    let completed = ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 0,
            reason: Some("Completed".into()),
            started_at: Some(start.clone()),
            finished_at: Some(start.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let init: Vec<ContainerStatus> = spec
        .init_containers
        .unwrap_or_default()
        .iter()
        .map(|c| container_status(&c.name, c.image.clone(), completed.clone(), false))
        .collect();
    PodStatus {
        phase: Some("Running".into()),
        conditions: Some(
            [
                "PodScheduled",
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready",
            ]
            .into_iter()
            .map(condition)
            .collect(),
        ),
        container_statuses: Some(
            spec.containers
                .iter()
                .map(|c| container_status(&c.name, c.image.clone(), running.clone(), true))
                .collect(),
        ),
        init_container_statuses: (!init.is_empty()).then_some(init),
        host_ip: Some(LOCAL_IP.into()),
        host_ips: Some(vec![HostIP {
            ip: LOCAL_IP.into(),
        }]),
        pod_ip: Some(LOCAL_IP.into()),
        pod_ips: Some(vec![PodIP {
            ip: LOCAL_IP.into(),
        }]),
        start_time: Some(start),
        ..Default::default()
    }
}

/// How long to wait before force-deleting a terminating Pod: what is left of its grace
/// period (its `deletionTimestamp` is the deletion request plus the grace period), bounded
/// by `deletionGracePeriodSeconds`. `None` when the Pod is not terminating.
pub fn deletion_delay(pod: &Pod, now: Timestamp) -> Option<Duration> {
    let deadline = pod.metadata.deletion_timestamp.as_ref()?.0;
    let grace = Duration::from_secs(
        pod.metadata
            .deletion_grace_period_seconds
            .unwrap_or(0)
            .max(0)
            .unsigned_abs(),
    );
    let left = Duration::try_from(deadline.duration_since(now)).unwrap_or(Duration::ZERO);
    Some(left.min(grace))
}

/// The claims (namespace, claim name) a Pod's volumes use, generic ephemeral volumes
/// included (their claim is `<pod>-<volume>`).
pub fn pod_claims(pod: &Pod) -> Vec<(String, String)> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(pvc) = &v.persistent_volume_claim {
                Some((ns.clone(), pvc.claim_name.clone()))
            } else {
                v.ephemeral
                    .as_ref()
                    .map(|_| (ns.clone(), format!("{pod_name}-{}", v.name)))
            }
        })
        .collect()
}

/// The unique volume name of a PersistentVolume as the attach/detach controller names it:
/// `kubernetes.io/csi/<driver>^<volumeHandle>` for CSI, `local/<pv-name>` otherwise.
pub fn unique_volume_name(pv: &PersistentVolume) -> String {
    match pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        Some(csi) => format!("kubernetes.io/csi/{}^{}", csi.driver, csi.volume_handle),
        None => format!("local/{}", pv.metadata.name.as_deref().unwrap_or_default()),
    }
}

/// The volumes attached to the node: those of the bound PersistentVolumes of every
/// unfinished Pod's claims, sorted and without duplicates. Unbound claims and missing
/// objects are skipped.
pub fn attached_volumes<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    bound_volume: impl Fn(&str, &str) -> Option<String>,
    volume: impl Fn(&str) -> Option<PersistentVolume>,
) -> Vec<AttachedVolume> {
    let names: BTreeSet<String> = pods
        .into_iter()
        .filter(|p| !is_terminal(p))
        .flat_map(pod_claims)
        .filter_map(|(ns, claim)| bound_volume(&ns, &claim))
        .filter_map(|pv_name| volume(&pv_name))
        .map(|pv| unique_volume_name(&pv))
        .collect();
    names
        .into_iter()
        .map(|name| AttachedVolume {
            name,
            device_path: String::new(),
        })
        .collect()
}

/// What finished in the background.
enum Done {
    /// A status update of the Pod with this uid ended.
    Status(String),
    /// The deletion timer of the Pod with this uid fired (and the delete was sent).
    Deleted(String),
    /// Time to retry the volume report.
    RetryVolumes,
}

/// Inputs of the Pod loop.
enum Input {
    Pod(Box<Result<watcher::Event<Pod>, watcher::Error>>),
    /// A claim or volume changed (or its store finished its initial list).
    Storage {
        synced: bool,
        kind: &'static str,
        error: Option<watcher::Error>,
    },
}

type InputStream = Pin<Box<dyn Stream<Item = Input> + Send>>;

fn storage_stream<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    kind: &'static str,
) -> InputStream
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    )
    .map(move |ev| match ev {
        Ok(e) => Input::Storage {
            synced: matches!(e, watcher::Event::InitDone),
            kind,
            error: None,
        },
        Err(e) => Input::Storage {
            synced: false,
            kind,
            error: Some(e),
        },
    })
    .boxed()
}

/// Serves the Pods bound to `node_name` until the watches end (they do not, normally).
pub async fn run(client: kube::Client, node_name: String) {
    let pods: Api<Pod> = Api::all(client.clone());
    let (claims, claims_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volumes, volumes_writer) = reflector::store::<PersistentVolume>();
    let pod_stream = watcher(
        pods,
        watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
    )
    .default_backoff()
    .map(|e| Input::Pod(Box::new(e)))
    .boxed();
    let mut inputs = futures::stream::select_all([
        pod_stream,
        storage_stream(
            Api::all(client.clone()),
            claims_writer,
            "PersistentVolumeClaim",
        ),
        storage_stream(Api::all(client.clone()), volumes_writer, "PersistentVolume"),
    ]);
    let mut state = PodLoop {
        client,
        node_name,
        claims,
        volumes,
        pods: HashMap::new(),
        listing: None,
        timers: HashMap::new(),
        updating: HashSet::new(),
        synced: BTreeSet::new(),
        reported: None,
        tasks: JoinSet::new(),
    };
    loop {
        tokio::select! {
            input = inputs.next() => match input {
                Some(input) => state.on_input(input),
                None => {
                    warn!("the Pod watches ended");
                    return;
                }
            },
            Some(done) = state.tasks.join_next(), if !state.tasks.is_empty() => {
                match done {
                    Ok(Done::Status(uid)) => { state.updating.remove(&uid); }
                    Ok(Done::Deleted(uid)) => { state.timers.remove(&uid); }
                    Ok(Done::RetryVolumes) => state.reported = None,
                    Err(e) if e.is_cancelled() => {}
                    Err(e) => warn!(error = %e, "a Pod task failed"),
                }
            }
        }
        state.report_volumes().await;
    }
}

struct PodLoop {
    client: kube::Client,
    node_name: String,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    /// The Pods bound to this node, by uid.
    pods: HashMap<String, Pod>,
    /// Uids seen since the last watch (re)start, until its initial list is complete.
    listing: Option<HashSet<String>>,
    /// Deletion timers, by Pod uid.
    timers: HashMap<String, AbortHandle>,
    /// Pods whose status update is in flight.
    updating: HashSet<String>,
    /// Storage kinds whose store has its initial list.
    synced: BTreeSet<&'static str>,
    /// The volumes last reported (`None`: report again).
    reported: Option<Vec<AttachedVolume>>,
    tasks: JoinSet<Done>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl PodLoop {
    fn on_input(&mut self, input: Input) {
        match input {
            Input::Pod(event) => match *event {
                Err(e) => warn!(error = %e, "Pod watch failed; retrying"),
                Ok(event) => self.on_pod_event(event),
            },
            Input::Storage {
                synced,
                kind,
                error,
            } => {
                if let Some(e) = error {
                    warn!(kind, error = %e, "watch failed; retrying");
                }
                if synced {
                    self.synced.insert(kind);
                }
            }
        }
    }

    fn on_pod_event(&mut self, event: watcher::Event<Pod>) {
        match event {
            watcher::Event::Init => self.listing = Some(HashSet::new()),
            watcher::Event::InitApply(pod) => {
                if let Some(seen) = &mut self.listing {
                    seen.insert(uid_of(&pod));
                }
                self.on_pod(pod);
            }
            watcher::Event::InitDone => {
                // Pods not listed again were deleted while the watch was down.
                if let Some(seen) = self.listing.take() {
                    let gone: Vec<String> = self
                        .pods
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        self.forget(&uid);
                    }
                }
            }
            watcher::Event::Apply(pod) => self.on_pod(pod),
            watcher::Event::Delete(pod) => self.forget(&uid_of(&pod)),
        }
    }

    fn forget(&mut self, uid: &str) {
        if let Some(pod) = self.pods.remove(uid) {
            debug!(pod = %ObjectRef::from_obj(&pod), "Pod gone");
        }
        if let Some(timer) = self.timers.remove(uid) {
            timer.abort();
        }
    }

    fn on_pod(&mut self, pod: Pod) {
        let uid = uid_of(&pod);
        self.pods.insert(uid.clone(), pod.clone());
        if is_terminal(&pod) {
            return;
        }
        let now = Timestamp::now();
        if let Some(delay) = deletion_delay(&pod, now) {
            if !self.timers.contains_key(&uid) {
                let handle = self
                    .tasks
                    .spawn(delete_after(self.client.clone(), pod, delay));
                self.timers.insert(uid, handle);
            }
            return;
        }
        if needs_running_status(&pod) && self.updating.insert(uid) {
            self.tasks.spawn(mark_running(self.client.clone(), pod));
        }
    }

    /// Reports the attached volumes when they changed (once the claim and volume stores
    /// have their initial lists, so a restart does not report a partial set).
    async fn report_volumes(&mut self) {
        if self.synced.len() < 2 {
            return;
        }
        let claims = &self.claims;
        let volumes = &self.volumes;
        let attached = attached_volumes(
            self.pods.values(),
            |ns, name| {
                claims
                    .get(&ObjectRef::new(name).within(ns))
                    .and_then(|c| c.spec.as_ref()?.volume_name.clone())
            },
            |name| volumes.get(&ObjectRef::new(name)).map(|pv| (*pv).clone()),
        );
        if self.reported.as_ref() == Some(&attached) {
            return;
        }
        let in_use: Vec<&str> = attached.iter().map(|v| v.name.as_str()).collect();
        let patch = json!({ "status": { "volumesAttached": attached, "volumesInUse": in_use } });
        let api: Api<Node> = Api::all(self.client.clone());
        match api
            .patch_status(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                info!(volumes = ?in_use, "reported attached volumes");
                self.reported = Some(attached);
            }
            Err(e) => {
                warn!(error = %e, "failed to report attached volumes; retrying");
                self.tasks.spawn(async {
                    tokio::time::sleep(VOLUME_RETRY).await;
                    Done::RetryVolumes
                });
            }
        }
    }
}

/// The retries of a Pod status write or deletion: [`STATUS_ATTEMPTS`] in all, 200 ms apart
/// and doubling.
fn status_backoff() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_factor(2.0)
        .with_max_times(STATUS_ATTEMPTS as usize - 1)
}

/// Whether `e` is an API answer with one of `codes`.
fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Marks a Pod Running/Ready, retrying a few times with backoff.
async fn mark_running(client: kube::Client, pod: Pod) -> Done {
    let uid = uid_of(&pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let patch = json!({ "status": running_pod_status(&pod, Timestamp::now()) });
    let (params, patch) = (PatchParams::default(), Patch::Strategic(&patch));
    let marked = (|| api.patch_status(&name, &params, &patch))
        .retry(status_backoff())
        .when(|e| !is_status(e, &[404]))
        .notify(|e, _| warn!(pod = %format!("{ns}/{name}"), error = %e, "failed to mark the Pod running"))
        .await;
    match marked {
        Ok(_) => info!(pod = %format!("{ns}/{name}"), "Pod running"),
        Err(e) if is_status(&e, &[404]) => {}
        Err(e) => {
            warn!(pod = %format!("{ns}/{name}"), error = %e, "gave up marking the Pod running")
        }
    }
    Done::Status(uid)
}

/// Deletes a terminating Pod for good once its grace period is over (its containers
/// "stopped"): a delete with grace period 0, preconditioned on the uid.
async fn delete_after(client: kube::Client, pod: Pod, delay: Duration) -> Done {
    let uid = uid_of(&pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    tokio::time::sleep(delay).await;
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    // Gone already, or a new Pod with the same name (precondition failed): nothing to do.
    let deleted = (|| api.delete(&name, &params))
        .retry(status_backoff())
        .when(|e| !is_status(e, &[404, 409]))
        .notify(|e, _| warn!(pod = %format!("{ns}/{name}"), error = %e, "failed to delete the Pod"))
        .await;
    match deleted {
        Ok(_) => info!(pod = %format!("{ns}/{name}"), "terminated Pod deleted"),
        Err(e) if is_status(&e, &[404, 409]) => {}
        Err(e) => warn!(pod = %format!("{ns}/{name}"), error = %e, "gave up deleting the Pod"),
    }
    Done::Deleted(uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, Container, PersistentVolumeClaimVolumeSource,
        PersistentVolumeSpec, PodSpec, Volume,
    };

    fn pod(name: &str, claims: &[&str]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.spec = Some(PodSpec {
            containers: vec![
                Container {
                    name: "a".into(),
                    image: Some("img".into()),
                    ..Default::default()
                },
                Container {
                    name: "b".into(),
                    ..Default::default()
                },
            ],
            init_containers: Some(vec![Container {
                name: "init".into(),
                ..Default::default()
            }]),
            volumes: Some(
                claims
                    .iter()
                    .map(|c| Volume {
                        name: format!("v-{c}"),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: (*c).into(),
                            read_only: None,
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    }

    fn with_phase(mut p: Pod, phase: &str) -> Pod {
        p.status.get_or_insert_with(Default::default).phase = Some(phase.into());
        p
    }

    #[test]
    fn running_status() {
        let p = pod("p", &[]);
        assert!(needs_running_status(&p));
        let now = Timestamp::UNIX_EPOCH;
        let status = running_pod_status(&p, now);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let conds: Vec<_> = status
            .conditions
            .clone()
            .expect("conditions")
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect();
        for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert!(conds.contains(&(t.to_string(), "True".to_string())), "{t}");
        }
        let cs = status.container_statuses.clone().expect("statuses");
        assert_eq!(cs.len(), 2);
        assert!(cs.iter().all(|c| c.ready && c.started == Some(true)));
        assert!(
            cs[0]
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some()
        );
        assert_eq!(cs[0].image, "img");
        let init = status.init_container_statuses.clone().expect("init");
        assert_eq!(
            init[0]
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code),
            Some(0)
        );
        assert_eq!(status.pod_ip.as_deref(), Some(LOCAL_IP));
        assert_eq!(status.host_ip.as_deref(), Some(LOCAL_IP));
        assert_eq!(status.start_time, Some(Time(now)));

        let mut done = p.clone();
        done.status = Some(status);
        assert!(!needs_running_status(&done));

        // The scheduler's PodScheduled transition time is kept.
        let scheduled_at = Timestamp::from_second(5).expect("ts");
        let mut scheduled = p.clone();
        scheduled.status = Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: Some(Time(scheduled_at)),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let status = running_pod_status(&scheduled, Timestamp::from_second(9).expect("ts"));
        let times: Vec<_> = status
            .conditions
            .expect("conditions")
            .into_iter()
            .map(|c| (c.type_, c.last_transition_time.map(|t| t.0.as_second())))
            .collect();
        assert_eq!(times[0], ("PodScheduled".to_string(), Some(5)));
        assert_eq!(times[4], ("Ready".to_string(), Some(9)));
    }

    #[test]
    fn finished_and_terminating_pods_are_left_alone() {
        assert!(!needs_running_status(&with_phase(
            pod("p", &[]),
            "Succeeded"
        )));
        assert!(!needs_running_status(&with_phase(pod("p", &[]), "Failed")));
        assert!(needs_running_status(&with_phase(pod("p", &[]), "Pending")));
        let mut p = pod("p", &[]);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(!needs_running_status(&p));
    }

    #[test]
    fn deletion_waits_for_the_rest_of_the_grace_period() {
        let now = Timestamp::from_second(1_000).expect("ts");
        let mut p = pod("p", &[]);
        assert_eq!(deletion_delay(&p, now), None);
        p.metadata.deletion_grace_period_seconds = Some(30);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_010).expect("ts")));
        assert_eq!(deletion_delay(&p, now), Some(Duration::from_secs(10)));
        // Past the deadline: now.
        p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(990).expect("ts")));
        assert_eq!(deletion_delay(&p, now), Some(Duration::ZERO));
        // Never longer than the grace period (clock skew).
        p.metadata.deletion_grace_period_seconds = Some(5);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_100).expect("ts")));
        assert_eq!(deletion_delay(&p, now), Some(Duration::from_secs(5)));
    }

    fn pv(name: &str, csi: Option<(&str, &str)>) -> PersistentVolume {
        let mut v = PersistentVolume::default();
        v.metadata.name = Some(name.into());
        v.spec = Some(PersistentVolumeSpec {
            csi: csi.map(|(driver, handle)| CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: handle.into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        v
    }

    #[test]
    fn volumes_of_the_pods() {
        let pods = [
            pod("a", &["c1", "c2"]),
            pod("b", &["c1", "unbound"]),
            with_phase(pod("done", &["c3"]), "Succeeded"),
        ];
        let bound = |_ns: &str, claim: &str| match claim {
            "c1" => Some("pv-csi".to_string()),
            "c2" => Some("pv-host".to_string()),
            "c3" => Some("pv-other".to_string()),
            _ => None,
        };
        let volume = |name: &str| match name {
            "pv-csi" => Some(pv("pv-csi", Some(("ebs.csi", "vol-1")))),
            "pv-host" => Some(pv("pv-host", None)),
            "pv-other" => Some(pv("pv-other", None)),
            _ => None,
        };
        let names: Vec<String> = attached_volumes(&pods, bound, volume)
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["kubernetes.io/csi/ebs.csi^vol-1", "local/pv-host"]);
        // The last pod using a volume goes: the volume goes.
        let names: Vec<String> = attached_volumes(&pods[1..], bound, volume)
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["kubernetes.io/csi/ebs.csi^vol-1"]);
        assert!(attached_volumes(&[], bound, volume).is_empty());
    }

    #[test]
    fn ephemeral_volumes_use_their_generated_claim() {
        let mut p = pod("web", &[]);
        if let Some(spec) = p.spec.as_mut() {
            spec.volumes = Some(vec![Volume {
                name: "scratch".into(),
                ephemeral: Some(Default::default()),
                ..Default::default()
            }]);
        }
        assert_eq!(
            pod_claims(&p),
            [("ns".to_string(), "web-scratch".to_string())]
        );
    }
}
