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
//! - a finish locks the heads of its batch first, and an ingest locks
//!   every existing head it adds a delivery behind, both in (sink, stream)
//!   byte order, so a head change and an ingest of the same (sink, stream)
//!   never interleave (otherwise the new delivery could be left without a
//!   head, and delivered out of order or never) — and finishes of other
//!   sinks on the same stream wait for neither;
//! - every connection carries a `statement_timeout`, so no call can hang;
//! - the delivery loops' calls hold at most
//!   [`limits::PG_DELIVERY_CONNECTIONS`] of the pool at once, so an ingest
//!   never queues behind a thousand destinations' claims and finishes.
//!
//! Must never: compute a time from the process clock, or hold a
//! transaction open across a plugin call.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres, Row, Transaction};
use tokio::sync::watch;

use super::plan::{self, FinishPlan, HeadChanges, IngestInputs, IngestPlan, KeptRow};
use super::sql::{Dialect, Sql, SqlTx};
use super::{
    new_lease_token, shared, AttemptNote, Claimed, Finish, HeadLock, IngestError, IngestItem,
    Ingested, RouteFn, Store, StoreError, StoredEvent,
};
use crate::event::NewEvent;
use crate::limits;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Channel of the wake-up notifications sent on ingest.
pub const WAKE_CHANNEL: &str = "outboxd_wake";

/// The transaction-level advisory lock key the router holds while it routes
/// (`pg_try_advisory_xact_lock`), so that one replica routes at a time: the
/// bytes of `outbox` (0x6f7574626f78).
pub const ROUTER_LOCK: i64 = 0x6f75_7462_6f78;

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

/// The heads of stream `$1` another session holds locked: the claim's own
/// lock (`FOR UPDATE OF h, d SKIP LOCKED`) taken on every head of the
/// stream and released with the statement; those it skips are held, and
/// the holder is the session whose transaction id is the row's `xmax`
/// (a lock shared by several is a multixact and names no session).
pub const HEAD_LOCKS_SQL: &str = "WITH free AS (\
       SELECT h.sink FROM outboxd.heads h JOIN outboxd.deliveries d ON d.id = h.delivery_id \
       WHERE h.stream = $1 FOR UPDATE OF h, d SKIP LOCKED) \
     SELECT h.sink, a.pid, a.application_name, host(a.client_addr), a.state, \
       (extract(epoch FROM a.xact_start) * 1000)::bigint \
     FROM outboxd.heads h JOIN outboxd.deliveries d ON d.id = h.delivery_id \
     LEFT JOIN pg_stat_activity a ON a.backend_xid IN (h.xmax, d.xmax) \
     WHERE h.stream = $1 AND h.sink NOT IN (SELECT sink FROM free) ORDER BY h.sink";

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

/// Finish step 1: lock the heads of the (sink, stream) pairs of `$1`
/// (delivery ids), in (sink, stream) byte order — the order ingest's head
/// insert takes them in — so a finish and an ingest never wait on each
/// other in opposite orders.
pub const LOCK_FINISHING_HEADS_SQL: &str = "SELECT 1 FROM outboxd.heads h \
     WHERE (h.sink, h.stream) IN (SELECT sink, stream FROM outboxd.deliveries WHERE id = ANY($1)) \
     ORDER BY h.sink COLLATE \"C\", h.stream COLLATE \"C\" FOR UPDATE";

