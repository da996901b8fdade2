//! The request headers for one event: the CloudEvents HTTP binary binding
//! (CloudEvents HTTP Protocol Binding 1.0.2, §3.1) and the Standard Webhooks
//! signature (<https://www.standardwebhooks.com/>, "Signature scheme").
//!
//! Pure functions of the event, the key and the timestamp, so they are tested
//! natively.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use outboxd_sink::pending::Header;
use outboxd_sink::Event;

/// Sent as `user-agent`.
pub const USER_AGENT: &str = concat!("outboxd-webhook/", env!("CARGO_PKG_VERSION"));

/// Whether `name` (lower-case) is an attribute this sink writes from the
/// event's own fields. An extension of the same name is not sent again: the
/// event's field is the one that counts.
fn is_own_attribute(name: &str) -> bool {
    matches!(
        name,
        "specversion"
            | "id"
            | "source"
            | "type"
            | "subject"
            | "time"
            | "datacontenttype"
            | "dataschema"
            | "data"
            | "partitionkey"
            | "sequence"
    )
}

/// All headers of the POST for `event`, signed with `key` at `timestamp`
/// (unix seconds), and with `previous` too while a secret rotation keeps the
/// old one valid: `webhook-signature` then carries both, space-separated,
/// the new one first (the scheme lets a header carry several).
///
/// `Err` holds the reason the event can never be sent as it is (a
/// `datacontenttype` or extension name that cannot be an HTTP header); the
/// caller rejects the event with it.
pub fn headers(
    event: &Event,
    key: &[u8],
    previous: Option<&[u8]>,
    timestamp: u64,
) -> Result<Vec<Header>, String> {
    let mut headers: Vec<Header> = Vec::with_capacity(16 + event.extensions.len());
    let add = |headers: &mut Vec<Header>, name: &str, value: String| {
        headers.push((name.to_string(), value.into_bytes()))
    };

    add(&mut headers, "ce-specversion", "1.0".into());
    add(&mut headers, "ce-id", percent_encode(&event.id));
    add(&mut headers, "ce-source", percent_encode(&event.source));
    add(&mut headers, "ce-type", percent_encode(&event.type_));
    if let Some(subject) = &event.subject {
        add(&mut headers, "ce-subject", percent_encode(subject));
    }
    add(&mut headers, "ce-time", percent_encode(&event.time));
    add(
        &mut headers,
        "ce-partitionkey",
        percent_encode(&event.stream),
    );
    add(&mut headers, "ce-sequence", event.sequence.to_string());
    if let Some(schema) = &event.dataschema {
        add(&mut headers, "ce-dataschema", percent_encode(schema));
    }
    for (name, value) in &event.extensions {
        if name.is_empty() || !name.bytes().all(is_token_char) {
            return Err(format!(
                "extension name `{}` cannot be an HTTP header name",
                name.escape_default()
            ));
        }
        // CloudEvents names are lower-case already (§3.1.1 of the spec);
        // only another producer's name is lowered here.
        let lowered;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = name.to_ascii_lowercase();
            lowered.as_str()
        } else {
            name.as_str()
        };
        if is_own_attribute(name) {
            continue;
        }
        let mut header = String::with_capacity(3 + name.len());
        header.push_str("ce-");
        header.push_str(name);
        headers.push((header, percent_encode(value).into_bytes()));
    }

    if let Some(content_type) = &event.datacontenttype {
        if !is_header_value(content_type) {
            return Err("datacontenttype is not a valid HTTP header value".into());
        }
        add(&mut headers, "content-type", content_type.clone());
    }
    add(&mut headers, "content-length", event.data.len().to_string());
    add(&mut headers, "user-agent", USER_AGENT.into());

    // The signed id is the header value as sent, so a receiver that verifies
    // from the headers always agrees with the signature.
    let webhook_id = percent_encode(&event.id);
    let content = signed_content(&webhook_id, timestamp, &event.data);
    let mut signature = sign(key, &content);
    if let Some(previous) = previous {
        signature.push(' ');
        signature.push_str(&sign(previous, &content));
    }
    add(&mut headers, "webhook-id", webhook_id);
    add(&mut headers, "webhook-timestamp", timestamp.to_string());
    add(&mut headers, "webhook-signature", signature);
    Ok(headers)
}

/// What a Standard Webhooks signature covers: `{id}.{timestamp}.{body}`.
/// Built once per request, whatever the number of keys signing it.
pub fn signed_content(id: &str, timestamp: u64, body: &[u8]) -> Vec<u8> {
    let timestamp = timestamp.to_string();
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + 2 + body.len());
    for part in [id.as_bytes(), b".", timestamp.as_bytes(), b".", body] {
        content.extend_from_slice(part);
    }
    content
}

/// `v1,<base64 of HMAC-SHA256(key, content)>`, the Standard Webhooks
/// signature of [`signed_content`], computed by the host
/// (`outboxd_sink::sign`).
pub fn sign(key: &[u8], content: &[u8]) -> String {
    let mac = outboxd_sink::sign::hmac_sha256(key, content);
    let mut signature = String::with_capacity(3 + 44);
    signature.push_str("v1,");
    STANDARD.encode_string(mac, &mut signature);
    signature
}

/// Percent-encodes an attribute value for a header (CloudEvents HTTP binding
/// §3.1.3.2): every UTF-8 byte outside printable ASCII U+0021..U+007E, and
/// space, `"` and `%`, becomes `%XY`.
pub fn percent_encode(value: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let kept = |byte: u8| KEPT[usize::from(byte)];
    // Most values need nothing encoded: one copy, not a push per byte.
    if value.bytes().all(kept) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for byte in value.bytes() {
        if kept(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        }
    }
    out
}

