//! One turn of a delivery key's loop: claim a batch, hand it to the
//! sink's plugin, turn the answer into finishes by the retry policy, and
//! record them fenced, in one transaction — with, for each failed
//! attempt, what the host knows of it (outcome class, the call's
//! duration, the receiver's status) for the store's `attempts` history.
//!
//! Must never: mark delivered anything the sink did not acknowledge, or
//! charge an attempt to an event that was not tried.

use std::time::Duration;

use super::{retry, Shared, Target};
use crate::metrics::{SinkLabel, TrapLabel};
use crate::otel::{SpanHandle, Telemetry, TraceContext, TurnCall};
use crate::plugin::bindings::{Event, Outcome};
use crate::plugin::trace::BatchTrace;
use crate::plugin::SinkFailure;
use crate::store::{AttemptNote, AttemptOutcome, Claimed, Finish, Store, StoreError};

/// A database call of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DbCall {
    /// Taking the batch's leases.
    Claim,
    /// Giving back untried deliveries' leases.
    Release,
    /// Recording the batch's outcomes.
    Finish,
}

impl std::fmt::Display for DbCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DbCall::Claim => "claim",
            DbCall::Release => "release",
            DbCall::Finish => "finish",
        })
    }
}

/// Why a turn did not run to its end: its leases then expire and the
/// batch is tried again, while the loop backs off. A plugin's failure is
/// not one of these: it is an outcome ([`TurnReport::failure`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum TurnError {
    /// A database call did not answer within `delivery.db-timeout`.
    #[error("{call} timed out after {after:?}")]
    Timeout {
        /// The call.
        call: DbCall,
        /// `delivery.db-timeout`.
        after: Duration,
    },
    /// A database call failed.
    #[error("{call}: {source}")]
    Store {
        /// The call.
        call: DbCall,
        /// The store's error.
        source: StoreError,
    },
    /// The turn ran past its deadline (the plugin's deadline plus three
    /// database calls) and was abandoned.
    #[error("turn exceeded its deadline of {0:?}; its leases will expire")]
    Deadline(Duration),
    /// The turn's task ended without an answer (a panic).
    #[error("delivery turn ended abnormally: {0}")]
    Aborted(#[source] tokio::task::JoinError),
}

impl TurnError {
    /// `result` of database call `call`, bounded by `after`.
    fn bounded<T>(
        call: DbCall,
        after: Duration,
        result: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    ) -> Result<T, TurnError> {
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(TurnError::Store { call, source }),
            Err(_) => Err(TurnError::Timeout { call, after }),
        }
    }
}

/// What one turn did.
#[derive(Debug, Default)]
pub(super) struct TurnReport {
    /// Events handed to the plugin.
    pub claimed: usize,
    /// Why the batch failed as a whole (a trap, or `init` refusing), if it
    /// did.
    pub failure: Option<SinkFailure>,
    /// The batch ran out of its deadline or memory: halve the next one.
    pub shrink: bool,
    /// The claim was cut to this many events to fit the batch byte budget.
    pub fitted: Option<u32>,
    /// Events of the batch the target acknowledged.
    pub delivered: usize,
    /// The batch's first failure (a trap, or an event's retry or reject
    /// reason), if any.
    pub last_error: Option<String>,
}

