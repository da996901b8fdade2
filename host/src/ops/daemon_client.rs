//! What the CLI asks a running daemon: state that lives only in the
//! daemon's process, not in the database — today, which sinks are
//! quarantined.
//!
//! Owns: one `GET /v1/admin/sinks` to the daemon at the configured `listen`
//! address (loopback when it listens on every address), with the admin
//! token when one is configured, bounded by [`CLIENT_TIMEOUT`].
//!
//! Must never: change anything in the daemon, or make a CLI command fail
//! because no daemon answers (the caller says so and goes on).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};

/// Longest the CLI waits for the daemon.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);

/// Why the daemon's state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DaemonClientError {
    #[error("no daemon answered at {addr}: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("the daemon at {addr} answered {status} to GET /v1/admin/sinks (is admin.token the daemon's?)")]
    Status { addr: SocketAddr, status: u16 },
    #[error("the daemon at {addr} answered GET /v1/admin/sinks with unreadable JSON: {reason}")]
    Body { addr: SocketAddr, reason: String },
}

/// The quarantine of every quarantined sink, by sink name, as the daemon
/// listening on `listen` reports it (`/v1/admin/sinks`, field
/// `quarantine`).
pub async fn quarantines(
    listen: SocketAddr,
    token: Option<&str>,
) -> Result<BTreeMap<String, serde_json::Value>, DaemonClientError> {
    let addr = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    };
    let body = tokio::time::timeout(CLIENT_TIMEOUT, get_sinks(addr, token))
        .await
        .map_err(|_| DaemonClientError::Unreachable {
            addr,
            reason: format!("no answer within {CLIENT_TIMEOUT:?}"),
        })??;
    let sinks = body["sinks"]
        .as_array()
        .ok_or_else(|| DaemonClientError::Body {
            addr,
            reason: "no `sinks` array".into(),
        })?;
    Ok(sinks
        .iter()
        .filter(|s| !s["quarantine"].is_null())
        .filter_map(|s| Some((s["sink"].as_str()?.to_string(), s["quarantine"].clone())))
        .collect())
}

async fn get_sinks(
    addr: SocketAddr,
    token: Option<&str>,
) -> Result<serde_json::Value, DaemonClientError> {
    let unreachable = |reason: String| DaemonClientError::Unreachable { addr, reason };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(connection);
    let mut request =
        http::Request::get("/v1/admin/sinks").header(http::header::HOST, addr.to_string());
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| unreachable(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(DaemonClientError::Status { addr, status });
    }
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| DaemonClientError::Body {
        addr,
        reason: e.to_string(),
    })
}
