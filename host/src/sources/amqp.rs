//! The `amqp` source: consume a RabbitMQ queue, store each message as an
//! event, acknowledge it only after the commit (README, Sources,
//! `kind = "amqp"`).
//!
//! Owns: the `[sources.NAME] kind = "amqp"` configuration
//! ([`AmqpSourceConfig`]); declaring what the source consumes (its queue,
//! durable, with `x-dead-letter-exchange`; its bindings; the dead-letter
//! exchange and queue); and one consuming session ([`run`]) on the host's
//! shared connection ([`AmqpPool`](crate::plugin::amqp::AmqpPool)):
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

pub mod loops;
pub mod mapping;

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

use super::{SourceConfig, SourceContext, StatusHandle};
use crate::backoff::Backoff;
use crate::event::NewEvent;
use crate::metrics::SourceLabel;
use crate::plugin::amqp::redact_url;
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

/// `[sources.NAME] kind = "amqp"`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AmqpSourceConfig {
    /// Broker URL, `amqp://user:password@host:port/vhost` (vhost
    /// percent-encoded). Write it as a `${VAR}` reference (or set
    /// `OUTBOXD_SOURCES__NAME__URL`) so the password comes from the
    /// environment; it is never logged or shown.
    pub url: String,
    /// The queue consumed; declared durable with `x-dead-letter-exchange`.
    pub queue: String,
    /// The bindings declared for the queue: only these routes reach it.
    #[serde(default)]
    pub bindings: Vec<Binding>,
    /// Messages the broker hands out before any is acknowledged. At least
    /// `batch-size`. Default [`DEFAULT_PREFETCH`].
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// Messages per ingest transaction, 1 to [`MAX_BATCH_SIZE`]. Default
    /// [`DEFAULT_BATCH_SIZE`].
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// How long a batch waits to fill after its first message. Default
    /// [`DEFAULT_BATCH_WAIT`].
    #[serde(default = "default_batch_wait", with = "humantime_serde")]
    pub batch_wait: Duration,
    /// Declare the queue with `x-single-active-consumer`, so that replicas
    /// consuming it take turns (one at a time, the next takes over when it
    /// goes away) and a stream's messages are never stored by two consumers
    /// at once, out of order. Default true.
    #[serde(default = "yes")]
    pub single_active_consumer: bool,
    /// Dead-letter exchange (fanout, durable). Default `<queue>.dead-letter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_exchange: Option<String>,
    /// Queue bound to the dead-letter exchange. Default `<queue>.dead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_queue: Option<String>,
    /// CloudEvents `source` of plain messages. Default `/amqp/<queue>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_source: Option<String>,
    /// Header holding a plain message's id when it has no `message-id`.
    /// Unset: a message without `message-id` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_header: Option<String>,
    /// A plain message's type: `routing-key` (default) or `header:NAME`
    /// (or a JSON path into the body).
    #[serde(default = "routing_key", rename = "type")]
    pub type_from: String,
    /// A plain message's stream: `routing-key` (default), `header:NAME`, or
    /// a JSON path into the body (`$.order.id`, or a JSON Pointer as
    /// `json:/order/id`).
    #[serde(default = "routing_key", rename = "stream")]
    pub stream_from: String,
}

/// One exchange and the routing-key patterns bound from it to the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Binding {
    /// Declared durable (of `exchange-kind`) if it does not exist.
    pub exchange: String,
    /// Patterns such as `documents.ingest.#`, `documents.update.#`.
    pub routing_keys: Vec<String>,
    /// `topic` (default), `direct`, `fanout` or `headers`.
    #[serde(default = "topic")]
    pub exchange_kind: String,
}

fn default_prefetch() -> u16 {
    DEFAULT_PREFETCH
}
fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}
fn default_batch_wait() -> Duration {
    DEFAULT_BATCH_WAIT
}
fn yes() -> bool {
    true
}
fn routing_key() -> String {
    "routing-key".into()
}
fn topic() -> String {
    "topic".into()
}

impl std::fmt::Debug for AmqpSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSourceConfig")
            .field("url", &redact_url(&self.url))
            .field("queue", &self.queue)
            .field("bindings", &self.bindings)
            .field("prefetch", &self.prefetch)
            .field("batch_size", &self.batch_size)
            .field("batch_wait", &self.batch_wait)
            .finish_non_exhaustive()
    }
}