/// One turn: claim, deliver, finish. `Err` when a database call failed
/// or timed out (the batch's leases then expire and it is tried again).
/// `full`, when given, is told as soon as the claim returns whether it
/// came back with all `batch_size` deliveries (dropped unsent when the
/// claim fails), so the loop may claim the next batch meanwhile.
pub(super) async fn turn(
    shared: &Shared,
    target: &Target,
    sink: &str,
    batch_size: u32,
    lease: Duration,
    full: Option<tokio::sync::oneshot::Sender<bool>>,
) -> Result<TurnReport, TurnError> {
    let plugin = &target.plugin;
    // Metrics are labelled by sink, so the label count stays bounded by the
    // plugins loaded, however many destinations each serves.
    let label = plugin.name();
    let db_timeout = shared.config.db_timeout;
    let claim_started = shared.telemetry.is_on().then(std::time::SystemTime::now);
    let claim_timer = std::time::Instant::now();
    let claimed = TurnError::bounded(
        DbCall::Claim,
        db_timeout,
        tokio::time::timeout(
            db_timeout,
            shared
                .store
                .claim_after(sink, batch_size, lease, plugin.manifest().after.as_deref()),
        )
        .await,
    )?;
    shared.metrics.claimed(label, claimed.len(), batch_size);
    shared
        .metrics
        .received(label, claim_timer.elapsed().as_secs_f64(), claimed.len());
    if let Some(full) = full {
        let _ = full.send(claimed.len() >= batch_size as usize);
    }
    if claimed.is_empty() {
        return Ok(TurnReport::default());
    }
    drop(
        shared
            .telemetry
            .turn_call(TurnCall::Claim, sink, claimed.len(), &[], claim_started),
    );
    let (claimed, over_budget) = fit_bytes(claimed, plugin.manifest().limits.batch_bytes());
    let fitted = (!over_budget.is_empty()).then_some(claimed.len() as u32);
    if !over_budget.is_empty() {
        release(shared, label, &over_budget).await?;
    }
    let batch: Vec<Event> = claimed.iter().map(to_wit_event).collect();
    let (attempts, trace) = start_attempts(&shared.telemetry, sink, &claimed);
    let started = std::time::Instant::now();
    let outcomes = plugin.deliver_traced(&batch, trace).await;
    let seconds = started.elapsed().as_secs_f64();
    shared
        .metrics
        .attempt_duration
        .get_or_create(&SinkLabel {
            sink: label.to_string(),
        })
        .observe(seconds);
    let decided = decide(shared, target, sink, &claimed, outcomes);
    shared.metrics.processed(
        label,
        seconds,
        decided.failure.as_ref().map(failure_type).as_deref(),
    );
    let mut finishes = decided.finishes;
    hold_back_behind_failures(&claimed, &mut finishes);
    let notes = attempt_notes(
        &finishes,
        &decided.statuses,
        decided.failure.as_ref(),
        (seconds * 1000.0).round() as i64,
    );
    let links = end_attempts(attempts, &finishes, decided.failure.as_ref());
    // Every outcome of the batch in one transaction: one commit, not one
    // per delivery (each commit is an fsync, docs/measurements.md).
    let items: Vec<(i64, &str, &Finish)> = claimed
        .iter()
        .zip(&finishes)
        .map(|(c, f)| (c.delivery_id, c.lease_token.as_str(), f))
        .collect();
    let mut finish_span =
        shared
            .telemetry
            .turn_call(TurnCall::Finish, sink, items.len(), &links, None);
    let kept = finish_with_retries(&*shared.store, &items, &notes, db_timeout)
        .await
        .inspect_err(|e| {
            if let Some(span) = finish_span.as_mut() {
                span.fail("finish_failed", &e.to_string());
            }
        })?;
    drop(finish_span);
    for ((c, finish), kept) in claimed.iter().zip(&finishes).zip(kept) {
        record(shared, label, sink, c, finish, kept);
    }
    let delivered = finishes
        .iter()
        .filter(|f| matches!(f, Finish::Delivered))
        .count();
    let last_error = decided
        .failure
        .as_ref()
        .map(ToString::to_string)
        .or_else(|| {
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
        failure: decided.failure,
        shrink: decided.shrink,
        fitted,
    })
}

/// What a batch's plugin call decided.
struct Decided {
    /// One per claimed delivery, in order.
    finishes: Vec<Finish>,
    /// One per claimed delivery: the receiver's answer its sink's reason
    /// names ([`crate::store::attempt_status`]), read before the host
    /// wraps the reason (`rejected: …`, `retry window … used up`).
    statuses: Vec<Option<String>>,
    /// Why the batch failed as a whole, if it did.
    failure: Option<SinkFailure>,
    /// It ran out of its deadline or memory.
    shrink: bool,
}

