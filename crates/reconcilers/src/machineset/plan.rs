//! The second part of a reconcile of a set, pure: from a [`Snapshot`], every write and
//! Event of the reconcile, in order, and its requeue ([`Decision`]). It composes the pure
//! rules of [`super::decide`] (claims, auto-preservation, replicas, counts, status) and
//! [`super::budget`] (the gate's verdicts). Where a write's outcome changes what follows,
//! the decision says what to do for each outcome:
//!
//! - the set gone while its finalizer is added ends the reconcile;
//! - a machine to adopt or auto-preserve that is gone ends it too (the plan counted it;
//!   the next reconcile decides without it), after [`GONE_RETRY`];
//! - a failed creation skips the deletions; a failure writes the status of that failure
//!   ([`StatusPlan`]) and fails the reconcile;
//! - the gate refuses the reservation of admitted deletions when another reconcile's
//!   admissions outdated this one's view: they are not issued, the set looks again after
//!   [`GATE_CONFLICT_RETRY`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use mcm_api::constants::annotations;
use mcm_api::{Machine, MachineSet, MachineSetStatus};
use serde_json::Value;

use super::budget::{self, RefusalNote};
use super::context::FINALIZER;
use super::decide::{self, ReplicaFailure};
use super::model::{Claim, Snapshot};
use crate::disruptionbudget::gate::Reservation;

/// How often a set is reconciled without any event (MCM: 10 minutes).
pub(crate) const RESYNC_PERIOD: Duration = Duration::from_secs(600);
/// How soon a set whose deletions a budget holds back looks again at the latest (a change
/// of the budget's status wakes it sooner).
pub(crate) const BUDGET_RECHECK: Duration = Duration::from_secs(10);
/// How soon a set looks again while the creations and deletions it issued are not in the
/// machine store yet.
pub(crate) const AWAIT_EXPECTATIONS: Duration = Duration::from_millis(500);
/// How soon a set looks again after a machine it planned with was gone.
pub(crate) const GONE_RETRY: Duration = Duration::from_secs(1);
/// How soon a set looks again after the gate refused its reservation.
pub(crate) const GATE_CONFLICT_RETRY: Duration = Duration::from_secs(1);

/// What one reconcile of a set does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// Add the finalizer first (the set gone: stop).
    pub(crate) add_finalizer: bool,
    /// Drop the set's expectations: the store shows them (or they timed out).
    pub(crate) clear_expectations: bool,
    /// The rest.
    pub(crate) work: Work,
}

/// The work of a reconcile after the finalizer and the expectations.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Work {
    /// A set being deleted without our finalizer: nothing.
    Idle,
    /// The set waits for its creations and deletions to reach the store.
    AwaitExpectations,
    /// A set being deleted without machines: release the finalizer and forget what was
    /// announced for it.
    Finish,
    /// Manage the set's machines.
    Manage(Box<Manage>),
}

/// A controller-reference write on a machine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimWrite {
    /// The machine as the store had it.
    pub(crate) machine: Arc<Machine>,
    /// Adopt (take the set as controller) or release (drop the controller reference).
    pub(crate) adopt: bool,
}

/// An auto-preservation write on a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreserveWrite {
    /// The machine.
    pub(crate) machine: String,
    /// The resourceVersion the plan was made from (the patch's guard).
    pub(crate) resource_version: Option<String>,
    /// Set (`true`) or remove the `auto-preserved` annotation.
    pub(crate) auto_preserved: bool,
}

/// The creations of a reconcile.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Creation {
    /// None.
    None,
    /// Machines are missing but the template has no labels: the reconcile fails.
    TemplateWithoutLabels,
    /// Create machines from `template` in slow-start batches (a failed batch skips the
    /// rest).
    Create {
        /// The sizes of the batches.
        batches: Vec<usize>,
        /// The Machine to create.
        template: Box<Machine>,
        /// The Warning about an effective-creation-timeout annotation that does not parse.
        invalid_timeout: Option<String>,
    },
}

/// The deletions of a reconcile, with the gate's verdicts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Deletion {
    /// The machines to delete (admitted by the gate or not gated), in deletion order.
    pub(crate) issue: Vec<String>,
    /// The admitted ones among them (not issued when the reservation is refused).
    pub(crate) admitted: Vec<String>,
    /// What to record in the gate first (`None`: nothing).
    pub(crate) reservation: Option<Reservation>,
    /// The announcement of the refusals.
    pub(crate) refusals: RefusalNote,
    /// The uid of each machine to delete (the deletion's precondition).
    pub(crate) uids: BTreeMap<String, Option<String>>,
    /// A deletion was refused (by a budget, or because the budgets are not listed yet).
    pub(crate) held: bool,
}

