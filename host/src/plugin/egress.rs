//! Outbound HTTP for plugins: the allow-list and the pooled client.
//!
//! Owns: the decision whether a plugin's `wasi:http` request may leave the
//! host (scheme, host and effective port against the manifest's patterns;
//! userinfo refused; the `Host` header forced to the checked authority), the
//! address rule, and sending allowed requests over a keep-alive client per
//! plugin (wasmtime's default sender opens a connection per request; a
//! pooled one measured 1.2–1.5× faster here, docs/measurements.md). Timeouts a guest
//! sets are clamped to host ceilings.
//!
//! The address rule: a request whose host is, or resolves to, a loopback,
//! link-local, private (RFC 1918, ULA), unspecified or "this network"
//! address is refused unless a rule names that host or that address
//! exactly — `http://127.0.0.1:8080`, `https://internal.corp`; a wildcard
//! (`*`, `*.example.com`, `http://*:*`) never reaches such an address. The
//! rule is applied by the client's connector ([`GuardedConnector`]), which
//! resolves the name itself and connects only to the addresses it checked,
//! so a name that resolves differently between check and connect (DNS
//! rebinding) gains nothing. Each plugin has its own client, because the
//! connector carries that plugin's policy and a pooled connection must
//! never serve a plugin whose policy did not allow it.
//!
//! Must never: send a request that was not checked, connect to an address
//! that was not checked, or let a guest choose a timeout longer than the
//! ceiling.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::capture_connection;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::limits::HTTP_CONNECT_TIMEOUT;

mod watch;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};
pub use watch::{Metered, Stall, Timeouts};

/// Most request-body bytes drained from a guest whose request was refused
/// (the guest's body write must finish before it can see the refusal).
const DRAIN_LIMIT: usize = 8 << 20;

/// One `scheme://host[:port]` allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    scheme: String,
    /// Lower-case host; `*` any host; `*.example.com` its subdomains.
    host: String,
    /// `None` means any port.
    port: Option<u16>,
}

