//! Scenarios of a swap between the Go MCM and mcm-rs: `swap-in` (a fleet exactly as the Go
//! MCM leaves it is handed to mcm-rs) and `swap-back` (what mcm-rs leaves carries what the Go
//! MCM needs to finish it). Both read the fixture `fixtures/go-fleet.yaml`.

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use mcm_api::{Machine, MachineClass, MachineDeployment, MachineSet};
use serde_json::{Value, json};

use crate::e2e::ctx::{Ctx, SECRET, Timings, WAIT};
use crate::e2e::env::{Check, substitute, wait_for, yaml_documents};

/// The fixture: a deployment of two machines as the Go MCM leaves it.
const GO_FLEET: &str = include_str!("../fixtures/go-fleet.yaml");
/// "Any non-empty value" in a check against the fixture.
const ANY: &str = "${ANY}";
/// The Node annotation compared by meaning (two JSON texts of one `NodeTemplateSpec`).
const LAST_APPLIED: &str = mcm_api::constants::annotations::LAST_APPLIED_ANNO_LABELS_TAINTS;
/// The deployment of both scenarios.
const MD: &str = "go-pool";
/// Its class.
const CLASS: &str = "go-class";
/// The template hash the Go MCM computed (decimal FNV-32a) and the set named after it
/// (`SafeEncodeString("2736514098")[:5]` is `6c7b9`).
const GO_HASH: &str = "2736514098";
const GO_SET: &str = "go-pool-6c7b9";
/// The Go machines' name suffixes.
const GO_MACHINES: [&str; 2] = ["fq8zx", "r2b6c"];

/// The fixture's document of `kind` with the placeholders of `vars` filled in.
fn fixture(kind: &str, vars: &[(&str, &str)]) -> Result<Value> {
    let mut doc = yaml_documents(GO_FLEET)?
        .into_iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("the fixture has no {kind}"))?;
    substitute(&mut doc, vars);
    Ok(doc)
}

/// Creates `doc` (a deployment, set or machine) with a POST, as a Go client creates it
/// (with the `null`s Go's marshalling writes, `creationTimestamp: null`).
async fn go_create(ctx: &Ctx<'_>, doc: &Value) -> Result<()> {
    use kube::api::{ApiResource, DynamicObject, PostParams};
    let resource = match doc["kind"].as_str() {
        Some("MachineDeployment") => ApiResource::erase::<MachineDeployment>(&()),
        Some("MachineSet") => ApiResource::erase::<MachineSet>(&()),
        Some("Machine") => ApiResource::erase::<Machine>(&()),
        other => anyhow::bail!("go_create of {other:?}"),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ctx.ns, &resource);
    let obj: DynamicObject = serde_json::from_value(doc.clone())?;
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating {} {}", doc["kind"], doc["metadata"]["name"]))?;
    Ok(())
}

/// Where `got` differs from `want` (the fixture's fields, recursively): a `${ANY}` string
/// wants any non-empty value; Go's marshalling artefacts (`creationTimestamp: null`, an empty
/// object) want nothing; arrays are compared element by element; the last-applied record by
/// meaning. Pure.
pub fn differences(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::String(w), _) if w == ANY => {
            if got.as_str().is_none_or(str::is_empty) {
                out.push(format!("{path}: wanted a value, found {got}"));
            }
        }
        (Value::Object(w), _) if w.is_empty() => {}
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                if k == "creationTimestamp" && v.is_null() {
                    continue;
                }
                let here = format!("{path}.{k}");
                let found = g.get(k).unwrap_or(&Value::Null);
                if k == LAST_APPLIED {
                    same_record(&here, v, found, out);
                } else {
                    differences(&here, v, found, out);
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (w, g)) in w.iter().zip(g).enumerate() {
                differences(&format!("{path}[{i}]"), w, g, out);
            }
        }
        _ if want == got => {}
        _ => out.push(format!("{path}: wanted {want}, found {got}")),
    }
}