/// The status to write for each outcome. The failures' `ReplicaFailure` condition carries
/// an empty message, which is the error's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusPlan {
    /// All went well.
    pub(crate) ok: MachineSetStatus,
    /// A creation failed.
    pub(crate) create_failed: MachineSetStatus,
    /// A deletion failed.
    pub(crate) delete_failed: MachineSetStatus,
}

/// The management of a set's machines, in the order of its steps.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Manage {
    /// The selector-overlap note to announce (empty: no overlap; `None` for a set being
    /// deleted, which announces nothing).
    pub(crate) overlap: Option<String>,
    /// Adoptions and releases, in the store's order.
    pub(crate) claims: Vec<ClaimWrite>,
    /// Spec patches of claimed machines (machine name, merge patch).
    pub(crate) spec_syncs: Vec<(String, Value)>,
    /// Auto-preservation writes.
    pub(crate) auto_preserve: Vec<PreserveWrite>,
    /// Creations.
    pub(crate) create: Creation,
    /// Deletions (`None`: none planned).
    pub(crate) delete: Option<Deletion>,
    /// The status.
    pub(crate) status: StatusPlan,
    /// Why no machine is created although some are missing.
    pub(crate) scale_up_blocked: Option<&'static str>,
    /// When to look again.
    pub(crate) requeue: Duration,
    /// When to look again if the gate refuses the reservation.
    pub(crate) requeue_on_gate_conflict: Duration,
}

/// Decides one reconcile of the set of `s`. Pure.
pub(crate) fn plan(s: &Snapshot) -> Decision {
    let set = &*s.set;
    let deleting = set.metadata.deletion_timestamp.is_some();
    let has_finalizer = set.finalizers().iter().any(|f| f == FINALIZER);
    let decision = |add_finalizer, clear_expectations, work| Decision {
        add_finalizer,
        clear_expectations,
        work,
    };
    if deleting && !has_finalizer {
        return decision(false, false, Work::Idle);
    }
    let add_finalizer = !deleting && !has_finalizer;
    let satisfied = s
        .pending
        .as_ref()
        .map(|p| decide::expectations_satisfied(p, &s.machines, s.instant));
    if satisfied == Some(false) {
        return decision(add_finalizer, false, Work::AwaitExpectations);
    }
    let clear = satisfied == Some(true);
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let mut claimed: Vec<Arc<Machine>> = Vec::new();
    let mut claims = Vec::new();
    for m in &s.machines {
        match decide::claim(&uid, deleting, set.spec.selector.as_ref(), m) {
            Claim::Owned => claimed.push(m.clone()),
            Claim::Adopt => {
                claims.push(ClaimWrite {
                    machine: m.clone(),
                    adopt: true,
                });
                claimed.push(m.clone());
            }
            Claim::Release => claims.push(ClaimWrite {
                machine: m.clone(),
                adopt: false,
            }),
            Claim::Ignore => {}
        }
    }
    if deleting && claimed.is_empty() {
        return decision(add_finalizer, clear, Work::Finish);
    }
    let work = Work::Manage(Box::new(manage(s, claims, claimed)));
    decision(add_finalizer, clear, work)
}

