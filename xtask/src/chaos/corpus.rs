//! The bad-input corpus (`corpus.yaml`): objects with something wrong, applied like
//! `kubectl apply --server-side` (strict field validation) next to a healthy
//! MachineDeployment. Each must be refused at admission with a message naming the field,
//! or be reported by its controller in status and a Warning Event, or stay untouched; the
//! controllers must neither crash nor loop hot, the healthy machines must not be disturbed,
//! and deleting the corpus must leave nothing behind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, ValidationDirective};
use kube::core::{GroupVersionKind, TypeMeta};
use kube::discovery::Scope;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{CLASS, DEPLOYMENT, Report};
use crate::e2e::ctx::{Ctx, is_running};
use crate::e2e::env::{self, Check, wait_for};

/// The corpus.
const CORPUS: &str = include_str!("corpus.yaml");
/// How long a controller may take to report a problem.
const SURFACE: Duration = Duration::from_secs(60);
/// How long the requests of the controllers are counted while the corpus sits there.
const WINDOW: Duration = Duration::from_secs(30);

/// One corpus entry.
#[derive(Debug, Clone, Deserialize)]
struct Entry {
    name: String,
    expect: Expect,
    objects: Vec<Value>,
}

/// What must become of an entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Expect {
    /// The API server refuses the last object, naming this field.
    Refused(String),
    /// The controller reports the problem on the object.
    Surfaced(Surfaced),
    /// The object works anyway.
    Running(Running),
    /// No controller changes or deletes the object.
    Untouched(Target),
}

/// Where and how a problem must be reported.
#[derive(Debug, Clone, Deserialize)]
struct Surfaced {
    kind: Option<String>,
    name: Option<String>,
    /// A label selector of the objects instead of a name.
    labels: Option<String>,
    /// Text in the object's status (`None` for kinds without status).
    status: Option<String>,
    /// Reason of a Warning Event on the object.
    event: String,
}

/// An object that must work despite its odd input.
#[derive(Debug, Clone, Deserialize)]
struct Running {
    kind: Option<String>,
    name: Option<String>,
    /// A Machine's Node must not be this one.
    node_not: Option<String>,
    /// Reason of a Warning Event that must be on the object.
    event: Option<String>,
}

/// An object by kind and name.
#[derive(Debug, Clone, Deserialize)]
struct Target {
    kind: String,
    name: String,
}

/// Figures of the corpus run.
#[derive(Debug, Default)]
pub struct Figures {
    entries: usize,
    objects: usize,
    refused: usize,
    surfaced: usize,
    running: usize,
    untouched: usize,
    requests: String,
}

impl Figures {
    /// Rows of the report table.
    pub fn print(&self) {
        println!(
            "| bad-input corpus: entries (objects) | {} ({}) |",
            self.entries, self.objects
        );
        println!(
            "| refused at admission / surfaced in status and Event / working anyway / left untouched | {} / {} / {} / {} |",
            self.refused, self.surfaced, self.running, self.untouched
        );
        println!(
            "| requests while the corpus sat there | {} |",
            self.requests
        );
    }
}

/// The corpus with the placeholders replaced.
fn load(vars: &[(&str, &str)]) -> Result<Vec<Entry>> {
    let mut docs = env::yaml_documents(CORPUS)?;
    let mut doc = docs.pop().context("the corpus is empty")?;
    env::substitute(&mut doc, vars);
    serde_json::from_value(doc).context("parsing the corpus")
}

/// Applies `obj` like `kubectl apply --server-side` (strict field validation): the inner
/// result is the API server's answer.
async fn apply_strict(ctx: &Ctx<'_>, obj: &Value) -> Result<Result<DynamicObject, kube::Error>> {
    let (api, name) = dynamic_api(ctx, obj).await?;
    let params = PatchParams {
        field_manager: Some("chaos-corpus".into()),
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::default()
    };
    Ok(api.patch(&name, &params, &Patch::Apply(obj)).await)
}

