//! The HTTP shape of the destination actions, under
//! `/v1/admin/destinations` (behind the admin token, see [`super::admin`]).
//!
//! Owns: request parsing (errors name the field, by
//! `serde_path_to_error`), status codes, and the answer bodies of
//! `POST`/`GET` `/v1/admin/destinations`, `GET`/`PUT`/`DELETE`
//! `/v1/admin/destinations/{name}` (`DELETE` requires
//! `?pending=park|purge`), `POST …/{name}/pause`, `…/resume`,
//! `…/rotate-secret`, and `POST /v1/admin/destinations/sync`.
//!
//! Must never: decide anything itself — every rule is in
//! `crate::destinations::actions`, which the CLI reaches through here.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::OpsState;
use crate::destinations::actions::{self, ActionError, Pending, Spec};

/// The destination routes (the caller adds the token check).
pub fn routes() -> Router<OpsState> {
    Router::new()
        .route("/v1/admin/destinations", get(list).post(create))
        .route("/v1/admin/destinations/sync", post(sync))
        .route(
            "/v1/admin/destinations/{name}",
            get(show).put(put).delete(delete),
        )
        .route("/v1/admin/destinations/{name}/pause", post(pause))
        .route("/v1/admin/destinations/{name}/resume", post(resume))
        .route("/v1/admin/destinations/{name}/rotate-secret", post(rotate))
}

/// `e` as the admin API answers it (see [`super::refusal`]).
fn refused(e: ActionError) -> Response {
    let field = match &e {
        ActionError::Invalid { field, .. } => Some(field.as_str()),
        ActionError::Secret(e) => Some(e.field.as_str()),
        _ => None,
    };
    super::refusal(e.status(), &e.to_string(), field)
}

fn bad_body(field: String, message: String) -> Response {
    refused(ActionError::Invalid { field, message })
}

/// Parse `bytes` as `T`, naming the field at fault.
/// A request refused before any action ran.
type Refusal = Box<Response>;

fn parse<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, Refusal> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        Box::new(bad_body(
            if path == "." { "body".into() } else { path },
            e.inner().to_string(),
        ))
    })
}

fn json_body(bytes: &[u8]) -> Result<Value, Refusal> {
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| Box::new(bad_body("body".into(), format!("not JSON: {e}"))))
}

async fn list(State(state): State<OpsState>) -> Response {
    match actions::list(&state.destinations()).await {
        Ok(all) => Json(json!({ "destinations": all })).into_response(),
        Err(e) => refused(e),
    }
}

async fn show(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    match actions::show(&state.destinations(), &name).await {
        Ok(d) => Json(d).into_response(),
        Err(e) => refused(e),
    }
}

async fn create(State(state): State<OpsState>, body: Bytes) -> Response {
    let mut value = match json_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let name = match value.as_object_mut().and_then(|m| m.remove("name")) {
        Some(Value::String(n)) => n,
        Some(_) => return bad_body("name".into(), "must be a string".into()),
        None => return bad_body("name".into(), "is required".into()),
    };
    let spec: Spec = match parse(value) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    match actions::create(&state.destinations(), &name, spec).await {
        Ok(w) => (StatusCode::CREATED, Json(w)).into_response(),
        Err(e) => refused(e),
    }
}

async fn put(State(state): State<OpsState>, Path(name): Path<String>, body: Bytes) -> Response {
    let spec: Spec = match json_body(&body).and_then(parse) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    match actions::put(&state.destinations(), &name, spec).await {
        Ok(w) if w.created => (StatusCode::CREATED, Json(w)).into_response(),
        Ok(w) => Json(w).into_response(),
        Err(e) => refused(e),
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
            return bad_body(
                "pending".into(),
                format!(
                    "{}: say what happens to its deliveries not yet delivered — \
                     `?pending=park` keeps them waiting under its name, `?pending=purge` deletes them",
                    other.map_or("is required".to_string(), |o| format!("{o:?} is neither park nor purge"))
                ),
            )
        }
    };
    match actions::delete(&state.destinations(), &name, pending).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => refused(e),
    }
}

/// `POST /v1/admin/destinations/sync`: a platform list (see
/// `destinations::sync::parse`) the catch-all destinations are made to
/// match.
async fn sync(State(state): State<OpsState>, body: Bytes) -> Response {
    let req = match crate::destinations::sync::parse(&String::from_utf8_lossy(&body)) {
        Ok(r) => r,
        Err(e) => return bad_body("body".into(), e),
    };
    match crate::destinations::sync::sync(&state.destinations(), &req).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => refused(e),
    }
}

async fn pause(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    match actions::set_active(&state.destinations(), &name, false).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => refused(e),
    }
}

async fn resume(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    match actions::set_active(&state.destinations(), &name, true).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => refused(e),
    }
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

async fn rotate(State(state): State<OpsState>, Path(name): Path<String>, body: Bytes) -> Response {
    let req: RotateBody = match json_body(&body).and_then(parse) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    match actions::rotate(&state.destinations(), &name, req.secret, req.grace).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => refused(e),
    }
}