/// The management of the `claimed` machines of the set of `s` (after `claims`). Pure.
fn manage(s: &Snapshot, claims: Vec<ClaimWrite>, mut claimed: Vec<Arc<Machine>>) -> Manage {
    let set = &*s.set;
    let deleting = set.metadata.deletion_timestamp.is_some();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let overlap = (!deleting).then(|| {
        decide::overlap_note(
            &uid,
            set.spec.selector.as_ref(),
            s.machines.iter().map(AsRef::as_ref),
        )
    });
    let spec_syncs = if deleting {
        Vec::new()
    } else {
        claimed
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter_map(|m| Some((m.name_any(), decide::machine_spec_patch(set, m)?)))
            .collect()
    };
    // Before the replicas: a Failed machine annotated now is kept in this very pass.
    let auto_preserve = if deleting {
        Vec::new()
    } else {
        auto_preserve(set, &mut claimed)
    };
    let views = decide::views(set, &claimed, &s.node_preserve, s.now);
    let replicas = decide::plan_replicas(&decide::set_input(set), &views);
    let create = creation(set, replicas.create);
    let delete = (!replicas.delete.is_empty()).then(|| deletion(s, &replicas.delete, &claimed));
    let held = delete.as_ref().is_some_and(|d| d.held);
    let counts = decide::count_machines(&views, set.spec.min_ready_seconds.unwrap_or(0), s.now);
    let failed = |reason| {
        let failure = ReplicaFailure {
            reason,
            message: "",
        };
        decide::desired_status(set, &counts, Some(failure), s.now)
    };
    let status = StatusPlan {
        ok: decide::desired_status(set, &counts, None, s.now),
        create_failed: failed("FailedCreate"),
        delete_failed: failed("FailedDelete"),
    };
    // A Machine that disappears (also the last one of a deleting set) triggers this set
    // through the manager's deletion tap; no polling is needed for it.
    let recheck = counts
        .recheck_after
        .map_or(RESYNC_PERIOD, |after| after + Duration::from_secs(1));
    let requeue = if held {
        recheck.min(BUDGET_RECHECK)
    } else {
        recheck
    };
    Manage {
        overlap,
        claims,
        spec_syncs,
        auto_preserve,
        create,
        delete,
        status,
        scale_up_blocked: replicas.scale_up_blocked,
        requeue,
        requeue_on_gate_conflict: requeue.min(GATE_CONFLICT_RETRY),
    }
}

/// The auto-preservation writes of the set (at most `spec.autoPreserveFailedMachineMax`
/// machines annotated), and `claimed` as they make it. Pure.
fn auto_preserve(set: &MachineSet, claimed: &mut [Arc<Machine>]) -> Vec<PreserveWrite> {
    let max = set.spec.auto_preserve_failed_machine_max.unwrap_or(0);
    let plan = decide::plan_auto_preservation(max, claimed.iter().map(AsRef::as_ref));
    let changes = plan
        .annotate
        .iter()
        .map(|n| (n, true))
        .chain(plan.release.iter().map(|n| (n, false)));
    let mut writes = Vec::new();
    for (name, auto_preserved) in changes {
        let Some(slot) = claimed.iter_mut().find(|m| m.name_any() == *name) else {
            continue;
        };
        writes.push(PreserveWrite {
            machine: name.clone(),
            resource_version: slot.resource_version(),
            auto_preserved,
        });
        *slot = Arc::new(decide::with_auto_preservation(slot, auto_preserved));
    }
    writes
}

/// The creation of `count` machines of `set`. Pure.
fn creation(set: &MachineSet, count: usize) -> Creation {
    if count == 0 {
        return Creation::None;
    }
    if set
        .template_labels()
        .is_none_or(std::collections::BTreeMap::is_empty)
    {
        return Creation::TemplateWithoutLabels;
    }
    let invalid_timeout = match decide::effective_creation_timeout(set) {
        Some(Err(e)) => Some(format!(
            "annotation {} is not a duration ({e}); new machines keep the creation timeout of \
             their template",
            annotations::EFFECTIVE_CREATION_TIMEOUT
        )),
        _ => None,
    };
    Creation::Create {
        batches: decide::slow_start_batches(count, decide::SLOW_START_INITIAL_BATCH_SIZE),
        template: Box::new(decide::machine_from_template(set)),
        invalid_timeout,
    }
}