/// Compares two last-applied records as the Go MCM reads them (`json.Unmarshal` into a
/// `NodeTemplateSpec`: absent, null and empty are the same).
fn same_record(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    let parse = |v: &Value| -> Option<Value> {
        serde_json::from_str::<Value>(v.as_str()?)
            .ok()
            .map(|v| mcm_api::canonical::canonical(&v, &[]).unwrap_or_default())
    };
    match (parse(want), parse(got)) {
        (Some(w), Some(g)) if w == g => {}
        (w, g) => out.push(format!("{path}: wanted the record {w:?}, found {g:?}")),
    }
}

/// One object's differences from its fixture document.
fn check(what: &str, want: &Value, got: &impl serde::Serialize, out: &mut Vec<String>) {
    match serde_json::to_value(got) {
        Ok(got) => differences(what, want, &got, out),
        Err(e) => out.push(format!("{what}: {e}")),
    }
}

/// `value` at `pointer` as a string, or "".
fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Everything of the deployment `MD` (its sets, machines, their Nodes, the class and its
/// Secret) compared with the fixture: what the Go MCM needs to go on with it. Returns the
/// differences and how many objects were compared.
async fn go_view(ctx: &Ctx<'_>) -> Result<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let md = mds.get(MD).await.context("reading the deployment")?;
    let md_uid = md.uid().unwrap_or_default();
    let base = [
        ("${MD}", MD),
        ("${CLASS}", CLASS),
        ("${SECRET}", SECRET),
        ("${HASH}", ANY),
        ("${SET_UID}", ANY),
        ("${PROVIDER_ID}", ANY),
        ("${MD_UID}", md_uid.as_str()),
    ];
    let mut compared = 1;
    check(
        "MachineDeployment",
        &fixture("MachineDeployment", &base)?,
        &md,
        &mut out,
    );
    let sets = sets.list(&ListParams::default()).await?.items;
    let live: Vec<&MachineSet> = sets.iter().filter(|s| s.spec.replicas() > 0).collect();
    ensure!(live.len() == 1, "{} sets with replicas", live.len());
    let set = live[0];
    let set_name = set.name_any();
    let set_value = serde_json::to_value(set)?;
    let hash = str_at(&set_value, "/metadata/labels/machine-template-hash").to_string();
    for pointer in [
        "/spec/selector/matchLabels/machine-template-hash",
        "/spec/template/metadata/labels/machine-template-hash",
    ] {
        if str_at(&set_value, pointer) != hash || hash.is_empty() {
            out.push(format!(
                "MachineSet {set_name}{pointer}: {:?}, its label {hash:?}",
                str_at(&set_value, pointer)
            ));
        }
    }
    let with_set = |extra: &[(&'static str, String)]| -> Vec<(String, String)> {
        base.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("${SET}".to_string(), set_name.clone())])
            .chain(extra.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .collect()
    };
    let vars = |v: &[(String, String)]| -> Vec<(String, String)> { v.to_vec() };
    let fill = |kind: &str, v: &[(String, String)]| -> Result<Value> {
        let pairs: Vec<(&str, &str)> = v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        fixture(kind, &pairs)
    };
    compared += 1;
    check(
        &format!("MachineSet {set_name}"),
        &fill("MachineSet", &vars(&with_set(&[])))?,
        set,
        &mut out,
    );
    let machines: Vec<Machine> = ctx
        .machines()
        .await?
        .into_iter()
        .filter(|m| mcm_api::owner::controller_of(&m.metadata).is_some_and(|o| o.name == set_name))
        .collect();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for m in &machines {
        let name = m.name_any();
        let node = m.labels().get("node").cloned().unwrap_or_default();
        let v = with_set(&[("${MACHINE}", name.clone()), ("${NODE}", node.clone())]);
        compared += 1;
        check(
            &format!("Machine {name}"),
            &fill("Machine", &v)?,
            m,
            &mut out,
        );
        if m.labels().get("machine-template-hash") != Some(&hash) {
            out.push(format!(
                "Machine {name}: template hash differs from its set's"
            ));
        }
        match nodes.get_opt(&node).await? {
            Some(n) => {
                compared += 1;
                check(&format!("Node {node}"), &fill("Node", &v)?, &n, &mut out);
            }
            None => out.push(format!("Machine {name}: no Node {node:?}")),
        }
    }
    ensure!(
        machines.len() == 2,
        "{} machines of {set_name}",
        machines.len()
    );
    let classes: Api<MachineClass> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    check(
        "MachineClass",
        &fixture("MachineClass", &base)?,
        &classes.get(CLASS).await?,
        &mut out,
    );
    check(
        "Secret",
        &fixture("Secret", &base)?,
        &secrets.get(SECRET).await?,
        &mut out,
    );
    Ok((out, compared + 2))
}

/// `swap-back`: a deployment run by mcm-rs, then mcm-rs stopped. Every object carries what the
/// Go MCM needs to finish it, field by field against the Go fleet's fixture: the finalizer
/// names on deployment, set, machines, class and Secret, the set's template hash in its
/// labels, selector and template, the machines' controller references, `node` label,
/// providerID and priority, the Nodes' finalizer, machine-name label and a last-applied
/// record the Go MCM reads as the template.
pub async fn swap_back(ctx: &mut Ctx<'_>) -> Result<String> {
    ctx.create_class(CLASS, json!({})).await?;
    ctx.start_controllers(&Timings::default(), None).await?;
    let mut md = fixture("MachineDeployment", &[("${MD}", MD), ("${CLASS}", CLASS)])?;
    // As a user (or Gardener) creates it: no finalizer, no revision.
    md["metadata"] = json!({ "name": MD });
    go_create(ctx, &md).await?;
    ctx.await_fleet(2, Some(CLASS)).await?;
    // Some of it (the Node's record, its finalizer) is written after the machines run.
    wait_for("what the Go MCM needs, on every object", WAIT, || async {
        let (problems, _) = go_view(ctx).await?;
        Ok(if problems.is_empty() {
            Check::Done(())
        } else {
            Check::Pending(problems.join("; "))
        })
    })
    .await?;
    ctx.stop_controllers().await;
    let (problems, compared) = go_view(ctx).await?;
    ensure!(
        problems.is_empty(),
        "after mcm-rs stopped: {}",
        problems.join("; ")
    );
    Ok(format!(
        "{compared} objects left by mcm-rs carry what the Go MCM needs (finalizers, hash labels, owners, node finalizer and record)"
    ))
}

/// `swap-in`: a fleet exactly as the Go MCM leaves it (deployment, Go-named set with Go's
/// numeric template hash, two machines with Go's finalizer and priority, Nodes with the Node
/// finalizer and Go's last-applied record, Go's statuses) is handed to mcm-rs: nothing is
/// rolled out or replaced; then a scale-down, a rollout and the deletion of the deployment
/// complete, nothing left behind or stuck. The fleet is created with POSTs, as the Go MCM
/// creates it, and its Go-marshalled documents are server-side applied again after the swap,
/// as a GitOps tool re-applies them.
pub async fn swap_in(ctx: &mut Ctx<'_>) -> Result<String> {
    let began = Instant::now();
    let mut class = ctx.class_body(CLASS, json!({}));
    class["metadata"]["finalizers"] =
        json!([mcm_api::constants::finalizers::MACHINE_CONTROLLER_MANAGER]);
    ctx.apply(&class).await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    secrets
        .patch(
            SECRET,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers":
                [mcm_api::constants::finalizers::MACHINE_CONTROLLER] } })),
        )
        .await
        .context("the Secret's Go finalizer")?;
    let (md_uid, go_documents) = create_go_fleet(ctx).await?;
    // The machines' VMs: the machine controller alone stands in for the Go one that created
    // them (a VM is the provider's, the same under either).
    let timings = Timings::default();
    ctx.start_machine_controller(&timings, None).await?;
    ctx.await_fleet(2, Some(CLASS)).await?;
    ctx.stop_controllers().await;
    leave_as_go_does(ctx, &md_uid).await?;
    let before: BTreeSet<String> = ctx
        .machines()
        .await?
        .iter()
        .filter_map(|m| m.uid())
        .collect();
    let vms_before = ctx.vm_records();

    // The swap.
    ctx.start_controllers(&timings, None).await?;
    await_reconciled(ctx).await?;
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let names = set_names(&sets).await?;
    ensure!(
        names == [GO_SET],
        "sets after the swap: {names:?} (a rollout?)"
    );
    let fleet = ctx.await_fleet(2, Some(CLASS)).await?;
    let after: BTreeSet<String> = fleet.iter().filter_map(|m| m.uid()).collect();
    ensure!(
        after == before,
        "machines replaced: {before:?} -> {after:?}"
    );
    ensure!(
        ctx.vm_records() == vms_before,
        "VMs changed: {vms_before:?} -> {:?}",
        ctx.vm_records()
    );

    // A GitOps tool applies the same Go manifests again, server-side: accepted, and nothing
    // rolls out or is replaced.
    reapply_go_fleet(ctx, &go_documents).await?;
    let fleet = ctx.await_fleet(2, Some(CLASS)).await?;
    let reapplied: BTreeSet<String> = fleet.iter().filter_map(|m| m.uid()).collect();
    let names = set_names(&sets).await?;
    ensure!(
        reapplied == before && names == [GO_SET],
        "after the server-side apply: sets {names:?}, machines {before:?} -> {reapplied:?}"
    );

    // Scale down: the Go-held machine, its VM and its Node go.
    ctx.patch_deployment(MD, json!({ "spec": { "replicas": 1 } }))
        .await?;
    let one = ctx.await_fleet(1, Some(CLASS)).await?;
    ensure!(
        one.iter()
            .all(|m| m.uid().is_some_and(|u| before.contains(&u))),
        "the scale-down replaced a machine"
    );
    // Roll out to another class: the Go machine is replaced.
    ctx.create_class("go-class-2", json!({})).await?;
    ctx.patch_deployment(
        MD,
        json!({ "spec": { "template": { "spec": { "class": { "name": "go-class-2" } } } } }),
    )
    .await?;
    ctx.await_fleet(1, Some("go-class-2")).await?;
    // Delete the deployment: nothing left, nothing stuck.
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    mds.delete(MD, &DeleteParams::default())
        .await
        .context("deleting the deployment")?;
    wait_for("everything to be gone", WAIT, || async {
        let left = [
            (
                "deployments",
                mds.list(&ListParams::default()).await?.items.len(),
            ),
            ("sets", sets.list(&ListParams::default()).await?.items.len()),
            ("machines", ctx.machines().await?.len()),
            ("nodes", ctx.nodes().await?.len()),
            ("VM records", ctx.vm_records().len()),
            ("VM processes", ctx.vm_process_count()),
        ];
        Ok(if left.iter().all(|(_, n)| *n == 0) {
            Check::Done(())
        } else {
            Check::Pending(format!("{left:?}"))
        })
    })
    .await?;
    Ok(format!(
        "Go fleet of 2 (POSTed) taken over without a rollout or replacement; its Go manifests server-side applied again without a change; scaled to 1, rolled out, deleted: nothing left ({:.0}s)",
        began.elapsed().as_secs_f64()
    ))
}

