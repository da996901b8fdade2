//! Delivering a batch: each event's request built in the configured payload
//! mode, sent by the SDK's per-stream sender (`outboxd_sink::streams`:
//! different streams concurrently through the host's `http-batch` calls,
//! each stream in batch order, the rest of a stream answered `retry` once
//! one of its events is not delivered), each
//! answer judged by the SDK's HTTP table (`outboxd_sink::outcome`). Each
//! request carries the attempt's `traceparent` (`outboxd_sink::trace`).

use std::time::Duration;

use crate::awareness::{self, Prepared};
use crate::cloudevents;
use crate::config::{Config, Payload};
use outboxd_sink::batch::{self, BatchRequest};
use outboxd_sink::outcome;
use outboxd_sink::{streams, Event, Outcome};

/// POSTs every event of `batch`; `outcomes[i]` answers `batch[i]`.
pub fn deliver(config: &Config, batch: &[Event]) -> Vec<Outcome> {
    // The one response header an answer is judged by.
    batch::keep_response_headers(&["retry-after"]);
    streams::deliver(
        batch,
        config.max_concurrency,
        |event| start(config, event),
        |_, response| {
            let retry_after = response.header("retry-after");
            // The clock is read only for a `Retry-After`, the one thing
            // the time is needed for.
            let now = retry_after.map_or(Duration::ZERO, |_| batch::now());
            outcome::for_response(response.status, retry_after, &response.body, now)
        },
    )
}

/// Builds (and signs) one event's request; `Err` is an outcome decided
/// without sending.
fn start(config: &Config, event: &Event) -> Result<BatchRequest, Outcome> {
    let (mut headers, body) = match &config.payload {
        Payload::CloudEvents { key, previous } => {
            // One clock reading for the requests built between two waits.
            let timestamp = batch::now().as_secs();
            let headers = cloudevents::headers(event, key, previous.as_deref(), timestamp)
                .map_err(Outcome::Reject)?;
            (headers, event.data.clone())
        }
        Payload::Awareness { secret } => {
            match awareness::request(event, &config.target, secret.as_deref()) {
                Ok(Prepared::Send(headers, body)) => (headers, body),
                // Answered without sending, as the service never queues it.
                Ok(Prepared::Echo) => return Err(Outcome::Delivered),
                Err(reason) => return Err(Outcome::Reject(reason)),
            }
        }
    };
    outboxd_sink::trace::add_header(&mut headers, event, String::into_bytes);
    Ok(batch::post(&config.target, headers, body, config.timeout))
}
