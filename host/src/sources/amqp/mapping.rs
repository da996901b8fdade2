//! How one AMQP message becomes one event.
//!
//! Owns the three readings, tried in this order:
//!
//! 1. **CloudEvents AMQP binding, structured mode**: `content-type`
//!    `application/cloudevents+json`; the body is the event in the
//!    CloudEvents JSON format.
//! 2. **CloudEvents AMQP binding, binary mode**: a `cloudEvents_specversion`
//!    (or `cloudEvents:specversion`) application property; every
//!    `cloudEvents_<name>` property is the attribute `<name>`, the
//!    `content-type` property is `datacontenttype`, the body is `data`.
//! 3. **Plain messages**, by the source's [`Mapping`]: the id from the
//!    `message-id` property, else a named header (else refused); the type
//!    from the routing key or a header; the stream from a header, a JSON path
//!    into the body, or the routing key; `data` is the body.
//!
//! Every reading ends in [`NewEvent::from_json`], so a message is held to
//! exactly the rules HTTP ingest applies (lengths, NUL, extension names).
//! A message whose content type says JSON must carry valid JSON.
//!
//! Must never: touch the network or the store; guess an id (a message
//! without one is refused, since a generated id would make every broker
//! redelivery a new event).

use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use serde_json::{json, Map, Value};

use crate::event::{self, is_json_content_type, DataFormat, NewEvent};

/// Content type of the structured mode (CloudEvents AMQP binding §3.2).
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// Prefixes of CloudEvents attributes as application properties in binary
/// mode (binding §3.1.3: `cloudEvents_`; `cloudEvents:` in older versions).
pub const ATTRIBUTE_PREFIXES: [&str; 2] = ["cloudEvents_", "cloudEvents:"];

/// Where a plain message's attribute comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// The message's routing key.
    RoutingKey,
    /// An application property (header) by name.
    Header(String),
    /// A value inside the JSON body, by JSON Pointer (RFC 6901).
    Json(String),
}

impl Field {
    /// Parse `routing-key`, `header:NAME`, `json:/pointer` or a JSONPath
    /// of names and indexes (`$.order.id`, `$.items[0].sku`).
    pub fn parse(spec: &str) -> Result<Field, String> {
        if spec == "routing-key" {
            return Ok(Field::RoutingKey);
        }
        if let Some(name) = spec.strip_prefix("header:") {
            if name.is_empty() || name.len() > 255 {
                return Err("header: needs a header name of 1 to 255 bytes".into());
            }
            return Ok(Field::Header(name.to_string()));
        }
        if let Some(pointer) = spec.strip_prefix("json:") {
            if !pointer.starts_with('/') {
                return Err(format!(
                    "json:{pointer} is not a JSON Pointer (RFC 6901): it starts with `/`, e.g. json:/order/id"
                ));
            }
            return Ok(Field::Json(pointer.to_string()));
        }
        if let Some(path) = spec.strip_prefix('$') {
            return json_path_to_pointer(path).map(Field::Json);
        }
        Err(format!(
            "{spec:?}: expected `routing-key`, `header:NAME`, `json:/pointer` or a JSON path such as `$.order.id`"
        ))
    }

    fn describe(&self) -> String {
        match self {
            Field::RoutingKey => "the routing key".into(),
            Field::Header(name) => format!("header {name:?}"),
            Field::Json(pointer) => format!("JSON body at {pointer}"),
        }
    }
}

/// `.a.b[0]` (after the `$`) as the JSON Pointer `/a/b/0`.
fn json_path_to_pointer(path: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "${path} is not a JSON path of names and indexes (e.g. `$.order.id`, `$.items[0].sku`)"
        )
    };
    let mut pointer = String::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() || name == "*" {
                return Err(bad());
            }
            pointer.push('/');
            pointer.push_str(&name.replace('~', "~0").replace('/', "~1"));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').ok_or_else(bad)?;
            let index = &after[..end];
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            pointer.push('/');
            pointer.push_str(index);
            rest = &after[end + 1..];
        } else {
            return Err(bad());
        }
    }
    if pointer.is_empty() {
        return Err(bad());
    }
    Ok(pointer)
}

