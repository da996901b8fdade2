//! The PostgreSQL store, for production and for several replicas.
//!
//! Owns: the PostgreSQL schema (`migrations/postgres/`, schema `outboxd`)
//! and the SQL that keeps the rules of [`crate::store`] with many writers
//! and many workers at once:
//!
//! - ingest locks the `streams` rows it touches, in sorted order (no
//!   deadlock between two batches), so sequences are gapless and strictly
//!   increasing under any concurrency; a unique violation on `id` (two
//!   producers racing with the same id) or a deadlock/serialization failure
//!   retries the transaction, which then sees the winner's row;
//! - claims use `FOR UPDATE SKIP LOCKED` on the heads of streams, so
//!   concurrent workers and replicas never take the same delivery; lease
//!   expiry is `now()` of the database;
//! - a finish that moves or drops a stream's head takes the stream's row
//!   lock first, like ingest, so a head change and an ingest of the same
//!   stream never interleave (otherwise the new delivery could be left
//!   without a head, and delivered out of order or never);
//! - every connection carries a `statement_timeout`, so no call can hang.
//!
//! Must never: compute a time from the process clock, or hold a
//! transaction open across a plugin call.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres, QueryBuilder, Row, Transaction};
use tokio::sync::watch;

use super::{
    destination_row, new_lease_token, registered_sink, same_event, sink_replica, BackfillPage,
    Claimed, DeadFilter, DeadLetter, DeliveryInfo, DestinationRow, Finish, IngestError, IngestItem,
    Ingested, Purged, PutMode, QueueStats, RegisteredSink, RouteFn, SinkIdentity, SinkReplica,
    Store, StoreError, StoredEvent,
};
use crate::event::NewEvent;
use crate::limits::LOCKED_HEAD_CONFIRM;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Server-side limit on any one statement.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Channel of the wake-up notifications sent on ingest.
pub const WAKE_CHANNEL: &str = "outboxd_wake";
/// Attempts of an ingest transaction that lost a race (unique violation,
/// deadlock, serialization failure) before giving up.
const INGEST_ATTEMPTS: usize = 5;

/// Claim step 1: due heads of one sink, by due time (waiting and
/// expired-lease work in one order, so neither starves the other), skipping
/// heads another worker is claiming, and heads whose delivery row another
/// session holds locked (an application's transaction left idle): that
/// stream waits, the others are claimed, and [`OVERDUE_HEAD_SQL`] tells.
/// Reads only `heads_due`: O(batch). `$1` sink, `$2` limit.
pub const CLAIM_HEADS_SQL: &str = "SELECT h.stream, h.delivery_id FROM outboxd.heads h \
     JOIN outboxd.deliveries d ON d.id = h.delivery_id \
     WHERE h.sink = $1 AND h.due_at <= now() ORDER BY h.due_at LIMIT $2 FOR UPDATE OF h, d SKIP LOCKED";

/// The oldest head of `$1` (sink) due for more than `$2` milliseconds:
/// right after a claim that had room for it, one it skipped because
/// another session holds it locked. Its stream and how long it has been
/// due (ms).
pub const OVERDUE_HEAD_SQL: &str =
    "SELECT stream, (extract(epoch FROM now() - due_at) * 1000)::bigint \
     FROM outboxd.heads WHERE sink = $1 AND due_at <= now() - $2 * interval '1 millisecond' \
     ORDER BY due_at LIMIT 1";

/// Claim step 2: up to `$3` live deliveries behind each claimed head
/// (`$2`, delivery ids), in sequence order, with whether each may be taken
/// now. Reads `deliveries_live`: O(batch). `$1` sink.
pub const CLAIM_RUNS_SQL: &str = "SELECT f.id, h.stream, \
       (f.next_attempt_at <= now() AND (f.lease_expires_at IS NULL OR f.lease_expires_at <= now())) \
     FROM outboxd.deliveries h \
     CROSS JOIN LATERAL (SELECT id, next_attempt_at, lease_expires_at, sequence FROM outboxd.deliveries \
                         WHERE sink = $1 AND stream = h.stream AND status = 'pending' AND sequence > h.sequence \
                         ORDER BY sequence LIMIT $3) AS f \
     WHERE h.id = ANY($2) ORDER BY h.stream, f.sequence";

/// Move each head that is on a finished delivery (`$1` ids, `$2` sinks,
/// `$3` streams, as arrays) to its stream's first live delivery, due when
/// its retry time and any lease have passed. `LATERAL … LIMIT 1` keeps
/// every probe on `deliveries_live`; heads with no live delivery left are
/// not touched (the caller deletes them).
pub const MOVE_HEADS_SQL: &str = "UPDATE outboxd.heads h SET delivery_id = n.id, \
       due_at = GREATEST(n.next_attempt_at, COALESCE(n.lease_expires_at, n.next_attempt_at)) \
     FROM unnest($1::bigint[], $2::text[], $3::text[]) AS m(id, sink, stream) \
     CROSS JOIN LATERAL (SELECT id, next_attempt_at, lease_expires_at FROM outboxd.deliveries \
                         WHERE sink = m.sink AND stream = m.stream AND status = 'pending' \
                         ORDER BY sequence LIMIT 1) AS n \
     WHERE h.sink = m.sink AND h.stream = m.stream AND h.delivery_id = m.id";

/// Of the deliveries `$1` (ids), those behind an undelivered earlier
/// delivery of their (sink, stream): a pending one, or a dead letter
/// blocking the head (due `infinity`).
pub const BEHIND_EARLIER_SQL: &str = "SELECT c.id FROM outboxd.deliveries c WHERE c.id = ANY($1) AND ( \
       EXISTS (SELECT 1 FROM outboxd.deliveries e WHERE e.sink = c.sink AND e.stream = c.stream \
               AND e.status = 'pending' AND e.sequence < c.sequence) \
       OR EXISTS (SELECT 1 FROM outboxd.heads h JOIN outboxd.deliveries hd ON hd.id = h.delivery_id \
               WHERE h.sink = c.sink AND h.stream = c.stream AND h.due_at = 'infinity' \
                 AND hd.sequence < c.sequence))";

/// Point the head of (`$1` sink, `$2` stream) at its earliest live
/// delivery (after a replay or a backfill added one that may sit before
/// the current head).
pub const RESET_HEAD_SQL: &str = "INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
     SELECT sink, stream, id, GREATEST(next_attempt_at, COALESCE(lease_expires_at, next_attempt_at)) \
     FROM outboxd.deliveries WHERE sink = $1 AND stream = $2 AND status = 'pending' \
     ORDER BY sequence LIMIT 1 \
     ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = EXCLUDED.delivery_id, due_at = EXCLUDED.due_at";

