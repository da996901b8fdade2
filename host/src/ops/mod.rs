//! Operations: probes, metrics, and the admin layer — the admin actions
//! ([`actions`], one typed action and one error type for every admin
//! operation) and the admin API, their HTTP face ([`admin`]).
//!
//! Owns: `/health` (200 while the process serves and every delivery loop
//! has finished a turn within its stale limit), `/ready` (database answers,
//! no migration pending, every loop fresh *and* succeeding, plugins
//! loaded; with queue figures), `/metrics` (Prometheus text), and the
//! admin API under `/v1/admin/` (bearer token when configured; `/metrics`
//! too when `metrics.require-token` is on, the default beyond loopback),
//! and the API's own description at `/v1/openapi.json` ([`openapi`]).
//!
//! Must never: run an unbounded query on a probe path — counts are capped
//! and every store call has a short timeout, so a huge backlog cannot make
//! a probe time out.

pub mod actions;
pub mod admin;
pub mod openapi;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::delivery::Heartbeats;
use crate::metrics::{Metrics, SinkLabel, SinkStatusLabel};
use crate::plugin::registry::SinkState;
use crate::store::{QueueStats, Store};

pub use crate::limits::PROBE_TIMEOUT;
/// Most rows counted for queue figures ([`crate::store::STATS_COUNT_CAP`]).
pub const COUNT_CAP: u64 = crate::store::STATS_COUNT_CAP;

/// What the endpoints look at.
#[derive(Clone)]
pub struct OpsState {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// The sinks: loaded, removed (parked), refused.
    pub plugins: Arc<crate::plugin::registry::Registry>,
    /// Each delivery loop's liveness.
    pub heartbeats: Arc<Heartbeats>,
    /// The Prometheus registry.
    pub metrics: Arc<Metrics>,
    /// Sinks quarantined after failing batch after batch.
    pub quarantines: Arc<crate::delivery::Quarantines>,
    /// The bearer token the admin API requires, when set.
    pub admin_token: Option<String>,
    /// The AMQP brokers plugins publish to (readiness shows an outage).
    pub amqp: crate::plugin::amqp::AmqpPool,
    /// The plugin runtime (`/metrics` shows its instance pool).
    pub runtime: crate::plugin::Runtime,
    /// The routing table (backfill routes past events with it).
    pub routes: Arc<crate::routing::routes::Router>,
    /// The configured sources' status (readiness shows each).
    pub sources: Arc<crate::sources::Statuses>,
    /// The destinations this process routes by.
    pub live: Arc<crate::destinations::live::Live>,
    /// Wakes delivery loops after an action queued work (a backfill).
    pub wake: Arc<crate::wakeups::Wakeups>,
    /// The sinks across every replica.
    pub fleet: Arc<crate::fleet::Fleet>,
    /// Whether `/metrics` needs the admin token (`metrics.require-token`).
    pub metrics_require_token: bool,
    /// The producer gate of the HTTP ingest (the producer actions refresh
    /// it after a change).
    pub gate: Arc<crate::auth::Gate>,
}

impl OpsState {
    /// The context of the destination actions.
    pub fn destinations(&self) -> actions::destinations::Context {
        actions::destinations::Context {
            store: self.store.clone(),
            live: self.live.clone(),
            plugins: self.plugins.clone(),
            routes: self.routes.clone(),
            wake: self.wake.clone(),
        }
    }
}

/// The ops routes.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state.clone())
        .merge(openapi::router())
        .merge(admin::router(state))
}

async fn health(State(state): State<OpsState>) -> Response {
    let beats = state.heartbeats.snapshot();
    let stale: Vec<String> = beats
        .iter()
        .filter(|(_, b)| !b.fresh())
        .map(|(sink, b)| {
            format!(
                "{sink}: last turn {:.0?} ago (limit {:?})",
                b.age(),
                b.stale_after
            )
        })
        .collect();
    if stale.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "stale", "stale_loops": stale })),
        )
            .into_response()
    }
}

