//! AMQP publishing for plugins: the host side of `outboxd:sink/amqp`.
//!
//! Owns: one connection per broker URL ([`AmqpPool`], owned by the
//! [`Runtime`](super::Runtime) and shared by every plugin that names the
//! same URL), a few idle channels per connection in publisher-confirm mode,
//! the check of each message against the manifest's exchange patterns
//! ([`AmqpAccess`]), and `publish-batch`: send every message of a call on
//! one channel, then await all their confirms together (one confirm costs
//! the broker an fsync: about 540 messages/s one at a time against about
//! 9,500/s with 100 in flight, docs/measurements.md). When the broker goes away the
//! connection is dropped and opened again on demand, no sooner than an
//! exponential backoff allows, so a dead broker costs a batch one fast
//! `unavailable`, not a connect timeout each.
//!
//! Must never: touch a broker for a message whose exchange the manifest does
//! not grant; answer `ok` for a message without a positive confirm (anything
//! in flight when a connection or channel drops, or still unconfirmed at the
//! batch deadline, is an error); log or return a broker URL with its
//! password ([`redact_url`]).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::AMQPErrorKind;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};

use super::bindings::outboxd::sink::amqp::Host;
use super::bindings::{AmqpMessage, PublishError};
use super::manifest::AmqpCapability;
use super::runtime::HostState;
use crate::limits::DEADLINE_MARGIN;

/// Longest wait for a new connection: TCP, TLS and the AMQP handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait before the second attempt to connect after a failure; it doubles
/// with each further failure, up to [`RECONNECT_BACKOFF_MAX`]. The first
/// attempt after a lost connection is immediate.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait between two attempts to connect.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Longest a `publish-batch` waits for its confirms when the caller has no
/// batch deadline of its own.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// Most messages in one `publish-batch` call; the rest are answered
/// `invalid` unsent.
pub const MAX_MESSAGES_PER_CALL: usize = 10_000;
/// Idle confirm-mode channels kept per broker for reuse.
const MAX_IDLE_CHANNELS: usize = 16;
/// An AMQP short string (exchange, routing key, property, header name).
const MAX_SHORT_STRING: usize = 255;

/// `amqp://user:***@host:port/vhost`: `url` with any password replaced, for
/// logs and error messages. Anything that does not look like a URL with
/// userinfo is returned unchanged.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// The brokers plugins publish to, one connection each. Cheap to clone.
#[derive(Clone, Default)]
pub struct AmqpPool {
    brokers: Arc<Mutex<HashMap<String, Arc<Broker>>>>,
}

/// What the pool knows of one broker, for readiness and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerStatus {
    /// The broker URL without its password.
    pub broker: String,
    /// A connection is open.
    pub connected: bool,
    /// Why the last attempt to connect, or the last connection, failed.
    pub last_error: Option<String>,
}

impl AmqpPool {
    /// An empty pool; connections open on first use.
    pub fn new() -> AmqpPool {
        AmqpPool::default()
    }

    /// The publishing rights of a plugin with capability `grant` (none: every
    /// publish is `not-allowed`). Checks the URL, but does not connect.
    pub fn access(&self, grant: Option<&AmqpCapability>) -> Result<AmqpAccess, String> {
        let Some(grant) = grant else {
            return Ok(AmqpAccess::denied());
        };
        if grant.exchanges.is_empty() {
            return Err("exchanges: names no exchange; list the exchanges (or `*` patterns) the plugin may publish to".into());
        }
        let uri = parse_url(&grant.url).map_err(|e| format!("url: {e}"))?;
        let broker = {
            let mut brokers = self.brokers.lock().unwrap_or_else(PoisonError::into_inner);
            brokers
                .entry(grant.url.clone())
                .or_insert_with(|| Arc::new(Broker::new(uri, redact_url(&grant.url))))
                .clone()
        };
        Ok(AmqpAccess {
            broker: Some(broker),
            exchanges: grant.exchanges.clone().into(),
            deadline: None,
        })
    }

