//! The host side of `outboxd:sink/http-batch`: a guest hands over a list
//! of requests in one call; each is checked and sent exactly as a
//! `wasi:http` request is ([`EgressHooks::send`]: the batch's request
//! budget, the policy and address rule, the forced `Host`, the pooled
//! client, the receiver watch), all of them at once. `send-batch` answers
//! one result per request, in order, when all are answered; `start` and
//! `wait` ([`InFlight`]) hand answers back as they come, by the guest's
//! tags.
//!
//! Why it exists: through `wasi:http` a request costs about 35 host calls
//! on resources, each lifted and lowered, plus two tasks and their
//! wake-ups (bench/results/2026-12-04-outbound-http.md: 47 µs of CPU per
//! request against 12.7 µs for a native pooled client). Here a request is
//! one record in one call, and the whole call is one future on the
//! guest's own task: no resource, no task per request.
//!
//! Owns: turning a guest's record into an `http::Request` (method, URL,
//! headers, `content-length`), the cap on requests at once
//! ([`MAX_REQUESTS_PER_CALL`]), the started requests of a batch
//! ([`InFlight`]), and reading each response body into what the guest
//! keeps.
//!
//! Must never: send a request another way than [`EgressHooks::send`] (the
//! one place that checks it), accept a header the `wasi:http` path forbids
//! (`host`, `connection`, `transfer-encoding`, …), or hold more than the
//! request's `keep-body-bytes` of a body.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::hooks::{wit_name, EgressHooks};
use crate::plugin::bindings::{HttpBatchRequest, HttpBatchResponse, HttpRequestError};

/// Most requests one `send-batch` call sends, and most `start`ed requests
/// in flight at once; the ones past it are answered `HTTP-request-denied`
/// unsent. The SDK's `MAX_IN_FLIGHT`, so a batch of one request per
/// stream fits.
pub const MAX_REQUESTS_PER_CALL: usize = 1024;

/// Longest method accepted, in bytes.
const MAX_METHOD_BYTES: usize = 32;

/// One request's answer, as the guest gets it.
type Answer = Result<HttpBatchResponse, HttpRequestError>;

/// One request of a call, on its way to its answer.
type Sending = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// A started request on its way to its answer, with the guest's tag.
type Tagged = Pin<Box<dyn Future<Output = (u64, Answer)> + Send>>;

impl EgressHooks {
    /// Send every request of `requests` at once and answer each, in
    /// order: `answers[i]` answers `requests[i]`. Requests are checked and
    /// counted against the batch's budget in list order, before any is
    /// sent; the returned future then drives them all together.
    pub fn send_batch(
        &mut self,
        requests: Vec<HttpBatchRequest>,
    ) -> impl Future<Output = Vec<Answer>> + Send + 'static {
        let sends: Vec<Sending> = requests
            .into_iter()
            .enumerate()
            .map(|(index, request)| self.sending(request, index >= MAX_REQUESTS_PER_CALL))
            .collect();
        futures::future::join_all(sends)
    }

    /// `request` checked and on its way (its budget counted now); or, when
    /// `over_cap`, answered `HTTP-request-denied` unsent.
    fn sending(&mut self, request: HttpBatchRequest, over_cap: bool) -> Sending {
        if over_cap {
            let error = refused(
                &HttpError::HttpRequestDenied,
                format!("more than {MAX_REQUESTS_PER_CALL} requests at once"),
            );
            return Box::pin(std::future::ready(Err(error)));
        }
        let keep = request.keep_body_bytes as usize;
        match build(request) {
            Err(error) => Box::pin(std::future::ready(Err(error))),
            Ok((request, options)) => {
                let sent = self.send(request, Some(options));
                Box::pin(async move {
                    match sent.await {
                        Ok(response) => Ok(read(response, keep).await),
                        Err(code) => Err(failed(&code)),
                    }
                })
            }
        }
    }
}

/// The requests one batch has `start`ed and not yet handed back by
/// `wait`, each with the guest's tag. Driven only while the guest waits
/// (no task of their own); hyper's connection tasks move the bytes
/// meanwhile.
#[derive(Default)]
pub struct InFlight {
    requests: FuturesUnordered<Tagged>,
}

