//! Bootstrap tokens: the credential a new VM uses to join the target cluster.
//!
//! One token per machine, stored as the Secret `kube-system/bootstrap-token-<id>` of the
//! target cluster (the format kube-apiserver's bootstrap-token authenticator reads). The id is
//! derived from the machine's namespace and name, so a reconcile after a crash finds the same
//! token; it expires after the creation timeout and is deleted once the Node joined.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::constants::placeholders;

/// Namespace of bootstrap-token secrets.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// Secret type of bootstrap tokens.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Label on token secrets naming the machine they were made for.
pub const MACHINE_LABEL: &str = "machine.sapcloud.io/machine-name";

/// The 6-character token id of a machine: stable across reconciles, `[a-z0-9]{6}`.
pub fn token_id(namespace: &str, machine_name: &str) -> String {
    // FNV-1a over "namespace/name", printed in base 36: cheap, stable, no extra dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in namespace.bytes().chain(*b"/").chain(machine_name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut id = String::with_capacity(6);
    for _ in 0..6 {
        let digit = (h % 36) as u32;
        h /= 36;
        id.push(char::from_digit(digit, 36).unwrap_or('0'));
    }
    id
}

/// Whether the bootstrap token of `m` may still exist, read from the Machine before its
/// deletion marks it Terminating. The token is deleted before a machine's first Running is
/// recorded (by either MCM), so a machine in a phase that only follows Running (Running,
/// Unknown, an in-place phase) has none left, and deleting it again would only be a 404. A
/// `machine-join-duration` annotation (written by earlier releases right after the token's
/// deletion) says the same. Any other phase (none yet, Pending, CrashLoopBackOff, Failed
/// either before or after joining) may have one. Pure.
pub fn may_exist(m: &mcm_api::Machine) -> bool {
    use mcm_api::MachinePhase::*;
    let joined = matches!(
        m.phase(),
        Some(Running | Unknown | InPlaceUpdating | InPlaceUpdateSuccessful | InPlaceUpdateFailed)
    );
    let annotated =
        m.metadata.annotations.as_ref().is_some_and(|a| {
            a.contains_key(mcm_api::constants::annotations::MACHINE_JOIN_DURATION)
        });
    !joined && !annotated
}

/// The name of the token secret for a token id.
pub fn secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

/// A fresh 16-character token secret, `[a-z0-9]{16}`.
pub fn random_secret() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..16)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// The token secret for a machine.
pub fn token_secret(
    id: &str,
    secret: &str,
    machine_name: &str,
    expires: Timestamp,
    extra_groups: &str,
) -> Secret {
    let mut data = BTreeMap::from([
        ("token-id".to_string(), id.to_string()),
        ("token-secret".to_string(), secret.to_string()),
        ("expiration".to_string(), expires.to_string()),
        (
            "usage-bootstrap-authentication".to_string(),
            "true".to_string(),
        ),
        ("usage-bootstrap-signing".to_string(), "true".to_string()),
        (
            "description".to_string(),
            format!("bootstrap token of machine {machine_name}, created by machine-controller"),
        ),
    ]);
    if !extra_groups.trim().is_empty() {
        data.insert("auth-extra-groups".into(), extra_groups.trim().to_string());
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(id)),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                MACHINE_LABEL.to_string(),
                machine_name.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.into()),
        string_data: Some(data),
        ..Default::default()
    }
}

/// The expiry of a token made now for a machine with this creation timeout.
pub fn expiry(now: Timestamp, creation_timeout: Duration) -> Timestamp {
    let secs = i64::try_from(creation_timeout.as_secs()).unwrap_or(i64::MAX / 2);
    now.checked_add(jiff::SignedDuration::from_secs(secs))
        .unwrap_or(now)
}

/// The full token (`<id>.<secret>`) stored in a token secret, if it is well-formed.
pub fn token_of(secret: &Secret) -> Option<String> {
    let get = |k: &str| -> Option<String> {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(k).cloned()))
    };
    Some(format!("{}.{}", get("token-id")?, get("token-secret")?))
}

