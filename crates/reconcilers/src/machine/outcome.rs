//! How the machine controller reads the outcome of a step it carried out (pure): the
//! driver's answers and what a created VM settles into. The step runs in
//! [`act`](super::act); its outcome decides the next move, by these rules alone.

use mcm_driver::{Code, DriverError, GetMachineStatusResponse, ResourceKind, ResourceState};

use super::model::{NodeHealth, VmReport};

/// What the driver's lookup of a machine's VM (`get_machine_status`) says for its creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The VM exists (adopted: an earlier attempt made it).
    Found,
    /// No VM (`NotFound`), or the driver cannot look one up (`Unimplemented`): create it.
    Absent,
    /// A VM the driver found by its own means that still needs `initialize_machine`.
    Uninitialized,
    /// The lookup failed: a creation failure.
    Failed,
}

impl Lookup {
    /// The lookup's answer, read. Pure.
    pub(crate) fn of<T>(answer: &Result<T, DriverError>) -> Lookup {
        match answer {
            Ok(_) => Lookup::Found,
            Err(e) if matches!(e.code, Code::NotFound | Code::Unimplemented) => Lookup::Absent,
            Err(e) if e.code == Code::Uninitialized => Lookup::Uninitialized,
            Err(_) => Lookup::Failed,
        }
    }
}

/// Whether a refused `create_machine` takes back the `vm-requested` record it wrote: only the
/// attempt's first request, and only when the driver says the request was invalid (nothing
/// was created, the SPI's contract; an earlier request of the attempt may have made a VM).
/// Pure.
pub(crate) fn takes_back_request(first_request: bool, refusal: &DriverError) -> bool {
    first_request && refusal.code == Code::InvalidArgument
}

/// What `delete_machine`'s answer means for the deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VmDeletion {
    /// Deleted, or gone already (`NotFound`).
    Deleted,
    /// The driver calls the request invalid: the class as it is cannot delete the VM (the
    /// deletion is blocked until the class is fixed). The driver's message.
    Blocked(String),
    /// Anything else (unreachable, throttled, failed): retried with backoff.
    Failed,
}

impl VmDeletion {
    /// The answer, read. Pure.
    pub(crate) fn of<T>(answer: &Result<T, DriverError>) -> VmDeletion {
        match answer {
            Ok(_) => VmDeletion::Deleted,
            Err(e) if e.is_not_found() => VmDeletion::Deleted,
            Err(e) if e.code == Code::InvalidArgument => VmDeletion::Blocked(e.full_message()),
            Err(_) => VmDeletion::Failed,
        }
    }
}

/// The phase a machine whose VM was just recorded and initialized settles into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// No target cluster to join (`--target-kubeconfig=none`): upstream's phase for it.
    Available,
    /// Its Node joined and is healthy already (Pending would be a write nobody sees).
    Running,
    /// Waiting for its Node (the creation timeout runs).
    Pending,
}

/// What a machine settles into after its VM was recorded: `node` is the health of the Node
/// it records, if the store has it (by [`NodeHealth::healthy`], the lifecycle's own rule for
/// `MarkRunning`). Pure.
pub(crate) fn settled(target_cluster: bool, node: Option<&NodeHealth>) -> Settled {
    match node {
        _ if !target_cluster => Settled::Available,
        Some(n) if n.healthy() => Settled::Running,
        _ => Settled::Pending,
    }
}

/// The fast path's reading of a status response: the VM resource stopped or failed, or
/// present. Pure.
pub(crate) fn report_of(status: &GetMachineStatusResponse) -> VmReport {
    status
        .resources
        .iter()
        .find(|r| r.kind == ResourceKind::Vm)
        .map_or(VmReport::Present, |vm| match vm.state {
            ResourceState::Stopped | ResourceState::Failed => VmReport::Stopped {
                message: vm
                    .message
                    .clone()
                    .unwrap_or_else(|| format!("{:?}", vm.state).to_lowercase()),
            },
            _ => VmReport::Present,
        })
}