/// The PostgreSQL store.
pub struct PgStore {
    pool: PgPool,
    url: String,
    /// The server-side limit on each statement.
    statement_timeout: Duration,
    /// By sink, the head a claim with room for it last left behind because
    /// it is locked. [`Store::ping`] fails while one was seen recently.
    locked_heads: std::sync::Mutex<BTreeMap<String, LockedHead>>,
    /// By sink, when a claim last looked for a locked head: at most once
    /// per [`limits::LOCKED_HEAD_LOOK_EVERY`], so a loop whose claims come
    /// back short does not send a second query with every claim.
    looked: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Turns of the delivery loops' calls (claim, finish, next due time):
    /// [`limits::PG_DELIVERY_CONNECTIONS`] at once, first come first
    /// served, so however many destinations are busy, the rest of the pool
    /// is free for ingest and everything else.
    delivery_turns: tokio::sync::Semaphore,
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
    /// Connect: a pool of [`limits::PG_POOL_SIZE`] connections, each
    /// carrying `statement_timeout` (`delivery.db-timeout` for the daemon)
    /// so no statement outlives the call that waits for it.
    pub async fn open(url: &str, statement_timeout: Duration) -> Result<PgStore, StoreError> {
        let options = PgConnectOptions::from_str(url)?
            .options([(
                "statement_timeout",
                format!("{}", statement_timeout.as_millis()),
            )])
            .application_name("outboxd");
        let pool = PgPoolOptions::new()
            .max_connections(limits::PG_POOL_SIZE)
            .acquire_timeout(limits::PG_ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        Ok(PgStore {
            pool,
            url: url.to_string(),
            statement_timeout,
            locked_heads: Default::default(),
            looked: Default::default(),
            delivery_turns: tokio::sync::Semaphore::new(limits::PG_DELIVERY_CONNECTIONS),
        })
    }

    /// Wait for a turn of the delivery loops ([`PgStore::delivery_turns`]);
    /// held until the returned permit drops. The semaphore is never closed.
    async fn delivery_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.delivery_turns.acquire().await.ok()
    }

    /// After a claim of `sink` that took `claimed` of `limit`: when it had
    /// room, look for a head it left behind that has been due longer than
    /// a statement may wait — one another session holds locked — and note
    /// it (or that there is none) for [`Store::ping`]. A full claim says
    /// nothing: the rest may simply be a backlog.
    async fn note_locked_head(&self, sink: &str, claimed: usize, limit: u32) {
        if claimed >= limit as usize {
            return;
        }
        {
            let mut looked = self.looked.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            match looked.get(sink) {
                Some(at) if now.duration_since(*at) < limits::LOCKED_HEAD_LOOK_EVERY => return,
                _ => {
                    looked.insert(sink.to_string(), now);
                }
            }
        }
        let overdue: Result<Option<(String, i64)>, sqlx::Error> = sqlx::query_as(OVERDUE_HEAD_SQL)
            .bind(sink)
            .bind(self.statement_timeout.as_millis() as i64)
            .fetch_optional(&self.pool)
            .await;
        let mut locked = self.locked_heads.lock().unwrap_or_else(|e| e.into_inner());
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

    /// A locked head left behind claim after claim for a while
    /// ([`limits::LOCKED_HEAD_CONFIRM`]) and seen within the last three
    /// statement timeouts (a busy loop, whose claims are full, does not
    /// look again, so the note ages out), as the error `/ready` shows.
    fn locked_head(&self) -> Option<StoreError> {
        let locked = self.locked_heads.lock().unwrap_or_else(|e| e.into_inner());
        let (sink, head) = locked.iter().find(|(_, h)| {
            h.first_seen.elapsed() >= limits::LOCKED_HEAD_CONFIRM
                && h.last_seen.elapsed() <= self.statement_timeout * 3
        })?;
        Some(StoreError::HeadLocked(format!(
            "the head of stream {:?} of sink {sink} has been due for {} s and another \
             session holds it locked (a transaction left idle?); that stream waits, the others \
             are delivered",
            head.stream,
            head.due_ms / 1000
        )))
    }
}

/// The event columns, as every read of events selects them first.
static EVENT_COLUMNS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| super::event_columns(&DIALECT));

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
    /// The producer that posted each event (`None`: anonymous or a source).
    producer: Vec<Option<String>>,
    /// Deliveries, as parallel columns: event id, sink, stream, sequence.
    d_event: Vec<String>,
    d_sink: Vec<String>,
    d_stream: Vec<String>,
    d_sequence: Vec<i64>,
}

