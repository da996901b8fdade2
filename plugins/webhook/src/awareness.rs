//! The awareness payload mode (`payload = "awareness"`): the body and headers
//! the awareness service POSTs to a subscription (its DeliveryEngine.ts
//! `attemptDelivery`), so a platform that received from the service receives
//! from outboxd unchanged.
//!
//! - Body: `{eventId, id, w3id, evaultPublicKey, data, schemaId, operation}`,
//!   compact, bytes as JavaScript's `JSON.stringify` writes them
//!   (`awareness_wire`), so a receiver that re-serializes the parsed body
//!   before verifying still matches.
//! - `content-type: application/json`, `x-aaas-event-id: <eventId>`, and,
//!   when a secret is set, `x-aaas-signature`: lower-case hex
//!   HMAC-SHA256 over the raw body, keyed with the secret string's own UTF-8
//!   bytes (Node's `createHmac("sha256", secret)`; no `whsec_` decoding).
//!
//! Pure functions of the event and the secret, so they are tested natively.

use awareness_wire::Packet;
use outboxd_sink::http::Url;
use outboxd_sink::pending::Header;
use outboxd_sink::Event;

use crate::cloudevents::{is_header_value, USER_AGENT};

/// What to do with one event in this mode.
#[derive(Debug)]
pub enum Prepared {
    /// POST these headers and body.
    Send(Vec<Header>, Vec<u8>),
    /// The event came from the platform this URL belongs to: not sent back
    /// to it (the service's ping-pong guard, IngestService.ts: a
    /// `requestingPlatform` with the target's origin).
    Echo,
}

/// The request for `event` to `target`; `Err` is why the event can never
/// be sent in this format (no `schemaid`, data that is not JSON, an id that
/// cannot be a header value), for a reject.
pub fn request(event: &Event, target: &Url, secret: Option<&[u8]>) -> Result<Prepared, String> {
    let packet = Packet::from_event(event)?;
    if is_echo(target, packet.requesting_platform) {
        return Ok(Prepared::Echo);
    }
    if !is_header_value(packet.event_id) {
        return Err(format!(
            "event id `{}` cannot be sent in the x-aaas-event-id header",
            packet.event_id.escape_default()
        ));
    }
    let body = awareness_wire::webhook_body(&packet);
    let mut headers: Vec<Header> = vec![
        ("content-type".into(), b"application/json".to_vec()),
        ("content-length".into(), body.len().to_string().into_bytes()),
        ("user-agent".into(), USER_AGENT.as_bytes().to_vec()),
        (
            "x-aaas-event-id".into(),
            packet.event_id.as_bytes().to_vec(),
        ),
    ];
    if let Some(secret) = secret {
        headers.push(("x-aaas-signature".into(), sign(secret, &body).into_bytes()));
    }
    Ok(Prepared::Send(headers, body))
}

/// True when `requesting_platform` has the origin of `target`.
fn is_echo(target: &Url, requesting_platform: Option<&str>) -> bool {
    let scheme = if target.https { "https" } else { "http" };
    let target = awareness_wire::origin(&format!("{scheme}://{}", target.authority));
    let from = requesting_platform.and_then(awareness_wire::origin);
    from.is_some() && from == target
}

/// Lower-case hex of HMAC-SHA256(`secret`, `body`).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = outboxd_sink::sign::hmac_sha256(secret, body);
    let mut out = String::with_capacity(digest.len() * 2);
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xF)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str) -> Event {
        let mut event = crate::cloudevents::tests::event();
        event.stream = "envelope-9".into();
        event.data = data.as_bytes().to_vec();
        event.extensions = vec![
            ("w3id".into(), "@owner".into()),
            ("schemaid".into(), "550e8400-schema".into()),
            ("operation".into(), "update".into()),
            ("requestingplatform".into(), "https://blabsy.example".into()),
        ];
        event
    }

    fn target(url: &str) -> Url {
        Url::parse(url).unwrap()
    }

    fn send(event: &Event, secret: Option<&[u8]>) -> (Vec<Header>, Vec<u8>) {
        match request(event, &target("http://127.0.0.1:9090/api/webhook"), secret).unwrap() {
            Prepared::Send(headers, body) => (headers, body),
            Prepared::Echo => panic!("not an echo"),
        }
    }

    fn get<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Body and signatures as Node.js 20 writes them:
    /// `JSON.stringify({eventId, id, w3id, evaultPublicKey: null, data,
    /// schemaId, operation})` and `crypto.createHmac("sha256", secret)
    /// .update(body).digest("hex")`.
    const NODE_BODY: &str = r#"{"eventId":"evt-1","id":"envelope-9","w3id":"@owner","evaultPublicKey":null,"data":{"name":"Zoë \"Z\"\n","n":[1,2.5]},"schemaId":"550e8400-schema","operation":"update"}"#;

    #[test]
    fn body_and_signature_match_the_services_reference() {
        let e = event(r#"{ "name": "Zo\u00eb \"Z\"\n", "n": [1.0, 2.50] }"#);
        let (headers, body) = send(&e, Some(b"whsec_not-decoded"));
        assert_eq!(std::str::from_utf8(&body).unwrap(), NODE_BODY);
        assert_eq!(
            get(&headers, "x-aaas-signature"),
            Some("22d0ba840d4ecf6836878025154a01ae75e37db7862b284ce3110939875f956c")
        );
        assert_eq!(
            sign("pässwörd".as_bytes(), NODE_BODY.as_bytes()),
            "d4c36431da397de4969c9db552f551894edb65e9ee944756cde634ea954ee4af"
        );
        assert_eq!(get(&headers, "content-type"), Some("application/json"));
        assert_eq!(get(&headers, "x-aaas-event-id"), Some("evt-1"));
        assert_eq!(
            get(&headers, "content-length").map(str::to_string),
            Some(NODE_BODY.len().to_string())
        );
    }

    #[test]
    fn no_secret_no_signature() {
        let (headers, _) = send(&event("{}"), None);
        assert_eq!(get(&headers, "x-aaas-signature"), None);
        assert_eq!(get(&headers, "x-aaas-event-id"), Some("evt-1"));
    }

    #[test]
    fn unsendable_events_are_refused() {
        let mut bad_id = event("{}");
        bad_id.id = "evt\r\n1".into();
        let to = target("http://h/");
        assert!(request(&bad_id, &to, None)
            .unwrap_err()
            .contains("x-aaas-event-id"));
        let mut no_schema = event("{}");
        no_schema.extensions.retain(|(n, _)| n != "schemaid");
        assert!(request(&no_schema, &to, None)
            .unwrap_err()
            .contains("schemaid"));
    }

    #[test]
    fn the_requesting_platform_is_not_sent_its_own_event() {
        // The event's requestingplatform is https://blabsy.example.
        let e = event("{}");
        for (url, echo) in [
            ("https://blabsy.example/api/webhook", true),
            ("https://BLABSY.example:443/other", true),
            ("http://blabsy.example/api/webhook", false),
            ("https://blabsy.example:8443/api/webhook", false),
            ("https://pictique.example/api/webhook", false),
        ] {
            let prepared = request(&e, &target(url), None).unwrap();
            assert_eq!(matches!(prepared, Prepared::Echo), echo, "{url}");
        }
        let mut unknown = event("{}");
        unknown
            .extensions
            .retain(|(n, _)| n != "requestingplatform");
        let prepared = request(&unknown, &target("https://blabsy.example/"), None).unwrap();
        assert!(matches!(prepared, Prepared::Send(..)));
    }
}