/// [`RESET_HEAD_SQL`], except that a head blocked by a dead letter (due
/// `infinity`, `on-dead = "block"`) stays unless its dead letter is among
/// `$3` (delivery ids being replayed): a replay of other letters, or a
/// backfill (`$3` empty), adds deliveries that wait behind the block, and
/// they go first once the blocking letter itself is replayed.
pub const RESET_HEAD_UNLESS_BLOCKED_SQL: &str = "INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
     SELECT sink, stream, id, GREATEST(next_attempt_at, COALESCE(lease_expires_at, next_attempt_at)) \
     FROM outboxd.deliveries WHERE sink = $1 AND stream = $2 AND status = 'pending' \
     ORDER BY sequence LIMIT 1 \
     ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = EXCLUDED.delivery_id, due_at = EXCLUDED.due_at \
     WHERE outboxd.heads.due_at < 'infinity' OR outboxd.heads.delivery_id = ANY($3)";

/// The PostgreSQL store.
pub struct PgStore {
    pool: PgPool,
    url: String,
    /// By sink, the head a claim with room for it last left behind because
    /// it is locked. [`Store::ping`] fails while one was seen recently.
    locked_heads: std::sync::Mutex<BTreeMap<String, LockedHead>>,
}

/// A stream's head left behind by claims because it is locked.
struct LockedHead {
    stream: String,
    /// How long it had been due when last seen, ms.
    due_ms: i64,
    /// When claims first and last left it behind.
    first_seen: std::time::Instant,
    last_seen: std::time::Instant,
}

impl PgStore {
    /// Connect (pool of up to 16 connections).
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let options = PgConnectOptions::from_str(url)?
            .options([(
                "statement_timeout",
                format!("{}", STATEMENT_TIMEOUT.as_millis()),
            )])
            .application_name("outboxd");
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(PgStore {
            pool,
            url: url.to_string(),
            locked_heads: Default::default(),
        })
    }

    /// After a claim of `sink` that took `claimed` of `limit`: when it had
    /// room, look for a head it left behind that has been due longer than
    /// a statement may wait ([`STATEMENT_TIMEOUT`]) — one another session
    /// holds locked — and note it (or that there is none) for
    /// [`Store::ping`]. A full claim says nothing: the rest may simply be
    /// a backlog.
    async fn note_locked_head(&self, sink: &str, claimed: usize, limit: u32) {
        if claimed >= limit as usize {
            return;
        }
        let overdue: Result<Option<(String, i64)>, sqlx::Error> = sqlx::query_as(OVERDUE_HEAD_SQL)
            .bind(sink)
            .bind(STATEMENT_TIMEOUT.as_millis() as i64)
            .fetch_optional(&self.pool)
            .await;
        let mut locked = self.locked_heads.lock().unwrap();
        match overdue {
            Ok(Some((stream, due_ms))) => {
                let now = std::time::Instant::now();
                match locked.get_mut(sink) {
                    Some(head) if head.stream == stream => {
                        head.due_ms = due_ms;
                        head.last_seen = now;
                    }
                    _ => {
                        tracing::warn!(sink, stream = %stream, "the head of a stream is locked by another session; that stream waits");
                        locked.insert(
                            sink.to_string(),
                            LockedHead {
                                stream,
                                due_ms,
                                first_seen: now,
                                last_seen: now,
                            },
                        );
                    }
                }
            }
            Ok(None) => {
                locked.remove(sink);
            }
            Err(e) => tracing::debug!(sink, "looking for a locked head: {e}"),
        }
    }
}

const EVENT_COLUMNS: &str =
    "id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
     producer_sequence, extensions, data, data_format, \
     (extract(epoch FROM ingested_at) * 1000)::bigint AS ingested_at_ms";

/// True for errors after which the whole transaction may simply be re-run.
fn is_retryable(e: &IngestError) -> bool {
    let IngestError::Store(StoreError::Database(sqlx::Error::Database(db))) = e else {
        return false;
    };
    matches!(
        db.code().as_deref(),
        Some("23505") | Some("40001") | Some("40P01")
    )
}

/// New events and their deliveries, gathered as columns and written with
/// one statement each (`unnest`), whatever the request's size.
#[derive(Default)]
struct NewRows {
    id: Vec<String>,
    source: Vec<String>,
    ty: Vec<String>,
    subject: Vec<Option<String>>,
    time: Vec<Option<String>>,
    datacontenttype: Vec<Option<String>>,
    dataschema: Vec<Option<String>>,
    stream: Vec<String>,
    sequence: Vec<i64>,
    producer_sequence: Vec<bool>,
    extensions: Vec<String>,
    data: Vec<Vec<u8>>,
    data_format: Vec<String>,
    content_hash: Vec<String>,
    routed: Vec<bool>,
    /// Deliveries, as parallel columns: event id, sink, stream, sequence.
    d_event: Vec<String>,
    d_sink: Vec<String>,
    d_stream: Vec<String>,
    d_sequence: Vec<i64>,
}

impl NewRows {
    fn push_event(&mut self, ev: &NewEvent, sequence: u64, hash: String, routed: bool) {
        self.id.push(ev.id.clone());
        self.source.push(ev.source.clone());
        self.ty.push(ev.ty.clone());
        self.subject.push(ev.subject.clone());
        self.time.push(ev.time.clone());
        self.datacontenttype.push(ev.datacontenttype.clone());
        self.dataschema.push(ev.dataschema.clone());
        self.stream.push(ev.stream.clone());
        self.sequence.push(sequence as i64);
        self.producer_sequence.push(ev.sequence.is_some());
        self.extensions
            .push(serde_json::to_string(&ev.extensions).expect("string map serialises"));
        self.data.push(ev.data.clone());
        self.data_format.push(ev.data_format.as_str().to_string());
        self.content_hash.push(hash);
        self.routed.push(routed);
    }

    fn push_delivery(&mut self, event_id: &str, sink: &str, stream: &str, sequence: u64) {
        self.d_event.push(event_id.to_string());
        self.d_sink.push(sink.to_string());
        self.d_stream.push(stream.to_string());
        self.d_sequence.push(sequence as i64);
    }

    /// Insert the events in request order (their `seq_id` follows it), then
    /// their deliveries.
    async fn insert(&self, tx: &mut Transaction<'_, Postgres>) -> Result<(), sqlx::Error> {
        if self.id.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO outboxd.events (id, source, type, subject, time, datacontenttype, dataschema, stream, \
             sequence, producer_sequence, extensions, data, data_format, content_hash, routed) \
             SELECT id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
                    producer_sequence, extensions, data, data_format, content_hash, routed \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
                         $8::text[], $9::bigint[], $10::bool[], $11::text[], $12::bytea[], $13::text[], \
                         $14::text[], $15::bool[]) WITH ORDINALITY \
               AS e(id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
                    producer_sequence, extensions, data, data_format, content_hash, routed, n) \
             ORDER BY n",
        )
        .bind(&self.id)
        .bind(&self.source)
        .bind(&self.ty)
        .bind(&self.subject)
        .bind(&self.time)
        .bind(&self.datacontenttype)
        .bind(&self.dataschema)
        .bind(&self.stream)
        .bind(&self.sequence)
        .bind(&self.producer_sequence)
        .bind(&self.extensions)
        .bind(&self.data)
        .bind(&self.data_format)
        .bind(&self.content_hash)
        .bind(&self.routed)
        .execute(&mut **tx)
        .await?;
        insert_deliveries(
            tx,
            &self.d_event,
            &self.d_sink,
            &self.d_stream,
            &self.d_sequence,
        )
        .await
    }
}

