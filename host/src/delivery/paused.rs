//! Which sinks an operator paused, read once for every loop of the
//! process.
//!
//! Owns: a cache of `Store::paused_sinks` renewed at most every
//! [`super::sink_loop::PAUSE_RECHECK`], read by every delivery loop before it claims
//! — one query per second for the process, however many loops (a thousand
//! destinations must not mean a thousand reads a second). One loop at a
//! time renews it; the others go on with the last answer meanwhile, so a
//! read that waits on the store (a lock on `sink_state`, a slow database)
//! holds back one loop, not all of them.
//!
//! Must never: treat a failed read as "nothing paused" for longer than it
//! takes to read again (the last answer is kept until a read succeeds), or
//! let a loop go on before there is a first answer.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::Store;

/// The last answer: when it was read (or last tried) and the paused names.
type Answer = (Instant, Arc<Vec<String>>);

/// The shared answer.
#[derive(Default)]
pub struct PausedSinks {
    answer: Mutex<Option<Answer>>,
    /// Held by the one loop reading the store.
    reader: tokio::sync::Mutex<()>,
}

impl PausedSinks {
    /// Whether any of `names` (a delivery key, its sink) is paused.
    ///
    /// When the cached answer is older than
    /// [`super::sink_loop::PAUSE_RECHECK`], this loop reads the store
    /// (within `timeout`) unless another loop is reading it, in which case
    /// the last answer stands: a pause takes effect within the recheck plus
    /// however long a read takes. Before the first answer every loop waits
    /// for it. A read that fails or times out keeps the last answer (and
    /// the next read comes a recheck later).
    pub async fn any(&self, store: &dyn Store, timeout: Duration, names: &[&str]) -> bool {
        let paused = match self.fresh() {
            Ok(paused) => paused,
            Err(Some(last)) => match self.reader.try_lock() {
                Err(_) => last,
                Ok(_reading) => match self.fresh() {
                    Ok(paused) => paused,
                    Err(_) => self.read(store, timeout).await.unwrap_or(last),
                },
            },
            Err(None) => {
                let _reading = self.reader.lock().await;
                match self.fresh() {
                    Ok(paused) | Err(Some(paused)) => paused,
                    Err(None) => self.read(store, timeout).await.unwrap_or_default(),
                }
            }
        };
        names.iter().any(|n| paused.iter().any(|p| p == n))
    }

    /// The cached answer if it is fresh; else the stale one, if any.
    fn fresh(&self) -> Result<Arc<Vec<String>>, Option<Arc<Vec<String>>>> {
        match self.answer.lock().unwrap().as_ref() {
            Some((at, paused)) if at.elapsed() < super::sink_loop::PAUSE_RECHECK => {
                Ok(paused.clone())
            }
            Some((_, paused)) => Err(Some(paused.clone())),
            None => Err(None),
        }
    }

    /// Read the store and cache the answer; `None` when the read failed or
    /// timed out (the last answer's time is renewed, so the next read comes
    /// a recheck later).
    async fn read(&self, store: &dyn Store, timeout: Duration) -> Option<Arc<Vec<String>>> {
        let result = tokio::time::timeout(timeout, store.paused_sinks()).await;
        let mut answer = self.answer.lock().unwrap();
        match result {
            Ok(Ok(paused)) => {
                let paused = Arc::new(paused);
                *answer = Some((Instant::now(), paused.clone()));
                Some(paused)
            }
            _ => {
                if let Some((at, _)) = answer.as_mut() {
                    *at = Instant::now();
                }
                None
            }
        }
    }
}
