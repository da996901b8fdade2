//! The CLI's client of the running daemon: one request to its admin API.
//!
//! Owns: one request to the daemon at the configured `listen` address
//! (loopback when it listens on every address), with the admin token when
//! one is configured, bounded by a timeout; over TLS when the daemon
//! serves TLS (`[tls]`), trusting exactly the certificate in its
//! `cert-file` (the CLI runs beside the daemon and reads the same
//! configuration, so the leaf is pinned rather than checked by name); the
//! answer read into the action's answer type, or its refusal.
//!
//! Must never: retry a change (a request that timed out may have been
//! applied), or hide the daemon's refusal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use outboxd::config::Config;
use serde::de::DeserializeOwned;

/// Why a request to the daemon got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum DaemonClientError {
    /// No daemon answered.
    #[error("no daemon answered at {addr}: {reason}")]
    Unreachable {
        /// Where it was asked.
        addr: SocketAddr,
        /// Why it did not answer.
        reason: String,
    },
    /// The daemon's answer was not the JSON expected.
    #[error("the daemon at {addr} answered {path} with unreadable JSON: {reason}")]
    Body {
        /// Where it was asked.
        addr: SocketAddr,
        /// The path asked for.
        path: String,
        /// Why the JSON could not be read.
        reason: String,
    },
}

/// The daemon's refusal of a request: its status and message (the admin
/// API's `{"error": …}`).
#[derive(Debug, Clone)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    /// What the daemon said.
    pub message: String,
}

/// Where and how to reach the running daemon.
#[derive(Debug, Clone)]
pub struct DaemonAt {
    /// Its `listen` address.
    pub listen: SocketAddr,
    /// Its `admin.token`, sent as a bearer token.
    pub token: Option<String>,
    /// Its `tls.cert-file`, when it serves TLS: the one certificate
    /// trusted.
    pub tls_cert: Option<PathBuf>,
}

impl DaemonAt {
    /// The daemon `config` describes.
    pub fn of(config: &Config) -> DaemonAt {
        DaemonAt {
            listen: config.listen,
            token: config.admin.token.clone(),
            tls_cert: config.tls.as_ref().map(|t| t.cert_file.clone()),
        }
    }
}

/// `method path` with a JSON `body` on `daemon`, bounded by `timeout`:
/// its answer read as `T` when the status is 2xx, its refusal otherwise.
pub async fn request<T: DeserializeOwned>(
    daemon: &DaemonAt,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
    timeout: Duration,
) -> Result<Result<T, Refused>, DaemonClientError> {
    let addr = loopback_for(daemon.listen);
    let (status, bytes) = call(daemon, method, path, body, timeout).await?;
    if !(200..300).contains(&status) {
        let answer: serde_json::Value =
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        let message = answer["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("the daemon refused {path} (is admin.token the daemon's?)"));
        return Ok(Err(Refused { status, message }));
    }
    serde_json::from_slice(&bytes)
        .map(Ok)
        .map_err(|e| DaemonClientError::Body {
            addr,
            path: path.to_string(),
            reason: e.to_string(),
        })
}

/// `method path` with a JSON `body` on the daemon at `listen`, bounded by
/// `timeout`: the status and the body bytes, whatever the status.
async fn call(
    daemon: &DaemonAt,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
    timeout: Duration,
) -> Result<(u16, bytes::Bytes), DaemonClientError> {
    let addr = loopback_for(daemon.listen);
    tokio::time::timeout(timeout, send(daemon, addr, method, path, body))
        .await
        .map_err(|_| DaemonClientError::Unreachable {
            addr,
            reason: format!("no answer within {timeout:?}"),
        })?
}

/// One request to `daemon` at `addr`: its status and body bytes.
async fn send(
    daemon: &DaemonAt,
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(u16, bytes::Bytes), DaemonClientError> {
    let unreachable = |reason: String| DaemonClientError::Unreachable { addr, reason };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut sender = match &daemon.tls_cert {
        None => handshake(stream).await,
        Some(cert) => {
            let connector = pinned_connector(cert).map_err(unreachable)?;
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let stream = connector
                .connect(name, stream)
                .await
                .map_err(|e| unreachable(format!("TLS: {e}")))?;
            handshake(stream).await
        }
    }
    .map_err(|e| unreachable(e.to_string()))?;
    let token = daemon.token.as_deref();
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(bytes)))
        .map_err(|e| unreachable(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    Ok((status, bytes))
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// An HTTP/1.1 connection over `io`, its driver spawned.
async fn handshake<T>(io: T) -> Result<Sender, hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// A TLS connector (rustls, ring) that trusts exactly the first
/// certificate of `cert_file`. Errors: the file cannot be read (named).
fn pinned_connector(cert_file: &std::path::Path) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    let cert = rustls::pki_types::CertificateDer::from_pem_file(cert_file)
        .map_err(|e| format!("{}: {e}", cert_file.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let verifier = Arc::new(Pinned {
        cert,
        algorithms: provider.signature_verification_algorithms,
    });
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Trusts one certificate, byte for byte; the handshake's signatures are
/// still checked against it (rustls' own verification of TLS 1.2 and 1.3
/// signatures).
#[derive(Debug)]
struct Pinned {
    cert: rustls::pki_types::CertificateDer<'static>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The address to reach a daemon listening on `listen`: loopback when it
/// listens on every address.
fn loopback_for(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}
