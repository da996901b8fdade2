//! An event as an AMQP message, in the CloudEvents AMQP binding's binary
//! content mode
//! (https://github.com/cloudevents/spec/blob/main/cloudevents/bindings/amqp-protocol-binding.md):
//! the body is the event's `data` byte for byte, `datacontenttype` is the
//! `content-type` property (§3.1.1), and every other attribute is a header
//! named `cloudEvents_<attribute>` (§3.1.3.1: `_` is the preferred
//! separator, `:` the original one, one of them for all attributes of a
//! message). AMQP 0-9-1 has no application-properties section; its
//! `headers` table is where RabbitMQ clients read them. Values go as
//! strings, the binding's canonical string form (§3.1.3.2).
//!
//! Properties: `message-id` = event `id`, `delivery-mode` 2 (persistent),
//! and the `mandatory` flag, so an unroutable event comes back instead of
//! being dropped.

use crate::config::Config;
use outboxd_sink::amqp::Message;
use outboxd_sink::Event;

/// Attributes this sink writes itself; an extension of the same name is
/// skipped (the event's own field wins).
const OWN_ATTRIBUTES: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "partitionkey",
    "sequence",
    "dataschema",
    "datacontenttype",
];

/// The message for `event`, or why it cannot be sent as configured (a
/// routing key attribute it lacks, a name AMQP cannot carry).
pub fn message(config: &Config, event: &Event) -> Result<Message, String> {
    let routing_key = config.routing_key.render(event)?;
    let mut headers = headers(config.header_prefix, event)?;
    // The attempt's context as W3C Trace Context's AMQP property; the
    // event's creation context travels as `cloudEvents_traceparent`.
    outboxd_sink::trace::add_header(&mut headers, event, |v| v);
    Ok(Message {
        exchange: config.exchange.clone(),
        routing_key,
        payload: event.data.clone(),
        content_type: event.datacontenttype.clone(),
        message_id: Some(event.id.clone()),
        headers,
        persistent: true,
        mandatory: true,
    })
}

/// The CloudEvents attribute headers of `event`.
pub fn headers(prefix: &str, event: &Event) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::with_capacity(9 + event.extensions.len());
    let mut add = |name: &str, value: String| headers.push((format!("{prefix}{name}"), value));
    add("specversion", "1.0".into());
    add("id", event.id.clone());
    add("source", event.source.clone());
    add("type", event.type_.clone());
    if let Some(subject) = &event.subject {
        add("subject", subject.clone());
    }
    add("time", event.time.clone());
    add("partitionkey", event.stream.clone());
    add("sequence", event.sequence.to_string());
    if let Some(schema) = &event.dataschema {
        add("dataschema", schema.clone());
    }
    for (name, value) in &event.extensions {
        let name = name.to_ascii_lowercase();
        if OWN_ATTRIBUTES.contains(&name.as_str()) {
            continue;
        }
        if name.is_empty() || prefix.len() + name.len() > 255 {
            return Err(format!(
                "extension name `{}` cannot be an AMQP header name (empty, or over 255 bytes with the prefix)",
                name.escape_default()
            ));
        }
        if headers.iter().any(|(n, _)| n[prefix.len()..] == name) {
            continue;
        }
        headers.push((format!("{prefix}{name}"), value.clone()));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn event() -> Event {
        Event {
            id: "evt-1".into(),
            source: "/documents".into(),
            type_: "person".into(),
            subject: Some("people/7".into()),
            stream: "doc-7".into(),
            sequence: 42,
            time: "2026-11-30T01:02:03.456Z".into(),
            datacontenttype: Some("application/json".into()),
            dataschema: None,
            data: b"{\"a\":1}".to_vec(),
            extensions: vec![
                ("operation".into(), "new".into()),
                ("Sequence".into(), "1".into()),
            ],
            attempt: 1,
            ingested_at: "2026-11-30T01:02:03.456789Z".into(),
        }
    }

    fn config() -> Config {
        Config::parse(&[
            ("exchange".to_string(), "documents".to_string()),
            (
                "routing-key".to_string(),
                "documents.{operation}.{type}".to_string(),
            ),
        ])
        .unwrap()
    }

    fn get<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn binary_binding() {
        let m = message(&config(), &event()).unwrap();
        assert_eq!(m.exchange, "documents");
        assert_eq!(m.routing_key, "documents.new.person");
        assert_eq!(m.payload, b"{\"a\":1}");
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(m.message_id.as_deref(), Some("evt-1"));
        assert!(m.persistent && m.mandatory);
        let h = &m.headers;
        assert_eq!(get(h, "cloudEvents_specversion"), Some("1.0"));
        assert_eq!(get(h, "cloudEvents_id"), Some("evt-1"));
        assert_eq!(get(h, "cloudEvents_source"), Some("/documents"));
        assert_eq!(get(h, "cloudEvents_type"), Some("person"));
        assert_eq!(get(h, "cloudEvents_subject"), Some("people/7"));
        assert_eq!(get(h, "cloudEvents_partitionkey"), Some("doc-7"));
        assert_eq!(get(h, "cloudEvents_sequence"), Some("42"));
        assert_eq!(get(h, "cloudEvents_operation"), Some("new"));
        assert_eq!(get(h, "cloudEvents_datacontenttype"), None);
        assert_eq!(
            h.iter()
                .filter(|(n, _)| n == "cloudEvents_sequence")
                .count(),
            1
        );
    }

    #[test]
    fn colon_prefix() {
        let h = headers("cloudEvents:", &event()).unwrap();
        assert_eq!(get(&h, "cloudEvents:id"), Some("evt-1"));
        assert!(h.iter().all(|(n, _)| n.starts_with("cloudEvents:")));
    }

    #[test]
    fn missing_routing_attribute_is_an_error() {
        let mut e = event();
        e.extensions.clear();
        assert!(message(&config(), &e).unwrap_err().contains("{operation}"));
    }
}
