//! The validating admission webhook against the real API server: the binary publishes its CA
//! into the ValidatingWebhookConfiguration, the API server calls it, and bad objects are
//! refused before they reach etcd with messages naming their fields; with the webhook down
//! the configuration's failurePolicy decides, and the class controller still reports the
//! provider's problems as an Event.

mod common;

use common::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use mcm_api::{MachineClass, MachineDeployment};
use mcm_testenv::kit::{
    WEBHOOK_NAME, events_for, eventually, free_port, webhook_args, webhook_configuration,
};
use serde_json::{Value, json};

const WEBHOOK: &str = WEBHOOK_NAME;

/// Registers the webhook of namespace `h.ns` at a free port with `failure_policy`; returns
/// the configuration's name and the port.
async fn register(h: &Harness, failure_policy: &str) -> (String, u16) {
    let name = format!("mcm-{}", h.ns);
    let port = free_port();
    let cfg: ValidatingWebhookConfiguration =
        serde_json::from_value(webhook_configuration(&name, &h.ns, port, failure_policy)).unwrap();
    configurations(h)
        .create(&PostParams::default(), &cfg)
        .await
        .unwrap();
    (name, port)
}

fn configurations(h: &Harness) -> Api<ValidatingWebhookConfiguration> {
    Api::all(h.client.clone())
}

fn ca_bundle(c: Option<&ValidatingWebhookConfiguration>) -> Option<Vec<u8>> {
    c?.webhooks
        .as_ref()?
        .first()?
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
}

/// The objects of kind `K` in the harness's namespace, written as plain JSON (a value the
/// typed struct cannot hold, such as a bad duration, must still reach the API server).
fn raw<K: kube::Resource<DynamicType = ()>>(h: &Harness) -> Api<DynamicObject> {
    Api::namespaced_with(h.client.clone(), &h.ns, &ApiResource::erase::<K>(&()))
}

/// The API server's answer to creating `obj`: `Ok` when stored, else its message.
async fn create_json(api: &Api<DynamicObject>, obj: &Value) -> Result<(), String> {
    let obj: DynamicObject = serde_json::from_value(obj.clone()).expect("a test object");
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(e.message),
        Err(e) => Err(e.to_string()),
    }
}

/// Creates `obj` (under a fresh name each attempt: `<name>-<n>`) until the webhook refuses
/// it; returns the refusal and the name it was refused under. The configuration reaches the
/// API server's webhook manager a moment after it is written: until then an attempt is
/// stored, or fails to call the webhook (no CA yet).
/// With `webhook_up` false a failure to call the webhook is the refusal awaited.
async fn refusal_of(
    api: &Api<DynamicObject>,
    obj: &Value,
    what: &str,
    webhook_up: bool,
) -> (String, String) {
    let base = obj["metadata"]["name"].as_str().unwrap().to_string();
    let attempt = std::sync::atomic::AtomicU32::new(0);
    eventually(WAIT, what, || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("{base}-{n}");
        let mut obj = obj.clone();
        obj["metadata"]["name"] = json!(name);
        match create_json(api, &obj).await {
            Err(m) if webhook_up && m.contains("failed calling webhook") => Err(m),
            Err(m) => Ok(Some((m, name))),
            Ok(()) => Err(format!(
                "{name} was stored: the configuration is not in effect yet"
            )),
        }
    })
    .await
}

fn class_json(h: &Harness, name: &str, spec: Value) -> Value {
    serde_json::to_value(h.class_body(name, spec, "local-secret")).unwrap()
}

