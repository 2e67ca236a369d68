//! The remediation budget and short-circuit of a MachineDeployment (mcm-rs additions). Pure.
//!
//! The budget bounds how many of a deployment's machines may be Failed or being replaced at
//! once (default: its resolved maxSurge, at least 1, the controller's behaviour without the
//! annotation). The short-circuit stops all remediation while too many of its machines are
//! unhealthy at once: a zone outage must not turn into the replacement of a whole fleet.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::constants::annotations::policy;
use mcm_api::intstr::scaled_value;
use mcm_api::{Machine, MachinePhase};

pub(crate) use mcm_api::policy::remediation::{RemediationPolicy, policy_of};

/// What the decision counts of one deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Census {
    /// `spec.replicas` of the deployment (percentages of the budget count from it).
    pub replicas: i32,
    /// Its machines that are not being deleted (percentages of the short-circuit count from
    /// them).
    pub machines: usize,
    /// Of those, the unhealthy ones (phase Unknown or Failed, or a Node that is not healthy),
    /// the machine being decided included.
    pub unhealthy: usize,
    /// Its other machines that are Failed or being deleted.
    pub being_replaced: usize,
}

/// One machine of a deployment as the census sees it. The machine controller (deciding
/// whether a machine may fail) and the MachineDeployment's `RemediationAllowed` condition
/// both count with it, so they agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// Being deleted: not counted among the machines (its replacement is under way).
    pub deleting: bool,
    /// Failed (and not preserved), Terminating or being deleted: in flight.
    pub being_replaced: bool,
    /// Impaired, as the census counts: Unknown or Failed, or its Node is not Ready. Not the
    /// machine's own health ([`NodeHealth::healthy`](super::model::NodeHealth::healthy),
    /// which also reads the bad conditions and per-condition rules of that machine's
    /// configuration): the census counts every machine of a deployment alike, also in the
    /// manager, which has neither. Nodes of a zone outage go NotReady together, before the
    /// machine controller marks their machines Unknown one by one.
    pub impaired: bool,
}

impl Member {
    /// `machine`, whose Node in the target cluster's store is `node`. Readiness only: the
    /// bad-condition list is a flag of the machine controller that the manager does not have,
    /// and a machine whose Node has a bad condition is marked Unknown at its next reconcile.
    pub(crate) fn of(machine: &Machine, node: Option<&Node>) -> Member {
        let node_not_ready = node.is_some_and(|n| !super::model::NodeHealth::of(n, &[], &[]).ready);
        Member {
            deleting: machine.metadata.deletion_timestamp.is_some(),
            being_replaced: super::observe::is_being_replaced(machine),
            impaired: node_not_ready
                || matches!(
                    machine.phase(),
                    Some(MachinePhase::Unknown | MachinePhase::Failed)
                ),
        }
    }

    /// The machine a decision is about: counted unhealthy (it is about to fail), not in
    /// flight yet.
    pub(crate) fn deciding(self) -> Member {
        Member {
            impaired: true,
            being_replaced: false,
            ..self
        }
    }
}

/// Counts the `members` of a deployment with `replicas`. Pure.
pub(crate) fn census(replicas: i32, members: impl IntoIterator<Item = Member>) -> Census {
    let mut c = Census {
        replicas,
        machines: 0,
        unhealthy: 0,
        being_replaced: 0,
    };
    for m in members {
        c.being_replaced += usize::from(m.being_replaced);
        if m.deleting {
            continue;
        }
        c.machines += 1;
        c.unhealthy += usize::from(m.impaired);
    }
    c
}

/// Why no further machine of the deployment may be marked Failed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Throttle {
    /// The budget of machines in flight is used up.
    BudgetUsed {
        /// Machines already being replaced.
        being_replaced: usize,
        /// The budget.
        budget: usize,
    },
    /// Too many machines are unhealthy at once: nothing is remediated.
    ShortCircuit {
        /// Unhealthy machines.
        unhealthy: usize,
        /// Machines counted.
        machines: usize,
        /// The resolved maximum.
        max: usize,
        /// The annotation's value as written.
        written: String,
    },
}

impl Throttle {
    /// The message, naming the deployment.
    pub(crate) fn describe(&self, deployment: &str) -> String {
        match self {
            Throttle::BudgetUsed {
                being_replaced,
                budget,
            } => format!(
                "{being_replaced} machine(s) of MachineDeployment {deployment} are already being replaced (budget {budget})"
            ),
            Throttle::ShortCircuit {
                unhealthy,
                machines,
                max,
                written,
            } => format!(
                "remediation short-circuited: {unhealthy} of the {machines} machines of MachineDeployment {deployment} are unhealthy, more than {} {written} ({max}); none is replaced until fewer are",
                policy::MAX_UNHEALTHY
            ),
        }
    }
}

