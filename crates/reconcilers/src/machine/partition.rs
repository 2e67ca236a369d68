//! Zonal partitions (mcm-rs addition; gardener/machine-controller-manager #760 and #354).
//! Pure.
//!
//! In a network partition every Node of one zone goes `Unknown` (their kubelets cannot reach
//! the API server) while the cloud still runs their VMs. Remediating them machine by machine
//! (drain, delete, replace) prolongs the outage and leaves the pool without its machines, its
//! pods and possibly its capacity reservation when the zone comes back. So the machine
//! controller recognises the shape and holds the remediation of such machines:
//!
//! - a **zone partition** of zone Z: among the machines of the namespace that are not being
//!   deleted, at least [`PartitionRule::min_unreachable`] machines of Z, and at least
//!   [`PartitionRule::min_unreachable_percent`] of Z's machines, have an unreachable Node
//!   (`Ready` is `Unknown`: the kubelet stopped reporting), while the machines of the other
//!   zones (there must be some) are at least [`PartitionRule::min_healthy_elsewhere_percent`]
//!   healthy. The namespace is the scope, not the MachineDeployment: a Gardener worker pool
//!   spans its zones with one MachineDeployment per zone, and a zone's partition cuts every
//!   pool in it;
//! - a machine is **held** when its health timeout has passed, its zone is partitioned, and
//!   the driver reports its VM running ([`super::decide::VmReport::Present`]): a VM gone or
//!   stopped is a crash, remediated as ever. The hold lasts at most
//!   [`PartitionRule::max_hold`] past the health timeout (per MachineDeployment, annotation
//!   [`MAX_HOLD_ANNOTATION`]); after that the machine is remediated within the normal
//!   budget. The hold ends by itself when the Node reports again (the machine goes back to
//!   Running on its VM).
//!
//! A whole cluster's heartbeat loss has no healthy zone to compare with: it is the API-server
//! freeze's case (the safety controller), not this one.

use std::collections::BTreeMap;
use std::time::Duration;

pub(crate) use mcm_api::constants::annotations::ZONE_PARTITION_MAX_HOLD as MAX_HOLD_ANNOTATION;

/// The Node label of a machine's zone.
pub(crate) const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The zone label before Kubernetes 1.17, still read when the current one is missing.
pub(crate) const LEGACY_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";

/// The knobs of the rule (flags `--machine-zone-partition-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRule {
    /// Fewest machines of a zone whose Nodes are unreachable for a partition (at least 1).
    pub min_unreachable: usize,
    /// Share of a zone's machines (percent) whose Nodes are unreachable for a partition.
    pub min_unreachable_percent: u32,
    /// Share of the other zones' machines (percent) that must be healthy.
    pub min_healthy_elsewhere_percent: u32,
    /// How long past its health timeout a machine of a partitioned zone is held; zero turns
    /// the hold off (MCM's behaviour: remediated machine by machine).
    pub max_hold: Duration,
}

impl Default for PartitionRule {
    /// Two or more unreachable machines making up at least half of their zone, the other
    /// zones at least 80 % healthy, held for at most 30 minutes past the health timeout.
    fn default() -> Self {
        PartitionRule {
            min_unreachable: 2,
            min_unreachable_percent: 50,
            min_healthy_elsewhere_percent: 80,
            max_hold: Duration::from_secs(30 * 60),
        }
    }
}

/// One machine, as the rule counts it (machines being deleted are left out by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZoneMember {
    /// Its zone (its Node's zone label), if known.
    pub zone: Option<String>,
    /// Its Node's `Ready` condition is `Unknown` (or missing).
    pub unreachable: bool,
    /// Serving, as the partition rule counts: its Node is Ready and the machine Running.
    /// Not the machine's own health ([`NodeHealth::healthy`](super::model::NodeHealth::healthy),
    /// which reads that machine's bad conditions and rules): the manager counts the same
    /// way without them.
    pub serving: bool,
}

pub(crate) use super::model::ZonePartition;

/// Whether `percent` of `of` is at most `count` (rounded up: 50 % of 3 needs 2).
fn at_least_percent(count: usize, of: usize, percent: u32) -> bool {
    (count as u128) * 100 >= (of as u128) * u128::from(percent)
}

/// The partition of `zone`, if the `members` of the namespace show one. Pure.
pub(crate) fn zone_partition(
    zone: &str,
    members: &[ZoneMember],
    rule: &PartitionRule,
) -> Option<ZonePartition> {
    if rule.max_hold.is_zero() {
        return None;
    }
    let (mut machines, mut unreachable, mut elsewhere, mut healthy_elsewhere) = (0, 0, 0, 0);
    for m in members {
        if m.zone.as_deref() == Some(zone) {
            machines += 1;
            unreachable += usize::from(m.unreachable);
        } else {
            elsewhere += 1;
            healthy_elsewhere += usize::from(m.serving);
        }
    }
    let partitioned = unreachable >= rule.min_unreachable.max(1)
        && at_least_percent(unreachable, machines, rule.min_unreachable_percent)
        && elsewhere > 0
        && at_least_percent(
            healthy_elsewhere,
            elsewhere,
            rule.min_healthy_elsewhere_percent,
        );
    partitioned.then(|| ZonePartition {
        zone: zone.to_string(),
        unreachable,
        machines,
        healthy_elsewhere,
        elsewhere,
    })
}

