//! Retention: deletes delivered deliveries older than
//! `delivery.retention`, in bounded batches, so the live indexes stay small
//! (docs/measurements.md: finished rows left in place slow every claim).
//!
//! Must never: touch a delivery that is not delivered.

use std::time::Duration;

use tokio::sync::watch;

use super::Shared;

/// Rows deleted per retention batch.
const RETENTION_BATCH: u32 = 1000;
/// How often retention runs.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Delete delivered rows older than the retention period, in bounded
/// batches, every minute, until `shutdown`.
pub async fn run_retention(shared: Shared, mut shutdown: watch::Receiver<bool>) {
    loop {
        loop {
            let purged = tokio::time::timeout(
                shared.config.db_timeout,
                shared
                    .store
                    .purge_delivered(shared.config.retention, RETENTION_BATCH),
            )
            .await;
            match purged {
                Ok(Ok(n)) if n as u32 >= RETENTION_BATCH && !*shutdown.borrow() => continue,
                Ok(Ok(n)) => {
                    if n > 0 {
                        tracing::debug!(rows = n, "retention deleted delivered rows");
                    }
                    break;
                }
                Ok(Err(e)) => {
                    tracing::warn!("retention: {e}");
                    break;
                }
                Err(_) => break,
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_EVERY) => {}
            _ = shutdown.changed() => return,
        }
    }
}
