//! The `wasi:http` hooks of one plugin instance: every request a guest
//! sends passes [`EgressHooks::send_request`], which hands it to
//! [`EgressHooks::send`]: the batch's request budget and the policy, the
//! `Host` header forced to the checked authority, the plugin's pooled
//! client under the response timeouts ([`super::watch`]), the response
//! body capped. The `http-batch` interface ([`super::batch`]) sends
//! through the same [`EgressHooks::send`].
//!
//! Must never: send a request that was not checked, let a guest choose a
//! timeout longer than the plugin's ceilings, or tell a guest more about a
//! refusal than `HTTP-request-denied` (the reason goes to the host's log).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::capture_connection;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::connector::{ConnectError, HttpClient};
use super::policy::EgressPolicy;
use super::watch::{self, Timeouts};
use crate::limits::REFUSED_BODY_DRAIN_TIMEOUT;

/// Most request-body bytes drained from a guest whose request was refused
/// (the guest's body write must finish before it can see the refusal).
const DRAIN_LIMIT: usize = 8 << 20;

/// What one batch's requests came to against the manifest's grant: how
/// many the guest sent, and why each one the grant refused was refused (its
/// allow-list, or the address rule). A request over the batch's
/// `limits.max-requests` is not counted as denied: the next batch may send
/// it.
#[derive(Debug, Default)]
pub struct Denials {
    requests: AtomicU32,
    denied: Mutex<Vec<String>>,
}

impl Denials {
    fn sent(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Note a denial. `reason` names the origin (`scheme://host:port`),
    /// never the path or query, which may carry a token.
    fn deny(&self, reason: &str, policy: &EgressPolicy) {
        let mut denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        denied.push(format!("{reason} ({})", policy.grant()));
    }

    /// Why the manifest denied the batch's requests, when it denied every
    /// one it sent (at least one): the first refusal, naming the URL and
    /// the grant. `None` when no request was sent, none was denied, or
    /// some went out (a denial then cannot be told apart from the
    /// other answers).
    pub fn all_denied(&self) -> Option<String> {
        let denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        let requests = self.requests.load(Ordering::Relaxed) as usize;
        (requests > 0 && denied.len() == requests).then(|| denied[0].clone())
    }
}

/// The `wasi:http` hooks of one plugin instance.
pub struct EgressHooks {
    /// The plugin's name, for logs.
    pub plugin: Arc<str>,
    /// Where it may connect (manifest `capabilities.http`).
    pub policy: Arc<EgressPolicy>,
    /// The host's pooled HTTP client.
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
    /// This batch's requests denied by the manifest.
    pub denials: Arc<Denials>,
    /// The tracer: a CLIENT span per request that carries a `traceparent`.
    pub telemetry: crate::otel::Telemetry,
    /// The response headers `http-batch` answers carry (the guest's
    /// `keep-response-headers`; every one until it calls it).
    pub answer_headers: super::batch::AnswerHeaders,
    /// The `Host` header of the last authority sent to, made once: a
    /// sink's requests go to one authority, and a value made from text is
    /// an allocation each time (a clone of this one is a count).
    pub last_host: Option<(http::uri::Authority, http::HeaderValue)>,
}

/// The CLIENT span of `request` when it carries a `traceparent` (the
/// attempt's, as the plugin set it): started as its child, and the header
/// rewritten to name the new span, so the receiver's parent is the
/// request (W3C Trace Context §3.2). Ends when the send future is dropped.
fn client_span(
    telemetry: &crate::otel::Telemetry,
    plugin: &str,
    request: &mut http::Request<WasiBody>,
) -> Option<crate::otel::SpanHandle> {
    if !telemetry.is_on() {
        return None;
    }
    let parent = request
        .headers()
        .get(crate::otel::context::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| crate::otel::TraceContext::from_parts(Some(v), None))?;
    let span = telemetry.http_client(
        plugin,
        request.method().as_str(),
        &request.uri().to_string(),
        &parent,
    )?;
    if let Ok(value) = http::HeaderValue::from_str(&span.context().traceparent) {
        request
            .headers_mut()
            .insert(crate::otel::context::TRACEPARENT, value);
    }
    Some(span)
}

type SendResult = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
)>;

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn std::future::Future<Output = SendResult> + Send> {
        let sent = self.send(request, options);
        Box::new(async move {
            let response = sent.await?;
            let io: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, io))
        })
    }
}

