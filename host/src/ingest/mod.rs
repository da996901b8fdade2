//! Ingest: events in from producers.
//!
//! Owns: the HTTP ingest and read API ([`http`]), the awareness-compatible
//! `POST /ingest` ([`awareness`]), their settings ([`settings`]), and
//! [`submit`], the one path by which events reach the store — the HTTP API
//! and every configured source (`crate::sources`) go through it. The
//! acknowledgement is sent only after the store committed.
//!
//! Must never: acknowledge before commit, store part of a refused request,
//! or answer bad input with a 5xx.

pub mod awareness;
pub mod http;
pub mod settings;

use crate::event::NewEvent;
use crate::metrics::Metrics;
use crate::otel::{SpanHandle, Telemetry, TraceContext};
use crate::routing::Router;
use crate::store::{IngestError, IngestItem, Ingested, Store};

/// Route `events`, store them with their deliveries in one transaction
/// (all or nothing, idempotent on id: see [`Store::ingest`]), count the
/// stored and duplicate ones in `outboxd_events_ingested`, and wake the
/// delivery loops of the keys that got a delivery.
///
/// Errors: [`IngestError`] as the store reports it; nothing was stored.
pub async fn submit(
    store: &dyn Store,
    routes: &Router,
    wake: &crate::wakeups::Wakeups,
    metrics: &Metrics,
    events: Vec<NewEvent>,
) -> Result<Vec<Ingested>, IngestError> {
    submit_as(store, routes, wake, metrics, events, None).await
}

/// [`submit`] for events an authenticated producer posted: `producer`
/// (its name, [`crate::auth`]) is stored with each event, and the events
/// stored are counted in `outboxd_producer_events_total{producer}`.
pub async fn submit_as(
    store: &dyn Store,
    routes: &Router,
    wake: &crate::wakeups::Wakeups,
    metrics: &Metrics,
    events: Vec<NewEvent>,
    producer: Option<&str>,
) -> Result<Vec<Ingested>, IngestError> {
    let items: Vec<IngestItem> = events
        .into_iter()
        .map(|event| {
            let sinks = routes.sinks_for(&event);
            IngestItem {
                event,
                sinks,
                producer: producer.map(str::to_string),
            }
        })
        .collect();
    let started = std::time::Instant::now();
    let results = store.ingest(&items).await;
    let seconds = started.elapsed().as_secs_f64();
    let results = results.inspect_err(|_| metrics.sent(seconds, true, 0))?;
    // Wake only the loops of the keys that got a delivery.
    wake.keys(
        items
            .iter()
            .zip(&results)
            .filter(|(_, r)| !r.duplicate)
            .flat_map(|(i, _)| i.sinks.iter().map(String::as_str)),
    );
    let duplicates = results.iter().filter(|r| r.duplicate).count() as u64;
    let stored = results.len() as u64 - duplicates;
    metrics.sent(seconds, false, stored);
    metrics.ingested("stored", stored);
    metrics.ingested("duplicate", duplicates);
    if let Some(producer) = producer {
        metrics
            .producer_events
            .get_or_create(&crate::metrics::ProducerLabel {
                producer: producer.to_string(),
            })
            .inc_by(stored);
    }
    Ok(results)
}

/// The trace context of events about to be submitted through `endpoint`
/// (`/v1/events`, `/ingest`, `source:NAME`): each event without a
/// `traceparent` extension of its own takes the transport's (`transport`:
/// the request's headers, a message's, an outbox property), and, with
/// tracing on, the ingest span is started as a child of `transport` —
/// an event that still has no context then takes the span's, so its
/// deliveries join the trace outboxd began. The caller keeps the span
/// until the store answered (dropping it ends it).
pub fn trace_ingest(
    telemetry: &Telemetry,
    endpoint: &str,
    transport: Option<&TraceContext>,
    events: &mut [NewEvent],
) -> Option<SpanHandle> {
    for event in events.iter_mut() {
        crate::otel::context::adopt(&mut event.extensions, transport);
    }
    if !telemetry.is_on() {
        return None;
    }
    let own: Vec<(&str, Option<TraceContext>)> = events
        .iter()
        .map(|e| (e.id.as_str(), TraceContext::of_extensions(&e.extensions)))
        .collect();
    let span = telemetry.ingest(endpoint, transport, &own)?;
    let context = span.context();
    for event in events.iter_mut() {
        crate::otel::context::adopt(&mut event.extensions, Some(&context));
    }
    Some(span)
}

/// `error.type` of a refused ingest, for its span.
pub fn error_type(e: &IngestError) -> &'static str {
    match e {
        IngestError::Conflict { .. } => "conflict",
        IngestError::SequenceNotIncreasing { .. } => "sequence_not_increasing",
        IngestError::Store(_) => "store_unavailable",
    }
}
