//! The settings of destinations, as `outboxd.toml` writes them:
//! `[destinations]` ([`DestinationsConfig`]) and `[destinations.sync]`
//! ([`SyncConfig`]). `crate::config` gathers them with every other room's
//! settings.
//!
//! Must never: import `crate::config` (it imports these), or read the
//! environment.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Knobs of destinations (`[destinations]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DestinationsConfig {
    /// How often each process reads the destinations again, so a change
    /// made through another replica (or the database) takes effect here.
    /// Changes made through this process apply at once. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// A destination whose every attempt failed for this long, with no
    /// success, is disabled (its deliveries wait; `resume` re-enables it).
    /// Default 5 days, as Svix disables a failing endpoint.
    #[serde(with = "humantime_serde")]
    pub disable_after: Duration,
    /// How long a destination's loop sleeps when the destination has
    /// nothing pending at all. It is woken at once by an ingest, a replay
    /// or a backfill that queues work for it (in every replica, through
    /// PostgreSQL `NOTIFY`), so this only bounds how late work queued
    /// without a wake-up (a dead-letter replay by the CLI on SQLite) is
    /// noticed; idle destinations then cost one claim per interval each.
    /// Default 10 s.
    #[serde(with = "humantime_serde")]
    pub idle_poll_interval: Duration,
    /// A platform list to keep the catch-all destinations in step with
    /// (`outboxd destinations sync`), read again every `every`. Default
    /// none.
    pub sync: Option<SyncConfig>,
}

/// `[destinations.sync]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SyncConfig {
    /// The platform list (JSON, as `outboxd destinations sync --from`).
    pub from: PathBuf,
    /// How often. Default 5 min.
    #[serde(with = "humantime_serde", default = "SyncConfig::default_every")]
    pub every: Duration,
}

impl SyncConfig {
    fn default_every() -> Duration {
        Duration::from_secs(300)
    }
}

impl Default for DestinationsConfig {
    fn default() -> Self {
        DestinationsConfig {
            refresh_interval: Duration::from_secs(1),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            idle_poll_interval: Duration::from_secs(10),
            sync: None,
        }
    }
}
