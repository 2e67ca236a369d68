//! The test kit of mcm-rs: what the integration tests of every crate share.
//!
//! - [`wait`]: [`within`] (a future or a panic naming it), [`eventually`] (a polled check
//!   with a bounded timeout, failing with what was awaited and the last observation), the
//!   watch-based [`await_object`] and [`await_list`], and [`consistently`] (a polled check
//!   that must hold for a while: something that must not happen);
//! - [`fixtures`]: a fresh namespace on the shared control plane ([`TestNamespace`]), typed
//!   builders of Machines, MachineSets, MachineDeployments and
//!   MachineClasses, a Secret, a Ready Node; namespaces come from
//!   [`ControlPlane::namespace`](crate::ControlPlane::namespace);
//! - [`process`]: a free loopback port, a child process killed on drop serving HTTP
//!   ([`ServedProcess`]), `/proc` checks, a TCP [`Proxy`] to cut a connection;
//! - [`metrics`]: samples of a `/metrics` text by name and labels;
//! - [`events`]: the Events recorded about an object or a Node;
//! - [`golden`]: a test's output compared with a reviewed file ([`assert_golden`]).
//!
//! ```no_run
//! # async fn demo(client: kube::Client, ns: &str) {
//! use std::time::Duration;
//! use mcm_testenv::kit::{MachineDeploymentBuilder, create, eventually};
//! let api = kube::Api::namespaced(client, ns);
//! let md = MachineDeploymentBuilder::new("web").replicas(3).class("c").rolling(1, 0).build();
//! create(&api, &md).await;
//! let machines: kube::Api<mcm_api::Machine> = kube::Api::namespaced(api.into_client(), ns);
//! eventually(Duration::from_secs(60), "3 machines", || async {
//!     let n = machines.list(&Default::default()).await.map(|l| l.items.len());
//!     if n.as_ref().is_ok_and(|n| *n == 3) { Ok(()) } else { Err(n) }
//! })
//! .await;
//! # }
//! ```

pub mod events;
pub mod fixtures;
pub mod golden;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod wait;

pub use events::{await_event, events_for, node_events_for};
pub use fixtures::{
    MachineBuilder, MachineClassBuilder, MachineDeploymentBuilder, MachineSetBuilder,
    TestNamespace, WEBHOOK_NAME, class_ref, controller_ref, create, create_class_with_secret,
    create_ready_node, is_ready, kubeconfig_text, ready_status, secret, template, webhook_args,
    webhook_configuration,
};
pub use golden::{GOLDEN_UPDATE_ENV, assert_golden};
pub use metrics::{metric, metric_with, sample, scrape};
pub use process::{
    LocalNodeVm, ProviderController, ServedProcess, binary_beside, boot_local_node, free_port,
    http_get, http_status, process_alive, sigkill, stop_agents,
};
pub use proxy::Proxy;
pub use wait::{
    Outcome, Timeout, Violation, await_gone, await_list, await_object, consistently, eventually,
    try_consistently, try_eventually, within,
};
