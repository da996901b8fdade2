//! Sources: relays that pull events out of an application's own outbox.
//!
//! Owns only what every source needs: the seam every kind implements
//! ([`Source`]: its kind, validation, redacted view, staleness bound, the
//! check against the loaded sinks, and `run` ending in one
//! [`SourceError`]); the `[sources.NAME]` configuration ([`SourceConfig`],
//! tagged by `kind = "..."`), the one place a kind is matched, in the
//! `sources!` list where a configuration becomes a source; starting each
//! configured source as its own task supervised with backoff
//! ([`spawn_all`]); and the per-source status (ready / last error / last
//! cycle time / named checks) that `/ready`, `GET /v1/admin/sources` and
//! `outboxd sources list` show ([`Statuses`]).
//!
//! Each kind is a folder `sources/<kind>/` of the same shape, where the
//! files apply: `mod.rs` (its note and its [`Source`] impl), `config.rs`
//! (its settings and their validation), the upstream protocol (the
//! `neo4j` outbox and its queries, the CouchDB client and design document;
//! the `amqp` source's broker is [`crate::broker`]), `mapping.rs` (what
//! it reads, made an event) and `relay.rs` (the relay loop). A fourth
//! source is one such folder and one line in `sources!`. A source hands
//! events to the store through [`crate::ingest::submit`], the path the HTTP
//! ingest uses (idempotent on id), never by writing rows around it.
//!
//! Must never: let one source's failure stop the daemon or another source
//! (each runs in its own task; an error is logged, shown, and retried after
//! a backoff), hold kind-specific logic here, or import the plugin host
//! (a sink is seen through [`SinkView`]).

pub mod amqp;
pub mod couchdb;
pub mod neo4j;
pub mod template;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::metrics::Metrics;
use crate::routing::Router as Routes;
use crate::store::Store;

/// What every source is: one implementation per kind, on the kind's
/// configuration struct, reached through [`SourceConfig::source`].
#[async_trait::async_trait]
pub trait Source: Send + Sync {
    /// The `kind` value that names it in `[sources.NAME]`.
    fn kind(&self) -> &'static str;

    /// Check what types alone cannot. `Err((key, problem))` names the key
    /// under `sources.NAME.`.
    fn validate(&self) -> Result<(), (String, String)>;

    /// The same configuration with secrets (passwords in URLs) replaced,
    /// for `outboxd config show`.
    fn redacted(&self) -> SourceConfig;

    /// How long the source's liveness check (the one every cycle renews)
    /// may go unrenewed before `/ready` counts it stale; `None` when its
    /// checks follow a state instead and never go stale.
    fn stale_after(&self) -> Option<Duration>;

    /// Check a loaded sink against source `name` (at start and for each
    /// sink loaded later): `Err` names both when the sink could publish
    /// where the source reads, which would loop outboxd's output back in.
    fn check_sink(&self, _name: &str, _sink: &SinkView<'_>) -> Result<(), String> {
        Ok(())
    }

    /// Run source `name` until `shutdown` turns true (`Ok`) or something
    /// fails (`Err`; the supervisor shows it and runs the source again
    /// after a backoff).
    async fn run(
        &self,
        name: &str,
        ctx: &SourceContext,
        status: &StatusHandle,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), SourceError>;
}

/// A boxed error of a kind's own type, kept whole so its text and source
/// chain stay as the kind wrote them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a run of a source stopped, by what failed. Its text is the kind's
/// own (naming the system, the step and what to do); `/ready` and the
/// admin API show it as the source's `last_error`.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The system the source reads (a database, a broker, a feed) failed,
    /// gave no answer in time, or answered what it should not have.
    #[error(transparent)]
    Upstream(BoxError),
    /// outboxd's own store failed or gave no answer in time.
    #[error(transparent)]
    Store(BoxError),
    /// A setting is unusable at run time (the text names the key).
    #[error(transparent)]
    Config(BoxError),
    /// The run's task panicked or was cancelled.
    #[error("source task {0}")]
    Task(String),
}

