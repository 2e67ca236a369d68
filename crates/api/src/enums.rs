//! String enumerations of the API (phases, operation states and types, strategies, conditions).
//!
//! Each enum lists the values the current Go API defines, with the exact same strings, plus an
//! `Other(String)` variant. Decision: values that this crate does not know are **kept**, not
//! rejected. The CRD is shared with other writers (a newer Go MCM, Gardener, humans with
//! `kubectl`), and a strict enum would make the whole object fail to deserialize, which in a
//! reflector means the object silently disappears from the controller's view. With `Other`, the
//! object still deserializes, round-trips losslessly, and the controllers can decide what an
//! unknown value means (usually: leave it alone). The CRD schemas therefore do not restrict these
//! fields to an `enum` either, like the Go CRDs.

use std::{borrow::Cow, fmt};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this crate does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// Every value known to this crate, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];

            /// The wire string of this value.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $value, )+
                    $name::Other(s) => s.as_str(),
                }
            }

            /// Whether this is a value the crate knows (not [`Self::Other`]).
            pub fn is_known(&self) -> bool {
                !matches!(self, $name::Other(_))
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $( $value => $name::$variant, )+
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                match $name::from(s.as_str()) {
                    $name::Other(_) => $name::Other(s),
                    known => known,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                Cow::<'de, str>::deserialize(deserializer).map(|s| $name::from(s.as_ref()))
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                let known: Vec<&str> = vec![$($value),+];
                json_schema!({
                    "type": "string",
                    "description": format!("One of: {}.", known.join(", ")),
                })
            }
        }
    };
}

string_enum! {
    /// Lifecycle phase of a Machine (`status.currentStatus.phase`).
    MachinePhase {
        /// The VM is being created, or was created and its Node has not become ready yet.
        Pending => "Pending",
        /// The VM exists at the provider but has not joined the cluster yet.
        Available => "Available",
        /// The Node is ready and healthy.
        Running => "Running",
        /// The Machine is being deleted (drain, VM deletion, Node deletion).
        Terminating => "Terminating",
        /// The Node is not ready or has a bad condition; the health timeout is running.
        Unknown => "Unknown",
        /// Creation or health timed out; the Machine will be replaced.
        Failed => "Failed",
        /// Creation keeps failing: the Machine object exists but there is no VM yet.
        CrashLoopBackOff => "CrashLoopBackOff",
        /// The Machine is being updated in place.
        InPlaceUpdating => "InPlaceUpdating",
        /// The in-place update of the Machine succeeded.
        InPlaceUpdateSuccessful => "InPlaceUpdateSuccessful",
        /// The in-place update of the Machine failed.
        InPlaceUpdateFailed => "InPlaceUpdateFailed",
    }
}

string_enum! {
    /// A voluntary disruption that a `MachineDisruptionBudget` can limit
    /// ([`crate::disruption_budget`]).
    DisruptionReason {
        /// A rolling update of a MachineDeployment deletes a machine of an old MachineSet.
        RollingUpdate => "RollingUpdate",
        /// A MachineSet's replicas went down (the cluster-autoscaler's scale-down included).
        ScaleDown => "ScaleDown",
        /// A preserved Failed machine is deleted after its preservation ended.
        PreservationRelease => "PreservationRelease",
    }
}

string_enum! {
    /// State of the last operation on a Machine (`status.lastOperation.state`); Go calls this
    /// `MachineState` although it describes an operation.
    MachineState {
        /// The operation is still in progress.
        Processing => "Processing",
        /// The operation failed.
        Failed => "Failed",
        /// The operation completed successfully.
        Successful => "Successful",
    }
}

string_enum! {
    /// Kind of the last operation on a Machine (`status.lastOperation.type`).
    MachineOperationType {
        /// Creation of the VM / Machine.
        Create => "Create",
        /// Update of the Machine.
        Update => "Update",
        /// In-place update of the Machine.
        InPlaceUpdate => "InPlaceUpdate",
        /// Drain of the Machine's Node.
        DrainNode => "DrainNode",
        /// Health check of the Machine's Node.
        HealthCheck => "HealthCheck",
        /// Deletion of the Machine.
        Delete => "Delete",
    }
}

