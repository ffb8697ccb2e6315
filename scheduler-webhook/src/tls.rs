//! TLS for the webhook and extender server: rustls 0.23 (ring) with a
//! certificate resolver that re-reads the PEM files when they change, so a
//! rotated certificate (cert-manager, a re-rendered Secret) needs no restart.
//!
//! The files are checked (one `stat` each) at every TLS handshake; a change
//! that does not load (half-written file, mismatched key) keeps serving the
//! previous certificate and logs why.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the expected kind.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Identity of a file's current content (modification time and length).
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

struct Loaded {
    stamps: (Stamp, Stamp),
    key: Arc<CertifiedKey>,
}

/// Serves the certificate in `cert`/`key`, reloading them when they change.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Loaded>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the files once; fails if they are not a usable pair.
    ///
    /// # Errors
    /// A [`TlsError`] naming the file and the problem.
    pub fn new(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let stamps = (stamp(cert), stamp(key));
        let loaded = load(cert, key)?;
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Loaded {
                stamps,
                key: Arc::new(loaded),
            }),
        })
    }

    /// The certificate currently served, reloading first if the files changed.
    #[must_use]
    pub fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert), stamp(&self.key));
        if let Ok(current) = self.current.read()
            && current.stamps == stamps
        {
            return current.key.clone();
        }
        let Ok(mut current) = self.current.write() else {
            // A poisoned lock means a panic elsewhere; keep serving nothing new.
            return self.fallback();
        };
        if current.stamps != stamps {
            match load(&self.cert, &self.key) {
                Ok(key) => {
                    info!(cert = %self.cert.display(), "TLS certificate reloaded");
                    current.key = Arc::new(key);
                }
                Err(error) => {
                    warn!(%error, "TLS certificate changed but does not load; serving the previous one")
                }
            }
            // Remember the stamps either way, so a broken file is not re-parsed per handshake.
            current.stamps = stamps;
        }
        current.key.clone()
    }

    fn fallback(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) => c.key.clone(),
            Err(poisoned) => poisoned.into_inner().key.clone(),
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let pem_err = |path: &Path, what: String| TlsError::Pem {
        path: path.to_owned(),
        what,
    };
    let cert_pem = read(cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem_err(cert, "no CERTIFICATE block".to_owned()));
    }
    let key_pem = read(key)?;
    let private =
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| pem_err(key, e.to_string()))?;
    let signing = ring::sign::any_supported_type(&private)
        .map_err(|e| pem_err(key, format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| pem_err(key, format!("does not match the certificate: {e}")))?;
    Ok(certified)
}

/// A rustls server config (ring provider, TLS 1.2 and 1.3) serving the
/// reloading certificate.
///
/// # Errors
/// A [`TlsError`] when the files are not a usable pair.
pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let resolver = ReloadingCert::new(cert, key)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert.cert.pem()).unwrap();
        std::fs::write(&k, cert.signing_key.serialize_pem()).unwrap();
        (c, k, cert.cert.der().to_vec())
    }

    #[test]
    fn serves_the_pair_and_reloads_after_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k, first) = write_pair(dir.path(), "first.example");
        let resolver = ReloadingCert::new(&c, &k).unwrap();
        assert_eq!(resolver.current().cert[0].as_ref(), first.as_slice());

        let (_, _, second) = write_pair(dir.path(), "second.example.with.a.longer.name");
        assert_eq!(resolver.current().cert[0].as_ref(), second.as_slice());
    }

    #[test]
    fn a_broken_rotation_keeps_the_previous_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k, first) = write_pair(dir.path(), "first.example");
        let resolver = ReloadingCert::new(&c, &k).unwrap();
        std::fs::write(&k, "-----BEGIN PRIVATE KEY-----\nnot base64!\n").unwrap();
        assert_eq!(resolver.current().cert[0].as_ref(), first.as_slice());
    }

    #[test]
    fn startup_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.crt");
        let err = ReloadingCert::new(&missing, &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope.crt"), "{err}");

        let (c, _, _) = write_pair(dir.path(), "a.example");
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let (_, k2, _) = write_pair(&other, "b.example");
        let err = ReloadingCert::new(&c, &k2).unwrap_err().to_string();
        assert!(err.contains("does not match"), "{err}");

        std::fs::write(&c, "hello").unwrap();
        let err = server_config(&c, &k2).unwrap_err().to_string();
        assert!(err.contains("no CERTIFICATE"), "{err}");
    }
}
