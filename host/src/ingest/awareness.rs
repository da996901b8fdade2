//! The awareness-compatible ingest: `POST /ingest` as the awareness
//! service answers it, so the eVaults' outbox dispatchers (and any other
//! producer of that service) can point at outboxd unchanged.
//!
//! Owns (its settings, [`AwarenessIngestConfig`], are in
//! [`super::settings`]): the shared-secret check (`x-ingest-secret`, compared in constant time),
//! the awareness body's validation (a `400` naming the field), its mapping
//! onto a CloudEvent ([`to_event`]; the table is in
//! `docs/awareness-ingest.md`), and the service's answers (`200 {ok,
//! packetId, eventId, duplicate, deliveriesQueued}`, `401`, `409`, `503`).
//!
//! Every event goes through [`super::submit`], the one path into the store:
//! idempotent on the event id (same content → a duplicate success, other
//! content → `409`), one transaction with its deliveries, acknowledged only
//! after the commit. There is no deduplication by content: A → B → A on one
//! packet is three events with three ids.
//!
//! Must never: log or echo the secret, store anything for a request whose
//! secret is wrong or whose body is refused, derive an event id from the
//! content (that would collapse A → B → A), or answer bad input with a 5xx.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::http::IngestState;
use super::settings::IngestConfig;
use crate::event::{EventError, NewEvent};
use crate::store::IngestError;
// Errors in the service's shape, `{"error"}` with the field at fault, as
// `POST /v1/events` answers.
use super::http::{bad_event as bad_field, error};

/// The header carrying the shared secret (the awareness service's
/// `IngestController`: `req.header("x-ingest-secret")`).
pub const SECRET_HEADER: &str = "x-ingest-secret";

pub use super::settings::{AwarenessIngestConfig, DEFAULT_PATH};

/// First part of every mapped event's `type`:
/// `awareness.<schemaId>.<operation>`.
pub const TYPE_PREFIX: &str = "awareness";

/// The `operation` the service assumes when a body has none
/// (`IngestService`: `payload.operation ?? "create"`).
pub const DEFAULT_OPERATION: &str = "create";

/// The operations the service's `AwarenessPayload` type allows.
pub const OPERATIONS: &[&str] = &["create", "update", "delete"];

/// The body fields the service reads (`AwarenessPayload` and the eVault
/// dispatcher's POST). Any other field is refused with `400`.
pub const FIELDS: &[&str] = &[
    "eventId",
    "id",
    "w3id",
    "evaultPublicKey",
    "data",
    "schemaId",
    "operation",
    "requestingPlatform",
    "occurredAt",
    "streamVersion",
];

/// What the handler needs: the ingest path and the secret's digest.
#[derive(Clone)]
struct AwarenessState {
    ingest: IngestState,
    /// SHA-256 of the resolved secret: comparing digests in constant time
    /// hides the secret's length as well as its bytes.
    secret_digest: Arc<[u8; 32]>,
}

/// The awareness route, when `[ingest.awareness]` is configured and
/// enabled; an empty router otherwise (merged as is).
///
/// Errors: the secret cannot be resolved (its variable named), a message
/// for the start-up error.
pub fn router(config: &IngestConfig, state: IngestState) -> Result<Router, String> {
    let Some(awareness) = config.awareness.as_ref().filter(|a| a.enabled) else {
        return Ok(Router::new());
    };
    let secret = awareness
        .resolved_secret()
        .map_err(|e| format!("configuration key `ingest.awareness.secret`: {e}"))?;
    let secret_digest = Arc::new(Sha256::digest(secret.as_bytes()).into());
    tracing::info!(path = %awareness.path, "awareness-compatible ingest mounted");
    Ok(Router::new()
        .route(&awareness.path, post(post_ingest))
        .with_state(AwarenessState {
            ingest: state,
            secret_digest,
        }))
}

async fn post_ingest(
    State(state): State<AwarenessState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let response = post_ingest_inner(&state, &headers, body).await;
    // Counted as `POST /v1/events` counts them; stored and duplicate
    // events are counted by `submit`.
    let outcome = match response.status() {
        StatusCode::CONFLICT => Some("conflict"),
        s if s.is_client_error() => Some("rejected"),
        _ => None,
    };
    if let Some(outcome) = outcome {
        state.ingest.metrics.ingested(outcome, 1);
    }
    response
}

