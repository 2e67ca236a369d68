//! The effects of the machine controller: one small action per [`Step`](super::decide::Step)
//! (and the preservation and in-place steps' shared writes). Every action is idempotent: it may
//! run again after a crash at any point. Actions decide nothing beyond how to carry out their
//! step.
//!
//! Split by what they touch: `records` (the Machine's status, progress and Events, shared by
//! all), `create`, `running` (the phases of a machine that exists and the driver probes),
//! `drain` and `delete`.

mod announce;
mod create;
mod delete;
mod drain;
mod hooks;
mod inplace;
mod preserve;
mod records;
mod running;

pub(crate) use announce::announce;
pub(crate) use create::{create_vm, finish_creation, report_class_problem};
pub(crate) use delete::{
    attachments_of, delete_node, delete_vm, delete_volume_attachments, deletion_blocked,
    finish_deletion, machine_exists, mark_terminating,
};
pub(crate) use drain::{
    DeletionDrain, PassPlan, cordon_for_deletion, drain_node_pass, drain_options, drain_pass,
    drained_and_going_on, patch_node_condition, record_drained, set_node_terminating,
};
pub(crate) use hooks::{await_hooks, expire_hooks};
pub(crate) use inplace::inplace_step;
pub(crate) use preserve::preserve_step;
pub(crate) use records::{add_finalizer, class_and_secret, patch_machine, patch_status};
pub(crate) use running::{
    PERMIT_BUSY_RECHECK, hold, hold_for_partition, keep_running, mark_available, mark_failed,
    mark_running, mark_unknown, throttle_replacement, vm_report,
};
