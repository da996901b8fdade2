//! What one delivery loop serves: the plugin version for its delivery key,
//! and the key's own limits (hold, rate, in-flight cap) and observer.
//!
//! Owns: [`Target`] and the non-blocking permit count a rate-limited loop
//! takes before it claims.
//!
//! Must never: wait while a lease is held — permits are taken before the
//! claim, never after.

use std::sync::Arc;

use governor::DefaultDirectRateLimiter;

use crate::plugin::Plugin;

/// The serving side of one delivery key (a sink, or one destination of it).
#[derive(Clone)]
pub struct Target {
    /// The plugin version and configuration that delivers this key's batches.
    pub plugin: Plugin,
    /// Why nothing is claimed for this key now (paused by an operator,
    /// disabled after failing for too long), if so. Its deliveries wait.
    pub hold: Option<String>,
    /// Events per second this key may hand to its plugin (a token bucket,
    /// one token per event), if limited.
    pub rate: Option<Arc<DefaultDirectRateLimiter>>,
    /// Most events of this key in one batch, hence in flight at once.
    pub max_in_flight: Option<u32>,
    /// Told the result of every batch attempted.
    pub observer: Option<Arc<dyn TurnObserver>>,
    /// How long the loop sleeps when its key has nothing pending at all,
    /// unless woken; `None`: `delivery.max-poll-interval`.
    pub idle_poll: Option<std::time::Duration>,
}

impl Target {
    /// A sink served as it is: its plugin, no hold, no limits.
    pub fn plain(plugin: Plugin) -> Target {
        Target {
            plugin,
            hold: None,
            rate: None,
            max_in_flight: None,
            observer: None,
            idle_poll: None,
        }
    }
}

/// Sees the result of each batch a loop attempted.
pub trait TurnObserver: Send + Sync {
    /// `delivered` and `failed` events of one batch (retried, dead or
    /// untried behind a failure), and the batch's first failure reason.
    fn turn(&self, delivered: usize, failed: usize, last_error: Option<&str>);
}

/// How many permits, up to `want`, `rate` gives at once without waiting
/// (each taken permit is spent). 0 means the bucket is empty.
pub fn take_permits(rate: &DefaultDirectRateLimiter, want: u32) -> u32 {
    let mut got = 0;
    while got < want && rate.check().is_ok() {
        got += 1;
    }
    got
}