/// Whether `headers` carry the configured secret. Constant time over the
/// digests; a missing or non-text header is a mismatch.
fn secret_matches(state: &AwarenessState, headers: &HeaderMap) -> bool {
    let Some(given) = headers.get(SECRET_HEADER) else {
        return false;
    };
    let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
    given.ct_eq(&*state.secret_digest).into()
}

/// Who posts a request with `headers`: `Ok(Some)` a producer by its token,
/// `Ok(None)` a producer of the service by its shared secret; `Err` the
/// refusal to answer (counted). A producer token (`Authorization: Bearer
/// obx_…`) may stand in for the shared secret and is checked by the same
/// gate as `POST /v1/events` (a wrong one is refused, never tried as a
/// secret); any other `Authorization` a producer of the service sends is
/// left alone.
fn who_posts(
    state: &AwarenessState,
    headers: &HeaderMap,
) -> Result<Option<crate::auth::Principal>, Box<Response>> {
    let bearer_token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .is_some_and(|(scheme, token)| {
            scheme.eq_ignore_ascii_case("bearer")
                && token
                    .trim_start_matches(' ')
                    .starts_with(crate::auth::token::PREFIX)
        });
    if bearer_token {
        let gate = &state.ingest.gate;
        return gate
            .authenticate(headers, crate::auth::gate::now_ms())
            .map_err(|refusal| {
                Box::new(super::http::gate_refusal(
                    &state.ingest.metrics,
                    "awareness",
                    &refusal,
                    None,
                ))
            });
    }
    if secret_matches(state, headers) {
        return Ok(None);
    }
    state
        .ingest
        .metrics
        .refused("awareness", "invalid-ingest-secret");
    // The service's answer (`IngestController`): 401 "invalid ingest
    // secret", for a missing header as for a wrong one.
    Err(Box::new(error(
        StatusCode::UNAUTHORIZED,
        Some(SECRET_HEADER),
        "invalid ingest secret",
    )))
}

async fn post_ingest_inner(state: &AwarenessState, headers: &HeaderMap, body: Body) -> Response {
    let limit = state.ingest.limits.max_body_bytes;
    let principal = match who_posts(state, headers) {
        Ok(p) => p,
        Err(refused) => {
            // Read (and drop) the body first, as `POST /v1/events` does:
            // an HTTP/2 answer before it resets the stream.
            let _ = axum::body::to_bytes(body, limit).await;
            return *refused;
        }
    };
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
    let mapped = match to_event(&bytes, || uuid::Uuid::now_v7().to_string()) {
        Ok(m) => m,
        Err(e) => return bad_field(e),
    };
    let packet_id = mapped.event.stream.clone();
    let event_id = mapped.event.id.clone();
    let events = vec![mapped.event];
    if let Some(principal) = &principal {
        if let Err(refusal) = state
            .ingest
            .gate
            .admit(principal, &events, bytes.len(), false)
        {
            return super::http::gate_refusal(
                &state.ingest.metrics,
                "awareness",
                &refusal,
                Some(&principal.name),
            );
        }
    }
    let mut events = events;
    let transport = super::http::transport_context(headers);
    let mut span = super::trace_ingest(
        &state.ingest.telemetry,
        "awareness",
        transport.as_ref(),
        &mut events,
    );
    let submitted = super::submit_as(
        &*state.ingest.store,
        &state.ingest.routes,
        &state.ingest.wake,
        &state.ingest.metrics,
        events,
        principal.as_ref().map(|p| p.name.as_str()),
    )
    .await;
    if let (Some(span), Err(e)) = (span.as_mut(), &submitted) {
        span.fail(super::error_type(e), &e.to_string());
    }
    drop(span);
    answer(submitted, &packet_id, &event_id)
}

