//! Reading the Events (`events.k8s.io/v1`) the controllers record.

use k8s_openapi::api::events::v1::Event;
use kube::Api;

async fn notes(api: Api<Event>, regarding: impl Fn(&Event) -> bool, reason: &str) -> Vec<String> {
    api.list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("list Events: {e}"))
        .items
        .into_iter()
        .filter(|e| regarding(e) && e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// The notes of the Events in namespace `ns` about the object `name` with reason `reason`.
pub async fn events_for(client: &kube::Client, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let api = Api::namespaced(client.clone(), ns);
    notes(
        api,
        |e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name),
        reason,
    )
    .await
}

/// The notes of the Events (any namespace) about the Node `name` with reason `reason`.
pub async fn node_events_for(client: &kube::Client, name: &str, reason: &str) -> Vec<String> {
    let api = Api::all(client.clone());
    notes(
        api,
        |e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(name)
            })
        },
        reason,
    )
    .await
}

/// Waits up to `timeout` for an Event in namespace `ns` about the object `name` with reason
/// `reason` whose note contains `text`, and returns the notes of that reason. Events are
/// published after the status write they describe, so a test that saw the status waits for
/// the Event instead of reading once.
pub async fn await_event(
    client: &kube::Client,
    ns: &str,
    name: &str,
    reason: &str,
    text: &str,
    timeout: std::time::Duration,
) -> Vec<String> {
    let what = format!("an Event {reason} about {ns}/{name} mentioning {text:?}");
    super::wait::eventually(timeout, &what, || async {
        let notes = events_for(client, ns, name, reason).await;
        notes.iter().any(|n| n.contains(text)).then_some(notes)
    })
    .await
}
