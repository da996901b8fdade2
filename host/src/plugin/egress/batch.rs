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
//! Owns: turning a guest's request, read in place ([`RequestView`]), into
//! an `http::Request` (method, URL, headers, `content-length`) —
//! [`prepare`] — the cap on requests at once ([`MAX_REQUESTS_PER_CALL`]),
//! the started requests of a batch ([`InFlight`]), and reading each
//! response into its answer: the body up to what the guest keeps, the
//! headers it asked for ([`AnswerHeaders`]). Reading the records out of
//! guest memory is `crate::plugin::batch_imports`'.
//!
//! Must never: send a request another way than [`EgressHooks::send`] (the
//! one place that checks it), accept a header the `wasi:http` path forbids
//! (`host`, `connection`, `transfer-encoding`, …), or hold more than the
//! request's `keep-body-bytes` of a body.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::Either;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::hooks::{wit_name, EgressHooks};
use crate::plugin::bindings::{HttpBatchResponse, HttpRequestError};

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

/// One `http-batch` request record as the guest handed it over, read in
/// place: every field borrowed, from the guest's memory (the host's
/// imports) or from a record built natively (tests).
pub struct RequestView<'a> {
    /// `method`.
    pub method: &'a str,
    /// `url`.
    pub url: &'a str,
    /// `headers`, names and values, in order.
    pub headers: &'a [(Cow<'a, str>, &'a [u8])],
    /// `body`.
    pub body: &'a [u8],
    /// `timeout-ms`.
    pub timeout_ms: Option<u64>,
    /// `keep-body-bytes`.
    pub keep_body_bytes: u32,
    /// The header values, in order, then the body, when they were already
    /// copied out of guest memory together in that layout
    /// ([`crate::plugin::batch_imports::CopiedRequest`]): the request's
    /// values and body are then slices of it, not copied again. `None`:
    /// copied from `headers` and `body`.
    pub copied: Option<&'a Bytes>,
}

/// A request made ready from its [`RequestView`] (its bytes copied out
/// of guest memory, checked as `wasi:http` checks a request), or answered
/// already.
// Nearly every request is `Send`: boxing it to shrink the others would
// cost each request an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Prepared {
    /// Ready to go through [`EgressHooks::send`], keeping `keep` bytes of
    /// the response body.
    Send {
        /// The request.
        request: http::Request<WasiBody>,
        /// Its timeouts.
        options: RequestOptions,
        /// `keep-body-bytes`.
        keep: usize,
    },
    /// Refused as given (method, URL or a header); nothing is sent.
    Refused(HttpRequestError),
    /// Past [`MAX_REQUESTS_PER_CALL`] at once: answered
    /// `HTTP-request-denied`, unsent (its bytes not even read).
    OverCap,
}

/// `view` made ready to send, or refused as given (see [`Prepared`]);
/// `recent` holds what the batch's earlier requests parsed.
pub fn prepare(view: &RequestView<'_>, recent: &mut Recent) -> Prepared {
    match build(view, recent) {
        Ok((request, options)) => Prepared::Send {
            request,
            options,
            keep: view.keep_body_bytes as usize,
        },
        Err(error) => Prepared::Refused(error),
    }
}

impl EgressHooks {
    /// Send every request of `requests` at once and answer each, in
    /// order: `answers[i]` answers `requests[i]`. Requests are checked and
    /// counted against the batch's budget in list order, before any is
    /// sent; the returned future then drives them all together.
    pub fn send_batch(
        &mut self,
        requests: Vec<Prepared>,
    ) -> impl Future<Output = Vec<Answer>> + Send + 'static {
        let sends: Vec<Sending> = requests
            .into_iter()
            .map(|request| Box::pin(self.sending(request)) as Sending)
            .collect();
        futures::future::join_all(sends)
    }

    /// `request` checked and on its way (its budget counted now), or
    /// answered as [`Prepared`] says. Unboxed: the caller boxes it once,
    /// with whatever it keeps beside it.
    fn sending(
        &mut self,
        request: Prepared,
    ) -> impl Future<Output = Answer> + Send + 'static + use<> {
        let (request, options, keep) = match request {
            Prepared::OverCap => {
                return Either::Left(std::future::ready(Err(refused(
                    &HttpError::HttpRequestDenied,
                    format!("more than {MAX_REQUESTS_PER_CALL} requests at once"),
                ))))
            }
            Prepared::Refused(error) => return Either::Left(std::future::ready(Err(error))),
            Prepared::Send {
                request,
                options,
                keep,
            } => (request, options, keep),
        };
        let headers = self.answer_headers.clone();
        // Combinators, not an `async` block: a block holding a future it
        // awaits keeps room for it twice (3.6 KB a request, measured).
        Either::Right(
            self.send(request, Some(options))
                .then(move |sent| match sent {
                    Ok(response) => Either::Left(read(response, keep, headers).map(Ok)),
                    Err(code) => Either::Right(std::future::ready(Err(failed(&code)))),
                }),
        )
    }
}

