//! One blocking HTTP request over `wasi:http/outgoing-handler` (WASI 0.2).
//!
//! Two rules of the host are kept here so a sink does not have to:
//!
//! - Host resources are dropped children first (an output stream before
//!   its body, a pollable before what it polls, a body before its
//!   response): the host refuses to drop a resource whose children are
//!   alive, and that refusal is a trap.
//! - A failed body write is never the answer: when the host refuses a
//!   request (its allow-list), the body's stream closes before the
//!   response future says why; the body is finished anyway and the
//!   future's error is returned.
//!
//! Must never: read more of a response body than the caller allows.

use std::time::Duration;

use wasip2::http::outgoing_handler;
pub use wasip2::http::types::{ErrorCode, Method};
use wasip2::http::types::{
    Fields, IncomingBody, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};

/// Bytes per write: `wasi:io` streams take at most 4096 per
/// `blocking-write-and-flush`.
const WRITE_CHUNK: usize = 4096;

/// Where a request goes, from an `http://` or `https://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub https: bool,
    /// `host[:port]`.
    pub authority: String,
    /// Path and query, from `/`.
    pub path_with_query: String,
}

impl Url {
    /// Parse `http://host[:port][/path][?query]` or `https://…`. A
    /// `#fragment` is dropped. Errors say what is wrong, never repeating
    /// the URL (it may carry a token).
    pub fn parse(url: &str) -> Result<Url, String> {
        let url = url.split('#').next().unwrap_or_default();
        let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err("must start with http:// or https://".into());
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err("has no host".into());
        }
        if authority.contains('@') {
            return Err("must not carry credentials (`user:password@`)".into());
        }
        let path_with_query = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        Ok(Url {
            https,
            authority: authority.to_string(),
            path_with_query,
        })
    }
}

impl Url {
    /// `http[s]://authority/path?query`, as [`Display`](std::fmt::Display)
    /// writes it, in one allocation and without the formatting machinery
    /// (a sink calls it for every request it sends).
    pub fn to_text(&self) -> String {
        let scheme = if self.https { "https://" } else { "http://" };
        let mut text =
            String::with_capacity(scheme.len() + self.authority.len() + self.path_with_query.len());
        for part in [scheme, &self.authority, &self.path_with_query] {
            text.push_str(part);
        }
        text
    }
}

impl std::fmt::Display for Url {
    /// `http[s]://authority/path?query`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// A request to send.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub method: Method,
    pub url: &'a Url,
    /// Header names and values, in order.
    pub headers: &'a [(String, Vec<u8>)],
    pub body: &'a [u8],
    /// Connect, first-byte and between-bytes timeout; the host may clamp
    /// it to its own ceilings.
    pub timeout: Duration,
    /// Most bytes of the response body kept; the rest is left unread.
    pub max_body: usize,
}

/// The answer to a request.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Response headers, names lower-case as the host gives them.
    pub headers: Vec<(String, Vec<u8>)>,
    /// At most [`Request::max_body`] bytes of the body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Send `request` and wait for the answer. `Err` is the `wasi:http` error
