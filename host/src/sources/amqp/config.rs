//! The `[sources.NAME] kind = "amqp"` settings ([`AmqpSourceConfig`]):
//! the broker URL, the queue, its bindings and dead-letter names, the
//! batch knobs and how plain messages map to events, with their
//! validation (each error names the key).
//!
//! Must never: show the URL's password (its `Debug` and
//! [`AmqpSourceConfig::redacted`] replace it) or touch the broker.

use super::*;

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
        crate::interpolate::interpolate(&self.url)
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
        if let Err(e) = crate::broker::check_url(&url) {
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

pub(super) fn exchange_kind(kind: &str) -> Option<ExchangeKind> {
    match kind {
        "topic" => Some(ExchangeKind::Topic),
        "direct" => Some(ExchangeKind::Direct),
        "fanout" => Some(ExchangeKind::Fanout),
        "headers" => Some(ExchangeKind::Headers),
        _ => None,
    }
}
