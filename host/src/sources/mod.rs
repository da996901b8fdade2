//! Sources: relays that pull events from an application's own outbox
//! (`[sources.NAME]` in the configuration) and hand them to the store.
//!
//! Owns only what every source needs: the `[sources.NAME]` dispatch on
//! `kind` ([`SourceConfig`], one variant per kind, each variant's settings
//! defined in that kind's own file), starting each configured source as its
//! own task supervised with backoff ([`start`]), the per-source status that
//! `/ready` and the admin API show ([`SourceStatuses`]), and the ingest
//! handle ([`SourceIngest`]) through which a source stores events — the
//! same store call, routing and metrics as the HTTP ingest (idempotent on
//! id: same content → duplicate success, other content → conflict).
//!
//! Must never: write events or deliveries around the store's ingest, let a
//! failing source take the daemon down or hold back another source, or log
//! a source's secrets.

pub mod neo4j;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::event::NewEvent;
use crate::metrics::Metrics;
use crate::store::{IngestError, IngestItem, Ingested, Store};

/// One `[sources.NAME]` table, chosen by its `kind` key.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SourceConfig {
    /// `kind = "neo4j"`: the Neo4j outbox relay ([`neo4j`]).
    Neo4j(neo4j::Neo4jSourceConfig),
}

/// The kinds `kind` may name.
pub const KINDS: &[&str] = &["neo4j"];

impl<'de> Deserialize<'de> for SourceConfig {
    /// By `kind`, then the kind's own table; an error names the key inside
    /// the table (`lease: invalid value ...`), which serde's tagged enums
    /// would not.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table: serde_json::Map<String, serde_json::Value> = Deserialize::deserialize(d)?;
        let kind = match table.remove("kind") {
            Some(serde_json::Value::String(k)) => k,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "`kind` must be a string, got {other}"
                )))
            }
            None => {
                return Err(D::Error::custom(format!(
                    "`kind` is required (one of: {})",
                    KINDS.join(", ")
                )))
            }
        };
        let value = serde_json::Value::Object(table);
        let named = |e: serde_path_to_error::Error<serde_json::Error>| {
            D::Error::custom(format!("`{}`: {}", e.path(), e.inner()))
        };
        match kind.as_str() {
            "neo4j" => serde_path_to_error::deserialize(value)
                .map(SourceConfig::Neo4j)
                .map_err(named),
            other => Err(D::Error::custom(format!(
                "`kind = {other:?}` is not a source kind (one of: {})",
                KINDS.join(", ")
            ))),
        }
    }
}

impl SourceConfig {
    /// The `kind` value.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Neo4j(_) => "neo4j",
        }
    }

    /// Check values types alone cannot. `Err((key, problem))` names the key
    /// relative to `sources.NAME.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        match self {
            SourceConfig::Neo4j(c) => c.validate(),
        }
    }
}

/// Backoff of a source's supervisor after a failed run: first pause.
pub const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Backoff of a source's supervisor after failed runs in a row: longest pause.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What `/ready`, `/metrics` and `outboxd sources list` show of one source.
#[derive(Debug, Clone, Serialize)]
pub struct SourceReport {
    pub name: String,
    pub kind: String,
    /// Reachable, last cycle fresh and succeeding.
    pub ready: bool,
    /// The source's own system answered on the last try.
    pub connected: bool,
    pub last_error: Option<String>,
    /// Time since the last cycle finished, ms.
    pub last_cycle_age_ms: Option<u64>,
    /// Duration of the last cycle, ms.
    pub last_cycle_ms: Option<u64>,
    pub consecutive_failures: u32,
    /// Age of the oldest outbox entry still waiting, ms (when known).
    pub oldest_pending_age_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct Status {
    kind: &'static str,
    stale_after: Duration,
    connected: bool,
    last_error: Option<String>,
    last_cycle_at: Option<Instant>,
    last_cycle: Option<Duration>,
    consecutive_failures: u32,
    oldest_pending_age: Option<Duration>,
}

/// The status of every configured source, shared by the sources (writers)
/// and the ops endpoints (readers).
#[derive(Default)]
pub struct SourceStatuses {
    inner: Mutex<BTreeMap<String, Status>>,
}

impl SourceStatuses {
    /// Register source `name`: not ready until its first cycle succeeds; a
    /// cycle older than `stale_after` makes it not ready again.
    pub fn register(&self, name: &str, kind: &'static str, stale_after: Duration) {
        self.inner.lock().unwrap().insert(
            name.to_string(),
            Status {
                kind,
                stale_after,
                connected: false,
                last_error: None,
                last_cycle_at: None,
                last_cycle: None,
                consecutive_failures: 0,
                oldest_pending_age: None,
            },
        );
    }

    /// Record a successful cycle of `took`.
    pub fn cycle_ok(&self, name: &str, took: Duration) {
        if let Some(s) = self.inner.lock().unwrap().get_mut(name) {
            s.connected = true;
            s.last_error = None;
            s.last_cycle_at = Some(Instant::now());
            s.last_cycle = Some(took);
            s.consecutive_failures = 0;
        }
    }

