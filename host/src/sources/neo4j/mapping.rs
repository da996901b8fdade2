//! A claimed outbox node made an event: its properties read by the
//! configured names, the payload in its data format, the stream and
//! version, the type (a property, or a template over the properties), the
//! time in its encoding, the extensions the configuration lets through.
//!
//! Must never: guess a missing or malformed property (the node is refused
//! with a reason naming the property), or read Neo4j.

use super::*;
use crate::sources::template::Template;

/// Why a claimed node cannot become an event: the reason recorded on it,
/// naming the property.
pub(super) fn to_event(
    config: &Neo4jSourceConfig,
    type_template: Option<&Template>,
    source_name: &str,
    node: &ClaimedNode,
) -> Result<NewEvent, String> {
    let p = &config.properties;
    let m = &config.event;
    let (stream, version) = stream_and_version(p, node)?;
    let ty = event_type(config, type_template, node)?;
    let source = node
        .source
        .clone()
        .or_else(|| m.source.clone())
        .unwrap_or_else(|| format!("outboxd:neo4j/{source_name}"));
    let raw = |v: serde_json::Value| serde_json::value::to_raw_value(&v).expect("JSON value");
    let mut attrs: BTreeMap<String, Box<RawValue>> = BTreeMap::new();
    attrs.insert("specversion".into(), raw("1.0".into()));
    attrs.insert("id".into(), raw(node.event_id.clone().into()));
    attrs.insert("source".into(), raw(source.into()));
    attrs.insert("type".into(), raw(ty.into()));
    attrs.insert("partitionkey".into(), raw(stream.into()));
    attrs.insert("sequence".into(), raw(version.into()));
    if let Some(s) = &node.subject {
        attrs.insert("subject".into(), raw(s.clone().into()));
    }
    let (time_property, time_encoding) = event_time(config);
    match (&node.time, node.has_time) {
        (Some(t), _) => {
            attrs.insert("time".into(), raw(t.clone().into()));
        }
        (None, true) => {
            return Err(format!(
                "property `{time_property}` (the event time) is not {}",
                encoding_name(time_encoding)
            ))
        }
        (None, false) => {}
    }
    let from_property = insert_extensions(config, node, &mut attrs)?;
    let traceparent = node
        .properties
        .iter()
        .find(|(name, _)| *name == m.traceparent_property)
        .and_then(|(_, v)| v.as_deref());
    if let Some(tp) = traceparent.filter(|tp| crate::otel::context::parse_traceparent(tp).is_some())
    {
        attrs.insert("traceparent".into(), raw(tp.into()));
    }
    match (&node.data, node.has_data, m.data_format) {
        (None, false, _) => {}
        (None, true, _) => {
            return Err(format!("property `{}` must be a string", m.data_property));
        }
        (Some(d), _, DataFormat::Json) => {
            let data = RawValue::from_string(d.clone())
                .map_err(|e| format!("property `{}` is not JSON: {e}", m.data_property))?;
            attrs.insert("datacontenttype".into(), raw("application/json".into()));
            attrs.insert("data".into(), data);
        }
        (Some(d), _, DataFormat::Text) => {
            attrs.insert("datacontenttype".into(), raw("text/plain".into()));
            attrs.insert("data".into(), raw(d.clone().into()));
        }
    }
    let json = serde_json::to_string(&attrs).expect("JSON object");
    let raw_event = RawValue::from_string(json).expect("JSON text");
    NewEvent::from_json(&raw_event).map_err(|e| {
        let field = e.field.as_str();
        let property = match field {
            "id" => p.event_id.clone(),
            "partitionkey" => p.stream.clone(),
            "sequence" => p.stream_version.clone(),
            "type" => m.type_property.clone(),
            "time" => time_property.clone(),
            "data" => m.data_property.clone(),
            "source" => m
                .source_property
                .clone()
                .unwrap_or_else(|| "event.source".into()),
            "subject" => m.subject_property.clone().unwrap_or_default(),
            f => f
                .strip_prefix("extensions.")
                .and_then(|x| from_property.get(x).cloned())
                .unwrap_or_else(|| f.to_string()),
        };
        format!("property `{property}`: {}", e.problem)
    })
}