    /// The state of every broker a loaded plugin names, as last seen. It
    /// does not connect: a broker nobody published to since it came back
    /// still shows its last error until the next publish or [`probe`](Self::probe).
    pub fn status(&self) -> Vec<BrokerStatus> {
        self.brokers().iter().map(|b| b.status()).collect()
    }

    /// Like [`status`](Self::status), but first connects to every broker
    /// that has no connection (within its backoff and at most `timeout`).
    pub async fn probe(&self, timeout: Duration) -> Vec<BrokerStatus> {
        let brokers = self.brokers();
        join_all(brokers.iter().map(|b| async move {
            let _ = tokio::time::timeout(timeout, b.connection()).await;
            b.status()
        }))
        .await
    }

    /// The pool's connection to the broker at `url` (opened on first use,
    /// reopened after a loss no sooner than the reconnect backoff allows),
    /// for a consumer of the host's own, such as the `amqp` source. The
    /// broker then shows in [`status`](Self::status) like a plugin's.
    ///
    /// Errors: `url` is not an AMQP URL, or the broker is unreachable; the
    /// message never carries the password.
    pub async fn connection(&self, url: &str) -> Result<Arc<Connection>, String> {
        let broker = {
            let mut brokers = self.brokers.lock().unwrap_or_else(PoisonError::into_inner);
            match brokers.get(url) {
                Some(broker) => broker.clone(),
                None => {
                    let uri = parse_url(url)?;
                    let broker = Arc::new(Broker::new(uri, redact_url(url)));
                    brokers.insert(url.to_string(), broker.clone());
                    broker
                }
            }
        };
        broker.connection().await
    }

    fn brokers(&self) -> Vec<Arc<Broker>> {
        let mut brokers: Vec<Arc<Broker>> = self
            .brokers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        brokers.sort_by(|a, b| a.shown.cmp(&b.shown));
        brokers
    }
}

/// Whether two broker URLs name the same broker and virtual host (host,
/// port and vhost compared; user and password ignored). A URL that does not
/// parse names no broker: `false`.
pub fn same_broker(a: &str, b: &str) -> bool {
    match (parse_url(a), parse_url(b)) {
        (Ok(a), Ok(b)) => {
            a.authority.host.eq_ignore_ascii_case(&b.authority.host)
                && a.authority.port == b.authority.port
                && a.vhost == b.vhost
        }
        _ => false,
    }
}

/// Check a broker URL as the pool would parse it; the error never repeats
/// the password.
pub fn check_url(url: &str) -> Result<(), String> {
    parse_url(url).map(|_| ())
}

/// Parse a broker URL with lapin's parser; errors never repeat the URL.
fn parse_url(url: &str) -> Result<AMQPUri, String> {
    let scheme_ok = url.starts_with("amqp://") || url.starts_with("amqps://");
    if !scheme_ok {
        return Err(format!(
            "{}: expected amqp://… or amqps://…",
            redact_url(url)
        ));
    }
    let mut uri = AMQPUri::from_str(url).map_err(|e| {
        // The parser's message may quote the URL; never pass it on then.
        if e.contains(url) || e.contains('@') {
            format!("{}: not a valid AMQP URL", redact_url(url))
        } else {
            format!("{}: not a valid AMQP URL: {e}", redact_url(url))
        }
    })?;
    // lapin keeps only DNS names as the host and falls back to `localhost`
    // for an IP address; keep the address that was written.
    if let Ok(parsed) = url.parse::<http::Uri>() {
        if let Some(host) = parsed.host() {
            uri.authority.host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
        }
    }
    Ok(uri)
}

