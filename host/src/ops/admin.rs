//! The admin API under `/v1/admin/`: dead letters, sinks, events.
//!
//! Owns: the bearer-token check (`Authorization: Bearer <admin.token>`;
//! 401 without it or with a wrong one, compared in constant time), and the
//! HTTP shape of each admin action: request parsing, status codes, answer
//! bodies, and waking this daemon's delivery loops after a change. The
//! actions themselves are [`super::actions`], which the CLI calls too.
//!
//! Must never: act without the token when one is configured, or decide
//! anything an action decides (the CLI would then answer differently).

use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::actions::{self, AdminError, DeadSelection};
use super::OpsState;
use crate::store::DeadFilter;

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
        .merge(super::producers::routes())
        .merge(super::secrets::routes())
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

/// `None` when `headers` carry the admin token (or none is configured);
/// else the 401 answer (`code` `unauthorized`).
pub(crate) fn token_refusal(state: &OpsState, headers: &axum::http::HeaderMap) -> Option<Response> {
    let token = state.admin_token.as_deref().filter(|t| !t.is_empty())?;
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => None,
        _ => Some(
            (
                StatusCode::UNAUTHORIZED,
                [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                Json(json!({
                    "error": "admin API: missing or wrong bearer token",
                    "code": "unauthorized",
                })),
            )
                .into_response(),
        ),
    }
}

async fn require_token(State(state): State<OpsState>, request: Request, next: Next) -> Response {
    if let Some(refused) = token_refusal(&state, request.headers()) {
        state.metrics.refused("admin", "admin-token");
        return refused;
    }
    next.run(request).await
}

/// `e` as the admin API answers it (see [`super::refusal`]).
fn refused(e: AdminError) -> Response {
    let field = match &e {
        AdminError::Invalid { field, .. } => Some(field.as_str()),
        _ => None,
    };
    super::refusal(e.status(), &e.to_string(), field)
}

/// `GET /v1/admin/events/{id}`: [`actions::EventView`].
async fn show_event(State(state): State<OpsState>, Path(id): Path<String>) -> Response {
    match actions::show_event(&*state.store, &id).await {
        Ok(view) => Json(view).into_response(),
        Err(e) => refused(e),
    }
}

/// Query of `GET /v1/admin/dead`: the fields of the replay and purge body
/// (a [`DeadFilter`] and `limit`), spelled out because a query string
/// cannot carry a flattened struct's numbers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    sink: Option<String>,
    stream: Option<String>,
    event_id: Option<String>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: Option<u32>,
}

/// `GET /v1/admin/dead`: `{"dead": [DeadLetter…]}`, newest first;
/// `limit` as [`actions::DeadSelection`] rules.
async fn list_dead(State(state): State<OpsState>, Query(q): Query<ListQuery>) -> Response {
    let sel = DeadSelection {
        filter: DeadFilter {
            sink: q.sink,
            stream: q.stream,
            event_id: q.event_id,
            since_ms: q.since_ms,
            until_ms: q.until_ms,
        },
        limit: q.limit,
    };
    match actions::list_dead(&*state.store, &sel).await {
        Ok(dead) => Json(json!({ "dead": dead })).into_response(),
        Err(e) => refused(e),
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

impl From<Selection> for DeadSelection {
    fn from(s: Selection) -> DeadSelection {
        DeadSelection {
            filter: s.filter,
            limit: s.limit,
        }
    }
}

/// `POST /v1/admin/dead/replay`: `{"replayed": n}`.
async fn replay_dead(State(state): State<OpsState>, body: Option<Json<Selection>>) -> Response {
    let sel = body.map(|b| b.0).unwrap_or_default().into();
    match actions::replay_dead(&*state.store, &sel).await {
        Ok(n) => {
            state.wake.everyone();
            Json(json!({ "replayed": n })).into_response()
        }
        Err(e) => refused(e),
    }
}

/// `POST /v1/admin/dead/purge`: `{"purged": n}`.
async fn purge_dead(State(state): State<OpsState>, body: Option<Json<Selection>>) -> Response {
    let sel = body.map(|b| b.0).unwrap_or_default().into();
    match actions::purge_dead(&*state.store, &sel).await {
        Ok(n) => {
            // A purged dead letter may unblock its stream (`on-dead = block`).
            state.wake.everyone();
            Json(json!({ "purged": n })).into_response()
        }
        Err(e) => refused(e),
    }
}

/// `GET /v1/admin/sinks`: `{"sinks": [SinkView…], "replica"}`.
async fn list_sinks(State(state): State<OpsState>) -> Response {
    match actions::list_sinks(
        &*state.store,
        &state.plugins,
        &state.quarantines,
        &state.fleet,
    )
    .await
    {
        Ok((sinks, replica)) => Json(json!({ "sinks": sinks, "replica": replica })).into_response(),
        Err(e) => refused(e),
    }
}

/// `POST /v1/admin/sinks/{sink}/retire`: no replica routes new events to
/// it from now on; its deliveries already queued stay and are delivered
/// by any replica that still has its plugin loaded (or wait).
async fn retire(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    match actions::retire(&*state.store, &sink).await {
        Ok(()) => {
            let _ = state.fleet.cycle().await;
            Json(json!({ "sink": sink, "retired": true })).into_response()
        }
        Err(e) => refused(e),
    }
}

async fn set_paused(state: OpsState, sink: String, paused: bool) -> Response {
    match actions::set_paused(&*state.store, &state.plugins.known(), &sink, paused).await {
        Ok(()) => Json(json!({ "sink": sink, "paused": paused })).into_response(),
        Err(e) => refused(e),
    }
}

/// `POST /v1/admin/sinks/{sink}/pause`.
async fn pause(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    set_paused(state, sink, true).await
}

/// `POST /v1/admin/sinks/{sink}/resume`.
async fn resume(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    set_paused(state, sink, false).await
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

/// `POST /v1/admin/backfill`: [`actions::Backfilled`].
async fn backfill(State(state): State<OpsState>, Json(req): Json<BackfillRequest>) -> Response {
    let known = state.plugins.known();
    match actions::backfill(
        &*state.store,
        &state.routes,
        &known,
        &req.sink,
        req.since_ms,
    )
    .await
    {
        Ok(done) => {
            state.wake.everyone();
            Json(done).into_response()
        }
        Err(e) => refused(e),
    }
}
