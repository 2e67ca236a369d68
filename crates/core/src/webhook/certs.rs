//! The webhook's serving certificate: read from a directory (cert-manager's `tls.crt` and
//! `tls.key`), or a self-signed CA and a serving certificate generated at start-up, kept in a
//! Secret that every replica shares, renewed at start-up when it nears its end or no longer
//! names the hosts, and whose CA is patched into the ValidatingWebhookConfiguration.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::json;

/// How long a generated certificate is valid.
pub const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A shared certificate with less than this left is replaced at start-up.
pub const RENEW_BEFORE: Duration = Duration::from_secs(90 * 24 * 3600);

/// Annotation of the Secret: the hosts (comma separated) its certificate names.
pub const HOSTS_ANNOTATION: &str = "webhook.machine.sapcloud.io/hosts";
/// Annotation of the Secret: when its certificate ends (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "webhook.machine.sapcloud.io/not-after";

/// Errors of the certificate set-up. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file of `--webhook-cert-dir` cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Generating a key or certificate failed.
    #[error("cannot generate the webhook certificate")]
    Generate(#[from] rcgen::Error),
    /// The PEM material is not a certificate chain and key rustls accepts.
    #[error("the webhook certificate or key is not usable")]
    Tls(#[source] rustls::Error),
    /// A PEM file does not parse.
    #[error("the webhook certificate or key is not PEM: {0}")]
    Pem(String),
    /// The Secret or the webhook configuration could not be read or written.
    #[error("{what}")]
    Api {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// A serving certificate and key (PEM), and the CA that signed it when it is ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingCert {
    /// The certificate chain, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
    /// The CA certificate clients trust (self-signed mode), PEM.
    pub ca_pem: Option<String>,
    /// When the certificate ends.
    pub not_after: Option<Timestamp>,
}

/// Reads `tls.crt` and `tls.key` (and `ca.crt` when present) from `dir`.
pub fn from_dir(dir: &Path) -> Result<ServingCert, CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| CertError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    Ok(ServingCert {
        cert_pem: read("tls.crt")?,
        key_pem: read("tls.key")?,
        ca_pem: read("ca.crt").ok(),
        not_after: None,
    })
}

/// A fresh CA and a serving certificate for `hosts` (DNS names or IP addresses) signed by it,
/// valid from an hour before `now` (clock skew) for [`VALIDITY`].
pub fn self_signed(hosts: &[String], now: Timestamp) -> Result<ServingCert, CertError> {
    let start = now - jiff::SignedDuration::from_hours(1);
    let end = now + VALIDITY;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "mcm-rs webhook CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut ca_params, start, end);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut params = CertificateParams::new(hosts.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts
            .first()
            .map(String::as_str)
            .unwrap_or("mcm-rs webhook"),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    set_validity(&mut params, start, end);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(ServingCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: Some(ca.pem()),
        not_after: Some(end),
    })
}

/// Sets the validity of `params` to `from..to` (whole seconds, UTC).
fn set_validity(params: &mut CertificateParams, from: Timestamp, to: Timestamp) {
    let at = |t: Timestamp| {
        let dt = t.to_zoned(jiff::tz::TimeZone::UTC);
        let seconds_of_day = u64::from(dt.hour() as u8) * 3600
            + u64::from(dt.minute() as u8) * 60
            + u64::from(dt.second() as u8);
        rcgen::date_time_ymd(dt.year().into(), dt.month() as u8, dt.day() as u8)
            + Duration::from_secs(seconds_of_day)
    };
    params.not_before = at(from);
    params.not_after = at(to);
}

/// The DNS names of a Service: `svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`,
/// then `extra` (deduplicated, in that order).
pub fn hosts(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if !service.is_empty() {
        out.push(service.to_string());
        out.push(format!("{service}.{namespace}"));
        out.push(format!("{service}.{namespace}.svc"));
        out.push(format!("{service}.{namespace}.svc.cluster.local"));
    }
    for h in extra.iter().map(|h| h.trim()).filter(|h| !h.is_empty()) {
        if !out.iter().any(|o| o == h) {
            out.push(h.to_string());
        }
    }
    out
}

/// What to do with the shared Secret found at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedCert {
    /// Use the certificate it holds.
    Use(ServingCert),
    /// Generate a new one and write it (absent, incomplete, other hosts, or near its end).
    Renew,
}

/// Decides whether the Secret's certificate can serve `hosts` at `now` (pure).
pub fn decide(secret: Option<&Secret>, hosts: &[String], now: Timestamp) -> SharedCert {
    let Some(secret) = secret else {
        return SharedCert::Renew;
    };
    let anns = secret.metadata.annotations.clone().unwrap_or_default();
    let data = secret.data.clone().unwrap_or_default();
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    let named = anns
        .get(HOSTS_ANNOTATION)
        .map(|h| h.split(',').collect::<Vec<_>>());
    let not_after = anns
        .get(NOT_AFTER_ANNOTATION)
        .and_then(|t| t.parse::<Timestamp>().ok());
    match (
        text("tls.crt"),
        text("tls.key"),
        text("ca.crt"),
        named,
        not_after,
    ) {
        (Some(cert_pem), Some(key_pem), Some(ca_pem), Some(named), Some(end))
            if hosts.iter().all(|h| named.contains(&h.as_str())) && end > now + RENEW_BEFORE =>
        {
            SharedCert::Use(ServingCert {
                cert_pem,
                key_pem,
                ca_pem: Some(ca_pem),
                not_after: Some(end),
            })
        }
        _ => SharedCert::Renew,
    }
}

