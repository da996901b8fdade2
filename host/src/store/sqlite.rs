//! The embedded default store: one SQLite file in WAL mode.
//!
//! Owns: the SQLite schema (`migrations/sqlite/`) and the SQL that keeps the
//! rules of [`crate::store`]. SQLite has one writer at a time, so every write
//! (ingest, claim, finish) goes through a pool of exactly one connection —
//! this is what makes claims exclusive here, where PostgreSQL uses
//! `FOR UPDATE SKIP LOCKED`. Reads use a separate pool. `synchronous=FULL`:
//! an acknowledged event survives power loss, not only a process crash.
//!
//! Must never: hold the writer across anything but SQL (no plugin call, no
//! network), or compute a lease time from the process clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};

use super::plan::{self, FinishPlan, HeadChanges, IngestInputs, IngestPlan, KeptRow};
use super::sql::{Dialect, Sql, SqlTx};
use crate::limits;

use super::{
    new_lease_token, shared, AttemptNote, Claimed, Finish, IngestError, IngestItem, Ingested,
    RouteFn, Store, StoreError, StoredEvent,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// Database time in Unix milliseconds.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Claim step 1: due heads of one sink by due time (waiting and
/// expired-lease work in one order, so neither starves the other). The one
/// writer makes the claim exclusive. `?1` sink, `?2` now (ms), `?3` limit.
pub const CLAIM_HEADS_SQL: &str =
    "SELECT stream, delivery_id FROM heads WHERE sink = ?1 AND due_at <= ?2 ORDER BY due_at LIMIT ?3";

/// Claim step 2, per claimed head: up to `?5` live deliveries behind head
/// `?4` of stream `?3` of sink `?2`, in sequence order, with whether each
/// may be taken at `?1` (ms): due and not leased.
pub const CLAIM_FOLLOWERS_SQL: &str =
    "SELECT id, (next_attempt_at <= ?1 AND (lease_expires_at IS NULL OR lease_expires_at <= ?1)) \
     FROM deliveries WHERE sink = ?2 AND stream = ?3 AND status = 'pending' \
       AND sequence > (SELECT sequence FROM deliveries WHERE id = ?4) \
     ORDER BY sequence LIMIT ?5";

/// Rows per multi-row ingest statement: 15 bound values a row for events
/// keeps a statement within SQLite's default limit of 32,766 variables
/// (`SQLITE_MAX_VARIABLE_NUMBER`, SQLite 3.32+).
const INGEST_ROWS: usize = 500;

/// The SQLite store. Cheap to share behind an `Arc`.
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    /// Open (creating if missing) the database file at `path`, creating its
    /// folder too.
    pub async fn open(path: &str) -> Result<SqliteStore, StoreError> {
        if let Some(parent) = std::path::Path::new(path).parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    StoreError::Database(sqlx::Error::Configuration(
                        format!(
                            "cannot create folder {} for the database: {e}",
                            parent.display()
                        )
                        .into(),
                    ))
                })?;
            }
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(limits::SQLITE_BUSY_TIMEOUT);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(limits::SQLITE_WRITER_WAIT)
            .after_release(|conn, _| Box::pin(async move { Ok(outside_transaction(conn).await) }))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(limits::SQLITE_READERS)
            .connect_with(options)
            .await?;
        Ok(SqliteStore { writer, reader })
    }
}

/// The SQLite spelling of the shared templates ([`super::sql`]). Times are
/// Unix ms integers everywhere.
static DIALECT: Dialect = Dialect {
    schema: "",
    now_ms: NOW_MS,
    now: NOW_MS,
    question_marks: true,
    greatest: "MAX",
    time_as_ms: "{}",
    ms_as_time: "{}",
    ms_ago: "(CAST(unixepoch('subsec') * 1000 AS INTEGER) - {})",
    ms_ahead: "(CAST(unixepoch('subsec') * 1000 AS INTEGER) + {})",
    probe_timeout: None,
    blocked_due: "9223372036854775807",
    for_update: "",
    lock_stream: None,
    routed_only: "",
    no_migrations:
        "SELECT COUNT(*) = 0 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    notify: None,
};

/// The due time of a head blocked by a dead letter (`on-dead = "block"`):
/// never. [`DIALECT`]'s `blocked_due`.
const BLOCKED: i64 = i64::MAX;

