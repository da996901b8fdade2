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

use crate::bindings::outboxd::sink::log::{log, Level};
use crate::bindings::outboxd::sink::types::RetryInfo;
use crate::bindings::{Event, Outcome};
use crate::config::{segment, Config};
use crate::http::{self, Method};

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

/// Most documents marked at once (requests in flight). Each holds a few
/// host resources; the host caps the resource table.
pub const IN_FLIGHT: usize = 32;

/// What a document's answer leads to.
enum Next {
    Done(Outcome),
    /// Save this body (the document as read, the entry marked).
    Put(Vec<u8>),
}

/// After `GET` of `event`'s document.
fn after_get(
    config: &Config,
    event: &Event,
    got: Result<http::Response, String>,
    now: &str,
) -> Next {
    let doc_id = &event.stream;
    let got = match got {
        Ok(r) => r,
        Err(e) => return Next::Done(retry(format!("GET document {doc_id:?}: {e}"))),
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
            return Next::Done(Outcome::Delivered);
        }
        s if transient(s) => {
            return Next::Done(retry(format!("GET document {doc_id:?}: HTTP {s}")))
        }
        s => {
            return Next::Done(Outcome::Reject(format!(
                "GET document {doc_id:?}: HTTP {s}: {}",
                quote(&got.body)
            )))
        }
    }
    let mut doc: Value = match serde_json::from_slice(&got.body) {
        Ok(d) => d,
        Err(e) => {
            return Next::Done(Outcome::Reject(format!(
                "document {doc_id:?} is not JSON: {e}"
            )))
        }
    };
    match set_published(config, &mut doc, &event.id, now) {
        Found::AlreadyPublished => Next::Done(Outcome::Delivered),
        Found::Missing => {
            log(
                Level::Warn,
                &format!(
                    "event {}: document {doc_id:?} has no outbox entry with this event id; nothing to mark",
                    event.id
                ),
            );
            Next::Done(Outcome::Delivered)
        }
        Found::Marked => Next::Put(serde_json::to_vec(&doc).expect("a JSON value serialises")),
    }
}

/// After `PUT` of `event`'s document: `None` on 409 (read it again).
fn after_put(event: &Event, put: Result<http::Response, String>) -> Option<Outcome> {
    let doc_id = &event.stream;
    let put = match put {
        Ok(r) => r,
        Err(e) => return Some(retry(format!("PUT document {doc_id:?}: {e}"))),
    };
    match put.status {
        201 | 202 => Some(Outcome::Delivered),
        // Another writer saved a newer revision: read it again.
        409 => None,
        s if transient(s) => Some(retry(format!("PUT document {doc_id:?}: HTTP {s}"))),
        s => Some(Outcome::Reject(format!(
            "PUT document {doc_id:?}: HTTP {s}: {}",
            quote(&put.body)
        ))),
    }
}

fn path(config: &Config, event: &Event) -> String {
    format!("/{}/{}", config.database, segment(&event.stream))
}

/// Mark every event of `batch` (its entry in document `event.stream`)
/// published at `now` (RFC 3339). Different documents are marked
/// concurrently, at most [`IN_FLIGHT`] at once, in rounds of `GET` then
/// `PUT`; the events of one document one after the other, and none after
/// one that failed (it answers `retry`, unsent). A document that answers
/// 409 is read again in the next round, at most `max-conflicts` times.
pub fn mark_batch(config: &Config, batch: &[Event], now: &str) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = batch.iter().map(|_| None).collect();
    let mut conflicts = vec![0u32; batch.len()];
    // Each document's events, in batch order.
    let mut queues: Vec<std::collections::VecDeque<usize>> = Vec::new();
    let mut streams: Vec<&str> = Vec::new();
    for (i, event) in batch.iter().enumerate() {
        match streams.iter().position(|s| *s == event.stream) {
            Some(q) => queues[q].push_back(i),
            None => {
                streams.push(&event.stream);
                queues.push([i].into());
            }
        }
    }
    let finish = |outcomes: &mut Vec<Option<Outcome>>,
                  queue: &mut std::collections::VecDeque<usize>,
                  outcome: Outcome| {
        let i = queue.pop_front().expect("a head");
        let failed = !matches!(outcome, Outcome::Delivered);
        outcomes[i] = Some(outcome);
        if failed {
            for j in queue.drain(..) {
                outcomes[j] = Some(retry(format!("predecessor {} not marked", batch[i].id)));
            }
        }
    };
    loop {
        let heads: Vec<usize> = (0..queues.len())
            .filter(|q| !queues[*q].is_empty())
            .take(IN_FLIGHT)
            .collect();
        if heads.is_empty() {
            break;
        }
        let gets: Vec<http::Request> = heads
            .iter()
            .map(|q| http::Request {
                method: Method::Get,
                path: path(config, &batch[queues[*q][0]]),
                body: None,
            })
            .collect();
        let (mut putting, mut puts): (Vec<usize>, Vec<http::Request>) = (Vec::new(), Vec::new());
        for (q, got) in heads.iter().zip(http::send_all(config, &gets)) {
            let event = &batch[queues[*q][0]];
            match after_get(config, event, got, now) {
                Next::Done(outcome) => finish(&mut outcomes, &mut queues[*q], outcome),
                Next::Put(body) => {
                    putting.push(*q);
                    puts.push(http::Request {
                        method: Method::Put,
                        path: path(config, event),
                        body: Some(body),
                    });
                }
            }
        }
        for (q, put) in putting.iter().zip(http::send_all(config, &puts)) {
            let i = queues[*q][0];
            match after_put(&batch[i], put) {
                Some(outcome) => finish(&mut outcomes, &mut queues[*q], outcome),
                None => {
                    conflicts[i] += 1;
                    if conflicts[i] >= config.max_conflicts {
                        let reason = format!(
                            "document {:?}: 409 conflict {} times in a row (other writers); trying again later",
                            batch[i].stream, config.max_conflicts
                        );
                        finish(&mut outcomes, &mut queues[*q], retry(reason));
                    }
                }
            }
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|| retry("not marked".into())))
        .collect()
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