/// How a plain message (neither CloudEvents mode) becomes an event.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// The CloudEvents `source` of every plain message.
    pub event_source: String,
    /// Header holding the id when the message has no `message-id`.
    pub id_header: Option<String>,
    /// Where the CloudEvents `type` is read from (the `type` key).
    pub type_from: Field,
    /// Where the stream (`partitionkey`) is read from (the `stream` key).
    pub stream_from: Field,
}

/// One message as the broker delivered it.
pub struct Message<'a> {
    /// The routing key it was published with.
    pub routing_key: &'a str,
    /// Its AMQP basic properties (`message-id`, `content-type`, headers).
    pub properties: &'a BasicProperties,
    /// The body, byte for byte.
    pub body: &'a [u8],
}

/// Why a message cannot become an event: dead-lettered with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unmappable(pub String);

fn unmappable(reason: impl Into<String>) -> Unmappable {
    Unmappable(reason.into())
}

/// The event `message` carries, by the rules of the module note.
pub fn to_event(mapping: &Mapping, message: &Message) -> Result<NewEvent, Unmappable> {
    let content_type = message
        .properties
        .content_type()
        .as_ref()
        .map(|c| c.as_str().to_string());
    let essence = content_type.as_deref().map(|c| {
        c.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    match essence.as_deref() {
        Some(STRUCTURED_CONTENT_TYPE) => {
            return event::parse_one(message.body).map_err(|e| {
                unmappable(format!(
                    "structured CloudEvent (content-type {STRUCTURED_CONTENT_TYPE}): {e}"
                ))
            })
        }
        Some("application/cloudevents-batch+json") => {
            return Err(unmappable(
                "content-type application/cloudevents-batch+json: the CloudEvents AMQP binding has no batch mode; send one event per message",
            ))
        }
        _ => {}
    }
    let headers = message.properties.headers().as_ref();
    if let Some(headers) = headers.filter(|h| binary_mode(h)) {
        return binary(headers, content_type.as_deref(), message.body);
    }
    plain(mapping, message, headers, content_type.as_deref())
}

/// The W3C trace context a message carries in its `traceparent` and
/// `tracestate` application properties (W3C Trace Context: AMQP format),
/// which an event without its own `traceparent` extension takes.
pub fn trace_context(message: &Message) -> Option<crate::otel::TraceContext> {
    let headers = message.properties.headers().as_ref();
    let text = |name: &str| header_text(headers, name).ok().flatten();
    crate::otel::TraceContext::from_parts(
        text(crate::otel::context::TRACEPARENT).as_deref(),
        text(crate::otel::context::TRACESTATE).as_deref(),
    )
}

fn binary_mode(headers: &FieldTable) -> bool {
    ATTRIBUTE_PREFIXES.iter().any(|p| {
        headers
            .inner()
            .contains_key(format!("{p}specversion").as_str())
    })
}

/// Binary mode: `cloudEvents_*` properties are the attributes.
fn binary(
    headers: &FieldTable,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<NewEvent, Unmappable> {
    let mut attributes = Map::new();
    let mut named = std::collections::BTreeMap::new();
    for (key, value) in headers.inner() {
        let key = key.as_str();
        let Some(name) = ATTRIBUTE_PREFIXES.iter().find_map(|p| key.strip_prefix(p)) else {
            continue;
        };
        let value = attribute_value(name, value)
            .map_err(|problem| unmappable(format!("header {key:?}: {problem}")))?;
        if attributes.insert(name.to_string(), value).is_some() {
            return Err(unmappable(format!(
                "CloudEvents attribute {name:?} is given twice (as cloudEvents_{name} and cloudEvents:{name})"
            )));
        }
        named.insert(name.to_string(), key.to_string());
    }
    for forbidden in ["data", "data_base64", "datacontenttype"] {
        if let Some(header) = named.get(forbidden) {
            return Err(unmappable(format!(
                "header {header:?}: {forbidden} travels as the body and the content-type property in the CloudEvents AMQP binding, not as a header"
            )));
        }
    }
    if let Some(ct) = content_type {
        attributes.insert("datacontenttype".into(), json!(ct));
    }
    let mut event = from_attributes(attributes).map_err(|e| {
        let header = named
            .get(e.field.trim_start_matches("extensions."))
            .cloned()
            .unwrap_or_else(|| {
                format!("cloudEvents_{}", e.field.trim_start_matches("extensions."))
            });
        unmappable(format!(
            "CloudEvents binary mode: attribute {} (header {header}): {}",
            e.field, e.problem
        ))
    })?;
    set_data(&mut event, content_type, body)?;
    Ok(event)
}

/// An application property as a JSON attribute value: strings as strings,
/// integers as numbers, booleans, an AMQP timestamp as RFC 3339 (`time`).
fn attribute_value(name: &str, value: &AMQPValue) -> Result<Value, String> {
    Ok(match value {
        AMQPValue::Timestamp(seconds) => {
            let time = time::OffsetDateTime::from_unix_timestamp(*seconds as i64)
                .map_err(|e| format!("timestamp out of range: {e}"))?;
            let text = time
                .format(&time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("timestamp: {e}"))?;
            if name == "time" {
                json!(text)
            } else {
                json!(seconds)
            }
        }
        other => match scalar(other)? {
            Scalar::Text(s) => json!(s),
            Scalar::Integer(n) => json!(n),
            Scalar::Bool(b) => json!(b),
        },
    })
}

enum Scalar {
    Text(String),
    Integer(i64),
    Bool(bool),
}

fn scalar(value: &AMQPValue) -> Result<Scalar, String> {
    let text = |bytes: &[u8]| {
        String::from_utf8(bytes.to_vec())
            .map(Scalar::Text)
            .map_err(|_| "is not valid UTF-8".to_string())
    };
    Ok(match value {
        AMQPValue::LongString(s) => text(s.as_bytes())?,
        AMQPValue::ShortString(s) => Scalar::Text(s.as_str().to_string()),
        AMQPValue::ByteArray(b) => text(b.as_slice())?,
        AMQPValue::Boolean(b) => Scalar::Bool(*b),
        AMQPValue::ShortShortInt(n) => Scalar::Integer(*n as i64),
        AMQPValue::ShortShortUInt(n) => Scalar::Integer(*n as i64),
        AMQPValue::ShortInt(n) => Scalar::Integer(*n as i64),
        AMQPValue::ShortUInt(n) => Scalar::Integer(*n as i64),
        AMQPValue::LongInt(n) => Scalar::Integer(*n as i64),
        AMQPValue::LongUInt(n) => Scalar::Integer(*n as i64),
        AMQPValue::LongLongInt(n) => Scalar::Integer(*n),
        AMQPValue::Timestamp(n) => Scalar::Integer(*n as i64),
        other => {
            return Err(format!(
                "is of AMQP type {:?}; expected a string, an integer or a boolean",
                other.get_type()
            ))
        }
    })
}

/// The text of a header used as an attribute (`id`, `type`, stream).
fn header_text(headers: Option<&FieldTable>, name: &str) -> Result<Option<String>, String> {
    let Some(value) = headers.and_then(|h| h.inner().get(name)) else {
        return Ok(None);
    };
    match scalar(value).map_err(|p| format!("header {name:?} {p}"))? {
        Scalar::Text(s) => Ok(Some(s)),
        Scalar::Integer(n) => Ok(Some(n.to_string())),
        Scalar::Bool(b) => Ok(Some(b.to_string())),
    }
}

/// A plain message, by the source's mapping.
fn plain(
    mapping: &Mapping,
    message: &Message,
    headers: Option<&FieldTable>,
    content_type: Option<&str>,
) -> Result<NewEvent, Unmappable> {
    let id = plain_id(mapping, message, headers)?;
    // The body as JSON, parsed once, when a field needs it.
    let mut body_json: Option<Value> = None;
    let mut read = |field: &Field, attribute: &str| {
        field_text(field, attribute, message, headers, &mut body_json)
    };
    let ty = read(&mapping.type_from, "type")?;
    let stream = read(&mapping.stream_from, "stream")?;
    let mut attributes = Map::new();
    attributes.insert("id".into(), json!(id));
    attributes.insert("source".into(), json!(mapping.event_source));
    attributes.insert("type".into(), json!(ty));
    attributes.insert("partitionkey".into(), json!(stream));
    if let Some(ct) = content_type {
        attributes.insert("datacontenttype".into(), json!(ct));
    }
    let mut event = from_attributes(attributes).map_err(|e| {
        let from = match e.field.as_str() {
            "id" if message.properties.message_id().is_some() => "the message-id property".into(),
            "id" => format!("header {:?}", mapping.id_header.as_deref().unwrap_or("")),
            "type" => mapping.type_from.describe(),
            "partitionkey" => mapping.stream_from.describe(),
            _ => "the message".into(),
        };
        let field = if e.field == "partitionkey" {
            "stream"
        } else {
            e.field.as_str()
        };
        unmappable(format!("{field} (from {from}): {}", e.problem))
    })?;
    set_data(&mut event, content_type, message.body)?;
    Ok(event)
}

/// The event id of a plain message: its `message-id` property, else the
/// `id-header` header; neither is refused (a generated id would make every
/// redelivery a new event).
fn plain_id(
    mapping: &Mapping,
    message: &Message,
    headers: Option<&FieldTable>,
) -> Result<String, Unmappable> {
    match message.properties.message_id().as_ref() {
        Some(id) if !id.as_str().is_empty() => Ok(id.as_str().to_string()),
        _ => match &mapping.id_header {
            Some(name) => header_text(headers, name)
                .map_err(unmappable)?
                .filter(|id| !id.is_empty())
                .ok_or_else(|| {
                    unmappable(format!(
                        "no event id: the message has no message-id property and no header {name:?}"
                    ))
                }),
            None => Err(unmappable(
                "no event id: the message has no message-id property (set id-header to read it from a header)",
            )),
        },
    }
}

/// The non-empty text of `field` in a plain message, for `attribute`
/// (`type`, `stream`). `body_json` caches the body parsed as JSON.
fn field_text(
    field: &Field,
    attribute: &str,
    message: &Message,
    headers: Option<&FieldTable>,
    body_json: &mut Option<Value>,
) -> Result<String, Unmappable> {
    let value = match field {
        Field::RoutingKey => Some(message.routing_key.to_string()),
        Field::Header(name) => header_text(headers, name).map_err(unmappable)?,
        Field::Json(pointer) => {
            if body_json.is_none() {
                *body_json = Some(serde_json::from_slice(message.body).map_err(|e| {
                    unmappable(format!(
                        "body is not valid JSON ({e}), and the {attribute} is read from it at {pointer}"
                    ))
                })?);
            }
            match body_json.as_ref().and_then(|b| b.pointer(pointer)) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(Value::Null) | None => None,
                Some(_) => {
                    return Err(unmappable(format!(
                        "the {attribute} at {pointer} in the JSON body is not a string or a number"
                    )))
                }
            }
        }
    };
    value.filter(|v| !v.is_empty()).ok_or_else(|| {
        unmappable(format!(
            "no {attribute}: {} is missing or empty",
            field.describe()
        ))
    })
}

/// Validate attributes as HTTP ingest does (`specversion` 1.0 implied).
fn from_attributes(mut attributes: Map<String, Value>) -> Result<NewEvent, event::EventError> {
    attributes
        .entry("specversion")
        .or_insert_with(|| json!("1.0"));
    let raw = serde_json::value::to_raw_value(&Value::Object(attributes)).map_err(|e| {
        event::EventError {
            field: "event".into(),
            problem: e.to_string(),
        }
    })?;
    NewEvent::from_json(&raw)
}

/// `data` = the body, byte for byte. JSON content types must carry valid
/// JSON (compared canonically, as HTTP ingest compares JSON data); `text/*`
/// is text when it is UTF-8; anything else, or no content type, is bytes.
fn set_data(
    event: &mut NewEvent,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(), Unmappable> {
    event.data = body.to_vec();
    event.data_format = if body.is_empty() {
        DataFormat::None
    } else {
        match content_type {
            None => DataFormat::Binary,
            Some(ct) if is_json_content_type(Some(ct)) => {
                serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|e| {
                    unmappable(format!("body is not valid JSON (content-type {ct}): {e}"))
                })?;
                DataFormat::Json
            }
            Some(ct) if ct.trim().to_ascii_lowercase().starts_with("text/") => {
                if std::str::from_utf8(body).is_ok() {
                    DataFormat::Text
                } else {
                    DataFormat::Binary
                }
            }
            Some(_) => DataFormat::Binary,
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{LongString, ShortString};

    fn mapping() -> Mapping {
        Mapping {
            event_source: "amqp://broker/orders".into(),
            id_header: Some("x-id".into()),
            type_from: Field::RoutingKey,
            stream_from: Field::Json("/order/id".into()),
        }
    }

    fn props(
        content_type: Option<&str>,
        id: Option<&str>,
        headers: &[(&str, AMQPValue)],
    ) -> BasicProperties {
        let mut p = BasicProperties::default();
        if let Some(ct) = content_type {
            p = p.with_content_type(ShortString::from(ct));
        }
        if let Some(id) = id {
            p = p.with_message_id(ShortString::from(id));
        }
        if !headers.is_empty() {
            let mut t = FieldTable::default();
            for (k, v) in headers {
                t.insert(ShortString::from(*k), v.clone());
            }
            p = p.with_headers(t);
        }
        p
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s.as_bytes()))
    }

    fn map(p: &BasicProperties, key: &str, body: &[u8]) -> Result<NewEvent, Unmappable> {
        to_event(
            &mapping(),
            &Message {
                routing_key: key,
                properties: p,
                body,
            },
        )
    }

    #[test]
    fn json_paths_become_pointers() {
        assert_eq!(
            Field::parse("$.order.id").unwrap(),
            Field::Json("/order/id".into())
        );
        assert_eq!(
            Field::parse("$.items[2].sku").unwrap(),
            Field::Json("/items/2/sku".into())
        );
        assert_eq!(
            Field::parse("json:/a~1b").unwrap(),
            Field::Json("/a~1b".into())
        );
        assert_eq!(
            Field::parse("header:x-k").unwrap(),
            Field::Header("x-k".into())
        );
        assert_eq!(Field::parse("routing-key").unwrap(), Field::RoutingKey);
        for bad in ["$", "$.", "$.a[x]", "json:a", "header:", "stream", "$..a"] {
            assert!(Field::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_messages_take_id_type_stream_and_data_by_the_mapping() {
        let body = br#"{"order":{"id":"o-7"},"n":1}"#;
        let p = props(Some("application/json"), Some("m-1"), &[]);
        let e = map(&p, "orders.created", body).unwrap();
        assert_eq!(e.id, "m-1");
        assert_eq!(e.ty, "orders.created");
        assert_eq!(e.stream, "o-7");
        assert_eq!(e.source, "amqp://broker/orders");
        assert_eq!(e.data, body, "data is the body, byte for byte");
        assert_eq!(e.data_format, DataFormat::Json);
        assert_eq!(e.datacontenttype.as_deref(), Some("application/json"));

        // No message-id: the named header.
        let p = props(Some("application/json"), None, &[("x-id", text("h-1"))]);
        assert_eq!(map(&p, "k", body).unwrap().id, "h-1");
        // Neither: refused, naming both.
        let p = props(Some("application/json"), None, &[]);
        let e = map(&p, "k", body).unwrap_err().0;
        assert!(e.contains("message-id") && e.contains("x-id"), "{e}");
    }

    #[test]
    fn json_needed_but_not_json_is_refused_with_the_reason() {
        let p = props(Some("application/json"), Some("m-1"), &[]);
        let e = map(&p, "k", b"{not json").unwrap_err().0;
        assert!(
            e.contains("not valid JSON") && e.contains("/order/id"),
            "{e}"
        );
        // A JSON content type with a body that is not JSON, stream elsewhere.
        let mut m = mapping();
        m.stream_from = Field::RoutingKey;
        let e = to_event(
            &m,
            &Message {
                routing_key: "k",
                properties: &p,
                body: b"<xml/>",
            },
        )
        .unwrap_err()
        .0;
        assert!(
            e.contains("not valid JSON (content-type application/json)"),
            "{e}"
        );
        // The stream missing from the body.
        let e = map(&p, "k", br#"{"order":{}}"#).unwrap_err().0;
        assert!(e.contains("no stream") && e.contains("/order/id"), "{e}");
    }

    #[test]
    fn binary_mode_reads_cloud_events_properties() {
        let p = props(
            Some("application/json"),
            Some("ignored-message-id"),
            &[
                ("cloudEvents_specversion", text("1.0")),
                ("cloudEvents_id", text("ce-1")),
                ("cloudEvents_source", text("/orders")),
                ("cloudEvents_type", text("order.created")),
                ("cloudEvents_partitionkey", text("order-9")),
                ("cloudEvents_time", AMQPValue::Timestamp(1_700_000_000)),
                ("cloudEvents:tenant", text("acme")),
                ("other", text("not an attribute")),
            ],
        );
        let e = map(&p, "k", br#"{"a":1}"#).unwrap();
        assert_eq!(e.id, "ce-1");
        assert_eq!(e.ty, "order.created");
        assert_eq!(e.stream, "order-9");
        assert_eq!(e.time.as_deref(), Some("2023-11-14T22:13:20Z"));
        assert_eq!(e.extensions.get("tenant").map(String::as_str), Some("acme"));
        assert!(!e.extensions.contains_key("other"));
        assert_eq!(e.data, br#"{"a":1}"#);

        let p = props(
            None,
            None,
            &[
                ("cloudEvents_specversion", text("1.0")),
                ("cloudEvents_source", text("/orders")),
                ("cloudEvents_type", text("t")),
            ],
        );
        let e = map(&p, "k", b"x").unwrap_err().0;
        assert!(
            e.contains("attribute id") && e.contains("cloudEvents_id") && e.contains("required"),
            "{e}"
        );
    }

    #[test]
    fn structured_mode_is_the_json_format() {
        let p = props(
            Some("application/cloudevents+json; charset=utf-8"),
            None,
            &[],
        );
        let body = br#"{"specversion":"1.0","id":"s-1","source":"/x","type":"t","partitionkey":"k","data":{"b":2}}"#;
        let e = map(&p, "ignored", body).unwrap();
        assert_eq!((e.id.as_str(), e.stream.as_str()), ("s-1", "k"));
        let e = map(&p, "k", b"[1,2").unwrap_err().0;
        assert!(e.contains("structured CloudEvent"), "{e}");
    }

    #[test]
    fn ingest_rules_apply_to_mapped_attributes() {
        let long = "x".repeat(300);
        let p = props(
            Some("application/json"),
            Some(&long[..250]),
            &[("s", text(&long))],
        );
        let mut m = mapping();
        m.stream_from = Field::Header("s".into());
        let e = to_event(
            &m,
            &Message {
                routing_key: "k",
                properties: &p,
                body: b"{}",
            },
        )
        .unwrap_err()
        .0;
        assert!(
            e.starts_with("stream (from header \"s\")") && e.contains("over the limit"),
            "{e}"
        );
    }
}