/// A loaded sink as a source's [`Source::check_sink`] sees it, built from
/// the sink's manifest by whoever loads sinks (the daemon): sources never
/// read manifests.
#[derive(Debug, Clone, Copy)]
pub struct SinkView<'a> {
    /// The sink's name.
    pub name: &'a str,
    /// Its `[config]` table (values as written, `${VAR}` unresolved).
    pub config: &'a BTreeMap<String, String>,
    /// Its AMQP grant, when it has one.
    pub amqp: Option<SinkAmqp<'a>>,
}

/// The `capabilities.amqp` grant of a sink.
#[derive(Debug, Clone, Copy)]
pub struct SinkAmqp<'a> {
    /// The broker URL (may hold `${VAR}` references and a password).
    pub url: &'a str,
    /// Exchange name patterns it may publish to (`*` any run of
    /// characters).
    pub exchanges: &'a [String],
}

/// Check `sink` against every configured source: the first `Err` names
/// the sink and the source it could publish into.
pub fn check_sink(
    sources: &BTreeMap<String, SourceConfig>,
    sink: &SinkView<'_>,
) -> Result<(), String> {
    for (name, config) in sources {
        config.source().check_sink(name, sink)?;
    }
    Ok(())
}

/// The list of source kinds, the one place a kind is matched: each line
/// names the kind's `kind` value, its [`SourceConfig`] variant and its
/// configuration struct (which implements [`Source`]). It makes the enum,
/// [`KINDS`], the `kind`-dispatched deserializer and
/// [`SourceConfig::source`].
macro_rules! sources {
    ($($(#[$doc:meta])* $kind:literal => $variant:ident($config:ty),)+) => {
        /// One `[sources.NAME]` table: `kind` picks the variant, the other
        /// keys are the kind's own (unknown keys are refused, naming the key).
        #[derive(Debug, Clone, Serialize)]
        #[serde(tag = "kind", rename_all = "kebab-case")]
        #[allow(clippy::large_enum_variant)] // a few per process, read once at start
        pub enum SourceConfig {
            $($(#[$doc])* $variant($config),)+
        }

        /// The kinds `kind` may name.
        pub const KINDS: &[&str] = &[$($kind),+];

        impl SourceConfig {
            /// The source this configuration is.
            pub fn source(&self) -> &dyn Source {
                match self {
                    $(SourceConfig::$variant(c) => c,)+
                }
            }

            /// The configuration of kind `kind` from its table, or `None`
            /// when no source has that kind.
            fn from_table<E: serde::de::Error>(
                kind: &str,
                table: serde_json::Value,
            ) -> Option<Result<SourceConfig, E>> {
                fn named<E: serde::de::Error>(e: serde_path_to_error::Error<serde_json::Error>) -> E {
                    E::custom(format!("`{}`: {}", e.path(), e.inner()))
                }
                match kind {
                    $($kind => Some(
                        serde_path_to_error::deserialize(table)
                            .map(SourceConfig::$variant)
                            .map_err(named),
                    ),)+
                    _ => None,
                }
            }
        }
    };
}

sources! {
    /// Messages of a RabbitMQ queue ([`amqp`]).
    "amqp" => Amqp(amqp::AmqpSourceConfig),
    /// Pending entries kept inside CouchDB documents ([`couchdb`]).
    "couchdb" => Couchdb(couchdb::CouchdbConfig),
    /// Outbox nodes in a Neo4j graph ([`neo4j`]).
    "neo4j" => Neo4j(neo4j::Neo4jSourceConfig),
}

impl<'de> Deserialize<'de> for SourceConfig {
    /// By `kind`, then the kind's own table; an error names the key inside
    /// the table (`lease: invalid value ...`), which serde's internally
    /// tagged enums would not.
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
        SourceConfig::from_table(&kind, serde_json::Value::Object(table)).unwrap_or_else(|| {
            Err(D::Error::custom(format!(
                "`kind = {kind:?}` is not a source kind (one of: {})",
                KINDS.join(", ")
            )))
        })
    }
}

impl SourceConfig {
    /// The `kind` value.
    pub fn kind(&self) -> &'static str {
        self.source().kind()
    }

    /// Check what types alone cannot. `Err((key, problem))` names the key
    /// under `sources.NAME.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.source().validate()
    }

    /// The same configuration with secrets (passwords in URLs) replaced,
    /// for `outboxd config show`.
    pub fn redacted(&self) -> SourceConfig {
        self.source().redacted()
    }
}

/// First wait after a source's run failed; doubles per failure in a row up
/// to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest wait between two runs of a failing source.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A run that lasted this long before failing resets the backoff.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);

/// What a running source may use: the ingest path and the metrics.
#[derive(Clone)]
pub struct SourceContext {
    /// outboxd's store, where events are ingested.
    pub store: Arc<dyn Store>,
    /// The routes that decide which sinks an ingested event is queued for.
    pub routes: Arc<Routes>,
    /// Woken after an ingest that queued deliveries.
    pub wake: Arc<crate::wakeups::Wakeups>,
    /// The daemon's metrics (ingest and per-source counters).
    pub metrics: Arc<Metrics>,
    /// Timeout of each store call a source makes.
    pub db_timeout: Duration,
    /// The host's AMQP connections, shared with the plugins.
    pub amqp: crate::broker::AmqpPool,
    /// The tracer: a span per ingested message when on.
    pub telemetry: crate::otel::Telemetry,
}

/// A named readiness check of one source (e.g. `couchdb_reachable`).
#[derive(Debug, Clone)]
struct Check {
    ok: bool,
    detail: Option<String>,
    at: Instant,
    /// The check turns not-ok when not renewed within this long.
    stale_after: Option<Duration>,
}

/// The state of one source.
#[derive(Debug, Clone)]
struct SourceStatus {
    kind: &'static str,
    last_error: Option<String>,
    last_cycle_at: Option<SystemTime>,
    checks: BTreeMap<String, Check>,
    /// Runs started again after a failure.
    restarts: u64,
}

/// The status of every configured source, shared with `/ready`.
#[derive(Debug, Default)]
pub struct Statuses {
    inner: Mutex<BTreeMap<String, SourceStatus>>,
}

impl Statuses {
    fn with<R>(&self, name: &str, f: impl FnOnce(&mut SourceStatus) -> R) -> Option<R> {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.get_mut(name).map(f)
    }

    /// Every source as JSON (`ok`, `kind`, `last_error`, `last_cycle_at_ms`,
    /// `restarts`, `checks`), and whether all are ready. A source is ready when its
    /// last run has no error and every check is ok and fresh.
    pub fn snapshot(&self) -> (bool, serde_json::Value) {
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut all_ok = true;
        let mut out = serde_json::Map::new();
        for (name, s) in map.iter() {
            let mut ok = s.last_error.is_none();
            let mut checks = serde_json::Map::new();
            for (check, c) in &s.checks {
                let age = c.at.elapsed();
                let fresh = c.stale_after.is_none_or(|limit| age <= limit);
                let check_ok = c.ok && fresh;
                ok &= check_ok;
                let mut v = serde_json::json!({ "ok": check_ok, "age_ms": age.as_millis() as u64 });
                if let Some(d) = &c.detail {
                    v["detail"] = serde_json::json!(d);
                } else if !fresh {
                    v["detail"] = serde_json::json!(format!(
                        "not renewed for {:.0?} (limit {:?})",
                        age,
                        c.stale_after.unwrap_or_default()
                    ));
                }
                checks.insert(check.clone(), v);
            }
            if s.checks.is_empty() {
                ok = false; // not started yet
            }
            all_ok &= ok;
            out.insert(
                name.clone(),
                serde_json::json!({
                    "ok": ok,
                    "kind": s.kind,
                    "last_error": s.last_error,
                    "last_cycle_at_ms": s.last_cycle_at
                        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                        .map(|d| d.as_millis() as u64),
                    "restarts": s.restarts,
                    "checks": checks,
                }),
            );
        }
        (all_ok, serde_json::Value::Object(out))
    }

    /// Every source as a list (`GET /v1/admin/sources`, `outboxd sources
    /// list`): the [`snapshot`](Self::snapshot) entries, each with its
    /// `name` and `last_cycle_age_ms` (time since its last cycle).
    pub fn list(&self) -> Vec<serde_json::Value> {
        let (_, all) = self.snapshot();
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let serde_json::Value::Object(all) = all else {
            return Vec::new();
        };
        all.into_iter()
            .map(|(name, mut s)| {
                s["name"] = serde_json::json!(name);
                s["last_cycle_age_ms"] = serde_json::json!(s["last_cycle_at_ms"]
                    .as_u64()
                    .map(|at| now_ms.saturating_sub(at)));
                s
            })
            .collect()
    }
}

/// One source's handle on its own status.
#[derive(Clone)]
pub struct StatusHandle {
    name: String,
    statuses: Arc<Statuses>,
}

impl StatusHandle {
    /// Set check `check`; with `stale_after`, it turns not-ok unless set
    /// again within that time.
    pub fn check(
        &self,
        check: &str,
        ok: bool,
        detail: Option<String>,
        stale_after: Option<Duration>,
    ) {
        self.statuses.with(&self.name, |s| {
            s.checks.insert(
                check.to_string(),
                Check {
                    ok,
                    detail,
                    at: Instant::now(),
                    stale_after,
                },
            );
        });
    }

    /// A cycle (a poll, a scan page) finished without error.
    pub fn cycle(&self) {
        self.statuses.with(&self.name, |s| {
            s.last_cycle_at = Some(SystemTime::now());
            s.last_error = None;
        });
    }

    /// Record a failure the source retries by itself (the run goes on);
    /// the next [`cycle`](Self::cycle) clears it.
    pub fn error(&self, error: String) {
        self.statuses
            .with(&self.name, |s| s.last_error = Some(error));
    }

    fn restarted(&self) {
        self.statuses.with(&self.name, |s| s.restarts += 1);
    }
}

/// Register and start every configured source, each in its own task that
/// runs it again after a failure or a panic (backoff [`BACKOFF_INITIAL`] doubling to
/// [`BACKOFF_MAX`]), until `shutdown` turns true.
pub fn spawn_all(
    sources: &BTreeMap<String, SourceConfig>,
    ctx: SourceContext,
    statuses: Arc<Statuses>,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (name, config) in sources {
        statuses
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                name.clone(),
                SourceStatus {
                    kind: config.kind(),
                    last_error: None,
                    last_cycle_at: None,
                    checks: BTreeMap::new(),
                    restarts: 0,
                },
            );
        let status = StatusHandle {
            name: name.clone(),
            statuses: statuses.clone(),
        };
        tasks.push(tokio::spawn(supervise(
            name.clone(),
            config.clone(),
            ctx.clone(),
            status,
            shutdown.clone(),
        )));
    }
    tasks
}

