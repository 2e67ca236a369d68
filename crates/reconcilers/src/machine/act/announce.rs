//! Carries out an [`Announcement`]: records it on the Machine (a write only when the Machine
//! does not show it yet) and publishes its Events when it is new. The only place that asks.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use mcm_api::Machine;

use super::records::record;
use crate::machine::announcement::{Announcement, Note, Novelty, Target};
use crate::machine::{Ctx, Error};

/// Records the announcement on `m` (a write only when the Machine does not show it yet) and
/// publishes its Events when it is new; whether it was.
pub(crate) async fn announce(ctx: &Ctx, m: &Machine, a: Announcement) -> Result<bool, Error> {
    let new = match a.novelty {
        Novelty::Remembered(topic) => {
            let new = a.is_new_for(m, ctx.last_announced(m, topic).as_deref());
            let text = a.notes.first().map(|n| n.text.as_str()).unwrap_or("");
            ctx.remember_announced(m, topic, text);
            new
        }
        _ => a.is_new_for(m, None),
    };
    if let Some(op) = &a.op {
        record(ctx, m, a.phase.as_ref(), op).await?;
    }
    if new {
        for note in a.notes {
            publish(ctx, m, note).await;
        }
    }
    Ok(new)
}

/// Publishes one Event.
async fn publish(ctx: &Ctx, m: &Machine, n: Note) {
    match n.target {
        Target::Machine => {
            ctx.events
                .publish(&m.object_ref(&()), n.kind, n.reason, n.action, n.text)
                .await;
        }
        Target::Object(reference) => {
            ctx.events
                .publish(&reference, n.kind, n.reason, n.action, n.text)
                .await;
        }
        Target::Node(node) => {
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                // Node events are looked up by the node's name as uid (as the kubelet does).
                uid: Some(node),
                ..Default::default()
            };
            ctx.node_events
                .publish(&reference, n.kind, n.reason, n.action, n.text)
                .await;
        }
    }
}
