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

pub mod heartbeat;
pub mod paused;
pub mod quarantine;
pub mod retry;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::DeliveryConfig;
use crate::metrics::{Metrics, PluginLabel, SinkLabel, TrapLabel};
use crate::plugin::bindings::{Event, Outcome};
use crate::plugin::SinkFailure;
use crate::store::{Claimed, Finish, Store};
pub use heartbeat::Heartbeats;
pub use quarantine::Quarantines;
pub use target::{Target, TurnObserver};

/// The minimum lease for a sink with deadline `d`: `2·d + 5 s`. A lease
/// shorter than this could expire while the batch is still running and let
/// another worker deliver the same events concurrently. Because a batch can
/// never outlive its deadline (the plugin call is interrupted there, the
/// turn abandoned), a lease of at least this length never needs renewing.
pub fn minimum_lease(deadline: Duration) -> Duration {
    deadline * 2 + Duration::from_secs(5)
}

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
    const PAGE: u32 = 500;
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

/// What every sink loop shares.
#[derive(Clone)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub config: DeliveryConfig,
    /// Woken on ingest, per delivery key (and by LISTEN/NOTIFY from other
    /// processes).
    pub wake: Arc<crate::wakeups::Wakeups>,
    pub heartbeats: Arc<Heartbeats>,
    pub metrics: Arc<Metrics>,
    /// Which sinks are quarantined (shown by `/ready` and the admin API).
    pub quarantines: Arc<Quarantines>,
    /// Which sinks an operator paused (one read per second for every loop).
    pub paused: Arc<paused::PausedSinks>,
}

/// The stale limit of a sink's loop: its longest healthy turn (plugin
/// deadline plus three database calls) plus the longest idle sleep, plus
/// 5 s of slack.
pub fn stale_after(config: &DeliveryConfig, deadline: Duration) -> Duration {
    deadline + config.db_timeout * 3 + config.max_poll_interval + Duration::from_secs(5)
}

/// How long a paused sink's loop waits before looking again.
const PAUSE_RECHECK: Duration = Duration::from_secs(1);

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

