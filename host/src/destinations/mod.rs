//! Destinations: the configured targets of a sink, kept in the store and
//! managed while running.
//!
//! A plugin is the code that talks to a kind of target; a destination is
//! one configured target of it — its own configuration (merged over the
//! manifest's `[config]`), filters, signing secret, retry override, rate
//! limit, in-flight cap and state. A destination's name is its **delivery
//! key**: its deliveries, heads, attempts, retry windows and dead letters
//! are stored under it, so order is per (destination, stream) and one
//! destination never holds back another. A sink with no destinations is
//! served as one destination named after the sink, as before.
//!
//! Owns: what is done with a stored [`Destination`] — its redacted form
//! (here) and the configuration its plugin gets, its secrets sealed at
//! rest ([`sealing`]); the live [`Snapshot`] every replica routes by, read
//! and refreshed ([`live`]); the admin actions ([`actions`]);
//! per-destination health and automatic disable ([`health`]); secrets
//! ([`secret`]); platform sync ([`sync`]); its settings ([`settings`]).
//! The record itself, its [`Filter`] and the [`Snapshot`] type are
//! routing's (`crate::routing`), which ingest routes by without importing
//! this room.
//!
//! Must never: print a secret (records are redacted by [`Destination::redacted`]
//! before they leave through the API or a log), drop deliveries of a
//! destination that is paused, disabled or deleted without `purge`.

pub mod actions;
pub mod health;
pub mod live;
pub mod sealing;
pub mod secret;
pub mod settings;
pub mod sync;

// The routing model, named here too for this room's files (`super::State`).
pub use crate::routing::{Destination, Filter, RetryOverride, Snapshot, State};

/// Longest destination name, bytes.
pub const MAX_NAME_BYTES: usize = 128;

impl Destination {
    /// The record with every secret replaced by whether it is set, and
    /// every credential `config` value (sealed or not) by `"***"` (a plain
    /// URL with a password keeps its other parts) — the only form that
    /// leaves the process (API answers, logs).
    pub fn redacted(&self) -> serde_json::Value {
        let mut shown = self.clone();
        for (key, value) in shown.config.iter_mut() {
            // `is_credential(key, "")`: by the key's name alone.
            *value = if crate::secrets::is_sealed(value) || crate::secrets::is_credential(key, "") {
                "***".into()
            } else {
                crate::redact::redact_url(value)
            };
        }
        let mut value = serde_json::to_value(&shown).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.remove("secret");
            map.remove("previous_secret");
            map.insert("has_secret".into(), self.secret.is_some().into());
            if self.previous_secret.is_none() {
                map.remove("previous_until_ms");
            }
        }
        value
    }
}

/// Unix milliseconds now, by this process's clock.
pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}