/// The service's answer to a submitted body of packet `packet_id` and
/// event `event_id`: `200 {ok, packetId, eventId, duplicate,
/// deliveriesQueued}`, `409` naming what differs or the version that does
/// not advance, `503` when the store failed.
fn answer(
    submitted: Result<Vec<crate::store::Ingested>, IngestError>,
    packet_id: &str,
    event_id: &str,
) -> Response {
    match submitted {
        Ok(results) => {
            let r = &results[0];
            (
                StatusCode::OK,
                Json(json!({
                    "ok": true,
                    "packetId": packet_id,
                    "eventId": event_id,
                    "duplicate": r.duplicate,
                    "deliveriesQueued": r.deliveries_queued,
                })),
            )
                .into_response()
        }
        Err(IngestError::Conflict { attributes, .. }) => {
            let fields = awareness_fields(&attributes);
            // The service's `EventIdConflictError` message, and the fields
            // that differ from the stored event.
            let body = json!({
                "error": format!(
                    "eventId {event_id} was already used for a different event (differs in: {})",
                    fields.join(", ")
                ),
                "field": "eventId",
                "attributes": fields,
            });
            (StatusCode::CONFLICT, Json(body)).into_response()
        }
        Err(IngestError::SequenceNotIncreasing { given, last, .. }) => error(
            StatusCode::CONFLICT,
            Some("streamVersion"),
            format!(
                "streamVersion {given} does not advance packet {packet_id:?} (its last version is {last}); nothing stored"
            ),
        ),
        Err(IngestError::Store(e)) => {
            tracing::error!("awareness ingest failed: {e}");
            super::http::store_unavailable(&e)
        }
    }
}

/// An awareness body mapped onto an event.
#[derive(Debug, Clone)]
pub struct Mapped {
    /// The event the body maps to.
    pub event: NewEvent,
    /// True when the body had no `eventId` and one was generated.
    pub generated_id: bool,
}

fn field_error(field: &str, problem: impl Into<String>) -> EventError {
    EventError {
        field: field.to_string(),
        problem: problem.into(),
    }
}

/// The body field a CloudEvents attribute of the mapped event comes from,
/// for errors and conflicts (`partitionkey` → `id`, `sequence` →
/// `streamVersion`, ...). `None` for attributes derived from fields named
/// elsewhere (`source`, `type`, `datacontenttype`).
fn awareness_field(attribute: &str) -> Option<&'static str> {
    Some(match attribute {
        "id" => "eventId",
        "partitionkey" => "id",
        "sequence" => "streamVersion",
        "time" => "occurredAt",
        "data" => "data",
        "w3id" | "extensions.w3id" => "w3id",
        "evaultpublickey" | "extensions.evaultpublickey" => "evaultPublicKey",
        "schemaid" | "extensions.schemaid" => "schemaId",
        "operation" | "extensions.operation" => "operation",
        "requestingplatform" | "extensions.requestingplatform" => "requestingPlatform",
        "event" => "body",
        _ => return None,
    })
}

/// The body fields behind differing CloudEvents attributes, in order,
/// without repeats.
fn awareness_fields(attributes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in attributes {
        if let Some(f) = awareness_field(a) {
            if !out.iter().any(|o| o == f) {
                out.push(f.to_string());
            }
        }
    }
    if out.is_empty() {
        out.push("content".to_string());
    }
    out
}

/// Percent-encode `s` for a URN's namespace-specific string: unreserved
/// characters and `@` stay, every other byte becomes `%XX` (RFC 3986 §2.1).
fn urn_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Map an awareness body (JSON text) onto an event, validating every field
/// the service reads; `new_id` makes the event id when the body has no
/// `eventId`.
///
/// The mapping (the contract the `awareness` sink and the webhook's
/// awareness payload mode read back):
///
/// | event | from the body |
/// |---|---|
/// | `id` | `eventId` (absent: `new_id()`, a UUIDv7) |
/// | stream (`partitionkey`) | `id`, the packet (MetaEnvelope) id |
/// | `sequence` | `streamVersion`, when given; else assigned |
/// | `time` | `occurredAt`, when given (RFC 3339) |
/// | `type` | `awareness.<schemaId>.<operation>` (`operation` absent: `create`) |
/// | `source` | `urn:awareness:<w3id>` (percent-encoded), `urn:awareness` without `w3id` |
/// | `datacontenttype` | `application/json` |
/// | `data` | `data`, JSON as given; `null` or absent: no data |
/// | extensions | `w3id`, `evaultpublickey`, `schemaid`, `operation`, `requestingplatform`, each only when given and not `null` |
///
/// Errors name the body field: a body that is not a JSON object (`body`),
/// `id` or `schemaId` missing or empty, a field of the wrong JSON type, an
/// `operation` outside create/update/delete, an `occurredAt` that is not
/// RFC 3339, a `streamVersion` that is not a whole number ≥ 1, a field the
/// service does not read, or any rule of the CloudEvents ingest (NUL
/// characters, lengths) under the field's name.
pub fn to_event(body: &[u8], new_id: impl FnOnce() -> String) -> Result<Mapped, EventError> {
    let fields = body_fields(body)?;
    let packet = Packet::read(&fields, new_id)?;
    let raw = packet.cloudevent()?;
    let event = NewEvent::from_json(&raw).map_err(|e| EventError {
        field: awareness_field(&e.field)
            .map(str::to_string)
            .unwrap_or_else(|| match e.field.as_str() {
                // `source` is built from `w3id`, `type` from `schemaId`.
                "source" => "w3id".to_string(),
                "type" => "schemaId".to_string(),
                other => other.to_string(),
            }),
        problem: e.problem,
    })?;
    Ok(Mapped {
        event,
        generated_id: packet.generated_id,
    })
}