/// Turn the plugin's answer into finishes by the sink's retry policy: its
/// outcomes one by one, or — when the batch failed as a whole (a trap,
/// `init` refusing) — a retry of every event.
fn decide(
    shared: &Shared,
    target: &Target,
    sink: &str,
    claimed: &[Claimed],
    outcomes: Result<Vec<Outcome>, SinkFailure>,
) -> Decided {
    let policy = &target.plugin.manifest().retry;
    let outcomes = match outcomes {
        Ok(outcomes) => outcomes,
        Err(failure) => {
            log_failure(sink, &failure, claimed.len());
            let mut shrink = false;
            if let SinkFailure::Trap { kind, .. } = &failure {
                shrink = failure.is_deadline() || failure.is_out_of_memory();
                shared
                    .metrics
                    .plugin_traps
                    .get_or_create(&TrapLabel {
                        plugin: target.plugin.name().to_string(),
                        kind: kind.to_string(),
                    })
                    .inc();
            }
            let reason = failure.to_string();
            return Decided {
                finishes: claimed
                    .iter()
                    .map(|c| retry::after_failure(policy, c, &reason, None))
                    .collect(),
                statuses: vec![None; claimed.len()],
                failure: Some(failure),
                shrink,
            };
        }
    };
    let (finishes, statuses) = claimed
        .iter()
        .zip(outcomes)
        .map(|(c, outcome)| match outcome {
            Outcome::Delivered => (Finish::Delivered, None),
            Outcome::Retry(info) => (
                retry::after_failure(
                    policy,
                    c,
                    &info.reason,
                    info.after_ms.map(Duration::from_millis),
                ),
                crate::store::attempt_status(&info.reason),
            ),
            Outcome::Reject(reason) => (
                retry::dead(policy, format!("rejected: {reason}")),
                crate::store::attempt_status(&reason),
            ),
        })
        .unzip();
    Decided {
        finishes,
        statuses,
        failure: None,
        shrink: false,
    }
}

/// Behind the first event of a stream that was not delivered, the rest of
/// that stream in this batch was not tried (the sink contract) and must
/// wait for it: give those leases back without charging an attempt. A
/// `delivered` the sink reported is kept: it did reach the target.
fn hold_back_behind_failures(claimed: &[Claimed], finishes: &mut [Finish]) {
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
}

/// What the host knows of each failed attempt of a batch, for the store
/// to record with its finish (`None` for a delivered or released one):
/// dead letters are `dead`; a batch that trapped is `timeout` (its
/// deadline) or `trap`; any other retry is `retry`. `duration_ms` is the
/// batch's plugin call.
fn attempt_notes(
    finishes: &[Finish],
    statuses: &[Option<String>],
    failure: Option<&SinkFailure>,
    duration_ms: i64,
) -> Vec<Option<AttemptNote>> {
    let retried = match failure {
        Some(f @ SinkFailure::Trap { .. }) if f.is_deadline() => AttemptOutcome::Timeout,
        Some(SinkFailure::Trap { .. }) => AttemptOutcome::Trap,
        Some(SinkFailure::Init(_)) | None => AttemptOutcome::Retry,
    };
    finishes
        .iter()
        .enumerate()
        .map(|(i, finish)| {
            let outcome = match finish {
                Finish::Retry { .. } => retried,
                Finish::Dead { .. } => AttemptOutcome::Dead,
                Finish::Delivered | Finish::Release => return None,
            };
            Some(AttemptNote {
                outcome,
                duration_ms: Some(duration_ms),
                status: statuses.get(i).cloned().flatten(),
            })
        })
        .collect()
}

