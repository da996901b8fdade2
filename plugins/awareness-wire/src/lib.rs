//! The awareness service's wire shapes, shared by the `awareness` sink (the
//! vault dispatcher's `POST /ingest`) and the `webhook` sink's awareness
//! payload mode (the service's deliveries to platforms).
//!
//! - [`Packet`]: an outboxd event read by the shared mapping (docs/awareness.md):
//!   `id` is the `eventId`, the stream the packet `id`, `sequence` the
//!   `streamVersion`, `time` the `occurredAt`, `data` the JSON `data`, and
//!   the extensions `w3id`, `evaultpublickey`, `schemaid`, `operation`,
//!   `requestingplatform`.
//! - [`ingest_body`] and [`webhook_body`]: the two JSON bodies, keys in the
//!   service's order, written by [`json`] byte for byte as JavaScript's
//!   `JSON.stringify` writes the parsed object.
//!
//! Pure functions of the event, so they are tested natively.
//!
//! Must never: send anything, or read configuration; the sinks do.

pub mod json;

use outboxd_sink::Event;
use serde_json::Value;

/// CloudEvents extension attribute names of the packet fields that have no
/// CloudEvents attribute of their own (lower-case letters and digits, as
/// CloudEvents 1.0 §3.1.1 requires).
pub mod extension {
    /// The vault owner's W3ID (eName), `w3id`.
    pub const W3ID: &str = "w3id";
    /// The vault's public key, `evaultPublicKey`.
    pub const EVAULT_PUBLIC_KEY: &str = "evaultpublickey";
    /// The ontology of the MetaEnvelope, `schemaId`.
    pub const SCHEMA_ID: &str = "schemaid";
    /// `create`, `update` or `delete`, `operation`.
    pub const OPERATION: &str = "operation";
    /// The platform whose request caused the change, `requestingPlatform`.
    pub const REQUESTING_PLATFORM: &str = "requestingplatform";
}

/// The `operation` the service assumes when a packet has none
/// (`payload.operation ?? "create"` in its IngestService.ts).
pub const DEFAULT_OPERATION: &str = "create";

/// An event's awareness packet fields, borrowed from the event.
#[derive(Debug, Clone, PartialEq)]
pub struct Packet<'e> {
    /// `eventId`: the event's `id`.
    pub event_id: &'e str,
    /// `id`, the packet (MetaEnvelope) id: the event's stream.
    pub packet_id: &'e str,
    /// `w3id`, from the extension of that name.
    pub w3id: Option<&'e str>,
    /// `evaultPublicKey`, from the `evaultpublickey` extension.
    pub evault_public_key: Option<&'e str>,
    /// `schemaId`, from the `schemaid` extension; the service requires it.
    pub schema_id: &'e str,
    /// `operation`, from the extension of that name.
    pub operation: Option<&'e str>,
    /// `requestingPlatform`, from the `requestingplatform` extension.
    pub requesting_platform: Option<&'e str>,
    /// `occurredAt`: the event's `time` (RFC 3339).
    pub occurred_at: &'e str,
    /// `streamVersion`: the event's `sequence`.
    pub stream_version: u64,
    /// `data`: the event's data parsed as JSON; `null` when it is empty.
    pub data: Value,
    /// Bytes of the event's data as it came, to size the body before it
    /// is written (written compactly, the data is seldom longer).
    pub data_bytes: usize,
}

impl<'e> Packet<'e> {
    /// Reads `event` by the mapping. `Err` is why the event can never be
    /// sent as an awareness packet (no `schemaid` extension, data that is
    /// not JSON); the sink rejects the event with it.
    pub fn from_event(event: &'e Event) -> Result<Packet<'e>, String> {
        let schema_id = find(event, extension::SCHEMA_ID).ok_or_else(|| {
            format!(
                "event {} has no `{}` extension: the awareness service requires schemaId (it answers 400 without it)",
                event.id,
                extension::SCHEMA_ID
            )
        })?;
        let data = if event.data.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            json::parse(&event.data).map_err(|err| {
                format!(
                    "event {}: data is not JSON the awareness payload can carry: {err}",
                    event.id
                )
            })?
        };
        Ok(Packet {
            event_id: &event.id,
            packet_id: &event.stream,
            w3id: find(event, extension::W3ID),
            evault_public_key: find(event, extension::EVAULT_PUBLIC_KEY),
            schema_id,
            operation: find(event, extension::OPERATION),
            requesting_platform: find(event, extension::REQUESTING_PLATFORM),
            occurred_at: &event.time,
            stream_version: event.sequence,
            data,
            data_bytes: event.data.len(),
        })
    }
}