/// The requests one batch has `start`ed and not yet handed back by
/// `wait`, each with the guest's tag. Driven while the guest waits, and
/// once as each is started (no task of their own); hyper's connection
/// tasks move the bytes meanwhile.
#[derive(Default)]
pub struct InFlight {
    requests: FuturesUnordered<Tagged>,
    /// Answers that came while requests were being started, handed back
    /// by the next `wait` before any other.
    early: Vec<(u64, Answer)>,
}

impl InFlight {
    /// How many more requests may be started now: the rest of
    /// [`MAX_REQUESTS_PER_CALL`].
    pub fn room(&self) -> usize {
        MAX_REQUESTS_PER_CALL.saturating_sub(self.requests.len() + self.early.len())
    }

    /// Start every request of `requests` (checked and counted in list
    /// order through `hooks`).
    pub fn start(&mut self, hooks: &mut EgressHooks, requests: Vec<(u64, Prepared)>) {
        for (tag, request) in requests {
            // One box a request, its tag beside it.
            let sending = hooks.sending(request);
            self.requests
                .push(Box::pin(sending.map(move |answer| (tag, answer))));
        }
    }

    /// Drive the requests in flight as far as they go without waiting:
    /// a request just started takes its pooled connection and is handed
    /// to it, so it is on the wire while the guest builds the next rather
    /// than at its next `wait`. Answers that come meanwhile are kept for
    /// that `wait`.
    pub async fn drive(&mut self) {
        std::future::poll_fn(|cx| {
            while let std::task::Poll::Ready(Some(answer)) = self.requests.poll_next_unpin(cx) {
                self.early.push(answer);
            }
            std::task::Poll::Ready(())
        })
        .await
    }

    /// Wait for the next answer, then take it and every other answer
    /// ready now, in the order they came. Empty when nothing is in flight.
    pub async fn wait(&mut self) -> Vec<(u64, Answer)> {
        let mut ready = std::mem::take(&mut self.early);
        if ready.is_empty() {
            let Some(first) = self.requests.next().await else {
                return ready;
            };
            ready.push(first);
        }
        while let Some(Some(next)) = self.requests.next().now_or_never() {
            ready.push(next);
        }
        ready
    }
}

/// Which response headers a batch's answers carry: every one, until the
/// guest names the ones it reads (`keep-response-headers`, WIT 0.1.4);
/// a request takes the setting in force when it is sent.
/// Each header an answer carries costs the guest two allocations and the
/// host two copies; a sink reading only `retry-after` is spared the rest
/// (a CouchDB answer carries eight).
#[derive(Debug, Clone, Default)]
pub struct AnswerHeaders(Option<Arc<[http::HeaderName]>>);

impl AnswerHeaders {
    /// Only the headers named in `names` (case-insensitive, RFC 9110 §5.1;
    /// a name that is not a valid header name matches nothing).
    pub fn only<'a>(names: impl IntoIterator<Item = &'a str>) -> AnswerHeaders {
        let names = names
            .into_iter()
            .filter_map(|name| http::HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        AnswerHeaders(Some(names))
    }

    /// Whether an answer carries header `name`.
    fn keeps(&self, name: &http::HeaderName) -> bool {
        self.0.as_ref().is_none_or(|names| names.contains(name))
    }
}