/// code when no response came (refused by the host's allow-list, DNS,
/// connection, timeout, …); [`crate::outcome::transport_error`] names it.
pub fn send(request: &Request) -> Result<Response, ErrorCode> {
    let headers = Fields::from_list(&with_content_length(request.headers, request.body.len()))
        .map_err(|_| ErrorCode::InternalError(Some("a request header is not valid".into())))?;
    let outgoing = OutgoingRequest::new(headers);
    let scheme = if request.url.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let accepted = outgoing.set_method(&request.method).is_ok()
        && outgoing.set_scheme(Some(&scheme)).is_ok()
        && outgoing.set_authority(Some(&request.url.authority)).is_ok()
        && outgoing
            .set_path_with_query(Some(&request.url.path_with_query))
            .is_ok();
    if !accepted {
        return Err(ErrorCode::HttpRequestUriInvalid);
    }
    let body = outgoing
        .body()
        .map_err(|()| ErrorCode::InternalError(Some("the request has no body".into())))?;
    let options = RequestOptions::new();
    let timeout = Some(u64::try_from(request.timeout.as_nanos()).unwrap_or(u64::MAX));
    // A host that does not support a timeout refuses it; its own apply.
    let _ = options.set_connect_timeout(timeout);
    let _ = options.set_first_byte_timeout(timeout);
    let _ = options.set_between_bytes_timeout(timeout);
    let future = outgoing_handler::handle(outgoing, Some(options))?;
    if let Ok(stream) = body.write() {
        for chunk in request.body.chunks(WRITE_CHUNK) {
            if stream.blocking_write_and_flush(chunk).is_err() {
                break;
            }
        }
        // The stream (a child of the body) goes before the body is finished.
        drop(stream);
    }
    let _ = OutgoingBody::finish(body, None);
    let answer = loop {
        match future.get() {
            Some(answer) => break answer,
            None => future.subscribe().block(),
        }
    };
    drop(future);
    let response = match answer {
        Ok(Ok(response)) => response,
        Ok(Err(code)) => return Err(code),
        Err(()) => {
            return Err(ErrorCode::InternalError(Some(
                "response already taken".into(),
            )))
        }
    };
    let status = response.status();
    let headers = response.headers().entries();
    let mut kept = Vec::new();
    if request.max_body > 0 {
        if let Ok(incoming) = response.consume() {
            read_body(&incoming, request.max_body, &mut kept);
            drop(incoming);
        }
    }
    drop(response);
    Ok(Response {
        status,
        headers,
        body: kept,
    })
}

/// `headers` with a `content-length` of `len` added unless one is there.
///
/// Without it `wasi:http` sends the body chunked (`Transfer-Encoding:
/// chunked`), and a receiver that reads only `Content-Length` bodies (some
/// frameworks and proxies do) sees an empty request, which it may still
/// answer 2xx: the event would count as delivered with nothing delivered.
/// The body is always known in full before it is sent here, so its length
/// is always given.
pub fn with_content_length(headers: &[(String, Vec<u8>)], len: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = headers.to_vec();
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-length"))
    {
        out.push(("content-length".into(), len.to_string().into_bytes()));
    }
    out
}

/// Read up to `max` bytes of `body` into `out`; a failed or closed stream
/// ends the read (the status still decides).
fn read_body(body: &IncomingBody, max: usize, out: &mut Vec<u8>) {
    let Ok(stream) = body.stream() else {
        return;
    };
    while out.len() < max {
        let want = (max - out.len()).min(64 * 1024) as u64;
        match stream.blocking_read(want) {
            Ok(bytes) if bytes.is_empty() => break,
            Ok(bytes) => out.extend_from_slice(&bytes),
            Err(_) => break,
        }
    }
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_length_is_always_given() {
        let added = with_content_length(&[("a".into(), b"1".to_vec())], 42);
        assert_eq!(
            added,
            vec![
                ("a".to_string(), b"1".to_vec()),
                ("content-length".to_string(), b"42".to_vec())
            ]
        );
        let kept = with_content_length(&[("Content-Length".into(), b"7".to_vec())], 7);
        assert_eq!(kept.len(), 1);
    }

    #[test]
    fn url_forms() {
        let u = Url::parse("http://127.0.0.1:9090/hook?x=1#frag").unwrap();
        assert_eq!(
            (u.https, u.authority.as_str(), u.path_with_query.as_str()),
            (false, "127.0.0.1:9090", "/hook?x=1")
        );
        assert_eq!(Url::parse("https://h?q").unwrap().path_with_query, "/?q");
        assert!(Url::parse("ftp://h").is_err());
        assert!(Url::parse("http://u:p@h/")
            .unwrap_err()
            .contains("credentials"));
        assert!(Url::parse("http:///x").is_err());
        for url in [
            "http://127.0.0.1:9090/hook?x=1",
            "https://h/?q",
            "http://h/",
        ] {
            let parsed = Url::parse(url).unwrap();
            assert_eq!(parsed.to_text(), url);
            assert_eq!(parsed.to_string(), url);
        }
    }
}
