//! Lifecycle hooks of a Machine's deletion (Cluster API's semantics). Pure.
//!
//! While a Machine being deleted carries an annotation
//! `pre-drain.delete.hook.machine.sapcloud.io/<name>: <owner>`, its deletion waits before the
//! drain; while it carries `pre-terminate.delete.hook.machine.sapcloud.io/<name>: <owner>`,
//! it waits after the drain and before the VM is deleted. The owners remove the annotations
//! when their work is done. Without `--machine-lifecycle-hook-timeout` a hook holds for as
//! long as it is there; with it, the deletion goes on after that long, with a Warning.

use std::collections::BTreeMap;
use std::fmt;

use mcm_api::constants::annotations::{hooks, progress};

/// A stage of the deletion that hooks can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookStage {
    /// Before the drain.
    PreDrain,
    /// After the drain, before the VM is deleted.
    PreTerminate,
}

impl HookStage {
    /// The annotation prefix of the stage's hooks.
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            HookStage::PreDrain => hooks::PRE_DRAIN_PREFIX,
            HookStage::PreTerminate => hooks::PRE_TERMINATE_PREFIX,
        }
    }

    /// The progress annotation written when the stage's hooks were given up on.
    pub(crate) fn expired_annotation(self) -> &'static str {
        match self {
            HookStage::PreDrain => progress::PRE_DRAIN_HOOKS_EXPIRED,
            HookStage::PreTerminate => progress::PRE_TERMINATE_HOOKS_EXPIRED,
        }
    }
}

impl fmt::Display for HookStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HookStage::PreDrain => "pre-drain",
            HookStage::PreTerminate => "pre-terminate",
        })
    }
}

/// The hooks of a stage on a Machine, as `name (owner owner)`, sorted by name.
pub(crate) fn hooks_of(
    annotations: Option<&BTreeMap<String, String>>,
    stage: HookStage,
) -> Vec<String> {
    annotations
        .into_iter()
        .flatten()
        .filter_map(|(k, owner)| {
            let name = k.strip_prefix(stage.prefix())?;
            Some(if owner.is_empty() {
                name.to_string()
            } else {
                format!("{name} (owner {owner})")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_are_read_per_stage_with_their_owners() {
        let a: BTreeMap<String, String> = [
            (
                format!("{}etcd-member", hooks::PRE_DRAIN_PREFIX),
                "etcd-operator".to_string(),
            ),
            (format!("{}backup", hooks::PRE_DRAIN_PREFIX), String::new()),
            (
                format!("{}lb", hooks::PRE_TERMINATE_PREFIX),
                "lb-controller".to_string(),
            ),
            (
                "pre-drain.delete.hook.example.com/x".to_string(),
                "y".to_string(),
            ),
        ]
        .into();
        assert_eq!(
            hooks_of(Some(&a), HookStage::PreDrain),
            vec![
                "backup".to_string(),
                "etcd-member (owner etcd-operator)".to_string()
            ]
        );
        assert_eq!(
            hooks_of(Some(&a), HookStage::PreTerminate),
            vec!["lb (owner lb-controller)".to_string()]
        );
        assert!(hooks_of(None, HookStage::PreDrain).is_empty());
    }
}
