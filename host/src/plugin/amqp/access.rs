//! One plugin's publishing rights ([`AmqpAccess`]): the check of each
//! message against the manifest's exchange patterns and AMQP's own limits,
//! before anything reaches a broker, and `publish-batch` itself.
//!
//! Must never: touch a broker for a message whose exchange the manifest
//! does not grant.

use std::sync::Arc;
use std::time::Instant;

use crate::broker::{AmqpPool, Broker};
use crate::limits::{AMQP_CONFIRM_TIMEOUT as CONFIRM_TIMEOUT, DEADLINE_MARGIN};
use crate::plugin::bindings::{AmqpMessage, PublishError};
use crate::plugin::manifest::AmqpCapability;

/// Most messages in one `publish-batch` call; the rest are answered
/// `invalid` unsent.
pub const MAX_MESSAGES_PER_CALL: usize = 10_000;
/// An AMQP short string (exchange, routing key, property, header name).
const MAX_SHORT_STRING: usize = 255;

impl AmqpPool {
    /// The publishing rights of a plugin with capability `grant` (none: every
    /// publish is `not-allowed`). Checks the URL, but does not connect.
    pub fn access(&self, grant: Option<&AmqpCapability>) -> Result<AmqpAccess, String> {
        let Some(grant) = grant else {
            return Ok(AmqpAccess::denied());
        };
        if grant.exchanges.is_empty() {
            return Err("exchanges: names no exchange; list the exchanges (or `*` patterns) the plugin may publish to".into());
        }
        let broker = self.broker(&grant.url).map_err(|e| format!("url: {e}"))?;
        Ok(AmqpAccess {
            broker: Some(broker),
            exchanges: grant.exchanges.clone().into(),
            deadline: None,
        })
    }
}

/// One plugin's publishing rights: its broker and its exchange patterns.
/// Cheap to clone; the runtime makes one per batch with
/// [`for_batch`](Self::for_batch).
#[derive(Clone)]
pub struct AmqpAccess {
    /// `None`: the manifest grants no AMQP.
    broker: Option<Arc<Broker>>,
    /// `*` glob patterns of the exchanges allowed.
    exchanges: Arc<[String]>,
    /// When the batch must be answered; confirms are awaited until
    /// [`DEADLINE_MARGIN`] before it.
    deadline: Option<Instant>,
}

impl AmqpAccess {
    /// No AMQP at all: every message is `not-allowed`.
    pub fn denied() -> AmqpAccess {
        AmqpAccess {
            broker: None,
            exchanges: Arc::from(Vec::new()),
            deadline: None,
        }
    }