/// Insert deliveries (parallel columns: event id, sink, stream, sequence);
/// the first live delivery of each (sink, stream) becomes its head, later
/// ones wait behind it. An existing (event, sink) delivery is left alone.
async fn insert_deliveries(
    tx: &mut Transaction<'_, Postgres>,
    events: &[String],
    sinks: &[String],
    streams: &[String],
    sequences: &[i64],
) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "WITH d AS (INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence) \
                    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) \
                    ON CONFLICT (event_id, sink) DO NOTHING RETURNING id, sink, stream, sequence) \
         INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
         SELECT DISTINCT ON (sink, stream) sink, stream, id, now() FROM d \
         ORDER BY sink, stream, sequence ON CONFLICT (sink, stream) DO NOTHING",
    )
    .bind(events)
    .bind(sinks)
    .bind(streams)
    .bind(sequences)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Lock the rows of `streams` in byte order (`COLLATE "C"`): the one order
/// every transaction that moves heads or adds deliveries takes them in
/// (ingest, finish, routing, replay, purge, backfill), so two never wait on
/// each other in opposite orders, and a head is never moved from a stale
/// read while another transaction changes its stream.
async fn lock_streams(
    tx: &mut Transaction<'_, Postgres>,
    streams: &[String],
) -> Result<(), sqlx::Error> {
    if streams.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "SELECT 1 FROM outboxd.streams WHERE stream = ANY($1) ORDER BY stream COLLATE \"C\" FOR UPDATE",
    )
    .bind(streams)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl PgStore {
    /// One claim ([`Store::claim_after`]), in one transaction.
    async fn claim_once(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
        after: Option<&str>,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let heads: Vec<(String, i64)> = sqlx::query_as(CLAIM_HEADS_SQL)
            .bind(sink)
            .bind(limit as i64)
            .fetch_all(&mut *tx)
            .await?;
        if heads.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let mut streams: Vec<String> = heads.iter().map(|h| h.0.clone()).collect();
        let mut ids: Vec<i64> = heads.iter().map(|h| h.1).collect();
        let mut order: Vec<(String, i64)> = heads.clone();
        // Contiguous runs behind the heads we now hold locked: the next live
        // rows of each stream while each is due and not leased.
        let room = (limit as usize).saturating_sub(ids.len());
        if room > 0 {
            let head_ids: Vec<i64> = ids.clone();
            let followers: Vec<(i64, String, bool)> = sqlx::query_as(CLAIM_RUNS_SQL)
                .bind(sink)
                .bind(&head_ids)
                .bind(room as i64)
                .fetch_all(&mut *tx)
                .await?;
            let mut room = room;
            let mut stopped: BTreeSet<String> = BTreeSet::new();
            for (id, stream, eligible) in followers {
                if room == 0 {
                    break;
                }
                if stopped.contains(&stream) {
                    continue;
                }
                if !eligible {
                    stopped.insert(stream);
                    continue;
                }
                ids.push(id);
                order.push((stream, id));
                room -= 1;
            }
        }
        if let Some(after) = after {
            let blocked: std::collections::HashSet<i64> = sqlx::query_scalar(
                "SELECT d.id FROM outboxd.deliveries d JOIN outboxd.deliveries t \
                   ON t.event_id = d.event_id AND t.sink = $2 \
                 WHERE d.id = ANY($1) AND t.status <> 'delivered'",
            )
            .bind(&ids)
            .bind(after)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
            if !blocked.is_empty() {
                let (kept, claimed_streams, held) = super::cut_runs(&order, &heads, &blocked);
                sqlx::query(
                    "UPDATE outboxd.heads SET due_at = now() + interval '1 second' \
                     WHERE sink = $1 AND stream = ANY($2)",
                )
                .bind(sink)
                .bind(&held)
                .execute(&mut *tx)
                .await?;
                ids = kept;
                streams = claimed_streams;
                if ids.is_empty() {
                    tx.commit().await?;
                    return Ok(Vec::new());
                }
            }
        }
        let token = new_lease_token();
        let rows = sqlx::query(
            "UPDATE outboxd.deliveries SET lease_token = $2, lease_expires_at = now() + $3 * interval '1 millisecond', \
               attempts = attempts + 1, first_attempt_at = COALESCE(first_attempt_at, now()) \
             WHERE id = ANY($1) AND status = 'pending' \
             RETURNING id, event_id, attempts, \
               (extract(epoch FROM first_attempt_at) * 1000)::bigint AS first_ms, \
               (extract(epoch FROM now()) * 1000)::bigint AS now_ms",
        )
        .bind(&ids)
        .bind(&token)
        .bind(lease.as_millis() as i64)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE outboxd.heads SET due_at = now() + $3 * interval '1 millisecond' \
             WHERE sink = $1 AND stream = ANY($2)",
        )
        .bind(sink)
        .bind(&streams)
        .bind(lease.as_millis() as i64)
        .execute(&mut *tx)
        .await?;
        let event_ids: Vec<String> = rows
            .iter()
            .map(|r| r.try_get("event_id"))
            .collect::<Result<_, _>>()?;
        let mut events: BTreeMap<String, StoredEvent> = BTreeMap::new();
        for row in sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM outboxd.events WHERE id = ANY($1)"
        ))
        .bind(&event_ids)
        .fetch_all(&mut *tx)
        .await?
        {
            let ev = super::event_from_row(&row)?;
            events.insert(ev.event.id.clone(), ev);
        }
        tx.commit().await?;
        let leased = rows
            .iter()
            .map(|row| {
                Ok(super::LeasedRow {
                    delivery_id: row.try_get("id")?,
                    event_id: row.try_get("event_id")?,
                    attempts: row.try_get::<i32, _>("attempts")? as u32,
                    first_attempt_at_ms: row.try_get("first_ms")?,
                    claimed_at_ms: row.try_get("now_ms")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        super::assemble_claims(leased, &events, &token)
    }

    async fn ingest_once(
        &self,
        items: &[IngestItem],
    ) -> Result<(Vec<Ingested>, bool), IngestError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        // Lock every stream row this request touches, in byte order (COLLATE "C",
        // the order Rust sorts in and finish_many locks in), so ingest and
        // finish never lock two streams in opposite orders.
        let streams: BTreeSet<&str> = items.iter().map(|i| i.event.stream.as_str()).collect();
        let streams: Vec<&str> = streams.into_iter().collect();
        sqlx::query(
            "INSERT INTO outboxd.streams (stream, last_sequence) SELECT s, 0 FROM unnest($1::text[]) AS s \
             ORDER BY s COLLATE \"C\" ON CONFLICT (stream) DO NOTHING",
        )
        .bind(&streams)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, last_sequence FROM outboxd.streams WHERE stream = ANY($1) ORDER BY stream COLLATE \"C\" FOR UPDATE",
        )
        .bind(&streams)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        let mut last: BTreeMap<String, u64> =
            rows.into_iter().map(|(s, n)| (s, n as u64)).collect();
        let original = last.clone();
        // A stream with events enqueued by SQL and not yet routed: new events
        // of it wait for the router too, so deliveries keep stream order.
        let unrouted: BTreeSet<String> = sqlx::query_scalar(
            "SELECT DISTINCT stream FROM outboxd.events WHERE NOT routed AND stream = ANY($1)",
        )
        .bind(&streams)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::from)?
        .into_iter()
        .collect();

        // Events of this request already stored, in one statement.
        let ids: Vec<&str> = items.iter().map(|i| i.event.id.as_str()).collect();
        let mut stored: HashMap<String, (Option<String>, StoredEvent)> = HashMap::new();
        for row in sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS}, content_hash FROM outboxd.events WHERE id = ANY($1)"
        ))
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::from)?
        {
            let hash: Option<String> = row.try_get("content_hash").map_err(StoreError::from)?;
            let event = super::event_from_row(&row)?;
            stored.insert(event.event.id.clone(), (hash, event));
        }

        let mut out = Vec::with_capacity(items.len());
        let mut queued = false;
        // The delivery keys queued, named in the NOTIFY so other processes
        // wake only those loops; `everyone` when the router must run.
        let mut woken: Vec<&String> = Vec::new();
        let mut everyone = false;
        // New events of this request, by id: (hash, item index, sequence).
        let mut fresh: HashMap<&str, (String, usize, u64)> = HashMap::new();
        let mut rows = NewRows::default();
        for (index, item) in items.iter().enumerate() {
            let ev = &item.event;
            let hash = ev.content_hash();
            // The same id again: stored before, or earlier in this request.
            let earlier = match (stored.get(&ev.id), fresh.get(ev.id.as_str())) {
                (Some((stored_hash, s)), _) => Some((
                    stored_hash.as_deref(),
                    &s.event,
                    s.event.stream.clone(),
                    s.sequence,
                )),
                (None, Some((h, i, seq))) => {
                    let first = &items[*i].event;
                    Some((Some(h.as_str()), first, first.stream.clone(), *seq))
                }
                (None, None) => None,
            };
            if let Some((earlier_hash, earlier_event, stream, sequence)) = earlier {
                match same_event(earlier_hash, earlier_event, ev, &hash) {
                    Ok(()) => {
                        out.push(Ingested {
                            id: ev.id.clone(),
                            stream,
                            sequence,
                            duplicate: true,
                            deliveries_queued: 0,
                        });
                        continue;
                    }
                    Err(attributes) => {
                        return Err(IngestError::Conflict {
                            index,
                            id: ev.id.clone(),
                            attributes,
                        })
                    }
                }
            }
            let prev = last.get(&ev.stream).copied().unwrap_or(0);
            let sequence = super::next_sequence(index, ev, prev)?;
            last.insert(ev.stream.clone(), sequence);
            let routed = !unrouted.contains(&ev.stream);
            rows.push_event(ev, sequence, hash.clone(), routed);
            let deliveries_queued = if routed { item.sinks.len() as u64 } else { 0 };
            if routed {
                for sink in &item.sinks {
                    rows.push_delivery(&ev.id, sink, &ev.stream, sequence);
                    woken.push(sink);
                }
                queued |= !item.sinks.is_empty();
            } else {
                // The router creates its deliveries (and wakes the loops).
                queued = true;
                everyone = true;
            }
            fresh.insert(ev.id.as_str(), (hash, index, sequence));
            out.push(Ingested {
                id: ev.id.clone(),
                stream: ev.stream.clone(),
                sequence,
                duplicate: false,
                deliveries_queued,
            });
        }
        rows.insert(&mut tx).await.map_err(StoreError::from)?;
        let changed: Vec<(String, i64)> = last
            .iter()
            .filter(|(s, n)| original.get(*s) != Some(n))
            .map(|(s, n)| (s.clone(), *n as i64))
            .collect();
        if !changed.is_empty() {
            let (names, values): (Vec<String>, Vec<i64>) = changed.into_iter().unzip();
            sqlx::query(
                "UPDATE outboxd.streams AS s SET last_sequence = v.n \
                 FROM unnest($1::text[], $2::bigint[]) AS v(stream, n) WHERE s.stream = v.stream",
            )
            .bind(&names)
            .bind(&values)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        }
        if queued {
            let payload = if everyone {
                "*".to_string()
            } else {
                crate::wakeups::payload(woken.iter().map(|k| k.as_str()))
            };
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(WAKE_CHANNEL)
                .bind(payload)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok((out, queued))
    }
}