/// One broker: its connection (opened on demand) and idle channels.
struct Broker {
    /// Carries the password: never printed.
    uri: AMQPUri,
    /// The URL without its password.
    shown: String,
    /// The connection and its reconnect schedule. An async lock, so
    /// concurrent batches wait for one attempt to connect instead of each
    /// opening a connection.
    link: tokio::sync::Mutex<Link>,
    /// Copy of the last known state, readable without waiting on `link`.
    seen: Mutex<BrokerStatus>,
    /// Channels in confirm mode with nothing in flight.
    idle: Mutex<Vec<Channel>>,
}

#[derive(Default)]
struct Link {
    connection: Option<Arc<Connection>>,
    /// Failed attempts to connect since the last success.
    failures: u32,
    /// No attempt to connect before this.
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

impl Broker {
    fn new(uri: AMQPUri, shown: String) -> Broker {
        Broker {
            uri,
            seen: Mutex::new(BrokerStatus {
                broker: shown.clone(),
                connected: false,
                last_error: None,
            }),
            shown,
            link: tokio::sync::Mutex::new(Link::default()),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn status(&self) -> BrokerStatus {
        let mut status = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // A connection the broker closed since it was last looked at.
        if status.connected {
            if let Ok(link) = self.link.try_lock() {
                if !link
                    .connection
                    .as_ref()
                    .is_some_and(|c| c.status().connected())
                {
                    status.connected = false;
                    status
                        .last_error
                        .get_or_insert_with(|| "connection lost".into());
                }
            }
        }
        status
    }

    fn record(&self, link: &Link) {
        let connected = link
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected());
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = BrokerStatus {
            broker: self.shown.clone(),
            connected,
            last_error: link.last_error.clone(),
        };
    }

    /// The open connection, or a new one; `Err` says why there is none.
    async fn connection(&self) -> Result<Arc<Connection>, String> {
        let mut link = self.link.lock().await;
        if let Some(connection) = &link.connection {
            if connection.status().connected() {
                return Ok(connection.clone());
            }
            let was = link.connection.take();
            drop(was);
            link.last_error = Some("connection lost".into());
            tracing::warn!(broker = %self.shown, "AMQP connection lost; reconnecting");
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
        if let Some(at) = link.retry_at {
            let now = Instant::now();
            if now < at {
                let reason = link
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "not connected".into());
                return Err(format!(
                    "broker {} unreachable: {reason}; next attempt in {} ms",
                    self.shown,
                    (at - now).as_millis()
                ));
            }
        }
        let properties = ConnectionProperties::default().with_connection_name("outboxd".into());
        let attempt = tokio::time::timeout(
            CONNECT_TIMEOUT,
            Connection::connect_uri(self.uri.clone(), properties),
        )
        .await;
        let error = match attempt {
            Ok(Ok(connection)) => {
                let connection = Arc::new(connection);
                if link.failures > 0 || link.last_error.is_some() {
                    tracing::info!(broker = %self.shown, "AMQP connection restored");
                } else {
                    tracing::info!(broker = %self.shown, "AMQP connection open");
                }
                link.connection = Some(connection.clone());
                link.failures = 0;
                link.retry_at = None;
                link.last_error = None;
                self.record(&link);
                return Ok(connection);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no connection within {CONNECT_TIMEOUT:?}"),
        };
        link.failures += 1;
        let backoff = RECONNECT_BACKOFF_MIN
            .saturating_mul(2u32.saturating_pow(link.failures.saturating_sub(1).min(16)))
            .min(RECONNECT_BACKOFF_MAX);
        link.retry_at = Some(Instant::now() + backoff);
        link.last_error = Some(error.clone());
        self.record(&link);
        tracing::warn!(broker = %self.shown, failures = link.failures, retry_in = ?backoff, "AMQP connect failed: {error}");
        Err(format!("broker {} unreachable: {error}", self.shown))
    }

    /// An idle channel in confirm mode, or a new one.
    async fn channel(&self) -> Result<Channel, String> {
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match idle {
                Some(channel) if channel.status().connected() => return Ok(channel),
                Some(_) => continue,
                None => break,
            }
        }
        let connection = self.connection().await?;
        let opened = async {
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, opened).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => Err(format!("broker {}: cannot open a channel: {e}", self.shown)),
            Err(_) => Err(format!(
                "broker {}: no channel within {CONNECT_TIMEOUT:?}",
                self.shown
            )),
        }
    }