/// Most header names a [`Recent`] keeps.
const MAX_RECENT_NAMES: usize = 64;

/// Headers the host sets itself, which a request may not carry: the
/// `wasi:http` path's list, kept once (the crate's is a `const`, built
/// again at every use).
static FORBIDDEN: [http::HeaderName; 9] = wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS;

/// What the requests of one batch share, parsed once for all of them:
/// the last URL, and the header names seen. A sink's requests repeat the
/// same URL and the same names in the same order (`ce-id`,
/// `webhook-signature`, …), and a URL or a header name outside the
/// standard ones is an allocation and a parse of its own each time.
/// Names are looked up from where the last one was found, so a request
/// repeating the previous one's names finds each at the first look.
#[derive(Default)]
pub struct Recent {
    url: Option<(Box<str>, http::Uri)>,
    names: Vec<http::HeaderName>,
    next: usize,
}

impl Recent {
    /// `url` parsed ([`parse_url`]), or the last one again.
    fn url(&mut self, url: &str) -> Result<http::Uri, HttpRequestError> {
        if let Some((text, uri)) = &self.url {
            if **text == *url {
                return Ok(uri.clone());
            }
        }
        let uri = parse_url(url)?;
        self.url = Some((url.into(), uri.clone()));
        Ok(uri)
    }

    /// `name` as a header name a request may carry, or why not: not valid
    /// HTTP (`invalid-syntax`), or set by the host (`forbidden`, checked
    /// when a name is first seen; a forbidden name is never kept, so each
    /// use of it is checked and refused). Header names are
    /// case-insensitive (RFC 9110 §5.1): `Content-Type` finds the
    /// `content-type` kept.
    fn name(&mut self, name: &str) -> Result<http::HeaderName, HttpRequestError> {
        let known = self.names.len();
        for look in 0..known {
            let at = (self.next + look) % known;
            if self.names[at].as_str().eq_ignore_ascii_case(name) {
                self.next = at + 1;
                return Ok(self.names[at].clone());
            }
        }
        let parsed = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| header_error("invalid-syntax", "a header name is not valid HTTP"))?;
        if FORBIDDEN.contains(&parsed) {
            return Err(header_error(
                "forbidden",
                &format!("header `{parsed}` is set by the host"),
            ));
        }
        if known < MAX_RECENT_NAMES {
            self.names.push(parsed.clone());
            self.next = known + 1;
        }
        Ok(parsed)
    }
}

