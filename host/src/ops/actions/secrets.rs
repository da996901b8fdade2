//! The secrets-at-rest actions: the keys' status (`GET
//! /v1/admin/secrets`, `outboxd secrets status`: which key seals, which
//! keys the keyring holds, how many stored values are under each key id
//! and how many are plain) and a key rotation (`POST
//! /v1/admin/secrets/rotate-key`, `outboxd secrets rotate-key
//! [--generate]`).
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

use serde::{Deserialize, Serialize};

use super::AdminError;
use crate::destinations::live::Live;
use crate::destinations::sealing::{self, Census, FailedRecord};
use crate::secrets::SecretsError;
use crate::store::Store;

/// Where the keys stand: `GET /v1/admin/secrets`, and the end of a
/// rotation's answer.
#[derive(Debug, Serialize, Deserialize)]
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
#[derive(Debug, Serialize, Deserialize)]
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
pub async fn key_status(store: &dyn Store, live: &Live) -> Result<KeyStatus, AdminError> {
    let secrets = live.secrets();
    let ring = secrets.ring();
    Ok(KeyStatus {
        key_id: ring.current().map(str::to_string),
        key_ids: ring.key_ids().to_vec(),
        key_source: secrets.source(),
        stored: sealing::census(store).await?,
    })
}

/// Reload the keyring (with `generate`, after appending a fresh key to
/// the key file), re-seal every stored secret under the current key, and
/// have the delivery loops rebuild from the resealed records.
///
/// Errors: [`AdminError::Keys`] when there is no key, or `generate` finds
/// no key file of the daemon's; the store failed.
pub async fn rotate_key(
    store: &dyn Store,
    live: &Live,
    generate: bool,
) -> Result<Rotated, AdminError> {
    let secrets = live.secrets();
    let generated = if generate {
        Some(secrets.generate_key()?)
    } else {
        secrets.reload()?;
        None
    };
    if !secrets.has_key() {
        return Err(SecretsError::NoKey.into());
    }
    let done = sealing::reseal_all(store, secrets, true).await?;
    live.refresh().await?;
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
        after: key_status(store, live).await?,
    })
}

/// What `POST /v1/admin/secrets/rotate-key` is given (the body is
/// optional).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateKey {
    /// Append a generated key to the daemon's key file first.
    #[serde(default)]
    pub generate: bool,
}
