//! The event actions: one event and its deliveries as the admin reads it
//! (`GET /v1/admin/events/{id}`, `outboxd events show ID`), and the event
//! search (`GET /v1/admin/events?…`, the console's events page).
//!
//! Owns: the one shape of those views ([`EventView`], [`FoundEvents`]) and
//! the search's input rules ([`EventQuery`]: times in RFC 3339, a state
//! by name, the page bounded by [`SEARCH_PAGE_MAX`]).
//!
//! Must never: show the payload in [`EventView`] (only its size; the
//! payload is [`show_body`]'s, cut at [`BODY_SHOWN_MAX`], or `GET
//! /v1/events/{id}`'s whole), or change anything.

use serde::{Deserialize, Serialize};

use super::AdminError;
use crate::store::{DeliveryInfo, DeliveryStatus, EventFilter, EventSummary, Store};

/// An event and its deliveries, as `GET /v1/admin/events/{id}` answers and
/// `outboxd events show ID` prints (the same JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventView {
    /// The event's id.
    pub id: String,
    /// CloudEvents `source`.
    pub source: String,
    #[serde(rename = "type")]
    /// CloudEvents `type`.
    pub ty: String,
    /// CloudEvents `subject`.
    pub subject: Option<String>,
    /// The ordering stream (CloudEvents `partitionkey`).
    pub stream: String,
    /// Position in its stream.
    pub sequence: u64,
    /// The producer's `time`, as given.
    pub time: Option<String>,
    /// CloudEvents `datacontenttype`.
    pub datacontenttype: Option<String>,
    /// Commit time of the ingest, Unix ms.
    pub ingested_at_ms: i64,
    /// Size of `data`, bytes.
    pub data_bytes: usize,
    /// The authenticated producer that posted it (`None`: anonymous, a
    /// source, or the in-transaction outbox).
    pub producer: Option<String>,
    /// Its deliveries, by delivery key.
    pub deliveries: Vec<DeliveryInfo>,
}

/// Event `id` with its deliveries.
///
/// Errors: [`AdminError::NotFound`] when no event has that id.
pub async fn show_event(store: &dyn Store, id: &str) -> Result<EventView, AdminError> {
    let (stored, deliveries) = store
        .event(id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("no event with id {id:?}")))?;
    let producer = store.event_producer(id).await?;
    let ev = stored.event;
    Ok(EventView {
        id: ev.id,
        source: ev.source,
        ty: ev.ty,
        subject: ev.subject,
        stream: ev.stream,
        sequence: stored.sequence,
        time: ev.time,
        datacontenttype: ev.datacontenttype,
        ingested_at_ms: stored.ingested_at_ms,
        data_bytes: ev.data.len(),
        producer,
        deliveries,
    })
}

/// Most events one search answers ([`search`]), and its default.
pub const SEARCH_PAGE_MAX: u32 = 500;
/// Events a search answers when no `limit` is given.
pub const SEARCH_PAGE_DEFAULT: u32 = 50;

/// An event search as the admin API's query string and the console's form
/// give it (`GET /v1/admin/events?stream=…&type=…`): every given field
/// must match; empty fields count as not given.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventQuery {
    /// This event only.
    pub id: Option<String>,
    /// This stream only.
    pub stream: Option<String>,
    /// CloudEvents `type`, exactly.
    #[serde(rename = "type")]
    pub ty: Option<String>,
    /// CloudEvents `source`, exactly.
    pub source: Option<String>,
    /// The producer (`outboxd producers create`) that posted it, by name.
    pub producer: Option<String>,
    /// Ingested at or after, RFC 3339.
    pub since: Option<String>,
    /// Ingested before, RFC 3339.
    pub until: Option<String>,
    /// With a delivery in this state: `pending`, `leased`, `retrying`,
    /// `delivered` or `dead`.
    pub state: Option<String>,
    /// At most this many, 1 to [`SEARCH_PAGE_MAX`]; default
    /// [`SEARCH_PAGE_DEFAULT`].
    pub limit: Option<u32>,
}

/// One event found, with how far its deliveries have got.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FoundEvent {
    /// The event (no payload).
    #[serde(flatten)]
    pub event: EventSummary,
    /// Deliveries not finished yet.
    pub open: u32,
    /// Deliveries acknowledged.
    pub delivered: u32,
    /// Deliveries dead-lettered.
    pub dead: u32,
}