impl NewRows {
    fn push_event(
        &mut self,
        ev: &NewEvent,
        producer: Option<&str>,
        sequence: u64,
        hash: String,
        routed: bool,
    ) {
        self.producer.push(producer.map(str::to_string));
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
             sequence, producer_sequence, extensions, data, data_format, content_hash, routed, producer) \
             SELECT id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
                    producer_sequence, extensions, data, data_format, content_hash, routed, producer \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
                         $8::text[], $9::bigint[], $10::bool[], $11::text[], $12::bytea[], $13::text[], \
                         $14::text[], $15::bool[], $16::text[]) WITH ORDINALITY \
               AS e(id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
                    producer_sequence, extensions, data, data_format, content_hash, routed, producer, n) \
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
        .bind(&self.producer)
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
///
/// A head that already exists is locked, not changed (`DO UPDATE … WHERE
/// false` locks every conflicting row: PostgreSQL, INSERT, "ON CONFLICT
/// Clause"), in (sink, stream) byte order as [`finish_batch`] locks heads:
/// a finish moving that head waits for this commit and then sees the new
/// delivery, or has moved it first and this insert sees the move (a head
/// dropped meanwhile is inserted anew). Only this (sink, stream) pair
/// waits: finishes of other sinks on the same stream never do.
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
         INSERT INTO outboxd.heads AS h (sink, stream, delivery_id, due_at) \
         SELECT DISTINCT ON (sink COLLATE \"C\", stream COLLATE \"C\") sink, stream, id, now() FROM d \
         ORDER BY sink COLLATE \"C\", stream COLLATE \"C\", sequence \
         ON CONFLICT (sink, stream) DO UPDATE SET due_at = h.due_at WHERE false",
    )
    .bind(events)
    .bind(sinks)
    .bind(streams)
    .bind(sequences)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl PgStore {
    /// What an ingest request finds stored, read under the locks of its
    /// streams' rows (taken here, in byte order, creating missing rows).
    async fn ingest_inputs(
        tx: &mut Transaction<'_, Postgres>,
        items: &[IngestItem],
    ) -> Result<IngestInputs, StoreError> {
        // Lock every stream row this request touches, in byte order (COLLATE
        // "C", the order Rust sorts in and finishes lock in), so ingest and
        // finish never lock two streams in opposite orders.
        let streams: BTreeSet<&str> = items.iter().map(|i| i.event.stream.as_str()).collect();
        let streams: Vec<&str> = streams.into_iter().collect();
        sqlx::query(
            "INSERT INTO outboxd.streams (stream, last_sequence) SELECT s, 0 FROM unnest($1::text[]) AS s \
             ORDER BY s COLLATE \"C\" ON CONFLICT (stream) DO NOTHING",
        )
        .bind(&streams)
        .execute(&mut **tx)
        .await?;
        let last: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, last_sequence FROM outboxd.streams WHERE stream = ANY($1) ORDER BY stream COLLATE \"C\" FOR UPDATE",
        )
        .bind(&streams)
        .fetch_all(&mut **tx)
        .await?;
        let unrouted: BTreeSet<String> = sqlx::query_scalar(
            "SELECT DISTINCT stream FROM outboxd.events WHERE NOT routed AND stream = ANY($1)",
        )
        .bind(&streams)
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .collect();
        // Events of this request already stored, in one statement.
        let ids: Vec<&str> = items.iter().map(|i| i.event.id.as_str()).collect();
        let mut stored = HashMap::new();
        for row in sqlx::query(&format!(
            "SELECT {}, content_hash FROM outboxd.events WHERE id = ANY($1)",
            *EVENT_COLUMNS
        ))
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await?
        {
            let hash: Option<String> = row.try_get("content_hash")?;
            let event = super::event_from_row(&row)?;
            stored.insert(event.event.id.clone(), (hash, event));
        }
        Ok(IngestInputs {
            stored,
            last: last.into_iter().map(|(s, n)| (s, n as u64)).collect(),
            unrouted,
        })
    }

    /// Write what [`plan::plan_ingest`] planned: one statement for the
    /// events, one for the deliveries and heads, one for the streams' last
    /// sequences, and the wake-up naming the delivery keys queued (`*` when
    /// the router must run).
    async fn write_ingest(
        tx: &mut Transaction<'_, Postgres>,
        items: &[IngestItem],
        plan: &IngestPlan,
    ) -> Result<(), StoreError> {
        let mut rows = NewRows::default();
        let mut sequences = HashMap::new();
        for row in &plan.events {
            let item = &items[row.index];
            rows.push_event(
                &item.event,
                item.producer.as_deref(),
                row.sequence,
                row.content_hash.clone(),
                row.routed,
            );
            sequences.insert(row.index, row.sequence);
        }
        for (index, key) in &plan.deliveries {
            let ev = &items[*index].event;
            rows.push_delivery(&ev.id, key, &ev.stream, sequences[index]);
        }
        rows.insert(tx).await?;
        if !plan.last_sequences.is_empty() {
            let (names, values): (Vec<&str>, Vec<i64>) = plan
                .last_sequences
                .iter()
                .map(|(s, n)| (s.as_str(), *n as i64))
                .unzip();
            sqlx::query(
                "UPDATE outboxd.streams AS s SET last_sequence = v.n \
                 FROM unnest($1::text[], $2::bigint[]) AS v(stream, n) WHERE s.stream = v.stream",
            )
            .bind(&names)
            .bind(&values)
            .execute(&mut **tx)
            .await?;
        }
        if plan.queued() {
            let payload = if plan.route_later {
                "*".to_string()
            } else {
                crate::wakeups::payload(plan.deliveries.iter().map(|(_, k)| k.as_str()))
            };
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(WAKE_CHANNEL)
                .bind(payload)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    async fn ingest_once(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        let inputs = Self::ingest_inputs(&mut tx, items).await?;
        let plan = plan::plan_ingest(items, &inputs)?;
        Self::write_ingest(&mut tx, items, &plan).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(plan.answers)
    }
}

crate::sql_tx!(PgTx, Postgres);

/// The PostgreSQL spelling of the shared templates ([`super::sql`]):
/// delivery-table times are `timestamptz`, registry times Unix-ms bigints.
static DIALECT: Dialect = Dialect {
    schema: "outboxd.",
    now_ms: "(extract(epoch FROM now()) * 1000)::bigint",
    now: "now()",
    question_marks: false,
    greatest: "GREATEST",
    time_as_ms: "(extract(epoch FROM {}) * 1000)::bigint",
    ms_as_time: "to_timestamp({}::bigint / 1000.0)",
    ms_ago: "(now() - {}::bigint * interval '1 millisecond')",
    ms_ahead: "(now() + {}::bigint * interval '1 millisecond')",
    // A probe must answer fast even under a huge backlog.
    probe_timeout: Some("SET LOCAL statement_timeout = {probe_ms}"),
    blocked_due: "'infinity'",
    for_update: " FOR UPDATE",
    lock_stream: Some("SELECT 1 FROM outboxd.streams WHERE stream = $1 FOR UPDATE"),
    routed_only: " AND routed",
    no_migrations: "SELECT to_regclass('_sqlx_migrations') IS NULL",
    notify: Some("SELECT pg_notify('outboxd_wake', $1)"),
};

#[async_trait]
impl Sql for PgStore {
    fn dialect(&self) -> &'static Dialect {
        &DIALECT
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    async fn begin(&self) -> Result<Box<dyn SqlTx + '_>, sqlx::Error> {
        Ok(Box::new(PgTx(self.pool.begin().await?)))
    }

    async fn begin_read(&self) -> Result<Box<dyn SqlTx + '_>, sqlx::Error> {
        self.begin().await
    }
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
        let mut tx = PgTx(self.pool.begin().await?);
        let heads: Vec<(String, i64)> = sqlx::query_as(CLAIM_HEADS_SQL)
            .bind(sink)
            .bind(limit as i64)
            .fetch_all(&mut *tx.0)
            .await?;
        if heads.is_empty() {
            tx.0.commit().await?;
            return Ok(Vec::new());
        }
        // Contiguous runs behind the heads we now hold locked.
        let room = (limit as usize).saturating_sub(heads.len());
        let followers: Vec<(i64, String, bool)> = if room > 0 {
            let head_ids: Vec<i64> = heads.iter().map(|h| h.1).collect();
            sqlx::query_as(CLAIM_RUNS_SQL)
                .bind(sink)
                .bind(&head_ids)
                .bind(room as i64)
                .fetch_all(&mut *tx.0)
                .await?
        } else {
            Vec::new()
        };
        let order = plan::take_runs(&heads, followers, limit as usize);
        let (ids, streams) =
            shared::apply_after(self, &mut tx, sink, after, &heads, &order).await?;
        if ids.is_empty() {
            tx.0.commit().await?;
            return Ok(Vec::new());
        }
        let token = new_lease_token();
        let leased = take_leases(&mut tx.0, sink, &ids, &streams, &token, lease).await?;
        let event_ids: Vec<String> = leased.iter().map(|row| row.event_id.clone()).collect();
        let mut events: BTreeMap<String, StoredEvent> = BTreeMap::new();
        for row in sqlx::query(&format!(
            "SELECT {} FROM outboxd.events WHERE id = ANY($1)",
            *EVENT_COLUMNS
        ))
        .bind(&event_ids)
        .fetch_all(&mut *tx.0)
        .await?
        {
            let ev = super::event_from_row(&row)?;
            events.insert(ev.event.id.clone(), ev);
        }
        tx.0.commit().await?;
        plan::assemble_claims(leased, &events, &token)
    }
}

