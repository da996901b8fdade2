//! What an HTTP response or a transport error means for the event:
//! delivered, retry (with the target's `Retry-After` hint) or reject.
//!
//! | answer                                   | outcome                                  |
//! |------------------------------------------|------------------------------------------|
//! | 2xx                                      | `delivered`                              |
//! | 408, 425, 429, 5xx                       | `retry`, reason `HTTP <status>`          |
//! | any other status (4xx, 1xx, 3xx)         | `reject`, `HTTP <status>: <body start>`  |
//! | transport error (`wasi:http` error-code) | `retry`, reason naming the error         |

use std::time::{Duration, SystemTime};

use wasip2::http::types::{ErrorCode, HeaderError};

use crate::{Outcome, RetryInfo};

/// Characters of the response body quoted in a reject reason.
const REASON_BODY_CHARS: usize = 200;

/// Bytes of the response body worth keeping for a reject reason: enough for
/// [`REASON_BODY_CHARS`] characters of UTF-8 however they are cut.
pub const REASON_BODY_BYTES: usize = 1024;

/// How a status code is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Delivered,
    Retry,
    Reject,
}

/// Classifies an HTTP status (RFC 9110 §15). 408 Request Timeout, 425 Too
/// Early and 429 Too Many Requests say "not now" and are retried with the
/// server errors; redirects are not followed and count as refusals.
pub fn classify(status: u16) -> Class {
    match status {
        200..=299 => Class::Delivered,
        408 | 425 | 429 | 500..=599 => Class::Retry,
        _ => Class::Reject,
    }
}

/// The outcome for a response with `status`, its `Retry-After` header value
/// and the start of its body; `now` is the time since the unix epoch.
pub fn for_response(
    status: u16,
    retry_after: Option<&[u8]>,
    body: &[u8],
    now: Duration,
) -> Outcome {
    match classify(status) {
        Class::Delivered => Outcome::Delivered,
        Class::Retry => Outcome::Retry(RetryInfo {
            reason: format!("HTTP {status}"),
            after_ms: retry_after.and_then(|value| retry_after_ms(value, now)),
        }),
        Class::Reject => Outcome::Reject(reject_reason(status, body)),
    }
}

/// `HTTP <status>: <first 200 characters of the body>`, decoded as lossy
/// UTF-8, control characters turned to spaces so the reason stays one line.
pub fn reject_reason(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let quoted: String = text
        .chars()
        .take(REASON_BODY_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match quoted.trim() {
        "" => format!("HTTP {status}"),
        quoted => format!("HTTP {status}: {quoted}"),
    }
}

/// Milliseconds to wait from a `Retry-After` value (RFC 9110 §10.2.3):
/// delta-seconds, or an HTTP-date taken relative to `now` and clamped at 0.
/// `None` when the value is neither.
pub fn retry_after_ms(value: &[u8], now: Duration) -> Option<u64> {
    let value = std::str::from_utf8(value).ok()?.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is "a very long time", not an error.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(seconds.saturating_mul(1000));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at = at.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let wait = at.saturating_sub(now).as_millis();
    Some(u64::try_from(wait).unwrap_or(u64::MAX))
}

/// A `retry` outcome without a hint.
pub fn retry(reason: impl Into<String>) -> Outcome {
    Outcome::Retry(RetryInfo {
        reason: reason.into(),
        after_ms: None,
    })
}

/// A `retry` outcome for a request that failed before a response arrived.
pub fn transport_error(code: &ErrorCode) -> Outcome {
    retry(describe(code))
}

/// A short operator-facing account of a `wasi:http` error code, ending in
/// the code as the WIT spells it: `connection refused (connection-refused)`,
/// `request denied by host policy (HTTP-request-denied)`.
pub fn describe(code: &ErrorCode) -> String {
    format!("{} ({})", prose(code), wit_name(code))
}

/// The case name of a `wasi:http/types.error-code` as the WIT spells it
/// (WASI 0.2 `wasi:http/types`, `variant error-code`), payload left out:
/// `connection-refused`, `HTTP-request-denied`, `DNS-error`. The name
/// docs/plugins.md and the host's log use; Rust's `Debug` text
/// (`ErrorCode::ConnectionRefused`) is neither.
pub fn wit_name(code: &ErrorCode) -> &'static str {
    use ErrorCode as E;
    match code {
        E::DnsTimeout => "DNS-timeout",
        E::DnsError(_) => "DNS-error",
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
        E::TlsAlertReceived(_) => "TLS-alert-received",
        E::HttpRequestDenied => "HTTP-request-denied",
        E::HttpRequestLengthRequired => "HTTP-request-length-required",
        E::HttpRequestBodySize(_) => "HTTP-request-body-size",
        E::HttpRequestMethodInvalid => "HTTP-request-method-invalid",
        E::HttpRequestUriInvalid => "HTTP-request-URI-invalid",
        E::HttpRequestUriTooLong => "HTTP-request-URI-too-long",
        E::HttpRequestHeaderSectionSize(_) => "HTTP-request-header-section-size",
        E::HttpRequestHeaderSize(_) => "HTTP-request-header-size",
        E::HttpRequestTrailerSectionSize(_) => "HTTP-request-trailer-section-size",
        E::HttpRequestTrailerSize(_) => "HTTP-request-trailer-size",
        E::HttpResponseIncomplete => "HTTP-response-incomplete",
        E::HttpResponseHeaderSectionSize(_) => "HTTP-response-header-section-size",
        E::HttpResponseHeaderSize(_) => "HTTP-response-header-size",
        E::HttpResponseBodySize(_) => "HTTP-response-body-size",
        E::HttpResponseTrailerSectionSize(_) => "HTTP-response-trailer-section-size",
        E::HttpResponseTrailerSize(_) => "HTTP-response-trailer-size",
        E::HttpResponseTransferCoding(_) => "HTTP-response-transfer-coding",
        E::HttpResponseContentCoding(_) => "HTTP-response-content-coding",
        E::HttpResponseTimeout => "HTTP-response-timeout",
        E::HttpUpgradeFailed => "HTTP-upgrade-failed",
        E::HttpProtocolError => "HTTP-protocol-error",
        E::LoopDetected => "loop-detected",
        E::ConfigurationError => "configuration-error",
        E::InternalError(_) => "internal-error",
    }
}

