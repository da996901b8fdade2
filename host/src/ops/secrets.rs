//! The secrets-at-rest admin actions and their HTTP shape, under
//! `/v1/admin/secrets` (behind the admin token, see [`super::admin`]):
//! `GET /v1/admin/secrets` (which key seals, which keys the keyring holds,
//! how many stored values are under each key id and how many are plain)
//! and `POST /v1/admin/secrets/rotate-key` (`{"generate": bool}`), which
//! `outboxd secrets rotate-key [--generate]` calls.
//!
//! Owns: the order of a key rotation — reload the keyring (with
//! `generate`, first append a fresh key to the daemon's key file as the
//! new current key), re-seal every stored secret under the current key
//! (`destinations::sealing::reseal_all`: revision-checked, a record changed
//! meanwhile resealed again), have the delivery loops rebuild from the
//! resealed records, and count what is left under each key. Values under
//! an old key open as long as that key stays in the keyring, so no
//! delivery fails while this runs.
//!
//! Must never: answer with a key or a secret; drop a key from the ring.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::OpsState;
use crate::destinations::sealing::{self, Census, FailedRecord};
use crate::secrets::SecretsError;
use crate::store::StoreError;

/// The secrets routes (the caller adds the token check).
pub fn routes() -> Router<OpsState> {
    Router::new()
        .route("/v1/admin/secrets", get(status))
        .route("/v1/admin/secrets/rotate-key", post(rotate))
}

/// Why a rotation did nothing.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// No key configured, or `generate` with keys that do not come from a
    /// file of the daemon's (HTTP 409, naming the setting); a key file
    /// that no longer parses (HTTP 409, naming the line).
    #[error(transparent)]
    Keys(#[from] SecretsError),
    /// HTTP 503.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the keys stand: `GET /v1/admin/secrets`, and the end of a
/// rotation's answer.
#[derive(Debug, Serialize)]
pub struct KeyStatus {
    /// The key id that seals now; `None` without a key.
    pub key_id: Option<String>,
    /// The key ids the keyring holds, in the file's order (the last is
    /// current).
    pub key_ids: Vec<String>,
    /// Where the keys come from: the key file's path, `secrets.key`, or
    /// `none`.
    pub key_source: String,
    /// Stored secret values by the key id they are sealed under, and plain.
    #[serde(flatten)]
    pub stored: Census,
}

/// What `rotate-key` did.
#[derive(Debug, Serialize)]
pub struct Rotated {
    /// The key everything is sealed under now.
    pub key_id: Option<String>,
    /// The key generated into the key file (with `generate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated: Option<String>,
    /// Values sealed afresh under it.
    pub resealed: u64,
    /// Values already under it.
    pub already_current: u64,
    /// Destinations that could not be resealed, with why.
    pub failed: Vec<FailedRecord>,
    /// The keys after: a key may leave the key file once its count here is
    /// 0 (and every replica has run with the new key).
    pub after: KeyStatus,
}

/// The state of the keys and of the stored secrets.
pub async fn key_status(state: &OpsState) -> Result<KeyStatus, StoreError> {
    let secrets = state.live.secrets();
    let ring = secrets.ring();
    Ok(KeyStatus {
        key_id: ring.current().map(str::to_string),
        key_ids: ring.key_ids().to_vec(),
        key_source: secrets.source(),
        stored: sealing::census(&*state.store).await?,
    })
}

/// Reload the keyring (with `generate`, after appending a fresh key to
/// the key file), re-seal every stored secret under the current key, and
/// have the delivery loops rebuild from the resealed records.
pub async fn rotate_key(state: &OpsState, generate: bool) -> Result<Rotated, RotateError> {
    let secrets = state.live.secrets();
    let generated = if generate {
        Some(secrets.generate_key()?)
    } else {
        secrets.reload()?;
        None
    };
    if !secrets.has_key() {
        return Err(SecretsError::NoKey.into());
    }
    let done = sealing::reseal_all(&*state.store, secrets, true).await?;
    state.live.refresh().await?;
    tracing::info!(
        key_id = ?done.key_id,
        resealed = done.resealed,
        already_current = done.already_current,
        failed = done.failed.len(),
        "secrets resealed under the current key"
    );
    Ok(Rotated {
        key_id: done.key_id,
        generated,
        resealed: done.resealed,
        already_current: done.already_current,
        failed: done.failed,
        after: key_status(state).await?,
    })
}

/// Body of `POST /v1/admin/secrets/rotate-key` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    /// Append a generated key to the daemon's key file first.
    #[serde(default)]
    generate: bool,
}

async fn status(State(state): State<OpsState>) -> Response {
    match key_status(&state).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => super::refusal(503, &e.to_string(), None),
    }
}

async fn rotate(State(state): State<OpsState>, body: Bytes) -> Response {
    let req: RotateBody = if body.is_empty() {
        RotateBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return super::refusal(400, &format!("not a rotate-key body: {e}"), Some("body"))
            }
        }
    };
    match rotate_key(&state, req.generate).await {
        Ok(r) => Json(r).into_response(),
        Err(RotateError::Keys(e)) => super::refusal(409, &e.to_string(), None),
        Err(RotateError::Store(e)) => super::refusal(503, &e.to_string(), None),
    }
}