/// A machine and its Node (if the store has it) as the rule counts them: the zone from the
/// Node's labels; unreachable when the Node's `Ready` is `Unknown` or missing; healthy when
/// the Node is Ready and the machine Running. Both the machine controller (deciding a hold)
/// and the manager (the `ZonePartition` condition) count with it, so they agree.
pub(crate) fn member(
    machine: &mcm_api::Machine,
    node: Option<&k8s_openapi::api::core::v1::Node>,
) -> ZoneMember {
    let health = node.map(|n| super::model::NodeHealth::of(n, &[], &[]));
    ZoneMember {
        zone: node.and_then(|n| node_zone(n.metadata.labels.as_ref())),
        unreachable: health.as_ref().is_some_and(|h| h.unreachable),
        serving: health.is_some_and(|h| h.ready)
            && machine.phase() == Some(&mcm_api::MachinePhase::Running),
    }
}

/// The zone of a Node from its labels.
pub(crate) fn node_zone(labels: Option<&BTreeMap<String, String>>) -> Option<String> {
    let labels = labels?;
    labels
        .get(ZONE_LABEL)
        .or_else(|| labels.get(LEGACY_ZONE_LABEL))
        .filter(|z| !z.is_empty())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(zone: &str, unreachable: bool, serving: bool) -> ZoneMember {
        ZoneMember {
            zone: Some(zone.into()),
            unreachable,
            serving,
        }
    }

    /// `n` machines of `zone`, `down` of them unreachable, the rest healthy.
    fn zone(zone: &str, n: usize, down: usize) -> Vec<ZoneMember> {
        (0..n).map(|i| member(zone, i < down, i >= down)).collect()
    }

    #[test]
    fn a_zone_cut_off_while_the_others_run_is_a_partition() {
        let rule = PartitionRule::default();
        let fleet = [zone("a", 3, 3), zone("b", 3, 0), zone("c", 2, 0)].concat();
        let p = zone_partition("a", &fleet, &rule).expect("a partition of a");
        assert_eq!(
            p,
            ZonePartition {
                zone: "a".into(),
                unreachable: 3,
                machines: 3,
                healthy_elsewhere: 5,
                elsewhere: 5
            }
        );
        assert_eq!(
            p.describe(),
            "zone a is partitioned: the Nodes of 3 of its 3 machines are unreachable while 5 \
             of the 5 machines of the other zones are healthy"
        );
        assert_eq!(zone_partition("b", &fleet, &rule), None);
        assert_eq!(zone_partition("c", &fleet, &rule), None);
    }

    #[test]
    fn what_is_not_a_partition() {
        let rule = PartitionRule::default();
        let cases: Vec<(&str, Vec<ZoneMember>)> = vec![
            // One machine down is a machine failure, whatever its zone's size.
            (
                "a single machine",
                [zone("a", 1, 1), zone("b", 3, 0)].concat(),
            ),
            ("one of two", [zone("a", 2, 1), zone("b", 3, 0)].concat()),
            // Under half of the zone.
            ("2 of 5", [zone("a", 5, 2), zone("b", 3, 0)].concat()),
            // No other zone to compare with: the whole cluster (the API-server freeze's case).
            ("one zone only", zone("a", 4, 4)),
            // The other zones are unhealthy too: not a zone's partition.
            ("everywhere", [zone("a", 3, 3), zone("b", 3, 2)].concat()),
            // Machines whose zone is unknown count elsewhere, never as the zone's.
            (
                "unknown zones",
                vec![
                    ZoneMember {
                        zone: None,
                        unreachable: true,
                        serving: false,
                    };
                    4
                ],
            ),
        ];
        for (what, fleet) in cases {
            assert_eq!(zone_partition("a", &fleet, &rule), None, "{what}");
        }
        // Thresholds are inclusive: 2 of 4 is half; 4 of 5 healthy elsewhere is 80 %.
        let fleet = [zone("a", 4, 2), zone("b", 5, 1)].concat();
        assert!(zone_partition("a", &fleet, &rule).is_some());
        // A max hold of zero turns the rule off.
        let off = PartitionRule {
            max_hold: Duration::ZERO,
            ..rule
        };
        let fleet = [zone("a", 3, 3), zone("b", 3, 0)].concat();
        assert_eq!(zone_partition("a", &fleet, &off), None);
    }

    #[test]
    fn the_zone_comes_from_the_current_label_else_the_legacy_one() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            node_zone(Some(&labels(&[
                (ZONE_LABEL, "a"),
                (LEGACY_ZONE_LABEL, "b")
            ]))),
            Some("a".into())
        );
        assert_eq!(
            node_zone(Some(&labels(&[(LEGACY_ZONE_LABEL, "b")]))),
            Some("b".into())
        );
        assert_eq!(node_zone(Some(&labels(&[(ZONE_LABEL, "")]))), None);
        assert_eq!(node_zone(None), None);
    }
}
