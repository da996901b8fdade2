//! Which certificates the daemon's outbound HTTPS trusts (`[egress]`):
//! plugins' requests and the OTLP exporter. The webpki roots (Mozilla's CA
//! set, as browsers), plus the certificate authorities of an operator's
//! `egress.ca-file` — a receiver or collector inside a company network is
//! often served under a private CA that no public root signs.
//!
//! Owns: the `[egress]` settings ([`EgressConfig`]), reading the CA file
//! (PEM, one or more `CERTIFICATE` items) and the rustls client
//! configuration every plugin's pooled client and the OTLP exporter are
//! built with ([`client_tls`]): the `ring` provider, TLS 1.2 and 1.3 (each
//! client's connector sets its own ALPN).
//!
//! Must never: trust a certificate the operator did not name beyond the
//! webpki roots, or start with a CA file it could not read whole (a file
//! that parses halfway would silently trust less than was written).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

/// `[egress]`: how the daemon's outbound requests (plugins', the OTLP
/// exporter's) leave the host.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct EgressConfig {
    /// Certificate authorities (PEM, `-----BEGIN CERTIFICATE-----` items)
    /// that outbound HTTPS trusts besides the webpki roots. Unset: the
    /// webpki roots only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

/// Why `egress.ca-file` cannot be used; the start stops with it.
#[derive(Debug, thiserror::Error)]
#[error("egress.ca-file: {file}: {problem}")]
pub struct TrustError {
    /// The file named by `egress.ca-file`.
    pub file: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// The rustls client configuration for the outbound HTTPS under
/// `config`: the webpki roots, and every certificate of `egress.ca-file`
/// when set. Errors name the file and what is wrong: unreadable, not PEM,
/// no certificate in it, or a certificate rustls cannot use as a trust
/// anchor.
pub fn client_tls(config: &EgressConfig) -> Result<Arc<rustls::ClientConfig>, TrustError> {
    let Some(file) = &config.ca_file else {
        return Ok(webpki_only());
    };
    let mut roots = webpki_roots();
    for (index, certificate) in read_certificates(file)?.into_iter().enumerate() {
        roots.add(certificate).map_err(|e| TrustError {
            file: file.clone(),
            problem: format!("certificate {} is not a usable CA: {e}", index + 1),
        })?;
    }
    Ok(Arc::new(with_roots(roots)))
}

/// The configuration with the webpki roots only (what [`client_tls`]
/// gives without `egress.ca-file`), made once per process.
pub fn webpki_only() -> Arc<rustls::ClientConfig> {
    static WEBPKI: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    WEBPKI
        .get_or_init(|| Arc::new(with_roots(webpki_roots())))
        .clone()
}

fn webpki_roots() -> rustls::RootCertStore {
    rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

fn with_roots(roots: rustls::RootCertStore) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// Every `CERTIFICATE` item of the PEM file `file`, in order; other items
/// (a key by mistake) are an error, as is a file with none.
fn read_certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let fail = |problem: String| TrustError {
        file: file.to_path_buf(),
        problem,
    };
    let text = std::fs::read(file).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let mut certificates = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(&text) {
        let (kind, der) = item.map_err(|e| fail(format!("is not PEM: {e}")))?;
        if kind != SectionKind::Certificate {
            return Err(fail(format!(
                "holds a {kind:?} item; only CERTIFICATE items belong here"
            )));
        }
        certificates.push(CertificateDer::from(der));
    }
    if certificates.is_empty() {
        return Err(fail("holds no PEM certificate".into()));
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn written(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    fn problem(text: &str) -> String {
        let file = written(text);
        let config = EgressConfig {
            ca_file: Some(file.path().to_path_buf()),
        };
        let e = client_tls(&config).unwrap_err();
        assert_eq!(e.file, file.path());
        e.problem
    }

    #[test]
    fn a_ca_file_adds_its_certificates_to_the_webpki_roots() {
        let file = written(&format!("{}{}", ca_pem(), ca_pem()));
        let roots = read_certificates(file.path()).unwrap();
        assert_eq!(roots.len(), 2);
        client_tls(&EgressConfig {
            ca_file: Some(file.path().to_path_buf()),
        })
        .unwrap();
    }

    #[test]
    fn a_ca_file_that_is_missing_empty_or_a_key_stops_the_start_naming_why() {
        let missing = EgressConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
        };
        let e = client_tls(&missing).unwrap_err().to_string();
        assert!(
            e.starts_with("egress.ca-file: /nonexistent/ca.pem: cannot be read"),
            "{e}"
        );
        assert_eq!(problem("no pem here\n"), "holds no PEM certificate");
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert!(problem(&key).contains("only CERTIFICATE items"), "{key}");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(problem(garbage).contains("not a usable CA"));
    }
}