/// The case name of a `wasi:http/types.header-error` as the WIT spells it
/// (WASI 0.2 `wasi:http/types`, `variant header-error`): `invalid-syntax`
/// (a name or value that is not a valid header), `forbidden` (a header
/// the host sets itself) or `immutable`. For a reason naming why
/// `fields.from-list` refused a request's headers, where Rust's `Debug`
/// text would say `HeaderError::Forbidden`.
pub fn header_error_name(error: &HeaderError) -> &'static str {
    match error {
        HeaderError::InvalidSyntax => "invalid-syntax",
        HeaderError::Forbidden => "forbidden",
        HeaderError::Immutable => "immutable",
    }
}

/// What [`describe`] says before the code.
fn prose(code: &ErrorCode) -> String {
    use ErrorCode as E;
    let text = match code {
        E::DnsTimeout => "DNS timeout",
        E::DnsError(payload) => {
            return match &payload.rcode {
                Some(rcode) => format!("DNS error ({})", clip(rcode)),
                None => "DNS error".into(),
            }
        }
        E::DestinationNotFound => "destination not found",
        E::DestinationUnavailable => "destination unavailable",
        E::DestinationIpProhibited => "destination IP prohibited",
        E::DestinationIpUnroutable => "destination IP unroutable",
        E::ConnectionRefused => "connection refused",
        E::ConnectionTerminated => "connection terminated",
        E::ConnectionTimeout => "connection timeout",
        // The three ways a receiver holds a request, as outboxd's host
        // reports them (its log line gives the figures).
        E::ConnectionReadTimeout => "response stalled: no byte within the between-bytes timeout",
        E::ConnectionWriteTimeout => "connection write timeout",
        E::ConnectionLimitReached => "connection limit reached",
        E::TlsProtocolError => "TLS protocol error",
        E::TlsCertificateError => "TLS certificate error",
        E::TlsAlertReceived(payload) => {
            return match &payload.alert_message {
                Some(message) => format!("TLS alert received: {}", clip(message)),
                None => "TLS alert received".into(),
            }
        }
        E::HttpRequestDenied => "request denied by host policy",
        E::HttpRequestLengthRequired => "request length required",
        E::HttpRequestBodySize(_) => "request body size",
        E::HttpRequestMethodInvalid => "request method invalid",
        E::HttpRequestUriInvalid => "request URI invalid",
        E::HttpRequestUriTooLong => "request URI too long",
        E::HttpRequestHeaderSectionSize(_) => "request header section too large",
        E::HttpRequestHeaderSize(_) => "request header too large",
        E::HttpRequestTrailerSectionSize(_) => "request trailer section too large",
        E::HttpRequestTrailerSize(_) => "request trailer too large",
        E::HttpResponseIncomplete => {
            "response incomplete: cut off, or unfinished before the batch deadline"
        }
        E::HttpResponseHeaderSectionSize(_) => "response header section too large",
        E::HttpResponseHeaderSize(_) => "response header too large",
        E::HttpResponseBodySize(_) => "response body size",
        E::HttpResponseTrailerSectionSize(_) => "response trailer section too large",
        E::HttpResponseTrailerSize(_) => "response trailer too large",
        E::HttpResponseTransferCoding(_) => "response transfer coding",
        E::HttpResponseContentCoding(_) => "response content coding",
        E::HttpResponseTimeout => "no response within the first-byte timeout",
        E::HttpUpgradeFailed => "HTTP upgrade failed",
        E::HttpProtocolError => "HTTP protocol error",
        E::LoopDetected => "loop detected",
        E::ConfigurationError => "HTTP configuration error",
        E::InternalError(message) => {
            return match message {
                Some(message) => format!("internal HTTP error: {}", clip(message)),
                None => "internal HTTP error".into(),
            }
        }
    };
    text.to_string()
}