/// The API of `obj`'s kind (in the scenario's namespace when namespaced) and its name.
async fn dynamic_api(ctx: &Ctx<'_>, obj: &Value) -> Result<(Api<DynamicObject>, String)> {
    let types: TypeMeta = serde_json::from_value(obj.clone()).context("no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types).context("parsing apiVersion")?;
    let name = obj["metadata"]["name"]
        .as_str()
        .context("no metadata.name")?
        .to_string();
    let (resource, caps) = kube::discovery::pinned_kind(&ctx.client, &gvk)
        .await
        .with_context(|| format!("the API server does not serve {}", types.kind))?;
    let api = match caps.scope {
        Scope::Cluster => Api::all_with(ctx.client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(ctx.client.clone(), &ctx.ns, &resource),
    };
    Ok((api, name))
}

/// The message of an API error (a refusal), or the error itself.
fn refusal(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => format!("{other:#}"),
    }
}

/// The reasons of the Warning Events on the object `kind`/`name` of the namespace.
async fn warnings(ctx: &Ctx<'_>, kind: &str, name: &str) -> Result<BTreeSet<String>> {
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .filter_map(|e| e.reason)
        .collect())
}

/// The object an expectation is about: the given kind and name, else the entry's last
/// object's.
fn subject(entry: &Entry, kind: Option<&String>, name: Option<&String>) -> (String, String) {
    let last = entry.objects.last().cloned().unwrap_or_default();
    (
        kind.cloned()
            .unwrap_or_else(|| last["kind"].as_str().unwrap_or_default().to_string()),
        name.cloned().unwrap_or_else(|| {
            last["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }),
    )
}

/// Whether an object works: a Machine Running (on a Node other than `node_not`), a set or
/// deployment with all its replicas ready. Pure.
fn works(obj: &DynamicObject, node_not: Option<&str>) -> bool {
    let status = &obj.data["status"];
    if obj.types.as_ref().is_some_and(|t| t.kind == "Machine") {
        let node = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("node"))
            .map(String::as_str);
        return status["currentStatus"]["phase"] == "Running" && node.is_some() && node != node_not;
    }
    let want = obj.data["spec"]["replicas"].as_i64().unwrap_or(0);
    want > 0 && status["readyReplicas"].as_i64() == Some(want)
}

/// What [`look`] checks on each object of an entry.
struct Wanted {
    kind: String,
    name: String,
    labels: Option<String>,
    /// `None`: the object must work; `Some(text)`: its status must hold the text (any
    /// status when the text is absent).
    status: Option<Option<String>>,
    event: Option<String>,
    node_not: Option<String>,
}

/// What an accepted entry must come to (`None` for refusals and untouched objects).
fn wanted(entry: &Entry) -> Option<Wanted> {
    match &entry.expect {
        Expect::Surfaced(s) => {
            let (kind, name) = subject(entry, s.kind.as_ref(), s.name.as_ref());
            Some(Wanted {
                kind,
                name,
                labels: s.labels.clone(),
                status: Some(s.status.clone()),
                event: Some(s.event.clone()),
                node_not: None,
            })
        }
        Expect::Running(r) => {
            let (kind, name) = subject(entry, r.kind.as_ref(), r.name.as_ref());
            Some(Wanted {
                kind,
                name,
                labels: None,
                status: None,
                event: r.event.clone(),
                node_not: r.node_not.clone(),
            })
        }
        Expect::Refused(_) | Expect::Untouched(_) => None,
    }
}

/// Looks once at what an accepted entry must come to; `Done` when it has.
async fn look(ctx: &Ctx<'_>, entry: &Entry, w: &Wanted) -> Result<Check<()>> {
    let template = object_of(entry, &w.kind, &w.name).cloned().unwrap_or_else(
        || json!({ "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": w.kind, "metadata": { "name": w.name } }),
    );
    let (api, _) = dynamic_api(ctx, &template).await?;
    let objects = match &w.labels {
        Some(selector) => {
            api.list(&ListParams::default().labels(selector))
                .await?
                .items
        }
        None => api.get_opt(&w.name).await?.into_iter().collect(),
    };
    if objects.is_empty() {
        return Ok(Check::Pending(format!(
            "no {} {} {:?}",
            w.kind, w.name, w.labels
        )));
    }
    for obj in &objects {
        let obj_name = obj.metadata.name.clone().unwrap_or_default();
        let status = obj.data["status"].to_string();
        let reasons = warnings(ctx, &w.kind, &obj_name).await?;
        let state_ok = match &w.status {
            None => works(obj, w.node_not.as_deref()),
            Some(text) => text.as_ref().is_none_or(|t| status.contains(t.as_str())),
        };
        if !state_ok || !w.event.as_ref().is_none_or(|e| reasons.contains(e)) {
            return Ok(Check::Pending(format!(
                "{} {obj_name}: status {status}; Warning Events {reasons:?}",
                w.kind
            )));
        }
    }
    Ok(Check::Done(()))
}

/// Finds the object `kind`/`name` among the entry's objects (for its apiVersion).
fn object_of<'e>(entry: &'e Entry, kind: &str, name: &str) -> Option<&'e Value> {
    entry
        .objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// Runs the corpus next to a healthy MachineDeployment.
pub async fn run(ctx: &mut Ctx<'_>, report: &mut Report) -> Result<()> {
    ctx.create_class(CLASS, json!({})).await?;
    ctx.start_controllers(&super::timings(), None).await?;
    ctx.create_deployment(DEPLOYMENT, 3, CLASS).await?;
    let healthy = ctx.await_fleet(3, None).await?;
    let healthy_names: BTreeSet<String> = super::machine_names(&healthy);
    let node = healthy[0]
        .node_name()
        .context("a healthy machine without a node")?
        .to_string();
    let state = ctx.state.root().display().to_string();
    let long = format!("bad-{}", "l".repeat(236));
    let long_machine = format!("bad-{}", "m".repeat(96));
    let kubeconfig = ctx.kubeconfig()?;
    let vars = [
        ("$LONG_MACHINE", long_machine.as_str()),
        ("$KUBECONFIG", kubeconfig.as_str()),
        ("$NS", ctx.ns.as_str()),
        ("$STATE", state.as_str()),
        ("$SECRET", crate::e2e::ctx::SECRET),
        ("$NODE", node.as_str()),
        ("$LONG", long.as_str()),
    ];
    let corpus = load(&vars)?;
    let mut figures = Figures {
        entries: corpus.len(),
        objects: corpus.iter().map(|e| e.objects.len()).sum(),
        ..Figures::default()
    };
    let mc = ctx.machine_controller()?;
    let mgr = ctx.manager()?;
    let requests = "mcm_kube_client_requests_total";
    let before = (mc.metric(requests).await, mgr.metric(requests).await);
    // Resource versions of the objects that must stay untouched.
    let mut untouched = BTreeMap::new();
    for entry in &corpus {
        let (last, first) = entry
            .objects
            .split_last()
            .context("an entry without objects")?;
        let mut prepared = Ok(());
        for obj in first {
            if let Err(e) = apply_strict(ctx, obj).await? {
                prepared = Err(refusal(&e));
                break;
            }
        }
        if let Err(e) = prepared {
            report.violations.push(format!(
                "corpus {}: a valid object of the entry was refused: {e}",
                entry.name
            ));
            continue;
        }
        let applied = apply_strict(ctx, last).await?;
        match (&entry.expect, applied) {
            (Expect::Refused(field), Err(e)) => {
                let message = refusal(&e);
                println!("corpus {:<45} refused: {message}", entry.name);
                if message.contains(field.as_str()) {
                    figures.refused += 1;
                } else {
                    report.violations.push(format!(
                        "corpus {}: refused without naming {field}: {message}",
                        entry.name
                    ));
                }
            }
            (Expect::Refused(field), Ok(_)) => report.violations.push(format!(
                "corpus {}: accepted, expected a refusal naming {field}",
                entry.name
            )),
            (_, Err(e)) => report.violations.push(format!(
                "corpus {}: refused ({}), expected to be accepted",
                entry.name,
                refusal(&e)
            )),
            (Expect::Untouched(t), Ok(obj)) => {
                untouched.insert(
                    (t.kind.clone(), t.name.clone()),
                    (entry.clone(), obj.metadata.resource_version),
                );
            }
            (Expect::Surfaced(_) | Expect::Running(_), Ok(_)) => {}
        }
    }
    // Every accepted entry must come to what it expects, all within one bound.
    let mut pending: Vec<(&Entry, Wanted, String)> = corpus
        .iter()
        .filter_map(|e| wanted(e).map(|w| (e, w, String::new())))
        .collect();
    let deadline = std::time::Instant::now() + SURFACE;
    while !pending.is_empty() && std::time::Instant::now() < deadline {
        let mut left = Vec::new();
        for (entry, w, _) in pending {
            match look(ctx, entry, &w).await {
                Ok(Check::Done(())) => {
                    println!("corpus {:<45} {}", entry.name, outcome(&entry.expect));
                    match entry.expect {
                        Expect::Running(_) => figures.running += 1,
                        _ => figures.surfaced += 1,
                    }
                }
                Ok(Check::Pending(seen)) => left.push((entry, w, seen)),
                Err(e) => left.push((entry, w, format!("error: {e:#}"))),
            }
        }
        pending = left;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    for (entry, _, seen) in pending {
        report.violations.push(format!(
            "corpus {}: not {} within {SURFACE:?}; last seen: {seen}",
            entry.name,
            outcome(&entry.expect)
        ));
    }
    // The controllers while the corpus sits there: no hot loop.
    let mc = ctx.machine_controller()?;
    let mgr = ctx.manager()?;
    let start = (mc.metric(requests).await, mgr.metric(requests).await);
    tokio::time::sleep(WINDOW).await;
    let end = (mc.metric(requests).await, mgr.metric(requests).await);
    let sent = |a: Option<f64>, b: Option<f64>| b.unwrap_or(0.0) - a.unwrap_or(0.0);
    let (mc_sent, mgr_sent) = (sent(start.0, end.0), sent(start.1, end.1));
    let bound = super::IDLE_EXPECTED_PER_SECOND * WINDOW.as_secs_f64()
        + PER_REPORTED_PROBLEM * WINDOW.as_secs_f64() * (figures.surfaced + figures.running) as f64
        + 5.0;
    figures.requests = format!(
        "machine controller {mc_sent:.0}, manager {mgr_sent:.0} in {}s (bound {bound:.0} each); {:.0} and {:.0} while applying",
        WINDOW.as_secs(),
        sent(before.0, start.0),
        sent(before.1, start.1),
    );
    println!("corpus requests: {}", figures.requests);
    for (who, n) in [("machine controller", mc_sent), ("manager", mgr_sent)] {
        if n > bound {
            report.violations.push(format!(
                "corpus: the {who} sent {n:.0} requests in {}s with the corpus in place (bound {bound:.0})",
                WINDOW.as_secs()
            ));
        }
    }
    for ((kind, name), (entry, version)) in &untouched {
        let obj = object_of(entry, kind, name).context("an untouched object not in its entry")?;
        let (api, _) = dynamic_api(ctx, obj).await?;
        let _ = version;
        match api.get_opt(name).await? {
            Some(now) => {
                let ours = our_managers(&now);
                if ours.is_empty() {
                    figures.untouched += 1;
                } else {
                    report.violations.push(format!(
                        "corpus {}: {kind} {name} was changed by {ours:?}",
                        entry.name
                    ));
                }
            }
            None => report.violations.push(format!(
                "corpus {}: {kind} {name} was deleted by a controller",
                entry.name
            )),
        }
    }
    undisturbed(ctx, &healthy_names).await?;
    super::controllers_alive(ctx)?;
    delete_corpus(ctx, &corpus).await?;
    undisturbed(ctx, &healthy_names).await?;
    report.corpus = Some(figures);
    Ok(())
}

/// The field managers of `obj` that are this project's controllers (their field manager is
/// the binary's name, from the User-Agent). Other writers, such as the node lifecycle
/// controller tainting a Node without a kubelet, do not count. Pure.
fn our_managers(obj: &DynamicObject) -> Vec<String> {
    obj.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .filter(|m| m.starts_with("machine-controller"))
        .collect()
}

/// How an expectation reads in the run's output.
fn outcome(expect: &Expect) -> &'static str {
    match expect {
        Expect::Refused(_) => "refused",
        Expect::Surfaced(_) => "surfaced in status and a Warning Event",
        Expect::Running(_) => "working anyway",
        Expect::Untouched(_) => "left untouched",
    }
}

/// Requests per second a reported problem may cost: one retry per `--machine-backoff-max`
/// (2 s in the scenarios), each at most three requests (the bootstrap-token lookup, a status
/// record, the Event series). A hot loop retries without waiting: the one this corpus found
/// sent 130 requests per second.
const PER_REPORTED_PROBLEM: f64 = 3.0 / 2.0;

/// The healthy machines are the same ones, Running, each with one VM, and no VM is left
/// without a Machine; the counters match.
async fn undisturbed(ctx: &Ctx<'_>, healthy: &BTreeSet<String>) -> Result<()> {
    let machines = ctx.machines().await?;
    let names: BTreeSet<String> = super::machine_names(&machines);
    let workers: Vec<_> = machines
        .iter()
        .filter(|m| {
            m.metadata
                .name
                .as_ref()
                .is_some_and(|n| healthy.contains(n))
        })
        .collect();
    if workers.len() != healthy.len() || !workers.iter().all(|m| is_running(m)) {
        bail!(
            "the healthy machines were disturbed: {} of {healthy:?} left, Running: {}",
            workers.len(),
            workers.iter().filter(|m| is_running(m)).count()
        );
    }
    let mut per_machine = BTreeMap::<String, usize>::new();
    for name in ctx.vm_records() {
        *per_machine.entry(name).or_default() += 1;
    }
    let wrong: Vec<_> = per_machine
        .iter()
        .filter(|(m, n)| **n > 1 || !names.contains(*m))
        .collect();
    if !wrong.is_empty() || healthy.iter().any(|m| !per_machine.contains_key(m)) {
        bail!("VM records wrong: duplicated or without a Machine {wrong:?} (healthy {healthy:?})");
    }
    healthy_counters(ctx, healthy.len()).await
}

/// The healthy MachineDeployment's status counters equal its machines.
async fn healthy_counters(ctx: &Ctx<'_>, n: usize) -> Result<()> {
    let api: Api<mcm_api::MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let want = i32::try_from(n).unwrap_or(i32::MAX);
    wait_for(
        "the healthy MachineDeployment's counters",
        WINDOW,
        || async {
            let d = api.get(DEPLOYMENT).await?;
            let s = d.status.clone().unwrap_or_default();
            let counts = (
                s.replicas.unwrap_or(0),
                s.ready_replicas.unwrap_or(0),
                s.updated_replicas.unwrap_or(0),
            );
            Ok(if counts == (want, want, want) {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "(replicas, ready, updated) = {counts:?}, want {want}"
                ))
            })
        },
    )
    .await
}

