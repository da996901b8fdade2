//! Sources: relays that take events from an application's own systems
//! (a broker queue, an outbox in another database) and hand them to the
//! store.
//!
//! Owns what every source needs and nothing kind-specific: the
//! `[sources.NAME]` configuration dispatch ([`SourceConfig`], tagged by
//! `kind`, one variant per kind, each variant's struct in its kind's file),
//! starting each configured source as its own task supervised with backoff
//! ([`start`]), the per-source status that `/ready` and the admin API show
//! ([`SourceStates`]), and the one way a source stores events
//! ([`SourceContext::ingest`]): the routes and the store's ingest path, as
//! the HTTP ingest uses them (idempotent on id: same content → duplicate
//! success, other content → conflict).
//!
//! Must never: write events or deliveries around the store's ingest path;
//! let one source's failure (an error, a panic) stop the daemon or another
//! source; acknowledge anything upstream before the store committed it (each
//! kind keeps that rule in its own file).

pub mod amqp;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::event::NewEvent;
use crate::ingest::routes::Router as Routes;
use crate::metrics::Metrics;
use crate::plugin::amqp::AmqpPool;
use crate::store::{IngestError, IngestItem, Ingested, Store};

/// Wait before the first restart of a failed source; it doubles with each
/// failure in a row, up to [`RESTART_BACKOFF_MAX`].
pub const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait between two restarts of a failed source. A run that lasted
/// longer than this counts as healthy: the next failure starts the backoff
/// afresh.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// One `[sources.NAME]` table: `kind` picks the variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SourceConfig {
    /// `kind = "amqp"`: consume a RabbitMQ queue ([`amqp`]).
    Amqp(amqp::AmqpSourceConfig),
}

impl SourceConfig {
    /// The `kind` value.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Amqp(_) => "amqp",
        }
    }

    /// Check the values types alone cannot. `Err((key, problem))`, the key
    /// relative to the table (`queue`, `bindings[0].exchange`).
    pub fn validate(&self) -> Result<(), (String, String)> {
        match self {
            SourceConfig::Amqp(c) => c.validate(),
        }
    }

    /// The same configuration with secrets (passwords in URLs) replaced,
    /// for `outboxd config show`.
    pub fn redacted(&self) -> SourceConfig {
        match self {
            SourceConfig::Amqp(c) => SourceConfig::Amqp(c.redacted()),
        }
    }
}

/// Whether the sink of manifest `sink` keeps apart from every source's
/// ingress routes: `Err` names the sink, the source and the binding its
/// published events could land on (see [`amqp::loops`]).
pub fn check_routes_apart(
    sources: &BTreeMap<String, SourceConfig>,
    sink: &crate::plugin::manifest::Manifest,
) -> Result<(), String> {
    for (name, config) in sources {
        match config {
            SourceConfig::Amqp(c) => amqp::check_sink(name, c, sink)?,
        }
    }
    Ok(())
}

/// What a running source uses: the store's ingest path and the host's
/// shared connections.
#[derive(Clone)]
pub struct SourceContext {
    pub store: Arc<dyn Store>,
    pub routes: Arc<Routes>,
    pub metrics: Arc<Metrics>,
    /// Woken after a commit that queued deliveries.
    pub wake: Arc<Notify>,
    /// The host's AMQP connections (shared with the plugins).
    pub amqp: AmqpPool,
    pub states: Arc<SourceStates>,
}

impl SourceContext {
    /// Store `events` in one transaction through the store's ingest path,
    /// routed as HTTP ingest routes them, and count the outcome in
    /// `outboxd_events_ingested_total`. All or nothing: on `Err` nothing of
    /// `events` was stored (a conflict names the item by index).
    pub async fn ingest(&self, events: Vec<NewEvent>) -> Result<Vec<Ingested>, IngestError> {
        let items: Vec<IngestItem> = events
            .into_iter()
            .map(|event| {
                let sinks = self.routes.sinks_for(&event);
                IngestItem { event, sinks }
            })
            .collect();
        match self.store.ingest(&items).await {
            Ok(results) => {
                let duplicates = results.iter().filter(|r| r.duplicate).count() as u64;
                self.metrics
                    .ingested("stored", results.len() as u64 - duplicates);
                self.metrics.ingested("duplicate", duplicates);
                if results.iter().any(|r| !r.duplicate) {
                    self.wake.notify_waiters();
                }
                Ok(results)
            }
            Err(e) => {
                if matches!(
                    e,
                    IngestError::Conflict { .. } | IngestError::SequenceNotIncreasing { .. }
                ) {
                    self.metrics.ingested("conflict", 1);
                }
                Err(e)
            }
        }
    }
}

