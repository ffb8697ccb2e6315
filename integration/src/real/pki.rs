//! The cluster's certificates, as kubeadm would make them but all on
//! 127.0.0.1: one CA signing the apiserver's serving certificate and the
//! client certificates (their organization is the Kubernetes group), and the
//! service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// The files of the cluster's PKI.
#[derive(Debug)]
pub struct Pki {
    /// The CA certificate (`--client-ca-file`, and what clients trust).
    pub ca: PathBuf,
    /// kube-apiserver's serving certificate (127.0.0.1, localhost and the
    /// in-cluster names).
    pub apiserver: CertFiles,
    /// The service-account signing key (private) and its public half.
    pub service_account: CertFiles,
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

fn err(what: &str) -> impl FnOnce(rcgen::Error) -> std::io::Error + '_ {
    move |e| std::io::Error::other(format!("{what}: {e}"))
}

impl Pki {
    /// Generates the CA, the apiserver certificate and the service-account key
    /// into `dir`.
    ///
    /// # Errors
    /// Key generation or a file write failed.
    pub fn generate(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "gpuslice-test-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(err("CA key"))?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(err("CA certificate"))?;
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, issuer.pem())?;

        let sa_key = KeyPair::generate().map_err(err("service-account key"))?;
        let service_account = CertFiles {
            cert: dir.join("sa.pub"),
            key: dir.join("sa.key"),
        };
        std::fs::write(&service_account.key, sa_key.serialize_pem())?;
        std::fs::write(&service_account.cert, sa_key.public_key_pem())?;

        let mut pki = Self {
            ca,
            apiserver: service_account.clone(),
            service_account,
            issuer,
            dir: dir.to_owned(),
        };
        pki.apiserver = pki.sign(
            "apiserver",
            "kube-apiserver",
            &[],
            &[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            true,
        )?;
        Ok(pki)
    }

    /// A client certificate for user `common_name` in `groups` (how
    /// kube-apiserver's x509 authenticator reads it).
    ///
    /// # Errors
    /// Signing or writing failed.
    pub fn client(
        &self,
        file: &str,
        common_name: &str,
        groups: &[&str],
    ) -> std::io::Result<CertFiles> {
        self.sign(file, common_name, groups, &[], false)
    }

    fn sign(
        &self,
        file: &str,
        common_name: &str,
        groups: &[&str],
        names: &[&str],
        server: bool,
    ) -> std::io::Result<CertFiles> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName((*n).try_into().map_err(err("DNS name"))?)),
            })
            .collect::<std::io::Result<_>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().map_err(err("key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err("certificate"))?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem())?;
        std::fs::write(&files.key, key.serialize_pem())?;
        Ok(files)
    }
}
