//! Heartbeats of the delivery loops, read by `/health`, `/ready` and
//! `/metrics`.
//!
//! Owns: per sink, when its loop last finished a turn, when a turn last
//! succeeded, and how many failed in a row; and, apart from the turns, why
//! its batches keep failing at the target (every event of the last batch
//! retried or rejected — a refused secret, a receiver down), so `/ready`
//! shows the reason while the loop itself is healthy. A loop that is stuck stops
//! beating; a loop whose every claim fails beats but never succeeds — the
//! probes tell the two apart.
//!
//! Must never: be used as a "running" latch: nothing here gates the loop.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed turns in a row after which a loop counts as failing (about 1.5 s
/// of retrying with the loop's backoff of 0.2 s, 0.4 s, 0.8 s).
pub const FAILING_AFTER: u32 = 3;

/// One loop's beat.
#[derive(Debug, Clone, Copy)]
pub struct Beat {
    /// When the loop was registered.
    pub started: Instant,
    /// When it last finished a turn.
    pub last_turn: Option<Instant>,
    /// When a turn last succeeded.
    pub last_success: Option<Instant>,
    /// Turns failed in a row.
    pub consecutive_failures: u32,
    /// A turn longer than this (since the last beat) means the loop is stuck.
    pub stale_after: Duration,
}

impl Beat {
    /// Time since the last finished turn (or since start, before any).
    pub fn age(&self) -> Duration {
        self.last_turn.unwrap_or(self.started).elapsed()
    }

    /// The loop finished a turn recently.
    pub fn fresh(&self) -> bool {
        self.age() <= self.stale_after
    }

    /// The loop succeeded recently and is not failing now: a loop whose
    /// every turn fails is not succeeding, even while it keeps turning.
    pub fn succeeding(&self) -> bool {
        self.consecutive_failures < FAILING_AFTER
            && self.last_success.unwrap_or(self.started).elapsed() <= self.stale_after
    }
}

/// Every loop's beat, by sink.
#[derive(Debug, Default)]
pub struct Heartbeats {
    beats: Mutex<BTreeMap<String, Beat>>,
    failing: Mutex<BTreeMap<String, Failing>>,
}

/// A sink whose batches deliver nothing: since when, and the last reason.
#[derive(Debug, Clone)]
pub struct Failing {
    /// Since when.
    pub since: Instant,
    /// Why.
    pub reason: String,
}

impl Heartbeats {
    /// Start tracking `sink`.
    pub fn register(&self, sink: &str, stale_after: Duration) {
        self.beats.lock().unwrap().insert(
            sink.to_string(),
            Beat {
                started: Instant::now(),
                last_turn: None,
                last_success: None,
                consecutive_failures: 0,
                stale_after,
            },
        );
    }

    /// Record a finished turn.
    pub fn turn(&self, sink: &str, ok: bool) -> u32 {
        let mut beats = self.beats.lock().unwrap();
        let Some(beat) = beats.get_mut(sink) else {
            return 0;
        };
        let now = Instant::now();
        beat.last_turn = Some(now);
        if ok {
            beat.last_success = Some(now);
            beat.consecutive_failures = 0;
        } else {
            beat.consecutive_failures += 1;
        }
        beat.consecutive_failures
    }

    /// Record what a batch of `sink` achieved: any delivered event clears
    /// its failing state; a batch with none sets it, with `reason`.
    pub fn outcome(&self, sink: &str, delivered: usize, reason: Option<&str>) {
        let mut failing = self.failing.lock().unwrap();
        match (delivered, reason) {
            (0, Some(reason)) => {
                let entry = failing.entry(sink.to_string()).or_insert_with(|| Failing {
                    since: Instant::now(),
                    reason: String::new(),
                });
                entry.reason = reason.to_string();
            }
            _ => {
                failing.remove(sink);
            }
        }
    }

    /// The sinks whose last batch delivered nothing, with why.
    pub fn failing(&self) -> BTreeMap<String, Failing> {
        self.failing.lock().unwrap().clone()
    }

    /// A copy of every beat.
    pub fn snapshot(&self) -> BTreeMap<String, Beat> {
        self.beats.lock().unwrap().clone()
    }
}