/// The value of extension `name`, matched without regard to ASCII case.
fn find<'e>(event: &'e Event, name: &str) -> Option<&'e str> {
    event
        .extensions
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The `POST /ingest` body the vault's dispatcher sends
/// (awareness-outbox-dispatcher.ts `deliver`): `{eventId, id, w3id,
/// evaultPublicKey, data, schemaId, operation, requestingPlatform,
/// occurredAt, streamVersion}`. An absent field is `null`, as the dispatcher
/// sends an absent `evaultPublicKey` or `requestingPlatform`; the service
/// reads each with `?? null` (and `operation ?? "create"`).
pub fn ingest_body(packet: &Packet<'_>) -> Vec<u8> {
    let mut out = common_fields(packet);
    out.optional("operation", packet.operation);
    out.optional("requestingPlatform", packet.requesting_platform);
    out.string("occurredAt", packet.occurred_at);
    out.integer("streamVersion", packet.stream_version);
    out.finish()
}

/// The body the awareness service POSTs to a subscription (DeliveryEngine.ts
/// `attemptDelivery`, the payload IngestService.ts stores): `{eventId, id,
/// w3id, evaultPublicKey, data, schemaId, operation}`, with the service's
/// defaults: absent `w3id` and `evaultPublicKey` are `null`, an absent
/// `operation` is `"create"`.
pub fn webhook_body(packet: &Packet<'_>) -> Vec<u8> {
    let mut out = common_fields(packet);
    out.string("operation", packet.operation.unwrap_or(DEFAULT_OPERATION));
    out.finish()
}

/// Bytes the ingest body takes, keys and values, when its data is written
/// no longer than it came (compact JSON): the body is written without
/// growing.
fn body_capacity(packet: &Packet<'_>) -> usize {
    let text = [
        Some(packet.event_id),
        Some(packet.packet_id),
        packet.w3id,
        packet.evault_public_key,
        Some(packet.schema_id),
        packet.operation,
        packet.requesting_platform,
        Some(packet.occurred_at),
    ];
    BODY_KEYS_BYTES + packet.data_bytes + text.iter().flatten().map(|s| s.len()).sum::<usize>()
}

/// Room for the ingest body's keys, quotes, separators, `null`s and the
/// `streamVersion` digits, beside its values: about 185 bytes at most.
/// Values that need escaping, or numbers written longer than they came
/// (`1.5e300` is written `1.5e+300`), make the body grow as it is written.
const BODY_KEYS_BYTES: usize = 192;

/// `eventId, id, w3id, evaultPublicKey, data, schemaId`: the six keys both
/// bodies open with, in that order.
fn common_fields(packet: &Packet<'_>) -> json::Object {
    let mut out = json::Object::with_capacity(body_capacity(packet));
    out.string("eventId", packet.event_id);
    out.string("id", packet.packet_id);
    out.optional("w3id", packet.w3id);
    out.optional("evaultPublicKey", packet.evault_public_key);
    out.value("data", &packet.data);
    out.string("schemaId", packet.schema_id);
    out
}