/// The deletion of `names` of the `claimed` machines, with the gate's verdicts. Pure.
fn deletion(s: &Snapshot, names: &[String], claimed: &[Arc<Machine>]) -> Deletion {
    let verdicts = budget::gate_deletions(s, names, claimed);
    let uids = names
        .iter()
        .map(|n| {
            let uid = s
                .machines
                .iter()
                .find(|m| m.name_any() == *n)
                .and_then(|m| m.metadata.uid.clone());
            (n.clone(), uid)
        })
        .collect();
    Deletion {
        refusals: budget::refusal_note(s, &verdicts.refused),
        held: !verdicts.refused.is_empty(),
        issue: verdicts.issue,
        admitted: verdicts.admitted,
        reservation: verdicts.reservation,
        uids,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashSet};
    use std::time::Instant;

    use jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::disruptionbudget::gate::{Enforcement, GateView};
    use crate::machineset::model::PendingChanges;

    const UID: &str = "set-uid";

    fn set(replicas: i32, extra: serde_json::Value) -> MachineSet {
        let mut v = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
            "metadata": {
                "name": "s", "namespace": "ns", "uid": UID,
                "finalizers": [FINALIZER],
            },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "pool": "a" } },
                "template": {
                    "metadata": { "labels": { "pool": "a" } },
                    "spec": { "class": { "kind": "MachineClass", "name": "c" } },
                },
            },
        });
        json_merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    /// A Running machine of the set (`owned`) or an orphan, selected by it.
    fn machine(name: &str, owned: bool) -> Arc<Machine> {
        let mut v = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {
                "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "resourceVersion": "7", "labels": { "pool": "a" },
            },
            "spec": { "class": { "kind": "MachineClass", "name": "c" } },
            "status": { "currentStatus": { "phase": "Running" } },
        });
        if owned {
            v["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
                "name": "s", "uid": UID, "controller": true,
            }]);
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn snapshot(
        set: MachineSet,
        machines: Vec<Arc<Machine>>,
        enforcement: Enforcement,
    ) -> Snapshot {
        Snapshot {
            set: Arc::new(set),
            key: "ns/s".into(),
            now: "2026-11-29T10:00:00Z".parse::<Timestamp>().unwrap(),
            instant: Instant::now(),
            machines,
            pending: None,
            node_preserve: BTreeMap::new(),
            node_preserved: BTreeSet::new(),
            old_set_of_rollout: false,
            budgets: Vec::new(),
            gate: GateView {
                enforcement,
                in_flight: HashSet::new(),
                version: 3,
            },
        }
    }

    fn manage(d: &Decision) -> &Manage {
        match &d.work {
            Work::Manage(m) => m,
            other => panic!("not a management: {other:?}"),
        }
    }

    #[test]
    fn the_finalizer_the_expectations_and_a_deletion_decide_the_kind_of_work() {
        let absent = Enforcement::Absent;
        // (set, machines, pending, add_finalizer, clear_expectations, work)
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-11-29T09:00:00Z"}});
        let no_finalizer = json!({"metadata": {"finalizers": []}});
        let deleting_without = json!({"metadata": {
            "deletionTimestamp": "2026-11-29T09:00:00Z", "finalizers": ["other"],
        }});
        let waiting = |since| PendingChanges {
            created: ["gone-yet".to_owned()].into(),
            deleted: HashSet::new(),
            since,
        };
        let now = Instant::now();
        let cases: Vec<(MachineSet, Option<PendingChanges>, bool, bool, &str)> = vec![
            (set(0, deleting_without), None, false, false, "Idle"),
            (set(0, deleting.clone()), None, false, false, "Finish"),
            (set(0, no_finalizer.clone()), None, true, false, "Manage"),
            (
                set(0, no_finalizer),
                Some(waiting(now)),
                true,
                false,
                "AwaitExpectations",
            ),
            // Expectations that timed out are dropped, and the set acts.
            (
                set(0, json!({})),
                Some(waiting(now - std::time::Duration::from_secs(61))),
                false,
                true,
                "Manage",
            ),
        ];
        for (set, pending, add_finalizer, clear, work) in cases {
            let mut s = snapshot(set, Vec::new(), absent);
            s.instant = now;
            s.pending = pending;
            let d = plan(&s);
            assert_eq!(d.add_finalizer, add_finalizer, "{work}");
            assert_eq!(d.clear_expectations, clear, "{work}");
            let kind = match d.work {
                Work::Idle => "Idle",
                Work::AwaitExpectations => "AwaitExpectations",
                Work::Finish => "Finish",
                Work::Manage(_) => "Manage",
            };
            assert_eq!(kind, work);
        }
    }

    #[test]
    fn claims_creations_and_the_status_of_a_live_set() {
        // An orphan is adopted and counts: one more machine is created, in slow-start
        // batches.
        let s = snapshot(
            set(4, json!({})),
            vec![machine("owned", true), machine("orphan", false)],
            Enforcement::Enforced,
        );
        let d = plan(&s);
        let m = manage(&d);
        assert_eq!(m.overlap.as_deref(), Some(""));
        assert_eq!(m.claims.len(), 1);
        assert!(m.claims[0].adopt);
        assert_eq!(m.claims[0].machine.name_any(), "orphan");
        let Creation::Create { batches, .. } = &m.create else {
            panic!("no creation: {:?}", m.create);
        };
        assert_eq!(batches, &[1, 1]);
        assert_eq!(m.delete, None);
        assert_eq!(m.status.ok.replicas, Some(2));
        assert_eq!(m.requeue, RESYNC_PERIOD);
        // The failure statuses carry the ReplicaFailure condition, its message left to the
        // error.
        let cond = |st: &MachineSetStatus| {
            let c = st.conditions.as_ref().unwrap()[0].clone();
            (c.reason.unwrap(), c.message.unwrap())
        };
        assert_eq!(
            cond(&m.status.create_failed),
            ("FailedCreate".into(), String::new())
        );
        assert_eq!(
            cond(&m.status.delete_failed),
            ("FailedDelete".into(), String::new())
        );
        assert_eq!(m.status.ok.conditions, None);

        // A template without labels creates nothing: the reconcile fails.
        let mut bare = set(1, json!({}));
        bare.spec.template.as_mut().unwrap().metadata = None;
        let d = plan(&snapshot(bare, Vec::new(), Enforcement::Enforced));
        assert_eq!(manage(&d).create, Creation::TemplateWithoutLabels);
    }

    #[test]
    fn surplus_machines_go_as_the_gate_answers() {
        let machines = || vec![machine("a", true), machine("b", true)];
        // (enforcement, issued, admitted, reservation, held, requeue)
        let cases = [
            (
                Enforcement::Absent,
                vec!["a"],
                vec![],
                false,
                false,
                RESYNC_PERIOD,
            ),
            (
                Enforcement::Pending,
                vec![],
                vec![],
                false,
                true,
                BUDGET_RECHECK,
            ),
            (
                Enforcement::Enforced,
                vec!["a"],
                vec!["a"],
                true,
                false,
                RESYNC_PERIOD,
            ),
        ];
        for (enforcement, issue, admitted, reserved, held, requeue) in cases {
            // The deletion is voluntary: the set is an old set of a rollout.
            let mut s = snapshot(set(1, json!({})), machines(), enforcement);
            s.old_set_of_rollout = true;
            let d = plan(&s);
            let m = manage(&d);
            let del = m.delete.as_ref().expect("a deletion");
            assert_eq!(del.issue, issue, "{enforcement:?}");
            assert_eq!(del.admitted, admitted, "{enforcement:?}");
            assert_eq!(del.held, held, "{enforcement:?}");
            assert_eq!(m.requeue, requeue, "{enforcement:?}");
            assert_eq!(m.requeue_on_gate_conflict, requeue.min(GATE_CONFLICT_RETRY));
            assert_eq!(del.reservation.is_some(), reserved, "{enforcement:?}");
            if let Some(r) = &del.reservation {
                assert_eq!(r.version, 3, "the version of the view");
                assert_eq!(r.admitted, admitted);
            }
            assert_eq!(del.uids["a"].as_deref(), Some("uid-a"));
        }
        // A set being deleted asks no budget: its machines go at once, announced nothing.
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-11-29T09:00:00Z"}});
        let d = plan(&snapshot(
            set(1, deleting),
            machines(),
            Enforcement::Pending,
        ));
        let m = manage(&d);
        assert_eq!(m.overlap, None);
        assert_eq!(m.delete.as_ref().unwrap().issue, ["a", "b"]);
        assert_eq!(m.delete.as_ref().unwrap().reservation, None);
    }

    #[test]
    fn a_failed_machine_auto_preserved_now_is_kept_in_the_same_pass() {
        let mut failed = (*machine("f", true)).clone();
        failed
            .status
            .as_mut()
            .unwrap()
            .current_status
            .as_mut()
            .unwrap()
            .phase = Some(mcm_api::MachinePhase::Failed);
        let s = snapshot(
            set(1, json!({"spec": {"autoPreserveFailedMachineMax": 1}})),
            vec![Arc::new(failed)],
            Enforcement::Absent,
        );
        let d = plan(&s);
        let m = manage(&d);
        assert_eq!(
            m.auto_preserve,
            [PreserveWrite {
                machine: "f".into(),
                resource_version: Some("7".into()),
                auto_preserved: true,
            }]
        );
        // Annotated, it is kept and not replaced.
        assert_eq!(m.delete, None);
        assert_eq!(m.create, Creation::None);
        assert_eq!(m.status.ok.auto_preserve_failed_machine_count, Some(1));
    }
}