/// The names of the namespace's MachineSets.
async fn set_names(sets: &Api<MachineSet>) -> Result<Vec<String>> {
    Ok(sets
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|s| s.name_any())
        .collect())
}

/// Creates the deployment, the Go-named set and its two machines from the fixture (the
/// machines without VM yet), with a POST each as the Go MCM creates them; returns the
/// deployment's uid and the documents created.
async fn create_go_fleet(ctx: &Ctx<'_>) -> Result<(String, Vec<Value>)> {
    let base = [
        ("${MD}", MD),
        ("${CLASS}", CLASS),
        ("${SET}", GO_SET),
        ("${HASH}", GO_HASH),
    ];
    let mut created = vec![fixture("MachineDeployment", &base)?];
    go_create(ctx, &created[0]).await?;
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let md_uid = mds.get(MD).await?.uid().context("the deployment's uid")?;
    let mut vars = base.to_vec();
    vars.push(("${MD_UID}", &md_uid));
    created.push(fixture("MachineSet", &vars)?);
    go_create(ctx, &created[1]).await?;
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let set_uid = sets.get(GO_SET).await?.uid().context("the set's uid")?;
    for suffix in GO_MACHINES {
        let name = format!("{GO_SET}-{suffix}");
        let mut vars = vars.clone();
        vars.push(("${SET_UID}", &set_uid));
        vars.push(("${MACHINE}", &name));
        let mut m = fixture("Machine", &vars)?;
        // Recorded by the machine controller once the VM exists.
        m["spec"]
            .as_object_mut()
            .context("the Machine's spec")?
            .remove("providerID");
        m["metadata"]["labels"]
            .as_object_mut()
            .context("the Machine's labels")?
            .remove("node");
        go_create(ctx, &m).await?;
        created.push(m);
    }
    Ok((md_uid, created))
}

