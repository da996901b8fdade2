//! Marking one entry published: load the document, find the entry by event
//! id, set the status and `published_at`, save with the loaded `_rev`; on
//! 409 read again and retry, at most `max-conflicts` times.
//!
//! | what happens                                   | outcome |
//! |------------------------------------------------|---------|
//! | saved (201/202)                                | `delivered` |
//! | the entry is already published                 | `delivered` (nothing written) |
//! | the document is gone (404, deleted)            | `delivered`, logged at warn: nothing is left pending to mark |
//! | the document has no entry with this event id   | `delivered`, logged at warn: likewise |
//! | 409 `max-conflicts` times in a row             | `retry` |
//! | 408, 429, 5xx, 401, 403, transport error       | `retry` (credentials can be fixed) |
//! | the document is not JSON, another status       | `reject` |

use serde_json::Value;
use wasip2::http::types::Method;

use crate::bindings::outboxd::sink::log::{log, Level};
use crate::bindings::outboxd::sink::types::RetryInfo;
use crate::bindings::{Event, Outcome};
use crate::config::{segment, Config};
use crate::http;

/// Characters of a response body quoted in a reason.
const QUOTE: usize = 200;

fn retry(reason: String) -> Outcome {
    Outcome::Retry(RetryInfo {
        reason,
        after_ms: None,
    })
}

fn quote(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .chars()
        .take(QUOTE)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Whether `status` is worth another attempt later.
fn transient(status: u16) -> bool {
    matches!(status, 401 | 403 | 408 | 425 | 429 | 500..=599)
}

/// Mark `event`'s entry in document `event.stream` published at `now`
/// (RFC 3339).
pub fn mark(config: &Config, event: &Event, now: &str) -> Outcome {
    let doc_id = &event.stream;
    let path = format!("/{}/{}", config.database, segment(doc_id));
    for _ in 0..config.max_conflicts {
        let got = match http::send(config, Method::Get, &path, None) {
            Ok(r) => r,
            Err(e) => return retry(format!("GET document {doc_id:?}: {e}")),
        };
        match got.status {
            200 => {}
            404 => {
                log(
                    Level::Warn,
                    &format!(
                        "event {}: document {doc_id:?} no longer exists; nothing to mark",
                        event.id
                    ),
                );
                return Outcome::Delivered;
            }
            s if transient(s) => return retry(format!("GET document {doc_id:?}: HTTP {s}")),
            s => {
                return Outcome::Reject(format!(
                    "GET document {doc_id:?}: HTTP {s}: {}",
                    quote(&got.body)
                ))
            }
        }
        let mut doc: Value = match serde_json::from_slice(&got.body) {
            Ok(d) => d,
            Err(e) => return Outcome::Reject(format!("document {doc_id:?} is not JSON: {e}")),
        };
        match set_published(config, &mut doc, &event.id, now) {
            Found::AlreadyPublished => return Outcome::Delivered,
            Found::Missing => {
                log(Level::Warn, &format!(
                    "event {}: document {doc_id:?} has no outbox entry with this event id; nothing to mark", event.id));
                return Outcome::Delivered;
            }
            Found::Marked => {}
        }
        let body = serde_json::to_vec(&doc).expect("a JSON value serialises");
        let put = match http::send(config, Method::Put, &path, Some(&body)) {
            Ok(r) => r,
            Err(e) => return retry(format!("PUT document {doc_id:?}: {e}")),
        };
        match put.status {
            201 | 202 => return Outcome::Delivered,
            409 => continue, // another writer saved a newer revision: read it again
            s if transient(s) => return retry(format!("PUT document {doc_id:?}: HTTP {s}")),
            s => {
                return Outcome::Reject(format!(
                    "PUT document {doc_id:?}: HTTP {s}: {}",
                    quote(&put.body)
                ))
            }
        }
    }
    retry(format!(
        "document {doc_id:?}: 409 conflict {} times in a row (other writers); trying again later",
        config.max_conflicts
    ))
}

enum Found {
    Marked,
    AlreadyPublished,
    Missing,
}

/// Set the entry with `event_id` to published in `doc`.
fn set_published(config: &Config, doc: &mut Value, event_id: &str, now: &str) -> Found {
    let mut at = &mut *doc;
    for key in &config.entries {
        match at.get_mut(key) {
            Some(v) => at = v,
            None => return Found::Missing,
        }
    }
    let Some(entries) = at.as_array_mut() else {
        return Found::Missing;
    };
    let Some(entry) = entries
        .iter_mut()
        .find(|e| e.get(&config.event_id).and_then(Value::as_str) == Some(event_id))
    else {
        return Found::Missing;
    };
    if entry.get(&config.status).and_then(Value::as_str) == Some(config.published.as_str()) {
        return Found::AlreadyPublished;
    }
    let Some(object) = entry.as_object_mut() else {
        return Found::Missing;
    };
    object.insert(
        config.status.clone(),
        Value::String(config.published.clone()),
    );
    object.insert(config.published_at.clone(), Value::String(now.to_string()));
    Found::Marked
}

/// `seconds` since the Unix epoch as RFC 3339 UTC with milliseconds
/// (`2026-12-01T10:00:00.000Z`); civil date per Howard Hinnant's
/// `civil_from_days`.
pub fn rfc3339(seconds: u64, nanos: u32) -> String {
    let days = (seconds / 86_400) as i64;
    let secs = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        nanos / 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(1_796_117_400, 5_000_000),
            "2026-12-01T09:30:00.005Z"
        );
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn marks_only_the_entry_and_keeps_the_rest() {
        let config = Config::parse(&[
            ("url".into(), "http://h".into()),
            ("database".into(), "d".into()),
        ])
        .unwrap();
        let mut doc: Value = serde_json::from_str(
            r#"{"z":1.50,"extensions":{"_server_outbox":[{"event_id":"a","status":"pending"},{"event_id":"b","status":"pending"}]}}"#,
        ).unwrap();
        assert!(matches!(
            set_published(&config, &mut doc, "b", "T"),
            Found::Marked
        ));
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(
            text,
            r#"{"z":1.50,"extensions":{"_server_outbox":[{"event_id":"a","status":"pending"},{"event_id":"b","status":"published","published_at":"T"}]}}"#
        );
        assert!(matches!(
            set_published(&config, &mut doc, "b", "T"),
            Found::AlreadyPublished
        ));
        assert!(matches!(
            set_published(&config, &mut doc, "c", "T"),
            Found::Missing
        ));
    }
}
