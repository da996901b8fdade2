//! The HTTP face of the producer actions, under `/v1/admin/producers`:
//! `GET`/`POST /v1/admin/producers`, `POST …/{name}/revoke`,
//! `POST …/{name}/rotate` (`{"grace": "10m"}`, optional).
//!
//! Owns: reading each request into the action's input and the status of
//! its answer (`201` for a producer created).
//!
//! Must never: decide anything itself (`crate::ops::actions::producers`
//! does), or log a token.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use super::{answer, body, created, refused};
use crate::ops::actions::producers::{self, ProducerSpec};
use crate::ops::OpsState;

/// The producer routes (the caller adds the token check).
pub fn routes() -> Router<OpsState> {
    Router::new()
        .route("/v1/admin/producers", get(list).post(create))
        .route("/v1/admin/producers/{name}/revoke", post(revoke))
        .route("/v1/admin/producers/{name}/rotate", post(rotate))
}

async fn list(State(state): State<OpsState>) -> Response {
    answer(producers::list(&*state.store).await)
}

async fn create(State(state): State<OpsState>, bytes: Bytes) -> Response {
    let spec: ProducerSpec = match body(&bytes) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    match producers::create(&*state.store, &state.gate, spec).await {
        Ok(made) => created(made),
        Err(e) => refused(e),
    }
}

async fn revoke(State(state): State<OpsState>, Path(name): Path<String>) -> Response {
    answer(producers::revoke(&*state.store, &state.gate, &name).await)
}

/// Body of `POST …/{name}/rotate`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    /// How long the current token stays accepted (`"1h"`); default 0.
    #[serde(default, with = "humantime_serde")]
    grace: Option<Duration>,
}

async fn rotate(State(state): State<OpsState>, Path(name): Path<String>, bytes: Bytes) -> Response {
    let req: RotateBody = match body(&bytes) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let grace = req.grace.unwrap_or_default();
    answer(producers::rotate(&*state.store, &state.gate, &name, grace).await)
}
