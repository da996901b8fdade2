//! HTTP requests through `wasi:http/outgoing-handler`, many in flight at
//! once.
//!
//! Host resources are dropped children first (pollable, stream, body,
//! response): the host refuses to drop a resource whose children live.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingBody, Method, OutgoingBody, OutgoingRequest,
    RequestOptions, Scheme,
};
use wasip2::io::poll::{poll, Pollable};

use crate::config::Config;

/// Largest response body read; a document over this is an error.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// An answer: status and body.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// One request to send: method, path under the server's prefix, JSON body.
pub struct Request {
    pub method: Method,
    pub path: String,
    pub body: Option<Vec<u8>>,
}

/// Send `requests` all at once and wait for every answer together
/// (`wasi:io/poll`), so documents are marked concurrently. `results[i]`
/// answers `requests[i]`; `Err` is a transport failure, worded for a retry
/// reason.
pub fn send_all(config: &Config, requests: &[Request]) -> Vec<Result<Response, String>> {
    let started: Vec<Result<FutureIncomingResponse, String>> =
        requests.iter().map(|r| start(config, r)).collect();
    let mut out: Vec<Option<Result<Response, String>>> = started
        .iter()
        .map(|s| s.as_ref().err().map(|e| Err(e.clone())))
        .collect();
    loop {
        let waiting: Vec<usize> = (0..out.len()).filter(|i| out[*i].is_none()).collect();
        if waiting.is_empty() {
            break;
        }
        let ready = {
            let pollables: Vec<Pollable> = waiting
                .iter()
                .filter_map(|i| started[*i].as_ref().ok().map(|f| f.subscribe()))
                .collect();
            let refs: Vec<&Pollable> = pollables.iter().collect();
            poll(&refs)
        };
        for r in ready {
            let i = waiting[r as usize];
            if let Ok(future) = &started[i] {
                out[i] = Some(finish(future));
            }
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err("no response".into())))
        .collect()
}

/// Hands `r` to the host and writes its body; returns the response future.
fn start(config: &Config, r: &Request) -> Result<FutureIncomingResponse, String> {
    let headers = headers(config, r);
    let fields = Fields::from_list(&headers).map_err(|e| {
        format!(
            "request headers refused ({})",
            outboxd_sink::outcome::header_error_name(&e)
        )
    })?;
    let request = OutgoingRequest::new(fields);
    let scheme = if config.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let full_path = format!("{}{}", config.prefix, r.path);
    let accepted = request.set_method(&r.method).is_ok()
        && request.set_scheme(Some(&scheme)).is_ok()
        && request.set_authority(Some(&config.authority)).is_ok()
        && request.set_path_with_query(Some(&full_path)).is_ok();
    if !accepted {
        return Err("the host refused the configured url".into());
    }
    let outgoing = request
        .body()
        .map_err(|_| "the host gave the request no body".to_string())?;
    let options = RequestOptions::new();
    let _ = options.set_connect_timeout(Some(config.timeout_ns));
    let _ = options.set_first_byte_timeout(Some(config.timeout_ns));
    let _ = options.set_between_bytes_timeout(Some(config.timeout_ns));
    let future = outgoing_handler::handle(request, Some(options)).map_err(|e| transport(&e))?;
    if let Some(bytes) = &r.body {
        if let Ok(stream) = outgoing.write() {
            for chunk in bytes.chunks(4096) {
                if stream.blocking_write_and_flush(chunk).is_err() {
                    break; // the response says why
                }
            }
            drop(stream);
        }
    }
    let _ = OutgoingBody::finish(outgoing, None);
    Ok(future)
}

/// The headers of `r`. A body goes with its `content-length`: without one
/// `wasi:http` sends it chunked, which a receiver reading only
/// `Content-Length` bodies takes for an empty request.
fn headers(config: &Config, r: &Request) -> Vec<(String, Vec<u8>)> {
    let mut headers: Vec<(String, Vec<u8>)> = vec![("accept".into(), b"application/json".to_vec())];
    if let Some(body) = &r.body {
        headers.push(("content-type".into(), b"application/json".to_vec()));
        headers.push(("content-length".into(), body.len().to_string().into_bytes()));
    }
    if let Some(auth) = &config.authorization {
        headers.push(("authorization".into(), auth.as_bytes().to_vec()));
    }
    headers
}

/// The answer of a ready response future, its body read whole.
fn finish(future: &FutureIncomingResponse) -> Result<Response, String> {
    let response = match future.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(code))) => return Err(transport(&code)),
        _ => return Err("no response".into()),
    };
    let status = response.status();
    let incoming = response
        .consume()
        .map_err(|_| "response body unavailable".to_string())?;
    drop(response);
    let body = read_all(&incoming)?;
    drop(incoming);
    Ok(Response { status, body })
}

fn read_all(incoming: &IncomingBody) -> Result<Vec<u8>, String> {
    let stream = incoming
        .stream()
        .map_err(|_| "response body unavailable".to_string())?;
    let mut body = Vec::new();
    // An error is the stream closing: the body is complete.
    while let Ok(bytes) = stream.blocking_read(64 * 1024) {
        body.extend_from_slice(&bytes);
        if body.len() > MAX_BODY {
            return Err(format!("response body over {MAX_BODY} bytes"));
        }
    }
    Ok(body)
}

/// A transport error as a retry reason, ending in the `wasi:http` code as
/// the WIT spells it.
fn transport(code: &ErrorCode) -> String {
    let name = outboxd_sink::outcome::wit_name(code);
    match code {
        ErrorCode::ConnectionRefused => format!("connection refused ({name})"),
        ErrorCode::ConnectionTimeout => format!("connection timed out ({name})"),
        ErrorCode::HttpRequestDenied => {
            format!("request denied by the host (capabilities.http) ({name})")
        }
        _ => format!("HTTP transport error: {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_goes_with_its_length() {
        let pairs: Vec<(String, String)> = [("url", "http://127.0.0.1:5984"), ("database", "d")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = Config::parse(&pairs).unwrap();
        let get = |name: &str, r: &Request| {
            headers(&config, r)
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| String::from_utf8(v).unwrap())
        };
        let put = Request {
            method: Method::Put,
            path: "/d/x".into(),
            body: Some(b"{\"a\":1}".to_vec()),
        };
        assert_eq!(get("content-length", &put).as_deref(), Some("7"));
        let read = Request {
            method: Method::Get,
            path: "/d/x".into(),
            body: None,
        };
        assert_eq!(get("content-length", &read), None);
    }

    #[test]
    fn transport_errors_name_the_wit_code() {
        assert_eq!(
            transport(&ErrorCode::ConnectionRefused),
            "connection refused (connection-refused)"
        );
        assert_eq!(
            transport(&ErrorCode::HttpResponseTimeout),
            "HTTP transport error: HTTP-response-timeout"
        );
    }
}