    /// Record a failed cycle (or connection attempt). `connected` says
    /// whether the source's system answered at all.
    pub fn cycle_failed(&self, name: &str, connected: bool, error: &str) {
        if let Some(s) = self.inner.lock().unwrap().get_mut(name) {
            s.connected = connected;
            s.last_error = Some(error.to_string());
            s.last_cycle_at = Some(Instant::now());
            s.consecutive_failures += 1;
        }
    }

    /// Record the age of the oldest waiting entry.
    pub fn set_oldest_pending(&self, name: &str, age: Option<Duration>) {
        if let Some(s) = self.inner.lock().unwrap().get_mut(name) {
            s.oldest_pending_age = age;
        }
    }

    /// Every source's report, by name.
    pub fn reports(&self) -> Vec<SourceReport> {
        self.inner
            .lock()
            .unwrap()
            .iter()
            .map(|(name, s)| {
                let age = s.last_cycle_at.map(|t| t.elapsed());
                let fresh = age.is_some_and(|a| a <= s.stale_after);
                SourceReport {
                    name: name.clone(),
                    kind: s.kind.to_string(),
                    ready: s.connected && fresh && s.consecutive_failures == 0,
                    connected: s.connected,
                    last_error: s.last_error.clone(),
                    last_cycle_age_ms: age.map(|a| a.as_millis() as u64),
                    last_cycle_ms: s.last_cycle.map(|d| d.as_millis() as u64),
                    consecutive_failures: s.consecutive_failures,
                    oldest_pending_age_ms: s.oldest_pending_age.map(|d| d.as_millis() as u64),
                }
            })
            .collect()
    }
}

/// The ingest path a source uses: routing, the store's ingest (one
/// transaction per call, idempotent on id), the ingest metrics and the
/// delivery wake-up — as `POST /v1/events` does.
#[derive(Clone)]
pub struct SourceIngest {
    pub store: Arc<dyn Store>,
    pub routes: Arc<crate::ingest::routes::Router>,
    pub wake: Arc<Notify>,
    pub metrics: Arc<Metrics>,
}

impl SourceIngest {
    /// Store `events` in one transaction (all or none), each with one
    /// delivery per routed sink. Errors as [`Store::ingest`]; a conflict or
    /// a sequence that does not advance names the item's index.
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
                match &e {
                    IngestError::Conflict { .. } | IngestError::SequenceNotIncreasing { .. } => {
                        self.metrics.ingested("conflict", 1)
                    }
                    IngestError::Store(_) => {}
                }
                Err(e)
            }
        }
    }
}

/// What every source task is given.
#[derive(Clone)]
pub struct SourceContext {
    pub ingest: SourceIngest,
    pub statuses: Arc<SourceStatuses>,
}

/// Why a configured source could not be started (a start error of the
/// daemon, naming the key).
#[derive(Debug, thiserror::Error)]
#[error("configuration key `sources.{source_name}.{key}`: {problem}")]
pub struct SourceStartError {
    pub source_name: String,
    pub key: String,
    pub problem: String,
}

/// Start every configured source as its own task, each supervised: a run
/// that fails is restarted after a backoff (doubling from
/// [`RESTART_BACKOFF_MIN`] to [`RESTART_BACKOFF_MAX`]), until `shutdown`.
///
/// Errors: settings that can only be checked at start (a secret's
/// environment variable that is not set), naming the key.
pub fn start(
    sources: &BTreeMap<String, SourceConfig>,
    ctx: SourceContext,
    shutdown: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, SourceStartError> {
    let mut tasks = Vec::new();
    for (name, config) in sources {
        match config {
            SourceConfig::Neo4j(c) => {
                let relay = neo4j::Relay::prepare(name, c.clone(), ctx.clone())?;
                ctx.statuses.register(name, "neo4j", relay.stale_after());
                tasks.push(tokio::spawn(supervise(
                    name.clone(),
                    ctx.statuses.clone(),
                    shutdown.clone(),
                    move |stop| {
                        let relay = relay.clone();
                        async move { relay.run(stop).await }
                    },
                )));
            }
        }
    }
    Ok(tasks)
}

/// Run `run` until `shutdown`; after each failed run record the error and
/// wait a backoff before running it again.
async fn supervise<F, Fut>(
    name: String,
    statuses: Arc<SourceStatuses>,
    mut shutdown: watch::Receiver<bool>,
    mut run: F,
) where
    F: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = Result<(), SourceRunError>>,
{
    let mut backoff = RESTART_BACKOFF_MIN;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        match run(shutdown.clone()).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(source = %name, error = %e.message, "source failed; restarting after {backoff:?}");
                statuses.cycle_failed(&name, e.connected, &e.message);
            }
        }
        if started.elapsed() > RESTART_BACKOFF_MAX {
            backoff = RESTART_BACKOFF_MIN;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// A source's run ended with an error; the supervisor restarts it.
#[derive(Debug, Clone)]
pub struct SourceRunError {
    /// Whether the source's own system answered (false: unreachable).
    pub connected: bool,
    pub message: String,
}