/// The bytes [`percent_encode`] keeps as they are: printable ASCII
/// U+0021..U+007E but `"` and `%`. A table, since every byte of every
/// attribute value of every request is looked up in it.
static KEPT: [bool; 256] = {
    let mut kept = [false; 256];
    let mut byte = 0x21;
    while byte <= 0x7E {
        kept[byte] = byte != b'"' as usize && byte != b'%' as usize;
        byte += 1;
    }
    kept
};

/// `tchar` of RFC 9110 §5.6.2, the characters of a header name.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII, space and tab, no surrounding whitespace (RFC 9110 §5.5,
/// without obsolete text).
pub fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || b == b' ' || b.is_ascii_graphic())
        && value.trim_matches([' ', '\t']).len() == value.len()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An event for the header tests (also the awareness mode's).
    pub(crate) fn event() -> Event {
        Event {
            id: "evt-1".into(),
            source: "/orders".into(),
            type_: "order.created".into(),
            subject: None,
            stream: "order-7".into(),
            sequence: 42,
            time: "2026-11-30T01:02:03.456Z".into(),
            datacontenttype: Some("application/json".into()),
            dataschema: None,
            data: b"{}".to_vec(),
            extensions: vec![("traceparent".into(), "00-ab cd-\"x\"-%".into())],
            attempt: 1,
            ingested_at: "2026-11-30T01:02:03.456789Z".into(),
        }
    }

    fn get<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    #[test]
    fn standard_webhooks_reference_signature() {
        // The reference vector of the Standard Webhooks libraries.
        let key: Vec<u8> = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            sign(
                &key,
                &signed_content(
                    "msg_p5jXN8AQM9LWM0D4loKWxJek",
                    1614265330,
                    br#"{"test": 2432232314}"#
                )
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn binary_binding_headers() {
        let key = b"key".to_vec();
        let headers = headers(&event(), &key, None, 1_700_000_000).unwrap();
        assert_eq!(get(&headers, "ce-specversion"), Some("1.0"));
        assert_eq!(get(&headers, "ce-id"), Some("evt-1"));
        assert_eq!(get(&headers, "ce-type"), Some("order.created"));
        assert_eq!(get(&headers, "ce-partitionkey"), Some("order-7"));
        assert_eq!(get(&headers, "ce-sequence"), Some("42"));
        assert_eq!(get(&headers, "ce-subject"), None);
        assert_eq!(
            get(&headers, "ce-traceparent"),
            Some("00-ab%20cd-%22x%22-%25")
        );
        assert_eq!(get(&headers, "content-type"), Some("application/json"));
        assert_eq!(get(&headers, "content-length"), Some("2"));
        assert_eq!(get(&headers, "webhook-id"), Some("evt-1"));
        assert_eq!(get(&headers, "webhook-timestamp"), Some("1700000000"));
        assert_eq!(
            get(&headers, "webhook-signature").map(String::from),
            Some(sign(&key, &signed_content("evt-1", 1_700_000_000, b"{}")))
        );
    }

    #[test]
    fn rotation_signs_with_both_secrets_new_first() {
        let new = b"new key".to_vec();
        let old = b"old key".to_vec();
        let headers = headers(&event(), &new, Some(&old), 1_700_000_000).unwrap();
        assert_eq!(
            get(&headers, "webhook-signature").map(String::from),
            Some(format!(
                "{} {}",
                sign(&new, &signed_content("evt-1", 1_700_000_000, b"{}")),
                sign(&old, &signed_content("evt-1", 1_700_000_000, b"{}"))
            ))
        );
        assert_eq!(
            headers
                .iter()
                .filter(|(n, _)| n == "webhook-signature")
                .count(),
            1
        );
    }

    #[test]
    fn own_attributes_win_over_extensions() {
        let key = b"key".to_vec();
        let mut event = event();
        event.extensions = vec![
            ("Sequence".into(), "1".into()),
            ("Tenant".into(), "a".into()),
        ];
        let headers = headers(&event, &key, None, 0).unwrap();
        assert_eq!(
            headers.iter().filter(|(n, _)| n == "ce-sequence").count(),
            1
        );
        assert_eq!(get(&headers, "ce-tenant"), Some("a"));
    }

    #[test]
    fn unsendable_events_are_refused() {
        let key = b"key".to_vec();
        let mut bad_name = event();
        bad_name.extensions = vec![("a b".into(), "x".into())];
        assert!(headers(&bad_name, &key, None, 0).is_err());
        let mut bad_type = event();
        bad_type.datacontenttype = Some("text/plain\r\nx-injected: 1".into());
        assert!(headers(&bad_type, &key, None, 0).is_err());
    }

    #[test]
    fn the_kept_bytes_are_printable_ascii_but_quote_and_percent() {
        for byte in 0..=255u8 {
            let printable = (0x21..=0x7E).contains(&byte);
            assert_eq!(
                KEPT[usize::from(byte)],
                printable && byte != b'"' && byte != b'%',
                "byte {byte:#04x}"
            );
        }
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("a-Z_0~!"), "a-Z_0~!");
        assert_eq!(percent_encode("é €"), "%C3%A9%20%E2%82%AC");
        assert_eq!(percent_encode("\"%\r\n"), "%22%25%0D%0A");
    }
}
