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
//! and refreshed ([`live`]); per-destination health and automatic disable
//! ([`health`]); secrets ([`secret`]); its settings ([`settings`]). The
//! admin actions on destinations (create, change, pause, rotate, delete,
//! platform sync) are `crate::ops::actions`'.
//! The record itself, its [`Filter`] and the [`Snapshot`] type are
//! routing's (`crate::routing`), which ingest routes by without importing
//! this room.
//!
//! Must never: print a secret (records are redacted by [`Destination::redacted`]
//! before they leave through the API or a log), drop deliveries of a
//! destination that is paused, disabled or deleted without `purge`.

pub mod health;
pub mod live;
pub mod sealing;
pub mod secret;
pub mod settings;

// The routing model, named here too for this room's files (`super::State`).
pub use crate::routing::{Destination, Filter, RetryOverride, Snapshot, State};

/// Longest destination name, bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// A destination as it leaves the process (API answers, logs): the
/// record with every secret replaced by whether it is set, and every
/// credential `config` value (sealed or not) by `"***"` (a plain URL with
/// a password keeps its other parts). Made by [`Destination::redacted`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DestinationView {
    /// Unique; also its delivery key.
    pub name: String,
    /// The plugin (manifest `name`) that serves it.
    pub sink: String,
    /// Its configuration, credentials shown as `***`.
    pub config: std::collections::BTreeMap<String, String>,
    /// Which events it takes.
    pub filter: Filter,
    /// A retry policy within the manifest's bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryOverride>,
    /// Events per second handed to the plugin, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Events in one batch, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Active, paused or disabled.
    pub state: State,
    /// Why it is paused or disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
    /// A signing secret is set.
    pub has_secret: bool,
    /// Until when (Unix ms) the previous secret still signs too; only
    /// while there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_until_ms: Option<i64>,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Who keeps it (`sync`), when not an operator by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
}

impl Destination {
    /// The record as it may leave the process ([`DestinationView`]).
    pub fn redacted(&self) -> DestinationView {
        let config = self
            .config
            .iter()
            .map(|(key, value)| {
                // `is_credential(key, "")`: by the key's name alone.
                let shown =
                    if crate::secrets::is_sealed(value) || crate::secrets::is_credential(key, "") {
                        "***".into()
                    } else {
                        crate::redact::redact_url(value)
                    };
                (key.clone(), shown)
            })
            .collect();
        DestinationView {
            name: self.name.clone(),
            sink: self.sink.clone(),
            config,
            filter: self.filter.clone(),
            retry: self.retry.clone(),
            rate_per_second: self.rate_per_second,
            max_in_flight: self.max_in_flight,
            state: self.state,
            state_reason: self.state_reason.clone(),
            has_secret: self.secret.is_some(),
            previous_until_ms: self
                .previous_until_ms
                .filter(|_| self.previous_secret.is_some()),
            created_at_ms: self.created_at_ms,
            managed_by: self.managed_by.clone(),
        }
    }
}

/// Unix milliseconds now, by this process's clock.
pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}
