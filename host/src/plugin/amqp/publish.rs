//! `publish-batch` on the wire: every message of a call sent on one
//! channel, then all their confirms awaited together (one confirm costs the
//! broker an fsync: about 540 messages/s one at a time against about
//! 9,500/s with 100 in flight, docs/measurements.md).
//!
//! Must never: answer `ok` for a message without a positive confirm
//! (anything in flight when a connection or channel drops, or still
//! unconfirmed at the batch deadline, is an error); give a channel with
//! confirms outstanding back to the pool.

use std::time::Instant;

use futures::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::protocol::AMQPErrorKind;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, ErrorKind};

use crate::broker::{discard, Broker};
use crate::plugin::bindings::{AmqpMessage, PublishError};

/// One answer per message of a call, `None` until decided.
type Answers = Vec<Option<Result<(), PublishError>>>;

/// A message sent and the confirm it waits for, by its slot in the answers.
type Pending = Vec<(usize, lapin::PublisherConfirm)>;

impl Broker {
    /// Publish `messages[i]` for each `i` of `todo` on one channel, then
    /// await their confirms together until `wait_until`. One answer per
    /// entry of `todo`.
    pub(super) async fn publish(
        &self,
        messages: &[AmqpMessage],
        todo: &[usize],
        wait_until: Instant,
    ) -> Vec<Result<(), PublishError>> {
        let channel = match tokio::time::timeout_at(wait_until.into(), self.channel()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(reason)) => return vec![Err(PublishError::Unavailable(reason)); todo.len()],
            Err(_) => {
                let reason = format!(
                    "broker {}: no channel before the batch deadline",
                    self.shown
                );
                return vec![Err(PublishError::Unavailable(reason)); todo.len()];
            }
        };
        let mut answers: Answers = vec![None; todo.len()];
        let (pending, sent_all) = self.send_all(&channel, messages, todo, &mut answers).await;
        let confirmed_all = self.await_confirms(pending, wait_until, &mut answers).await;
        if sent_all && confirmed_all {
            self.give_back(channel);
        } else {
            discard(channel);
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(PublishError::Unavailable("not published".into()))))
            .collect()
    }

    /// Send `messages[i]` for each `i` of `todo`, in order, on `channel`.
    /// After a failed send the rest are answered with its error unsent.
    /// Returns what waits for a confirm, and whether every send went out.
    async fn send_all(
        &self,
        channel: &Channel,
        messages: &[AmqpMessage],
        todo: &[usize],
        answers: &mut Answers,
    ) -> (Pending, bool) {
        let mut pending = Vec::with_capacity(todo.len());
        let mut send_error: Option<PublishError> = None;
        for (slot, &i) in todo.iter().enumerate() {
            if let Some(error) = &send_error {
                answers[slot] = Some(Err(error.clone()));
                continue;
            }
            let m = &messages[i];
            let options = BasicPublishOptions {
                mandatory: m.mandatory,
                immediate: false,
            };
            let sent = channel
                .basic_publish(
                    ShortString::from(m.exchange.as_str()),
                    ShortString::from(m.routing_key.as_str()),
                    options,
                    &m.payload,
                    properties(m),
                )
                .await;
            match sent {
                Ok(confirm) => pending.push((slot, confirm)),
                Err(e) => {
                    let error = self.classify(&e);
                    answers[slot] = Some(Err(error.clone()));
                    send_error = Some(error);
                }
            }
        }
        (pending, send_error.is_none())
    }

    /// Wait for every confirm of `pending` until `wait_until` and answer
    /// its slot. Returns whether the channel is still clean (every confirm
    /// came, none failed), so it can serve another batch.
    async fn await_confirms(
        &self,
        pending: Pending,
        wait_until: Instant,
        answers: &mut Answers,
    ) -> bool {
        let slots: Vec<usize> = pending.iter().map(|(slot, _)| *slot).collect();
        let confirms = tokio::time::timeout_at(
            wait_until.into(),
            join_all(pending.into_iter().map(|(_, c)| c)),
        )
        .await;
        let Ok(confirms) = confirms else {
            let reason = format!(
                "broker {}: no confirm before the batch deadline",
                self.shown
            );
            for slot in slots {
                answers[slot] = Some(Err(PublishError::Unavailable(reason.clone())));
            }
            return false;
        };
        let mut clean = true;
        // A channel the broker closed fails every later confirm with a bare
        // state error; answer those with the broker's reason.
        let mut refused: Option<String> = None;
        for (slot, confirm) in slots.iter().zip(confirms) {
            let answer = match confirm {
                Ok(confirmation) => confirmed(confirmation),
                Err(e) => {
                    clean = false;
                    match (self.classify(&e), &refused) {
                        (PublishError::Refused(reason), _) => {
                            refused = Some(reason.clone());
                            Err(PublishError::Refused(reason))
                        }
                        (_, Some(reason)) if channel_closed(&e) => {
                            Err(PublishError::Refused(reason.clone()))
                        }
                        (other, _) => Err(other),
                    }
                }
            };
            answers[*slot] = Some(answer);
        }
        clean
    }

    /// A lapin error as the guest sees it: a channel-level refusal by the
    /// broker, or the broker being unavailable.
    fn classify(&self, e: &lapin::Error) -> PublishError {
        match e.kind() {
            ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(_)) => {
                PublishError::Refused(format!(
                    "broker closed the channel: {} {}",
                    amqp.get_id(),
                    amqp.get_message()
                ))
            }
            _ => PublishError::Unavailable(format!("broker {}: {e}", self.shown)),
        }
    }
}

/// The answer a broker's confirm gives: `ok` only for a positive confirm
/// of a routed message.
fn confirmed(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(PublishError::Unroutable(format!(
            "returned by the broker: {} {} (exchange {:?}, routing key {:?})",
            returned.reply_code,
            returned.reply_text,
            returned.delivery.exchange.as_str(),
            returned.delivery.routing_key.as_str(),
        ))),
        Confirmation::Nack(returned) => Err(PublishError::Nacked(match returned {
            Some(r) => format!(
                "negative confirm from the broker ({} {})",
                r.reply_code, r.reply_text
            ),
            None => "negative confirm from the broker".to_string(),
        })),
    }
}

/// Whether `e` only says the channel is no longer usable.
fn channel_closed(e: &lapin::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidChannel(_)
    )
}

/// The content header of a message.
fn properties(m: &AmqpMessage) -> BasicProperties {
    let mut properties =
        BasicProperties::default().with_delivery_mode(if m.persistent { 2 } else { 1 });
    if let Some(content_type) = &m.content_type {
        properties = properties.with_content_type(content_type.as_str().into());
    }
    if let Some(id) = &m.message_id {
        properties = properties.with_message_id(id.as_str().into());
    }
    if !m.headers.is_empty() {
        let mut headers = FieldTable::default();
        for (name, value) in &m.headers {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(LongString::from(value.as_bytes())),
            );
        }
        properties = properties.with_headers(headers);
    }
    properties
}
