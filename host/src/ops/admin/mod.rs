//! The admin API under `/v1/admin/`: the HTTP face of the admin actions
//! (`super::actions`), which the CLI reaches through it.
//!
//! Owns: the bearer-token check (`Authorization: Bearer <admin.token>`;
//! 401 without it or with a wrong one, compared in constant time); for
//! each action, its route, reading the request into the action's input
//! (errors name the field), the status of its answer, and waking this
//! daemon's delivery loops after a change; the one form of a refusal
//! ([`refused`]: the action's status and `{"error", "code", "field"}`).
//!
//! Must never: act without the token when one is configured, or decide
//! anything an action decides (the CLI would then answer differently).

mod destinations;
mod producers;
mod secrets;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::actions::dead::{self, DeadSelection};
use super::actions::sinks::{self, BackfillRequest};
use super::actions::{attempts, events, invalid, AdminError};
use super::OpsState;
use crate::store::DeadFilter;

/// The admin routes, behind the token check.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/v1/admin/events", get(search_events))
        .route("/v1/admin/events/{id}", get(show_event))
        .route("/v1/admin/events/{id}/body", get(show_body))
        .route("/v1/admin/streams/{stream}", get(show_stream))
        .route("/v1/admin/attempts", get(list_attempts))
        .route("/v1/admin/dead", get(list_dead))
        .route("/v1/admin/dead/replay", post(replay_dead))
        .route("/v1/admin/dead/purge", post(purge_dead))
        .route("/v1/admin/sinks", get(list_sinks))
        .route("/v1/admin/sources", get(list_sources))
        .route("/v1/admin/queue", get(queue))
        .route("/v1/admin/backfill", post(backfill))
        .route("/v1/admin/sinks/{sink}/pause", post(pause))
        .route("/v1/admin/sinks/{sink}/resume", post(resume))
        .route("/v1/admin/sinks/{sink}/retire", post(retire))
        .merge(destinations::routes())
        .merge(producers::routes())
        .merge(secrets::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

/// An action's refusal as the admin API answers it: its status and
/// `{"error": message, "code": …}` (the code stable per status:
/// `invalid`, `not-found`, `conflict`, `store-unavailable`, …), with
/// `"field"` naming the bad input when there is one.
fn refused(e: AdminError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let code = match status.as_u16() {
        400 => "invalid",
        401 => "unauthorized",
        404 => "not-found",
        409 => "conflict",
        503 => "store-unavailable",
        _ => "refused",
    };
    let mut body = json!({ "error": e.to_string(), "code": code });
    if let Some(field) = e.field() {
        body["field"] = field.into();
    }
    (status, Json(body)).into_response()
}

/// An action's answer with `200 OK`, or its refusal.
fn answer<T: serde::Serialize>(result: Result<T, AdminError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(e) => refused(e),
    }
}

/// A JSON request body as `T`, naming the field at fault
/// (`serde_path_to_error`; `body` for the body as a whole). An empty body
/// reads as `{}`.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, AdminError> {
    let value: serde_json::Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| invalid("body", format!("not JSON: {e}")))?
    };
    parse_value(value)
}

/// [`parse`] of a body already read as JSON.
fn parse_value<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, AdminError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        invalid(
            if path == "." { "body".into() } else { path },
            e.inner().to_string(),
        )
    })
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

/// `GET /v1/admin/events/{id}`: [`events::EventView`].
async fn show_event(State(state): State<OpsState>, Path(id): Path<String>) -> Response {
    answer(events::show_event(&*state.store, &id).await)
}

/// `GET /v1/admin/events?id=&stream=&type=&source=&since=&until=&state=&limit=`:
/// [`events::FoundEvents`], newest first.
async fn search_events(
    State(state): State<OpsState>,
    Query(q): Query<events::EventQuery>,
) -> Response {
    answer(events::search(&*state.store, &q).await)
}

/// `GET /v1/admin/events/{id}/body`: [`events::EventBody`].
async fn show_body(State(state): State<OpsState>, Path(id): Path<String>) -> Response {
    answer(events::show_body(&*state.store, &id).await)
}

