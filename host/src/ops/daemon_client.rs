//! What the CLI asks a running daemon: state that lives only in the
//! daemon's process, not in the database (which sinks are loaded, removed
//! or quarantined, the status of the configured sources), and the actions
//! that need the daemon's loaded plugins or routes (destinations,
//! backfill: [`call`]).
//!
//! Owns: one request to the daemon at the configured `listen`
//! address (loopback when it listens on every address), with the admin
//! token when one is configured, bounded by [`CLIENT_TIMEOUT`].
//!
//! Must never: change anything in the daemon except through [`call`], or
//! make a read-only CLI command fail because no daemon answers (the caller
//! says so and goes on).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http_body_util::BodyExt;

pub use crate::limits::CLIENT_TIMEOUT;

/// Why the daemon's state could not be read.
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
    /// The daemon refused.
    #[error("the daemon at {addr} answered {status} to GET {path} (is admin.token the daemon's?)")]
    Status {
        /// Where it was asked.
        addr: SocketAddr,
        /// The path asked for.
        path: &'static str,
        /// The HTTP status it answered.
        status: u16,
    },
    /// The daemon's answer was not the JSON expected.
    #[error("the daemon at {addr} answered GET {path} with unreadable JSON: {reason}")]
    Body {
        /// Where it was asked.
        addr: SocketAddr,
        /// The path asked for.
        path: &'static str,
        /// Why the JSON could not be read.
        reason: String,
    },
}

/// Every sink as the daemon listening on `listen` reports it
/// (`/v1/admin/sinks`, field `sinks`: one
/// [`crate::ops::actions::SinkView`] each, as JSON).
pub async fn sinks(
    listen: SocketAddr,
    token: Option<&str>,
) -> Result<Vec<serde_json::Value>, DaemonClientError> {
    let (addr, body) = get(listen, SINKS_PATH, token).await?;
    match body["sinks"].as_array() {
        Some(sinks) => Ok(sinks.clone()),
        None => Err(DaemonClientError::Body {
            addr,
            path: SINKS_PATH,
            reason: "no `sinks` array".into(),
        }),
    }
}

/// Every configured source with its status, as the daemon listening on
/// `listen` reports it (`/v1/admin/sources`, field `sources`: `name`,
/// `kind`, `ok`, `last_error`, `last_cycle_age_ms`, `checks`).
pub async fn sources(
    listen: SocketAddr,
    token: Option<&str>,
) -> Result<Vec<serde_json::Value>, DaemonClientError> {
    let (addr, body) = get(listen, SOURCES_PATH, token).await?;
    match body["sources"].as_array() {
        Some(sources) => Ok(sources.clone()),
        None => Err(DaemonClientError::Body {
            addr,
            path: SOURCES_PATH,
            reason: "no `sources` array".into(),
        }),
    }
}

/// `method path` with a JSON `body` on the daemon at `listen`, bounded by
/// [`CLIENT_TIMEOUT`] (a destination create that backfills may take
/// longer: `timeout` overrides it). Returns the status and the JSON body
/// (`null` when there is none), whatever the status.
pub async fn call(
    listen: SocketAddr,
    token: Option<&str>,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
    timeout: Option<Duration>,
) -> Result<(u16, serde_json::Value), DaemonClientError> {
    let addr = loopback_for(listen);
    let limit = timeout.unwrap_or(CLIENT_TIMEOUT);
    let (status, bytes) = tokio::time::timeout(limit, send(addr, method, path, token, body))
        .await
        .map_err(|_| DaemonClientError::Unreachable {
            addr,
            reason: format!("no answer within {limit:?}"),
        })??;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// One request to `addr`: its status and body bytes.
async fn send(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> Result<(u16, bytes::Bytes), DaemonClientError> {
    let unreachable = |reason: String| DaemonClientError::Unreachable { addr, reason };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(connection);
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

const SINKS_PATH: &str = "/v1/admin/sinks";
const SOURCES_PATH: &str = "/v1/admin/sources";

/// `GET path` on the daemon at `listen` (loopback when it listens on every
/// address), bounded by [`CLIENT_TIMEOUT`]: the address asked and the body.
async fn get(
    listen: SocketAddr,
    path: &'static str,
    token: Option<&str>,
) -> Result<(SocketAddr, serde_json::Value), DaemonClientError> {
    let addr = loopback_for(listen);
    let (status, bytes) = tokio::time::timeout(
        CLIENT_TIMEOUT,
        send(addr, http::Method::GET, path, token, None),
    )
    .await
    .map_err(|_| DaemonClientError::Unreachable {
        addr,
        reason: format!("no answer within {CLIENT_TIMEOUT:?}"),
    })??;
    if status != 200 {
        return Err(DaemonClientError::Status { addr, path, status });
    }
    let body = serde_json::from_slice(&bytes).map_err(|e| DaemonClientError::Body {
        addr,
        path,
        reason: e.to_string(),
    })?;
    Ok((addr, body))
}