/// Server-side applies the Go fleet's documents as a GitOps tool re-applies the manifests a
/// Go program wrote (`creationTimestamp: null` in the templates, `spec: {}`): each is
/// accepted, and the deployment gets no new generation (the template is the same).
async fn reapply_go_fleet(ctx: &Ctx<'_>, documents: &[Value]) -> Result<()> {
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let generation = mds.get(MD).await?.metadata.generation;
    for doc in documents {
        crate::e2e::env::apply(&ctx.client, &ctx.ns, doc)
            .await
            .with_context(|| {
                format!(
                    "a server-side apply of the Go-marshalled {} {}",
                    doc["kind"], doc["metadata"]["name"]
                )
            })?;
    }
    let after = mds.get(MD).await?.metadata.generation;
    ensure!(
        after == generation,
        "the apply of the same Go manifest changed the deployment: generation {generation:?} -> {after:?}"
    );
    Ok(())
}

/// What the Go MCM writes that the stand-in did not, or wrote otherwise: Go's last-applied
/// record and the Node finalizer on each Node, and the statuses of the set and deployment.
async fn leave_as_go_does(ctx: &Ctx<'_>, md_uid: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for m in ctx.machines().await? {
        let node_name = m.labels().get("node").cloned().context("a node label")?;
        let node = fixture(
            "Node",
            &[("${NODE}", &node_name), ("${MACHINE}", &m.name_any())],
        )?;
        let patch = json!({ "metadata": {
            "labels": node["metadata"]["labels"],
            "annotations": node["metadata"]["annotations"],
            "finalizers": node["metadata"]["finalizers"],
        } });
        nodes
            .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("Go's marks on Node {node_name}"))?;
    }
    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    sets.patch_status(
        GO_SET,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 2,
            "availableReplicas": 2, "observedGeneration": 1,
        } })),
    )
    .await
    .context("the set's Go status")?;
    let mds: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let generation = mds.get(MD).await?.metadata.generation.unwrap_or(1);
    let now = jiff::Timestamp::now().to_string();
    mds.patch_status(
        MD,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2,
            "observedGeneration": generation,
            "conditions": [
                { "type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                  "message": "Deployment has minimum availability.",
                  "lastUpdateTime": now, "lastTransitionTime": now },
                { "type": "Progressing", "status": "True", "reason": "NewMachineSetAvailable",
                  "message": format!("Machine Set \"{GO_SET}\" has successfully progressed."),
                  "lastUpdateTime": now, "lastTransitionTime": now },
            ],
        } })),
    )
    .await
    .with_context(|| format!("the Go status of deployment {MD} ({md_uid})"))?;
    Ok(())
}

