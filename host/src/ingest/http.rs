//! `POST /v1/events` and `GET /v1/events/{id}`.
//!
//! Owns: content types (`application/cloudevents+json` for one event,
//! `application/cloudevents-batch+json` for an array), the body size and
//! batch item limits, and mapping every refusal to a 4xx with a JSON body
//! `{"error": "...", "field": "..."}` naming what was wrong.
//!
//! Batches are all-or-nothing: one transaction per request. If any item is
//! invalid or conflicts, nothing of the request is stored and the error
//! names the item (`[3].id`).
//!
//! Every request passes the producer gate first ([`crate::auth::Gate`]):
//! who posts (401 `unauthorized`), then, once the body is parsed, whether
//! each event is inside the producer's scope (403 `out-of-scope`, naming
//! the event and attribute) and within its rate (429 `rate-limited` with
//! `Retry-After`). Every refusal carries a stable `code` and is counted in
//! `outboxd_requests_refused_total{endpoint="events"}`.
//!
//! Must never: answer before the commit, or with a 5xx for bad input (a
//! store failure is 503: the producer should retry; its `cause` says
//! `storage-full` when the database's disk is full); store anything of a
//! request the gate refused.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::json;

use super::settings::IngestConfig;
use crate::event::{self, DataFormat, EventError};
use crate::metrics::Metrics;
use crate::routing::Router as Routes;
use crate::store::{IngestError, Store};

/// What the ingest handlers need.
#[derive(Clone)]
pub struct IngestState {
    /// The durable store.
    pub store: Arc<dyn Store>,
    /// The routing table.
    pub routes: Arc<Routes>,
    /// The `[ingest]` limits.
    pub limits: IngestConfig,
    /// Woken after every commit that queued deliveries.
    pub wake: Arc<crate::wakeups::Wakeups>,
    /// The Prometheus registry.
    pub metrics: Arc<Metrics>,
    /// Who may post: producer tokens, scopes and rates.
    pub gate: Arc<crate::auth::Gate>,
    /// The tracer: a span per ingest request when on.
    pub telemetry: crate::otel::Telemetry,
}

/// The ingest and read routes.
pub fn router(state: IngestState) -> Router {
    Router::new()
        .route("/v1/events", post(post_events))
        .route("/v1/events/{id}", get(get_event))
        .with_state(state)
}

/// An error answer, `{"error": "...", "code": "...", "field": "..."}`
/// (the field at fault when there is one; the code from [`code_for`]);
/// the shape both ingest endpoints answer with.
pub(crate) fn error(
    status: StatusCode,
    field: Option<&str>,
    message: impl Into<String>,
) -> Response {
    let mut body = json!({ "error": message.into(), "code": code_for(status) });
    if let Some(field) = field {
        body["field"] = json!(field);
    }
    (status, Json(body)).into_response()
}

/// The stable error code of an ingest answer with `status` (the gate's
/// refusals carry their own, [`crate::auth::Refusal::code`]).
pub(crate) fn code_for(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid-event",
        401 => "unauthorized",
        404 => "not-found",
        409 => "conflict",
        413 => "too-large",
        415 => "unsupported-media-type",
        429 => "rate-limited",
        503 => "store-unavailable",
        _ => "refused",
    }
}

