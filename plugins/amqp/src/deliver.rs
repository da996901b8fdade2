//! Delivering a batch: build one message per event, publish them through the
//! host's `publish-batch` (all in flight together, confirms awaited
//! together), and turn each answer into an outcome.
//!
//! Order: events of one stream are published in batch order, and never
//! after a predecessor in the same batch that failed. An event that cannot
//! be built (its routing key needs an attribute it lacks) is rejected and
//! the rest of its stream answers `retry` unsent. With `ordering = "strict"`
//! (the default) each call carries at most one event per stream, so a
//! failure the broker reports also stops the stream's successors: a batch
//! whose streams each hold one event is one call; a stream with `n` events
//! takes `n` calls (rounds), each a confirm round trip. With `ordering =
//! "pipelined"` the whole batch is one call.
//!
//! | host answer   | outcome |
//! |---------------|---------|
//! | ok            | `delivered` |
//! | `not-allowed` | `reject` (the manifest does not grant the exchange) |
//! | `invalid`     | `reject` |
//! | `unroutable`  | `reject` or `retry`, as `unroutable` is configured |
//! | `nacked`, `refused`, `unavailable` | `retry` |

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{Config, Ordering, Unroutable};
use crate::message;
use outboxd_sink::amqp::{Message, PublishError};
use outboxd_sink::RetryInfo;
use outboxd_sink::{Event, Outcome};