/// The body's fields, each as its raw JSON. Errors: a body that is not a
/// JSON object (saying whether it is JSON at all), or a field the service
/// does not read.
fn body_fields(
    body: &[u8],
) -> Result<std::collections::BTreeMap<String, Box<RawValue>>, EventError> {
    let fields: std::collections::BTreeMap<String, Box<RawValue>> = serde_json::from_slice(body)
        .map_err(
            |e| match serde_json::from_slice::<serde_json::Value>(body) {
                Ok(_) => field_error("body", "must be a JSON object (the awareness payload)"),
                Err(_) => field_error("body", format!("is not valid JSON: {e}")),
            },
        )?;
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(field_error(
            unknown,
            format!(
                "is not a field of the awareness payload (accepted: {})",
                FIELDS.join(", ")
            ),
        ));
    }
    Ok(fields)
}

/// An awareness body, read and checked field by field.
struct Packet {
    packet: String,
    schema_id: String,
    event_id: String,
    generated_id: bool,
    w3id: Option<String>,
    evault_public_key: Option<String>,
    requesting_platform: Option<String>,
    operation: Option<String>,
    occurred_at: Option<String>,
    stream_version: Option<serde_json::Value>,
    data: Option<String>,
}

impl Packet {
    /// Read `fields`; `new_id` gives the event id when the body has none.
    /// Errors name the field.
    fn read(
        fields: &std::collections::BTreeMap<String, Box<RawValue>>,
        new_id: impl FnOnce() -> String,
    ) -> Result<Packet, EventError> {
        let value = |name: &str| -> Option<serde_json::Value> {
            fields
                .get(name)
                .and_then(|raw| serde_json::from_str(raw.get()).ok())
                .filter(|v: &serde_json::Value| !v.is_null())
        };
        // A string field: absent or null → None; another JSON type → 400.
        let text = |name: &str| -> Result<Option<String>, EventError> {
            match value(name) {
                None => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s)),
                Some(other) => Err(field_error(
                    name,
                    format!("must be a string, got {}", json_type(&other)),
                )),
            }
        };
        // Required as the service requires them (`!body?.id || !body?.schemaId`).
        let required = |name: &str, what: &str| -> Result<String, EventError> {
            match text(name)? {
                Some(s) if !s.is_empty() => Ok(s),
                _ => Err(field_error(
                    name,
                    format!(
                        "is required ({what}; the service answers \"id and schemaId are required\")"
                    ),
                )),
            }
        };
        let packet = required("id", "the packet's MetaEnvelope id")?;
        let schema_id = required("schemaId", "the ontology id")?;
        let (event_id, generated_id) = match text("eventId")? {
            Some(id) if id.is_empty() => {
                return Err(field_error(
                    "eventId",
                    "must not be empty when given; leave it out to have one generated",
                ))
            }
            Some(id) => (id, false),
            None => (new_id(), true),
        };
        let w3id = text("w3id")?;
        let evault_public_key = text("evaultPublicKey")?;
        let requesting_platform = text("requestingPlatform")?;
        let operation = text("operation")?;
        if let Some(op) = &operation {
            if !OPERATIONS.contains(&op.as_str()) {
                return Err(field_error(
                    "operation",
                    format!("must be one of {}, got {op:?}", OPERATIONS.join(", ")),
                ));
            }
        }
        let occurred_at = text("occurredAt")?;
        if let Some(t) = &occurred_at {
            crate::rfc3339::parse_ms(t).map_err(|_| {
                field_error(
                    "occurredAt",
                    format!("must be an ISO 8601 / RFC 3339 timestamp such as \"2026-12-01T10:00:00.000Z\", got {t:?}"),
                )
            })?;
        }
        Ok(Packet {
            packet,
            schema_id,
            event_id,
            generated_id,
            w3id,
            evault_public_key,
            requesting_platform,
            operation,
            occurred_at,
            stream_version: stream_version(value("streamVersion"))?,
            data: object_data(fields.get("data").map(|raw| &**raw))?,
        })
    }

    /// The CloudEvent (JSON format) the packet maps to, by the table in
    /// docs/awareness-ingest.md. The data goes in as its own JSON text, so
    /// it is stored as given (key order and all); the attributes around it
    /// are ours.
    fn cloudevent(&self) -> Result<Box<RawValue>, EventError> {
        let source = match &self.w3id {
            Some(w) => format!("urn:{TYPE_PREFIX}:{}", urn_encode(w)),
            None => format!("urn:{TYPE_PREFIX}"),
        };
        let ty = format!(
            "{TYPE_PREFIX}.{}.{}",
            self.schema_id,
            self.operation.as_deref().unwrap_or(DEFAULT_OPERATION)
        );
        let mut ce = serde_json::Map::new();
        ce.insert("specversion".into(), json!("1.0"));
        ce.insert("id".into(), json!(self.event_id));
        ce.insert("source".into(), json!(source));
        ce.insert("type".into(), json!(ty));
        ce.insert("partitionkey".into(), json!(self.packet));
        ce.insert("datacontenttype".into(), json!("application/json"));
        if let Some(v) = &self.stream_version {
            ce.insert("sequence".into(), v.clone());
        }
        if let Some(t) = &self.occurred_at {
            ce.insert("time".into(), json!(t));
        }
        ce.insert("schemaid".into(), json!(self.schema_id));
        for (name, v) in [
            ("w3id", &self.w3id),
            ("evaultpublickey", &self.evault_public_key),
            ("operation", &self.operation),
            ("requestingplatform", &self.requesting_platform),
        ] {
            if let Some(v) = v {
                ce.insert(name.into(), json!(v));
            }
        }
        let mut text =
            serde_json::to_string(&serde_json::Value::Object(ce)).expect("a JSON map serialises");
        if let Some(data) = &self.data {
            text.pop(); // the closing brace
            text.push_str(",\"data\":");
            text.push_str(data);
            text.push('}');
        }
        RawValue::from_string(text)
            .map_err(|e| field_error("body", format!("is not valid JSON: {e}")))
    }
}