/// Run the delivery loop of one delivery key — a sink, or one destination
/// of a sink (`crate::destinations`) — until `shutdown` turns true or the
/// sender of `current` is dropped. An in-flight batch is finished before
/// the loop returns.
///
/// `current` holds the [`Target`] the key is served by (see
/// `plugin::registry` and `crate::destinations`): each batch runs on the
/// plugin version current when it starts. While it holds `None` the sink
/// was removed: nothing is claimed, its deliveries wait (no busy loop, no
/// dead letters), and the loop resumes when a version comes back. Metrics
/// are labelled by the plugin's sink name, never by the key.
pub async fn run_sink(
    shared: Shared,
    sink: String,
    mut current: watch::Receiver<Option<Target>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = &shared.config;
    let store = &*shared.store;
    let lease = config.lease;
    // Read at the first turn, and whenever the registry swaps it.
    let mut serving: Option<Target> = None;
    let mut traps = quarantine::TrapCounter::default();
    // While set and in the future the sink is quarantined: nothing is
    // claimed, ingest wake-ups do not end it, the loop still beats.
    let mut quarantined_until: Option<std::time::Instant> = None;
    let mut batch_limit = u32::MAX;
    // Set when a wait below saw `current` change (which marks it seen).
    let mut swapped = true;
    let key_wake = shared.wake.subscribe(&sink);
    tracing::info!(sink = %sink, lease = ?lease, "delivery loop started");
    loop {
        if *shutdown.borrow() {
            break;
        }
        if swapped || current.has_changed().unwrap_or(false) {
            swapped = false;
            serving = current.borrow_and_update().clone();
            traps.reset(&shared.quarantines, &sink);
            quarantined_until = None;
            batch_limit = u32::MAX;
            if let Some(Target { plugin, .. }) = &serving {
                shared.metrics.sink_started(plugin.name());
                shared.heartbeats.register(
                    &sink,
                    stale_after(config, plugin.manifest().limits.deadline),
                );
            }
        }
        let Some(target) = serving.clone() else {
            // Removed: beat (the loop is alive and means to be idle) and
            // wait for the plugin to come back.
            shared.heartbeats.turn(&sink, true);
            tokio::select! {
                changed = current.changed() => {
                    if changed.is_err() {
                        break; // the registry is gone: no version will come
                    }
                    swapped = true;
                }
                _ = tokio::time::sleep(config.max_poll_interval) => {}
                _ = shutdown.changed() => {}
            }
            continue;
        };
        if let Some(left) = quarantined_until
            .and_then(|t| t.checked_duration_since(std::time::Instant::now()))
            .filter(|left| !left.is_zero())
        {
            // Beat at least every poll interval, so a quarantine longer
            // than the stale limit does not make /health fail.
            shared.heartbeats.turn(&sink, true);
            tokio::select! {
                _ = tokio::time::sleep(left.min(config.max_poll_interval)) => {}
                Ok(()) = current.changed() => swapped = true,
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let plugin = target.plugin.clone();
        let deadline = plugin.manifest().limits.deadline;
        let batch_size = target
            .max_in_flight
            .map_or(plugin.manifest().limits.max_batch, |cap| {
                cap.min(plugin.manifest().limits.max_batch)
            });
        batch_limit = batch_limit.min(batch_size);
        // A turn may take the plugin's deadline plus its database calls;
        // past this it is abandoned (its leases then expire and others
        // take over).
        let turn_deadline = deadline + config.db_timeout * 3;
        // Register for wake-ups before looking, so an ingest between the
        // look and the sleep is not missed.
        let notified = shared.wake.all().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let notified_key = key_wake.notified();
        tokio::pin!(notified_key);
        notified_key.as_mut().enable();

        // A sink paused by an operator holds every destination of it too.
        let paused = shared
            .paused
            .any(store, config.db_timeout, &[&sink, plugin.name()])
            .await;
        let held = paused || target.hold.is_some();
        let sleep = if held {
            shared.heartbeats.turn(&sink, true);
            PAUSE_RECHECK
        } else {
            // A rate-limited key takes its permits before it claims, so it
            // never holds a lease while it waits for one.
            let limit = match target.rate.as_deref() {
                None => batch_limit,
                Some(rate) => match target::take_permits(rate, batch_limit) {
                    0 => {
                        shared.heartbeats.turn(&sink, true);
                        rate.until_ready().await;
                        1
                    }
                    n => n,
                },
            };
            let result = match tokio::time::timeout(
                turn_deadline,
                turn(&shared, &target, &sink, limit, lease),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "turn exceeded its deadline of {turn_deadline:?}; its leases will expire"
                )),
            };
            match result {
                Ok(report) => {
                    shared.heartbeats.turn(&sink, true);
                    if report.claimed > 0 {
                        shared.heartbeats.outcome(
                            &sink,
                            report.delivered,
                            report.last_error.as_deref(),
                        );
                    }
                    // A batch that runs out of time or memory loses every
                    // outcome in it, so the same batch from the same head
                    // would fail the same way again: halve the batch after
                    // either (down to one event, which then fails or
                    // succeeds on its own), grow it back after batches that
                    // get their outcomes. A batch cut to fit
                    // `limits.max-batch-bytes` sets the next claim's size.
                    if report.shrink {
                        batch_limit = (batch_limit / 2).max(1);
                        tracing::warn!(sink = %sink, batch_limit, "batch ran out of time or memory; batch size halved");
                    } else if let Some(fitted) = report.fitted {
                        batch_limit = fitted.max(1);
                    } else if report.claimed > 0 && report.failure.is_none() {
                        batch_limit = batch_limit.saturating_mul(2).min(batch_size);
                    }
                    // Counted per batch attempted: a turn that claimed
                    // nothing (the usual turn after a failure, whose
                    // deliveries wait for their retry) changes nothing.
                    let quarantine = match (&report.failure, report.claimed) {
                        (_, 0) => None,
                        (Some(reason), _) => traps.failed(
                            &shared.quarantines,
                            &sink,
                            reason,
                            config.quarantine_after_traps,
                            config.quarantine_backoff,
                        ),
                        (None, _) => {
                            traps.answered(&shared.quarantines, &sink);
                            None
                        }
                    };
                    if let Some(backoff) = quarantine {
                        shared
                            .metrics
                            .plugin_quarantines
                            .get_or_create(&PluginLabel {
                                plugin: plugin.name().to_string(),
                            })
                            .inc();
                        tracing::error!(
                            sink = %sink, pause = ?backoff,
                            "plugin quarantined after {} batches in a row failed as a whole; deliveries wait",
                            config.quarantine_after_traps.max(1)
                        );
                        quarantined_until = Some(std::time::Instant::now() + backoff);
                        continue;
                    } else if report.claimed > 0 {
                        // More may be due at once: go again without sleeping.
                        continue;
                    } else {
                        match tokio::time::timeout(config.db_timeout, store.next_due_in(&sink))
                            .await
                        {
                            Ok(Ok(Some(wait))) => wait.min(config.max_poll_interval),
                            Ok(Ok(None)) => target.idle_poll.unwrap_or(config.max_poll_interval),
                            Ok(Err(e)) => {
                                tracing::warn!(sink = %sink, "next due time: {e}");
                                config.max_poll_interval
                            }
                            Err(_) => config.max_poll_interval,
                        }
                    }
                }
                Err(e) => {
                    let failures = shared.heartbeats.turn(&sink, false);
                    let backoff = (Duration::from_millis(100)
                        * 2u32.saturating_pow(failures.min(10)))
                    .min(config.max_poll_interval.max(Duration::from_secs(5)));
                    tracing::warn!(sink = %sink, consecutive_failures = failures, "delivery turn failed: {e}");
                    backoff
                }
            }
        };
        if sleep.is_zero() {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = &mut notified, if !held => {}
            _ = &mut notified_key, if !held => {}
            Ok(()) = current.changed() => swapped = true,
            _ = shutdown.changed() => {}
        }
    }
    tracing::info!(sink = %sink, "delivery loop stopped");
}

