//! Sources: relays that pull events out of an application's own outbox.
//!
//! Owns only what every source needs: the `[sources.NAME]` configuration
//! dispatch ([`SourceConfig`], tagged by `kind = "..."`, one variant per
//! kind, each variant's struct in its own file), starting each configured
//! source as its own task supervised with backoff ([`spawn_all`]), and the
//! per-source status (ready / last error / last cycle time / named checks)
//! that `/ready`, `GET /v1/admin/sources` and `outboxd sources list` show
//! ([`Statuses`]).
//!
//! Each kind lives in `sources/<kind>.rs`. A source hands events to the
//! store through [`crate::ingest::submit`], the path the HTTP ingest uses
//! (idempotent on id), never by writing rows around it.
//!
//! Must never: let one source's failure stop the daemon or another source
//! (each runs in its own task; an error is logged, shown, and retried after
//! a backoff), or hold kind-specific logic here.

pub mod amqp;
pub mod couchdb;
pub mod neo4j;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::ingest::routes::Router as Routes;
use crate::metrics::Metrics;
use crate::store::Store;

/// One `[sources.NAME]` table: `kind` picks the variant, the other keys are
/// the kind's own (unknown keys are refused, naming the key).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[allow(clippy::large_enum_variant)] // a few per process, read once at start
pub enum SourceConfig {
    /// Pending entries kept inside CouchDB documents ([`couchdb`]).
    Couchdb(couchdb::CouchdbConfig),
    /// Outbox nodes in a Neo4j graph ([`neo4j`]).
    Neo4j(neo4j::Neo4jSourceConfig),
    /// Messages of a RabbitMQ queue ([`amqp`]).
    Amqp(amqp::AmqpSourceConfig),
}

/// The kinds `kind` may name.
pub const KINDS: &[&str] = &["amqp", "couchdb", "neo4j"];

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
        let value = serde_json::Value::Object(table);
        fn named<E: Error>(e: serde_path_to_error::Error<serde_json::Error>) -> E {
            E::custom(format!("`{}`: {}", e.path(), e.inner()))
        }
        match kind.as_str() {
            "couchdb" => serde_path_to_error::deserialize(value)
                .map(SourceConfig::Couchdb)
                .map_err(named),
            "neo4j" => serde_path_to_error::deserialize(value)
                .map(SourceConfig::Neo4j)
                .map_err(named),
            "amqp" => serde_path_to_error::deserialize(value)
                .map(SourceConfig::Amqp)
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
            SourceConfig::Couchdb(_) => "couchdb",
            SourceConfig::Neo4j(_) => "neo4j",
            SourceConfig::Amqp(_) => "amqp",
        }
    }

    /// Check what types alone cannot. `Err((key, problem))` names the key
    /// under `sources.NAME.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        match self {
            SourceConfig::Couchdb(c) => c.validate(),
            SourceConfig::Neo4j(c) => c.validate(),
            SourceConfig::Amqp(c) => c.validate(),
        }
    }

    /// The same configuration with secrets (passwords in URLs) replaced,
    /// for `outboxd config show`.
    pub fn redacted(&self) -> SourceConfig {
        match self {
            SourceConfig::Couchdb(c) => SourceConfig::Couchdb(c.clone()), // credentials are env names
            SourceConfig::Neo4j(c) => SourceConfig::Neo4j(c.clone()),     // password is an env name
            SourceConfig::Amqp(c) => SourceConfig::Amqp(c.redacted()),
        }
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
    pub amqp: crate::plugin::amqp::AmqpPool,
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
            tokio::spawn(async move {
                match &config {
                    SourceConfig::Couchdb(c) => couchdb::run(&name, c, &ctx, &status, shutdown)
                        .await
                        .map_err(|e| e.to_string()),
                    SourceConfig::Neo4j(c) => neo4j::run(&name, c, &ctx, &status, shutdown)
                        .await
                        .map_err(|e| e.to_string()),
                    SourceConfig::Amqp(c) => amqp::run(&name, c, &ctx, &status, shutdown).await,
                }
            })
        };
        let result = match run.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err(format!("source task panicked: {e}")),
            Err(e) => Err(format!("source task ended: {e}")),
        };
        match result {
            Ok(()) => return, // shutdown
            Err(error) => {
                if started.elapsed() >= BACKOFF_RESET_AFTER {
                    failures = 0;
                }
                tracing::warn!(source = %name, kind = config.kind(), retry_in = ?backoff.delay(failures), "source failed: {error}");
                status.error(error);
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
