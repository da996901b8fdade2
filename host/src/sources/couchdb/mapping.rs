//! One document's outbox entries → events.
//!
//! Owns the mapping (id = `event_id`, stream and subject = document id,
//! sequence = the entry's `sequence`, type from the `event-type` template,
//! data = `payload`, `routingkey` and `operation` as extensions, time =
//! `created_at`) and every rule that makes an entry malformed. The event is
//! built as a CloudEvents JSON object and parsed by [`crate::event`], so a
//! relayed entry meets exactly the rules an HTTP-ingested event meets.
//!
//! Per-document order: pending entries are relayed in `sequence` order,
//! and a valid pending entry that comes after a malformed pending entry
//! (in the document's list) is held back, since relaying it would put
//! sequence n+1 before n. Fixing or removing the malformed entry releases
//! it.
//!
//! Must never: touch the network or the store.

use serde_json::{json, Value};

use super::config::CouchdbConfig;
use crate::event::{self, NewEvent};
use crate::sources::template::{at_path, Template};

/// What one document revision holds for the relay.
#[derive(Debug, Default)]
pub struct DocumentOutbox {
    /// Pending entries as events, in `sequence` order.
    pub events: Vec<NewEvent>,
    /// One reason per malformed entry, naming the entry (`entry [2]`).
    pub malformed: Vec<String>,
    /// Valid pending entries held back behind a malformed one.
    pub held: u64,
    /// Entries already published (not relayed).
    pub published: u64,
    /// The earliest `created_at` of a pending entry, Unix ms.
    pub oldest_pending_ms: Option<i64>,
}

/// Read the outbox of `doc` (a document as CouchDB returns it, with `_id`).
pub fn read_document(doc: &Value, config: &CouchdbConfig, template: &Template) -> DocumentOutbox {
    let mut out = DocumentOutbox::default();
    let Some(doc_id) = doc.get("_id").and_then(Value::as_str) else {
        return out;
    };
    let entries = match at_path(doc, &config.paths.entries) {
        None | Some(Value::Null) => return out,
        Some(Value::Array(entries)) => entries,
        Some(_) => {
            out.malformed
                .push(format!("{} is not a list", config.paths.entries));
            return out;
        }
    };
    let source = config.effective_event_source();
    let mut blocked = false;
    let mut kept: Vec<(u64, usize, NewEvent)> = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        match entry_event(doc_id, entry, config, template, &source) {
            Read::Published => out.published += 1,
            Read::Pending(sequence, event, created_ms) => {
                if let Some(ms) = created_ms {
                    out.oldest_pending_ms = Some(out.oldest_pending_ms.map_or(ms, |o| o.min(ms)));
                }
                if blocked {
                    out.held += 1;
                } else {
                    kept.push((sequence, index, *event));
                }
            }
            Read::Malformed(reason, pending) => {
                out.malformed.push(format!("entry [{index}]: {reason}"));
                blocked |= pending;
            }
        }
    }
    kept.sort_by_key(|(sequence, index, _)| (*sequence, *index));
    let mut last: Option<u64> = None;
    for (sequence, index, event) in kept {
        if last == Some(sequence) {
            out.malformed.push(format!(
                "entry [{index}]: sequence {sequence} repeats an earlier entry's"
            ));
            continue;
        }
        last = Some(sequence);
        out.events.push(event);
    }
    out
}

enum Read {
    Published,
    /// A valid pending entry: its sequence, event and `created_at` (ms).
    Pending(u64, Box<NewEvent>, Option<i64>),
    /// Why it is malformed, and whether it claims to be pending.
    Malformed(String, bool),
}

