//! The certificates and keys of a test control plane: a CA, the API server's serving
//! certificate for 127.0.0.1, an admin client certificate (`system:masters`), and the
//! service-account signing key.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::TestEnvError;

/// Paths of the PEM files written by [`Pki::write`].
#[derive(Debug, Clone)]
pub struct PkiFiles {
    /// The CA certificate (trusted by clients, and the API server's client CA).
    pub ca_cert: PathBuf,
    /// The CA key (kube-controller-manager signs with it).
    pub ca_key: PathBuf,
    /// The API server's serving certificate.
    pub serving_cert: PathBuf,
    /// The API server's serving key.
    pub serving_key: PathBuf,
    /// The service-account signing key (private).
    pub service_account_key: PathBuf,
    /// The public half of the service-account key (token verification).
    pub service_account_pub: PathBuf,
}

/// Generated PEM material, kept in memory for kubeconfigs.
pub struct Pki {
    /// CA certificate, PEM.
    pub ca_cert_pem: String,
    /// Admin client certificate, PEM.
    pub admin_cert_pem: String,
    /// Admin client key, PEM.
    pub admin_key_pem: String,
    ca_key_pem: String,
    serving_cert_pem: String,
    serving_key_pem: String,
    service_account_key_pem: String,
    service_account_pub_pem: String,
}

impl Pki {
    /// Generates a fresh CA and the certificates signed by it.
    pub fn generate() -> Result<Self, TestEnvError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = name("mcm-testenv-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

        let mut serving = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        serving.distinguished_name = name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving.signed_by(&serving_key, &ca)?;

        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name = name("mcm-testenv-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_key = KeyPair::generate()?;
        let admin_cert = admin.signed_by(&admin_key, &ca)?;

        let service_account_key = KeyPair::generate()?;

        Ok(Pki {
            ca_cert_pem: ca.pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            ca_key_pem,
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            service_account_key_pem: service_account_key.serialize_pem(),
            service_account_pub_pem: service_account_key.public_key_pem(),
        })
    }

    /// Writes the files the control-plane processes read into `dir`.
    pub fn write(&self, dir: &Path) -> Result<PkiFiles, TestEnvError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| TestEnvError::io("create the pki directory", e))?;
        let files = PkiFiles {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            service_account_key: dir.join("sa.key"),
            service_account_pub: dir.join("sa.pub"),
        };
        for (path, pem) in [
            (&files.ca_cert, &self.ca_cert_pem),
            (&files.ca_key, &self.ca_key_pem),
            (&files.serving_cert, &self.serving_cert_pem),
            (&files.serving_key, &self.serving_key_pem),
            (&files.service_account_key, &self.service_account_key_pem),
            (&files.service_account_pub, &self.service_account_pub_pem),
        ] {
            std::fs::write(path, pem).map_err(|e| TestEnvError::io("write a pki file", e))?;
        }
        Ok(files)
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}
