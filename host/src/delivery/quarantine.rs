//! Quarantine: pausing a sink whose plugin fails batch after batch.
//!
//! Owns: counting the batches of one sink that ended as a whole in a failure
//! of the plugin (a trap, or `init` refusing), per batch attempted — a turn
//! that claimed nothing neither counts nor resets; a batch that got its
//! outcomes resets — deciding when that count reaches
//! `delivery.quarantine-after-traps`, the quarantine's length (the
//! configured backoff, doubling with every quarantine in a row, at most
//! [`MAX_QUARANTINE`]), and the state every sink's quarantine is in, for
//! `/ready` and the admin API.
//!
//! Must never: drop, dead-letter or re-route a delivery — a quarantined sink
//! only stops claiming; its deliveries wait.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::backoff::Backoff;

/// Longest one quarantine lasts.
pub const MAX_QUARANTINE: Duration = Duration::from_secs(600);

/// What a sink's quarantine looks like from outside.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantineState {
    /// When the quarantine started, Unix ms.
    pub since_ms: i64,
    /// When the sink claims again, Unix ms.
    pub until_ms: i64,
    /// The same, RFC 3339.
    pub until: String,
    /// The failure of the batch that tipped it (`plugin trap: panic`).
    pub reason: String,
    /// Failed batches in a row that led to it.
    pub failed_batches: u32,
    /// Quarantines in a row, this one included (the length doubles with each).
    pub in_a_row: u32,
}

/// The quarantine state of every sink of this process.
#[derive(Default)]
pub struct Quarantines {
    sinks: Mutex<BTreeMap<String, QuarantineState>>,
}

impl Quarantines {
    /// Sinks in quarantine now, by name.
    pub fn current(&self) -> BTreeMap<String, QuarantineState> {
        let now = unix_ms(SystemTime::now());
        self.sinks
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, q)| q.until_ms > now)
            .map(|(s, q)| (s.clone(), q.clone()))
            .collect()
    }

    fn set(&self, sink: &str, state: QuarantineState) {
        self.sinks.lock().unwrap().insert(sink.to_string(), state);
    }

    fn clear(&self, sink: &str) {
        self.sinks.lock().unwrap().remove(sink);
    }
}

/// One sink loop's count of failed batches.
#[derive(Debug, Default)]
pub struct TrapCounter {
    failed_in_a_row: u32,
    quarantines_in_a_row: u32,
}

impl TrapCounter {
    /// Start over (a new plugin version serves the sink).
    pub fn reset(&mut self, quarantines: &Quarantines, sink: &str) {
        *self = TrapCounter::default();
        quarantines.clear(sink);
    }

    /// A batch got one outcome per event: the plugin works again.
    pub fn answered(&mut self, quarantines: &Quarantines, sink: &str) {
        self.failed_in_a_row = 0;
        self.quarantines_in_a_row = 0;
        quarantines.clear(sink);
    }

    /// A batch failed as a whole with `reason`. Returns how long to
    /// quarantine the sink when this failure reaches `after` in a row.
    pub fn failed(
        &mut self,
        quarantines: &Quarantines,
        sink: &str,
        reason: &str,
        after: u32,
        backoff: Duration,
    ) -> Option<Duration> {
        self.failed_in_a_row += 1;
        if self.failed_in_a_row < after.max(1) {
            return None;
        }
        let pause = Backoff::doubling(backoff, MAX_QUARANTINE).delay(self.quarantines_in_a_row);
        self.quarantines_in_a_row += 1;
        let now = SystemTime::now();
        quarantines.set(
            sink,
            QuarantineState {
                since_ms: unix_ms(now),
                until_ms: unix_ms(now + pause),
                until: crate::rfc3339::format_ms(unix_ms(now + pause)),
                reason: reason.to_string(),
                failed_batches: self.failed_in_a_row,
                in_a_row: self.quarantines_in_a_row,
            },
        );
        self.failed_in_a_row = 0;
        Some(pause)
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_after_n_failed_batches_doubling_and_capped() {
        let q = Quarantines::default();
        let mut c = TrapCounter::default();
        let b = Duration::from_secs(30);
        assert_eq!(c.failed(&q, "s", "plugin trap: panic", 3, b), None);
        assert_eq!(c.failed(&q, "s", "plugin trap: panic", 3, b), None);
        assert_eq!(c.failed(&q, "s", "plugin trap: panic", 3, b), Some(b));
        let state = &q.current()["s"];
        assert_eq!(state.reason, "plugin trap: panic");
        assert_eq!((state.failed_batches, state.in_a_row), (3, 1));
        for _ in 0..2 {
            c.failed(&q, "s", "x", 3, b);
        }
        assert_eq!(c.failed(&q, "s", "x", 3, b), Some(b * 2));
        for _ in 0..30 {
            c.failed(&q, "s", "x", 1, b);
        }
        assert_eq!(c.failed(&q, "s", "x", 1, b), Some(MAX_QUARANTINE));
        c.answered(&q, "s");
        assert!(q.current().is_empty());
        assert_eq!(c.failed(&q, "s", "x", 1, b), Some(b));
    }
}