async fn supervise(
    name: String,
    config: SourceConfig,
    ctx: SourceContext,
    status: StatusHandle,
    mut shutdown: watch::Receiver<bool>,
) {
    let backoff = Backoff::doubling(BACKOFF_INITIAL, BACKOFF_MAX);
    let mut failures = 0u32;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        // Each run in a task of its own, so a panic is a failure like any
        // other: shown, and run again after the backoff.
        let run = {
            let (name, config, ctx, status) =
                (name.clone(), config.clone(), ctx.clone(), status.clone());
            let shutdown = shutdown.clone();
            tokio::spawn(async move { config.source().run(&name, &ctx, &status, shutdown).await })
        };
        let result = match run.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err(SourceError::Task(format!("panicked: {e}"))),
            Err(e) => Err(SourceError::Task(format!("ended: {e}"))),
        };
        match result {
            Ok(()) => return, // shutdown
            Err(error) => {
                if started.elapsed() >= BACKOFF_RESET_AFTER {
                    failures = 0;
                }
                tracing::warn!(source = %name, kind = config.kind(), retry_in = ?backoff.delay(failures), "source failed: {error}");
                status.error(error.to_string());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.delay(failures)) => {}
            _ = shutdown.changed() => return,
        }
        failures = failures.saturating_add(1);
        status.restarted();
    }
}