/// The origin of an `http://` or `https://` URL as the service compares
/// them (`new URL(url).origin`, IngestService.ts `safeOrigin`):
/// `scheme://host[:port]`, scheme and host lower-case, no user info, the
/// scheme's default port (80, 443) left out. `None` when `url` is not such a
/// URL; the service then filters nothing.
pub fn origin(url: &str) -> Option<String> {
    let url = url.trim();
    let (scheme, rest, default_port) = if let Some(rest) = strip_scheme(url, "https://") {
        ("https", rest, 443)
    } else if let Some(rest) = strip_scheme(url, "http://") {
        ("http", rest, 80)
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = match host_port.rfind(':') {
        Some(i) if !host_port[i..].contains(']') => (&host_port[..i], &host_port[i + 1..]),
        _ => (host_port, ""),
    };
    if host.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let host = host.to_ascii_lowercase();
    let port = match port {
        "" => None,
        digits => Some(digits.parse::<u16>().ok()?),
    };
    Some(match port {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

fn strip_scheme<'u>(url: &'u str, scheme: &str) -> Option<&'u str> {
    let head = url.get(..scheme.len())?;
    head.eq_ignore_ascii_case(scheme)
        .then(|| &url[scheme.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(extensions: &[(&str, &str)], data: &[u8]) -> Event {
        Event {
            id: "evt-1".into(),
            source: "neo4j://vault".into(),
            type_: "awareness.update".into(),
            subject: None,
            stream: "envelope-9".into(),
            sequence: 3,
            time: "2026-11-30T01:02:03.456Z".into(),
            datacontenttype: Some("application/json".into()),
            dataschema: None,
            data: data.to_vec(),
            extensions: extensions
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            attempt: 1,
            ingested_at: "2026-11-30T01:02:03.456789Z".into(),
        }
    }

    const ALL: [(&str, &str); 5] = [
        ("w3id", "@owner"),
        ("evaultpublickey", "z6Mk"),
        ("schemaid", "550e8400-schema"),
        ("operation", "update"),
        ("requestingplatform", "https://blabsy.example"),
    ];

    #[test]
    fn ingest_body_carries_every_field_in_the_dispatchers_order() {
        let e = event(&ALL, br#"{"b":1,"a":[true,null]}"#);
        let body = ingest_body(&Packet::from_event(&e).unwrap());
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"eventId":"evt-1","id":"envelope-9","w3id":"@owner","evaultPublicKey":"z6Mk","data":{"b":1,"a":[true,null]},"schemaId":"550e8400-schema","operation":"update","requestingPlatform":"https://blabsy.example","occurredAt":"2026-11-30T01:02:03.456Z","streamVersion":3}"#
        );
    }

    #[test]
    fn the_ingest_body_is_written_without_growing() {
        // Every field present, no extension at all, and the longest
        // `streamVersion`: the body still fits the room made for it.
        for extensions in [&ALL[..], &[("schemaid", "s")][..]] {
            let mut e = event(extensions, br#"{"k":12345678901234,"pad":"xxxxxxxx"}"#);
            e.sequence = u64::MAX;
            let packet = Packet::from_event(&e).unwrap();
            let body = ingest_body(&packet);
            assert_eq!(body.capacity(), body_capacity(&packet), "{extensions:?}");
            assert!(String::from_utf8(body)
                .unwrap()
                .ends_with(r#""streamVersion":18446744073709551615}"#));
        }
    }

    #[test]
    fn absent_extensions_are_null_in_ingest_and_defaulted_in_webhook() {
        let e = event(&[("SchemaId", "s")], b"");
        let packet = Packet::from_event(&e).unwrap();
        assert_eq!(
            String::from_utf8(ingest_body(&packet)).unwrap(),
            r#"{"eventId":"evt-1","id":"envelope-9","w3id":null,"evaultPublicKey":null,"data":null,"schemaId":"s","operation":null,"requestingPlatform":null,"occurredAt":"2026-11-30T01:02:03.456Z","streamVersion":3}"#
        );
        assert_eq!(
            String::from_utf8(webhook_body(&packet)).unwrap(),
            r#"{"eventId":"evt-1","id":"envelope-9","w3id":null,"evaultPublicKey":null,"data":null,"schemaId":"s","operation":"create"}"#
        );
    }

    #[test]
    fn webhook_body_has_the_services_seven_keys() {
        let e = event(&ALL, br#"{"x":"y"}"#);
        let body = webhook_body(&Packet::from_event(&e).unwrap());
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"eventId":"evt-1","id":"envelope-9","w3id":"@owner","evaultPublicKey":"z6Mk","data":{"x":"y"},"schemaId":"550e8400-schema","operation":"update"}"#
        );
    }

    #[test]
    fn origins_as_the_service_compares_them() {
        for (url, expected) in [
            (
                "https://Blabsy.Example/api/webhook?x=1",
                Some("https://blabsy.example"),
            ),
            (
                "HTTPS://blabsy.example:443/",
                Some("https://blabsy.example"),
            ),
            ("http://127.0.0.1:8080", Some("http://127.0.0.1:8080")),
            ("http://u:p@h:80#f", Some("http://h")),
            ("http://[::1]:9/x", Some("http://[::1]:9")),
            ("http://[::1]/x", Some("http://[::1]")),
            ("ftp://h/", None),
            ("blabsy", None),
            ("http://h:x/", None),
            ("http://h:70000/", None),
            ("http://h:/", Some("http://h")),
            ("http:///x", None),
        ] {
            assert_eq!(origin(url).as_deref(), expected, "{url}");
        }
    }

    #[test]
    fn unsendable_events_say_why() {
        let err = Packet::from_event(&event(&[], b"{}")).unwrap_err();
        assert!(err.contains("schemaid") && err.contains("evt-1"), "{err}");
        let err = Packet::from_event(&event(&[("schemaid", "s")], b"{nope")).unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
    }
}