impl EgressHooks {
    /// Check `request` and send it: the batch's request budget, the
    /// policy, the `Host` header forced to the checked authority, the
    /// pooled client under the response timeouts (`options`, clamped to
    /// the ceilings). The future answers the response head, its body
    /// capped at `limits.max-response-bytes` and watched between bytes
    /// and against the deadline; or the `wasi:http` error code. What the
    /// `wasi:http` hook and the `http-batch` interface
    /// ([`super::batch`]) both send through; the budget is counted when
    /// this is called, not when the future runs.
    pub fn send(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> impl std::future::Future<Output = Result<http::Response<WasiBody>, HttpError>> + Send + 'static
    {
        let plugin = self.plugin.clone();
        let policy = self.policy.clone();
        let client = self.client.clone();
        let max_body = self.max_response_bytes;
        let ceilings = self.timeouts;
        let over_budget = self.requests_left == 0;
        self.requests_left = self.requests_left.saturating_sub(1);
        let denials = self.denials.clone();
        denials.sent();
        let span = client_span(&self.telemetry, &plugin, &mut request);
        let host = self.host_header(request.uri());
        async move {
            let mut span = span;
            let mut failed = |code: &HttpError, message: &str| {
                if let Some(span) = span.as_mut() {
                    span.fail(wit_name(code), message);
                }
            };
            let refusal = if over_budget {
                Err("the batch used up its limits.max-requests".to_string())
            } else {
                policy
                    .check(request.uri())
                    .inspect_err(|reason| denials.deny(reason, &policy))
            };
            if let Err(reason) = refusal {
                tracing::warn!(plugin = %plugin, uri = %request.uri(), code = wit_name(&HttpError::HttpRequestDenied), "outbound request refused: {reason}");
                failed(&HttpError::HttpRequestDenied, &reason);
                // Let the guest finish writing its body so it sees the refusal
                // on the response, not as an opaque write error.
                let body = http_body_util::Limited::new(request.into_body(), DRAIN_LIMIT);
                let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIMEOUT, body.collect()).await;
                return Err(HttpError::HttpRequestDenied);
            }
            let host = host.ok_or(HttpError::HttpRequestUriInvalid)?;
            request.headers_mut().insert(http::header::HOST, host);
            let uri = request.uri().clone();
            let timeouts = request_timeouts(ceilings, options);
            let captured = capture_connection(&mut request);
            let started = Instant::now();
            let response = match watch::head(client.request(request), &captured, started, &timeouts)
                .await
            {
                Err(stall) => {
                    tracing::warn!(plugin = %plugin, uri = %uri, code = wit_name(&stall.code()), "outbound request given up: {stall}");
                    failed(&stall.code(), &stall.to_string());
                    return Err(stall.code());
                }
                Ok(Err(e)) => {
                    if let Some(refused @ ConnectError::AddressRefused(_)) = connect_error(&e) {
                        denials.deny(&refused.to_string(), &policy);
                        tracing::warn!(plugin = %plugin, uri = %uri, code = wit_name(&HttpError::HttpRequestDenied), "outbound request refused: {refused}");
                        failed(&HttpError::HttpRequestDenied, &refused.to_string());
                        return Err(HttpError::HttpRequestDenied);
                    }
                    let chain: Vec<String> = std::iter::once(e.to_string())
                        .chain(causes(&e).map(|c| c.to_string()))
                        .collect();
                    let code = classify(&e);
                    tracing::debug!(plugin = %plugin, uri = %uri, code = wit_name(&code), "outbound request failed: {}", chain.join(": "));
                    failed(&code, &chain.join(": "));
                    return Err(code);
                }
                Ok(Ok(r)) => r,
            };
            // HTTP client semantic conventions: the status as an attribute;
            // 4xx and 5xx make the client span an error, `error.type` the
            // status code.
            if let Some(span) = span.as_mut() {
                let status = response.status().as_u16();
                span.set("http.response.status_code", i64::from(status));
                if status >= 400 {
                    span.fail(&status.to_string(), response.status().as_str());
                }
            }
            // One box a response: the cap and the watch inside it.
            let response = response.map(|body| {
                let body =
                    http_body_util::Limited::new(body.map_err(HttpError::from), max_body as usize)
                        .map_err(move |e| match e.downcast::<HttpError>() {
                            Ok(e) => *e,
                            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                                HttpError::HttpResponseBodySize(Some(max_body))
                            }
                            Err(e) => HttpError::InternalError(Some(e.to_string())),
                        });
                watch::Watched::new(body, timeouts, started, captured, plugin, uri).boxed_unsync()
            });
            Ok(response)
        }
    }

    /// The `Host` header naming `uri`'s authority (empty without one);
    /// `None` when the authority is not a valid header value.
    fn host_header(&mut self, uri: &http::Uri) -> Option<http::HeaderValue> {
        let Some(authority) = uri.authority() else {
            return Some(http::HeaderValue::from_static(""));
        };
        if let Some((last, value)) = &self.last_host {
            if last.as_str() == authority.as_str() {
                return Some(value.clone());
            }
        }
        let value = http::HeaderValue::from_str(authority.as_str()).ok()?;
        self.last_host = Some((authority.clone(), value.clone()));
        Some(value)
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

/// The connector's own error inside a client error, if that is the cause.
fn connect_error(e: &hyper_util::client::legacy::Error) -> Option<&ConnectError> {
    causes(e).find_map(|c| c.downcast_ref::<ConnectError>())
}

/// `e`'s chain of causes, outermost first, `e` itself excluded.
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(e.source(), |c| c.source())
}