/// `N events: D delivered, R to retry, J rejected`, for a sink's debug log.
pub fn summary(outcomes: &[Outcome]) -> String {
    let (mut delivered, mut retry, mut reject) = (0, 0, 0);
    for outcome in outcomes {
        match outcome {
            Outcome::Delivered => delivered += 1,
            Outcome::Retry(_) => retry += 1,
            Outcome::Reject(_) => reject += 1,
        }
    }
    format!(
        "{} events: {delivered} delivered, {retry} to retry, {reject} rejected",
        outcomes.len()
    )
}

/// At most 200 characters of a host-provided message, on one line.
fn clip(message: &str) -> String {
    message
        .chars()
        .take(REASON_BODY_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT

    #[test]
    fn statuses() {
        assert_eq!(classify(200), Class::Delivered);
        assert_eq!(classify(204), Class::Delivered);
        for status in [408, 425, 429, 500, 503, 599] {
            assert_eq!(classify(status), Class::Retry, "{status}");
        }
        for status in [100, 301, 400, 401, 404, 409, 410, 413, 600] {
            assert_eq!(classify(status), Class::Reject, "{status}");
        }
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(retry_after_ms(b"120", NOW), Some(120_000));
        assert_eq!(retry_after_ms(b" 0 ", NOW), Some(0));
        assert_eq!(
            retry_after_ms(b"99999999999999999999999", NOW),
            Some(u64::MAX)
        );
        assert_eq!(
            retry_after_ms(b"Wed, 21 Oct 2015 07:28:30 GMT", NOW),
            Some(30_000)
        );
        assert_eq!(
            retry_after_ms(b"Wed, 21 Oct 2015 07:27:00 GMT", NOW),
            Some(0)
        );
        assert_eq!(retry_after_ms(b"-5", NOW), None);
        assert_eq!(retry_after_ms(b"soon", NOW), None);
        assert_eq!(retry_after_ms(&[0xff, 0x31], NOW), None);
    }

    #[test]
    fn retry_carries_the_hint() {
        match for_response(503, Some(b"7"), b"", NOW) {
            Outcome::Retry(info) => {
                assert_eq!(info.reason, "HTTP 503");
                assert_eq!(info.after_ms, Some(7000));
            }
            _ => panic!("503 must be retried"),
        }
    }

    #[test]
    fn error_codes_are_named_as_the_wit_spells_them() {
        assert_eq!(
            describe(&ErrorCode::ConnectionRefused),
            "connection refused (connection-refused)"
        );
        assert_eq!(
            describe(&ErrorCode::HttpRequestDenied),
            "request denied by host policy (HTTP-request-denied)"
        );
        assert_eq!(
            wit_name(&ErrorCode::HttpRequestUriInvalid),
            "HTTP-request-URI-invalid"
        );
        assert_eq!(header_error_name(&HeaderError::Forbidden), "forbidden");
        assert_eq!(
            header_error_name(&HeaderError::InvalidSyntax),
            "invalid-syntax"
        );
        let internal = describe(&ErrorCode::InternalError(Some("boom".into())));
        assert_eq!(internal, "internal HTTP error: boom (internal-error)");
    }

    #[test]
    fn reject_quotes_the_body() {
        assert_eq!(reject_reason(404, b""), "HTTP 404");
        assert_eq!(
            reject_reason(400, b"bad\r\nthing\xff"),
            "HTTP 400: bad  thing\u{fffd}"
        );
        let long = "é".repeat(500);
        let reason = reject_reason(422, long.as_bytes());
        assert_eq!(reason.chars().count(), "HTTP 422: ".len() + 200);
    }
}