/// `GET /v1/admin/streams/{stream}`: [`super::actions::streams::StreamView`].
async fn show_stream(State(state): State<OpsState>, Path(stream): Path<String>) -> Response {
    answer(super::actions::streams::show(&state.destinations(), &stream).await)
}

/// `GET /v1/admin/attempts?sink=&event_id=&since=&until=&limit=`:
/// [`attempts::Attempts`], newest first.
async fn list_attempts(
    State(state): State<OpsState>,
    Query(q): Query<attempts::AttemptQuery>,
) -> Response {
    answer(attempts::list(&*state.store, &q).await)
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

/// `GET /v1/admin/dead`: [`dead::DeadLetters`], newest first.
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
    answer(dead::list_dead(&*state.store, &sel).await)
}

/// `POST /v1/admin/dead/replay`: [`dead::Replayed`].
async fn replay_dead(State(state): State<OpsState>, body: Option<Json<DeadSelection>>) -> Response {
    let sel = body.map(|b| b.0).unwrap_or_default();
    let done = dead::replay_dead(&*state.store, &sel).await;
    if done.is_ok() {
        state.wake.everyone();
    }
    answer(done)
}

/// `POST /v1/admin/dead/purge`: [`dead::PurgedDead`].
async fn purge_dead(State(state): State<OpsState>, body: Option<Json<DeadSelection>>) -> Response {
    let sel = body.map(|b| b.0).unwrap_or_default();
    let done = dead::purge_dead(&*state.store, &sel).await;
    if done.is_ok() {
        // A purged dead letter may unblock its stream (`on-dead = block`).
        state.wake.everyone();
    }
    answer(done)
}

/// `GET /v1/admin/sinks`: [`sinks::Sinks`].
async fn list_sinks(State(state): State<OpsState>) -> Response {
    answer(
        sinks::list_sinks(
            &*state.store,
            &state.plugins,
            &state.quarantines,
            &state.fleet,
        )
        .await,
    )
}

/// `GET /v1/admin/queue`: [`crate::store::QueueStats`].
async fn queue(State(state): State<OpsState>) -> Response {
    answer(sinks::queue(&*state.store).await)
}

/// `GET /v1/admin/sources`: [`super::actions::sources::Sources`].
async fn list_sources(State(state): State<OpsState>) -> Response {
    Json(super::actions::sources::list(&state.sources)).into_response()
}

/// `POST /v1/admin/sinks/{sink}/retire`: no replica routes new events to
/// it from now on; its deliveries already queued stay and are delivered
/// by any replica that still has its plugin loaded (or wait).
async fn retire(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    let done = sinks::retire(&*state.store, &sink).await;
    if done.is_ok() {
        let _ = state.fleet.cycle().await;
    }
    answer(done)
}

/// `POST /v1/admin/sinks/{sink}/pause`: [`sinks::SinkPaused`].
async fn pause(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    answer(sinks::set_paused(&*state.store, &state.plugins.known(), &sink, true).await)
}

/// `POST /v1/admin/sinks/{sink}/resume`: [`sinks::SinkPaused`].
async fn resume(State(state): State<OpsState>, Path(sink): Path<String>) -> Response {
    answer(sinks::set_paused(&*state.store, &state.plugins.known(), &sink, false).await)
}

/// `POST /v1/admin/backfill` ([`BackfillRequest`]): [`sinks::Backfilled`].
async fn backfill(State(state): State<OpsState>, Json(req): Json<BackfillRequest>) -> Response {
    let known = state.plugins.known();
    let done = sinks::backfill(&*state.store, &state.routes, &known, &req).await;
    if done.is_ok() {
        state.wake.everyone();
    }
    answer(done)
}

/// The body of a change answered with `201 Created`.
fn created<T: serde::Serialize>(value: T) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

/// Read a body (see [`parse`]); on a refusal, the answer to give.
type Parsed<T> = Result<T, Box<Response>>;

fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Parsed<T> {
    parse(bytes).map_err(|e| Box::new(refused(e)))
}