/// The `http::Request` a guest's record describes, with its timeouts; or
/// why it cannot be sent as given. The header values and the body are
/// copied out of guest memory together, into one buffer that each is a
/// slice of (a reference, not an allocation, per value); a view that
/// carries that buffer already ([`RequestView::copied`]) is sliced as it
/// is.
fn build(
    r: &RequestView<'_>,
    recent: &mut Recent,
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
    let uri = recent.url(r.url)?;
    let copied = match r.copied {
        Some(copied) => copied.clone(),
        None => {
            let size = r.body.len() + r.headers.iter().map(|(_, v)| v.len()).sum::<usize>();
            let mut copied = Vec::with_capacity(size);
            for (_, value) in r.headers {
                copied.extend_from_slice(value);
            }
            copied.extend_from_slice(r.body);
            Bytes::from(copied)
        }
    };
    let mut headers = http::HeaderMap::with_capacity(r.headers.len() + 2);
    let mut at = 0;
    for (name, value) in r.headers {
        let name = recent.name(name)?;
        let slice = copied.slice(at..at + value.len());
        at += value.len();
        let value = http::HeaderValue::from_maybe_shared(slice).map_err(|_| {
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
    let body: WasiBody = http_body_util::Full::new(copied.slice(at..))
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
async fn read(
    response: http::Response<WasiBody>,
    keep: usize,
    headers: AnswerHeaders,
) -> HttpBatchResponse {
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
            .filter(|(name, _)| headers.keeps(name))
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
    use crate::plugin::bindings::HttpBatchRequest;
    use std::sync::Arc;
    use std::time::Instant;

    /// `r` as the host reads it in place.
    fn prepared(r: &HttpBatchRequest) -> Prepared {
        let headers: Vec<(Cow<'_, str>, &[u8])> = r
            .headers
            .iter()
            .map(|(n, v)| (Cow::Borrowed(n.as_str()), v.as_slice()))
            .collect();
        prepare(
            &RequestView {
                method: &r.method,
                url: &r.url,
                headers: &headers,
                body: &r.body,
                timeout_ms: r.timeout_ms,
                keep_body_bytes: r.keep_body_bytes,
                copied: None,
            },
            &mut Recent::default(),
        )
    }

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
    async fn answers_carry_every_header_until_the_guest_names_the_ones_it_reads() {
        let (addr, _) = receiver(1).await;
        let mut hooks = hooks(&[format!("http://{addr}")]);
        let url = format!("http://{addr}/200");
        let headers = async |hooks: &mut EgressHooks| {
            let answers = hooks
                .send_batch(vec![prepared(&request("GET", &url, &[]))])
                .await;
            answers[0].as_ref().unwrap().headers.clone()
        };
        let names: Vec<String> = headers(&mut hooks)
            .await
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names, ["content-length", "x-status", "connection"]);
        hooks.answer_headers = AnswerHeaders::only(["X-Status", "not a name"]);
        assert_eq!(
            headers(&mut hooks).await,
            [("x-status".to_string(), b"200".to_vec())]
        );
        hooks.answer_headers = AnswerHeaders::only([]);
        assert!(headers(&mut hooks).await.is_empty());
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
        let answers = hooks
            .send_batch(requests.iter().map(prepared).collect())
            .await;
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
                prepared(&request("POST", &format!("http://{other}/200"), &[])),
                prepared(&request("POST", &format!("http://{addr}/200"), &[])),
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
                prepared(&request("POST", &format!("http://{addr}/200"), &[])),
                prepared(&request("POST", &format!("http://{addr}/200"), &[])),
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
                (
                    7,
                    prepared(&request("POST", &format!("http://{slow}/202"), &[])),
                ),
                (
                    9,
                    prepared(&request("POST", &format!("http://{fast}/201"), &[])),
                ),
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

    #[tokio::test]
    async fn a_started_request_is_on_the_wire_before_the_guest_waits() {
        use tokio::io::AsyncWriteExt;
        // A keep-alive receiver counting request heads.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = counted.clone();
                tokio::spawn(async move {
                    while super::super::hooks::tests::read_head(&mut socket)
                        .await
                        .is_some()
                    {
                        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if socket.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let url = format!("http://{addr}/");
        let mut hooks = hooks(&[format!("http://{addr}")]);
        let mut in_flight = InFlight::default();
        // The first request opens the connection the pool keeps.
        in_flight.start(&mut hooks, vec![(1, prepared(&request("GET", &url, &[])))]);
        assert_eq!(in_flight.wait().await.len(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;

        // Started and driven once, as the `start` import does; no `wait`
        // while the guest builds its next requests.
        in_flight.start(&mut hooks, vec![(2, prepared(&request("GET", &url, &[])))]);
        in_flight.drive().await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            assert!(
                Instant::now() < deadline,
                "the started request reached the receiver only at `wait`"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Driven again once answered (the guest starts more), the answer
        // is kept for the next `wait`.
        tokio::time::sleep(Duration::from_millis(100)).await;
        in_flight.drive().await;
        let answered = tokio::time::timeout(Duration::from_secs(5), in_flight.wait())
            .await
            .expect("the kept answer is handed back at once");
        assert_eq!(answered.len(), 1);
        assert_eq!(answered[0].0, 2);
        assert_eq!(answered[0].1.as_ref().unwrap().status, 200);
    }

    fn code(r: HttpBatchRequest) -> String {
        match prepared(&r) {
            Prepared::Refused(e) => e.code,
            _ => String::new(),
        }
    }

    #[test]
    fn a_request_is_built_with_its_length() {
        let Prepared::Send {
            request: built,
            options,
            ..
        } = prepared(&request("POST", "http://h:1/p?q#frag", &[("x-a", "1")]))
        else {
            panic!("refused");
        };
        assert_eq!(built.uri().to_string(), "http://h:1/p?q");
        assert_eq!(built.headers()["content-length"], "2");
        assert_eq!(built.headers()["x-a"], "1");
        assert_eq!(options.first_byte_timeout, None);
    }

    #[test]
    fn every_value_and_the_body_are_sent_as_given_from_one_copy() {
        let headers = [
            ("ce-id", "evt-1"),
            ("x-empty", ""),
            ("Content-Type", "application/json"),
            ("ce-id", "evt-1-again"),
            ("webhook-signature", "v1,abc="),
        ];
        let mut r = request("PUT", "https://h/p", &headers);
        r.body = b"{\"k\":1}".to_vec();
        let Prepared::Send { request: built, .. } = prepared(&r) else {
            panic!("refused");
        };
        let got: Vec<(String, String)> = built
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        let mut want: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
            .collect();
        want.push(("content-length".into(), "7".into()));
        let sorted = |mut v: Vec<(String, String)>| {
            v.sort();
            v
        };
        assert_eq!(sorted(got), sorted(want));
        let body = futures::executor::block_on(built.into_body().collect())
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"{\"k\":1}");
    }

    #[test]
    fn a_request_already_copied_out_is_sliced_not_copied_again() {
        let r = request("POST", "http://h:1/p", &[("ce-id", "evt-1"), ("x-b", "")]);
        let copied = Bytes::from_static(b"evt-1{}");
        let headers: Vec<(Cow<'_, str>, &[u8])> = vec![
            (Cow::Borrowed("ce-id"), &copied[..5]),
            (Cow::Borrowed("x-b"), &copied[5..5]),
        ];
        let view = RequestView {
            method: "POST",
            url: "http://h:1/p",
            headers: &headers,
            body: &copied[5..],
            timeout_ms: None,
            keep_body_bytes: 0,
            copied: Some(&copied),
        };
        let (
            Prepared::Send {
                request: sliced, ..
            },
            Prepared::Send { request: own, .. },
        ) = (prepare(&view, &mut Recent::default()), prepared(&r))
        else {
            panic!("refused");
        };
        assert_eq!(sliced.headers(), own.headers());
        let within = |bytes: &[u8]| copied.as_ptr_range().contains(&bytes.as_ptr());
        assert!(within(sliced.headers()["ce-id"].as_bytes()));
        let body = futures::executor::block_on(sliced.into_body().collect())
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"{}");
        assert!(within(&body), "the body is the buffer's tail, not a copy");
    }

    #[test]
    fn a_batch_parses_its_url_and_names_once_and_still_checks_each() {
        let mut recent = Recent::default();
        let a = recent.url("http://h:1/a").unwrap();
        assert_eq!(recent.url("http://h:1/a").unwrap(), a);
        assert_eq!(recent.url("http://h:1/b").unwrap().path(), "/b");
        assert_eq!(
            recent.url("ftp://h/").unwrap_err().code,
            "HTTP-request-URI-invalid"
        );
        assert_eq!(recent.url("http://h:1/b").unwrap().path(), "/b");
        assert_eq!(recent.name("ce-id").unwrap(), "ce-id");
        assert_eq!(recent.name("Webhook-ID").unwrap(), "webhook-id");
        assert_eq!(recent.name("ce-id").unwrap(), "ce-id");
        // A name in another case is the same name, kept once.
        assert_eq!(recent.name("WEBHOOK-id").unwrap(), "webhook-id");
        assert_eq!(recent.names.len(), 2);
        assert_eq!(recent.name("bad name").unwrap_err().code, "invalid-syntax");
        // A forbidden name is refused each time it comes, never kept.
        for _ in 0..2 {
            assert_eq!(recent.name("Host").unwrap_err().code, "forbidden");
        }
        assert_eq!(recent.names.len(), 2);
        // Past the cap, names are still parsed; the cache stops growing.
        for i in 0..2 * MAX_RECENT_NAMES {
            assert_eq!(
                recent.name(&format!("x-{i}")).unwrap(),
                format!("x-{i}").as_str()
            );
        }
        assert_eq!(recent.names.len(), MAX_RECENT_NAMES);
        assert_eq!(recent.name("x-100").unwrap(), "x-100");
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
