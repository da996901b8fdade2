//! The event action: one event and its deliveries as the admin reads it
//! (`GET /v1/admin/events/{id}`, `outboxd events show ID`).
//!
//! Owns: the one shape of that view ([`EventView`]).
//!
//! Must never: show the payload itself (only its size; `GET
//! /v1/events/{id}` gives the event whole), or change anything.

use serde::{Deserialize, Serialize};

use super::AdminError;
use crate::store::{DeliveryInfo, Store};

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
