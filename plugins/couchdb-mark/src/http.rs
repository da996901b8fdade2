//! HTTP requests to the CouchDB server, all of a round in one host call
//! (`outboxd:sink/http-batch`): the host sends them at once over its
//! pooled client and answers each.

use crate::bindings::outboxd::sink::http_batch::{
    keep_response_headers, send_batch, Request as BatchRequest, RequestError,
};

use crate::config::Config;

/// Largest response body read; a document over this is an error.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// A request method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
}

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

/// Send `requests` all at once and wait for every answer together, so
/// documents are marked concurrently. `results[i]` answers `requests[i]`;
/// `Err` is a transport failure, worded for a retry reason.
pub fn send_all(config: &Config, requests: &[Request]) -> Vec<Result<Response, String>> {
    let scheme = if config.https { "https" } else { "http" };
    let built: Vec<BatchRequest> = requests
        .iter()
        .map(|r| BatchRequest {
            method: match r.method {
                Method::Get => "GET".into(),
                Method::Put => "PUT".into(),
            },
            url: format!("{scheme}://{}{}{}", config.authority, config.prefix, r.path),
            headers: headers(config, r),
            body: r.body.clone().unwrap_or_default(),
            timeout_ms: Some(config.timeout_ns / 1_000_000),
            // One byte past the bound tells a document over it.
            keep_body_bytes: (MAX_BODY + 1) as u32,
        })
        .collect();
    if built.is_empty() {
        return Vec::new();
    }
    // No response header is read: CouchDB's eight are left in the host.
    keep_response_headers(&[]);
    send_batch(&built)
        .into_iter()
        .map(|answer| match answer {
            Ok(r) if r.body.len() > MAX_BODY => Err(format!("response body over {MAX_BODY} bytes")),
            Ok(r) => Ok(Response {
                status: r.status,
                body: r.body,
            }),
            Err(e) => Err(transport(&e)),
        })
        .collect()
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

/// A transport error as a retry reason, ending in the `wasi:http` code as
/// the WIT spells it.
fn transport(error: &RequestError) -> String {
    let name = error.code.as_str();
    match name {
        "connection-refused" => format!("connection refused ({name})"),
        "connection-timeout" => format!("connection timed out ({name})"),
        "HTTP-request-denied" => {
            format!("request denied by the host (capabilities.http) ({name})")
        }
        "forbidden" | "invalid-syntax" => format!("request headers refused ({name})"),
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
        let error = |code: &str| RequestError {
            code: code.into(),
            message: String::new(),
        };
        assert_eq!(
            transport(&error("connection-refused")),
            "connection refused (connection-refused)"
        );
        assert_eq!(
            transport(&error("HTTP-response-timeout")),
            "HTTP transport error: HTTP-response-timeout"
        );
    }
}