/// The `wasi:http` error code of a client error that is not the address
/// rule's refusal: the connector's typed reason, a TLS failure (rustls'
/// error inside the I/O error of the handshake), or else the destination
/// being unavailable; an error after the connection was made is a protocol
/// error.
fn classify(e: &hyper_util::client::legacy::Error) -> HttpError {
    if !e.is_connect() {
        return HttpError::HttpProtocolError;
    }
    if let Some(connect) = connect_error(e) {
        return match connect {
            ConnectError::Lookup { .. } | ConnectError::NoAddress { .. } => HttpError::DnsError {
                rcode: Some("lookup failed".into()),
                info_code: None,
            },
            ConnectError::Connect { source, .. } => match source.kind() {
                std::io::ErrorKind::ConnectionRefused => HttpError::ConnectionRefused,
                std::io::ErrorKind::TimedOut => HttpError::ConnectionTimeout,
                _ => HttpError::DestinationUnavailable,
            },
            ConnectError::Timeout { .. } => HttpError::ConnectionTimeout,
            ConnectError::AddressRefused(_) => HttpError::HttpRequestDenied,
            ConnectError::NoHost => HttpError::HttpRequestUriInvalid,
        };
    }
    match tls_error(e) {
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) => {
            HttpError::TlsCertificateError
        }
        Some(_) => HttpError::TlsProtocolError,
        None => HttpError::DestinationUnavailable,
    }
}

/// rustls' error in `e`'s chain: a cause itself, or inside the I/O
/// errors that carry it (tokio-rustls reports a failed handshake as an
/// I/O error, which the connector wraps in another), at any depth.
fn tls_error(e: &hyper_util::client::legacy::Error) -> Option<&rustls::Error> {
    fn inside<'a>(c: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner: &(dyn std::error::Error + 'static) =
            c.downcast_ref::<std::io::Error>()?.get_ref()?;
        inside(inner)
    }
    causes(e).find_map(inside)
}

