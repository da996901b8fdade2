//! Retention: deletes delivered deliveries, and recorded failed attempts
//! (`attempts`), older than `delivery.retention`, in bounded batches, so
//! the live indexes stay small (docs/measurements.md: finished rows left
//! in place slow every claim) and the attempt history cannot grow without
//! bound.
//!
//! Must never: touch a delivery that is not delivered.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use super::Shared;
use crate::store::StoreError;

/// Rows deleted per retention batch.
const RETENTION_BATCH: u32 = 1000;
/// How often retention runs.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Delete delivered rows and failed attempts older than the retention
/// period, in bounded batches, every minute, until `shutdown`.
pub async fn run_retention(shared: Shared, mut shutdown: watch::Receiver<bool>) {
    let retention = shared.config.retention;
    loop {
        purge_all(&shared, &shutdown, "delivered rows", || {
            shared.store.purge_delivered(retention, RETENTION_BATCH)
        })
        .await;
        purge_all(&shared, &shutdown, "failed attempts", || {
            shared.store.purge_attempts(retention, RETENTION_BATCH)
        })
        .await;
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_EVERY) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Run `purge` (one batch of at most [`RETENTION_BATCH`] rows, answering
/// how many it deleted) until a batch is short, it fails or times out, or
/// `shutdown`; `what` names the rows in the log.
async fn purge_all<F, Fut>(shared: &Shared, shutdown: &watch::Receiver<bool>, what: &str, purge: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    loop {
        match tokio::time::timeout(shared.config.db_timeout, purge()).await {
            Ok(Ok(n)) if n as u32 >= RETENTION_BATCH && !*shutdown.borrow() => continue,
            Ok(Ok(n)) => {
                if n > 0 {
                    tracing::debug!(rows = n, "retention deleted {what}");
                }
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!("retention of {what}: {e}");
                return;
            }
            Err(_) => return,
        }
    }
}
