//! AMQP broker connections, one per broker URL, shared by every plugin's
//! `amqp` interface ([`crate::plugin::amqp`]) and the `amqp` source
//! ([`crate::sources::amqp`]) naming it, with a few idle channels in
//! publisher-confirm mode each. A lost connection is opened again on
//! demand, no sooner than an exponential backoff allows, so a dead broker
//! costs a batch one fast `unavailable`, not a connect timeout each.
//!
//! Below both of its users: it imports only the ground floor
//! ([`crate::backoff`], [`crate::limits`], [`crate::redact`]), never the
//! plugin host or a source.
//!
//! Must never: print a broker URL with its password, or hand out a channel
//! whose confirms may still arrive for an earlier batch.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::join_all;
use lapin::options::ConfirmSelectOptions;
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties};

use crate::backoff::Backoff;
use crate::limits::{
    AMQP_CONNECT_TIMEOUT as CONNECT_TIMEOUT, AMQP_RECONNECT_BACKOFF_MAX as RECONNECT_BACKOFF_MAX,
    AMQP_RECONNECT_BACKOFF_MIN as RECONNECT_BACKOFF_MIN,
};
use crate::redact::redact_url;

/// Idle confirm-mode channels kept per broker for reuse.
const MAX_IDLE_CHANNELS: usize = 16;

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
        self.broker(url)?.connection().await
    }

    /// The pool's broker for `url`, made on first use (not connected).
    /// Errors: `url` is not an AMQP URL (the message never carries the
    /// password).
    pub(crate) fn broker(&self, url: &str) -> Result<Arc<Broker>, String> {
        let mut brokers = self.brokers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(broker) = brokers.get(url) {
            return Ok(broker.clone());
        }
        let broker = Arc::new(Broker::new(parse_url(url)?, redact_url(url)));
        brokers.insert(url.to_string(), broker.clone());
        Ok(broker)
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
pub(crate) struct Broker {
    /// Carries the password: never printed.
    uri: AMQPUri,
    /// The URL without its password.
    pub(crate) shown: String,
    /// The connection and its reconnect schedule. An async lock, so
    /// concurrent batches wait for one attempt to connect instead of each
    /// opening a connection.
    link: tokio::sync::Mutex<Link>,
    /// Copy of the last known state, readable without waiting on `link`.
    seen: Mutex<BrokerStatus>,
    /// The connection `seen` describes, so that [`Broker::status`] sees it
    /// close even while `link` is held (a connect attempt holds it up to
    /// [`CONNECT_TIMEOUT`]).
    watched: Mutex<Option<Arc<Connection>>>,
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
            watched: Mutex::new(None),
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
        let live = self
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|c| c.status().connected());
        if status.connected && !live {
            status.connected = false;
            status
                .last_error
                .get_or_insert_with(|| "connection lost".into());
        }
        status
    }

    fn record(&self, link: &Link) {
        let connected = link
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected());
        *self.watched.lock().unwrap_or_else(PoisonError::into_inner) = link.connection.clone();
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = BrokerStatus {
            broker: self.shown.clone(),
            connected,
            last_error: link.last_error.clone(),
        };
    }

    /// The open connection, or a new one; `Err` says why there is none.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, String> {
        let mut link = self.link.lock().await;
        if let Some(connection) = &link.connection {
            if connection.status().connected() {
                return Ok(connection.clone());
            }
            let was = link.connection.take();
            drop(was);
            link.last_error = Some("connection lost".into());
            self.record(&link);
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
        let backoff = Backoff::doubling(RECONNECT_BACKOFF_MIN, RECONNECT_BACKOFF_MAX)
            .delay(link.failures - 1);
        link.retry_at = Some(Instant::now() + backoff);
        link.last_error = Some(error.clone());
        self.record(&link);
        tracing::warn!(broker = %self.shown, failures = link.failures, retry_in = ?backoff, "AMQP connect failed: {error}");
        Err(format!("broker {} unreachable: {error}", self.shown))
    }

    /// An idle channel in confirm mode, or a new one.
    pub(crate) async fn channel(&self) -> Result<Channel, String> {
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
    pub(crate) fn give_back(&self, channel: Channel) {
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
pub(crate) fn discard(channel: Channel) {
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

#[cfg(test)]
mod tests {
    use super::*;

    // The `redact_url` half of this test is in `crate::redact`.
    #[test]
    fn passwords_never_shown() {
        let e = parse_url("http://guest:secret@h").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        let e = parse_url("amqp://guest:secret@h:notaport/").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    /// Needs RabbitMQ on 127.0.0.1:5672, as `scripts/setup.sh` starts it.
    #[tokio::test]
    async fn a_closed_connection_shows_at_once_even_while_the_link_is_held() {
        let broker = Broker::new(
            parse_url("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap(),
            "amqp://127.0.0.1:5672/%2f".into(),
        );
        let connection = broker
            .connection()
            .await
            .expect("RabbitMQ on 127.0.0.1:5672 (scripts/setup.sh starts it)");
        assert!(broker.status().connected);
        // As a connect attempt holds it, for up to CONNECT_TIMEOUT.
        let _held = broker.link.lock().await;
        connection
            .close(200, "closed by the test".into())
            .await
            .unwrap();
        let status = broker.status();
        assert!(!status.connected, "{status:?}");
        assert_eq!(status.last_error.as_deref(), Some("connection lost"));
    }

    #[test]
    fn ip_hosts_are_kept() {
        let uri = parse_url("amqp://guest:guest@127.0.0.1:5673/%2f").unwrap();
        assert_eq!(uri.authority.host, "127.0.0.1");
        assert_eq!(uri.authority.port, 5673);
        assert_eq!(uri.vhost, "/");
        assert_eq!(parse_url("amqp://[::1]/").unwrap().authority.host, "::1");
    }
}
