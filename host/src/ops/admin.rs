//! The admin API under `/v1/admin/`: dead letters, sinks, events.
//!
//! Owns: the bearer-token check (`Authorization: Bearer <admin.token>`;
//! 401 without it or with a wrong one, compared in constant time), and the
//! HTTP shape of each admin action. The same actions are in the CLI.
//!
//! Must never: act without the token when one is configured.

use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::OpsState;
use crate::plugin::registry::{SinkState, REMOVED_REASON};
use crate::store::DeadFilter;

/// Most dead letters one request lists, replays or purges.
pub const MAX_PAGE: u32 = 10_000;

/// The admin routes, behind the token check.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/v1/admin/events/{id}", get(show_event))
        .route("/v1/admin/dead", get(list_dead))
        .route("/v1/admin/dead/replay", post(replay_dead))
        .route("/v1/admin/dead/purge", post(purge_dead))
        .route("/v1/admin/sinks", get(list_sinks))
        .route("/v1/admin/sources", get(list_sources))
        .route("/v1/admin/backfill", post(backfill))
        .route("/v1/admin/sinks/{sink}/pause", post(pause))
        .route("/v1/admin/sinks/{sink}/resume", post(resume))
        .route("/v1/admin/sinks/{sink}/retire", post(retire))
        .merge(super::destinations::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

/// Every configured source with its status (`outboxd sources list`
/// prints the same).
async fn list_sources(State(state): State<OpsState>) -> Response {
    Json(json!({ "sources": state.sources.list() })).into_response()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_token(State(state): State<OpsState>, request: Request, next: Next) -> Response {
    if let Some(token) = state.admin_token.as_deref().filter(|t| !t.is_empty()) {
        let given = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => {}
            _ => {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                    Json(json!({ "error": "admin API: missing or wrong bearer token" })),
                )
                    .into_response()
            }
        }
    }
    next.run(request).await
}

fn store_error(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "error": format!("store: {e}") })),
    )
        .into_response()
}

async fn show_event(State(state): State<OpsState>, Path(id): Path<String>) -> Response {
    match state.store.event(&id).await {
        Ok(Some((stored, deliveries))) => Json(json!({
            "id": stored.event.id,
            "type": stored.event.ty,
            "source": stored.event.source,
            "stream": stored.event.stream,
            "sequence": stored.sequence,
            "ingested_at_ms": stored.ingested_at_ms,
            "deliveries": deliveries,
        }))
        .into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no event with id {id:?}") })),
        )
            .into_response(),
        Err(e) => store_error(e),
    }
}

/// Query of `GET /v1/admin/dead`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    sink: Option<String>,
    stream: Option<String>,
    limit: Option<u32>,
}

async fn list_dead(State(state): State<OpsState>, Query(q): Query<ListQuery>) -> Response {
    let filter = DeadFilter {
        sink: q.sink,
        stream: q.stream,
        ..Default::default()
    };
    match state
        .store
        .list_dead(&filter, q.limit.unwrap_or(100).min(MAX_PAGE))
        .await
    {
        Ok(dead) => Json(json!({ "dead": dead })).into_response(),
        Err(e) => store_error(e),
    }
}

/// Body of replay and purge: a filter (all fields optional) and a limit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Selection {
    #[serde(flatten)]
    filter: DeadFilter,
    limit: Option<u32>,
}

async fn replay_dead(State(state): State<OpsState>, body: Option<Json<Selection>>) -> Response {
    let sel = body.map(|b| b.0).unwrap_or_default();
    match state
        .store
        .replay_dead(&sel.filter, sel.limit.unwrap_or(MAX_PAGE).min(MAX_PAGE))
        .await
    {
        Ok(n) => {
            state.wake.everyone();
            Json(json!({ "replayed": n })).into_response()
        }
        Err(e) => store_error(e),
    }
}

async fn purge_dead(State(state): State<OpsState>, body: Option<Json<Selection>>) -> Response {
    let sel = body.map(|b| b.0).unwrap_or_default();
    match state
        .store
        .purge_dead(&sel.filter, sel.limit.unwrap_or(MAX_PAGE).min(MAX_PAGE))
        .await
    {
        Ok(n) => {
            // A purged dead letter may unblock its stream (`on-dead = block`).
            state.wake.everyone();
            Json(json!({ "purged": n })).into_response()
        }
        Err(e) => store_error(e),
    }
}

