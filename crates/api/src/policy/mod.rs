//! The policy annotations of mcm-rs (health rules, node-startup timeout, remediation budget
//! and short-circuit) and the rollout strategy: how a value is read, once, for the controllers that apply it and the
//! admission webhook that checks it.

pub mod health;
pub mod remediation;
pub mod strategy;
