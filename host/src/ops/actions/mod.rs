//! The admin actions: every operation an operator runs on a daemon —
//! events ([`events`]), streams' heads ([`streams`]), failed attempts
//! ([`attempts`]), dead letters ([`dead`]), sinks and backfill
//! ([`sinks`]), sources ([`sources`]), destinations ([`destinations`],
//! platform [`sync`]), producers ([`producers`]) and secrets at rest
//! ([`secrets`]). The HTTP admin API (`super::admin`, under `/v1/admin/`)
//! is a thin face over them; the CLI reaches them through that API, or
//! calls the ones that need only the database itself with `--offline`.
//!
//! Owns: each action's rules, its input and answer types (every answer a
//! typed, serialisable struct: the HTTP face writes it as the body, the
//! CLI reads it back), and the one error type of them all
//! ([`AdminError`], whose [`AdminError::status`] is the HTTP status and
//! whose [`AdminError::field`] names the bad input).
//!
//! Must never: print, or know HTTP beyond the status an error maps to;
//! change anything beyond what the action's name says; answer with a
//! secret except where an action says it shows one once.

pub mod attempts;
pub mod dead;
pub mod destinations;
pub mod events;
pub mod producers;
pub mod secrets;
pub mod sinks;
pub mod sources;
pub mod streams;
pub mod sync;

use crate::destinations::sealing::SealingError;
pub use crate::limits::{DEAD_LIST_DEFAULT, DEAD_PAGE_MAX};
use crate::secrets::{SealError, SecretsError};
use crate::store::StoreError;

/// Why an admin action did nothing.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Bad input (HTTP 400), naming the field or flag.
    #[error("{field}: {message}")]
    Invalid {
        /// The field or flag, as the user wrote it (`config.url`,
        /// `--since`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// What the action names does not exist (HTTP 404); the message says
    /// what was looked for.
    #[error("{0}")]
    NotFound(String),
    /// What the action would create exists already, or changed while it
    /// ran (HTTP 409); the message says what.
    #[error("{0}")]
    Conflict(String),
    /// A secret that cannot be sealed (no key configured: HTTP 400,
    /// naming the setting; nothing written) or opened (a key missing from
    /// the keyring: HTTP 503).
    #[error("{}", secret_message(.0))]
    Secret(SealingError),
    /// The keyring cannot do what was asked (HTTP 409): no key configured,
    /// `generate` with keys that do not come from a file of the daemon's,
    /// a key file that no longer parses (naming the line).
    #[error(transparent)]
    Keys(#[from] SecretsError),
    /// The database failed (HTTP 503).
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// What an operator reads when a secret cannot be sealed or opened.
fn secret_message(e: &SealingError) -> String {
    match &e.source {
        SealError::NoKey => format!(
            "outboxd stores secrets only sealed, and no secrets key is configured: set {} or {} on the daemon (or give no secret); nothing was stored",
            crate::secrets::KEY_FILE_SETTING,
            crate::secrets::KEY_SETTING,
        ),
        SealError::UnknownKey { key_id } => format!(
            "{e}: add key {key_id:?} to the daemon's keyring (the key file, or secrets.key) and try again"
        ),
        _ => e.to_string(),
    }
}

impl AdminError {
    /// The HTTP status it answers with.
    pub fn status(&self) -> u16 {
        match self {
            AdminError::Invalid { .. } => 400,
            AdminError::NotFound(_) => 404,
            AdminError::Conflict(_) | AdminError::Keys(_) => 409,
            AdminError::Secret(e) if e.source == SealError::NoKey => 400,
            AdminError::Secret(_) | AdminError::Store(_) => 503,
        }
    }

    /// The input at fault, when there is one (the answer's `field`).
    pub fn field(&self) -> Option<&str> {
        match self {
            AdminError::Invalid { field, .. } => Some(field),
            AdminError::Secret(e) => Some(&e.field),
            _ => None,
        }
    }
}

/// [`AdminError::Invalid`] naming `field`.
pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> AdminError {
    AdminError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// `text` as an RFC 3339 time, in Unix milliseconds.
///
/// Errors: [`AdminError::Invalid`] naming `field` (a flag such as
/// `--since`, or a JSON field) and the text given.
pub fn parse_time(field: &str, text: &str) -> Result<i64, AdminError> {
    crate::rfc3339::parse_ms(text).map_err(|message| invalid(field, message))
}

/// `names` joined for an error message, `none` when there are none.
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}