impl AllowRule {
    /// Parse a pattern. Without a port, the scheme's default port (80/443).
    pub fn parse(pattern: &str) -> Result<AllowRule, String> {
        let (scheme, rest) = pattern
            .split_once("://")
            .ok_or_else(|| format!("{pattern:?}: expected scheme://host[:port]"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!("{pattern:?}: scheme must be http or https"));
        }
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('@') || rest.is_empty() {
            return Err(format!(
                "{pattern:?}: expected scheme://host[:port], no path or userinfo"
            ));
        }
        let (host, port) = if let Some(stripped) = rest.strip_prefix('[') {
            let (h, after) = stripped
                .split_once(']')
                .ok_or_else(|| format!("{pattern:?}: unclosed ["))?;
            (format!("[{h}]"), after.strip_prefix(':'))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        let port = match port {
            None => Some(default_port(&scheme)),
            Some("*") => None,
            Some(p) => Some(
                p.parse()
                    .map_err(|_| format!("{pattern:?}: bad port {p:?}"))?,
            ),
        };
        Ok(AllowRule {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// Whether this rule names `host` itself (no wildcard host) for this
    /// scheme and port. Only such a rule reaches a loopback or private
    /// address.
    fn names(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.scheme == scheme
            && self.port.is_none_or(|p| p == port)
            && self.host != "*"
            && !self.host.starts_with("*.")
            && self.host == host
    }

    /// Whether this rule names address `ip` for this scheme and port.
    fn names_address(&self, scheme: &str, ip: IpAddr, port: u16) -> bool {
        self.scheme == scheme
            && self.port.is_none_or(|p| p == port)
            && parse_ip(&self.host) == Some(ip)
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        if self.scheme != scheme || self.port.is_some_and(|p| p != port) {
            return false;
        }
        if self.host == "*" || self.host == host {
            return true;
        }
        match self.host.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => false,
        }
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" {
        443
    } else {
        80
    }
}

/// `127.0.0.1` or `[::1]` as an address; `None` for a name.
fn parse_ip(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .parse()
        .ok()
}

/// What kind of internal address `ip` is, or `None` for a public one.
/// IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) count as their IPv4.
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_unspecified() || a == 0 {
                Some("unspecified")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if v4.is_private() {
                Some("private")
            } else if a == 100 && (64..128).contains(&b) {
                // RFC 6598 shared address space: internal to a carrier or cloud.
                Some("private")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal_kind(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private (unique local)")
            } else {
                None
            }
        }
    }
}

/// A plugin's outbound HTTP policy.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    rules: Vec<AllowRule>,
}

impl EgressPolicy {
    /// Build from the manifest's patterns. Errors name the bad pattern.
    pub fn new(patterns: &[String]) -> Result<EgressPolicy, String> {
        Ok(EgressPolicy {
            rules: patterns
                .iter()
                .map(|p| AllowRule::parse(p))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `uri` may be called; `Err` says why not.
    pub fn check(&self, uri: &http::Uri) -> Result<(), String> {
        let scheme = uri.scheme_str().unwrap_or("").to_ascii_lowercase();
        let authority = uri.authority().ok_or("request has no host")?;
        if authority.as_str().contains('@') {
            return Err("userinfo in the request URL is not allowed".into());
        }
        let host = authority.host().to_ascii_lowercase();
        let port = authority
            .port_u16()
            .unwrap_or_else(|| default_port(&scheme));
        if !self.rules.iter().any(|r| r.allows(&scheme, &host, port)) {
            return Err(format!(
                "{scheme}://{host}:{port} is not in the plugin's allow-list"
            ));
        }
        if let Some(ip) = parse_ip(&host) {
            self.check_address(&scheme, &host, SocketAddr::new(ip, port))?;
        }
        Ok(())
    }

    /// Whether `addr`, which `host` is or resolved to, may be connected to
    /// for a `scheme` request: a public address always (the name was
    /// checked by [`EgressPolicy::check`]); an internal one only when a rule
    /// names the host or the address exactly (module note).
    pub fn check_address(&self, scheme: &str, host: &str, addr: SocketAddr) -> Result<(), String> {
        let Some(kind) = internal_kind(addr.ip()) else {
            return Ok(());
        };
        let port = addr.port();
        if self
            .rules
            .iter()
            .any(|r| r.names(scheme, host, port) || r.names_address(scheme, addr.ip(), port))
        {
            return Ok(());
        }
        let via = if parse_ip(host).is_some() {
            String::new()
        } else {
            format!("{host} resolves to ")
        };
        Err(format!(
            "{via}{}, a {kind} address; only an allow-list entry naming it exactly \
             (e.g. \"{scheme}://{host}:{port}\") reaches it, a wildcard does not",
            addr.ip()
        ))
    }
}

/// An address refused by the address rule; found again in the client's
/// error to tell the guest `HTTP-request-denied`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AddressRefused(pub String);

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
            let host = uri
                .host()
                .ok_or("request has no host")?
                .to_ascii_lowercase();
            let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
            let addrs: Vec<SocketAddr> = match parse_ip(&host) {
                Some(ip) => vec![SocketAddr::new(ip, port)],
                None => tokio::net::lookup_host((host.as_str(), port))
                    .await?
                    .collect(),
            };
            let mut refused = None;
            let mut last_error: Option<std::io::Error> = None;
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
                    Ok(Err(e)) => last_error = Some(e),
                    Err(_) => {
                        last_error = Some(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "connect timed out",
                        ))
                    }
                }
            }
            match (last_error, refused) {
                (Some(e), _) => Err(e.into()),
                (None, Some(reason)) => Err(AddressRefused(reason).into()),
                (None, None) => Err(format!("dns error: {host} has no address").into()),
            }
        })
    }
}

/// A plugin's outbound client.
pub type HttpClient = Client<hyper_rustls::HttpsConnector<GuardedConnector>, WasiBody>;

/// Build a plugin's pooled client (HTTP/1.1, keep-alive, TLS through rustls
/// with the `ring` provider and the webpki roots), connecting only where
/// `policy` allows.
pub fn http_client(policy: Arc<EgressPolicy>) -> HttpClient {
    static TLS: OnceLock<rustls::ClientConfig> = OnceLock::new();
    let tls = TLS
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore {
                    roots: webpki_roots_list(),
                })
                .with_no_client_auth()
        })
        .clone();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(GuardedConnector { policy });
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(64)
        .build(https)
}

fn webpki_roots_list() -> Vec<rustls::pki_types::TrustAnchor<'static>> {
    webpki_roots::TLS_SERVER_ROOTS.to_vec()
}