/// Whether the user data has the `<<BOOTSTRAP_TOKEN>>` placeholder (without it the VM gets
/// no token). Pure.
pub fn has_token_placeholder(user_data: &str) -> bool {
    user_data.contains(placeholders::BOOTSTRAP_TOKEN)
}

/// Fills the placeholders of the user data: `<<BOOTSTRAP_TOKEN>>` and `<<MACHINE_NAME>>`.
pub fn render_user_data(user_data: &str, token: &str, machine_name: &str) -> String {
    user_data
        .replace(placeholders::BOOTSTRAP_TOKEN, token)
        .replace(placeholders::MACHINE_NAME, machine_name)
}

/// `userData` for a machine without a target cluster: only the machine-name placeholder is
/// filled (there is no bootstrap token).
pub fn render_machine_name(user_data: &str, machine_name: &str) -> String {
    user_data.replace(placeholders::MACHINE_NAME, machine_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_that_joined_has_no_token_left() {
        let machine = |phase: Option<&str>| -> mcm_api::Machine {
            let mut m = serde_json::json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": "m"}, "spec": {}
            });
            if let Some(p) = phase {
                m["status"] = serde_json::json!({"currentStatus": {"phase": p}});
            }
            serde_json::from_value(m).unwrap()
        };
        for phase in [
            None,
            Some("Pending"),
            Some("CrashLoopBackOff"),
            Some("Failed"),
        ] {
            assert!(
                may_exist(&machine(phase)),
                "{phase:?}: may never have joined"
            );
        }
        for phase in [
            "Running",
            "Unknown",
            "InPlaceUpdating",
            "InPlaceUpdateFailed",
        ] {
            assert!(!may_exist(&machine(Some(phase))), "{phase}: joined");
        }
        let mut annotated = machine(Some("Pending"));
        annotated.metadata.annotations = Some(
            [(
                mcm_api::constants::annotations::MACHINE_JOIN_DURATION.to_string(),
                "2m3s".to_string(),
            )]
            .into(),
        );
        assert!(
            !may_exist(&annotated),
            "annotated by an earlier release: deleted before Running was recorded"
        );
    }

    #[test]
    fn token_ids_are_stable_and_valid() {
        let a = token_id("ns", "machine-1");
        assert_eq!(a, token_id("ns", "machine-1"));
        assert_ne!(a, token_id("ns", "machine-2"));
        assert_ne!(a, token_id("other", "machine-1"));
        assert_eq!(a.len(), 6);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        let s = random_secret();
        assert_eq!(s.len(), 16);
        assert!(
            s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
    }

    #[test]
    fn secrets_carry_what_the_authenticator_needs() {
        let exp = expiry(
            "2026-01-01T00:00:00Z".parse().unwrap(),
            Duration::from_secs(1200),
        );
        let s = token_secret(
            "abcdef",
            "0123456789abcdef",
            "m",
            exp,
            "system:bootstrappers:x",
        );
        assert_eq!(s.metadata.name.as_deref(), Some("bootstrap-token-abcdef"));
        assert_eq!(s.type_.as_deref(), Some(TOKEN_SECRET_TYPE));
        let d = s.string_data.as_ref().unwrap();
        assert_eq!(d["expiration"], "2026-01-01T00:20:00Z");
        assert_eq!(d["auth-extra-groups"], "system:bootstrappers:x");
        assert_eq!(token_of(&s).as_deref(), Some("abcdef.0123456789abcdef"));
        let no_groups = token_secret("abcdef", "x", "m", exp, " ");
        assert!(
            !no_groups
                .string_data
                .unwrap()
                .contains_key("auth-extra-groups")
        );
    }

    #[test]
    fn placeholders_are_replaced() {
        assert_eq!(
            render_user_data(
                "token: <<BOOTSTRAP_TOKEN>>\nname: <<MACHINE_NAME>>\n",
                "a.b",
                "m1"
            ),
            "token: a.b\nname: m1\n"
        );
        assert!(has_token_placeholder("token: <<BOOTSTRAP_TOKEN>>"));
        assert!(!has_token_placeholder("#cloud-config\nruncmd: [echo]\n"));
    }
}
