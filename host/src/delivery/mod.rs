//! The delivery engine: claim → call the sink → fenced finish.
//!
//! Owns: one loop per sink that claims due heads of streams, hands them to
//! the sink's plugin as one batch, and records each outcome fenced on the
//! lease token; the translation of outcomes into delivered / retry at T /
//! dead ([`retry`]); the loop's own schedule (again at once after a full
//! batch; otherwise asleep until the next due time, a wake-up from ingest,
//! or the maximum poll interval).
//!
//! Invariants kept here: no in-memory "running" latch — a turn that fails
//! logs, backs off and tries again; every database call has a timeout; the
//! plugin call has the manifest's deadline; a lost lease changes nothing.
//!
//! Must never: hold a lease while sleeping, or mark delivered anything the
//! sink did not acknowledge.

pub mod retry;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::config::DeliveryConfig;
use crate::plugin::bindings::{Event, Outcome};
use crate::plugin::{Plugin, SinkFailure};
use crate::store::{Claimed, Finish, Store};

/// The minimum lease for a sink with deadline `d`: `2·d + 5 s`. A lease
/// shorter than this could expire while the batch is still running and let
/// another worker deliver the same events concurrently.
pub fn minimum_lease(deadline: Duration) -> Duration {
    deadline * 2 + Duration::from_secs(5)
}