/// The `wasi:http` hooks of one plugin instance.
pub struct EgressHooks {
    pub plugin: Arc<str>,
    pub policy: Arc<EgressPolicy>,
    pub client: HttpClient,
    /// Requests this batch may still send (manifest `limits.max-requests`).
    pub requests_left: u32,
    /// Most bytes of one response body the guest may read (manifest
    /// `limits.max-response-bytes`).
    pub max_response_bytes: u64,
    /// The ceilings of every request's timeouts (manifest
    /// `limits.first-byte-timeout`, `limits.between-bytes-timeout`) and the
    /// instant every response must be complete by (the batch deadline less
    /// [`crate::limits::DEADLINE_MARGIN`]).
    pub timeouts: Timeouts,
}

type SendResult = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
)>;

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn std::future::Future<Output = SendResult> + Send> {
        let plugin = self.plugin.clone();
        let policy = self.policy.clone();
        let client = self.client.clone();
        let max_body = self.max_response_bytes;
        let ceilings = self.timeouts;
        let over_budget = self.requests_left == 0;
        self.requests_left = self.requests_left.saturating_sub(1);
        Box::new(async move {
            let refusal = if over_budget {
                Err("the batch used up its limits.max-requests".to_string())
            } else {
                policy.check(request.uri())
            };
            if let Err(reason) = refusal {
                tracing::warn!(plugin = %plugin, uri = %request.uri(), "outbound request refused: {reason}");
                // Let the guest finish writing its body so it sees the refusal
                // on the response, not as an opaque write error.
                let body = http_body_util::Limited::new(request.into_body(), DRAIN_LIMIT);
                let _ = tokio::time::timeout(Duration::from_secs(5), body.collect()).await;
                return Err(HttpError::HttpRequestDenied);
            }
            let authority = request
                .uri()
                .authority()
                .map(|a| a.as_str().to_string())
                .unwrap_or_default();
            let host = http::HeaderValue::from_str(&authority)
                .map_err(|_| HttpError::HttpRequestUriInvalid)?;
            request.headers_mut().insert(http::header::HOST, host);
            let uri = request.uri().clone();
            let timeouts = request_timeouts(ceilings, options);
            let captured = capture_connection(&mut request);
            let started = Instant::now();
            let response = match watch::head(client.request(request), &captured, started, &timeouts)
                .await
            {
                Err(stall) => {
                    tracing::warn!(plugin = %plugin, uri = %uri, "outbound request given up: {stall}");
                    return Err(stall.code());
                }
                Ok(Err(e)) => {
                    if let Some(refused) = address_refused(&e) {
                        tracing::warn!(plugin = %plugin, uri = %uri, "outbound request refused: {refused}");
                        return Err(HttpError::HttpRequestDenied);
                    }
                    return Err(classify(&e));
                }
                Ok(Ok(r)) => r,
            };
            let head_bytes = watch::head_bytes(&captured, started);
            let response = response.map(|body| {
                let body =
                    http_body_util::Limited::new(body.map_err(HttpError::from), max_body as usize)
                        .map_err(move |e| match e.downcast::<HttpError>() {
                            Ok(e) => *e,
                            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                                HttpError::HttpResponseBodySize(Some(max_body))
                            }
                            Err(e) => HttpError::InternalError(Some(e.to_string())),
                        })
                        .boxed_unsync();
                watch::Watched::new(body, timeouts, started, head_bytes, plugin, uri).boxed_unsync()
            });
            let io: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, io))
        })
    }
}

/// The timeouts of one request: what the guest asked for (`None` or zero:
/// nothing asked) but never past the plugin's ceilings.
fn request_timeouts(ceilings: Timeouts, options: Option<RequestOptions>) -> Timeouts {
    let ask = |asked: Option<Duration>, ceiling: Duration| {
        asked
            .filter(|d| !d.is_zero())
            .map_or(ceiling, |d| d.min(ceiling))
    };
    Timeouts {
        first_byte: ask(
            options.and_then(|o| o.first_byte_timeout),
            ceilings.first_byte,
        ),
        between_bytes: ask(
            options.and_then(|o| o.between_bytes_timeout),
            ceilings.between_bytes,
        ),
        until: ceilings.until,
    }
}

/// The address rule's refusal inside a client error, if that is the cause.
fn address_refused(e: &hyper_util::client::legacy::Error) -> Option<&AddressRefused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        source = s.source();
    }
    None
}