/// Whether a writer connection coming back to the pool is outside any
/// transaction, in SQLite and in sqlx's own count of them; the pool closes
/// one that is not instead of reusing it.
///
/// Why: on `SQLITE_FULL` (a full disk) and a few other errors SQLite may
/// roll the whole transaction back by itself
/// (<https://www.sqlite.org/lang_transaction.html>). sqlx's `ROLLBACK` on
/// drop then fails and its count stays at one, so the next `begin` opens a
/// `SAVEPOINT`, and a later failure's `ROLLBACK TO` leaves a transaction open
/// on the connection: every commit after that is a `RELEASE` inside it —
/// acknowledged, never written, lost when it finally rolls back.
async fn outside_transaction(conn: &mut SqliteConnection) -> bool {
    use sqlx::Connection as _;
    // Runs after any rollback sqlx queued on drop; `BEGIN` fails inside a
    // transaction.
    let clean = sqlx::query("BEGIN").execute(&mut *conn).await.is_ok()
        && sqlx::query("ROLLBACK").execute(&mut *conn).await.is_ok()
        && !conn.is_in_transaction();
    if !clean {
        tracing::warn!(
            "a database connection was left inside a failed transaction; it is closed, not reused"
        );
    }
    clean
}

async fn now_ms(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
        .fetch_one(conn)
        .await
}

/// The event columns, as every read of events selects them first.
static EVENT_COLUMNS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| super::event_columns(&DIALECT));

crate::sql_tx!(SqliteTx, Sqlite);

#[async_trait]
impl Sql for SqliteStore {
    fn dialect(&self) -> &'static Dialect {
        &DIALECT
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    async fn begin(&self) -> Result<Box<dyn SqlTx + '_>, sqlx::Error> {
        Ok(Box::new(SqliteTx(self.writer.begin().await?)))
    }

    async fn begin_read(&self) -> Result<Box<dyn SqlTx + '_>, sqlx::Error> {
        Ok(Box::new(SqliteTx(self.reader.begin().await?)))
    }
}

/// `IN (…)` of `values` as binds.
fn push_in<'a, T>(q: &mut QueryBuilder<'a, Sqlite>, values: impl IntoIterator<Item = T>)
where
    T: 'a + sqlx::Encode<'a, Sqlite> + sqlx::Type<Sqlite> + Send,
{
    q.push(" IN (");
    let mut sep = q.separated(", ");
    for v in values {
        sep.push_bind(v);
    }
    q.push(")");
}

/// Events of `ids` as stored, by id, with their content hash.
async fn stored_events(
    conn: &mut SqliteConnection,
    ids: impl IntoIterator<Item = String>,
    with_hash: bool,
) -> Result<BTreeMap<String, (Option<String>, StoredEvent)>, StoreError> {
    let hash = if with_hash {
        ", content_hash"
    } else {
        ", NULL AS content_hash"
    };
    let mut q = QueryBuilder::<Sqlite>::new(format!(
        "SELECT {}{hash} FROM events WHERE id",
        *EVENT_COLUMNS
    ));
    push_in(&mut q, ids);
    let mut out = BTreeMap::new();
    for row in q.build().fetch_all(&mut *conn).await? {
        let hash: Option<String> = row.try_get("content_hash")?;
        let event = super::event_from_row(&row)?;
        out.insert(event.event.id.clone(), (hash, event));
    }
    Ok(out)
}

impl SqliteStore {
    /// What an ingest request finds stored: its ids' events and its
    /// streams' last sequences (one writer: nothing else changes them).
    async fn ingest_inputs(
        conn: &mut SqliteConnection,
        items: &[IngestItem],
    ) -> Result<IngestInputs, StoreError> {
        let ids: BTreeSet<String> = items.iter().map(|i| i.event.id.clone()).collect();
        let streams: BTreeSet<String> = items.iter().map(|i| i.event.stream.clone()).collect();
        let stored = stored_events(conn, ids, true).await?.into_iter().collect();
        let mut q =
            QueryBuilder::<Sqlite>::new("SELECT stream, last_sequence FROM streams WHERE stream");
        push_in(&mut q, streams);
        let last: Vec<(String, i64)> = q.build_query_as().fetch_all(&mut *conn).await?;
        Ok(IngestInputs {
            stored,
            last: last.into_iter().map(|(s, n)| (s, n as u64)).collect(),
            unrouted: BTreeSet::new(),
        })
    }

