//! How much one plugin may write to the host's log.
//!
//! Owns: a per-plugin pair of token buckets (the `governor` crate), one for
//! lines and one for bytes, shared by every batch of the plugin (a new
//! version gets its own), and the summary of what they dropped: at most one
//! summary line per [`SUMMARY_EVERY`], written when the plugin next logs or
//! a batch ends, saying how many lines and bytes were dropped since the
//! last one.
//!
//! Must never: block a guest (a line over the limit is dropped, never
//! waited for), or write a guest's text itself (`runtime` does, after
//! `guest_text::clean`).

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Instant;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Lines per second one plugin may log, on average.
pub const LINES_PER_SECOND: u32 = 100;
/// Lines one plugin may log at once after a quiet spell.
pub const LINES_BURST: u32 = 1_000;
/// Bytes per second one plugin may log, on average (messages after
/// `guest_text::clean`).
pub const BYTES_PER_SECOND: u32 = 64 << 10;
/// Bytes one plugin may log at once after a quiet spell.
pub const BYTES_BURST: u32 = 256 << 10;
/// Least time between two summaries of dropped lines.
pub use crate::limits::LOG_SUMMARY_EVERY as SUMMARY_EVERY;

/// The tracing target of a plugin's log lines and of their drop
/// summaries: `outboxd::plugin::runtime`, the name operators give
/// `RUST_LOG` (docs/plugins.md) and `outboxd plugin run --log-level` sets.
pub const PLUGIN_LOG_TARGET: &str = "outboxd::plugin::runtime";

/// Write the summary of `plugin`'s dropped log lines, when one is due
/// ([`LogLimit::summary_due`]).
pub fn log_dropped(plugin: &str, limit: &LogLimit) {
    if let Some(d) = limit.summary_due() {
        tracing::warn!(
            target: PLUGIN_LOG_TARGET,
            plugin,
            dropped_lines = d.lines,
            dropped_bytes = d.bytes,
            "plugin log over its rate ({LINES_PER_SECOND} lines/s, {BYTES_PER_SECOND} bytes/s): {} lines ({} bytes) dropped",
            d.lines,
            d.bytes
        );
    }
}

/// What was dropped since the last summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Log lines dropped.
    pub lines: u64,
    /// Bytes of them.
    pub bytes: u64,
}

/// The log buckets of one plugin version.
pub struct LogLimit {
    lines: DefaultDirectRateLimiter,
    bytes: DefaultDirectRateLimiter,
    dropped: Mutex<(Dropped, Option<Instant>)>,
}

impl std::fmt::Debug for LogLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLimit").finish_non_exhaustive()
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit::new(LINES_PER_SECOND, LINES_BURST, BYTES_PER_SECOND, BYTES_BURST)
    }
}

impl LogLimit {
    /// Buckets of `lines`/s (burst `lines_burst`) and `bytes`/s (burst
    /// `bytes_burst`); zeros count as one.
    pub fn new(lines: u32, lines_burst: u32, bytes: u32, bytes_burst: u32) -> LogLimit {
        let nz = |n: u32| NonZeroU32::new(n.max(1)).expect("at least one");
        LogLimit {
            lines: RateLimiter::direct(Quota::per_second(nz(lines)).allow_burst(nz(lines_burst))),
            bytes: RateLimiter::direct(Quota::per_second(nz(bytes)).allow_burst(nz(bytes_burst))),
            dropped: Mutex::new((Dropped::default(), None)),
        }
    }

    /// Whether a line of `len` bytes may be written now; when not, it is
    /// counted as dropped.
    pub fn admit(&self, len: usize) -> bool {
        let bytes = NonZeroU32::new((len as u32).max(1)).expect("at least one");
        // Take a line token first; the bytes bucket refuses a line longer
        // than its burst (`InsufficientCapacity`) like one over its rate.
        let ok = self.lines.check().is_ok() && matches!(self.bytes.check_n(bytes), Ok(Ok(())));
        if !ok {
            let mut d = self.dropped.lock().unwrap();
            d.0.lines += 1;
            d.0.bytes += len as u64;
        }
        ok
    }

    /// What was dropped since the last summary, when there is something and
    /// the last summary is at least [`SUMMARY_EVERY`] old; the count starts
    /// again.
    pub fn summary_due(&self) -> Option<Dropped> {
        let mut d = self.dropped.lock().unwrap();
        if d.0.lines == 0 || d.1.is_some_and(|t| t.elapsed() < SUMMARY_EVERY) {
            return None;
        }
        let out = d.0;
        *d = (Dropped::default(), Some(Instant::now()));
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_burst_are_dropped_counted_and_summarised_once() {
        let limit = LogLimit::new(1, 3, 1_000_000, 1_000_000);
        let admitted = (0..10).filter(|_| limit.admit(10)).count();
        assert_eq!(admitted, 3);
        assert_eq!(
            limit.summary_due(),
            Some(Dropped {
                lines: 7,
                bytes: 70
            })
        );
        limit.admit(10);
        assert_eq!(limit.summary_due(), None, "at most one summary a second");
    }

    #[test]
    fn bytes_are_limited_too() {
        let limit = LogLimit::new(1000, 1000, 100, 100);
        assert!(limit.admit(60));
        assert!(!limit.admit(60));
        assert!(!limit.admit(1000), "longer than the burst");
        assert!(limit.admit(40));
    }
}