/// The case name of the `wasi:http/types.error-code` a guest is handed for
/// `code`, as the WIT spells it (`connection-refused`,
/// `HTTP-request-denied`): what the host's log names, matching
/// docs/plugins.md and what a guest built on the SDK reports. Variants
/// that are not a WIT case (the embedder's own `Hyper`, `Connect`, …) are
/// never returned by these hooks and read `internal-error`.
pub fn wit_name(code: &HttpError) -> &'static str {
    use HttpError as E;
    match code {
        E::DnsTimeout => "DNS-timeout",
        E::DnsError { .. } => "DNS-error",
        E::DestinationNotFound => "destination-not-found",
        E::DestinationUnavailable => "destination-unavailable",
        E::DestinationIpProhibited => "destination-IP-prohibited",
        E::DestinationIpUnroutable => "destination-IP-unroutable",
        E::ConnectionRefused => "connection-refused",
        E::ConnectionTerminated => "connection-terminated",
        E::ConnectionTimeout => "connection-timeout",
        E::ConnectionReadTimeout => "connection-read-timeout",
        E::ConnectionWriteTimeout => "connection-write-timeout",
        E::ConnectionLimitReached => "connection-limit-reached",
        E::TlsProtocolError => "TLS-protocol-error",
        E::TlsCertificateError => "TLS-certificate-error",
        E::TlsAlertReceived { .. } => "TLS-alert-received",
        E::HttpRequestDenied => "HTTP-request-denied",
        E::HttpRequestLengthRequired => "HTTP-request-length-required",
        E::HttpRequestBodySize(_) => "HTTP-request-body-size",
        E::HttpRequestMethodInvalid => "HTTP-request-method-invalid",
        E::HttpRequestUriInvalid => "HTTP-request-URI-invalid",
        E::HttpRequestUriTooLong => "HTTP-request-URI-too-long",
        E::HttpRequestHeaderSectionSize(_) => "HTTP-request-header-section-size",
        E::HttpRequestHeaderSize { .. } => "HTTP-request-header-size",
        E::HttpRequestTrailerSectionSize(_) => "HTTP-request-trailer-section-size",
        E::HttpRequestTrailerSize { .. } => "HTTP-request-trailer-size",
        E::HttpResponseIncomplete => "HTTP-response-incomplete",
        E::HttpResponseHeaderSectionSize(_) => "HTTP-response-header-section-size",
        E::HttpResponseHeaderSize { .. } => "HTTP-response-header-size",
        E::HttpResponseBodySize(_) => "HTTP-response-body-size",
        E::HttpResponseTrailerSectionSize(_) => "HTTP-response-trailer-section-size",
        E::HttpResponseTrailerSize { .. } => "HTTP-response-trailer-size",
        E::HttpResponseTransferCoding(_) => "HTTP-response-transfer-coding",
        E::HttpResponseContentCoding(_) => "HTTP-response-content-coding",
        E::HttpResponseTimeout => "HTTP-response-timeout",
        E::HttpUpgradeFailed => "HTTP-upgrade-failed",
        E::HttpProtocolError => "HTTP-protocol-error",
        E::LoopDetected => "loop-detected",
        E::ConfigurationError => "configuration-error",
        _ => "internal-error",
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::plugin::egress::{http_client, EgressPolicy};
    use http_body_util::BodyExt;
    use std::net::SocketAddr;

    /// A loopback listener that records the `Host` header of each request
    /// and answers 200.
    async fn host_recorder() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let Some(text) = read_head(&mut socket).await else {
                        return;
                    };
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

    /// The head of the next request on `socket` (through the blank line),
    /// as text; `None` when the peer goes away first.
    pub(in crate::plugin::egress) async fn read_head(
        socket: &mut tokio::net::TcpStream,
    ) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        Some(String::from_utf8_lossy(&buf).to_string())
    }

    fn hooks(patterns: &[&str]) -> EgressHooks {
        for_tests(&patterns.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Hooks allowing `patterns`, with generous limits: 1,000 requests,
    /// 1 MiB responses, 30 s to the first byte, a minute to the deadline.
    pub(in crate::plugin::egress) fn for_tests(patterns: &[String]) -> EgressHooks {
        let policy = Arc::new(EgressPolicy::new(patterns).unwrap());
        EgressHooks {
            plugin: Arc::from("test"),
            client: http_client(policy.clone(), &crate::plugin::egress::webpki_only()),
            policy,
            requests_left: 1000,
            denials: Arc::default(),
            telemetry: Default::default(),
            answer_headers: Default::default(),
            last_host: None,
            max_response_bytes: 1 << 20,
            timeouts: Timeouts {
                first_byte: Duration::from_secs(30),
                between_bytes: Duration::from_secs(10),
                until: Instant::now() + Duration::from_secs(60),
            },
        }
    }

    #[test]
    fn codes_are_named_as_the_wit_spells_them() {
        assert_eq!(
            wit_name(&HttpError::ConnectionRefused),
            "connection-refused"
        );
        assert_eq!(
            wit_name(&HttpError::HttpRequestDenied),
            "HTTP-request-denied"
        );
        assert_eq!(
            wit_name(&HttpError::HttpRequestUriInvalid),
            "HTTP-request-URI-invalid"
        );
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

    /// A TLS listener on loopback serving a self-signed certificate for
    /// 127.0.0.1 (no root trusts it); it answers nothing past the
    /// handshake.
    async fn untrusted_tls() -> SocketAddr {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![made.cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = acceptor.accept(socket).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_untrusted_certificate_is_a_tls_certificate_error() {
        let addr = untrusted_tls().await;
        let mut hooks = hooks(&[&format!("https://{addr}")]);
        let got = send(&mut hooks, &format!("https://{addr}/x"), None).await;
        assert!(
            matches!(got, Err(HttpError::TlsCertificateError)),
            "{got:?}"
        );
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
    async fn each_request_of_a_batch_names_its_own_authority_in_host() {
        let (a, seen_a) = host_recorder().await;
        let (b, seen_b) = host_recorder().await;
        let mut hooks = hooks(&[&format!("http://{a}"), &format!("http://{b}")]);
        for to in [a, b, a] {
            let status = send(&mut hooks, &format!("http://{to}/x"), None)
                .await
                .unwrap();
            assert_eq!(status, 200);
        }
        assert_eq!(*seen_a.lock().unwrap(), vec![a.to_string(), a.to_string()]);
        assert_eq!(*seen_b.lock().unwrap(), vec![b.to_string()]);
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