/// Deletes every accepted corpus object (last first) and waits until all are gone.
async fn delete_corpus(ctx: &Ctx<'_>, corpus: &[Entry]) -> Result<()> {
    let mut apis = Vec::new();
    for entry in corpus {
        if matches!(entry.expect, Expect::Refused(_)) {
            continue;
        }
        for obj in entry.objects.iter().rev() {
            let (api, name) = dynamic_api(ctx, obj).await?;
            match api.delete(&name, &DeleteParams::foreground()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("deleting {name}")),
            }
            apis.push((api, name));
        }
    }
    wait_for("every corpus object to be gone", SURFACE * 2, || async {
        let mut left = Vec::new();
        for (api, name) in &apis {
            if api.get_opt(name).await?.is_some() {
                left.push(name.clone());
            }
        }
        Ok(if left.is_empty() {
            Check::Done(())
        } else {
            Check::Pending(format!("left: {left:?}"))
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_parses_and_has_at_least_25_objects_with_unique_names() {
        let vars = [
            ("$NS", "ns"),
            ("$STATE", "/s"),
            ("$SECRET", "s"),
            ("$NODE", "n"),
            ("$LONG", "l"),
        ];
        let corpus = load(&vars).unwrap();
        let objects: usize = corpus.iter().map(|e| e.objects.len()).sum();
        assert!(objects >= 25, "{objects} objects");
        let names: BTreeSet<_> = corpus.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.len(), corpus.len(), "duplicate entry names");
        // Placeholders are replaced.
        assert!(
            !serde_json::to_string(&corpus.iter().map(|e| &e.objects).collect::<Vec<_>>())
                .unwrap()
                .contains("$NS")
        );
    }
}