/// Publishes every event of `batch` with `publish` (the host's
/// `publish-batch`); `outcomes[i]` answers `batch[i]`.
pub fn deliver(
    config: &Config,
    batch: &[Event],
    publish: impl Fn(&[Message]) -> Vec<Result<(), PublishError>>,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
    // Streams with a failed event in this batch: why, for its successors.
    let mut blocked: BTreeMap<&str, Outcome> = BTreeMap::new();
    // Built up front; taken out when sent. `Err`: why it cannot be sent.
    let mut messages: Vec<Option<Result<Message, String>>> = batch
        .iter()
        .map(|event| Some(message::message(config, event)))
        .collect();
    loop {
        let mut round: Vec<usize> = Vec::new();
        let mut in_round: BTreeSet<&str> = BTreeSet::new();
        for (i, event) in batch.iter().enumerate() {
            if outcomes[i].is_some() {
                continue;
            }
            let stream = event.stream.as_str();
            if let Some(cause) = blocked.get(stream) {
                outcomes[i] = Some(cause.clone());
                continue;
            }
            if config.ordering == Ordering::Strict && in_round.contains(stream) {
                continue;
            }
            if let Some(Err(reason)) = &messages[i] {
                let rejected = Outcome::Reject(reason.clone());
                blocked.insert(stream, predecessor_failed(event, &rejected));
                outcomes[i] = Some(rejected);
                continue;
            }
            in_round.insert(stream);
            round.push(i);
        }
        if round.is_empty() {
            break;
        }
        let sent: Vec<Message> = round
            .iter()
            .filter_map(|&i| messages[i].take().and_then(Result::ok))
            .collect();
        let answers = publish(&sent);
        for (slot, &i) in round.iter().enumerate() {
            let outcome = match answers.get(slot) {
                Some(Ok(())) => Outcome::Delivered,
                Some(Err(error)) => outcome_for(config, error),
                None => retry(format!(
                    "the host answered {} of {} messages",
                    answers.len(),
                    sent.len()
                )),
            };
            if !matches!(outcome, Outcome::Delivered) {
                blocked.insert(
                    batch[i].stream.as_str(),
                    predecessor_failed(&batch[i], &outcome),
                );
            }
            outcomes[i] = Some(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|| retry("not published".into())))
        .collect()
}

/// What an error from `publish-batch` means for the event.
pub fn outcome_for(config: &Config, error: &PublishError) -> Outcome {
    match error {
        PublishError::NotAllowed(reason) => Outcome::Reject(format!("not allowed: {reason}")),
        PublishError::Invalid(reason) => Outcome::Reject(format!("invalid message: {reason}")),
        PublishError::Unroutable(reason) => {
            let reason = format!("unroutable: {reason}");
            match config.unroutable {
                Unroutable::Reject => Outcome::Reject(reason),
                Unroutable::Retry => retry(reason),
            }
        }
        PublishError::Nacked(reason) => retry(format!("nacked: {reason}")),
        PublishError::Refused(reason) => retry(format!("refused: {reason}")),
        PublishError::Unavailable(reason) => retry(format!("unavailable: {reason}")),
    }
}

/// The answer for the successors of `event`, which was not delivered.
fn predecessor_failed(event: &Event, outcome: &Outcome) -> Outcome {
    Outcome::Retry(RetryInfo {
        reason: format!("predecessor {} not delivered", event.id),
        after_ms: match outcome {
            Outcome::Retry(info) => info.after_ms,
            _ => None,
        },
    })
}

fn retry(reason: String) -> Outcome {
    Outcome::Retry(RetryInfo {
        reason,
        after_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn event(id: &str, stream: &str, ty: &str) -> Event {
        Event {
            id: id.into(),
            source: "/s".into(),
            type_: ty.into(),
            subject: None,
            stream: stream.into(),
            sequence: 1,
            time: "2026-11-30T01:02:03Z".into(),
            datacontenttype: None,
            dataschema: None,
            data: vec![],
            extensions: vec![],
            attempt: 1,
            ingested_at: "2026-11-30T01:02:03Z".into(),
        }
    }

    fn config(extra: &[(&str, &str)]) -> Config {
        let mut entries = vec![
            ("exchange".to_string(), "x".to_string()),
            ("routing-key".to_string(), "k.{type}".to_string()),
        ];
        entries.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Config::parse(&entries).unwrap()
    }

    /// A broker where routing key `k.bad` is unroutable; records each call's ids.
    fn broker(
        calls: &RefCell<Vec<Vec<String>>>,
    ) -> impl Fn(&[Message]) -> Vec<Result<(), PublishError>> + '_ {
        move |messages| {
            calls.borrow_mut().push(
                messages
                    .iter()
                    .map(|m| m.message_id.clone().unwrap())
                    .collect(),
            );
            messages
                .iter()
                .map(|m| {
                    if m.routing_key == "k.bad" {
                        Err(PublishError::Unroutable("312 NO_ROUTE".into()))
                    } else {
                        Ok(())
                    }
                })
                .collect()
        }
    }

    #[test]
    fn strict_rounds_take_one_event_per_stream_and_stop_a_failed_stream() {
        let calls = RefCell::new(Vec::new());
        let batch = vec![
            event("a1", "a", "ok"),
            event("b1", "b", "bad"),
            event("a2", "a", "ok"),
            event("b2", "b", "ok"),
            event("c1", "c", "ok"),
        ];
        let outcomes = deliver(&config(&[]), &batch, broker(&calls));
        assert_eq!(
            *calls.borrow(),
            vec![vec!["a1", "b1", "c1"], vec!["a2"]],
            "b2 must never be sent"
        );
        assert!(matches!(outcomes[0], Outcome::Delivered));
        assert!(matches!(&outcomes[1], Outcome::Reject(r) if r.contains("unroutable")));
        assert!(matches!(outcomes[2], Outcome::Delivered));
        assert!(
            matches!(&outcomes[3], Outcome::Retry(i) if i.reason == "predecessor b1 not delivered")
        );
        assert!(matches!(outcomes[4], Outcome::Delivered));
    }

    #[test]
    fn pipelined_is_one_call_and_unroutable_can_retry() {
        let calls = RefCell::new(Vec::new());
        let batch = vec![
            event("a1", "a", "ok"),
            event("a2", "a", "bad"),
            event("a3", "a", "ok"),
        ];
        let outcomes = deliver(
            &config(&[("ordering", "pipelined"), ("unroutable", "retry")]),
            &batch,
            broker(&calls),
        );
        assert_eq!(calls.borrow().len(), 1);
        assert!(matches!(outcomes[0], Outcome::Delivered));
        assert!(matches!(&outcomes[1], Outcome::Retry(i) if i.reason.contains("unroutable")));
        // Already sent with its predecessor; the broker has it.
        assert!(matches!(outcomes[2], Outcome::Delivered));
    }

    #[test]
    fn an_event_that_cannot_be_built_is_rejected_and_its_successors_wait_unsent() {
        let calls = RefCell::new(Vec::new());
        let cfg = Config::parse(&[
            ("exchange".to_string(), "x".to_string()),
            ("routing-key".to_string(), "k.{subject}".to_string()),
        ])
        .unwrap();
        let mut with_subject = event("a2", "a", "t");
        with_subject.subject = Some("s".into());
        let batch = vec![event("a1", "a", "t"), with_subject];
        let outcomes = deliver(&cfg, &batch, broker(&calls));
        assert!(calls.borrow().is_empty(), "nothing publishable");
        assert!(matches!(&outcomes[0], Outcome::Reject(r) if r.contains("{subject}")));
        assert!(matches!(&outcomes[1], Outcome::Retry(i) if i.reason.contains("predecessor a1")));
    }

    #[test]
    fn answers_map_to_outcomes() {
        let c = config(&[]);
        assert!(matches!(
            outcome_for(&c, &PublishError::NotAllowed("x".into())),
            Outcome::Reject(_)
        ));
        assert!(matches!(
            outcome_for(&c, &PublishError::Invalid("x".into())),
            Outcome::Reject(_)
        ));
        assert!(matches!(
            outcome_for(&c, &PublishError::Nacked("x".into())),
            Outcome::Retry(_)
        ));
        assert!(matches!(
            outcome_for(&c, &PublishError::Refused("x".into())),
            Outcome::Retry(_)
        ));
        assert!(matches!(
            outcome_for(&c, &PublishError::Unavailable("x".into())),
            Outcome::Retry(_)
        ));
    }
}