    /// The same rights for a batch that must be answered by `deadline`.
    pub fn for_batch(&self, deadline: Instant) -> AmqpAccess {
        AmqpAccess {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// Whether `exchange` is granted.
    pub fn allows(&self, exchange: &str) -> bool {
        self.broker.is_some()
            && self
                .exchanges
                .iter()
                .any(|p| crate::event::glob_match(p, exchange))
    }

    /// Publish `messages` (see `publish-batch` in `wit/sink.wit`): one answer
    /// per message, in order.
    pub async fn publish_batch(&self, messages: Vec<AmqpMessage>) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        for (i, message) in messages.iter().enumerate() {
            results[i] = self.refuse(i, message).map(Err);
        }
        let todo: Vec<usize> = (0..messages.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if let (Some(broker), false) = (&self.broker, todo.is_empty()) {
            let wait_until = self.wait_until();
            let answers = broker.publish(&messages, &todo, wait_until).await;
            for (i, answer) in todo.into_iter().zip(answers) {
                results[i] = Some(answer);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(PublishError::Unavailable("not published".into()))))
            .collect()
    }

    /// When to stop waiting for confirms.
    fn wait_until(&self) -> Instant {
        let cap = Instant::now() + CONFIRM_TIMEOUT;
        match self.deadline {
            Some(deadline) => deadline
                .checked_sub(DEADLINE_MARGIN)
                .unwrap_or(deadline)
                .min(cap),
            None => cap,
        }
    }

    /// Why message `i` is answered without touching the broker, if it is.
    fn refuse(&self, i: usize, message: &AmqpMessage) -> Option<PublishError> {
        if self.broker.is_none() {
            return Some(PublishError::NotAllowed(
                "this plugin has no AMQP capability (add capabilities.amqp to its manifest)".into(),
            ));
        }
        if !self.allows(&message.exchange) {
            return Some(PublishError::NotAllowed(format!(
                "exchange {:?} is not granted to this plugin (capabilities.amqp.exchanges: {})",
                message.exchange,
                self.exchanges.join(", ")
            )));
        }
        if i >= MAX_MESSAGES_PER_CALL {
            return Some(PublishError::Invalid(format!(
                "more than {MAX_MESSAGES_PER_CALL} messages in one publish-batch call"
            )));
        }
        check_message(message).err().map(PublishError::Invalid)
    }
}

/// Names and values AMQP cannot carry, caught before sending (lapin would
/// truncate or fail the whole channel).
fn check_message(message: &AmqpMessage) -> Result<(), String> {
    let short = |what: &str, value: &str| {
        if value.len() > MAX_SHORT_STRING {
            Err(format!(
                "{what} is {} bytes; AMQP allows at most {MAX_SHORT_STRING}",
                value.len()
            ))
        } else {
            Ok(())
        }
    };
    short("exchange", &message.exchange)?;
    short("routing key", &message.routing_key)?;
    if let Some(v) = &message.content_type {
        short("content-type", v)?;
    }
    if let Some(v) = &message.message_id {
        short("message-id", v)?;
    }
    let mut names: Vec<&str> = Vec::with_capacity(message.headers.len());
    for (name, _) in &message.headers {
        short(&format!("header name {name:?}"), name)?;
        if names.contains(&name.as_str()) {
            return Err(format!("header {name:?} is given more than once"));
        }
        names.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn message(exchange: &str) -> AmqpMessage {
        AmqpMessage {
            exchange: exchange.into(),
            routing_key: "k".into(),
            payload: vec![],
            content_type: None,
            message_id: None,
            headers: vec![],
            persistent: true,
            mandatory: true,
        }
    }

    #[tokio::test]
    async fn exchanges_outside_the_grant_are_refused_without_a_broker() {
        let pool = AmqpPool::new();
        // Port 1: nothing listens; a refusal must not even try.
        let grant = AmqpCapability {
            url: "amqp://guest:guest@127.0.0.1:1/%2f".into(),
            exchanges: vec!["events.*".into()],
        };
        let access = pool.access(Some(&grant)).unwrap();
        assert!(access.allows("events.orders"));
        assert!(!access.allows("documents"));
        let answers = access
            .publish_batch(vec![message("documents"), message("other")])
            .await;
        for answer in answers {
            assert!(
                matches!(&answer, Err(PublishError::NotAllowed(r)) if r.contains("not granted")),
                "{answer:?}"
            );
        }
        assert_eq!(
            pool.status()[0].last_error,
            None,
            "the broker was never tried"
        );

        let answers = AmqpAccess::denied()
            .publish_batch(vec![message("events.x")])
            .await;
        assert!(
            matches!(&answers[0], Err(PublishError::NotAllowed(r)) if r.contains("no AMQP capability"))
        );
    }

    #[tokio::test]
    async fn an_unreachable_broker_is_unavailable_and_backs_off() {
        let pool = AmqpPool::new();
        let grant = AmqpCapability {
            url: "amqp://guest:hunter2@127.0.0.1:1/%2f".into(),
            exchanges: vec!["*".into()],
        };
        let access = pool.access(Some(&grant)).unwrap();
        let answers = access.publish_batch(vec![message("x"), message("y")]).await;
        for answer in &answers {
            assert!(
                matches!(answer, Err(PublishError::Unavailable(r)) if !r.contains("hunter2")),
                "{answer:?}"
            );
        }
        // Within the backoff the next call fails at once, naming the wait.
        let started = Instant::now();
        let answers = access.publish_batch(vec![message("x")]).await;
        assert!(
            matches!(&answers[0], Err(PublishError::Unavailable(r)) if r.contains("next attempt")),
            "{answers:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(100));
        let status = pool.status();
        assert!(!status[0].connected && status[0].last_error.is_some());
        assert!(!status[0].broker.contains("hunter2"));
    }

    #[test]
    fn oversized_names_and_duplicate_headers_are_invalid() {
        let mut m = message("x");
        m.routing_key = "k".repeat(256);
        assert!(check_message(&m).unwrap_err().contains("routing key"));
        let mut m = message("x");
        m.headers = vec![("a".into(), "1".into()), ("a".into(), "2".into())];
        assert!(check_message(&m).unwrap_err().contains("more than once"));
    }
}