/// The fast path's reading of the driver's answer: gone (`NotFound`), stopped or present,
/// or not known when the driver could not tell. Pure.
pub(crate) fn vm_report(answer: &Result<GetMachineStatusResponse, DriverError>) -> VmReport {
    match answer {
        Err(e) if e.code == Code::NotFound => VmReport::Gone,
        Err(_) => VmReport::NotAsked,
        Ok(status) => report_of(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: Code) -> Result<(), DriverError> {
        Err(DriverError::new(code, "the cloud says no"))
    }

    #[test]
    fn a_lookup_finds_creates_initializes_or_fails() {
        let cases = [
            (Ok(()), Lookup::Found),
            (err(Code::NotFound), Lookup::Absent),
            (err(Code::Unimplemented), Lookup::Absent),
            (err(Code::Uninitialized), Lookup::Uninitialized),
            (err(Code::Unavailable), Lookup::Failed),
            (err(Code::InvalidArgument), Lookup::Failed),
        ];
        for (answer, want) in cases {
            assert_eq!(Lookup::of(&answer), want, "{answer:?}");
        }
    }

    #[test]
    fn only_an_invalid_first_request_takes_its_record_back() {
        let invalid = DriverError::new(Code::InvalidArgument, "bad");
        let lost = DriverError::new(Code::Unavailable, "lost");
        assert!(takes_back_request(true, &invalid));
        assert!(
            !takes_back_request(false, &invalid),
            "an earlier request may have made a VM"
        );
        assert!(!takes_back_request(true, &lost), "the cloud may have acted");
    }

    #[test]
    fn a_deletion_is_done_blocked_by_the_class_or_retried() {
        let cases = [
            (Ok(()), "Deleted"),
            (err(Code::NotFound), "Deleted"),
            (err(Code::InvalidArgument), "Blocked"),
            (err(Code::Unavailable), "Failed"),
            (err(Code::ResourceExhausted), "Failed"),
            (err(Code::Internal), "Failed"),
        ];
        for (answer, want) in cases {
            let got = format!("{:?}", VmDeletion::of(&answer));
            assert!(got.starts_with(want), "{answer:?}: {got}");
        }
        assert_eq!(
            VmDeletion::of(&err(Code::InvalidArgument)),
            VmDeletion::Blocked(
                DriverError::new(Code::InvalidArgument, "the cloud says no").full_message()
            )
        );
    }

    #[test]
    fn a_created_vm_settles_by_the_lifecycles_health_rule() {
        let health = |ready: bool, bad: &[&str]| NodeHealth {
            ready,
            not_ready_since: None,
            bad_conditions: bad.iter().map(|s| s.to_string()).collect(),
            unreachable: false,
            rule_matches: vec![],
        };
        let cases = [
            (false, Some(health(true, &[])), Settled::Available),
            (false, None, Settled::Available),
            (true, Some(health(true, &[])), Settled::Running),
            (
                true,
                Some(health(true, &["DiskPressure"])),
                Settled::Pending,
            ),
            (true, Some(health(false, &[])), Settled::Pending),
            (true, None, Settled::Pending),
        ];
        for (target, node, want) in cases {
            assert_eq!(settled(target, node.as_ref()), want, "{target} {node:?}");
        }
    }

    #[test]
    fn the_fast_path_reads_gone_stopped_present_or_unknown() {
        let status = |state: Option<ResourceState>| GetMachineStatusResponse {
            provider_id: "p".into(),
            node_name: "n".into(),
            addresses: vec![],
            resources: state
                .map(|state| mcm_driver::ResourceStatus {
                    kind: ResourceKind::Vm,
                    id: "vm".into(),
                    state,
                    message: None,
                })
                .into_iter()
                .collect(),
        };
        assert_eq!(
            vm_report(&Err(DriverError::new(Code::NotFound, "x"))),
            VmReport::Gone
        );
        assert_eq!(
            vm_report(&Err(DriverError::new(Code::Unavailable, "x"))),
            VmReport::NotAsked
        );
        assert_eq!(vm_report(&Ok(status(None))), VmReport::Present);
        assert_eq!(
            vm_report(&Ok(status(Some(ResourceState::Running)))),
            VmReport::Present
        );
        assert!(matches!(
            vm_report(&Ok(status(Some(ResourceState::Stopped)))),
            VmReport::Stopped { .. }
        ));
    }
}