/// Route events enqueued by SQL inside applications' transactions (see
/// `outboxd.enqueue`) until `shutdown` turns true: create their deliveries
/// by the configured routes, then wake the sink loops.
pub async fn run_router(
    store: Arc<dyn Store>,
    route: Arc<dyn Fn(&crate::event::NewEvent) -> Vec<String> + Send + Sync>,
    config: DeliveryConfig,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    const PAGE: u32 = 500;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let routed = tokio::time::timeout(config.db_timeout, store.route_pending(&*route, PAGE)).await;
        match routed {
            Ok(Ok(n)) if n > 0 => {
                wake.notify_waiters();
                if n as u32 >= PAGE {
                    continue;
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("routing enqueued events failed: {e}"),
            Err(_) => tracing::warn!("routing enqueued events timed out after {:?}", config.db_timeout),
        }
        tokio::select! {
            _ = tokio::time::sleep(config.max_poll_interval) => {}
            _ = &mut notified => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Run the delivery loop of one sink until `shutdown` turns true. An
/// in-flight batch is finished before the loop returns.
pub async fn run_sink(
    store: Arc<dyn Store>,
    plugin: Plugin,
    config: DeliveryConfig,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let sink = plugin.name().to_string();
    let lease = config.lease.max(minimum_lease(plugin.manifest().limits.deadline));
    let batch_size = plugin.manifest().limits.max_batch;
    let mut failures: u32 = 0;
    tracing::info!(sink = %sink, lease = ?lease, batch_size, "delivery loop started");
    loop {
        if *shutdown.borrow() {
            break;
        }
        // Register for wake-ups before looking, so an ingest between the
        // look and the sleep is not missed.
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        let turn = turn(&*store, &plugin, &sink, batch_size, lease, config.db_timeout).await;
        let sleep = match turn {
            Ok(n) if n as u32 >= batch_size => {
                failures = 0;
                continue;
            }
            Ok(n) => {
                failures = 0;
                if n > 0 {
                    continue;
                }
                match tokio::time::timeout(config.db_timeout, store.next_due_in(&sink)).await {
                    Ok(Ok(Some(wait))) => wait.min(config.max_poll_interval),
                    Ok(Ok(None)) => config.max_poll_interval,
                    Ok(Err(e)) => {
                        tracing::warn!(sink = %sink, "next due time: {e}");
                        config.max_poll_interval
                    }
                    Err(_) => config.max_poll_interval,
                }
            }
            Err(e) => {
                failures += 1;
                let backoff = (Duration::from_millis(100) * 2u32.saturating_pow(failures.min(10)))
                    .min(config.max_poll_interval.max(Duration::from_secs(5)));
                tracing::warn!(sink = %sink, consecutive_failures = failures, "delivery turn failed: {e}");
                backoff
            }
        };
        if sleep.is_zero() {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = &mut notified => {}
            _ = shutdown.changed() => {}
        }
    }
    tracing::info!(sink = %sink, "delivery loop stopped");
}

/// One turn: claim, deliver, finish. Returns how many deliveries it claimed.
async fn turn(
    store: &dyn Store,
    plugin: &Plugin,
    sink: &str,
    batch_size: u32,
    lease: Duration,
    db_timeout: Duration,
) -> Result<usize, String> {
    let claimed = tokio::time::timeout(db_timeout, store.claim(sink, batch_size, lease))
        .await
        .map_err(|_| format!("claim timed out after {db_timeout:?}"))?
        .map_err(|e| format!("claim: {e}"))?;
    if claimed.is_empty() {
        return Ok(0);
    }
    let batch: Vec<Event> = claimed.iter().map(to_wit_event).collect();
    let outcomes = plugin.deliver(&batch).await;
    let policy = &plugin.manifest().retry;
    let mut finishes: Vec<Finish> = match outcomes {
        Ok(outcomes) => claimed
            .iter()
            .zip(outcomes)
            .map(|(c, outcome)| match outcome {
                Outcome::Delivered => Finish::Delivered,
                Outcome::Retry(info) => {
                    retry::after_failure(policy, c, &info.reason, info.after_ms.map(Duration::from_millis))
                }
                Outcome::Reject(reason) => Finish::Dead { reason: format!("rejected: {reason}") },
            })
            .collect(),
        Err(failure) => {
            log_failure(sink, &failure, claimed.len());
            let reason = failure.to_string();
            claimed.iter().map(|c| retry::after_failure(policy, c, &reason, None)).collect()
        }
    };
    // Behind the first event of a stream that was not delivered, the rest of
    // that stream in this batch was not tried (the sink contract) and must
    // wait for it: give those leases back without charging an attempt.
    // A `delivered` the sink reported is kept: it did reach the target.
    let mut blocked: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (c, finish) in claimed.iter().zip(finishes.iter_mut()) {
        let stream = c.event.event.stream.as_str();
        if blocked.contains(stream) {
            if !matches!(finish, Finish::Delivered) {
                *finish = Finish::Release;
            }
        } else if !matches!(finish, Finish::Delivered) {
            blocked.insert(stream);
        }
    }
    for (c, finish) in claimed.iter().zip(&finishes) {
        let ev = &c.event.event;
        let kept = tokio::time::timeout(db_timeout, store.finish(c.delivery_id, &c.lease_token, finish))
            .await
            .map_err(|_| format!("finish timed out after {db_timeout:?}"))?
            .map_err(|e| format!("finish: {e}"))?;
        if !kept {
            tracing::warn!(
                event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
                "lease lost before the outcome was recorded; outcome dropped"
            );
            continue;
        }
        match finish {
            Finish::Delivered => {
                tracing::debug!(event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts, "delivered")
            }
            Finish::Retry { delay, reason } => tracing::info!(
                event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
                retry_in = ?delay, "delivery failed, will retry: {reason}"
            ),
            Finish::Dead { reason } => tracing::warn!(
                event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
                "delivery dead-lettered: {reason}"
            ),
            Finish::Release => tracing::debug!(
                event_id = %ev.id, stream = %ev.stream, sink, "not tried: an earlier event of its stream failed"
            ),
        }
    }
    Ok(claimed.len())
}

fn log_failure(sink: &str, failure: &SinkFailure, events: usize) {
    match failure {
        SinkFailure::Trap { kind, detail } => {
            tracing::warn!(sink, events, "plugin trap ({kind}); batch will be retried: {detail}")
        }
        SinkFailure::Init(reason) => tracing::warn!(sink, events, "plugin init refused: {reason}"),
    }
}

fn rfc3339_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// The WIT view of a claimed delivery.
fn to_wit_event(c: &Claimed) -> Event {
    let ev = &c.event.event;
    let ingested_at = rfc3339_ms(c.event.ingested_at_ms);
    Event {
        id: ev.id.clone(),
        source: ev.source.clone(),
        type_: ev.ty.clone(),
        subject: ev.subject.clone(),
        stream: ev.stream.clone(),
        sequence: c.event.sequence,
        time: ev.time.clone().unwrap_or_else(|| ingested_at.clone()),
        // JSON-format events without `datacontenttype` carry JSON
        // (CloudEvents JSON format §3.1); say so to the sink.
        datacontenttype: ev.datacontenttype.clone().or_else(|| {
            (ev.data_format == crate::event::DataFormat::Json).then(|| "application/json".to_string())
        }),
        dataschema: ev.dataschema.clone(),
        data: ev.data.clone(),
        extensions: ev.extensions.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        attempt: c.attempts,
        ingested_at,
    }
}