fn as_written(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// The number of machines that may be in flight: the annotation scaled against the replicas
/// (rounded up), else `default` (the resolved maxSurge, at least 1).
pub(crate) fn budget(policy: &RemediationPolicy, replicas: i32, default: usize) -> usize {
    policy
        .max_in_flight
        .as_ref()
        .and_then(|v| scaled_value(v, replicas, true).ok())
        .map_or(default, |n| usize::try_from(n).unwrap_or(0))
}

/// The short-circuit alone: `Some` when more machines are unhealthy than the policy allows.
pub(crate) fn short_circuit(
    policy: &RemediationPolicy,
    machines: usize,
    unhealthy: usize,
) -> Option<Throttle> {
    let v = policy.max_unhealthy.as_ref()?;
    let total = i32::try_from(machines).unwrap_or(i32::MAX);
    let max = usize::try_from(scaled_value(v, total, false).ok()?).unwrap_or(0);
    (unhealthy > max).then(|| Throttle::ShortCircuit {
        unhealthy,
        machines,
        max,
        written: as_written(v),
    })
}

/// Whether one more machine of the deployment may be marked Failed: the short-circuit
/// first, then the budget.
pub(crate) fn verdict(
    policy: &RemediationPolicy,
    default_budget: usize,
    c: Census,
) -> Option<Throttle> {
    if let Some(t) = short_circuit(policy, c.machines, c.unhealthy) {
        return Some(t);
    }
    let budget = budget(policy, c.replicas, default_budget);
    (c.being_replaced >= budget).then_some(Throttle::BudgetUsed {
        being_replaced: c.being_replaced,
        budget,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A zone outage: the Nodes of 3 of 5 machines went NotReady, none of the machines is
    /// Unknown yet. The machine controller, deciding about one of them, holds remediation,
    /// and the deployment's condition says so too (it used to count only Unknown and Failed
    /// machines and said `RemediationAllowed=True`).
    #[test]
    fn a_zone_outage_is_counted_the_same_by_the_machine_controller_and_the_deployment() {
        let machine = |name: &str| -> Machine {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name }, "spec": {},
                "status": { "currentStatus": { "phase": "Running" } }
            }))
            .unwrap()
        };
        let node = |ready: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "n" },
                "status": { "conditions": [{ "type": "Ready", "status": ready }] }
            }))
            .unwrap()
        };
        let (ready, down) = (node("True"), node("Unknown"));
        let fleet: Vec<(Machine, &Node)> = vec![
            (machine("a"), &down),
            (machine("b"), &down),
            (machine("c"), &down),
            (machine("d"), &ready),
            (machine("e"), &ready),
        ];
        let members: Vec<Member> = fleet.iter().map(|(m, n)| Member::of(m, Some(n))).collect();
        let p = policy(None, Some("40%"));

        // The machine controller, about machine a.
        let deciding = members
            .iter()
            .enumerate()
            .map(|(i, m)| if i == 0 { m.deciding() } else { *m });
        let held = verdict(&p, 1, super::census(5, deciding));
        assert_eq!(
            held,
            Some(Throttle::ShortCircuit {
                unhealthy: 3,
                machines: 5,
                max: 2,
                written: "40%".into()
            })
        );
        // The deployment's condition.
        let now = jiff::Timestamp::from_second(1_000).unwrap();
        let annotations: BTreeMap<String, String> =
            [(policy::MAX_UNHEALTHY.to_string(), "40%".to_string())].into();
        let condition = crate::machinedeployment::status::remediation_condition(
            "md",
            Some(&annotations),
            &members,
            now,
        )
        .unwrap();
        assert_eq!(
            condition.status,
            mcm_api::ConditionStatus::False,
            "{condition:?}"
        );
        assert_eq!(
            condition.message,
            held.map(|t| t.describe("md")),
            "the same words in both places"
        );
    }

    fn policy(in_flight: Option<&str>, unhealthy: Option<&str>) -> RemediationPolicy {
        let mut a = BTreeMap::new();
        if let Some(v) = in_flight {
            a.insert(policy::MAX_IN_FLIGHT.to_string(), v.to_string());
        }
        if let Some(v) = unhealthy {
            a.insert(policy::MAX_UNHEALTHY.to_string(), v.to_string());
        }
        policy_of(Some(&a)).unwrap()
    }

    fn census(replicas: i32, machines: usize, unhealthy: usize, being_replaced: usize) -> Census {
        Census {
            replicas,
            machines,
            unhealthy,
            being_replaced,
        }
    }

    #[test]
    fn without_annotations_the_budget_is_the_default() {
        let p = RemediationPolicy::default();
        assert_eq!(verdict(&p, 1, census(10, 10, 10, 0)), None);
        assert_eq!(
            verdict(&p, 1, census(10, 10, 10, 1)),
            Some(Throttle::BudgetUsed {
                being_replaced: 1,
                budget: 1
            })
        );
    }

    #[test]
    fn the_budget_is_a_count_or_a_percentage_rounded_up() {
        // (annotation, replicas, being replaced) -> throttled
        let cases = [
            ("3", 10, 2, false),
            ("3", 10, 3, true),
            ("25%", 10, 2, false), // 2.5 -> 3
            ("25%", 10, 3, true),
            ("0", 10, 0, true), // remediation paused
            ("100%", 4, 3, false),
        ];
        for (v, replicas, in_flight, want) in cases {
            let got = verdict(
                &policy(Some(v), None),
                1,
                census(replicas, replicas as usize, 1, in_flight),
            );
            assert_eq!(
                got.is_some(),
                want,
                "{v} of {replicas} with {in_flight} in flight: {got:?}"
            );
        }
    }

    #[test]
    fn the_census_and_the_zone_count_by_readiness_not_by_a_machines_health() {
        use k8s_openapi::api::core::v1::Node;
        // A Running machine whose Node is Ready but has a condition its configuration calls
        // bad: unhealthy to the machine itself, not impaired to the census, and serving to
        // the zone count.
        let machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m" }, "spec": {},
            "status": { "currentStatus": { "phase": "Running" } }
        }))
        .unwrap();
        let node = |ready: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "n" },
                "status": { "conditions": [
                    { "type": "Ready", "status": ready },
                    { "type": "DiskPressure", "status": "True" },
                ]}
            }))
            .unwrap()
        };
        let mut cfg = crate::machine::observe::machine_config_in(
            &machine,
            None,
            &crate::machine::plan::tests::settings().defaults,
        )
        .0;
        cfg.bad_conditions = vec!["DiskPressure".into()];
        let bad = node("True");
        assert!(!crate::machine::observe::health(&bad, &cfg).healthy());
        assert!(!Member::of(&machine, Some(&bad)).impaired);
        assert!(crate::machine::partition::member(&machine, Some(&bad)).serving);
        // Not Ready: impaired to the census, not serving, and unhealthy to the machine.
        let down = node("False");
        assert!(!crate::machine::observe::health(&down, &cfg).healthy());
        assert!(Member::of(&machine, Some(&down)).impaired);
        assert!(!crate::machine::partition::member(&machine, Some(&down)).serving);
    }

    #[test]
    fn the_short_circuit_counts_unhealthy_machines_rounded_down_and_wins() {
        let p = policy(Some("100%"), Some("40%"));
        // 40% of 4 = 1.6 -> 1: one unhealthy machine is remediated, two are not.
        assert_eq!(verdict(&p, 1, census(4, 4, 1, 0)), None);
        let t = verdict(&p, 1, census(4, 4, 3, 0)).unwrap();
        assert_eq!(
            t,
            Throttle::ShortCircuit {
                unhealthy: 3,
                machines: 4,
                max: 1,
                written: "40%".into()
            }
        );
        let msg = t.describe("md");
        assert!(
            msg.contains("3 of the 4 machines of MachineDeployment md are unhealthy"),
            "{msg}"
        );
        assert!(
            msg.contains("remediation.mcm-rs.io/max-unhealthy 40% (1)"),
            "{msg}"
        );
        // A count.
        assert!(verdict(&policy(None, Some("2")), 5, census(4, 4, 2, 0)).is_none());
        assert!(verdict(&policy(None, Some("2")), 5, census(4, 4, 3, 0)).is_some());
    }

    #[test]
    fn bad_values_name_the_annotation() {
        for bad in ["-1", "ten", "x%"] {
            let a: BTreeMap<String, String> =
                [(policy::MAX_UNHEALTHY.to_string(), bad.to_string())].into();
            let err = policy_of(Some(&a)).unwrap_err();
            assert_eq!(err.annotation, policy::MAX_UNHEALTHY, "{bad}");
        }
    }
}