/// `streamVersion`, the packet's version, as the event's `sequence`: a
/// whole number of at least 1, or a string of digits; absent or `null`:
/// none.
fn stream_version(
    value: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, EventError> {
    Ok(match value {
        None => None,
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some_and(|v| v >= 1) => Some(json!(n)),
        Some(serde_json::Value::String(s))
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(json!(s))
        }
        Some(other) => {
            return Err(field_error(
                "streamVersion",
                format!(
                    "must be a whole number of at least 1 (the packet's version), got {}",
                    match &other {
                        serde_json::Value::Number(n) => n.to_string(),
                        v => json_type(v).to_string(),
                    }
                ),
            ))
        }
    })
}

/// `data`, which must be a JSON object, as its own JSON text (stored as
/// given); absent or `null`: no data.
fn object_data(raw: Option<&RawValue>) -> Result<Option<String>, EventError> {
    // A raw value is valid JSON: one that opens with `{` is an object.
    Ok(match raw.map(|raw| raw.get().trim_start()) {
        None | Some("null") => None,
        Some(raw) if raw.starts_with('{') => Some(raw.to_string()),
        Some(_) => {
            let other: serde_json::Value = raw
                .and_then(|raw| serde_json::from_str(raw.get()).ok())
                .unwrap_or(serde_json::Value::Null);
            return Err(field_error(
                "data",
                format!("must be a JSON object or null, got {}", json_type(&other)),
            ));
        }
    })
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(body: serde_json::Value) -> Result<Mapped, EventError> {
        to_event(body.to_string().as_bytes(), || "generated".into())
    }

    #[test]
    fn a_full_body_maps_onto_the_shared_attributes() {
        // Raw text: the data's key order must survive as given.
        let body = r#"{"eventId": "e-1", "id": "packet-1", "w3id": "@owner", "evaultPublicKey": "pk",
            "data": {"b": 1, "a": "x"}, "schemaId": "schema-1", "operation": "update",
            "requestingPlatform": "https://pictique.example", "occurredAt": "2026-12-01T10:00:00.000Z",
            "streamVersion": 7}"#;
        let m = to_event(body.as_bytes(), || "generated".into()).unwrap();
        let e = m.event;
        assert!(!m.generated_id);
        assert_eq!(e.id, "e-1");
        assert_eq!(e.stream, "packet-1");
        assert_eq!(e.sequence, Some(7));
        assert_eq!(e.time.as_deref(), Some("2026-12-01T10:00:00.000Z"));
        assert_eq!(e.ty, "awareness.schema-1.update");
        assert_eq!(e.source, "urn:awareness:@owner");
        assert_eq!(e.extensions["w3id"], "@owner");
        assert_eq!(e.extensions["evaultpublickey"], "pk");
        assert_eq!(e.extensions["schemaid"], "schema-1");
        assert_eq!(e.extensions["operation"], "update");
        assert_eq!(
            e.extensions["requestingplatform"],
            "https://pictique.example"
        );
        assert_eq!(e.data, br#"{"b": 1, "a": "x"}"#);
    }

    #[test]
    fn absent_and_null_fields_leave_no_extension_and_the_type_says_create() {
        let m = map(json!({"id": "p", "schemaId": "s", "w3id": null, "data": null})).unwrap();
        assert!(m.generated_id);
        assert_eq!(m.event.id, "generated");
        assert_eq!(m.event.ty, "awareness.s.create");
        assert_eq!(m.event.source, "urn:awareness");
        assert_eq!(m.event.sequence, None);
        assert_eq!(
            m.event.extensions.keys().collect::<Vec<_>>(),
            vec!["schemaid"]
        );
        assert!(m.event.data.is_empty());
    }

    #[test]
    fn each_refusal_names_the_field() {
        let field = |body: serde_json::Value| map(body).unwrap_err().field;
        assert_eq!(field(json!({"schemaId": "s"})), "id");
        assert_eq!(field(json!({"id": "", "schemaId": "s"})), "id");
        assert_eq!(field(json!({"id": "p"})), "schemaId");
        assert_eq!(field(json!({"id": 5, "schemaId": "s"})), "id");
        assert_eq!(
            field(json!({"id": "p", "schemaId": "s", "data": [1]})),
            "data"
        );
        assert_eq!(
            field(json!({"id": "p", "schemaId": "s", "streamVersion": 1.5})),
            "streamVersion"
        );
        assert_eq!(
            field(json!({"id": "p", "schemaId": "s", "streamVersion": 0})),
            "streamVersion"
        );
        assert_eq!(
            field(json!({"id": "p", "schemaId": "s", "operation": "upsert"})),
            "operation"
        );
        assert_eq!(
            field(json!({"id": "p", "schemaId": "s", "occurredAt": "yesterday"})),
            "occurredAt"
        );
        assert_eq!(
            field(json!({"id": "p", "schemaId": "s", "colour": "red"})),
            "colour"
        );
        assert_eq!(
            field(json!({"id": "p\u{0}", "schemaId": "s"})),
            "id",
            "a NUL in the packet id is refused under its own name"
        );
        assert_eq!(
            to_event(b"not json", || "g".into()).unwrap_err().field,
            "body"
        );
        assert_eq!(to_event(b"[1]", || "g".into()).unwrap_err().field, "body");
    }

    #[test]
    fn the_secret_is_redacted_unless_it_is_a_bare_reference() {
        let c = |secret: &str| AwarenessIngestConfig {
            enabled: true,
            secret: secret.into(),
            path: DEFAULT_PATH.into(),
        };
        assert_eq!(
            c("${AWARENESS_SECRET}").redacted().secret,
            "${AWARENESS_SECRET}"
        );
        assert_eq!(c("s3cret").redacted().secret, "***");
        assert_eq!(c("${X:-s3cret}").redacted().secret, "***");
    }

    #[test]
    fn a_path_the_daemon_serves_is_refused() {
        for path in ["/v1/events", "/health", "ingest", "/in{x}"] {
            let c = AwarenessIngestConfig {
                enabled: true,
                secret: "s".into(),
                path: path.into(),
            };
            assert_eq!(c.validate().unwrap_err().0, "path", "{path}");
        }
    }
}
