//! The command line: every flag of Gardener's machine-controller is accepted, bad values and
//! unusable kubeconfigs end the process with a readable message.

mod common;

use std::process::Output;
use std::time::Duration;

use common::*;
use mcm_testenv::kit::{free_port, within};

const GARDENER_FLAGS: &[&str] = &[
    "port",
    "address",
    "cloud-provider",
    "concurrent-syncs",
    "min-resync-period",
    "profiling",
    "contention-profiling",
    "target-kubeconfig",
    "control-kubeconfig",
    "namespace",
    "kube-api-content-type",
    "kube-api-qps",
    "kube-api-burst",
    "controller-start-interval",
    "machine-creation-timeout",
    "machine-health-timeout",
    "machine-drain-timeout",
    "machine-inplace-update-timeout",
    "machine-preserve-timeout",
    "resource-exhausted-retry",
    "machine-max-evict-retries",
    "machine-pv-detach-timeout",
    "machine-pv-reattach-timeout",
    "machine-safety-apiserver-statuscheck-timeout",
    "machine-safety-orphan-vms-period",
    "machine-safety-apiserver-statuscheck-period",
    "node-conditions",
    "bootstrap-token-auth-extra-groups",
    "v",
    "leader-elect",
    "leader-elect-lease-duration",
    "leader-elect-renew-deadline",
    "leader-elect-retry-period",
    "leader-elect-resource-lock",
];

/// Runs the binary with `args` (bounded: it must exit by itself).
async fn run(args: &[&str]) -> Output {
    run_with_env(args, &[]).await
}

/// Runs the binary with `args` and the environment variables `env` (bounded: it must exit
/// by itself).
async fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_machine-controller-local"))
        .args(args)
        .env(mcm_provider_local::NODE_BINARY_ENV, node_binary())
        .envs(env.iter().copied())
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    within(
        Duration::from_secs(30),
        &format!("machine-controller-local {args:?} (environment {env:?}) to exit"),
        child.wait_with_output(),
    )
    .await
    .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test]
async fn help_lists_every_flag_of_gardeners_machine_controller() {
    let out = run(&["--help"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let help = text(&out);
    let listed = |flag: &str| {
        help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
            .any(|w| w == format!("--{flag}"))
    };
    let missing: Vec<&&str> = GARDENER_FLAGS.iter().filter(|f| !listed(f)).collect();
    assert!(
        missing.is_empty(),
        "flags missing from --help: {missing:?}\n{help}"
    );
}

#[tokio::test]
async fn an_invalid_duration_names_the_flag() {
    let out = run(&["--machine-drain-timeout=soon", "--leader-elect=false"]).await;
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(msg.contains("--machine-drain-timeout"), "{msg}");
    assert!(msg.contains("soon"), "{msg}");
}

#[tokio::test]
async fn no_target_cluster_needs_an_explicit_control_kubeconfig() {
    let port = free_port().to_string();
    let out = run(&[
        "--target-kubeconfig=none",
        "--leader-elect=false",
        "--address=127.0.0.1",
        &format!("--port={port}"),
    ])
    .await;
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(
        msg.contains("--control-kubeconfig") && msg.contains("--target-kubeconfig=none"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_missing_target_kubeconfig_is_reported_readably() {
    let port = free_port().to_string();
    let out = run(&[
        "--target-kubeconfig=/nonexistent",
        "--namespace=default",
        "--leader-elect=false",
        "--address=127.0.0.1",
        &format!("--port={port}"),
    ])
    .await;
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(msg.contains("/nonexistent"), "{msg}");
    assert_eq!(
        msg.to_lowercase().matches("no such file").count(),
        1,
        "the cause is shown, once: {msg}"
    );
    assert!(!msg.contains("panicked"), "{msg}");
}

#[tokio::test]
async fn an_invalid_fault_configuration_names_the_entry() {
    let out = run_with_env(
        &["--leader-elect=false"],
        &[("MCM_DRIVER_FAULTS", "all:rate=0.3;reboot:rate=1")],
    )
    .await;
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(msg.contains("MCM_DRIVER_FAULTS"), "{msg}");
    assert!(msg.contains("unknown operation \"reboot\""), "{msg}");
}