string_enum! {
    /// How a MachineDeployment replaces old machines (`spec.strategy.type`).
    MachineDeploymentStrategyType {
        /// Delete all old machines before creating new ones.
        Recreate => "Recreate",
        /// Gradually scale the new MachineSet up and the old ones down (the default).
        RollingUpdate => "RollingUpdate",
        /// Update the existing machines in place instead of replacing them.
        InPlaceUpdate => "InPlaceUpdate",
    }
}

string_enum! {
    /// Who drives an in-place update (`spec.strategy.inPlaceUpdate.orchestrationType`).
    OrchestrationType {
        /// The controller selects the machines to update.
        Auto => "Auto",
        /// A user selects machines (node label `node.machine.sapcloud.io/selected-for-update`).
        Manual => "Manual",
    }
}

string_enum! {
    /// Condition types of a MachineSet (`status.machineSetCondition[].type`).
    MachineSetConditionType {
        /// Machines could not be created or deleted (quota, provider errors, ...).
        ReplicaFailure => "ReplicaFailure",
        /// The MachineSet was frozen by the overshooting safety controller.
        Frozen => "Frozen",
    }
}

string_enum! {
    /// Condition types of a MachineDeployment (`status.conditions[].type`).
    MachineDeploymentConditionType {
        /// At least the minimum number of machines has been available for `minReadySeconds`.
        Available => "Available",
        /// A rollout is making progress (or finished, or exceeded its deadline).
        Progressing => "Progressing",
        /// Machines could not be created or deleted.
        ReplicaFailure => "ReplicaFailure",
        /// The MachineDeployment was frozen by the overshooting safety controller.
        Frozen => "Frozen",
        /// (mcm-rs) Whether its unhealthy machines may be remediated (False while the
        /// remediation short-circuit holds); only on deployments with remediation
        /// annotations.
        RemediationAllowed => "RemediationAllowed",
        /// (mcm-rs) Whether a zone of its machines is partitioned (their Nodes unreachable
        /// together while the other zones are healthy): while `True` the machine controller
        /// holds the remediation of those machines whose VMs run. Only on deployments that had
        /// a partitioned zone.
        ZonePartition => "ZonePartition",
    }
}

string_enum! {
    /// Status of a MachineSet/MachineDeployment condition.
    ConditionStatus {
        /// The condition holds.
        True => "True",
        /// The condition does not hold.
        False => "False",
        /// It cannot be decided whether the condition holds.
        Unknown => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn known_values_round_trip() {
        for phase in MachinePhase::KNOWN {
            let json = serde_json::to_string(phase).expect("serializes");
            let back: MachinePhase = serde_json::from_str(&json).expect("deserializes");
            assert_eq!(&back, phase);
            assert!(back.is_known());
        }
        assert_eq!(
            MachinePhase::from("CrashLoopBackOff"),
            MachinePhase::CrashLoopBackOff
        );
        assert_eq!(MachineState::Processing.as_str(), "Processing");
        assert_eq!(MachineOperationType::HealthCheck.to_string(), "HealthCheck");
        assert_eq!(
            MachineDeploymentStrategyType::from("RollingUpdate"),
            MachineDeploymentStrategyType::RollingUpdate
        );
    }

    #[test]
    fn unknown_values_are_kept() {
        let phase: MachinePhase = serde_json::from_str("\"Hibernating\"").expect("deserializes");
        assert_eq!(phase, MachinePhase::Other("Hibernating".into()));
        assert!(!phase.is_known());
        assert_eq!(
            serde_json::to_string(&phase).expect("serializes"),
            "\"Hibernating\""
        );
        // Matching is case sensitive, like Go's string comparison.
        assert_eq!(
            MachinePhase::from("running"),
            MachinePhase::Other("running".into())
        );
    }

    #[test]
    fn non_strings_are_rejected() {
        assert!(serde_json::from_str::<MachinePhase>("42").is_err());
    }
}