/// The stream (a string) and stream version (an integer from 1) of
/// `node`; errors name the property.
fn stream_and_version(p: &PropertyNames, node: &ClaimedNode) -> Result<(String, i64), String> {
    let stream = match (&node.stream, &node.stream_text) {
        (Some(s), _) => s.clone(),
        (None, Some(t)) => {
            return Err(format!(
                "property `{}` must be a string, got {t:?}",
                p.stream
            ))
        }
        (None, None) => return Err(format!("property `{}` (the stream) is missing", p.stream)),
    };
    let version = match (node.version, &node.version_text) {
        (Some(v), _) if v >= 1 => v,
        (Some(v), _) => {
            return Err(format!(
                "property `{}` must be an integer from 1, got {v}",
                p.stream_version
            ))
        }
        (None, Some(t)) => {
            return Err(format!(
                "property `{}` must be an integer, got {t:?}",
                p.stream_version
            ))
        }
        (None, None) => return Err(format!("property `{}` is missing", p.stream_version)),
    };
    Ok((stream, version))
}

/// The CloudEvents `type`: `template` (the parsed `event.type`) rendered
/// over the node's properties, or the type property.
fn event_type(
    config: &Neo4jSourceConfig,
    template: Option<&Template>,
    node: &ClaimedNode,
) -> Result<String, String> {
    let m = &config.event;
    let Some(template) = template else {
        return node
            .ty
            .clone()
            .ok_or_else(|| format!("property `{}` (the event type) is missing", m.type_property));
    };
    let fields: serde_json::Map<String, serde_json::Value> = node
        .properties
        .iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v.into())))
        .collect();
    template
        .render(&serde_json::Value::Object(fields))
        .map_err(|e| format!("event.type: {}", e.replacen("field", "property", 1)))
}

/// How `encoding` is named in reasons.
fn encoding_name(encoding: TimeEncoding) -> &'static str {
    match encoding {
        TimeEncoding::Datetime => "a Neo4j datetime",
        TimeEncoding::EpochMillis | TimeEncoding::EpochMillisFloat => {
            "a number of epoch milliseconds"
        }
        TimeEncoding::Iso8601 => "ISO-8601 text",
    }
}

/// The properties of `node` that the configuration lets become extension
/// attributes of `attrs` (its name lowercased, letters and digits only):
/// the allow-list `event.extensions` when set, else every property that is
/// not the relay's own ([`own_properties`]) nor in
/// `event.ignore-properties`. Returns which property each extension came
/// from, for error messages.
fn insert_extensions(
    config: &Neo4jSourceConfig,
    node: &ClaimedNode,
    attrs: &mut BTreeMap<String, Box<RawValue>>,
) -> Result<BTreeMap<String, String>, String> {
    let raw = |v: serde_json::Value| serde_json::value::to_raw_value(&v).expect("JSON value");
    let own = own_properties(config);
    let m = &config.event;
    let lets_through = |name: &str| match &m.extensions {
        Some(allowed) => allowed.iter().any(|a| a == name),
        None => !own.iter().any(|o| o == name) && !m.ignore_properties.iter().any(|i| i == name),
    };
    let mut from_property: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in node.properties.iter().filter(|(n, _)| lets_through(n)) {
        let ext: String = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let Some(value) = value else {
            return Err(format!("property `{name}` has a value that cannot be an extension attribute (a list?); list it in event.ignore-properties"));
        };
        if ext.is_empty() || attrs.contains_key(&ext) || from_property.contains_key(&ext) {
            return Err(format!(
                "property `{name}` cannot be an extension attribute ({ext:?} is empty or taken); list it in event.ignore-properties"
            ));
        }
        from_property.insert(ext.clone(), name.clone());
        attrs.insert(ext, raw(value.clone().into()));
    }
    Ok(from_property)
}