    /// Write what [`plan::plan_ingest`] planned, at database time `now`:
    /// multi-row statements, [`INGEST_ROWS`] rows each — the events, then
    /// the deliveries, then the heads of (key, stream) pairs that have
    /// none, then the streams' last sequences — so a request of 100
    /// events costs four statements, not three per event.
    async fn write_ingest(
        conn: &mut SqliteConnection,
        items: &[IngestItem],
        plan: &IngestPlan,
        now: i64,
    ) -> Result<(), StoreError> {
        let mut sequences = HashMap::new();
        for rows in plan.events.chunks(INGEST_ROWS) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO events (id, source, type, subject, time, datacontenttype, dataschema, stream, \
                 sequence, producer_sequence, extensions, data, data_format, content_hash, ingested_at, \
                 producer) ",
            );
            q.push_values(rows, |mut b, row| {
                let ev = &items[row.index].event;
                let extensions =
                    serde_json::to_string(&ev.extensions).expect("string map serialises");
                b.push_bind(&ev.id)
                    .push_bind(&ev.source)
                    .push_bind(&ev.ty)
                    .push_bind(&ev.subject)
                    .push_bind(&ev.time)
                    .push_bind(&ev.datacontenttype)
                    .push_bind(&ev.dataschema)
                    .push_bind(&ev.stream)
                    .push_bind(row.sequence as i64)
                    .push_bind(ev.sequence.is_some())
                    .push_bind(extensions)
                    .push_bind(&ev.data)
                    .push_bind(ev.data_format.as_str())
                    .push_bind(&row.content_hash)
                    .push_bind(now)
                    .push_bind(&items[row.index].producer);
            });
            q.build().execute(&mut *conn).await?;
            sequences.extend(rows.iter().map(|row| (row.index, row.sequence as i64)));
        }
        // The first new delivery of each (key, stream), by sequence, is its
        // head unless the pair has one; later ones wait behind it.
        let mut first: BTreeMap<(&str, &str), (i64, i64)> = BTreeMap::new();
        for rows in plan.deliveries.chunks(INGEST_ROWS) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO deliveries (event_id, sink, stream, sequence, next_attempt_at, created_at) ",
            );
            q.push_values(rows, |mut b, (index, key)| {
                let ev = &items[*index].event;
                b.push_bind(&ev.id)
                    .push_bind(key)
                    .push_bind(&ev.stream)
                    .push_bind(sequences[index])
                    .push_bind(now)
                    .push_bind(now);
            });
            q.push(" RETURNING id, event_id, sink");
            let made: HashMap<(String, String), i64> = q
                .build_query_as::<(i64, String, String)>()
                .fetch_all(&mut *conn)
                .await?
                .into_iter()
                .map(|(id, event, key)| ((event, key), id))
                .collect();
            for (index, key) in rows {
                let ev = &items[*index].event;
                let id = made[&(ev.id.clone(), key.clone())];
                let seq = sequences[index];
                first
                    .entry((key.as_str(), ev.stream.as_str()))
                    .and_modify(|f| {
                        if seq < f.1 {
                            *f = (id, seq)
                        }
                    })
                    .or_insert((id, seq));
            }
        }
        let heads: Vec<_> = first.into_iter().collect();
        for rows in heads.chunks(INGEST_ROWS) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO heads (sink, stream, delivery_id, due_at) ",
            );
            q.push_values(rows, |mut b, ((key, stream), (id, _))| {
                b.push_bind(*key)
                    .push_bind(*stream)
                    .push_bind(*id)
                    .push_bind(now);
            });
            q.push(" ON CONFLICT (sink, stream) DO NOTHING");
            q.build().execute(&mut *conn).await?;
        }
        let last: Vec<_> = plan.last_sequences.iter().collect();
        for rows in last.chunks(INGEST_ROWS) {
            let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO streams (stream, last_sequence) ");
            q.push_values(rows, |mut b, (stream, last)| {
                b.push_bind(stream.as_str()).push_bind(*last as i64);
            });
            q.push(" ON CONFLICT (stream) DO UPDATE SET last_sequence = excluded.last_sequence");
            q.build().execute(&mut *conn).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn sql(&self) -> &dyn Sql {
        self
    }

    async fn ingest(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError> {
        let mut tx = self.writer.begin().await.map_err(StoreError::from)?;
        let now = now_ms(&mut tx).await.map_err(StoreError::from)?;
        let inputs = Self::ingest_inputs(&mut tx, items).await?;
        let plan = plan::plan_ingest(items, &inputs)?;
        Self::write_ingest(&mut tx, items, &plan, now).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(plan.answers)
    }

    async fn claim_after(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
        after: Option<&str>,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut tx = SqliteTx(self.writer.begin().await?);
        let now = now_ms(&mut tx.0).await?;
        // Due heads, by due time: waiting and expired-lease work in one order,
        // so neither starves the other.
        let heads: Vec<(String, i64)> = sqlx::query_as(CLAIM_HEADS_SQL)
            .bind(sink)
            .bind(now)
            .bind(limit as i64)
            .fetch_all(&mut *tx.0)
            .await?;
        if heads.is_empty() {
            tx.0.commit().await?;
            return Ok(Vec::new());
        }
        let room = (limit as usize).saturating_sub(heads.len());
        let followers = followers(&mut tx.0, sink, &heads, room, now).await?;
        let order = plan::take_runs(&heads, followers, limit as usize);
        let (ids, streams) =
            shared::apply_after(self, &mut tx, sink, after, &heads, &order).await?;
        if ids.is_empty() {
            tx.0.commit().await?;
            return Ok(Vec::new());
        }
        let token = new_lease_token();
        let leased = take_leases(&mut tx.0, sink, &ids, &streams, &token, now, lease).await?;
        let event_ids = leased.iter().map(|row| row.event_id.clone());
        let events = stored_events(&mut tx.0, event_ids, false)
            .await?
            .into_iter()
            .map(|(id, (_, event))| (id, event))
            .collect();
        tx.0.commit().await?;
        plan::assemble_claims(leased, &events, &token)
    }

    async fn finish_noted(
        &self,
        items: &[(i64, &str, &Finish)],
        notes: &[Option<AttemptNote>],
    ) -> Result<Vec<bool>, StoreError> {
        // One transaction (one commit, one fsync) for a whole batch.
        let mut tx = SqliteTx(self.writer.begin().await?);
        let now = now_ms(&mut tx.0).await?;
        let mut plan = FinishPlan::new(items);
        let mut heads = HeadChanges::default();
        let set = format!("status = 'delivered', finished_at = {now}, last_error = NULL");
        heads
            .moved
            .extend(fenced_many(&mut tx.0, &set, &plan.delivered).await?);
        let mut failed = std::collections::HashSet::new();
        for ((id, token), delay, reason) in &plan.retry {
            let set = format!("next_attempt_at = {}, last_error = ?", now + delay);
            let retried = fenced(&mut tx.0, &set, Some(reason), *id, token).await?;
            failed.extend(retried.iter().map(|row| row.0));
            heads.waiting.extend(retried);
        }
        let behind = shared::behind_earlier(self, &mut tx, &plan.blocking).await?;
        plan.settle(items, &behind);
        let mut dead = Vec::new();
        for ((id, token), reason, _) in &plan.dead {
            let set = format!("status = 'dead', finished_at = {now}, last_error = ?");
            dead.extend(fenced(&mut tx.0, &set, Some(reason), *id, token).await?);
        }
        failed.extend(dead.iter().map(|row: &KeptRow| row.0));
        heads.add_dead(dead, &plan);
        let set = "attempts = attempts - 1, \
                   first_attempt_at = CASE WHEN attempts <= 1 THEN NULL ELSE first_attempt_at END";
        heads
            .waiting
            .extend(fenced_many(&mut tx.0, set, &plan.release).await?);
        apply_heads(&mut tx.0, &heads).await?;
        if !failed.is_empty() {
            shared::record_failures(self, &mut tx, items, notes, &failed).await?;
        }
        tx.0.commit().await?;
        Ok(heads.kept(items))
    }

    async fn next_due_in(&self, sink: &str) -> Result<Option<Duration>, StoreError> {
        let mut conn = self.reader.acquire().await?;
        let wait: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT MIN(due_at) - {NOW_MS} FROM heads WHERE sink = ? AND due_at < ?"
        ))
        .bind(sink)
        .bind(BLOCKED)
        .fetch_one(&mut *conn)
        .await?;
        Ok(wait.map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    async fn route_pending(&self, _route: &RouteFn<'_>, _limit: u32) -> Result<usize, StoreError> {
        // Every SQLite event comes through ingest, which routes it.
        Ok(0)
    }

    fn forward_wakeups(
        &self,
        _wake: std::sync::Arc<crate::wakeups::Wakeups>,
        _stop: tokio::sync::watch::Receiver<bool>,
    ) {
        // One process owns an SQLite file; ingest wakes the loops directly.
    }

    async fn migrate_each(&self, applied: &mut super::OnApplied<'_>) -> Result<(), StoreError> {
        let mut conn = self.writer.acquire().await?;
        super::migrate::run_each(&MIGRATOR, &mut *conn, applied).await?;
        Ok(())
    }
}

/// The live deliveries behind each claimed head (at most `room` per
/// head, in sequence order) — nobody else's to claim while we hold the
/// head — with whether each may be taken at `now`: due and not leased.
async fn followers(
    conn: &mut SqliteConnection,
    sink: &str,
    heads: &[(String, i64)],
    room: usize,
    now: i64,
) -> Result<Vec<(i64, String, bool)>, StoreError> {
    let mut followers = Vec::new();
    for (stream, head) in heads.iter().filter(|_| room > 0) {
        let rows: Vec<(i64, bool)> = sqlx::query_as(CLAIM_FOLLOWERS_SQL)
            .bind(now)
            .bind(sink)
            .bind(stream)
            .bind(head)
            .bind(room as i64)
            .fetch_all(&mut *conn)
            .await?;
        followers.extend(rows.into_iter().map(|(id, ok)| (id, stream.clone(), ok)));
    }
    Ok(followers)
}

/// Lease `ids` with `token` until `now + lease` (counting the attempt) and
/// move the heads of `streams` to the lease's end.
async fn take_leases(
    conn: &mut SqliteConnection,
    sink: &str,
    ids: &[i64],
    streams: &[String],
    token: &str,
    now: i64,
    lease: Duration,
) -> Result<Vec<plan::LeasedRow>, StoreError> {
    let lease_until = now + lease.as_millis() as i64;
    let mut update = QueryBuilder::<Sqlite>::new("UPDATE deliveries SET lease_token = ");
    update
        .push_bind(token)
        .push(", lease_expires_at = ")
        .push_bind(lease_until)
        .push(", attempts = attempts + 1, first_attempt_at = COALESCE(first_attempt_at, ")
        .push_bind(now)
        .push(") WHERE status = 'pending' AND id");
    push_in(&mut update, ids.iter().copied());
    update.push(" RETURNING id, event_id, attempts, first_attempt_at");
    let rows = update.build().fetch_all(&mut *conn).await?;

    let mut heads = QueryBuilder::<Sqlite>::new("UPDATE heads SET due_at = ");
    heads
        .push_bind(lease_until)
        .push(" WHERE sink = ")
        .push_bind(sink)
        .push(" AND stream");
    push_in(&mut heads, streams.iter().cloned());
    heads.build().execute(&mut *conn).await?;
    rows.iter()
        .map(|row| {
            Ok(plan::LeasedRow {
                delivery_id: row.try_get("id")?,
                event_id: row.try_get("event_id")?,
                attempts: row.try_get::<i64, _>("attempts")? as u32,
                first_attempt_at_ms: row.try_get("first_attempt_at")?,
                claimed_at_ms: now,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// One fenced change of delivery `id` (`set`, with `reason` bound to its
/// `?`), kept only while it still holds `token`: the (delivery, key,
/// stream) changed, or `None` when the lease was lost.
async fn fenced(
    conn: &mut SqliteConnection,
    set: &str,
    reason: Option<&str>,
    id: i64,
    token: &str,
) -> Result<Option<KeptRow>, StoreError> {
    let sql = format!(
        "UPDATE deliveries SET {set}, lease_token = NULL, lease_expires_at = NULL \
         WHERE id = ? AND lease_token = ? AND status = 'pending' RETURNING id, sink, stream"
    );
    let mut q = sqlx::query_as::<_, KeptRow>(&sql);
    if let Some(reason) = reason {
        q = q.bind(reason);
    }
    Ok(q.bind(id).bind(token).fetch_optional(&mut *conn).await?)
}

/// [`fenced`] without a bound reason for many deliveries at once: one
/// statement per lease token (a claim leases its whole batch under one),
/// at most [`FENCED_PER_STATEMENT`] ids each. Per delivery, the fence of
/// [`fenced`] exactly; returns the rows it kept.
async fn fenced_many(
    conn: &mut SqliteConnection,
    set: &str,
    items: &[(i64, &str)],
) -> Result<Vec<KeptRow>, StoreError> {
    let mut by_token: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (id, token) in items {
        by_token.entry(token).or_default().push(*id);
    }
    let mut kept = Vec::with_capacity(items.len());
    for (token, ids) in by_token {
        for chunk in ids.chunks(FENCED_PER_STATEMENT) {
            let mut q = QueryBuilder::<Sqlite>::new(format!(
                "UPDATE deliveries SET {set}, lease_token = NULL, lease_expires_at = NULL \
                 WHERE status = 'pending' AND lease_token = "
            ));
            q.push_bind(token).push(" AND id");
            push_in(&mut q, chunk.iter().copied());
            q.push(" RETURNING id, sink, stream");
            kept.extend(q.build_query_as::<KeptRow>().fetch_all(&mut *conn).await?);
        }
    }
    Ok(kept)
}

/// Ids a statement of [`fenced_many`] or [`move_heads`] names at most:
/// far below SQLite's 32,766 bound parameters.
const FENCED_PER_STATEMENT: usize = 500;

/// Move each head on a `moved` delivery to its stream's first live
/// delivery (possibly leased in the same batch, or now waiting to retry),
/// due when its retry time and any lease have passed; delete the heads
/// left on a finished delivery (no live one behind it). Two statements per
/// sink and [`FENCED_PER_STATEMENT`] deliveries. A delivery belongs to one
/// (sink, stream), so a head whose `delivery_id` is among the moved ids is
/// exactly a head on a moved delivery; the `stream IN` list only lets both
/// statements find those heads by the primary key.
async fn move_heads(conn: &mut SqliteConnection, moved: &[KeptRow]) -> Result<(), StoreError> {
    let mut by_sink: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
    for (id, sink, stream) in moved {
        by_sink.entry(sink).or_default().push((*id, stream));
    }
    for (sink, rows) in by_sink {
        for chunk in rows.chunks(FENCED_PER_STATEMENT) {
            let ids = || chunk.iter().map(|(id, _)| *id);
            let streams: BTreeSet<&str> = chunk.iter().map(|(_, stream)| *stream).collect();
            let mut update = QueryBuilder::<Sqlite>::new(
                "UPDATE heads SET (delivery_id, due_at) = ( \
                   SELECT d.id, MAX(d.next_attempt_at, COALESCE(d.lease_expires_at, d.next_attempt_at)) \
                   FROM deliveries d WHERE d.sink = heads.sink AND d.stream = heads.stream \
                   AND d.status = 'pending' ORDER BY d.sequence LIMIT 1) \
                 WHERE EXISTS (SELECT 1 FROM deliveries d WHERE d.sink = heads.sink \
                   AND d.stream = heads.stream AND d.status = 'pending') AND sink = ",
            );
            update.push_bind(sink).push(" AND stream");
            push_in(&mut update, streams.iter().copied());
            update.push(" AND delivery_id");
            push_in(&mut update, ids());
            update.build().execute(&mut *conn).await?;
            let mut delete = QueryBuilder::<Sqlite>::new("DELETE FROM heads WHERE sink = ");
            delete.push_bind(sink).push(" AND stream");
            push_in(&mut delete, streams.iter().copied());
            delete.push(" AND delivery_id");
            push_in(&mut delete, ids());
            delete.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// Apply a batch's [`HeadChanges`], in the order the protocol needs:
/// moved heads, then blocking dead letters, then waiting heads.
async fn apply_heads(conn: &mut SqliteConnection, heads: &HeadChanges) -> Result<(), StoreError> {
    move_heads(conn, &heads.moved).await?;
    for (id, key, stream) in &heads.blocked {
        // The head stays on the dead letter, due never: the stream waits
        // for a replay or a purge.
        sqlx::query(
            "INSERT INTO heads (sink, stream, delivery_id, due_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = excluded.delivery_id, due_at = excluded.due_at",
        )
        .bind(key)
        .bind(stream)
        .bind(id)
        .bind(BLOCKED)
        .execute(&mut *conn)
        .await?;
    }
    for (id, key, stream) in &heads.waiting {
        sqlx::query(
            "UPDATE heads SET due_at = (SELECT next_attempt_at FROM deliveries WHERE id = ?1) \
             WHERE sink = ?2 AND stream = ?3 AND delivery_id = ?1",
        )
        .bind(id)
        .bind(key)
        .bind(stream)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