    /// Keep a channel that has nothing in flight for the next batch.
    fn give_back(&self, channel: Channel) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if channel.status().connected() && idle.len() < MAX_IDLE_CHANNELS {
            idle.push(channel);
        } else {
            drop(idle);
            discard(channel);
        }
    }
}

/// Close a channel whose confirms may still arrive (they must not reach
/// the next batch) or that is not wanted any more.
fn discard(channel: Channel) {
    if channel.status().connected() {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = channel
                    .close(200, "outboxd: channel discarded".into())
                    .await;
            });
        }
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

impl Broker {
    /// Publish `messages[i]` for each `i` of `todo` on one channel, then
    /// await their confirms together until `wait_until`. One answer per
    /// entry of `todo`.
    async fn publish(
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

        // Send everything first, in order, on this one channel.
        let mut answers: Vec<Option<Result<(), PublishError>>> = vec![None; todo.len()];
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

        // Then wait for all confirms at once.
        let slots: Vec<usize> = pending.iter().map(|(slot, _)| *slot).collect();
        let confirms = tokio::time::timeout_at(
            wait_until.into(),
            join_all(pending.into_iter().map(|(_, c)| c)),
        )
        .await;
        let mut clean = send_error.is_none();
        match confirms {
            Ok(confirms) => {
                // A channel the broker closed fails every later confirm with
                // a bare state error; answer those with the broker's reason.
                let mut refused: Option<String> = None;
                for (slot, confirm) in slots.iter().zip(confirms) {
                    let answer = match confirm {
                        Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => Ok(()),
                        Ok(Confirmation::Ack(Some(returned))) => {
                            Err(PublishError::Unroutable(format!(
                                "returned by the broker: {} {} (exchange {:?}, routing key {:?})",
                                returned.reply_code,
                                returned.reply_text,
                                returned.delivery.exchange.as_str(),
                                returned.delivery.routing_key.as_str(),
                            )))
                        }
                        Ok(Confirmation::Nack(returned)) => {
                            Err(PublishError::Nacked(match returned {
                                Some(r) => format!(
                                    "negative confirm from the broker ({} {})",
                                    r.reply_code, r.reply_text
                                ),
                                None => "negative confirm from the broker".to_string(),
                            }))
                        }
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
            }
            Err(_) => {
                clean = false;
                let reason = format!(
                    "broker {}: no confirm before the batch deadline",
                    self.shown
                );
                for slot in slots {
                    answers[slot] = Some(Err(PublishError::Unavailable(reason.clone())));
                }
            }
        }
        if clean {
            self.give_back(channel);
        } else {
            discard(channel);
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(PublishError::Unavailable("not published".into()))))
            .collect()
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

impl Host for HostState {
    async fn publish_batch(&mut self, messages: Vec<AmqpMessage>) -> Vec<Result<(), PublishError>> {
        let access = self.amqp.clone();
        access.publish_batch(messages).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_shown() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("amqps://u:p@ss@h/v?x=1"),
            "amqps://u:***@h/v?x=1"
        );
        assert_eq!(redact_url("amqp://h:5672"), "amqp://h:5672");
        assert_eq!(redact_url("amqp://user@h"), "amqp://user@h");
        let e = parse_url("http://guest:secret@h").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        let e = parse_url("amqp://guest:secret@h:notaport/").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn ip_hosts_are_kept() {
        let uri = parse_url("amqp://guest:guest@127.0.0.1:5673/%2f").unwrap();
        assert_eq!(uri.authority.host, "127.0.0.1");
        assert_eq!(uri.authority.port, 5673);
        assert_eq!(uri.vhost, "/");
        assert_eq!(parse_url("amqp://[::1]/").unwrap().authority.host, "::1");
    }

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