/// What one turn did.
struct TurnReport {
    /// Events handed to the plugin.
    claimed: usize,
    /// Why the batch failed as a whole (a trap, or `init` refusing), if it
    /// did.
    failure: Option<String>,
    /// The batch ran out of its deadline or memory: halve the next one.
    shrink: bool,
    /// The claim was cut to this many events to fit the batch byte budget.
    fitted: Option<u32>,
    /// Events of the batch the target acknowledged.
    delivered: usize,
    /// The batch's first failure (a trap, or an event's retry or reject
    /// reason), if any.
    last_error: Option<String>,
}

/// One turn: claim, deliver, finish.
async fn turn(
    shared: &Shared,
    target: &Target,
    sink: &str,
    batch_size: u32,
    lease: Duration,
) -> Result<TurnReport, String> {
    let plugin = &target.plugin;
    // Metrics are labelled by sink, so the label count stays bounded by the
    // plugins loaded, however many destinations each serves.
    let label = plugin.name();
    let store = &*shared.store;
    let db_timeout = shared.config.db_timeout;
    let metrics = &shared.metrics;
    let claimed = tokio::time::timeout(
        db_timeout,
        store.claim_after(sink, batch_size, lease, plugin.manifest().after.as_deref()),
    )
    .await
    .map_err(|_| format!("claim timed out after {db_timeout:?}"))?
    .map_err(|e| format!("claim: {e}"))?;
    if claimed.is_empty() {
        return Ok(TurnReport {
            claimed: 0,
            failure: None,
            shrink: false,
            fitted: None,
            delivered: 0,
            last_error: None,
        });
    }
    let (claimed, over_budget) = fit_bytes(claimed, plugin.manifest().limits.batch_bytes());
    let fitted = (!over_budget.is_empty()).then_some(claimed.len() as u32);
    if !over_budget.is_empty() {
        release(shared, label, &over_budget).await?;
    }
    let batch: Vec<Event> = claimed.iter().map(to_wit_event).collect();
    let started = std::time::Instant::now();
    let outcomes = plugin.deliver(&batch).await;
    metrics
        .attempt_duration
        .get_or_create(&SinkLabel {
            sink: label.to_string(),
        })
        .observe(started.elapsed().as_secs_f64());
    let policy = &plugin.manifest().retry;
    let mut failure_reason = None;
    let mut shrink = false;
    let mut finishes: Vec<Finish> = match outcomes {
        Ok(outcomes) => claimed
            .iter()
            .zip(outcomes)
            .map(|(c, outcome)| match outcome {
                Outcome::Delivered => Finish::Delivered,
                Outcome::Retry(info) => retry::after_failure(
                    policy,
                    c,
                    &info.reason,
                    info.after_ms.map(Duration::from_millis),
                ),
                Outcome::Reject(reason) => retry::dead(policy, format!("rejected: {reason}")),
            })
            .collect(),
        Err(failure) => {
            log_failure(sink, &failure, claimed.len());
            failure_reason = Some(failure.to_string());
            if let SinkFailure::Trap { kind, .. } = &failure {
                shrink = failure.is_deadline() || failure.is_out_of_memory();
                metrics
                    .plugin_traps
                    .get_or_create(&TrapLabel {
                        plugin: label.to_string(),
                        kind: kind.clone(),
                    })
                    .inc();
            }
            let reason = failure.to_string();
            claimed
                .iter()
                .map(|c| retry::after_failure(policy, c, &reason, None))
                .collect()
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
    // Every outcome of the batch in one transaction: one commit, not one
    // per delivery (each commit is an fsync, docs/measurements.md).
    let items: Vec<(i64, &str, &Finish)> = claimed
        .iter()
        .zip(&finishes)
        .map(|(c, f)| (c.delivery_id, c.lease_token.as_str(), f))
        .collect();
    let kept_all = finish_with_retries(store, &items, db_timeout).await?;
    for ((c, finish), kept) in claimed.iter().zip(&finishes).zip(kept_all) {
        let ev = &c.event.event;
        if !kept {
            metrics.delivery(label, "lease_lost");
            tracing::warn!(
                event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
                "lease lost before the outcome was recorded; outcome dropped"
            );
            continue;
        }
        metrics.delivery(
            label,
            match finish {
                Finish::Delivered => "delivered",
                Finish::Retry { .. } => "retry",
                Finish::Dead { .. } => "dead",
                Finish::Release => "released",
            },
        );
        if let Finish::Delivered = finish {
            let now_ms = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
            let latency = (now_ms as i64 - c.event.ingested_at_ms).max(0) as f64 / 1000.0;
            metrics
                .delivery_latency
                .get_or_create(&SinkLabel {
                    sink: label.to_string(),
                })
                .observe(latency);
        }
        match finish {
            Finish::Delivered => {
                tracing::debug!(event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts, "delivered")
            }
            Finish::Retry { delay, reason } => tracing::info!(
                event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
                retry_in = ?delay, "delivery failed, will retry: {reason}"
            ),
            Finish::Dead {
                reason,
                blocks_stream,
            } => tracing::warn!(
                event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
                blocks_stream,
                "delivery dead-lettered: {reason}"
            ),
            Finish::Release => tracing::debug!(
                event_id = %ev.id, stream = %ev.stream, sink, "not tried: an earlier event of its stream failed"
            ),
        }
    }
    let delivered = finishes
        .iter()
        .filter(|f| matches!(f, Finish::Delivered))
        .count();
    let last_error = failure_reason.clone().or_else(|| {
        finishes.iter().find_map(|f| match f {
            Finish::Retry { reason, .. } | Finish::Dead { reason, .. } => Some(reason.clone()),
            _ => None,
        })
    });
    if let Some(observer) = &target.observer {
        observer.turn(delivered, claimed.len() - delivered, last_error.as_deref());
    }
    Ok(TurnReport {
        delivered,
        last_error,
        claimed: claimed.len(),
        failure: failure_reason,
        shrink,
        fitted,
    })
}

/// Delays between the attempts of a batch's finish that failed (a
/// database restart closes every connection; the pool reconnects on the
/// next use). The leases are still ours, and every attempt is fenced on
/// them, so a retried finish changes nothing a worker that took over did;
/// without it the outcomes of the batch wait for lease expiry
/// (`delivery.lease`) and are delivered again.
const FINISH_RETRY_DELAYS: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_millis(1000),
];

/// [`Store::finish_many`], tried again after [`FINISH_RETRY_DELAYS`] when
/// it fails; each attempt bounded by `db_timeout`.
async fn finish_with_retries(
    store: &dyn Store,
    items: &[(i64, &str, &Finish)],
    db_timeout: Duration,
) -> Result<Vec<bool>, String> {
    let mut delays = FINISH_RETRY_DELAYS.iter();
    loop {
        let error = match tokio::time::timeout(db_timeout, store.finish_many(items)).await {
            Ok(Ok(kept)) => return Ok(kept),
            Ok(Err(e)) => format!("finish: {e}"),
            Err(_) => format!("finish timed out after {db_timeout:?}"),
        };
        match delays.next() {
            Some(delay) => {
                tracing::info!("{error}; trying again in {delay:?}");
                tokio::time::sleep(*delay).await;
            }
            None => return Err(error),
        }
    }
}

/// Split a claim into the batch to deliver — as many events as fit in
/// `budget` bytes of data, taking every stream's head before any stream's
/// second event, and never an event whose predecessor in its stream was
/// left out; at least one — and the rest, to be released.
fn fit_bytes(claimed: Vec<Claimed>, budget: u64) -> (Vec<Claimed>, Vec<Claimed>) {
    let total: u64 = claimed
        .iter()
        .map(|c| c.event.event.data.len() as u64)
        .sum();
    if total <= budget || claimed.len() <= 1 {
        return (claimed, Vec::new());
    }
    // Rank of each event within its stream (0 = head); `claimed` is in
    // stream, then sequence order.
    let mut rank = vec![0usize; claimed.len()];
    for i in 1..claimed.len() {
        if claimed[i].event.event.stream == claimed[i - 1].event.event.stream {
            rank[i] = rank[i - 1] + 1;
        }
    }
    let mut order: Vec<usize> = (0..claimed.len()).collect();
    order.sort_by_key(|&i| (rank[i], i));
    let mut keep = vec![false; claimed.len()];
    let mut stopped = std::collections::HashSet::new();
    let mut used = 0u64;
    let mut kept = 0usize;
    for i in order {
        let stream = claimed[i].event.event.stream.as_str();
        if stopped.contains(stream) {
            continue;
        }
        let size = claimed[i].event.event.data.len() as u64;
        if kept > 0 && used + size > budget {
            stopped.insert(stream);
            continue;
        }
        used += size;
        kept += 1;
        keep[i] = true;
    }
    let (mut batch, mut rest) = (Vec::new(), Vec::new());
    for (c, k) in claimed.into_iter().zip(keep) {
        if k {
            batch.push(c);
        } else {
            rest.push(c);
        }
    }
    (batch, rest)
}

/// Give back the leases of claimed deliveries not handed to the plugin,
/// without charging an attempt.
/// Give `claimed` back untried; counted under sink `label`.
async fn release(shared: &Shared, label: &str, claimed: &[Claimed]) -> Result<(), String> {
    let db_timeout = shared.config.db_timeout;
    let items: Vec<(i64, &str, &Finish)> = claimed
        .iter()
        .map(|c| (c.delivery_id, c.lease_token.as_str(), &Finish::Release))
        .collect();
    tokio::time::timeout(db_timeout, shared.store.finish_many(&items))
        .await
        .map_err(|_| format!("release timed out after {db_timeout:?}"))?
        .map_err(|e| format!("release: {e}"))?;
    for _ in claimed {
        shared.metrics.delivery(label, "released");
    }
    Ok(())
}

fn log_failure(sink: &str, failure: &SinkFailure, events: usize) {
    match failure {
        SinkFailure::Trap { kind, detail } => {
            tracing::warn!(
                sink,
                events,
                "plugin trap ({kind}); batch will be retried: {detail}"
            )
        }
        SinkFailure::Init(reason) => tracing::warn!(sink, events, "plugin init refused: {reason}"),
    }
}

fn rfc3339_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
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
            (ev.data_format == crate::event::DataFormat::Json)
                .then(|| "application/json".to_string())
        }),
        dataschema: ev.dataschema.clone(),
        data: ev.data.clone(),
        extensions: ev
            .extensions
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        attempt: c.attempts,
        ingested_at,
    }
}