#[async_trait]
impl Store for PgStore {
    fn sql(&self) -> &dyn Sql {
        self
    }

    async fn ingest(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.ingest_once(items).await {
                Ok(out) => return Ok(out),
                Err(e) if attempt < INGEST_ATTEMPTS && is_retryable(&e) => {
                    tracing::debug!(attempt, "ingest transaction lost a race, retrying: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn claim_after(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
        after: Option<&str>,
    ) -> Result<Vec<Claimed>, StoreError> {
        let _turn = self.delivery_turn().await;
        let claimed = self.claim_once(sink, limit, lease, after).await?;
        self.note_locked_head(sink, claimed.len(), limit).await;
        Ok(claimed)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        shared::ping(self).await?;
        match self.locked_head() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn finish_noted(
        &self,
        items: &[(i64, &str, &Finish)],
        notes: &[Option<AttemptNote>],
    ) -> Result<Vec<bool>, StoreError> {
        // One transaction (one commit, one fsync) and a fixed number of
        // statements for a whole batch, whatever its size.
        let _turn = self.delivery_turn().await;
        let mut tx = PgTx(self.pool.begin().await?);
        let kept = finish_batch(self, &mut tx, items, notes).await?;
        tx.0.commit().await?;
        Ok(kept)
    }

    async fn next_due_in(&self, sink: &str) -> Result<Option<Duration>, StoreError> {
        let _turn = self.delivery_turn().await;
        let wait: Option<i64> = sqlx::query_scalar(
            "SELECT (extract(epoch FROM (MIN(due_at) - now())) * 1000)::bigint FROM outboxd.heads \
             WHERE sink = $1 AND due_at < 'infinity'",
        )
        .bind(sink)
        .fetch_one(&self.pool)
        .await?;
        Ok(wait.map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    async fn head_locks(&self, stream: &str) -> Result<Vec<HeadLock>, StoreError> {
        type Row = (
            String,
            Option<i32>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<i64>,
        );
        let rows: Vec<Row> = sqlx::query_as(HEAD_LOCKS_SQL)
            .bind(stream)
            .fetch_all(&self.pool)
            .await?;
        let mut out: Vec<HeadLock> = Vec::with_capacity(rows.len());
        for (sink, pid, application, client, state, since_ms) in rows {
            // Both rows held by the same session match it twice.
            if out.last().is_some_and(|l| l.sink == sink) {
                continue;
            }
            out.push(HeadLock {
                sink,
                pid,
                application,
                client,
                state,
                since_ms,
            });
        }
        Ok(out)
    }

    async fn route_pending(&self, route: &RouteFn<'_>, limit: u32) -> Result<usize, StoreError> {
        let mut tx = PgTx(self.pool.begin().await?);
        // One router at a time over the whole database: two replicas each
        // routing a page of one stream could otherwise commit the later
        // page first, and its event would become the stream's head ahead
        // of the earlier ones. Held until this transaction ends, so also
        // while a router that gave up on its timeout is still rolling back.
        let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(ROUTER_LOCK)
            .fetch_one(&mut *tx.0)
            .await?;
        if !ours {
            // Another replica is routing; it takes what this one would have.
            return Ok(0);
        }
        let rows = sqlx::query(&format!(
            "SELECT {} FROM outboxd.events WHERE NOT routed ORDER BY seq_id LIMIT $1 \
             FOR UPDATE SKIP LOCKED",
            *EVENT_COLUMNS
        ))
        .bind(limit as i64)
        .fetch_all(&mut *tx.0)
        .await?;
        if rows.is_empty() {
            tx.0.commit().await?;
            return Ok(0);
        }
        let events = rows
            .iter()
            .map(super::event_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let streams: BTreeSet<String> = events.iter().map(|e| e.event.stream.clone()).collect();
        shared::lock_streams(self, &mut tx, &streams).await?;
        // The page's deliveries with one statement and its events marked
        // routed with another, as ingest writes a request: two round trips
        // per page, not two per event.
        let (mut ids, mut hashes) = (Vec::new(), Vec::new());
        let (mut d_events, mut d_sinks, mut d_streams, mut d_sequences) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for stored in &events {
            for sink in route(&stored.event) {
                d_events.push(stored.event.id.clone());
                d_sinks.push(sink);
                d_streams.push(stored.event.stream.clone());
                d_sequences.push(stored.sequence as i64);
            }
            ids.push(stored.event.id.clone());
            hashes.push(stored.event.content_hash());
        }
        let queued = !d_events.is_empty();
        insert_deliveries(&mut tx.0, &d_events, &d_sinks, &d_streams, &d_sequences).await?;
        sqlx::query(
            "UPDATE outboxd.events AS e SET routed = true, content_hash = u.hash \
             FROM unnest($1::text[], $2::text[]) AS u(id, hash) WHERE e.id = u.id",
        )
        .bind(&ids)
        .bind(&hashes)
        .execute(&mut *tx.0)
        .await?;
        if queued {
            // A failed statement aborts the transaction: its error is the
            // answer, not a commit that silently rolls back.
            sqlx::query("SELECT pg_notify($1, 'routed')")
                .bind(WAKE_CHANNEL)
                .execute(&mut *tx.0)
                .await?;
        }
        tx.0.commit().await?;
        Ok(rows.len())
    }

    fn forward_wakeups(&self, wake: Arc<crate::wakeups::Wakeups>, mut stop: watch::Receiver<bool>) {
        let url = self.url.clone();
        tokio::spawn(async move {
            let mut backoff = limits::LISTEN_RETRY_FIRST;
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
                        backoff = limits::LISTEN_RETRY_FIRST;
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
                backoff = (backoff * 2).min(limits::LISTEN_RETRY_MAX);
            }
        });
    }

    async fn migrate_each(&self, applied: &mut super::OnApplied<'_>) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        super::migrate::run_each(&MIGRATOR, &mut *conn, applied).await?;
        Ok(())
    }
}

/// Lease `ids` with `token` for `lease` from the database's now (counting
/// the attempt) and move the heads of `streams` to the lease's end.
async fn take_leases(
    conn: &mut sqlx::PgConnection,
    sink: &str,
    ids: &[i64],
    streams: &[String],
    token: &str,
    lease: Duration,
) -> Result<Vec<plan::LeasedRow>, StoreError> {
    let rows = sqlx::query(
        "UPDATE outboxd.deliveries SET lease_token = $2, lease_expires_at = now() + $3 * interval '1 millisecond', \
           attempts = attempts + 1, first_attempt_at = COALESCE(first_attempt_at, now()) \
         WHERE id = ANY($1) AND status = 'pending' \
         RETURNING id, event_id, attempts, \
           (extract(epoch FROM first_attempt_at) * 1000)::bigint AS first_ms, \
           (extract(epoch FROM now()) * 1000)::bigint AS now_ms",
    )
    .bind(ids)
    .bind(token)
    .bind(lease.as_millis() as i64)
    .fetch_all(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE outboxd.heads SET due_at = now() + $3 * interval '1 millisecond' \
         WHERE sink = $1 AND stream = ANY($2)",
    )
    .bind(sink)
    .bind(streams)
    .bind(lease.as_millis() as i64)
    .execute(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(plan::LeasedRow {
                delivery_id: row.try_get("id")?,
                event_id: row.try_get("event_id")?,
                attempts: row.try_get::<i32, _>("attempts")? as u32,
                first_attempt_at_ms: row.try_get("first_ms")?,
                claimed_at_ms: row.try_get("now_ms")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Fenced finishes of a batch inside `tx` (see [`Store::finish_many`]),
/// as [`FinishPlan`] orders them, set-based: at most nine statements
/// whatever the batch size.
///
/// 1. Lock the heads of the batch's (sink, stream) pairs, in (sink,
///    stream) byte order as ingest's head insert locks them
///    ([`insert_deliveries`]): a head moving must not interleave with an
///    ingest adding the stream's next delivery (that ingest's head insert
///    would see the old head and do nothing, then the head would be
///    dropped: the new delivery stranded). Heads, not the streams' rows:
///    fifty destinations finishing on one stream do not queue behind each
///    other, nor an ingest behind all of them.
/// 2. One fenced `UPDATE` per kind of outcome, matching (delivery, lease
///    token, pending); what it returns is what was kept.
/// 3. Heads, as [`HeadChanges`] says.
/// 4. Only when some kept finish is a failure: its row of `attempts`
///    ([`shared::record_failures`]).
async fn finish_batch(
    store: &PgStore,
    tx: &mut PgTx,
    items: &[(i64, &str, &Finish)],
    notes: &[Option<AttemptNote>],
) -> Result<Vec<bool>, StoreError> {
    let mut plan = FinishPlan::new(items);
    let ids: Vec<i64> = items.iter().map(|(id, _, _)| *id).collect();
    sqlx::query(LOCK_FINISHING_HEADS_SQL)
        .bind(&ids)
        .execute(&mut *tx.0)
        .await?;
    let mut heads = HeadChanges::default();
    let set = "status = 'delivered', finished_at = now(), last_error = NULL";
    let kept = fenced_update(tx, set, "", fenced(&plan.delivered), None).await?;
    heads.moved.extend(kept);
    let (ids, extra): (Vec<_>, Vec<_>) = plan
        .retry
        .iter()
        .map(|(f, delay, reason)| (*f, (*delay, reason.to_string())))
        .unzip();
    let (delays, reasons): (Vec<i64>, Vec<String>) = extra.into_iter().unzip();
    let set = "next_attempt_at = now() + f.delay * interval '1 millisecond', last_error = f.reason";
    let columns = ", $3::bigint[], $4::text[]) AS f(id, token, delay, reason";
    let extra = Some((Extra::Ints(delays), reasons));
    let retried = fenced_update(tx, set, columns, fenced(&ids), extra).await?;
    let mut failed: HashSet<i64> = retried.iter().map(|row| row.0).collect();
    heads.waiting.extend(retried);
    let behind = shared::behind_earlier(store, tx, &plan.blocking).await?;
    plan.settle(items, &behind);
    let (dead, reasons): (Vec<_>, Vec<String>) = plan
        .dead
        .iter()
        .map(|(f, reason, _)| (*f, reason.to_string()))
        .unzip();
    let set = "status = 'dead', finished_at = now(), last_error = f.reason";
    let columns = ", $3::text[]) AS f(id, token, reason";
    let extra = Some((Extra::None, reasons));
    let kept = fenced_update(tx, set, columns, fenced(&dead), extra).await?;
    failed.extend(kept.iter().map(|row| row.0));
    heads.add_dead(kept, &plan);
    let set = "attempts = d.attempts - 1, \
               first_attempt_at = CASE WHEN d.attempts <= 1 THEN NULL ELSE d.first_attempt_at END";
    let kept = fenced_update(tx, set, "", fenced(&plan.release), None).await?;
    heads.waiting.extend(kept);
    apply_heads(tx, &heads).await?;
    if !failed.is_empty() {
        shared::record_failures(store, tx, items, notes, &failed).await?;
    }
    Ok(heads.kept(items))
}

/// Ids and lease tokens as two arrays for `unnest`.
fn fenced(items: &[plan::Fenced<'_>]) -> (Vec<i64>, Vec<String>) {
    items
        .iter()
        .map(|(id, token)| (*id, token.to_string()))
        .unzip()
}

/// A third `unnest` column of [`fenced_update`], before the reasons.
enum Extra {
    None,
    Ints(Vec<i64>),
}

/// One fenced `UPDATE … SET {set}` over `(ids, tokens)` (and, with
/// `extra`, more columns named by `columns`), kept only where the delivery
/// still holds its token: the (delivery, key, stream) rows changed.
async fn fenced_update(
    tx: &mut PgTx,
    set: &str,
    columns: &str,
    (ids, tokens): (Vec<i64>, Vec<String>),
    extra: Option<(Extra, Vec<String>)>,
) -> Result<Vec<KeptRow>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let columns = if columns.is_empty() {
        ") AS f(id, token".to_string()
    } else {
        columns.to_string()
    };
    let sql = format!(
        "UPDATE outboxd.deliveries d SET {set}, lease_token = NULL, lease_expires_at = NULL \
         FROM unnest($1::bigint[], $2::text[]{columns}) \
         WHERE d.id = f.id AND d.lease_token = f.token AND d.status = 'pending' \
         RETURNING d.id, d.sink, d.stream"
    );
    let mut q = sqlx::query_as::<_, KeptRow>(&sql).bind(ids).bind(tokens);
    match extra {
        Some((Extra::Ints(ints), texts)) => q = q.bind(ints).bind(texts),
        Some((Extra::None, texts)) => q = q.bind(texts),
        None => {}
    }
    Ok(q.fetch_all(&mut *tx.0).await?)
}

/// Apply a batch's [`HeadChanges`], set-based: moved heads (to the first
/// live delivery, or gone), then blocking dead letters (the head, due
/// never), then waiting heads (their delivery's next attempt time).
async fn apply_heads(tx: &mut PgTx, heads: &HeadChanges) -> Result<(), StoreError> {
    if !heads.moved.is_empty() {
        let (ids, sinks, streams) = columns(&heads.moved);
        sqlx::query(MOVE_HEADS_SQL)
            .bind(&ids)
            .bind(&sinks)
            .bind(&streams)
            .execute(&mut *tx.0)
            .await?;
        // Heads still on a finished delivery had no live one behind them.
        sqlx::query(
            "DELETE FROM outboxd.heads h USING unnest($1::bigint[], $2::text[], $3::text[]) AS m(id, sink, stream) \
             WHERE h.sink = m.sink AND h.stream = m.stream AND h.delivery_id = m.id",
        )
        .bind(&ids)
        .bind(&sinks)
        .bind(&streams)
        .execute(&mut *tx.0)
        .await?;
    }
    if !heads.blocked.is_empty() {
        let (ids, sinks, streams) = columns(&heads.blocked);
        sqlx::query(
            "INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
             SELECT sink, stream, id, 'infinity' FROM unnest($1::bigint[], $2::text[], $3::text[]) AS b(id, sink, stream) \
             ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = EXCLUDED.delivery_id, due_at = 'infinity'",
        )
        .bind(&ids)
        .bind(&sinks)
        .bind(&streams)
        .execute(&mut *tx.0)
        .await?;
    }
    if !heads.waiting.is_empty() {
        let (ids, sinks, streams) = columns(&heads.waiting);
        sqlx::query(
            "UPDATE outboxd.heads h SET due_at = d.next_attempt_at \
             FROM unnest($1::bigint[], $2::text[], $3::text[]) AS w(id, sink, stream) \
             JOIN outboxd.deliveries d ON d.id = w.id \
             WHERE h.sink = w.sink AND h.stream = w.stream AND h.delivery_id = w.id",
        )
        .bind(&ids)
        .bind(&sinks)
        .bind(&streams)
        .execute(&mut *tx.0)
        .await?;
    }
    Ok(())
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