/// An AMQP short string: at most 255 bytes.
const MAX_SHORT_STRING: usize = 255;

/// `Err((key, problem))` unless `value` fits an AMQP short string (1 to
/// [`MAX_SHORT_STRING`] bytes).
fn short(key: &str, value: &str) -> Result<(), (String, String)> {
    if value.is_empty() || value.len() > MAX_SHORT_STRING {
        Err((
            key.to_string(),
            format!("must be 1 to {MAX_SHORT_STRING} bytes, got {}", value.len()),
        ))
    } else {
        Ok(())
    }
}

impl AmqpSourceConfig {
    /// The URL with `${VAR}` references resolved. Errors name the variable,
    /// never a value.
    pub fn resolved_url(&self) -> Result<String, String> {
        crate::plugin::manifest::interpolate(&self.url)
    }

    /// The dead-letter exchange in force.
    pub fn dead_letter_exchange(&self) -> String {
        self.dead_letter_exchange
            .clone()
            .unwrap_or_else(|| format!("{}.dead-letter", self.queue))
    }

    /// The dead-letter queue in force.
    pub fn dead_letter_queue(&self) -> String {
        self.dead_letter_queue
            .clone()
            .unwrap_or_else(|| format!("{}.dead", self.queue))
    }

    /// How plain messages are read.
    pub fn mapping(&self) -> Result<Mapping, (String, String)> {
        let field = |key: &str, spec: &str| Field::parse(spec).map_err(|p| (key.to_string(), p));
        Ok(Mapping {
            event_source: self
                .event_source
                .clone()
                .unwrap_or_else(|| format!("/amqp/{}", self.queue)),
            id_header: self.id_header.clone(),
            type_from: field("type", &self.type_from)?,
            stream_from: field("stream", &self.stream_from)?,
        })
    }

    /// Check what types cannot. `Err((key, problem))`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        let url = match self.resolved_url() {
            Ok(url) => url,
            Err(e) => return bad("url", e),
        };
        if let Err(e) = crate::plugin::amqp::check_url(&url) {
            return bad("url", e);
        }
        short("queue", &self.queue)?;
        short("dead-letter-exchange", &self.dead_letter_exchange())?;
        short("dead-letter-queue", &self.dead_letter_queue())?;
        if self.dead_letter_queue() == self.queue {
            return bad(
                "dead-letter-queue",
                "must not be the consumed queue: dead letters would be consumed again".into(),
            );
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return bad(
                "batch-size",
                format!("must be 1 to {MAX_BATCH_SIZE}, got {}", self.batch_size),
            );
        }
        if (self.prefetch as usize) < self.batch_size {
            return bad(
                "prefetch",
                format!(
                    "is {}, below batch-size {}: a batch could never fill",
                    self.prefetch, self.batch_size
                ),
            );
        }
        if let Some(h) = &self.id_header {
            short("id-header", h)?;
        }
        if let Some(s) = &self.event_source {
            if s.is_empty() {
                return bad("event-source", "must not be empty".into());
            }
        }
        self.validate_bindings()?;
        self.mapping()?;
        Ok(())
    }

    /// Check each of `bindings`: exchange, kind and routing keys.
    fn validate_bindings(&self) -> Result<(), (String, String)> {
        let bad_key = |key: &str, problem: String| Err((key.to_string(), problem));
        for (i, b) in self.bindings.iter().enumerate() {
            short(&format!("bindings[{i}].exchange"), &b.exchange)?;
            if b.exchange == self.dead_letter_exchange() {
                return bad_key(
                    &format!("bindings[{i}].exchange"),
                    "is the dead-letter exchange: dead letters would be consumed again".into(),
                );
            }
            if exchange_kind(&b.exchange_kind).is_none() {
                return bad_key(
                    &format!("bindings[{i}].exchange-kind"),
                    format!(
                        "{:?}: expected topic, direct, fanout or headers",
                        b.exchange_kind
                    ),
                );
            }
            if b.routing_keys.is_empty() {
                return bad_key(
                    &format!("bindings[{i}].routing-keys"),
                    "names no routing key (a topic binding takes patterns such as `documents.ingest.#`)"
                        .into(),
                );
            }
            for (j, k) in b.routing_keys.iter().enumerate() {
                if k.len() > MAX_SHORT_STRING {
                    return bad_key(
                        &format!("bindings[{i}].routing-keys[{j}]"),
                        format!("is {} bytes; AMQP allows {MAX_SHORT_STRING}", k.len()),
                    );
                }
            }
        }
        Ok(())
    }

    /// The same configuration, the URL's password replaced (a `${VAR}`
    /// reference is shown as written).
    pub fn redacted(&self) -> AmqpSourceConfig {
        AmqpSourceConfig {
            url: redact_url(&self.url),
            ..self.clone()
        }
    }
}