/// The answer to a request the producer gate refused (`endpoint` names
/// the route in `outboxd_requests_refused_total`): its status, `{"error",
/// "code", "field"}`, `WWW-Authenticate: Bearer` on 401 (RFC 6750 §3) and
/// `Retry-After` on 429 (RFC 9110 §10.2.3).
pub(crate) fn gate_refusal(
    metrics: &Metrics,
    endpoint: &str,
    refusal: &crate::auth::Refusal,
    producer: Option<&str>,
) -> Response {
    metrics.refused(endpoint, refusal.reason());
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN);
    let mut body = json!({ "error": refusal.message(producer), "code": refusal.code() });
    if let Some(field) = refusal.field() {
        body["field"] = json!(field);
    }
    let mut response = (status, Json(body)).into_response();
    let headers = response.headers_mut();
    match refusal {
        crate::auth::Refusal::Unauthenticated(_) => {
            headers.insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        crate::auth::Refusal::RateLimited { retry_after, .. } => {
            let secs = crate::auth::gate::retry_after_secs(*retry_after);
            headers.insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        crate::auth::Refusal::OutOfScope { .. } => {}
    }
    response
}

/// 400 naming the attribute at fault.
pub(crate) fn bad_event(e: EventError) -> Response {
    error(StatusCode::BAD_REQUEST, Some(&e.field), e.to_string())
}

async fn post_events(State(state): State<IngestState>, headers: HeaderMap, body: Body) -> Response {
    // Who posts, before the body is parsed.
    let principal = match state
        .gate
        .authenticate(&headers, crate::auth::gate::now_ms())
    {
        Ok(p) => p,
        Err(refusal) => {
            // The body is read (up to the ingest limit) and dropped before
            // the answer: an HTTP/2 server that answers first resets the
            // stream, and clients such as curl then lose the 401.
            let _ = axum::body::to_bytes(body, state.limits.max_body_bytes).await;
            return gate_refusal(&state.metrics, "events", &refusal, None);
        }
    };
    let response = post_events_inner(&state, headers, body, principal.as_ref()).await;
    let outcome = match response.status() {
        StatusCode::CONFLICT => Some("conflict"),
        s if s.is_client_error() => Some("rejected"),
        _ => None,
    };
    if let Some(outcome) = outcome {
        state.metrics.ingested(outcome, 1);
    }
    response
}

async fn post_events_inner(
    state: &IngestState,
    headers: HeaderMap,
    body: Body,
    principal: Option<&crate::auth::Principal>,
) -> Response {
    let batch = match is_batch(&headers) {
        Ok(batch) => batch,
        Err(message) => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some("content-type"),
                message,
            )
        }
    };
    let limit = state.limits.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                Some("body"),
                format!("request body is over the limit of {limit} bytes (ingest.max-body-bytes)"),
            )
        }
    };
    let events = match parse_events(state, batch, &bytes) {
        Ok(events) => events,
        Err(refused) => return *refused,
    };
    // An empty batch is a valid batch (CloudEvents JSON format §4, "JSON
    // Batch Format"): nothing to store, nothing stored.
    if batch && events.is_empty() {
        return (StatusCode::OK, Json(json!({ "events": [] }))).into_response();
    }
    if let Some(principal) = principal {
        if let Err(refusal) = state.gate.admit(principal, &events, bytes.len(), batch) {
            return gate_refusal(&state.metrics, "events", &refusal, Some(&principal.name));
        }
    }
    let producer = principal.map(|p| p.name.as_str());
    let mut events = events;
    let transport = transport_context(&headers);
    let mut span = super::trace_ingest(
        &state.telemetry,
        "/v1/events",
        transport.as_ref(),
        &mut events,
    );
    let submitted = super::submit_as(
        &*state.store,
        &state.routes,
        &state.wake,
        &state.metrics,
        events,
        producer,
    )
    .await;
    if let (Some(span), Err(e)) = (span.as_mut(), &submitted) {
        span.fail(super::error_type(e), &e.to_string());
    }
    drop(span);
    match submitted {
        Ok(results) => {
            let created = results.iter().any(|r| !r.duplicate);
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            if batch {
                (status, Json(json!({ "events": results }))).into_response()
            } else {
                (status, Json(json!(results[0]))).into_response()
            }
        }
        Err(e) => refusal(e, batch),
    }
}

/// The W3C trace context of a request: its `traceparent` and
/// `tracestate` headers (ignored when malformed, W3C Trace Context
/// §3.2.2.1; several `tracestate` lines joined by `,`, §3.3.1.1).
pub(crate) fn transport_context(headers: &HeaderMap) -> Option<crate::otel::TraceContext> {
    let traceparent = headers
        .get(crate::otel::context::TRACEPARENT)?
        .to_str()
        .ok()?;
    let states: Vec<&str> = headers
        .get_all(crate::otel::context::TRACESTATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let tracestate = (!states.is_empty()).then(|| states.join(","));
    crate::otel::TraceContext::from_parts(Some(traceparent), tracestate.as_deref())
}

/// The events of a request body: one event, or a batch (`batch`) of at
/// most `ingest.max-batch-items`. `Err` the 400 naming the attribute at
/// fault, or the 413 of a batch over the limit.
fn parse_events(
    state: &IngestState,
    batch: bool,
    bytes: &[u8],
) -> Result<Vec<crate::event::NewEvent>, Box<Response>> {
    let events = if batch {
        event::parse_batch(bytes).map_err(|e| Box::new(bad_event(e)))?
    } else {
        vec![event::parse_one(bytes).map_err(|e| Box::new(bad_event(e)))?]
    };
    if batch && events.len() > state.limits.max_batch_items {
        return Err(Box::new(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("body"),
            format!(
                "batch has {} events, over the limit of {} (ingest.max-batch-items)",
                events.len(),
                state.limits.max_batch_items
            ),
        )));
    }
    Ok(events)
}

