//! One consuming session of an `amqp` source ([`run`]): declare the
//! queue, its bindings and dead-letter exchange and queue, then take
//! batches, store each in one ingest transaction, acknowledge after the
//! commit and dead-letter what cannot be stored.
//!
//! Must never: acknowledge a message that is not stored (or dead-lettered
//! with a confirmed copy), or requeue a poison message.

use super::*;

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
) -> Result<(), SourceError> {
    let config_error = |e: String| SourceError::Config(e.into());
    let mapping = config
        .mapping()
        .map_err(|(k, p)| config_error(format!("{k}: {p}")))?;
    let url = config.resolved_url().map_err(config_error)?;
    let upstream = |e: String| SourceError::Upstream(e.into());
    let connection = ctx.amqp.connection(&url).await.map_err(upstream)?;
    let channel = step("open a channel", connection.create_channel())
        .await
        .map_err(upstream)?;
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
    // A session ends on the broker's side even when the store was down:
    // the batch is held until the channel closes (see `ingest`).
    result.map_err(upstream)
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
                Ok(mut event) => {
                    let transport = mapping::trace_context(&message);
                    crate::otel::context::adopt(&mut event.extensions, transport.as_ref());
                    mapped.push((i, event))
                }
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
            let mut events: Vec<NewEvent> = mapped.iter().map(|(_, e)| e.clone()).collect();
            let ctx = self.ctx;
            let mut span =
                crate::ingest::trace_ingest(&ctx.telemetry, "source:amqp", None, &mut events);
            let submitted =
                crate::ingest::submit(&*ctx.store, &ctx.routes, &ctx.wake, &ctx.metrics, events)
                    .await;
            if let (Some(span), Err(e)) = (span.as_mut(), &submitted) {
                span.fail(crate::ingest::error_type(e), &e.to_string());
            }
            drop(span);
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
