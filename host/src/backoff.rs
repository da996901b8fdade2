//! Exponential backoff: the delay after the n-th failure in a row is
//! `first × factor^n`, never more than `max`.
//!
//! Used by the delivery loop (a failed turn), quarantine (a plugin whose
//! batches keep failing), the retry schedule of a sink and of the Neo4j
//! relay, the AMQP broker pool (reconnects), the source supervisor
//! (restarts) and the `amqp` source (a store that is down). The
//! PostgreSQL listener's reconnect (`store::postgres`) still doubles its
//! own wait.
//!
//! Owns: the arithmetic only, saturating at `max` instead of overflowing
//! however many failures are counted. Must never: sleep, read a clock, hold
//! the failure count, add jitter (each caller's jitter is its own policy)
//! or import anything of ours — it is on the ground floor.

use std::time::Duration;

/// An exponential backoff schedule: `first × factor^step`, capped at `max`.
///
/// `step` counts failures in a row from 0: `delay(0)` is `first`. The cap
/// is the only bound on the growth, so a schedule reaches `max` and stays
/// there whatever the count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    first: Duration,
    factor: f64,
    max: Duration,
}

impl Backoff {
    /// A schedule that doubles: `first`, `2·first`, `4·first`, … up to `max`.
    pub const fn doubling(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            factor: 2.0,
            max,
        }
    }

    /// A schedule growing by `factor` per step (a sink's `retry.factor`),
    /// from `first` up to `max`. A factor below 1 (or not a number) gives
    /// `first` at every step; validation of configured factors is the
    /// caller's.
    pub fn new(first: Duration, factor: f64, max: Duration) -> Backoff {
        Backoff { first, factor, max }
    }

    /// The delay after `step` failures in a row beyond the first (0:
    /// `first`), at most `max` (and at most `first` when `first` is over
    /// `max`: the cap wins).
    pub fn delay(&self, step: u32) -> Duration {
        let nominal =
            if self.factor.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(&self.factor) {
                // Integral factors in integer arithmetic: exact to the nanosecond.
                (self.factor as u32)
                    .checked_pow(step)
                    .and_then(|m| self.first.checked_mul(m))
            } else if self.factor > 1.0 {
                let exp = step.min(i32::MAX as u32) as i32;
                Duration::try_from_secs_f64(self.first.as_secs_f64() * self.factor.powi(exp)).ok()
            } else {
                Some(self.first)
            };
        nominal.map_or(self.max, |d| d.min(self.max))
    }

    /// The cap: the longest delay of the schedule.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubling_starts_at_first_and_doubles_per_step() {
        let b = Backoff::doubling(100 * MS, Duration::from_secs(5));
        let delays: Vec<_> = (0..4).map(|n| b.delay(n)).collect();
        assert_eq!(delays, [100 * MS, 200 * MS, 400 * MS, 800 * MS]);
    }

    #[test]
    fn the_cap_holds_at_any_step_without_overflow() {
        let b = Backoff::doubling(100 * MS, Duration::from_secs(5));
        assert_eq!(b.delay(6), Duration::from_secs(5)); // 6.4 s capped
        assert_eq!(b.delay(63), Duration::from_secs(5));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
        let huge = Backoff::doubling(Duration::MAX / 2, Duration::MAX);
        assert_eq!(huge.delay(2), Duration::MAX);
    }

    #[test]
    fn a_fractional_factor_grows_by_that_factor() {
        let b = Backoff::new(Duration::from_secs(1), 1.5, Duration::from_secs(60));
        assert_eq!(b.delay(0), Duration::from_secs(1));
        assert_eq!(b.delay(2), Duration::from_millis(2250));
        assert_eq!(b.delay(1000), Duration::from_secs(60));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn a_factor_below_one_stays_at_first() {
        for factor in [0.5, 0.0, -2.0, f64::NAN] {
            let b = Backoff::new(Duration::from_secs(1), factor, Duration::from_secs(60));
            assert_eq!(b.delay(5), Duration::from_secs(1), "factor {factor}");
        }
    }

    #[test]
    fn first_over_max_gives_max() {
        let b = Backoff::doubling(Duration::from_secs(10), Duration::from_secs(3));
        assert_eq!(b.delay(0), Duration::from_secs(3));
    }
}