/// Count and log one recorded finish (`kept`: the lease still held).
fn record(shared: &Shared, label: &str, sink: &str, c: &Claimed, finish: &Finish, kept: bool) {
    let metrics = &shared.metrics;
    let ev = &c.event.event;
    if !kept {
        metrics.delivery(label, "lease_lost");
        tracing::warn!(
            event_id = %ev.id, stream = %ev.stream, sink, attempt = c.attempts,
            "lease lost before the outcome was recorded; outcome dropped"
        );
        return;
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
    match finish {
        Finish::Delivered => {
            let now_ms = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
            let latency = (now_ms as i64 - c.event.ingested_at_ms).max(0) as f64 / 1000.0;
            metrics
                .delivery_latency
                .get_or_create(&SinkLabel {
                    sink: label.to_string(),
                })
                .observe(latency);
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

/// [`Store::finish_noted`], tried again after [`FINISH_RETRY_DELAYS`] when
/// it fails; each attempt bounded by `db_timeout`.
async fn finish_with_retries(
    store: &dyn Store,
    items: &[(i64, &str, &Finish)],
    notes: &[Option<AttemptNote>],
    db_timeout: Duration,
) -> Result<Vec<bool>, TurnError> {
    let mut delays = FINISH_RETRY_DELAYS.iter();
    loop {
        let attempt = tokio::time::timeout(db_timeout, store.finish_noted(items, notes)).await;
        let error = match TurnError::bounded(DbCall::Finish, db_timeout, attempt) {
            Ok(kept) => return Ok(kept),
            Err(error) => error,
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
/// without charging an attempt; counted under sink `label`.
async fn release(shared: &Shared, label: &str, claimed: &[Claimed]) -> Result<(), TurnError> {
    let db_timeout = shared.config.db_timeout;
    let items: Vec<(i64, &str, &Finish)> = claimed
        .iter()
        .map(|c| (c.delivery_id, c.lease_token.as_str(), &Finish::Release))
        .collect();
    let released = tokio::time::timeout(db_timeout, shared.store.finish_many(&items)).await;
    TurnError::bounded(DbCall::Release, db_timeout, released)?;
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

/// The attempt spans of a batch (one per claimed delivery, each a child
/// of its event's creation context; none with tracing off) and the
/// contexts the plugin propagates: each attempt's, or with tracing off
/// the event's creation context.
fn start_attempts(
    telemetry: &Telemetry,
    sink: &str,
    claimed: &[Claimed],
) -> (Vec<Option<SpanHandle>>, BatchTrace) {
    let mut spans = Vec::with_capacity(claimed.len());
    let mut contexts = std::collections::HashMap::new();
    for c in claimed {
        let ev = &c.event.event;
        let creation = TraceContext::of_extensions(&ev.extensions);
        let span = telemetry.attempt(sink, &ev.id, creation.as_ref(), c.attempts, claimed.len());
        let propagated = span.as_ref().map(SpanHandle::context).or(creation);
        if let Some(context) = propagated {
            contexts.insert(ev.id.clone(), context.traceparent);
        }
        spans.push(span);
    }
    let trace = BatchTrace {
        telemetry: telemetry.clone(),
        contexts: std::sync::Arc::new(contexts),
    };
    (spans, trace)
}

/// End each attempt span with its outcome (`outboxd.outcome`:
/// `delivered`, `retry`, `dead` or `released`, for an event not tried
/// behind a failed one) and, unless delivered, `error.type`; returns their
/// contexts, which the finish span links to.
fn end_attempts(
    spans: Vec<Option<SpanHandle>>,
    finishes: &[Finish],
    failure: Option<&SinkFailure>,
) -> Vec<TraceContext> {
    let mut links = Vec::new();
    for (span, finish) in spans.into_iter().zip(finishes) {
        let Some(mut span) = span else { continue };
        let (outcome, error) = match finish {
            Finish::Delivered => ("delivered", None),
            Finish::Retry { reason, .. } => ("retry", Some(reason.as_str())),
            Finish::Dead { reason, .. } => ("dead", Some(reason.as_str())),
            Finish::Release => ("released", None),
        };
        span.set("outboxd.outcome", outcome);
        if let Some(reason) = error {
            let error_type = match failure {
                Some(failure) => failure_type(failure),
                None if outcome == "dead" => "rejected".to_string(),
                None => "retryable".to_string(),
            };
            span.fail(&error_type, reason);
        }
        links.push(span.context());
        span.end();
    }
    links
}

/// `error.type` of a batch that failed as a whole: the trap's kind
/// (`deadline`, `out_of_memory`, …) or `init_refused`.
fn failure_type(failure: &SinkFailure) -> String {
    match failure {
        SinkFailure::Trap { kind, .. } => kind.to_string().replace(' ', "_"),
        SinkFailure::Init(_) => "init_refused".to_string(),
    }
}

/// The WIT view of a claimed delivery.
fn to_wit_event(c: &Claimed) -> Event {
    let ev = &c.event.event;
    let ingested_at = crate::rfc3339::format_ms(c.event.ingested_at_ms);
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
