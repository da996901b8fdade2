//! The stream action: a stream's head per delivery key and why it does not
//! move (`GET /v1/admin/streams/{stream}`, the console's streams page).
//!
//! Owns: the one reading of a head's situation ([`Why`]), in the order a
//! claim would meet it: the key paused (its sink or its destination), the
//! head a dead letter that blocks the stream, in flight under a lease,
//! waiting for its retry time, chained behind another sink that has not
//! delivered the same event yet, held by another database session's row
//! lock (so every claim skips it); otherwise due.
//!
//! Must never: change anything, or guess: each reason names what it read
//! (the dead letter's event, the retry time, the sink chained behind).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::destinations::Context;
use super::AdminError;
use crate::destinations::{Destination, State};
use crate::store::{DeliveryStatus, StreamHead};

/// Why a head does not move, or that it is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Why {
    /// An operator paused its sink (`outboxd sinks pause`).
    SinkPaused {
        /// The sink paused.
        sink: String,
    },
    /// Its destination is paused or disabled.
    DestinationHeld {
        /// `paused` or `disabled`.
        state: String,
        /// Why, as recorded.
        reason: Option<String>,
    },
    /// A dead letter at the head blocks the stream (`on-dead = "block"`)
    /// until it is replayed or purged.
    BlockedByDead {
        /// The dead letter's event.
        event_id: String,
        /// Why it died.
        reason: Option<String>,
    },
    /// Being delivered now, under a lease.
    InFlight {
        /// When the lease runs out, Unix ms.
        until_ms: Option<i64>,
    },
    /// Waiting for its next attempt after a failure.
    WaitingForRetry {
        /// When it is due, Unix ms.
        until_ms: i64,
        /// Why the last attempt failed.
        last_error: Option<String>,
    },
    /// Its sink is chained (`after` in its manifest): it takes the event
    /// only once the sink it follows delivered it.
    ChainedBehind {
        /// The sink it follows.
        sink: String,
        /// That sink's delivery of the event: `pending`, `retrying`, … .
        status: String,
    },
    /// Due, but another database session holds its row locked, so every
    /// claim skips it (PostgreSQL: a transaction left open on it, often
    /// `idle in transaction`); it moves when that transaction ends.
    HeldByLock {
        /// The session holding it, when it could be named.
        holder: Option<crate::store::HeadLock>,
    },
    /// Nothing holds it: the next claim of its key takes it.
    Due,
}

/// One head with the plugin that serves its key and why it does not move.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeadView {
    /// The head as stored.
    #[serde(flatten)]
    pub head: StreamHead,
    /// The sink (plugin) that serves the key.
    pub plugin: String,
    /// Why it does not move (or [`Why::Due`]).
    pub why: Why,
}

/// The answer of `GET /v1/admin/streams/{stream}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamView {
    /// The stream.
    pub stream: String,
    /// One head per delivery key with live deliveries on it, by key; none:
    /// every delivery of the stream is finished.
    pub heads: Vec<HeadView>,
}

/// The heads of `stream` and why each does not move.
///
/// Errors: [`AdminError::Invalid`] for an empty stream name; the store's.
pub async fn show(ctx: &Context, stream: &str) -> Result<StreamView, AdminError> {
    if stream.is_empty() {
        return Err(super::invalid("stream", "is empty"));
    }
    let heads = ctx.store.stream_heads(stream).await?;
    let locks = if heads.is_empty() {
        Vec::new()
    } else {
        ctx.store.head_locks(stream).await?
    };
    let paused = ctx.store.paused_sinks().await?;
    let destinations: BTreeMap<String, Destination> = if heads.is_empty() {
        BTreeMap::new()
    } else {
        ctx.store
            .destinations()
            .await?
            .into_iter()
            .filter_map(|r| Some((r.name, serde_json::from_str(&r.record).ok()?)))
            .collect()
    };
    let now = crate::destinations::now_ms();
    let mut out = Vec::with_capacity(heads.len());
    for head in heads {
        let destination = destinations.get(&head.sink);
        let plugin = destination.map_or_else(|| head.sink.clone(), |d| d.sink.clone());
        let mut why = why(ctx, &head, &plugin, destination, &paused, now).await?;
        if why == Why::Due {
            if let Some(lock) = locks.iter().find(|l| l.sink == head.sink) {
                why = Why::HeldByLock {
                    holder: lock.pid.map(|_| lock.clone()),
                };
            }
        }
        out.push(HeadView { head, plugin, why });
    }
    Ok(StreamView {
        stream: stream.to_string(),
        heads: out,
    })
}

async fn why(
    ctx: &Context,
    head: &StreamHead,
    plugin: &str,
    destination: Option<&Destination>,
    paused: &[String],
    now_ms: i64,
) -> Result<Why, AdminError> {
    if let Some(sink) = [head.sink.as_str(), plugin]
        .into_iter()
        .find(|s| paused.iter().any(|p| p == s))
    {
        return Ok(Why::SinkPaused { sink: sink.into() });
    }
    if let Some(d) = destination.filter(|d| d.state != State::Active) {
        let state = if d.state == State::Paused {
            "paused"
        } else {
            "disabled"
        };
        return Ok(Why::DestinationHeld {
            state: state.into(),
            reason: d.state_reason.clone(),
        });
    }
    match head.status {
        DeliveryStatus::Dead => {
            return Ok(Why::BlockedByDead {
                event_id: head.event_id.clone(),
                reason: head.last_error.clone(),
            })
        }
        DeliveryStatus::Leased => {
            return Ok(Why::InFlight {
                until_ms: head.lease_expires_at_ms,
            })
        }
        _ => {}
    }
    if let Some(due) = head.due_at_ms.filter(|due| *due > now_ms) {
        return Ok(Why::WaitingForRetry {
            until_ms: due,
            last_error: head.last_error.clone(),
        });
    }
    let after = ctx
        .plugins
        .serving(plugin)
        .and_then(|p| p.manifest().after.clone());
    if let Some(after) = after {
        if let Some((_, deliveries)) = ctx.store.event(&head.event_id).await? {
            if let Some(d) = deliveries
                .iter()
                .find(|d| d.sink == after && d.status != DeliveryStatus::Delivered)
            {
                return Ok(Why::ChainedBehind {
                    sink: after,
                    status: d.status.to_string(),
                });
            }
        }
    }
    Ok(Why::Due)
}
