//! TLS on the HTTP listener (`[tls]`): rustls with the `ring` provider, as
//! every other TLS connection of the daemon, offering HTTP/2 and HTTP/1.1
//! by ALPN (RFC 7301).
//!
//! Owns: the `[tls]` settings ([`TlsConfig`]), reading the certificate
//! chain and private key (PEM), and putting a changed pair in force
//! without a restart ([`watch`]): the files are looked at every
//! `reload-interval`, and a pair that does not load is logged while the
//! pair in force keeps serving.
//!
//! Must never: log the private key, or stop serving because a renewed
//! pair is broken.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum_server::tls_rustls::RustlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

/// `[tls]`: the listener's certificate and key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TlsConfig {
    /// The certificate chain, PEM, leaf first.
    pub cert_file: PathBuf,
    /// The private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// How often the files are looked at for a renewed pair. Default 10 s.
    #[serde(with = "humantime_serde", default = "TlsConfig::default_reload")]
    pub reload_interval: Duration,
}

impl TlsConfig {
    fn default_reload() -> Duration {
        Duration::from_secs(10)
    }

    /// Check what types cannot: (key, problem) naming the setting.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.cert_file.as_os_str().is_empty() {
            return Err(("cert-file".into(), "is empty".into()));
        }
        if self.key_file.as_os_str().is_empty() {
            return Err(("key-file".into(), "is empty".into()));
        }
        if self.reload_interval.is_zero() {
            return Err(("reload-interval".into(), "must be greater than 0s".into()));
        }
        Ok(())
    }
}

/// Why a certificate and key could not be put in force.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("tls: {file}: {problem}")]
    File {
        /// The file at fault.
        file: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The key does not fit the certificate, or rustls refused the pair.
    #[error("tls: {cert} with {key}: {problem}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        problem: String,
    },
}

/// The rustls server configuration for `tls`'s files: ring provider,
/// TLS 1.2 and 1.3, no client certificates, ALPN `h2` then `http/1.1`.
///
/// Errors: [`TlsError`] naming the file or pair at fault.
pub fn server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let file_error = |file: &Path, problem: String| TlsError::File {
        file: file.to_path_buf(),
        problem,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert_file)
        .map_err(|e| file_error(&tls.cert_file, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(&tls.cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error(&tls.cert_file, "holds no CERTIFICATE".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .map_err(|e| file_error(&tls.key_file, format!("no private key: {e}")))?;
    let pair_error = |problem: String| TlsError::Pair {
        cert: tls.cert_file.clone(),
        key: tls.key_file.clone(),
        problem,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| pair_error(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| pair_error(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What identifies a version of the pair on disk: each file's modification
/// time and length.
fn stamp(tls: &TlsConfig) -> Option<[(SystemTime, u64); 2]> {
    let one = |p: &Path| {
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len()))
    };
    Some([one(&tls.cert_file)?, one(&tls.key_file)?])
}

/// Look at `tls`'s files every `reload-interval` until `shutdown`; when
/// either changed, load the pair and put it in force in `serving` (new
/// connections use it; open ones keep theirs). A pair that does not load
/// is logged and looked at again at the next change.
pub fn watch(
    tls: TlsConfig,
    serving: RustlsConfig,
    mut shutdown: signal::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut seen = stamp(&tls);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tls.reload_interval) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let now = stamp(&tls);
            if now == seen {
                continue;
            }
            seen = now;
            match server_config(&tls) {
                Ok(config) => {
                    serving.reload_from_config(config);
                    tracing::info!(cert = %tls.cert_file.display(), "TLS certificate reloaded");
                }
                Err(e) => tracing::error!(
                    "TLS certificate not reloaded, the one in force keeps serving: {e}"
                ),
            }
        }
    })
}