/// The answer of a search: `{"events": [...]}`, newest first (by stream:
/// highest sequence first).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FoundEvents {
    /// The matching events, at most the limit.
    pub events: Vec<FoundEvent>,
    /// The limit applied: as many events as this means there may be more.
    pub limit: u32,
}

/// `text` as a filter value: `None` when absent or blank.
fn given(text: &Option<String>) -> Option<String> {
    text.as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

impl EventQuery {
    /// The store's filter and the limit.
    ///
    /// Errors: [`AdminError::Invalid`] naming `since`, `until`, `state` or
    /// `limit`.
    pub fn filter(&self) -> Result<(EventFilter, u32), AdminError> {
        let time = |field: &str, text: &Option<String>| {
            given(text)
                .map(|t| super::parse_time(field, &t))
                .transpose()
        };
        let state = match given(&self.state).as_deref() {
            None => None,
            Some("pending") => Some(DeliveryStatus::Pending),
            Some("leased") => Some(DeliveryStatus::Leased),
            Some("retrying") => Some(DeliveryStatus::Retrying),
            Some("delivered") => Some(DeliveryStatus::Delivered),
            Some("dead") => Some(DeliveryStatus::Dead),
            Some(other) => {
                return Err(super::invalid(
                    "state",
                    format!(
                        "{other:?} is not a delivery state: pending, leased, retrying, delivered or dead"
                    ),
                ))
            }
        };
        let limit = match self.limit.unwrap_or(SEARCH_PAGE_DEFAULT) {
            n @ 1..=SEARCH_PAGE_MAX => n,
            n => {
                return Err(super::invalid(
                    "limit",
                    format!("must be 1 to {SEARCH_PAGE_MAX}, got {n}"),
                ))
            }
        };
        Ok((
            EventFilter {
                id: given(&self.id),
                stream: given(&self.stream),
                ty: given(&self.ty),
                source: given(&self.source),
                producer: given(&self.producer),
                since_ms: time("since", &self.since)?,
                until_ms: time("until", &self.until)?,
                state,
            },
            limit,
        ))
    }
}

/// The events matching `query`, newest first, with their delivery
/// progress.
///
/// Errors: [`AdminError::Invalid`] naming the field at fault.
pub async fn search(store: &dyn Store, query: &EventQuery) -> Result<FoundEvents, AdminError> {
    let (filter, limit) = query.filter()?;
    let events = store.search_events(&filter, limit).await?;
    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let progress = store.delivery_progress(&ids).await?;
    let events = events
        .into_iter()
        .map(|event| {
            let p = progress.get(&event.id).cloned().unwrap_or_default();
            FoundEvent {
                event,
                open: p.open,
                delivered: p.delivered,
                dead: p.dead,
            }
        })
        .collect();
    Ok(FoundEvents { events, limit })
}

/// Most bytes of an event's `data` [`show_body`] answers with.
pub const BODY_SHOWN_MAX: usize = 64 * 1024;

/// An event's extension attributes and payload, as an operator reads them
/// (the console's event page): `data` as text — JSON and text as given,
/// binary as base64 — cut at [`BODY_SHOWN_MAX`] bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventBody {
    /// CloudEvents extension attributes, by name.
    pub extensions: std::collections::BTreeMap<String, String>,
    /// `json`, `text`, `binary` (`data` is then base64) or `none`.
    pub data_format: String,
    /// The payload as text, at most [`BODY_SHOWN_MAX`] bytes of it.
    pub data: String,
    /// True when `data` was cut.
    pub truncated: bool,
}

/// Event `id`'s extension attributes and payload.
///
/// Errors: [`AdminError::NotFound`] when no event has that id.
pub async fn show_body(store: &dyn Store, id: &str) -> Result<EventBody, AdminError> {
    let stored = store
        .stored_event(id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("no event with id {id:?}")))?;
    let ev = stored.event;
    let format = ev.data_format;
    let (bytes, truncated) = if ev.data.len() > BODY_SHOWN_MAX {
        (&ev.data[..BODY_SHOWN_MAX], true)
    } else {
        (&ev.data[..], false)
    };
    let data = match format {
        crate::event::DataFormat::Binary => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }
        _ => String::from_utf8_lossy(bytes).into_owned(),
    };
    Ok(EventBody {
        extensions: ev.extensions,
        data_format: format.as_str().to_string(),
        data,
        truncated,
    })
}