impl InFlight {
    /// Start every request of `requests` (checked and counted in list
    /// order through `hooks`); one past [`MAX_REQUESTS_PER_CALL`] in
    /// flight is answered `HTTP-request-denied` unsent.
    pub fn start(&mut self, hooks: &mut EgressHooks, requests: Vec<(u64, HttpBatchRequest)>) {
        for (tag, request) in requests {
            let over_cap = self.requests.len() >= MAX_REQUESTS_PER_CALL;
            let sending = hooks.sending(request, over_cap);
            self.requests
                .push(Box::pin(async move { (tag, sending.await) }));
        }
    }

    /// Wait for the next answer, then take it and every other answer
    /// ready now, in the order they came. Empty when nothing is in flight.
    pub async fn wait(&mut self) -> Vec<(u64, Answer)> {
        let Some(first) = self.requests.next().await else {
            return Vec::new();
        };
        let mut ready = vec![first];
        while let Some(Some(next)) = self.requests.next().now_or_never() {
            ready.push(next);
        }
        ready
    }
}

/// The `http::Request` a guest's record describes, with its timeouts; or
/// why it cannot be sent as given.
fn build(
    r: HttpBatchRequest,
) -> Result<(http::Request<WasiBody>, RequestOptions), HttpRequestError> {
    if r.method.is_empty() || r.method.len() > MAX_METHOD_BYTES {
        return Err(refused(
            &HttpError::HttpRequestMethodInvalid,
            format!("a method is 1 to {MAX_METHOD_BYTES} bytes"),
        ));
    }
    let method = http::Method::from_bytes(r.method.as_bytes()).map_err(|_| {
        refused(
            &HttpError::HttpRequestMethodInvalid,
            "the method is not an HTTP token".into(),
        )
    })?;
    let uri = parse_url(&r.url)?;
    // Sized once; each value keeps the guest's bytes without a copy.
    let mut headers = http::HeaderMap::with_capacity(r.headers.len() + 2);
    for (name, value) in r.headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| header_error("invalid-syntax", "a header name is not valid HTTP"))?;
        if wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS.contains(&name) {
            return Err(header_error(
                "forbidden",
                &format!("header `{name}` is set by the host"),
            ));
        }
        let value = http::HeaderValue::from_maybe_shared(Bytes::from(value)).map_err(|_| {
            header_error(
                "invalid-syntax",
                &format!("header `{name}`: the value is not valid HTTP"),
            )
        })?;
        headers.append(name, value);
    }
    if !headers.contains_key(http::header::CONTENT_LENGTH) {
        headers.insert(http::header::CONTENT_LENGTH, r.body.len().into());
    }
    let body: WasiBody = http_body_util::Full::new(Bytes::from(r.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut request = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(body)
        .map_err(|e| {
            refused(
                &HttpError::InternalError(None),
                format!("request not built: {e}"),
            )
        })?;
    *request.headers_mut() = headers;
    let timeout = r.timeout_ms.filter(|ms| *ms > 0).map(Duration::from_millis);
    let options = RequestOptions {
        connect_timeout: timeout,
        first_byte_timeout: timeout,
        between_bytes_timeout: timeout,
    };
    Ok((request, options))
}

/// An absolute `http://` or `https://` URL with a host and no userinfo;
/// a `#fragment` is dropped. Errors never repeat the URL (its query may
/// carry a token).
fn parse_url(url: &str) -> Result<http::Uri, HttpRequestError> {
    let invalid = |why: &str| refused(&HttpError::HttpRequestUriInvalid, format!("the url {why}"));
    let url = url.split('#').next().unwrap_or_default();
    let uri: http::Uri = url.parse().map_err(|_| invalid("is not a valid URI"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(invalid("must start with http:// or https://")),
    }
    let Some(authority) = uri.authority() else {
        return Err(invalid("has no host"));
    };
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return Err(invalid("must name a host and carry no credentials"));
    }
    Ok(uri)
}

/// Read `response`'s body to its end (or to where it breaks off or runs
/// past the ceilings: the status still stands), keeping its first `keep`
/// bytes.
async fn read(response: http::Response<WasiBody>, keep: usize) -> HttpBatchResponse {
    let (head, mut body) = response.into_parts();
    let mut kept = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            let room = keep.saturating_sub(kept.len());
            kept.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    HttpBatchResponse {
        status: head.status.as_u16(),
        headers: head
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect(),
        body: kept,
    }
}

/// A request refused before it was sent.
fn refused(code: &HttpError, message: String) -> HttpRequestError {
    HttpRequestError {
        code: wit_name(code).to_string(),
        message,
    }
}

/// A request whose headers `fields.from-list` would refuse: `code` is the
/// `header-error` case (`invalid-syntax`, `forbidden`).
fn header_error(code: &str, message: &str) -> HttpRequestError {
    HttpRequestError {
        code: code.to_string(),
        message: message.to_string(),
    }
}

/// A request that got no response, as the hook's error code says.
fn failed(code: &HttpError) -> HttpRequestError {
    HttpRequestError {
        code: wit_name(code).to_string(),
        message: describe(code),
    }
}

/// An operator-facing account of `code`, worded as the SDK words the same
/// `wasi:http` code (`outboxd_sink::outcome::describe`), so a reason reads
/// the same whichever way the request went.
fn describe(code: &HttpError) -> String {
    use HttpError as E;
    let text = match code {
        E::DnsTimeout => "DNS timeout",
        E::DnsError { .. } => "DNS error",
        E::DestinationUnavailable => "destination unavailable",
        E::ConnectionRefused => "connection refused",
        E::ConnectionTerminated => "connection terminated",
        E::ConnectionTimeout => "connection timeout",
        E::ConnectionReadTimeout => "response stalled: no byte within the between-bytes timeout",
        E::TlsProtocolError => "TLS protocol error",
        E::TlsCertificateError => "TLS certificate error",
        E::HttpRequestDenied => "request denied by host policy",
        E::HttpRequestUriInvalid => "request URI invalid",
        E::HttpResponseIncomplete => {
            "response incomplete: cut off, or unfinished before the batch deadline"
        }
        E::HttpResponseBodySize(_) => "response body size",
        E::HttpResponseTimeout => "no response within the first-byte timeout",
        E::HttpProtocolError => "HTTP protocol error",
        other => return wit_name(other).replace('-', " "),
    };
    text.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> HttpBatchRequest {
        HttpBatchRequest {
            method: method.into(),
            url: url.into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: b"{}".to_vec(),
            timeout_ms: None,
            keep_body_bytes: 0,
        }
    }

    /// A loopback receiver that answers each request only once `together`
    /// requests have arrived (or after 5 s, with 503), with the status its
    /// path names (`/201` → 201) and a body `body-<status>`; and how many
    /// requests it saw.
    async fn receiver(
        together: usize,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(together));
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (seen, barrier) = (counted.clone(), barrier.clone());
                tokio::spawn(async move {
                    let Some(text) = super::super::hooks::tests::read_head(&mut socket).await
                    else {
                        return;
                    };
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let path = text.split(' ').nth(1).unwrap_or("/");
                    let mut status: u16 = path.trim_start_matches('/').parse().unwrap_or(200);
                    if tokio::time::timeout(Duration::from_secs(5), barrier.wait())
                        .await
                        .is_err()
                    {
                        status = 503;
                    }
                    let body = format!("body-{status}");
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nx-status: {status}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(body.as_bytes()).await;
                });
            }
        });
        (addr, seen)
    }

    fn hooks(patterns: &[String]) -> EgressHooks {
        super::super::hooks::tests::for_tests(patterns)
    }

    #[tokio::test]
    async fn a_call_sends_its_requests_together_and_answers_each_in_order() {
        let (addr, seen) = receiver(3).await;
        let mut hooks = hooks(&[format!("http://{addr}")]);
        let mut requests: Vec<HttpBatchRequest> = [201, 202, 203]
            .iter()
            .map(|s| request("POST", &format!("http://{addr}/{s}"), &[]))
            .collect();
        requests[0].keep_body_bytes = 4;
        requests[1].keep_body_bytes = 100;
        let answers = hooks.send_batch(requests).await;
        let got: Vec<(u16, Vec<u8>)> = answers
            .into_iter()
            .map(|a| a.map(|r| (r.status, r.body)).unwrap())
            .collect();
        // 503 would mean the receiver never had all three at once.
        assert_eq!(
            got,
            vec![
                (201, b"body".to_vec()),
                (202, b"body-202".to_vec()),
                (203, Vec::new())
            ]
        );
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_request_outside_the_grant_never_leaves_the_host() {
        let (addr, seen) = receiver(1).await;
        let (other, other_seen) = receiver(1).await;
        let mut hooks = hooks(&[format!("http://{addr}")]);
        let answers = hooks
            .send_batch(vec![
                request("POST", &format!("http://{other}/200"), &[]),
                request("POST", &format!("http://{addr}/200"), &[]),
            ])
            .await;
        let denied = answers[0].as_ref().unwrap_err();
        assert_eq!(denied.code, "HTTP-request-denied");
        assert_eq!(answers[1].as_ref().unwrap().status, 200);
        assert_eq!(other_seen.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Not every request was denied: the batch is not a configuration error.
        assert_eq!(hooks.denials.all_denied(), None);
    }

    #[tokio::test]
    async fn the_batch_budget_counts_requests_in_list_order() {
        let (addr, seen) = receiver(1).await;
        let mut hooks = hooks(&[format!("http://{addr}")]);
        hooks.requests_left = 1;
        let answers = hooks
            .send_batch(vec![
                request("POST", &format!("http://{addr}/200"), &[]),
                request("POST", &format!("http://{addr}/200"), &[]),
            ])
            .await;
        assert_eq!(answers[0].as_ref().unwrap().status, 200);
        assert_eq!(answers[1].as_ref().unwrap_err().code, "HTTP-request-denied");
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn started_requests_are_handed_back_as_they_are_answered() {
        // `/202` is answered only after 2 s, once the barrier times out (it
        // waits for 2 requests and gets 1): it then answers 503.
        let (slow, _) = receiver(2).await;
        let (fast, _) = receiver(1).await;
        let mut hooks = hooks(&[format!("http://{slow}"), format!("http://{fast}")]);
        let mut in_flight = InFlight::default();
        in_flight.start(
            &mut hooks,
            vec![
                (7, request("POST", &format!("http://{slow}/202"), &[])),
                (9, request("POST", &format!("http://{fast}/201"), &[])),
            ],
        );
        let answered = |ready: Vec<(u64, Answer)>| -> Vec<(u64, u16)> {
            ready
                .into_iter()
                .map(|(tag, a)| (tag, a.map(|r| r.status).unwrap_or(0)))
                .collect()
        };
        let started = Instant::now();
        assert_eq!(answered(in_flight.wait().await), vec![(9, 201)]);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "the fast answer waited for the slow one"
        );
        assert_eq!(answered(in_flight.wait().await), vec![(7, 503)]);
        assert!(in_flight.wait().await.is_empty());
    }

    fn code(r: HttpBatchRequest) -> String {
        build(r).err().map(|e| e.code).unwrap_or_default()
    }

    #[test]
    fn a_request_is_built_with_its_length() {
        let (built, options) =
            build(request("POST", "http://h:1/p?q#frag", &[("x-a", "1")])).unwrap();
        assert_eq!(built.uri().to_string(), "http://h:1/p?q");
        assert_eq!(built.headers()["content-length"], "2");
        assert_eq!(built.headers()["x-a"], "1");
        assert_eq!(options.first_byte_timeout, None);
    }

    #[test]
    fn what_cannot_be_sent_is_named_as_the_wit_names_it() {
        // Method, URL, headers, and the code the request is refused with.
        type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: [Case; 9] = [
            ("", "http://h/", &[], "HTTP-request-method-invalid"),
            ("PO ST", "http://h/", &[], "HTTP-request-method-invalid"),
            ("POST", "ftp://h/", &[], "HTTP-request-URI-invalid"),
            ("POST", "/relative", &[], "HTTP-request-URI-invalid"),
            ("POST", "http://u:p@h/", &[], "HTTP-request-URI-invalid"),
            ("POST", "http://h/", &[("host", "evil")], "forbidden"),
            (
                "POST",
                "http://h/",
                &[("Transfer-Encoding", "chunked")],
                "forbidden",
            ),
            ("POST", "http://h/", &[("bad name", "1")], "invalid-syntax"),
            ("POST", "http://h/", &[("x", "a\nb")], "invalid-syntax"),
        ];
        for (method, url, headers, want) in cases {
            let got = code(request(method, url, headers));
            assert_eq!(got, want, "{method:?} {url} {headers:?}");
        }
    }
}