fn classify(e: &hyper_util::client::legacy::Error) -> HttpError {
    let text = format!("{e:?}");
    if e.is_connect() {
        if text.contains("dns error") || text.contains("failed to lookup") {
            HttpError::DnsError {
                rcode: Some("lookup failed".into()),
                info_code: None,
            }
        } else if text.contains("Refused") {
            HttpError::ConnectionRefused
        } else if text.contains("timed out") || text.contains("TimedOut") {
            HttpError::ConnectionTimeout
        } else if text.to_ascii_lowercase().contains("certificate") || text.contains("tls") {
            HttpError::TlsProtocolError
        } else {
            HttpError::DestinationUnavailable
        }
    } else {
        HttpError::HttpProtocolError
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(patterns: &[&str], uri: &str) -> bool {
        let p =
            EgressPolicy::new(&patterns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.check(&uri.parse().unwrap()).is_ok()
    }

    #[test]
    fn scheme_host_and_port_are_all_checked() {
        assert!(check(&["http://127.0.0.1:9090"], "http://127.0.0.1:9090/x"));
        assert!(!check(
            &["http://127.0.0.1:9090"],
            "http://127.0.0.1:9091/x"
        ));
        assert!(!check(
            &["http://127.0.0.1:9090"],
            "https://127.0.0.1:9090/x"
        ));
        assert!(!check(
            &["https://example.com"],
            "https://example.com:8443/"
        ));
        assert!(check(&["https://example.com"], "https://example.com/"));
        assert!(check(&["https://*.example.com"], "https://a.example.com/"));
        assert!(!check(&["https://*.example.com"], "https://example.com/"));
        assert!(!check(
            &["https://*.example.com"],
            "https://evilexample.com/"
        ));
        assert!(check(&["http://localhost:*"], "http://localhost:1234/"));
        assert!(!check(
            &["http://localhost:*"],
            "http://user:pw@localhost:1234/"
        ));
        assert!(check(&["http://[::1]:80"], "http://[::1]/"));
    }

    #[test]
    fn internal_addresses_need_an_entry_naming_them_exactly() {
        // Named exactly: allowed.
        assert!(check(&["http://127.0.0.1:9090"], "http://127.0.0.1:9090/x"));
        assert!(check(&["http://127.0.0.1:*"], "http://127.0.0.1:9090/x"));
        assert!(check(&["https://10.1.2.3"], "https://10.1.2.3/"));
        // A wildcard does not reach loopback, private, link-local,
        // unspecified or unique-local addresses ...
        for uri in [
            "http://127.0.0.1:9090/",
            "http://127.9.9.9/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://0.0.0.0:80/",
            "http://100.64.0.1/",
            "http://[::1]/",
            "http://[::]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://[::ffff:127.0.0.1]/",
        ] {
            assert!(
                !check(&["http://*:*"], uri),
                "{uri} must need an explicit entry"
            );
        }
        // ... but public ones are fine.
        assert!(check(&["http://*:*"], "http://93.184.216.34/"));
        assert!(check(&["http://*:*"], "http://[2001:db8::1]/"));
        // The refusal says what the address is and what to write.
        let p = EgressPolicy::new(&["http://*:*".to_string()]).unwrap();
        let e = p
            .check(&"http://127.0.0.1:9090/".parse().unwrap())
            .unwrap_err();
        assert!(
            e.contains("loopback") && e.contains("http://127.0.0.1:9090"),
            "{e}"
        );
    }

    #[test]
    fn a_name_resolving_to_an_internal_address_needs_the_name_or_the_address() {
        let addr: SocketAddr = "10.0.0.5:443".parse().unwrap();
        let policy = |p: &[&str]| {
            EgressPolicy::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
        };
        assert!(policy(&["https://internal.corp"])
            .check_address("https", "internal.corp", addr)
            .is_ok());
        assert!(policy(&["https://10.0.0.5"])
            .check_address("https", "internal.corp", addr)
            .is_ok());
        let e = policy(&["https://*.corp"])
            .check_address("https", "internal.corp", addr)
            .unwrap_err();
        assert!(
            e.contains("internal.corp resolves to 10.0.0.5, a private address"),
            "{e}"
        );
        assert!(policy(&["https://*"])
            .check_address("https", "internal.corp", addr)
            .is_err());
        // The entry must match the scheme and port too.
        assert!(policy(&["http://internal.corp"])
            .check_address("https", "internal.corp", addr)
            .is_err());
        assert!(policy(&["https://internal.corp:8443"])
            .check_address("https", "internal.corp", addr)
            .is_err());
        // A public address needs nothing more than the name's own check.
        let public: SocketAddr = "93.184.216.34:443".parse().unwrap();
        assert!(policy(&["https://*"])
            .check_address("https", "example.com", public)
            .is_ok());
    }

    /// A loopback listener that records the `Host` header of each request
    /// and answers 200.
    async fn host_recorder() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&buf).to_string();
                    for line in text.lines() {
                        if let Some((k, v)) = line.split_once(':') {
                            if k.eq_ignore_ascii_case("host") {
                                record.lock().unwrap().push(v.trim().to_string());
                            }
                        }
                    }
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        (addr, seen)
    }

    fn hooks(patterns: &[&str]) -> EgressHooks {
        let policy = Arc::new(
            EgressPolicy::new(&patterns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap(),
        );
        EgressHooks {
            plugin: Arc::from("test"),
            client: http_client(policy.clone()),
            policy,
            requests_left: 1000,
            max_response_bytes: 1 << 20,
            timeouts: Timeouts {
                first_byte: Duration::from_secs(30),
                between_bytes: Duration::from_secs(10),
                until: Instant::now() + Duration::from_secs(60),
            },
        }
    }

    #[tokio::test]
    async fn requests_past_the_batch_budget_are_refused_without_leaving_the_host() {
        let (addr, seen) = host_recorder().await;
        let mut hooks = hooks(&[&format!("http://{addr}")]);
        hooks.requests_left = 2;
        let uri = format!("http://{addr}/x");
        assert_eq!(send(&mut hooks, &uri, None).await.unwrap(), 200);
        assert_eq!(send(&mut hooks, &uri, None).await.unwrap(), 200);
        assert!(matches!(
            send(&mut hooks, &uri, None).await,
            Err(HttpError::HttpRequestDenied)
        ));
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "the third request left the host"
        );
    }

    #[tokio::test]
    async fn a_response_body_past_the_cap_fails_the_read() {
        // A server answering every request with a 64 KiB body.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                    let body = vec![b'x'; 64 << 10];
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                });
            }
        });
        let read = |max: u64| {
            let mut hooks = hooks(&[&format!("http://{addr}")]);
            hooks.max_response_bytes = max;
            let uri = format!("http://{addr}/big");
            async move {
                let body: WasiBody = http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync();
                let request = http::Request::builder().uri(uri).body(body).unwrap();
                let fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
                    Box::new(async { Ok(()) });
                let (response, _) = Box::into_pin(hooks.send_request(request, None, fut))
                    .await
                    .unwrap();
                response
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes().len())
            }
        };
        assert_eq!(read(1 << 20).await.unwrap(), 64 << 10);
        assert!(matches!(
            read(1000).await,
            Err(HttpError::HttpResponseBodySize(Some(1000)))
        ));
    }

    async fn send(
        hooks: &mut EgressHooks,
        uri: &str,
        host_header: Option<&str>,
    ) -> Result<u16, HttpError> {
        let body: WasiBody = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        let mut request = http::Request::builder().method("GET").uri(uri);
        if let Some(h) = host_header {
            request = request.header(http::header::HOST, h);
        }
        let request = request.body(body).unwrap();
        let fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
            Box::new(async { Ok(()) });
        let sent = Box::into_pin(hooks.send_request(request, None, fut)).await;
        sent.map(|(response, _)| response.status().as_u16())
    }

    #[tokio::test]
    async fn a_guest_set_host_header_cannot_redirect_the_request() {
        let (addr, seen) = host_recorder().await;
        let mut hooks = hooks(&[&format!("http://{addr}")]);
        let status = send(
            &mut hooks,
            &format!("http://{addr}/x"),
            Some("evil.example"),
        )
        .await
        .unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![addr.to_string()],
            "the Host header is the checked authority"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_connect_unless_named() {
        let (addr, seen) = host_recorder().await;
        let port = addr.port();
        let uri = format!("http://localhost:{port}/x");
        // `localhost` passes the wildcard name check, but the address it
        // resolves to is loopback: refused by the connector.
        let mut wildcard = hooks(&["http://*:*"]);
        assert!(matches!(
            send(&mut wildcard, &uri, None).await,
            Err(HttpError::HttpRequestDenied)
        ));
        assert!(
            seen.lock().unwrap().is_empty(),
            "nothing reached the listener"
        );
        // Named exactly: connected.
        let mut named = hooks(&[&format!("http://localhost:{port}")]);
        assert_eq!(send(&mut named, &uri, None).await.unwrap(), 200);
        // The address named exactly: connected too.
        let mut by_address = hooks(&[
            &format!("http://*:{port}"),
            &format!("http://127.0.0.1:{port}"),
        ]);
        let got = send(&mut by_address, &uri, None).await;
        // `localhost` may resolve to ::1 first; 127.0.0.1 is tried after it.
        assert_eq!(got.unwrap(), 200);
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