/// Whether the request is a batch, by its content type; for any other
/// content type, why it is refused (naming the accepted ones).
fn is_batch(headers: &HeaderMap) -> Result<bool, String> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match content_type.as_deref() {
        Some("application/cloudevents+json") => Ok(false),
        Some("application/cloudevents-batch+json") => Ok(true),
        other => Err(format!(
            "content-type {} is not accepted: use application/cloudevents+json (one event) or \
                     application/cloudevents-batch+json (a JSON array of events)",
            other
                .map(|o| format!("{o:?}"))
                .unwrap_or_else(|| "(missing)".into())
        )),
    }
}

/// The answer to a request the store refused as a whole: 409 naming the
/// item and attribute at fault, or 503 ([`store_unavailable`]).
fn refusal(e: IngestError, batch: bool) -> Response {
    match e {
        e @ IngestError::Conflict { .. } => {
            let IngestError::Conflict {
                index, attributes, ..
            } = &e
            else {
                unreachable!()
            };
            let field = if batch {
                format!("[{index}].{}", attributes.join(","))
            } else {
                attributes.join(",")
            };
            let mut body = json!({
                "error": e.to_string(), "code": "conflict", "field": field, "attributes": attributes
            });
            if !batch {
                body["error"] = json!(e.to_string().replacen("event [0] ", "event ", 1));
            }
            (StatusCode::CONFLICT, Json(body)).into_response()
        }
        e @ IngestError::SequenceNotIncreasing { .. } => {
            let IngestError::SequenceNotIncreasing { index, .. } = &e else {
                unreachable!()
            };
            let field = if batch {
                format!("[{index}].sequence")
            } else {
                "sequence".to_string()
            };
            error(StatusCode::CONFLICT, Some(&field), e.to_string())
        }
        IngestError::Store(e) => {
            tracing::error!("ingest failed: {e}");
            store_unavailable(&e)
        }
    }
}

/// 503 for a store that could not take the request (nothing of it was
/// stored; the producer should retry): `{"error": "...", "cause": ...}`,
/// the cause `"storage-full"` when the database's disk is full
/// ([`crate::store::StoreError::is_storage_full`]), else `"store"`.
pub(crate) fn store_unavailable(e: &crate::store::StoreError) -> Response {
    let (cause, message) = if e.is_storage_full() {
        (
            "storage-full",
            format!(
                "storage full: the disk holding the database has no space left, nothing stored; \
                 retry once space is freed ({e})"
            ),
        )
    } else {
        ("store", format!("store unavailable, nothing stored: {e}"))
    };
    let body = json!({ "error": message, "code": "store-unavailable", "cause": cause });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn get_event(
    State(state): State<IngestState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    // The same gate as posting; a producer reads only the events it posted
    // (another's is "not found", so ids are not probed across producers).
    let principal = match state
        .gate
        .authenticate(&headers, crate::auth::gate::now_ms())
    {
        Ok(p) => p,
        Err(refusal) => return gate_refusal(&state.metrics, "events", &refusal, None),
    };
    let producer = match state.store.event_producer(&id).await {
        Ok(p) => p,
        Err(e) => return store_unavailable(&e),
    };
    let hidden = principal.is_some_and(|p| producer.as_deref() != Some(p.name.as_str()));
    let found = if hidden {
        Ok(None)
    } else {
        state.store.event(&id).await
    };
    match found {
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            Some("id"),
            format!("no event with id {id:?}"),
        ),
        Ok(Some((stored, deliveries))) => {
            let ev = &stored.event;
            let mut body = json!({
                "specversion": "1.0",
                "id": ev.id,
                "source": ev.source,
                "type": ev.ty,
                "partitionkey": ev.stream,
                "sequence": stored.sequence,
                "ingested_at_ms": stored.ingested_at_ms,
            });
            for (k, v) in [
                ("subject", &ev.subject),
                ("time", &ev.time),
                ("datacontenttype", &ev.datacontenttype),
                ("dataschema", &ev.dataschema),
            ] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            for (k, v) in &ev.extensions {
                body[k] = json!(v);
            }
            match ev.data_format {
                DataFormat::Json => {
                    body["data"] =
                        serde_json::from_slice(&ev.data).unwrap_or(serde_json::Value::Null)
                }
                DataFormat::Text => body["data"] = json!(String::from_utf8_lossy(&ev.data)),
                DataFormat::Binary => {
                    body["data_base64"] =
                        json!(base64::engine::general_purpose::STANDARD.encode(&ev.data))
                }
                DataFormat::None => {}
            }
            Json(json!({ "event": body, "producer": producer, "deliveries": deliveries }))
                .into_response()
        }
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            format!("store unavailable: {e}"),
        ),
    }
}
