//! Which sinks an operator paused, read once for every loop of the
//! process.
//!
//! Owns: a cache of `Store::paused_sinks` renewed at most every
//! [`super::sink_loop::PAUSE_RECHECK`], read by every delivery loop before it claims
//! — one query per second for the process, however many loops (a thousand
//! destinations must not mean a thousand reads a second).
//!
//! Must never: treat a failed read as "nothing paused" for longer than it
//! takes to read again (the last answer is kept until a read succeeds).

use std::time::Instant;

use tokio::sync::Mutex;

use crate::store::Store;

/// The shared answer.
#[derive(Default)]
pub struct PausedSinks {
    inner: Mutex<Option<(Instant, Vec<String>)>>,
}

impl PausedSinks {
    /// Whether any of `names` (a delivery key, its sink) is paused,
    /// reading the store when the cached answer is older than
    /// [`super::sink_loop::PAUSE_RECHECK`]. A read that fails or times out keeps the
    /// last answer.
    pub async fn any(
        &self,
        store: &dyn Store,
        timeout: std::time::Duration,
        names: &[&str],
    ) -> bool {
        let mut inner = self.inner.lock().await;
        let stale = inner
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= super::sink_loop::PAUSE_RECHECK);
        if stale {
            match tokio::time::timeout(timeout, store.paused_sinks()).await {
                Ok(Ok(paused)) => *inner = Some((Instant::now(), paused)),
                _ => {
                    if let Some((at, _)) = inner.as_mut() {
                        *at = Instant::now();
                    }
                }
            }
        }
        inner
            .as_ref()
            .is_some_and(|(_, paused)| names.iter().any(|n| paused.iter().any(|p| p == n)))
    }
}