#[tokio::test]
async fn bad_objects_are_refused_before_they_are_stored() {
    let h = Harness::new("webhook", json!({})).await;
    let (name, port) = register(&h, "Fail").await;
    let configs = configurations(&h);

    let mc = h.spawn_controller("mc", &webhook_args(port, &name));
    let published = mcm_testenv::kit::await_object(
        configs.clone(),
        &name,
        WAIT,
        "the webhook's CA in the configuration's caBundle",
        |c: Option<&ValidatingWebhookConfiguration>| ca_bundle(c).is_some(),
    )
    .await;
    let bundle = ca_bundle(published.as_ref()).unwrap();
    let secret: Secret = Api::namespaced(h.client.clone(), &h.ns)
        .get(&format!("{name}-tls"))
        .await
        .expect("the shared certificate Secret");
    assert_eq!(
        secret
            .data
            .as_ref()
            .unwrap()
            .get("ca.crt")
            .map(|b| b.0.clone()),
        Some(bundle.clone()),
        "the Secret's CA is the published one"
    );

    // A class the local provider cannot use: refused, naming the field, and not stored.
    let classes = raw::<MachineClass>(&h);
    let bad = class_json(&h, "bad", json!({"capacity": {"cpu": "abc"}}));
    let (refused, bad_name) =
        refusal_of(&classes, &bad, "the webhook to refuse cpu: abc", true).await;
    assert!(
        refused.contains(WEBHOOK) && refused.contains("providerSpec.capacity.cpu"),
        "{refused}"
    );
    assert!(classes.get_opt(&bad_name).await.unwrap().is_none());

    // A good class is stored; changing it into a bad one is refused too.
    let good = class_json(&h, "good", json!({"capacity": {"cpu": "2"}}));
    create_json(&classes, &good).await.expect("a good class");
    let patched = classes
        .patch(
            "good",
            &PatchParams::default(),
            &Patch::Merge(json!({"providerSpec": {"capacity": {"cpu": "two"}}})),
        )
        .await
        .expect_err("an update to cpu: two is refused");
    assert!(
        patched.to_string().contains("providerSpec.capacity.cpu"),
        "{patched}"
    );

    // A deployment whose drain timeout no controller could decode is refused naming that
    // field; once that is fixed, its bad annotation is refused.
    let deployments = raw::<MachineDeployment>(&h);
    let d = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"name": "d"}},
            "template": {
                "metadata": {
                    "labels": {"name": "d"},
                    "annotations": {"node.machine.sapcloud.io/preserve": "always"},
                },
                "spec": {"class": {"kind": "MachineClass", "name": "good"}, "drainTimeout": "ten minutes"},
            },
        },
    });
    let refused = create_json(&deployments, &d)
        .await
        .expect_err("the deployment is refused");
    assert!(
        refused.contains("spec.template.spec.drainTimeout"),
        "{refused}"
    );
    let mut fixed = d.clone();
    fixed["spec"]["template"]["spec"]["drainTimeout"] = json!("10m");
    let refused = create_json(&deployments, &fixed)
        .await
        .expect_err("the annotation is refused");
    assert!(
        refused.contains("spec.template.metadata.annotations[node.machine.sapcloud.io/preserve]"),
        "{refused}"
    );
    fixed["spec"]["template"]["metadata"]["annotations"] = json!({});
    create_json(&deployments, &fixed)
        .await
        .expect("the fixed deployment is stored");
    deployments
        .delete("d", &DeleteParams::default())
        .await
        .unwrap();

    // A restart keeps the CA (the Secret is shared), so the configuration stays valid.
    mc.kill().await;
    let _mc = h.spawn_controller("mc-2", &webhook_args(port, &name));
    let again = class_json(&h, "bad-again", json!({"capacity": {"memory": "lots"}}));
    let (refused, _) = refusal_of(&classes, &again, "the restarted webhook to refuse", true).await;
    assert!(
        refused.contains("providerSpec.capacity.memory"),
        "{refused}"
    );
    assert_eq!(
        ca_bundle(configs.get_opt(&name).await.unwrap().as_ref()),
        Some(bundle),
        "the restart published the same CA"
    );
    configs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn with_the_webhook_down_the_failure_policy_decides() {
    let h = Harness::new("webhook-down", json!({})).await;
    // Nothing listens on its port.
    let (name, _) = register(&h, "Fail").await;
    let configs = configurations(&h);
    let classes = raw::<MachineClass>(&h);
    let bad = class_json(&h, "bad", json!({"capacity": {"cpu": "abc"}}));

    // Fail: nothing of the four kinds can be written while the webhook is down. (Until the
    // API server has the configuration, an attempt is stored: each uses a fresh name.)
    let (refused, _) = refusal_of(
        &classes,
        &bad,
        "the API server to apply the Fail policy",
        false,
    )
    .await;
    assert!(
        refused.contains(WEBHOOK) && refused.contains("failed calling webhook"),
        "{refused}"
    );

    // Ignore: writes go through unvalidated ...
    configs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    eventually(
        WAIT,
        "the API server to apply the Ignore policy",
        || async {
            match create_json(&classes, &bad).await {
                Ok(()) => Ok(Some(())),
                Err(m) => Err(m),
            }
        },
    )
    .await;

    // ... and the class controller still says what is wrong, with the provider's rules.
    let _mc = h.spawn_controller("mc", &[]);
    let notes = eventually(WAIT, "an Invalid Event on the class", || async {
        let notes = events_for(&h.client, &h.ns, "bad", "Invalid").await;
        if notes.is_empty() {
            Err(notes)
        } else {
            Ok(Some(notes))
        }
    })
    .await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("providerSpec.capacity.cpu")),
        "{notes:?}"
    );
    let stored: MachineClass = h.classes().get("bad").await.unwrap();
    assert_eq!(stored.provider_spec["capacity"]["cpu"], "abc");
    configs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}