/// What `/ready` and `GET /v1/admin/sources` show of one source.
#[derive(Debug, Clone, Serialize)]
pub struct SourceStatus {
    /// The `kind` of its configuration.
    pub kind: String,
    /// Attached to its upstream and taking events (an `amqp` source: its
    /// consumer is registered on the queue).
    pub ready: bool,
    /// The last failure (connect, declare, store), cleared by the next
    /// successful cycle.
    pub last_error: Option<String>,
    /// Time since the source last finished a cycle (a batch stored and
    /// acknowledged), ms; `None` before the first.
    pub last_cycle_age_ms: Option<u64>,
    /// Times the source was started again after a failure.
    pub restarts: u64,
}

#[derive(Debug, Clone)]
struct State {
    kind: String,
    ready: bool,
    last_error: Option<String>,
    last_cycle: Option<Instant>,
    restarts: u64,
}

/// The status of every configured source, by name.
#[derive(Debug, Default)]
pub struct SourceStates {
    states: Mutex<BTreeMap<String, State>>,
}

impl SourceStates {
    fn with<R>(&self, name: &str, f: impl FnOnce(&mut State) -> R) -> Option<R> {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        states.get_mut(name).map(f)
    }

    /// Start tracking source `name` of `kind` (not ready).
    pub fn register(&self, name: &str, kind: &str) {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                name.to_string(),
                State {
                    kind: kind.to_string(),
                    ready: false,
                    last_error: None,
                    last_cycle: None,
                    restarts: 0,
                },
            );
    }

    /// The source is (or is no longer) attached to its upstream.
    pub fn set_ready(&self, name: &str, ready: bool) {
        self.with(name, |s| s.ready = ready);
    }

    /// Record a failure; the source stays as ready as it was.
    pub fn failed(&self, name: &str, error: String) {
        self.with(name, |s| s.last_error = Some(error));
    }

    /// A cycle finished well: clears the last error.
    pub fn cycled(&self, name: &str) {
        self.with(name, |s| {
            s.last_cycle = Some(Instant::now());
            s.last_error = None;
        });
    }

    fn restarted(&self, name: &str) {
        self.with(name, |s| {
            s.restarts += 1;
            s.ready = false;
        });
    }

    /// Every source's status, by name.
    pub fn snapshot(&self) -> BTreeMap<String, SourceStatus> {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(name, s)| {
                (
                    name.clone(),
                    SourceStatus {
                        kind: s.kind.clone(),
                        ready: s.ready,
                        last_error: s.last_error.clone(),
                        last_cycle_age_ms: s.last_cycle.map(|t| t.elapsed().as_millis() as u64),
                        restarts: s.restarts,
                    },
                )
            })
            .collect()
    }
}

/// Start every configured source as its own supervised task. Each runs
/// until `shutdown` turns true; a run that fails (or panics) is started
/// again after a backoff, and never affects another source.
pub fn start(
    sources: &BTreeMap<String, SourceConfig>,
    ctx: SourceContext,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    sources
        .iter()
        .map(|(name, config)| {
            ctx.states.register(name, config.kind());
            tokio::spawn(supervise(
                name.clone(),
                config.clone(),
                ctx.clone(),
                shutdown.clone(),
            ))
        })
        .collect()
}

/// Run one source until shutdown, restarting it with backoff.
async fn supervise(
    name: String,
    config: SourceConfig,
    ctx: SourceContext,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut failures: u32 = 0;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        let run = {
            let (name, ctx, shutdown) = (name.clone(), ctx.clone(), shutdown.clone());
            let config = config.clone();
            tokio::spawn(async move {
                match config {
                    SourceConfig::Amqp(c) => amqp::run(&name, &c, &ctx, shutdown).await,
                }
            })
        };
        let error = match run.await {
            Ok(Ok(())) => return, // stopped by shutdown
            Ok(Err(e)) => e,
            Err(e) if e.is_panic() => format!("source task panicked: {e}"),
            Err(e) => format!("source task ended: {e}"),
        };
        ctx.states.set_ready(&name, false);
        ctx.states.failed(&name, error.clone());
        if started.elapsed() > RESTART_BACKOFF_MAX {
            failures = 0;
        }
        failures += 1;
        let backoff = RESTART_BACKOFF_MIN
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
            .min(RESTART_BACKOFF_MAX);
        tracing::warn!(source = %name, failures, retry_in = ?backoff, "source failed: {error}");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        ctx.states.restarted(&name);
    }
}
