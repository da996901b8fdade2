//! The retry schedule: when to try again, and when to give up.
//!
//! Owns: exponential backoff with jitter, honouring a sink's `after-ms` hint,
//! and the retry window — counted from the first attempt, so time an event
//! spends waiting behind a backlog is not charged against it.
//!
//! Must never: read clocks itself (times come from the claim, which read
//! the database's clock) or touch the store.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::plugin::manifest::{OnDead, RetryPolicy};
use crate::store::{Claimed, Finish};

/// Backoff before attempt `attempts + 1`: `base × factor^(attempts−1)`,
/// capped, with "equal jitter" (a random point in the upper half), so a
/// herd of failures spreads out without ever retrying sooner than half the
/// nominal delay.
pub fn backoff(policy: &RetryPolicy, attempts: u32) -> Duration {
    let nominal = Backoff::new(policy.base, policy.factor, policy.cap)
        .delay(attempts.saturating_sub(1))
        .as_secs_f64();
    let half = nominal / 2.0;
    Duration::from_secs_f64(half + rand::random::<f64>() * half)
}

/// A dead letter with `reason`, blocking its stream or not as the sink's
/// `on-dead` says.
pub fn dead(policy: &RetryPolicy, reason: String) -> Finish {
    Finish::Dead {
        reason,
        blocks_stream: policy.on_dead == OnDead::Block,
    }
}

/// Decide what a retryable failure of `claimed` becomes: another attempt
/// after `max(backoff, hint)`, or a dead letter when that attempt would fall
/// outside the retry window.
pub fn after_failure(
    policy: &RetryPolicy,
    claimed: &Claimed,
    reason: &str,
    hint: Option<Duration>,
) -> Finish {
    let mut delay = backoff(policy, claimed.attempts);
    if let Some(hint) = hint {
        delay = delay.max(hint);
    }
    let elapsed_ms = (claimed.claimed_at_ms - claimed.first_attempt_at_ms).max(0) as u128;
    let window_ms = policy.window.as_millis();
    if elapsed_ms + delay.as_millis() > window_ms {
        return dead(
            policy,
            format!(
                "retry window of {} used up after {} attempts; last error: {reason}",
                humantime::format_duration(policy.window),
                claimed.attempts
            ),
        );
    }
    Finish::Retry {
        delay,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            factor: 2.0,
            cap: Duration::from_secs(10),
            window: Duration::from_secs(3600),
            on_dead: OnDead::MoveOn,
        };
        for _ in 0..100 {
            let d1 = backoff(&p, 1);
            assert!(d1 >= Duration::from_millis(500) && d1 <= Duration::from_secs(1));
            let d3 = backoff(&p, 3);
            assert!(d3 >= Duration::from_secs(2) && d3 <= Duration::from_secs(4));
            let d9 = backoff(&p, 9);
            assert!(d9 >= Duration::from_secs(5) && d9 <= Duration::from_secs(10));
        }
    }
}