fn exchange_kind(kind: &str) -> Option<ExchangeKind> {
    match kind {
        "topic" => Some(ExchangeKind::Topic),
        "direct" => Some(ExchangeKind::Direct),
        "fanout" => Some(ExchangeKind::Fanout),
        "headers" => Some(ExchangeKind::Headers),
        _ => None,
    }
}

/// The readiness check of an `amqp` source: its consumer is registered on
/// the queue (a replica waiting its turn under `x-single-active-consumer`
/// is attached too).
pub const CONSUMER_ATTACHED: &str = "consumer_attached";

/// Run one session of source `name` until `shutdown` (then `Ok`) or a
/// failure (`Err`, naming what failed; the supervisor starts again). The
/// session's channel is closed at the end, so the broker requeues whatever
/// it held unacknowledged.
pub async fn run(
    name: &str,
    config: &AmqpSourceConfig,
    ctx: &SourceContext,
    status: &StatusHandle,
    shutdown: watch::Receiver<bool>,
) -> Result<(), String> {
    let mapping = config.mapping().map_err(|(k, p)| format!("{k}: {p}"))?;
    let url = config.resolved_url()?;
    let connection = ctx.amqp.connection(&url).await?;
    let channel = step("open a channel", connection.create_channel()).await?;
    let mut session = Session {
        name,
        config,
        ctx,
        status,
        mapping,
        channel: channel.clone(),
        held: 0,
    };
    let result = session.consume(shutdown).await;
    let detached = match &result {
        Ok(()) => "stopped".to_string(),
        Err(e) => e.clone(),
    };
    status.check(CONSUMER_ATTACHED, false, Some(detached), None);
    session.set_held(0);
    if channel.status().connected() {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            channel.close(200, "outboxd: source stopped".into()),
        )
        .await;
    }
    result
}

/// Await one broker step for at most [`BROKER_STEP_TIMEOUT`].
async fn step<T>(
    what: &str,
    f: impl std::future::Future<Output = lapin::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(BROKER_STEP_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {BROKER_STEP_TIMEOUT:?}")),
    }
}

struct Session<'a> {
    name: &'a str,
    config: &'a AmqpSourceConfig,
    ctx: &'a SourceContext,
    status: &'a StatusHandle,
    mapping: Mapping,
    channel: Channel,
    /// Messages taken and not yet acknowledged or rejected.
    held: usize,
}

/// A message of a batch that cannot be stored: its index in the batch and
/// the reason it is dead-lettered with.
type Poison = (usize, String);

/// What the session does after a batch.
enum Flow {
    Continue,
    Stop,
}