#[async_trait]
impl Store for PgStore {
    async fn ingest(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.ingest_once(items).await {
                Ok((out, _)) => return Ok(out),
                Err(e) if attempt < INGEST_ATTEMPTS && is_retryable(&e) => {
                    tracing::debug!(attempt, "ingest transaction lost a race, retrying: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn event(
        &self,
        id: &str,
    ) -> Result<Option<(StoredEvent, Vec<DeliveryInfo>)>, StoreError> {
        let Some(row) = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM outboxd.events WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let event = super::event_from_row(&row)?;
        let rows = sqlx::query(
            "SELECT sink, attempts, last_error, \
               CASE WHEN status = 'pending' AND lease_expires_at > now() THEN 'leased' \
                    WHEN status = 'pending' AND attempts > 0 THEN 'retrying' \
                    ELSE status END AS shown, \
               CASE WHEN status = 'pending' THEN (extract(epoch FROM next_attempt_at) * 1000)::bigint END AS next_ms, \
               (extract(epoch FROM finished_at) * 1000)::bigint AS finished_ms \
             FROM outboxd.deliveries WHERE event_id = $1 ORDER BY sink",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let deliveries = rows
            .iter()
            .map(|row| {
                Ok(DeliveryInfo {
                    sink: row.try_get("sink")?,
                    status: row.try_get("shown")?,
                    attempts: row.try_get::<i32, _>("attempts")? as u32,
                    last_error: row.try_get("last_error")?,
                    next_attempt_at_ms: row.try_get("next_ms")?,
                    finished_at_ms: row.try_get("finished_ms")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(Some((event, deliveries)))
    }

    async fn claim_after(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
        after: Option<&str>,
    ) -> Result<Vec<Claimed>, StoreError> {
        let claimed = self.claim_once(sink, limit, lease, after).await?;
        self.note_locked_head(sink, claimed.len(), limit).await;
        Ok(claimed)
    }

    async fn finish_many(&self, items: &[(i64, &str, &Finish)]) -> Result<Vec<bool>, StoreError> {
        // One transaction (one commit, one fsync) and a fixed number of
        // statements for a whole batch, whatever its size.
        let mut tx = self.pool.begin().await?;
        let kept = finish_batch(&mut tx, items).await?;
        tx.commit().await?;
        Ok(kept)
    }

    async fn next_due_in(&self, sink: &str) -> Result<Option<Duration>, StoreError> {
        let wait: Option<i64> = sqlx::query_scalar(
            "SELECT (extract(epoch FROM (MIN(due_at) - now())) * 1000)::bigint FROM outboxd.heads \
             WHERE sink = $1 AND due_at < 'infinity'",
        )
        .bind(sink)
        .fetch_one(&self.pool)
        .await?;
        Ok(wait.map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    async fn route_pending(&self, route: &RouteFn<'_>, limit: u32) -> Result<usize, StoreError> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM outboxd.events WHERE NOT routed ORDER BY seq_id LIMIT $1 \
             FOR UPDATE SKIP LOCKED"
        ))
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        let events = rows
            .iter()
            .map(super::event_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let streams: BTreeSet<String> = events.iter().map(|e| e.event.stream.clone()).collect();
        lock_streams(&mut tx, &streams.into_iter().collect::<Vec<_>>()).await?;
        let mut queued = false;
        for stored in &events {
            let sinks = route(&stored.event);
            let n = sinks.len();
            insert_deliveries(
                &mut tx,
                &vec![stored.event.id.clone(); n],
                &sinks,
                &vec![stored.event.stream.clone(); n],
                &vec![stored.sequence as i64; n],
            )
            .await?;
            queued |= !sinks.is_empty();
            sqlx::query("UPDATE outboxd.events SET routed = true, content_hash = $2 WHERE id = $1")
                .bind(&stored.event.id)
                .bind(stored.event.content_hash())
                .execute(&mut *tx)
                .await?;
        }
        if queued {
            sqlx::query("SELECT pg_notify($1, 'routed')")
                .bind(WAKE_CHANNEL)
                .execute(&mut *tx)
                .await
                .ok();
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    fn forward_wakeups(&self, wake: Arc<crate::wakeups::Wakeups>, mut stop: watch::Receiver<bool>) {
        let url = self.url.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                if *stop.borrow() {
                    return;
                }
                let listener = async {
                    let mut listener = PgListener::connect(&url).await?;
                    listener.listen(WAKE_CHANNEL).await?;
                    Ok::<_, sqlx::Error>(listener)
                };
                match listener.await {
                    Ok(mut listener) => {
                        backoff = Duration::from_millis(100);
                        // Anything ingested while we were not listening.
                        wake.everyone();
                        loop {
                            tokio::select! {
                                n = listener.try_recv() => match n {
                                    Ok(Some(n)) => wake.from_payload(n.payload()),
                                    Ok(None) => wake.everyone(),
                                    Err(e) => {
                                        tracing::warn!("LISTEN {WAKE_CHANNEL} failed, reconnecting: {e}");
                                        break;
                                    }
                                },
                                _ = stop.changed() => return,
                            }
                        }
                    }
                    Err(e) => tracing::warn!("LISTEN {WAKE_CHANNEL}: cannot connect: {e}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
    }

    async fn queue_stats(&self, cap: u64) -> Result<QueueStats, StoreError> {
        let mut tx = self.pool.begin().await?;
        // A probe must answer fast even under a huge backlog.
        sqlx::query("SET LOCAL statement_timeout = 2000")
            .execute(&mut *tx)
            .await?;
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT sink, st, COUNT(*) FROM ( \
               SELECT sink, CASE WHEN status = 'dead' THEN 'dead' \
                                 WHEN lease_expires_at > now() THEN 'leased' \
                                 WHEN lease_expires_at IS NOT NULL THEN 'expired' \
                                 WHEN attempts > 0 THEN 'retrying' ELSE 'pending' END AS st \
               FROM outboxd.deliveries WHERE status IN ('pending', 'dead') LIMIT $1) AS q \
             GROUP BY sink, st",
        )
        .bind(cap as i64)
        .fetch_all(&mut *tx)
        .await?;
        let ages: Vec<(String, i64)> = sqlx::query_as(
            "SELECT sink, (extract(epoch FROM now() - MIN(due_at)) * 1000)::bigint FROM outboxd.heads \
             WHERE due_at <= now() GROUP BY sink",
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(super::fold_stats(rows, ages, cap))
    }

    async fn list_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let mut q = QueryBuilder::<Postgres>::new(
            "SELECT event_id, sink, stream, sequence, attempts::bigint, last_error, \
             (extract(epoch FROM finished_at) * 1000)::bigint FROM outboxd.deliveries WHERE status = 'dead'",
        );
        push_dead_filter(&mut q, filter);
        q.push(" ORDER BY finished_at DESC LIMIT ")
            .push_bind(limit as i64);
        let rows: Vec<super::DeadRow> = q.build_query_as().fetch_all(&self.pool).await?;
        Ok(super::dead_letters(rows))
    }

    async fn replay_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut q = QueryBuilder::<Postgres>::new(
            "UPDATE outboxd.deliveries SET status = 'pending', attempts = 0, first_attempt_at = NULL, \
             next_attempt_at = now(), finished_at = NULL \
             WHERE id IN (SELECT id FROM outboxd.deliveries WHERE status = 'dead'",
        );
        push_dead_filter(&mut q, filter);
        q.push(" LIMIT ")
            .push_bind(limit as i64)
            .push(" FOR UPDATE) RETURNING id, sink, stream");
        let rows: Vec<(i64, String, String)> = q.build_query_as().fetch_all(&mut *tx).await?;
        let replayed: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let pairs: BTreeSet<(String, String)> = rows
            .iter()
            .map(|(_, sink, stream)| (stream.clone(), sink.clone()))
            .collect();
        let streams: BTreeSet<String> = pairs.iter().map(|(stream, _)| stream.clone()).collect();
        lock_streams(&mut tx, &streams.into_iter().collect::<Vec<_>>()).await?;
        // The replayed letter may sit before its stream's current head.
        for (stream, sink) in pairs {
            sqlx::query(RESET_HEAD_UNLESS_BLOCKED_SQL)
                .bind(&sink)
                .bind(&stream)
                .bind(&replayed)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("SELECT pg_notify($1, 'replay')")
            .bind(WAKE_CHANNEL)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    async fn purge_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut q = QueryBuilder::<Postgres>::new(
            "DELETE FROM outboxd.deliveries WHERE id IN (SELECT id FROM outboxd.deliveries WHERE status = 'dead'",
        );
        push_dead_filter(&mut q, filter);
        q.push(" LIMIT ")
            .push_bind(limit as i64)
            .push(" FOR UPDATE) RETURNING sink, stream, id");
        let rows: Vec<(String, String, i64)> = q.build_query_as().fetch_all(&mut *tx).await?;
        // A purged letter that blocked its stream (`on-dead = "block"`)
        // still holds the head: the stream moves on to its next live
        // delivery. Streams locked in ingest's order (see `finish_in`).
        let mut by_stream: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
        for (sink, stream, id) in &rows {
            by_stream
                .entry((stream.clone(), sink.clone()))
                .or_default()
                .push(*id);
        }
        let streams: BTreeSet<String> =
            by_stream.keys().map(|(stream, _)| stream.clone()).collect();
        lock_streams(&mut tx, &streams.into_iter().collect::<Vec<_>>()).await?;
        for ((stream, sink), ids) in by_stream {
            let held = sqlx::query(
                "DELETE FROM outboxd.heads WHERE sink = $1 AND stream = $2 AND delivery_id = ANY($3)",
            )
            .bind(&sink)
            .bind(&stream)
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if held > 0 {
                sqlx::query(RESET_HEAD_SQL)
                    .bind(&sink)
                    .bind(&stream)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        sqlx::query("SELECT pg_notify($1, 'purge')")
            .bind(WAKE_CHANNEL)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    async fn set_paused(&self, sink: &str, paused: bool) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO outboxd.sink_state (sink, paused) VALUES ($1, $2) \
             ON CONFLICT (sink) DO UPDATE SET paused = EXCLUDED.paused",
        )
        .bind(sink)
        .bind(paused)
        .execute(&self.pool)
        .await?;
        if !paused {
            sqlx::query("SELECT pg_notify($1, 'resume')")
                .bind(WAKE_CHANNEL)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    async fn paused_sinks(&self) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT sink FROM outboxd.sink_state WHERE paused ORDER BY sink")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn purge_delivered(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "DELETE FROM outboxd.deliveries WHERE id IN (SELECT id FROM outboxd.deliveries \
             WHERE status = 'delivered' AND finished_at < now() - $1 * interval '1 millisecond' \
             ORDER BY finished_at LIMIT $2)",
        )
        .bind(older_than.as_millis() as i64)
        .bind(limit as i64)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected())
    }

    async fn backfill_page(
        &self,
        sink: &str,
        since_ms: i64,
        after: i64,
        page: u32,
        route: &RouteFn<'_>,
    ) -> Result<BackfillPage, StoreError> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(&format!(
            "SELECT seq_id, {EVENT_COLUMNS} FROM outboxd.events \
             WHERE seq_id > $1 AND ingested_at >= to_timestamp($2) AND routed ORDER BY seq_id LIMIT $3"
        ))
        .bind(after)
        .bind(since_ms as f64 / 1000.0)
        .bind(page as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut out = BackfillPage {
            scanned: rows.len() as u64,
            ..Default::default()
        };
        let mut routed = Vec::new();
        for row in &rows {
            out.next_after = Some(row.try_get("seq_id")?);
            let stored = super::event_from_row(row)?;
            if route(&stored.event).iter().any(|s| s == sink) {
                routed.push(stored);
            }
        }
        // Stream locks first, as ingest takes them, before adding deliveries
        // and moving heads.
        let touched: BTreeSet<String> = routed.iter().map(|e| e.event.stream.clone()).collect();
        lock_streams(&mut tx, &touched.into_iter().collect::<Vec<_>>()).await?;
        let mut streams = BTreeSet::new();
        for stored in &routed {
            let created = sqlx::query(
                "INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (event_id, sink) DO NOTHING",
            )
            .bind(&stored.event.id)
            .bind(sink)
            .bind(&stored.event.stream)
            .bind(stored.sequence as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if created > 0 {
                out.created += created;
                streams.insert(stored.event.stream.clone());
            }
        }
        let none: Vec<i64> = Vec::new();
        for stream in streams {
            sqlx::query(RESET_HEAD_UNLESS_BLOCKED_SQL)
                .bind(sink)
                .bind(&stream)
                .bind(&none)
                .execute(&mut *tx)
                .await?;
        }
        if out.created > 0 {
            sqlx::query("SELECT pg_notify($1, 'backfill')")
                .bind(WAKE_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if rows.len() < page as usize {
            out.next_after = None;
        }
        Ok(out)
    }

    async fn pending_migrations(&self) -> Result<Vec<String>, StoreError> {
        let applied: Vec<i64> = if self.is_uninitialised().await? {
            Vec::new()
        } else {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.pool)
                .await?
        };
        Ok(MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
            .map(|m| format!("{}_{}", m.version, m.description.replace(' ', "_")))
            .collect())
    }

    async fn is_uninitialised(&self) -> Result<bool, StoreError> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&self.pool)
            .await?;
        Ok(!exists)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        // A locked head left behind claim after claim for a while
        // ([`LOCKED_HEAD_CONFIRM`]) and seen within the last three statement
        // timeouts: a busy loop (full claims) does not look again, so the
        // note ages out.
        let locked = self.locked_heads.lock().unwrap();
        if let Some((sink, LockedHead { stream, due_ms, .. })) = locked.iter().find(|(_, h)| {
            h.first_seen.elapsed() >= LOCKED_HEAD_CONFIRM
                && h.last_seen.elapsed() <= STATEMENT_TIMEOUT * 3
        }) {
            return Err(StoreError::HeadLocked(format!(
                "the head of stream {stream:?} of sink {sink} has been due for {} s and another \
                 session holds it locked (a transaction left idle?); that stream waits, the others \
                 are delivered",
                due_ms / 1000
            )));
        }
        Ok(())
    }

    async fn source_checkpoint(&self, source: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT checkpoint FROM outboxd.source_checkpoints WHERE source = $1",
        )
        .bind(source)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn save_source_checkpoint(
        &self,
        source: &str,
        checkpoint: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO outboxd.source_checkpoints (source, checkpoint, updated_at) VALUES ($1, $2, now()) \
             ON CONFLICT (source) DO UPDATE SET checkpoint = EXCLUDED.checkpoint, updated_at = EXCLUDED.updated_at",
        )
        .bind(source)
        .bind(checkpoint)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn destinations(&self) -> Result<Vec<DestinationRow>, StoreError> {
        let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
            "SELECT name, sink, record, revision, updated_at FROM outboxd.destinations ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(destination_row).collect())
    }

    async fn put_destination(
        &self,
        name: &str,
        sink: &str,
        record: &str,
        mode: PutMode,
    ) -> Result<Option<i64>, StoreError> {
        let sql = match mode {
            PutMode::Create => "INSERT INTO outboxd.destinations (name, sink, record, revision, updated_at) VALUES ($1, $2, $3, 1, (extract(epoch from now()) * 1000)::bigint) \
                 ON CONFLICT (name) DO NOTHING RETURNING revision",
            PutMode::Upsert => "INSERT INTO outboxd.destinations (name, sink, record, revision, updated_at) VALUES ($1, $2, $3, 1, (extract(epoch from now()) * 1000)::bigint) \
                 ON CONFLICT (name) DO UPDATE SET sink = excluded.sink, record = excluded.record, \
                 revision = outboxd.destinations.revision + 1, updated_at = excluded.updated_at RETURNING revision",
            PutMode::Revision(_) => "UPDATE outboxd.destinations SET sink = $2, record = $3, revision = revision + 1, updated_at = (extract(epoch from now()) * 1000)::bigint \
                 WHERE name = $1 AND revision = $4 RETURNING revision",
        };
        let mut query = sqlx::query_scalar(sql).bind(name).bind(sink).bind(record);
        if let PutMode::Revision(r) = mode {
            query = query.bind(r);
        }
        Ok(query.fetch_optional(&self.pool).await?)
    }

    async fn delete_destination(&self, name: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM outboxd.destination_health WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let gone = sqlx::query("DELETE FROM outboxd.destinations WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(gone > 0)
    }

    async fn purge_target(&self, key: &str) -> Result<Purged, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM outboxd.heads WHERE sink = $1")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let dead =
            sqlx::query("DELETE FROM outboxd.deliveries WHERE sink = $1 AND status = 'dead'")
                .bind(key)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        let pending =
            sqlx::query("DELETE FROM outboxd.deliveries WHERE sink = $1 AND status = 'pending'")
                .bind(key)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        tx.commit().await?;
        Ok(Purged { pending, dead })
    }

    async fn destination_health(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT name, health FROM outboxd.destination_health ORDER BY name")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn save_destination_health(&self, name: &str, health: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO outboxd.destination_health (name, health, updated_at) VALUES ($1, $2, (extract(epoch from now()) * 1000)::bigint) \
             ON CONFLICT (name) DO UPDATE SET health = excluded.health, updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(health)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn register_sinks(&self, sinks: &[SinkIdentity]) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut new = Vec::new();
        for s in sinks {
            let row: Option<String> = sqlx::query_scalar("INSERT INTO outboxd.sinks (name, version, component_sha, registered_at) VALUES ($1, $2, $3, (extract(epoch from now()) * 1000)::bigint) \
                 ON CONFLICT (name) DO NOTHING RETURNING name")
            .bind(&s.name)
            .bind(&s.version)
            .bind(&s.component_sha)
            .fetch_optional(&mut *tx)
            .await?;
            new.extend(row);
        }
        tx.commit().await?;
        Ok(new)
    }

    async fn registered_sinks(&self) -> Result<Vec<RegisteredSink>, StoreError> {
        let rows: Vec<(String, String, String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT name, version, component_sha, registered_at, retired_at FROM outboxd.sinks ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(registered_sink).collect())
    }

    async fn beat_replica(&self, replica: &str, sinks: &[SinkIdentity]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM outboxd.sink_replicas WHERE replica = $1 OR beat_at < (extract(epoch from now()) * 1000)::bigint - 3600000")
        .bind(replica)
        .execute(&mut *tx)
        .await?;
        for s in sinks {
            sqlx::query("INSERT INTO outboxd.sink_replicas (replica, sink, version, component_sha, beat_at) VALUES ($1, $2, $3, $4, (extract(epoch from now()) * 1000)::bigint)")
            .bind(replica)
            .bind(&s.name)
            .bind(&s.version)
            .bind(&s.component_sha)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn sink_replicas(&self) -> Result<Vec<SinkReplica>, StoreError> {
        let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as("SELECT replica, sink, version, component_sha, (extract(epoch from now()) * 1000)::bigint - beat_at FROM outboxd.sink_replicas ORDER BY sink, replica")
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(sink_replica).collect())
    }

    async fn retire_sink(&self, name: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query("UPDATE outboxd.sinks SET retired_at = (extract(epoch from now()) * 1000)::bigint WHERE name = $1 AND retired_at IS NULL")
        .bind(name)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0)
    }
}

fn push_dead_filter(q: &mut QueryBuilder<'_, Postgres>, f: &DeadFilter) {
    if let Some(sink) = &f.sink {
        q.push(" AND sink = ").push_bind(sink.clone());
    }
    if let Some(stream) = &f.stream {
        q.push(" AND stream = ").push_bind(stream.clone());
    }
    if let Some(id) = &f.event_id {
        q.push(" AND event_id = ").push_bind(id.clone());
    }
    if let Some(since) = f.since_ms {
        q.push(" AND finished_at >= to_timestamp(")
            .push_bind(since as f64 / 1000.0)
            .push(")");
    }
    if let Some(until) = f.until_ms {
        q.push(" AND finished_at < to_timestamp(")
            .push_bind(until as f64 / 1000.0)
            .push(")");
    }
}

/// Fenced finishes of a batch inside `tx` (see [`Store::finish_many`]),
/// set-based: at most nine statements whatever the batch size.
///
/// 1. Lock the streams whose head may move (delivered, dead), in ingest's
///    order (`COLLATE "C"`): a head moving must not interleave with an
///    ingest adding the stream's next delivery (that ingest's head insert
///    would see the old head and do nothing, then the head would be
///    dropped: the new delivery stranded).
/// 2. One fenced `UPDATE` per kind of outcome, matching (delivery, lease
///    token, pending); what it returns is what was kept.
/// 3. Heads: a head on a delivered or moved-on dead delivery moves to its
///    stream's first live delivery (possibly one of this batch now waiting
///    to retry), or goes when there is none; a blocking dead letter becomes
///    its stream's head, due never; a head waiting to retry, or released,
///    takes its delivery's next attempt time.
async fn finish_batch(
    tx: &mut Transaction<'_, Postgres>,
    items: &[(i64, &str, &Finish)],
) -> Result<Vec<bool>, StoreError> {
    let mut kept = vec![false; items.len()];
    let index: std::collections::HashMap<i64, usize> = items
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| (*id, i))
        .collect();

    let moving: Vec<i64> = items
        .iter()
        .filter(|(_, _, f)| matches!(f, Finish::Delivered | Finish::Dead { .. }))
        .map(|(id, _, _)| *id)
        .collect();
    if !moving.is_empty() {
        sqlx::query(
            "SELECT 1 FROM outboxd.streams WHERE stream IN \
               (SELECT stream FROM outboxd.deliveries WHERE id = ANY($1)) \
             ORDER BY stream COLLATE \"C\" FOR UPDATE",
        )
        .bind(&moving)
        .execute(&mut **tx)
        .await?;
    }

    // (delivery, sink, stream) of each kept outcome, by kind.
    let mut moved: Vec<(i64, String, String)> = Vec::new();
    let mut blocked: Vec<(i64, String, String)> = Vec::new();
    let mut waiting: Vec<(i64, String, String)> = Vec::new();
    let clear = "lease_token = NULL, lease_expires_at = NULL";
    let fence = "d.id = f.id AND d.lease_token = f.token AND d.status = 'pending' \
                 RETURNING d.id, d.sink, d.stream";

    let (ids, tokens) = pick(items, |f| matches!(f, Finish::Delivered).then_some(()));
    if !ids.is_empty() {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(&format!(
            "UPDATE outboxd.deliveries d SET status = 'delivered', finished_at = now(), last_error = NULL, {clear} \
             FROM unnest($1::bigint[], $2::text[]) AS f(id, token) WHERE {fence}"
        ))
        .bind(&ids)
        .bind(&tokens)
        .fetch_all(&mut **tx)
        .await?;
        moved.extend(rows);
    }

    let (ids, tokens, extra) = pick_with(items, |f| match f {
        Finish::Retry { delay, reason } => Some((delay.as_millis() as i64, reason.clone())),
        _ => None,
    });
    if !ids.is_empty() {
        let (delays, reasons): (Vec<i64>, Vec<String>) = extra.into_iter().unzip();
        let rows: Vec<(i64, String, String)> = sqlx::query_as(&format!(
            "UPDATE outboxd.deliveries d SET next_attempt_at = now() + f.delay * interval '1 millisecond', \
             last_error = f.reason, {clear} \
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[]) AS f(id, token, delay, reason) \
             WHERE {fence}"
        ))
        .bind(&ids)
        .bind(&tokens)
        .bind(&delays)
        .bind(&reasons)
        .fetch_all(&mut **tx)
        .await?;
        waiting.extend(rows);
    }

    // A blocking dead letter must be its stream's first undelivered
    // delivery (the delivered ones of this batch are already marked). When
    // an earlier one is still pending or blocking (its lease was taken over
    // after this batch was claimed, model/README.md `NO_BLOCK_HEAD_CHECK`),
    // it is released to wait behind it instead.
    let blocking_ids: Vec<i64> = items
        .iter()
        .filter(|(_, _, f)| {
            matches!(
                f,
                Finish::Dead {
                    blocks_stream: true,
                    ..
                }
            )
        })
        .map(|(id, _, _)| *id)
        .collect();
    let mut rewritten: Vec<(i64, &str, &Finish)> = items.to_vec();
    if !blocking_ids.is_empty() {
        let behind: std::collections::HashSet<i64> = sqlx::query_scalar(BEHIND_EARLIER_SQL)
            .bind(&blocking_ids)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .collect();
        for item in rewritten.iter_mut() {
            if behind.contains(&item.0) {
                item.2 = &Finish::Release;
            }
        }
    }
    let items = &rewritten[..];

    let (ids, tokens, extra) = pick_with(items, |f| match f {
        Finish::Dead {
            reason,
            blocks_stream,
        } => Some((reason.clone(), *blocks_stream)),
        _ => None,
    });
    if !ids.is_empty() {
        let (reasons, blocks): (Vec<String>, Vec<bool>) = extra.into_iter().unzip();
        let rows: Vec<(i64, String, String)> = sqlx::query_as(&format!(
            "UPDATE outboxd.deliveries d SET status = 'dead', finished_at = now(), last_error = f.reason, {clear} \
             FROM unnest($1::bigint[], $2::text[], $3::text[]) AS f(id, token, reason) WHERE {fence}"
        ))
        .bind(&ids)
        .bind(&tokens)
        .bind(&reasons)
        .fetch_all(&mut **tx)
        .await?;
        let blocking: std::collections::HashSet<i64> = ids
            .iter()
            .zip(&blocks)
            .filter(|(_, b)| **b)
            .map(|(id, _)| *id)
            .collect();
        for row in rows {
            if blocking.contains(&row.0) {
                blocked.push(row);
            } else {
                moved.push(row);
            }
        }
    }

    let (ids, tokens) = pick(items, |f| matches!(f, Finish::Release).then_some(()));
    if !ids.is_empty() {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(&format!(
            "UPDATE outboxd.deliveries d SET attempts = d.attempts - 1, \
             first_attempt_at = CASE WHEN d.attempts <= 1 THEN NULL ELSE d.first_attempt_at END, {clear} \
             FROM unnest($1::bigint[], $2::text[]) AS f(id, token) WHERE {fence}"
        ))
        .bind(&ids)
        .bind(&tokens)
        .fetch_all(&mut **tx)
        .await?;
        waiting.extend(rows);
    }

    for (id, _, _) in moved.iter().chain(&blocked).chain(&waiting) {
        if let Some(i) = index.get(id) {
            kept[*i] = true;
        }
    }

    if !moved.is_empty() {
        let (ids, sinks, streams) = columns(&moved);
        sqlx::query(MOVE_HEADS_SQL)
            .bind(&ids)
            .bind(&sinks)
            .bind(&streams)
            .execute(&mut **tx)
            .await?;
        // Heads still on a finished delivery had no live one behind them.
        sqlx::query(
            "DELETE FROM outboxd.heads h USING unnest($1::bigint[], $2::text[], $3::text[]) AS m(id, sink, stream) \
             WHERE h.sink = m.sink AND h.stream = m.stream AND h.delivery_id = m.id",
        )
        .bind(&ids)
        .bind(&sinks)
        .bind(&streams)
        .execute(&mut **tx)
        .await?;
    }
    if !blocked.is_empty() {
        // Everything before a blocking dead letter in this batch was
        // delivered and everything after it released: it is the first
        // undelivered delivery of its stream, so it becomes the head.
        let (ids, sinks, streams) = columns(&blocked);
        sqlx::query(
            "INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
             SELECT sink, stream, id, 'infinity' FROM unnest($1::bigint[], $2::text[], $3::text[]) AS b(id, sink, stream) \
             ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = EXCLUDED.delivery_id, due_at = 'infinity'",
        )
        .bind(&ids)
        .bind(&sinks)
        .bind(&streams)
        .execute(&mut **tx)
        .await?;
    }
    if !waiting.is_empty() {
        let (ids, sinks, streams) = columns(&waiting);
        sqlx::query(
            "UPDATE outboxd.heads h SET due_at = d.next_attempt_at \
             FROM unnest($1::bigint[], $2::text[], $3::text[]) AS w(id, sink, stream) \
             JOIN outboxd.deliveries d ON d.id = w.id \
             WHERE h.sink = w.sink AND h.stream = w.stream AND h.delivery_id = w.id",
        )
        .bind(&ids)
        .bind(&sinks)
        .bind(&streams)
        .execute(&mut **tx)
        .await?;
    }
    Ok(kept)
}

/// Ids and lease tokens of the items whose finish `want` picks.
fn pick(
    items: &[(i64, &str, &Finish)],
    want: impl Fn(&Finish) -> Option<()>,
) -> (Vec<i64>, Vec<String>) {
    let (ids, tokens, _) = pick_with(items, want);
    (ids, tokens)
}

/// Ids, lease tokens and what `want` extracts, of the items it picks.
fn pick_with<T>(
    items: &[(i64, &str, &Finish)],
    want: impl Fn(&Finish) -> Option<T>,
) -> (Vec<i64>, Vec<String>, Vec<T>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (id, token, finish) in items {
        if let Some(extra) = want(finish) {
            out.0.push(*id);
            out.1.push(token.to_string());
            out.2.push(extra);
        }
    }
    out
}

/// (delivery, sink, stream) rows as three arrays for `unnest`.
fn columns(rows: &[(i64, String, String)]) -> (Vec<i64>, Vec<String>, Vec<String>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (id, sink, stream) in rows {
        out.0.push(*id);
        out.1.push(sink.clone());
        out.2.push(stream.clone());
    }
    out
}
