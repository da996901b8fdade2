//! The connector of a plugin's pooled HTTP client: it resolves a request's
//! host itself, checks every address with the plugin's policy, and
//! connects only to an address it checked (see [`super`] on DNS
//! rebinding); TLS is layered on top by `hyper-rustls`.
//!
//! Owns: the client ([`http_client`]) and the typed reason a connection
//! was not made ([`ConnectError`]). Must never: connect to an address the
//! policy did not allow, or share a client between plugins.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use wasmtime_wasi_http::WasiBody;

use super::policy::{default_port, parse_ip, EgressPolicy};
use super::watch::Metered;
use crate::limits::{HTTP_CONNECT_TIMEOUT, HTTP_POOL_IDLE_TIMEOUT};

/// Why the connector opened no connection. Found again in the client's
/// error by [`super::hooks`] to give the guest its `wasi:http` error code.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URI has no host (the policy refuses such a request first).
    #[error("request has no host")]
    NoHost,
    /// The host name did not resolve.
    #[error("dns error: {host}: {source}")]
    Lookup {
        /// The host name.
        host: String,
        #[source]
        /// Why it did not resolve.
        source: std::io::Error,
    },
    /// The host name resolved to no address.
    #[error("dns error: {host} has no address")]
    NoAddress {
        /// The host name.
        host: String,
    },
    /// Every address was refused by the address rule (the reason of the
    /// first), so nothing was tried.
    #[error("{0}")]
    AddressRefused(String),
    /// The last allowed address tried failed to connect.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The address tried last.
        addr: SocketAddr,
        #[source]
        /// Why it failed.
        source: std::io::Error,
    },
    /// The last allowed address tried did not answer within
    /// [`crate::limits::HTTP_CONNECT_TIMEOUT`].
    #[error("connect to {addr} timed out")]
    Timeout {
        /// The address tried last.
        addr: SocketAddr,
    },
}

/// The connector of a plugin's client: resolves the request's host,
/// checks every address with [`EgressPolicy::check_address`], and connects
/// to the first allowed one that answers. TLS is layered on top by
/// `hyper-rustls` with the original host name.
#[derive(Clone)]
pub struct GuardedConnector {
    policy: Arc<EgressPolicy>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for GuardedConnector {
    type Response = TokioIo<Metered>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move {
            let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
            let host = uri.host().ok_or(ConnectError::NoHost)?.to_ascii_lowercase();
            let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
            let addrs: Vec<SocketAddr> = match parse_ip(&host) {
                Some(ip) => vec![SocketAddr::new(ip, port)],
                None => tokio::net::lookup_host((host.as_str(), port))
                    .await
                    .map_err(|source| ConnectError::Lookup {
                        host: host.clone(),
                        source,
                    })?
                    .collect(),
            };
            let mut refused = None;
            let mut last_error: Option<ConnectError> = None;
            for addr in addrs {
                if let Err(reason) = policy.check_address(&scheme, &host, addr) {
                    refused.get_or_insert(reason);
                    continue;
                }
                match tokio::time::timeout(HTTP_CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(TokioIo::new(Metered::new(stream)));
                    }
                    Ok(Err(source)) => last_error = Some(ConnectError::Connect { addr, source }),
                    Err(_) => last_error = Some(ConnectError::Timeout { addr }),
                }
            }
            let error = match (last_error, refused) {
                (Some(e), _) => e,
                (None, Some(reason)) => ConnectError::AddressRefused(reason),
                (None, None) => ConnectError::NoAddress { host },
            };
            Err(error.into())
        })
    }
}

/// A plugin's outbound client.
pub type HttpClient = Client<hyper_rustls::HttpsConnector<GuardedConnector>, WasiBody>;

/// Build a plugin's pooled client, connecting only where `policy` allows:
/// keep-alive HTTP/1.1, or HTTP/2 where a TLS receiver offers it by ALPN
/// (`h2` first, then `http/1.1`; one connection then carries many
/// requests at once); TLS through rustls as `tls` says (the `ring`
/// provider; the webpki roots and `egress.ca-file`, [`super::trust`]).
/// Plain `http://` is HTTP/1.1 (no prior-knowledge HTTP/2).
pub fn http_client(policy: Arc<EgressPolicy>, tls: &rustls::ClientConfig) -> HttpClient {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(GuardedConnector { policy });
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(HTTP_POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(64)
        .build(https)
}