async fn list_sinks(State(state): State<OpsState>) -> Response {
    let paused = match state.store.paused_sinks().await {
        Ok(p) => p,
        Err(e) => return store_error(e),
    };
    // `state`: "loaded" (with its version), "quarantined" (loaded, but not
    // claiming until `quarantine.until_ms` after failing batch after
    // batch; `quarantine.reason` says how), "removed" (its manifest is
    // gone; deliveries parked with reason "sink removed" until it returns)
    // or "refused" (a manifest names it but it never loaded).
    let states = state.plugins.states();
    let quarantined = state.quarantines.current();
    let fleet = state.fleet.status();
    let mut names = state.plugins.known();
    names.extend(fleet.sinks.iter().map(|s| s.name.clone()));
    names.sort();
    names.dedup();
    let sinks: Vec<_> = names
        .iter()
        .map(|s| {
            let f = fleet.sinks.iter().find(|f| &f.name == s);
            let quarantine = quarantined.get(s);
            let (loaded, st, version, parked) = match states.get(s) {
                Some(SinkState::Loaded { version }) if quarantine.is_some() => {
                    (true, "quarantined", Some(version.clone()), None)
                }
                Some(SinkState::Loaded { version }) => {
                    (true, "loaded", Some(version.clone()), None)
                }
                Some(SinkState::Removed) => (false, "removed", None, Some(REMOVED_REASON)),
                None if state.plugins.known().contains(s) => (false, "refused", None, None),
                // Registered by another replica; not loaded here.
                None => (false, "elsewhere", None, None),
            };
            json!({
                "sink": s,
                "loaded": loaded,
                "state": st,
                "version": version,
                "paused": paused.contains(s),
                "parked": parked,
                "quarantine": quarantine,
                "registered": f.is_some_and(|f| f.registered),
                "retired": f.is_some_and(|f| f.retired),
                "unserved": f.is_some_and(|f| f.unserved),
                "replicas": f.map(|f| f.replicas.clone()).unwrap_or_default(),
                "version_skew": f.is_some_and(|f| f.versions.len() > 1),
            })
        })
        .collect();
    Json(json!({ "sinks": sinks, "replica": fleet.replica })).into_response()
}

/// `POST /v1/admin/sinks/{sink}/retire`: no replica routes new events to
/// it from now on; its deliveries already queued stay and are delivered
/// by any replica that still has its plugin loaded (or wait).
async fn retire(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    match state.store.retire_sink(&sink).await {
        Ok(true) => {
            let _ = state.fleet.cycle().await;
            Json(json!({ "sink": sink, "retired": true })).into_response()
        }
        Ok(false) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no registered sink {sink:?} that is not retired already") })),
        )
            .into_response(),
        Err(e) => store_error(e),
    }
}

async fn set_paused(state: OpsState, sink: String, paused: bool) -> Response {
    if !state.plugins.known().contains(&sink) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no sink named {sink:?}") })),
        )
            .into_response();
    }
    match state.store.set_paused(&sink, paused).await {
        Ok(()) => Json(json!({ "sink": sink, "paused": paused })).into_response(),
        Err(e) => store_error(e),
    }
}

async fn pause(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    set_paused(state, sink, true).await
}

async fn resume(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    let r = set_paused(state.clone(), sink, false).await;
    r
}

/// Body of `POST /v1/admin/backfill`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillRequest {
    sink: String,
    /// Events ingested at or after this time, Unix ms. Default: all.
    #[serde(default)]
    since_ms: i64,
}

async fn backfill(State(state): State<OpsState>, Json(req): Json<BackfillRequest>) -> Response {
    if !state.plugins.known().contains(&req.sink) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no sink named {:?}", req.sink) })),
        )
            .into_response();
    }
    match crate::ingest::routes::backfill(&*state.store, &state.routes, &req.sink, req.since_ms)
        .await
    {
        Ok((scanned, created)) => {
            state.wake.everyone();
            Json(json!({ "sink": req.sink, "scanned": scanned, "created": created }))
                .into_response()
        }
        Err(e) => store_error(e),
    }
}