async fn queue(store: &dyn Store) -> Result<QueueStats, String> {
    match tokio::time::timeout(PROBE_TIMEOUT, store.queue_stats(COUNT_CAP)).await {
        Ok(Ok(q)) => Ok(q),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// `store.ping()` and `store.pending_migrations()`, each bounded by
/// [`PROBE_TIMEOUT`]: the `database` and `migrations` checks.
async fn database_checks(store: &dyn Store) -> (Result<(), String>, Result<(), String>) {
    let database = match tokio::time::timeout(PROBE_TIMEOUT, store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    };
    let migrations = match &database {
        Ok(()) => match tokio::time::timeout(PROBE_TIMEOUT, store.pending_migrations()).await {
            Ok(Ok(p)) if p.is_empty() => Ok(()),
            Ok(Ok(p)) => Err(format!("pending: {}", p.join(", "))),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        },
        Err(_) => Err("database unavailable".to_string()),
    };
    (database, migrations)
}

/// The `workers` check: ok when every delivery loop is fresh and
/// succeeding; each loop's figures by sink.
fn workers_check(heartbeats: &Heartbeats) -> serde_json::Value {
    let failing = heartbeats.failing();
    let mut workers = BTreeMap::new();
    let mut workers_ok = true;
    for (sink, beat) in &heartbeats.snapshot() {
        let ok = beat.fresh() && beat.succeeding();
        workers_ok &= ok;
        workers.insert(
            sink.clone(),
            json!({
                "ok": ok,
                "heartbeat_age_ms": beat.age().as_millis() as u64,
                "last_success_age_ms": beat.last_success.map(|t| t.elapsed().as_millis() as u64),
                "consecutive_failures": beat.consecutive_failures,
                // Shown, not failed on: the loop works; its target refuses
                // (e.g. a wrong ingest secret) and the batch is retried.
                "delivering": !failing.contains_key(sink),
                "last_failure": failing.get(sink).map(|f| f.reason.clone()),
                "failing_for_ms": failing.get(sink).map(|f| f.since.elapsed().as_millis() as u64),
            }),
        );
    }
    json!({ "ok": workers_ok, "sinks": workers })
}

/// The `plugins` check: ok when none was refused. Quarantines are shown,
/// not failed on: a quarantine ends by itself, ingest (what readiness
/// gates) is unaffected, and failing every replica's /ready for one sink's
/// plugin would stop ingest for every sink (docs/reference/sandbox.md,
/// "Quarantine state").
fn plugins_check(state: &OpsState) -> serde_json::Value {
    let refused = state.plugins.failures();
    let removed: Vec<String> = state
        .plugins
        .states()
        .into_iter()
        .filter(|(_, s)| *s == SinkState::Removed)
        .map(|(n, _)| n)
        .collect();
    json!({
        "ok": refused.is_empty(),
        "loaded": state.plugins.loaded(),
        "removed": removed,
        "refused": refused,
        "quarantined": state.quarantines.current(),
    })
}

/// The `amqp` check: ok when every broker a plugin publishes to is
/// connected.
async fn amqp_check(amqp: &crate::plugin::amqp::AmqpPool) -> serde_json::Value {
    let brokers = amqp.probe(PROBE_TIMEOUT).await;
    let ok = brokers.iter().all(|b| b.connected);
    let brokers: Vec<_> = brokers
        .iter()
        .map(
            |b| json!({ "broker": b.broker, "connected": b.connected, "last_error": b.last_error }),
        )
        .collect();
    json!({ "ok": ok, "brokers": brokers })
}

/// The `fleet` figures. Shown, not failed on: a sink no replica serves is
/// a fleet problem (deploy its plugin somewhere), and failing every
/// replica's /ready would stop ingest for every other sink.
fn fleet_figures(fleet: &crate::fleet::Fleet) -> serde_json::Value {
    let fleet = fleet.status();
    let names = |pick: fn(&crate::fleet::FleetSink) -> bool| -> Vec<String> {
        fleet
            .sinks
            .iter()
            .filter(|s| pick(s))
            .map(|s| s.name.clone())
            .collect()
    };
    json!({
        "replica": fleet.replica,
        "unserved": names(|s| s.unserved),
        "version_skew": names(|s| s.versions.len() > 1),
        "error": fleet.error,
    })
}

/// `/ready`: 200 when every check is ok, 503 otherwise; the body names
/// each check and the queue figures.
async fn ready(State(state): State<OpsState>) -> Response {
    let (database, migrations) = database_checks(&*state.store).await;
    let workers = workers_check(&state.heartbeats);
    let plugins = plugins_check(&state);
    let amqp = amqp_check(&state.amqp).await;
    let queue = if database.is_ok() {
        queue(&*state.store).await
    } else {
        Err("database unavailable".into())
    };
    let (sources_ok, sources) = state.sources.snapshot();
    let ok = database.is_ok()
        && migrations.is_ok()
        && workers["ok"] == true
        && plugins["ok"] == true
        && amqp["ok"] == true
        && sources_ok;
    let show = |r: &Result<(), String>| match r {
        Ok(()) => json!({ "ok": true }),
        Err(e) => json!({ "ok": false, "error": e }),
    };
    let body = json!({
        "ready": ok,
        "checks": {
            "database": show(&database),
            "migrations": show(&migrations),
            "workers": workers,
            "plugins": plugins,
            "amqp": amqp,
            "sources": { "ok": sources_ok, "sources": sources },
            "fleet": fleet_figures(&state.fleet),
        },
        "queue": match queue {
            Ok(q) => json!(q),
            Err(e) => json!({ "error": e }),
        },
    });
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<OpsState>, headers: axum::http::HeaderMap) -> Response {
    if state.metrics_require_token {
        if let Some(refused) = admin::token_refusal(&state, &headers) {
            state.metrics.refused("metrics", "admin-token");
            return refused;
        }
    }
    let m = &state.metrics;
    m.plugin_pool_slots
        .set(i64::from(state.runtime.pool_slots()));
    m.plugin_pool_instances.set(
        state
            .runtime
            .pooled_instances()
            .map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX)),
    );
    for (sink, beat) in state.heartbeats.snapshot() {
        let label = SinkLabel { sink };
        m.heartbeat_age
            .get_or_create(&label)
            .set(beat.age().as_secs_f64());
        m.consecutive_failures
            .get_or_create(&label)
            .set(beat.consecutive_failures as i64);
    }
    if let (_, serde_json::Value::Object(sources)) = state.sources.snapshot() {
        for (source, s) in sources {
            m.source_ready
                .get_or_create(&crate::metrics::SourceLabel { source })
                .set((s["ok"] == true) as i64);
        }
    }
    if let Ok(q) = queue(&*state.store).await {
        let (mut active, mut expired) = (0, 0);
        for sink in &state.plugins.known() {
            let s = q
                .sinks
                .iter()
                .find(|s| &s.sink == sink)
                .cloned()
                .unwrap_or_default();
            for (status, n) in [
                ("pending", s.pending),
                ("retrying", s.retrying),
                ("leased", s.leased),
                ("dead", s.dead),
            ] {
                m.queue_depth
                    .get_or_create(&SinkStatusLabel {
                        sink: sink.clone(),
                        status: status.into(),
                    })
                    .set(n as i64);
            }
            m.oldest_due_age
                .get_or_create(&SinkLabel { sink: sink.clone() })
                .set(s.oldest_due_age_ms.unwrap_or(0) as f64 / 1000.0);
            active += s.leased as i64;
            expired += s.expired_leases as i64;
        }
        m.leases_active.set(active);
        m.leases_expired.set(expired);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
        .into_response()
}