/// The Secret that holds `cert` for `hosts`.
pub fn secret_of(name: &str, cert: &ServingCert, hosts: &[String]) -> Secret {
    let mut data = BTreeMap::new();
    data.insert(
        "tls.crt".to_string(),
        ByteString(cert.cert_pem.clone().into()),
    );
    data.insert(
        "tls.key".to_string(),
        ByteString(cert.key_pem.clone().into()),
    );
    if let Some(ca) = &cert.ca_pem {
        data.insert("ca.crt".to_string(), ByteString(ca.clone().into()));
    }
    let mut anns = BTreeMap::new();
    anns.insert(HOSTS_ANNOTATION.to_string(), hosts.join(","));
    if let Some(end) = cert.not_after {
        anns.insert(NOT_AFTER_ANNOTATION.to_string(), end.to_string());
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(anns),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

/// The certificate every replica shares: the Secret's when it still serves `hosts`, else a
/// new one written to the Secret. A replica that loses the race to write it uses the
/// winner's.
pub async fn shared(
    secrets: &Api<Secret>,
    name: &str,
    hosts: &[String],
) -> Result<ServingCert, CertError> {
    let api_err = |what: String| move |source| CertError::Api { what, source };
    for _ in 0..5 {
        let found = secrets
            .get_opt(name)
            .await
            .map_err(api_err(format!("cannot read the webhook Secret {name}")))?;
        if let SharedCert::Use(cert) = decide(found.as_ref(), hosts, Timestamp::now()) {
            return Ok(cert);
        }
        let cert = self_signed(hosts, Timestamp::now())?;
        let mut secret = secret_of(name, &cert, hosts);
        let written = match &found {
            None => secrets.create(&PostParams::default(), &secret).await,
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version.clone();
                secrets.replace(name, &PostParams::default(), &secret).await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = name, hosts = ?hosts, "webhook certificate generated");
                return Ok(cert);
            }
            // Another replica wrote it first: read theirs.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(source) => {
                return Err(CertError::Api {
                    what: format!("cannot write the webhook Secret {name}"),
                    source,
                });
            }
        }
    }
    Err(CertError::Api {
        what: format!("the webhook Secret {name} kept changing while it was written"),
        source: kube::Error::Service("conflicts on every attempt".into()),
    })
}

/// Puts `ca_pem` into the `clientConfig.caBundle` of every webhook of the configuration.
pub async fn patch_ca_bundle(
    configs: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    ca_pem: &str,
) -> Result<usize, CertError> {
    let config = configs.get(name).await.map_err(|source| CertError::Api {
        what: format!("cannot read the ValidatingWebhookConfiguration {name}"),
        source,
    })?;
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    let webhooks: Vec<_> = config
        .webhooks
        .iter()
        .flatten()
        .map(|w| json!({"name": w.name, "clientConfig": {"caBundle": bundle}}))
        .collect();
    let patch = json!({"webhooks": webhooks});
    configs
        .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(|source| CertError::Api {
            what: format!("cannot patch the caBundle of the ValidatingWebhookConfiguration {name}"),
            source,
        })?;
    Ok(webhooks.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts_a() -> Vec<String> {
        hosts("mcm-webhook", "machines", &["127.0.0.1".to_string()])
    }

    #[test]
    fn service_hosts_then_extras_without_duplicates() {
        assert_eq!(
            hosts("w", "ns", &["w".into(), " 10.0.0.1 ".into(), String::new()]),
            vec![
                "w",
                "w.ns",
                "w.ns.svc",
                "w.ns.svc.cluster.local",
                "10.0.0.1"
            ]
        );
        assert_eq!(hosts("", "ns", &["127.0.0.1".into()]), vec!["127.0.0.1"]);
    }

    #[test]
    fn a_generated_certificate_is_reused_until_it_nears_its_end_or_names_other_hosts() {
        let now = Timestamp::now();
        let cert = self_signed(&hosts_a(), now).unwrap();
        assert!(cert.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            cert.ca_pem
                .as_deref()
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
        assert_ne!(cert.ca_pem.as_deref(), Some(cert.cert_pem.as_str()));
        let secret = secret_of("s", &cert, &hosts_a());
        assert_eq!(decide(None, &hosts_a(), now), SharedCert::Renew);
        assert_eq!(
            decide(Some(&secret), &hosts_a(), now),
            SharedCert::Use(cert.clone())
        );
        // A subset of the hosts is served by it too.
        assert!(matches!(
            decide(Some(&secret), &hosts_a()[..1], now),
            SharedCert::Use(_)
        ));
        let other = hosts("other", "machines", &[]);
        assert_eq!(decide(Some(&secret), &other, now), SharedCert::Renew);
        let late = now + (VALIDITY - RENEW_BEFORE) + Duration::from_secs(60);
        assert_eq!(decide(Some(&secret), &hosts_a(), late), SharedCert::Renew);
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().remove("tls.key");
        assert_eq!(decide(Some(&broken), &hosts_a(), now), SharedCert::Renew);
    }

    #[test]
    fn a_generated_certificate_loads_into_rustls() {
        let cert = self_signed(&hosts_a(), Timestamp::now()).unwrap();
        super::super::server_config(&cert).unwrap();
    }

    #[test]
    fn a_missing_directory_names_the_file() {
        let err = from_dir(Path::new("/nonexistent-webhook-dir")).unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
    }
}
