//! Per-destination health: what its loop last saw, and disabling a
//! destination whose every attempt failed for too long.
//!
//! Owns: the [`Health`] record (last attempt, last status and error, last
//! success, failing since, events delivered and failed per minute over the
//! last [`MINUTES_KEPT`] minutes), kept in memory by each destination's loop
//! through [`Tracker`] and written to the store at most every
//! [`FLUSH_EVERY`] or when the status flips; the automatic disable after
//! `destinations.disable-after` of failures with no success (Svix's
//! rule: an endpoint failing for 5 days is disabled).
//!
//! Must never: dead-letter anything on disable — the deliveries wait — or
//! write to the store on the delivery path (writes are spawned).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{now_ms, Destination, State};
use crate::delivery::TurnObserver;
use crate::store::{PutMode, Store};

/// Longest time between two writes of a destination's health while its
/// status does not change.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// Minutes of delivered/failed counts a [`Health`] keeps: the last hour.
pub const MINUTES_KEPT: usize = 60;

/// Events one destination's batches delivered and failed in one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Minute {
    /// The minute's start, Unix ms (a multiple of 60,000).
    pub at_ms: i64,
    /// Events delivered.
    pub delivered: u64,
    /// Events failed: retried, dead, or untried behind a failure.
    pub failed: u64,
}

/// What a destination's loop last saw. Times are Unix ms.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// When it was last tried, Unix ms.
    pub last_attempt_at_ms: Option<i64>,
    /// `delivered` (at least one event of the last batch delivered) or
    /// `failed`.
    pub last_status: Option<String>,
    /// Why its last attempt failed.
    pub last_error: Option<String>,
    /// When it last delivered, Unix ms.
    pub last_success_at_ms: Option<i64>,
    /// Since when every attempt failed; `None` after a success.
    pub failing_since_ms: Option<i64>,
    /// Events delivered and failed per minute, oldest first, over the last
    /// [`MINUTES_KEPT`] minutes; a minute without a batch is absent. Kept
    /// by the replica that serves it (a second replica's tracker of the
    /// same destination writes its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub minutes: Vec<Minute>,
}

impl Health {
    /// Count a batch's `delivered` and `failed` events at `now_ms`, and
    /// forget minutes older than [`MINUTES_KEPT`].
    pub fn count(&mut self, now_ms: i64, delivered: usize, failed: usize) {
        let at_ms = now_ms - now_ms.rem_euclid(60_000);
        match self.minutes.last_mut() {
            Some(m) if m.at_ms == at_ms => {
                m.delivered += delivered as u64;
                m.failed += failed as u64;
            }
            _ => self.minutes.push(Minute {
                at_ms,
                delivered: delivered as u64,
                failed: failed as u64,
            }),
        }
        let oldest = at_ms - (MINUTES_KEPT as i64 - 1) * 60_000;
        self.minutes.retain(|m| m.at_ms >= oldest);
    }

    /// Delivered and failed per minute for the [`MINUTES_KEPT`] minutes up
    /// to `now_ms`, oldest first, zeros where nothing was counted.
    pub fn last_hour(&self, now_ms: i64) -> (Vec<f64>, Vec<f64>) {
        let current = now_ms - now_ms.rem_euclid(60_000);
        let mut delivered = vec![0.0; MINUTES_KEPT];
        let mut failed = vec![0.0; MINUTES_KEPT];
        for m in &self.minutes {
            let back = (current - m.at_ms) / 60_000;
            if (0..MINUTES_KEPT as i64).contains(&back) {
                let i = MINUTES_KEPT - 1 - back as usize;
                delivered[i] = m.delivered as f64;
                failed[i] = m.failed as f64;
            }
        }
        (delivered, failed)
    }
}

/// Asks the live destinations to be read again (`live::Live::poke`).
pub type Reread = Arc<dyn Fn() + Send + Sync>;

/// Follows one destination's batches ([`TurnObserver`]).
pub struct Tracker {
    name: String,
    store: Arc<dyn Store>,
    disable_after: Duration,
    /// Called after a disable, to read the destinations again so the loop
    /// holds at once rather than at the next refresh.
    reread: Reread,
    inner: Mutex<Inner>,
}

struct Inner {
    health: Health,
    flushed: Option<Instant>,
    /// A disable is under way (written once, not on every failing batch).
    disabling: bool,
}

impl Tracker {
    /// Start from `health` as stored (so a restart does not reset how long
    /// a destination has been failing).
    pub fn new(
        name: &str,
        store: Arc<dyn Store>,
        health: Health,
        disable_after: Duration,
        reread: Reread,
    ) -> Arc<Tracker> {
        Arc::new(Tracker {
            name: name.to_string(),
            store,
            disable_after,
            reread,
            inner: Mutex::new(Inner {
                health,
                flushed: None,
                disabling: false,
            }),
        })
    }

