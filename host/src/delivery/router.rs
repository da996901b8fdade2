//! The router: gives events enqueued by SQL inside applications'
//! transactions (`outboxd.enqueue`) their deliveries, by the configured
//! routes, and wakes the loops of the keys it queued.
//!
//! Must never: deliver anything, or route an event twice (the store marks
//! it routed in the same transaction).

use std::sync::Arc;

use tokio::sync::watch;

use super::settings::DeliveryConfig;
use crate::store::Store;

/// Events routed per store call.
const PAGE: u32 = 500;

/// Which sinks an event goes to, by the configured routes.
pub type RouteFn = dyn Fn(&crate::event::NewEvent) -> Vec<String> + Send + Sync;

/// Route events enqueued by SQL inside applications' transactions (see
/// `outboxd.enqueue`) until `shutdown` turns true: create their deliveries
/// by the configured routes, then wake the sink loops.
pub async fn run_router(
    store: Arc<dyn Store>,
    route: Arc<RouteFn>,
    config: DeliveryConfig,
    wake: Arc<crate::wakeups::Wakeups>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        let notified = wake.all().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let routed =
            tokio::time::timeout(config.db_timeout, store.route_pending(&*route, PAGE)).await;
        match routed {
            Ok(Ok(n)) if n > 0 => {
                wake.everyone();
                if n as u32 >= PAGE {
                    continue;
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("routing enqueued events failed: {e}"),
            Err(_) => tracing::warn!(
                "routing enqueued events timed out after {:?}",
                config.db_timeout
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(config.max_poll_interval) => {}
            _ = &mut notified => {}
            _ = shutdown.changed() => {}
        }
    }
}
