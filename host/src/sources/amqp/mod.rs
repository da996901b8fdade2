//! The `amqp` source: consume a RabbitMQ queue, store each message as an
//! event, acknowledge it only after the commit (docs/guides/sources.md,
//! `kind = "amqp"`).
//!
//! Owns: the `[sources.NAME] kind = "amqp"` configuration
//! ([`AmqpSourceConfig`]); declaring what the source consumes (its queue,
//! durable, with `x-dead-letter-exchange`; its bindings; the dead-letter
//! exchange and queue); and one consuming session ([`run`]) on the host's
//! shared connection ([`AmqpPool`](crate::broker::AmqpPool)):
//!
//! - messages are taken in batches (up to `batch-size`, waiting at most
//!   `batch-wait` for a batch to fill; `prefetch` bounds what the broker
//!   hands out unacknowledged) and stored in one ingest transaction per
//!   batch, in queue order, so a stream's events keep their order;
//! - a message is acknowledged only after the transaction holding it
//!   committed; a duplicate (same id, same content: a broker redelivery) is
//!   acknowledged, since it is already held;
//! - a message that cannot become an event ([`mapping`]) or conflicts with
//!   a stored event (same id, other content) is dead-lettered: published to
//!   the dead-letter exchange with the reason in the `x-outboxd-reason`
//!   header and acknowledged once the broker confirmed that copy; if the
//!   copy is not confirmed, the message is rejected without requeue, so the
//!   broker dead-letters it itself by the queue's `x-dead-letter-exchange`.
//!   It never loops;
//! - while the store fails, the batch is held unacknowledged and retried
//!   with backoff; the broker hands out no more than `prefetch` meanwhile,
//!   and redelivers everything held if the session ends.
//!
//! Replicas: the queue is declared with `x-single-active-consumer`, so
//! several outboxd processes consuming it take turns (the broker hands the
//! queue to the next when the active one goes away) and never store one
//! stream's messages from two consumers at once.
//!
//! Reconnection: a session ends on any broker failure; the supervisor in
//! [`super`] starts a new one with backoff, and the pool reconnects within
//! its own backoff.
//!
//! Must never: acknowledge a message that is not stored (or dead-lettered
//! with a confirmed copy); requeue a poison message; consume anything but
//! its own queue; log the broker URL's password.

// The imports and constants of this file serve the whole folder: each
// file of it opens with `use super::*`.
mod config;
pub mod loops;
pub mod mapping;
mod relay;

pub use config::*;
pub use relay::*;

use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Confirmation, ExchangeKind};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{SinkView, Source, SourceConfig, SourceContext, SourceError, StatusHandle};
use crate::backoff::Backoff;
use crate::event::NewEvent;
use crate::metrics::SourceLabel;
use crate::redact::redact_url;
use crate::store::IngestError;
use mapping::{Field, Mapping, Message};

/// Default of `prefetch`: messages the broker hands out unacknowledged.
pub const DEFAULT_PREFETCH: u16 = 1000;
/// Default of `batch-size`: messages stored per ingest transaction.
pub const DEFAULT_BATCH_SIZE: usize = 200;
/// Largest `batch-size` (the HTTP ingest's default batch limit).
pub const MAX_BATCH_SIZE: usize = 1000;
/// Default of `batch-wait`: how long a batch waits to fill after its first
/// message.
pub const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(5);
/// First wait before storing a held batch again after the store failed; it
/// doubles up to [`INGEST_RETRY_MAX`].
pub const INGEST_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest wait between two attempts to store a held batch.
pub const INGEST_RETRY_MAX: Duration = Duration::from_secs(5);
/// Longest wait for each step of setting up a session (channel, declares,
/// consumer) and for the dead-letter confirms of a batch.
pub const BROKER_STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Header of a dead-lettered copy: why it was refused.
pub const REASON_HEADER: &str = "x-outboxd-reason";
/// Header of a dead-lettered copy: the source (`[sources.NAME]`) that refused it.
pub const SOURCE_HEADER: &str = "x-outboxd-source";
/// Header of a dead-lettered copy: the exchange the message was first
/// published to.
pub const ORIGINAL_EXCHANGE_HEADER: &str = "x-original-exchange";
/// Header of a dead-lettered copy: the routing key the message was first
/// published with.
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-original-routing-key";
/// Longest reason kept in [`REASON_HEADER`], bytes.
const MAX_REASON_BYTES: usize = 1024;

#[async_trait::async_trait]
impl Source for AmqpSourceConfig {
    fn kind(&self) -> &'static str {
        "amqp"
    }

    fn validate(&self) -> Result<(), (String, String)> {
        AmqpSourceConfig::validate(self)
    }

    fn redacted(&self) -> SourceConfig {
        SourceConfig::Amqp(AmqpSourceConfig::redacted(self))
    }

    /// None: `consumer_attached` follows the channel's state.
    fn stale_after(&self) -> Option<Duration> {
        None
    }

    /// Whether `sink` keeps apart from this source's ingress routes
    /// (docs/guides/sources.md, "Routes kept apart"): `Err` names the sink, the source and
    /// the binding its published events could land on (see [`loops`]).
    fn check_sink(&self, name: &str, sink: &SinkView<'_>) -> Result<(), String> {
        let url = self
            .resolved_url()
            .map_err(|e| format!("source {name:?}: url: {e}"))?;
        loops::check_sink(name, self, &url, sink)
    }

    async fn run(
        &self,
        name: &str,
        ctx: &SourceContext,
        status: &StatusHandle,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), SourceError> {
        relay::run(name, self, ctx, status, shutdown).await
    }
}
