//! Per-condition health rules and the node-startup timeout: read by
//! [`mcm_api::policy::health`], where the admission webhook reads them too.

pub(crate) use mcm_api::policy::health::*;