/// Waits until both controllers reconciled what they took over: the deployment and set
/// controllers at least once each, the machine controller once per machine (a rollout or a
/// replacement would have started in those reconciles).
async fn await_reconciled(ctx: &Ctx<'_>) -> Result<()> {
    const COUNT: &str = "mcm_controller_reconcile_duration_seconds_count";
    wait_for("the first reconciles after the swap", WAIT, || async {
        let manager = ctx.manager()?.metrics_text().await.unwrap_or_default();
        let machine = ctx
            .machine_controller()?
            .metrics_text()
            .await
            .unwrap_or_default();
        let of = |text: &str, c: &str| {
            mcm_testenv::kit::metric_with(text, COUNT, &format!("controller=\"{c}\""))
        };
        let seen = [
            of(&manager, "machinedeployment"),
            of(&manager, "machineset"),
            of(&machine, "machine"),
        ];
        Ok(if seen[0] >= 1.0 && seen[1] >= 1.0 && seen[2] >= 2.0 {
            Check::Done(())
        } else {
            Check::Pending(format!("reconciles (deployment, set, machine): {seen:?}"))
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_is_what_the_checks_compare() {
        let md = fixture("MachineDeployment", &[("${MD}", "a")]).unwrap();
        assert_eq!(md["metadata"]["name"], "a");
        for kind in ["MachineSet", "Machine", "Node", "MachineClass", "Secret"] {
            fixture(kind, &[]).unwrap();
        }
    }

    #[test]
    fn differences_follow_go_s_reading() {
        let want = json!({
            "metadata": {
                "creationTimestamp": null,
                "finalizers": ["f"],
                "labels": { "h": ANY, "n": "x" },
                "annotations": { LAST_APPLIED:
                    r#"{"metadata":{"creationTimestamp":null,"labels":{"a":"b"}},"spec":{}}"# },
            },
            "spec": {},
        });
        let ours = json!({
            "metadata": {
                "finalizers": ["f"],
                "labels": { "h": "123", "n": "x", "other": "y" },
                "annotations": { LAST_APPLIED:
                    r#"{"metadata":{"labels":{"a":"b"},"annotations":{}},"spec":{"taints":[]}}"# },
            },
            "spec": { "taints": [] },
        });
        let mut out = Vec::new();
        differences("o", &want, &ours, &mut out);
        assert_eq!(out, Vec::<String>::new());
        let mut wrong = ours.clone();
        wrong["metadata"]["finalizers"] = json!(["g"]);
        wrong["metadata"]["labels"]["h"] = json!("");
        wrong["metadata"]["annotations"][LAST_APPLIED] = json!(r#"{"metadata":{}}"#);
        let mut out = Vec::new();
        differences("o", &want, &wrong, &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        // A second finalizer is a difference (the Go MCM would wait for it).
        wrong = ours.clone();
        wrong["metadata"]["finalizers"] = json!(["f", "g"]);
        let mut out = Vec::new();
        differences("o", &want, &wrong, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    /// The Go-named set of the fixture is its deployment's new set (upstream's
    /// `EqualIgnoreHash`), so taking it over rolls nothing out.
    #[test]
    fn the_go_set_is_the_deployment_s_new_set() {
        let vars = [
            ("${MD}", MD),
            ("${CLASS}", CLASS),
            ("${SET}", GO_SET),
            ("${HASH}", GO_HASH),
            ("${MD_UID}", "u"),
        ];
        let md: MachineDeployment =
            serde_json::from_value(fixture("MachineDeployment", &vars).unwrap()).unwrap();
        let set: MachineSet =
            serde_json::from_value(fixture("MachineSet", &vars).unwrap()).unwrap();
        let t = set.spec.template.as_ref().unwrap();
        assert_eq!(
            mcm_api::canonical::set_identity(t),
            mcm_api::canonical::set_identity(&md.spec.template)
        );
    }
}