    fn flush(&self, health: Health) {
        let (store, name) = (self.store.clone(), self.name.clone());
        tokio::spawn(async move {
            let Ok(json) = serde_json::to_string(&health) else {
                return;
            };
            if let Err(e) = store.save_destination_health(&name, &json).await {
                tracing::warn!(destination = %name, "saving destination health: {e}");
            }
        });
    }

    fn disable(&self, since_ms: i64) {
        let (store, name) = (self.store.clone(), self.name.clone());
        let after = self.disable_after;
        let reread = self.reread.clone();
        tokio::spawn(async move {
            match disable(&*store, &name, since_ms, after).await {
                Ok(true) => {
                    reread();
                    tracing::error!(
                    destination = %name, failing_for = ?after,
                    "destination disabled: every attempt failed; its deliveries wait until it is resumed"
                    )
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(destination = %name, "disabling destination: {e}"),
            }
        });
    }
}

/// Set destination `name` disabled unless an operator changed it
/// meanwhile. Returns whether it did.
async fn disable(
    store: &dyn Store,
    name: &str,
    since_ms: i64,
    after: Duration,
) -> Result<bool, crate::store::StoreError> {
    let rows = store.destinations().await?;
    let Some(row) = rows.into_iter().find(|r| r.name == name) else {
        return Ok(false);
    };
    let Ok(mut d) = serde_json::from_str::<Destination>(&row.record) else {
        return Ok(false);
    };
    if d.state != State::Active {
        return Ok(false);
    }
    d.state = State::Disabled;
    d.state_reason = Some(format!(
        "every attempt failed for {} (since {}); resume it when the target is fixed",
        humantime::format_duration(after),
        crate::rfc3339::format_ms(since_ms),
    ));
    let record = serde_json::to_string(&d).unwrap_or_default();
    Ok(store
        .put_destination(name, &d.sink, &record, PutMode::Revision(row.revision))
        .await?
        .is_some())
}

impl TurnObserver for Tracker {
    fn turn(&self, delivered: usize, failed: usize, last_error: Option<&str>) {
        let now = now_ms();
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *guard;
        let h = &mut inner.health;
        let status = if delivered > 0 { "delivered" } else { "failed" };
        let flipped = h.last_status.as_deref() != Some(status);
        h.last_attempt_at_ms = Some(now);
        h.last_status = Some(status.to_string());
        h.count(now, delivered, failed);
        if delivered > 0 {
            h.last_success_at_ms = Some(now);
            h.failing_since_ms = None;
            inner.disabling = false;
        } else if failed > 0 {
            h.failing_since_ms.get_or_insert(now);
        }
        if let Some(e) = last_error {
            h.last_error = Some(e.to_string());
        }
        let due = inner.flushed.is_none_or(|t| t.elapsed() >= FLUSH_EVERY);
        let failing_since = h.failing_since_ms;
        let health = h.clone();
        if flipped || due {
            inner.flushed = Some(Instant::now());
            self.flush(health);
        }
        if let Some(since) = failing_since {
            if now - since >= self.disable_after.as_millis() as i64 && !inner.disabling {
                inner.disabling = true;
                self.disable(since);
            }
        }
    }
}

#[cfg(test)]
mod minutes {
    use super::*;

    #[test]
    fn batches_add_up_per_minute_and_an_hour_is_kept() {
        let mut h = Health::default();
        let t0: i64 = 1_800_000_000_000; // a whole minute
        h.count(t0 + 1_000, 3, 0);
        h.count(t0 + 59_000, 1, 2);
        h.count(t0 + 60_000, 0, 5);
        assert_eq!(
            h.minutes,
            [
                Minute {
                    at_ms: t0,
                    delivered: 4,
                    failed: 2
                },
                Minute {
                    at_ms: t0 + 60_000,
                    delivered: 0,
                    failed: 5
                },
            ]
        );
        let (delivered, failed) = h.last_hour(t0 + 61_000);
        assert_eq!(delivered.len(), MINUTES_KEPT);
        assert_eq!(&delivered[MINUTES_KEPT - 2..], [4.0, 0.0]);
        assert_eq!(&failed[MINUTES_KEPT - 2..], [2.0, 5.0]);
        h.count(t0 + 60 * 60_000, 1, 0);
        assert_eq!(
            h.minutes.first().unwrap().at_ms,
            t0 + 60_000,
            "the 61st minute back is dropped"
        );
    }
}
