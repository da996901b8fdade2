//! Delivering a batch: each event's request built in the configured payload
//! mode, sent by the SDK's per-stream sender (`outboxd_sink::streams`:
//! different streams concurrently, each stream in batch order, the rest of a
//! stream answered `retry` once one of its events is not delivered), each
//! answer judged by the SDK's HTTP table (`outboxd_sink::outcome`). Each
//! request carries the attempt's `traceparent` (`outboxd_sink::trace`).

use std::borrow::Cow;

use crate::awareness::{self, Prepared};
use crate::cloudevents;
use crate::config::{Config, Payload};
use outboxd_sink::outcome;
use outboxd_sink::pending::{self, Answer, Post, Progress, Request};
use outboxd_sink::{streams, Event, Outcome};

/// POSTs every event of `batch`; `outcomes[i]` answers `batch[i]`.
pub fn deliver(config: &Config, batch: &[Event]) -> Vec<Outcome> {
    streams::deliver(
        batch,
        config.max_concurrency,
        |event| start(config, event),
        |_, response| {
            outcome::for_response(
                response.status,
                response.header("retry-after"),
                &response.body,
                pending::now(),
            )
        },
    )
}

/// Builds (and signs) one event's request and starts it.
fn start<'a>(config: &Config, event: &'a Event) -> Progress<'a> {
    let built = match &config.payload {
        Payload::CloudEvents { key, previous } => {
            let timestamp = pending::now().as_secs();
            cloudevents::headers(event, key, previous.as_deref(), timestamp)
                .map(|headers| (headers, Cow::Borrowed(event.data.as_slice())))
        }
        Payload::Awareness { secret } => {
            match awareness::request(event, &config.target, secret.as_deref()) {
                Ok(Prepared::Send(headers, body)) => Ok((headers, Cow::Owned(body))),
                // Answered without sending, as the service never queues it.
                Ok(Prepared::Echo) => return Progress::Done(Answer::Decided(Outcome::Delivered)),
                Err(reason) => Err(reason),
            }
        }
    };
    match built {
        Ok((mut headers, body)) => {
            outboxd_sink::trace::add_header(&mut headers, event, String::into_bytes);
            let post = Post {
                url: &config.target,
                headers: &headers,
                timeout: config.timeout,
            };
            Request::start(post, body)
        }
        Err(reason) => Progress::Done(Answer::Decided(Outcome::Reject(reason))),
    }
}
