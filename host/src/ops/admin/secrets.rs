//! The HTTP face of the secrets-at-rest actions: `GET /v1/admin/secrets`
//! and `POST /v1/admin/secrets/rotate-key` (`{"generate": bool}`,
//! optional).
//!
//! Owns: reading the request into the action's input.
//!
//! Must never: answer with a key or a secret (the actions show none).

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use super::{answer, body};
use crate::ops::actions::secrets::{self, RotateKey};
use crate::ops::OpsState;

/// The secrets routes (the caller adds the token check).
pub fn routes() -> Router<OpsState> {
    Router::new()
        .route("/v1/admin/secrets", get(status))
        .route("/v1/admin/secrets/rotate-key", post(rotate))
}

async fn status(State(state): State<OpsState>) -> Response {
    answer(secrets::key_status(&*state.store, &state.live).await)
}

async fn rotate(State(state): State<OpsState>, bytes: Bytes) -> Response {
    let req: RotateKey = match body(&bytes) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    answer(secrets::rotate_key(&*state.store, &state.live, req.generate).await)
}
