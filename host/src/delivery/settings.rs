//! The settings of delivery, as `outboxd.toml` writes them: `[delivery]`
//! ([`DeliveryConfig`]) and the bound on its batches in flight
//! ([`MAX_BATCHES_IN_FLIGHT`]). `crate::config` gathers them with every
//! other room's settings.
//!
//! Must never: import `crate::config` (it imports these), or read the
//! environment.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Knobs of the delivery loop (one loop per sink).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DeliveryConfig {
    /// Lease taken on claimed deliveries. Must be comfortably longer than
    /// every sink's deadline: at least twice the deadline plus 5 s, checked
    /// at start. Default 70 s (twice the default 30 s deadline plus 10 s).
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Longest idle sleep between claims when no wake-up arrives. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub max_poll_interval: Duration,
    /// Timeout of each database call made by the loop. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub db_timeout: Duration,
    /// Delivered rows, and recorded failed attempts, older than this are
    /// deleted, in batches of 1,000. Default 7 days.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Batches in a row that end in a plugin trap before the sink is
    /// quarantined (paused with backoff). Default 5.
    pub quarantine_after_traps: u32,
    /// First quarantine pause; doubles on each quarantine in a row, up to
    /// 10 minutes. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub quarantine_backoff: Duration,
    /// A replica not heard from for this long no longer counts as serving
    /// its sinks (`/v1/admin/sinks`, `/ready`'s `fleet`,
    /// `outboxd_sink_serving_replicas`); replicas beat every 2 s. Default
    /// 30 s.
    #[serde(with = "humantime_serde")]
    pub replica_timeout: Duration,
    /// Batches one delivery key's loop keeps in flight at once, 1 to
    /// [`MAX_BATCHES_IN_FLIGHT`]: after a claim that came back full the
    /// next is claimed while the first is still being delivered, so the
    /// sink's network time overlaps the store's commits. Order per stream
    /// holds whatever the number: a stream's head is leased by one batch at
    /// a time, as between replicas. A destination with `max-in-flight` runs
    /// one batch at a time, so its cap holds. Default 2 (bench/README.md,
    /// stage 4: the webhook sink end to end against the no-op sink).
    pub batches_in_flight: u32,
}

/// The most batches a delivery key may keep in flight
/// ([`DeliveryConfig::batches_in_flight`]): each holds up to a batch of
/// leases and a plugin instance.
pub const MAX_BATCHES_IN_FLIGHT: u32 = 8;

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            lease: Duration::from_secs(70),
            max_poll_interval: Duration::from_secs(1),
            db_timeout: Duration::from_secs(10),
            retention: Duration::from_secs(7 * 24 * 3600),
            quarantine_after_traps: 5,
            quarantine_backoff: Duration::from_secs(30),
            replica_timeout: Duration::from_secs(30),
            batches_in_flight: 2,
        }
    }
}

impl DeliveryConfig {
    /// Check what types alone cannot. `Err((key, problem))` names the key
    /// under `delivery.`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, problem: String| Err((key.to_string(), problem));
        if self.max_poll_interval.is_zero() {
            return bad("max-poll-interval", "must be greater than 0s".into());
        }
        if self.db_timeout.is_zero() {
            return bad("db-timeout", "must be greater than 0s".into());
        }
        if !(1..=MAX_BATCHES_IN_FLIGHT).contains(&self.batches_in_flight) {
            return bad(
                "batches-in-flight",
                format!("must be from 1 to {MAX_BATCHES_IN_FLIGHT}"),
            );
        }
        Ok(())
    }
}