fn entry_event(
    doc_id: &str,
    entry: &Value,
    config: &CouchdbConfig,
    template: &Template,
    source: &str,
) -> Read {
    let p = &config.paths;
    if !entry.is_object() {
        return Read::Malformed("is not a JSON object".into(), true);
    }
    let field = |path: &str| at_path(entry, path).filter(|v| !v.is_null());
    match field(&p.status).and_then(Value::as_str) {
        Some(s) if s == p.published => return Read::Published,
        Some(s) if s == p.pending => {}
        Some(s) => {
            return Read::Malformed(
                format!(
                    "{} {s:?} is neither {:?} nor {:?}",
                    p.status, p.pending, p.published
                ),
                false,
            )
        }
        None => return Read::Malformed(format!("{} is missing or not a string", p.status), true),
    }
    let malformed = |reason: String| Read::Malformed(reason, true);
    let event_id = match field(&p.event_id).and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id,
        _ => {
            return malformed(format!(
                "{} is missing or not a non-empty string",
                p.event_id
            ))
        }
    };
    let sequence = match entry_sequence(field(&p.sequence), &p.sequence) {
        Ok(n) => n,
        Err(reason) => return malformed(reason),
    };
    let data = match entry_data(field(&p.payload), &p.payload) {
        Ok(v) => v,
        Err(reason) => return malformed(reason),
    };
    let ty = match template.render(entry) {
        Ok(t) => t,
        Err(e) => return malformed(format!("event-type: {e}")),
    };
    let mut ce = json!({
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": ty,
        "subject": doc_id,
        "partitionkey": doc_id,
        "sequence": sequence,
        "datacontenttype": "application/json",
        "data": data,
    });
    let mut created_ms = None;
    if let Some(created) = field(&p.created_at) {
        let Some(text) = created.as_str() else {
            return malformed(format!("{} is not a string", p.created_at));
        };
        ce["time"] = json!(text);
        created_ms =
            time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                .ok()
                .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64);
    }
    for (name, path) in [("routingkey", &p.routing_key), ("operation", &p.operation)] {
        match field(path) {
            None => {}
            Some(Value::String(s)) => ce[name] = json!(s),
            Some(v) => return malformed(format!("{path} {v} is not a string")),
        }
    }
    if let Some(tp) = field(&p.traceparent).and_then(Value::as_str) {
        if crate::otel::context::parse_traceparent(tp).is_some() {
            ce["traceparent"] = json!(tp);
        }
    }
    let bytes = serde_json::to_vec(&ce).expect("a JSON value serialises");
    match event::parse_one(&bytes) {
        Ok(event) => Read::Pending(sequence, Box::new(event), created_ms),
        Err(e) => malformed(format!("not a valid event: {e}")),
    }
}

/// An entry's `sequence` (at `path`): a positive integer.
fn entry_sequence(value: Option<&Value>, path: &str) -> Result<u64, String> {
    match value {
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(n),
            _ => Err(format!("{path} {v} is not a positive integer")),
        },
        None => Err(format!("{path} is missing")),
    }
}

/// An entry's `payload` (at `path`) as the event's data: any JSON value, a
/// string being JSON text to parse.
fn entry_data(value: Option<&Value>, path: &str) -> Result<Value, String> {
    match value {
        None => Err(format!("{path} is missing")),
        Some(Value::String(text)) => serde_json::from_str::<Value>(text)
            .map_err(|e| format!("{path} is a string that is not JSON text: {e}")),
        Some(v) => Ok(v.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CouchdbConfig {
        serde_json::from_value(json!({ "url": "http://127.0.0.1:5984", "database": "docs" }))
            .unwrap()
    }

    fn entry(id: &str, seq: Value, status: &str) -> Value {
        json!({ "event_id": id, "sequence": seq, "status": status, "operation": "new",
                "routing_key": "documents.new.person", "payload": {"a": 1},
                "created_at": "2026-12-01T10:00:00Z" })
    }

    fn read(entries: Vec<Value>) -> DocumentOutbox {
        let doc = json!({ "_id": "p1", "extensions": { "_server_outbox": entries } });
        let c = config();
        read_document(&doc, &c, &Template::parse(&c.event_type).unwrap())
    }

    #[test]
    fn maps_an_entry() {
        let out = read(vec![entry("e1", json!(1), "pending")]);
        assert!(out.malformed.is_empty(), "{:?}", out.malformed);
        let e = &out.events[0];
        assert_eq!(e.id, "e1");
        assert_eq!(e.stream, "p1");
        assert_eq!(e.sequence, Some(1));
        assert_eq!(e.ty, "documents.new.person");
        assert_eq!(e.source, "/couchdb/docs");
        assert_eq!(e.extensions["routingkey"], "documents.new.person");
        assert_eq!(e.extensions["operation"], "new");
        assert_eq!(e.data, br#"{"a":1}"#);
    }

    #[test]
    fn published_and_malformed_entries_are_not_relayed() {
        let mut no_payload = entry("e4", json!(4), "pending");
        no_payload.as_object_mut().unwrap().remove("payload");
        let mut text_payload = entry("e5", json!(5), "pending");
        text_payload["payload"] = json!("not json");
        let out = read(vec![
            entry("e1", json!(1), "published"),
            entry("e2", json!(2), "pending"),
            entry("", json!(3), "pending"),
            no_payload,
            text_payload,
            entry("e6", json!(0), "pending"),
            entry("e7", json!("7"), "pending"),
            entry("e8", json!(8), "pending"),
        ]);
        assert_eq!(out.published, 1);
        assert_eq!(
            out.events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["e2"]
        );
        assert_eq!(out.malformed.len(), 5, "{:?}", out.malformed);
        assert_eq!(out.held, 1, "e8 waits behind the malformed entries");
    }

    #[test]
    fn order_is_by_sequence_and_repeats_are_malformed() {
        let out = read(vec![
            entry("e3", json!(3), "pending"),
            entry("e1", json!(1), "pending"),
            entry("e1b", json!(1), "pending"),
        ]);
        assert_eq!(
            out.events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["e1", "e3"]
        );
        assert_eq!(out.malformed.len(), 1);
    }
}