impl Session<'_> {
    fn set_held(&mut self, held: usize) {
        self.held = held;
        self.ctx
            .metrics
            .source_unacked
            .get_or_create(&SourceLabel {
                source: self.name.to_string(),
            })
            .set(held as i64);
    }

    /// Declare the queue, its dead-letter exchange and queue, and its
    /// bindings (all durable).
    async fn declare(&self) -> Result<(), String> {
        self.declare_dead_letter().await?;
        self.declare_queue().await?;
        self.declare_bindings().await
    }

    /// The dead-letter exchange (fanout) and queue, bound together.
    async fn declare_dead_letter(&self) -> Result<(), String> {
        let ch = &self.channel;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let dlx = self.config.dead_letter_exchange();
        let dlq = self.config.dead_letter_queue();
        step(
            &format!("declare dead-letter exchange {dlx:?}"),
            ch.exchange_declare(
                dlx.as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            ),
        )
        .await?;
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        step(
            &format!("declare dead-letter queue {dlq:?}"),
            ch.queue_declare(dlq.as_str().into(), durable_queue, FieldTable::default()),
        )
        .await?;
        step(
            &format!("bind dead-letter queue {dlq:?} to {dlx:?}"),
            ch.queue_bind(
                dlq.as_str().into(),
                dlx.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        Ok(())
    }

    /// The consumed queue: durable, dead-lettering to the dead-letter
    /// exchange, single active consumer when configured.
    async fn declare_queue(&self) -> Result<(), String> {
        let ch = &self.channel;
        let dlx = self.config.dead_letter_exchange();
        let queue = &self.config.queue;
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from(dlx.as_bytes())),
        );
        if self.config.single_active_consumer {
            arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        }
        step(
            &format!(
                "declare queue {queue:?} (durable, x-dead-letter-exchange {dlx:?}, x-single-active-consumer {}; \
                 a queue declared before with other arguments must be deleted or given those)",
                self.config.single_active_consumer
            ),
            ch.queue_declare(queue.as_str().into(), durable_queue, arguments),
        )
        .await?;
        Ok(())
    }

    /// Each binding's exchange (durable, of its kind) and its routing keys
    /// bound to the queue.
    async fn declare_bindings(&self) -> Result<(), String> {
        let ch = &self.channel;
        let queue = &self.config.queue;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        for binding in &self.config.bindings {
            let kind = exchange_kind(&binding.exchange_kind).unwrap_or(ExchangeKind::Topic);
            step(
                &format!("declare exchange {:?}", binding.exchange),
                ch.exchange_declare(
                    binding.exchange.as_str().into(),
                    kind,
                    durable,
                    FieldTable::default(),
                ),
            )
            .await?;
            for key in &binding.routing_keys {
                step(
                    &format!(
                        "bind queue {queue:?} to exchange {:?} with {key:?}",
                        binding.exchange
                    ),
                    ch.queue_bind(
                        queue.as_str().into(),
                        binding.exchange.as_str().into(),
                        key.as_str().into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    ),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn consume(&mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), String> {
        step(
            "confirm mode",
            self.channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        step(
            "basic.qos",
            self.channel
                .basic_qos(self.config.prefetch, BasicQosOptions::default()),
        )
        .await?;
        self.declare().await?;
        let tag = format!("outboxd-source-{}", self.name);
        let mut consumer = step(
            &format!("consume queue {:?}", self.config.queue),
            self.channel.basic_consume(
                self.config.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        self.status.check(CONSUMER_ATTACHED, true, None, None);
        self.status.cycle();
        tracing::info!(source = %self.name, queue = %self.config.queue, "AMQP source consuming");

        let lost = |e: Option<lapin::Error>| match e {
            Some(e) => format!("consumer of queue {:?}: {e}", self.config.queue),
            None => format!(
                "consumer of queue {:?} was cancelled by the broker",
                self.config.queue
            ),
        };
        loop {
            let first = tokio::select! {
                next = consumer.next() => next,
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            };
            let first = match first {
                Some(Ok(d)) => d,
                Some(Err(e)) => return Err(lost(Some(e))),
                None => return Err(lost(None)),
            };
            let mut batch = vec![first];
            let until = tokio::time::Instant::now() + self.config.batch_wait;
            let mut broken = None;
            while batch.len() < self.config.batch_size {
                match tokio::time::timeout_at(until, consumer.next()).await {
                    Ok(Some(Ok(d))) => batch.push(d),
                    Ok(Some(Err(e))) => {
                        broken = Some(lost(Some(e)));
                        break;
                    }
                    Ok(None) => {
                        broken = Some(lost(None));
                        break;
                    }
                    Err(_) => break,
                }
            }
            if let Some(e) = broken {
                // The channel is gone: nothing can be acknowledged on it;
                // the broker redelivers the batch to the next session.
                return Err(e);
            }
            self.set_held(self.held + batch.len());
            self.ctx
                .metrics
                .source_message(self.name, "consumed", batch.len() as u64);
            match self.settle(batch, &mut shutdown).await? {
                Flow::Continue => {}
                Flow::Stop => return Ok(()),
            }
        }
    }

    /// Store, dead-letter and acknowledge one batch.
    async fn settle(
        &mut self,
        batch: Vec<Delivery>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Flow, String> {
        let (mapped, mut poison) = self.map_batch(&batch);
        self.ctx.metrics.ingested("rejected", poison.len() as u64);
        let Some((stored, duplicate)) = self
            .store(batch.len(), mapped, &mut poison, shutdown)
            .await?
        else {
            return Ok(Flow::Stop);
        };
        poison.sort_by_key(|(i, _)| *i);
        let rejected = self.dead_letter(&batch, &poison).await?;
        self.acknowledge(&batch, &rejected).await?;
        let m = &self.ctx.metrics;
        m.source_message(self.name, "stored", stored);
        m.source_message(self.name, "duplicate", duplicate);
        m.source_message(self.name, "dead_lettered", poison.len() as u64);
        self.set_held(self.held.saturating_sub(batch.len()));
        self.status.cycle();
        Ok(Flow::Continue)
    }

    /// Each message of `batch` as an event, by its index, or the reason it
    /// cannot be one (poison, by its index).
    fn map_batch(&self, batch: &[Delivery]) -> (Vec<(usize, NewEvent)>, Vec<Poison>) {
        let mut poison: Vec<Poison> = Vec::new();
        let mut mapped: Vec<(usize, NewEvent)> = Vec::new();
        for (i, d) in batch.iter().enumerate() {
            let message = Message {
                routing_key: d.routing_key.as_str(),
                properties: &d.properties,
                body: &d.data,
            };
            match mapping::to_event(&self.mapping, &message) {
                Ok(event) => mapped.push((i, event)),
                Err(e) => poison.push((i, e.0)),
            }
        }
        (mapped, poison)
    }

    /// Ingest `mapped` in one transaction, moving each event the store
    /// refuses as a conflict to `poison` and trying the rest again; while
    /// the store is unavailable, hold the `held` messages unacknowledged and
    /// retry with backoff. `Some((stored, duplicate))`, or `None` when
    /// shutdown came first.
    async fn store(
        &mut self,
        held: usize,
        mut mapped: Vec<(usize, NewEvent)>,
        poison: &mut Vec<Poison>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Option<(u64, u64)>, String> {
        let backoff = Backoff::doubling(INGEST_RETRY_MIN, INGEST_RETRY_MAX);
        let mut failures = 0u32;
        let (mut stored, mut duplicate) = (0u64, 0u64);
        while !mapped.is_empty() {
            let events: Vec<NewEvent> = mapped.iter().map(|(_, e)| e.clone()).collect();
            let ctx = self.ctx;
            let submitted =
                crate::ingest::submit(&*ctx.store, &ctx.routes, &ctx.wake, &ctx.metrics, events)
                    .await;
            if matches!(
                submitted,
                Err(IngestError::Conflict { .. } | IngestError::SequenceNotIncreasing { .. })
            ) {
                ctx.metrics.ingested("conflict", 1);
            }
            match submitted {
                Ok(results) => {
                    duplicate = results.iter().filter(|r| r.duplicate).count() as u64;
                    stored = results.len() as u64 - duplicate;
                    break;
                }
                Err(IngestError::Conflict {
                    index,
                    id,
                    attributes,
                }) => {
                    let (i, _) = mapped.remove(index);
                    poison.push((
                        i,
                        format!(
                            "conflict: event id {id:?} is already stored with different {}",
                            attributes.join(", ")
                        ),
                    ));
                }
                Err(IngestError::SequenceNotIncreasing {
                    index,
                    id,
                    stream,
                    given,
                    last,
                }) => {
                    let (i, _) = mapped.remove(index);
                    poison.push((
                        i,
                        format!(
                            "conflict: event id {id:?}: sequence {given} does not advance stream {stream:?} (last sequence {last})"
                        ),
                    ));
                }
                Err(IngestError::Store(e)) => {
                    let delay = backoff.delay(failures);
                    failures += 1;
                    let error = format!(
                        "store unavailable, {} messages held unacknowledged: {e}",
                        held
                    );
                    tracing::warn!(source = %self.name, retry_in = ?delay, "{error}");
                    self.status.error(error.clone());
                    if !self.channel.status().connected() {
                        return Err(format!(
                            "{error}; the channel closed meanwhile, so the broker redelivers them"
                        ));
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.wait_for(|s| *s) => return Ok(None),
                    }
                }
            }
        }
        Ok(Some((stored, duplicate)))
    }

    /// Acknowledge every message of `batch` up to its last one not in
    /// `rejected` (delivery tags).
    async fn acknowledge(&self, batch: &[Delivery], rejected: &[u64]) -> Result<(), String> {
        // Everything of the batch is settled but the rejected: acknowledge
        // up to its last message at once (deliveries of a channel arrive
        // in tag order, and earlier batches are settled already).
        let last = batch
            .iter()
            .rev()
            .map(|d| d.delivery_tag)
            .find(|tag| !rejected.contains(tag));
        if let Some(tag) = last {
            step(
                "acknowledge",
                self.channel
                    .basic_ack(tag, BasicAckOptions { multiple: true }),
            )
            .await?;
        }
        Ok(())
    }

    /// Publish a copy of each poison message, with its reason, to the
    /// dead-letter exchange and wait for the broker's confirms. A message
    /// whose copy is not confirmed is rejected without requeue (the broker
    /// dead-letters it by `x-dead-letter-exchange`). Returns the delivery
    /// tags rejected that way.
    async fn dead_letter(&self, batch: &[Delivery], poison: &[Poison]) -> Result<Vec<u64>, String> {
        if poison.is_empty() {
            return Ok(Vec::new());
        }
        let dlx = self.config.dead_letter_exchange();
        let mut confirms = Vec::with_capacity(poison.len());
        for (i, reason) in poison {
            let d = &batch[*i];
            tracing::warn!(
                source = %self.name,
                queue = %self.config.queue,
                routing_key = %d.routing_key,
                message_id = ?d.properties.message_id().as_ref().map(|m| m.as_str()),
                "message dead-lettered: {reason}"
            );
            let mut headers = d.properties.headers().clone().unwrap_or_default();
            let mut put = |name: &str, value: &str| {
                headers.insert(
                    ShortString::from(name),
                    AMQPValue::LongString(LongString::from(value.as_bytes())),
                );
            };
            put(REASON_HEADER, truncate(reason, MAX_REASON_BYTES));
            put(SOURCE_HEADER, self.name);
            put(ORIGINAL_EXCHANGE_HEADER, d.exchange.as_str());
            put(ORIGINAL_ROUTING_KEY_HEADER, d.routing_key.as_str());
            let properties = d.properties.clone().with_headers(headers);
            let sent = self
                .channel
                .basic_publish(
                    dlx.as_str().into(),
                    d.routing_key.clone(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &d.data,
                    properties,
                )
                .await;
            confirms.push((d.delivery_tag, sent));
        }
        let mut rejected = Vec::new();
        for (tag, sent) in confirms {
            let confirmed = match sent {
                Ok(confirm) => matches!(
                    tokio::time::timeout(BROKER_STEP_TIMEOUT, confirm).await,
                    Ok(Ok(Confirmation::Ack(None)))
                ),
                Err(_) => false,
            };
            if !confirmed {
                tracing::warn!(source = %self.name, "dead-letter copy not confirmed: rejecting the message without requeue");
                step(
                    "reject a poison message",
                    self.channel
                        .basic_reject(tag, BasicRejectOptions { requeue: false }),
                )
                .await?;
                rejected.push(tag);
            }
        }
        Ok(rejected)
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether the sink of manifest `sink` keeps apart from every `amqp`
/// source's ingress routes (called by the daemon for each sink it admits):
/// `Err` names the sink, the source and the binding its published events
/// could land on (see [`loops`]).
pub fn check_routes_apart(
    sources: &std::collections::BTreeMap<String, SourceConfig>,
    sink: &crate::plugin::manifest::Manifest,
) -> Result<(), String> {
    for (name, config) in sources {
        if let SourceConfig::Amqp(c) = config {
            check_sink(name, c, sink)?;
        }
    }
    Ok(())
}

/// Give the start-time check a shape the daemon can call: `Err` names the
/// sink and the source's binding it could reach.
pub fn check_sink(
    name: &str,
    config: &AmqpSourceConfig,
    sink: &crate::plugin::manifest::Manifest,
) -> Result<(), String> {
    let url = config
        .resolved_url()
        .map_err(|e| format!("source {name:?}: url: {e}"))?;
    loops::check_sink(name, config, &url, sink)
}
