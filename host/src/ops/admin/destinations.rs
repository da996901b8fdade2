//! The HTTP face of the destination actions, under
//! `/v1/admin/destinations`: `POST`/`GET` `/v1/admin/destinations`,
//! `GET`/`PUT`/`PATCH`/`DELETE` `/v1/admin/destinations/{name}` (`DELETE`
//! requires `?pending=park|purge`), `POST …/{name}/pause`, `…/resume`,
//! `…/rotate-secret`, and `POST /v1/admin/destinations/sync`.
//!
//! Owns: reading each request into the action's input and the status of
//! its answer (`201` for a destination created).
//!
//! Must never: decide anything itself — every rule is in
//! `crate::ops::actions::destinations` and `…::sync`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::Value;

use super::{answer, body, created, parse_value, refused};
use crate::ops::actions::destinations::{self as actions, Pending, Spec};
use crate::ops::actions::{invalid, sync};
use crate::ops::OpsState;

/// The destination routes (the caller adds the token check).
pub fn routes() -> Router<OpsState> {
    Router::new()
        .route("/v1/admin/destinations", get(list).post(create))
        .route("/v1/admin/destinations/sync", post(sync))
        .route(
            "/v1/admin/destinations/{name}",
            get(show).put(put).patch(edit).delete(delete),
        )
        .route("/v1/admin/destinations/{name}/pause", post(pause))
        .route("/v1/admin/destinations/{name}/resume", post(resume))
        .route("/v1/admin/destinations/{name}/rotate-secret", post(rotate))
}

async fn list(State(state): State<OpsState>) -> Response {
    answer(actions::list(&state.destinations()).await)
}

async fn show(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    answer(actions::show(&state.destinations(), &name).await)
}

/// `POST /v1/admin/destinations`: a [`Spec`] with its `name`.
async fn create(State(state): State<OpsState>, bytes: Bytes) -> Response {
    let mut value: Value = match body(&bytes) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let name = match value.as_object_mut().and_then(|m| m.remove("name")) {
        Some(Value::String(n)) => n,
        Some(_) => return refused(invalid("name", "must be a string")),
        None => return refused(invalid("name", "is required")),
    };
    let spec: Spec = match parse_value(value) {
        Ok(s) => s,
        Err(e) => return refused(e),
    };
    match actions::create(&state.destinations(), &name, spec).await {
        Ok(w) => created(w),
        Err(e) => refused(e),
    }
}

/// `PATCH /v1/admin/destinations/{name}`: an [`actions::Edit`], the
/// fields it gives replacing the stored ones.
async fn edit(State(state): State<OpsState>, Path(name): Path<String>, bytes: Bytes) -> Response {
    let edit: actions::Edit = match body(&bytes) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    answer(actions::edit(&state.destinations(), &name, edit).await)
}

async fn put(State(state): State<OpsState>, Path(name): Path<String>, bytes: Bytes) -> Response {
    let spec: Spec = match body(&bytes) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    match actions::put(&state.destinations(), &name, spec).await {
        Ok(w) if w.created => created(w),
        other => answer(other),
    }
}

/// Query of `DELETE /v1/admin/destinations/{name}`.
#[derive(Debug, Deserialize)]
struct DeleteQuery {
    pending: Option<String>,
}

async fn delete(
    State(state): State<OpsState>,
    Path(name): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> Response {
    let pending = match q.pending.as_deref() {
        Some("park") => Pending::Park,
        Some("purge") => Pending::Purge,
        other => {
            return refused(invalid(
                "pending",
                format!(
                    "{}: say what happens to its deliveries not yet delivered — \
                     `?pending=park` keeps them waiting under its name, `?pending=purge` deletes them",
                    other.map_or("is required".to_string(), |o| format!("{o:?} is neither park nor purge"))
                ),
            ))
        }
    };
    answer(actions::delete(&state.destinations(), &name, pending).await)
}

/// `POST /v1/admin/destinations/sync`: a platform list (see
/// [`sync::parse`]) the catch-all destinations are made to match.
async fn sync(State(state): State<OpsState>, bytes: Bytes) -> Response {
    let req = match sync::parse(&String::from_utf8_lossy(&bytes)) {
        Ok(r) => r,
        Err(e) => return refused(invalid("body", e)),
    };
    answer(sync::sync(&state.destinations(), &req).await)
}

async fn pause(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    answer(actions::set_active(&state.destinations(), &name, false).await)
}

async fn resume(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    answer(actions::set_active(&state.destinations(), &name, true).await)
}

/// Body of `POST …/{name}/rotate-secret` (both optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    /// The new secret; generated when absent.
    secret: Option<String>,
    /// How long the previous secret keeps signing, e.g. `"1h"`.
    #[serde(default, with = "humantime_serde")]
    grace: Option<Duration>,
}

async fn rotate(State(state): State<OpsState>, Path(name): Path<String>, bytes: Bytes) -> Response {
    let req: RotateBody = match body(&bytes) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    answer(actions::rotate(&state.destinations(), &name, req.secret, req.grace).await)
}
