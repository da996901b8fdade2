//! Many HTTP requests per host call: `outboxd:sink/http-batch` (since WIT
//! 0.1.2). The host sends them at once over its pooled client under the
//! same grant, limits and timeouts as `wasi:http`: [`send_all`] answers a
//! list when all of it is answered; [`start`] and [`wait`] hand answers
//! back as they come, by tag; [`keep_response_headers`] names the only
//! response headers the answers carry (since WIT 0.1.4).
//!
//! A request through `wasi:http` costs about 35 host calls on resources; a
//! request here is one record of one call, which is why
//! [`crate::streams::deliver`] sends this way (bench stage 4i,
//! docs/measurements.md).
//!
//! Must never: have two requests of one stream in flight at once when
//! their order matters (the host gives no order between them).

use std::time::Duration;

pub use crate::bindings::outboxd::sink::http_batch::{
    Request as BatchRequest, RequestError, Response as BatchResponse,
};
use crate::http::{Response, Url};
use crate::outcome;
use crate::Outcome;

/// A request header, name and value.
pub type Header = (String, Vec<u8>);

/// Most requests one call sends (the host answers the rest
/// `HTTP-request-denied`, unsent).
pub const MAX_PER_CALL: usize = 1024;

/// A `POST` of `body` to `url` with `headers` (the host adds its
/// `content-length`), waiting at most `timeout` for the response head and
/// then between bytes (the host clamps it to the manifest's ceilings), and
/// keeping the first [`outcome::REASON_BODY_BYTES`] of the response body
/// (for a reject reason).
pub fn post(url: &Url, headers: Vec<Header>, body: Vec<u8>, timeout: Duration) -> BatchRequest {
    BatchRequest {
        method: "POST".into(),
        url: url.to_text(),
        headers,
        body,
        timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        keep_body_bytes: outcome::REASON_BODY_BYTES as u32,
    }
}

std::thread_local! {
    /// The wall clock as [`now`] read it since the last call that waited
    /// on the host ([`send_all`], [`wait`]); `None`: not read since.
    static NOW: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// Wall-clock time since the unix epoch, read from the host
/// (`wasi:clocks/wall-clock`) once after each call here that waits on the
/// host ([`send_all`], [`wait`]) and kept until the next: the requests a
/// sink builds between two waits are built within microseconds of each
/// other, and share one reading instead of a host call each (what a
/// `webhook-timestamp`, in seconds, is made from).
pub fn now() -> Duration {
    NOW.with(|now| match now.get() {
        Some(read) => read,
        None => {
            let read = crate::pending::now();
            now.set(Some(read));
            read
        }
    })
}

/// Time passes while the host is waited on: the next [`now`] reads again.
fn waited() {
    NOW.with(|now| now.set(None));
}

/// Send every request of `requests` at once and wait for all the answers:
/// `answers[i]` answers `requests[i]`.
pub fn send_all(requests: &[BatchRequest]) -> Vec<Result<Response, RequestError>> {
    if requests.is_empty() {
        return Vec::new();
    }
    let answers = crate::bindings::outboxd::sink::http_batch::send_batch(requests);
    waited();
    answers
        .into_iter()
        .map(|answer| answer.map(response))
        .collect()
}

/// Start every request of `requests` (each with the caller's tag) without
/// waiting: they go out at once; [`wait`] hands back their answers.
pub fn start(requests: &[(u64, BatchRequest)]) {
    if !requests.is_empty() {
        crate::bindings::outboxd::sink::http_batch::start(requests);
    }
}

/// Requests sent after this call in this batch are answered with only the
/// response headers in `names` (case-insensitive; empty: none; WIT
/// 0.1.4). Without it answers carry every header, each one two
/// allocations in the sink's memory and a copy: a sink that reads only
/// `Retry-After` calls `keep_response_headers(&["retry-after"])` once,
/// before it sends.
pub fn keep_response_headers(names: &[&str]) {
    let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    crate::bindings::outboxd::sink::http_batch::keep_response_headers(&names);
}

/// Wait for at least one started request's answer and take every answer
/// ready then, each with its tag. Empty when none is in flight.
pub fn wait() -> Vec<(u64, Result<Response, RequestError>)> {
    let answers = crate::bindings::outboxd::sink::http_batch::wait();
    waited();
    answers
        .into_iter()
        .map(|(tag, answer)| (tag, answer.map(response)))
        .collect()
}

fn response(r: BatchResponse) -> Response {
    Response {
        status: r.status,
        headers: r.headers,
        body: r.body,
    }
}

/// What a request that got no response means for its event: a header the
/// host would never send (`forbidden`, `invalid-syntax`) is `reject`, as
/// no retry can send it; anything else is `retry`, the reason naming the
/// code (`connection refused (connection-refused)`).
pub fn for_error(error: &RequestError) -> Outcome {
    match error.code.as_str() {
        "forbidden" => Outcome::Reject(format!(
            "a request header is forbidden by the host: {}",
            error.message
        )),
        "invalid-syntax" => Outcome::Reject(format!(
            "a request header is not valid HTTP: {}",
            error.message
        )),
        code => outcome::retry(format!("{} ({code})", error.message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: &str, message: &str) -> RequestError {
        RequestError {
            code: code.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_header_the_host_refuses_is_rejected_and_the_rest_retried() {
        assert!(matches!(
            for_error(&error("forbidden", "header `host` is set by the host")),
            Outcome::Reject(_)
        ));
        match for_error(&error("connection-refused", "connection refused")) {
            Outcome::Retry(info) => {
                assert_eq!(info.reason, "connection refused (connection-refused)")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_post_keeps_what_a_reason_needs() {
        let url = Url::parse("https://h:8443/p?q=1").unwrap();
        let r = post(&url, vec![], b"{}".to_vec(), Duration::from_secs(3));
        assert_eq!(r.url, "https://h:8443/p?q=1");
        assert_eq!(r.timeout_ms, Some(3000));
        assert_eq!(r.keep_body_bytes as usize, outcome::REASON_BODY_BYTES);
    }
}
