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

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};

use super::{
    destination_row, new_lease_token, registered_sink, same_event, sink_replica, BackfillPage,
    Claimed, DeadFilter, DeadLetter, DeliveryInfo, DestinationRow, Finish, IngestError, IngestItem,
    Ingested, Purged, PutMode, QueueStats, RegisteredSink, RouteFn, SinkIdentity, SinkReplica,
    Store, StoreError, StoredEvent,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// Database time in Unix milliseconds.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

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
            .busy_timeout(Duration::from_secs(10));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .after_release(|conn, _| Box::pin(async move { Ok(outside_transaction(conn).await) }))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        Ok(SqliteStore { writer, reader })
    }
}

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

const EVENT_COLUMNS: &str =
    "id, source, type, subject, time, datacontenttype, dataschema, stream, sequence, \
     producer_sequence, extensions, data, data_format, ingested_at AS ingested_at_ms";

#[async_trait]
impl Store for SqliteStore {
    async fn ingest(&self, items: &[IngestItem]) -> Result<Vec<Ingested>, IngestError> {
        let mut tx = self.writer.begin().await.map_err(StoreError::from)?;
        let now = now_ms(&mut tx).await.map_err(StoreError::from)?;
        let mut out = Vec::with_capacity(items.len());
        let mut last_sequences: std::collections::HashMap<String, u64> =
            std::collections::HashMap::new();
        for (index, item) in items.iter().enumerate() {
            let ev = &item.event;
            let hash = ev.content_hash();
            let existing = sqlx::query(&format!(
                "SELECT {EVENT_COLUMNS}, content_hash FROM events WHERE id = ?"
            ))
            .bind(&ev.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(StoreError::from)?;
            if let Some(row) = existing {
                let stored_hash: Option<String> =
                    row.try_get("content_hash").map_err(StoreError::from)?;
                let stored = super::event_from_row(&row)?;
                match same_event(stored_hash.as_deref(), &stored.event, ev, &hash) {
                    Ok(()) => {
                        out.push(Ingested {
                            id: ev.id.clone(),
                            stream: stored.event.stream,
                            sequence: stored.sequence,
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

            // Each stream's last sequence is read once per request and
            // written once, before the commit.
            let last = match last_sequences.get(&ev.stream) {
                Some(last) => *last,
                None => {
                    let last: Option<i64> =
                        sqlx::query_scalar("SELECT last_sequence FROM streams WHERE stream = ?")
                            .bind(&ev.stream)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(StoreError::from)?;
                    last.unwrap_or(0) as u64
                }
            };
            let sequence = super::next_sequence(index, ev, last)?;
            last_sequences.insert(ev.stream.clone(), sequence);

            let extensions = serde_json::to_string(&ev.extensions).expect("string map serialises");
            sqlx::query(
                "INSERT INTO events (id, source, type, subject, time, datacontenttype, dataschema, stream, \
                 sequence, producer_sequence, extensions, data, data_format, content_hash, ingested_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&ev.id)
            .bind(&ev.source)
            .bind(&ev.ty)
            .bind(&ev.subject)
            .bind(&ev.time)
            .bind(&ev.datacontenttype)
            .bind(&ev.dataschema)
            .bind(&ev.stream)
            .bind(sequence as i64)
            .bind(ev.sequence.is_some())
            .bind(extensions)
            .bind(&ev.data)
            .bind(ev.data_format.as_str())
            .bind(&hash)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;

            for sink in &item.sinks {
                let delivery_id: i64 = sqlx::query_scalar(
                    "INSERT INTO deliveries (event_id, sink, stream, sequence, next_attempt_at, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                )
                .bind(&ev.id)
                .bind(sink)
                .bind(&ev.stream)
                .bind(sequence as i64)
                .bind(now)
                .bind(now)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                // The first live delivery of its (sink, stream) is the head;
                // later ones wait behind it.
                sqlx::query(
                    "INSERT INTO heads (sink, stream, delivery_id, due_at) VALUES (?, ?, ?, ?) \
                     ON CONFLICT (sink, stream) DO NOTHING",
                )
                .bind(sink)
                .bind(&ev.stream)
                .bind(delivery_id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
            }
            out.push(Ingested {
                id: ev.id.clone(),
                stream: ev.stream.clone(),
                sequence,
                duplicate: false,
                deliveries_queued: item.sinks.len() as u64,
            });
        }
        for (stream, last) in &last_sequences {
            sqlx::query(
                "INSERT INTO streams (stream, last_sequence) VALUES (?, ?) \
                 ON CONFLICT (stream) DO UPDATE SET last_sequence = excluded.last_sequence",
            )
            .bind(stream)
            .bind(*last as i64)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(out)
    }

    async fn event(
        &self,
        id: &str,
    ) -> Result<Option<(StoredEvent, Vec<DeliveryInfo>)>, StoreError> {
        let mut conn = self.reader.acquire().await?;
        let Some(row) = sqlx::query(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = ?"))
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
        else {
            return Ok(None);
        };
        let event = super::event_from_row(&row)?;
        let now = now_ms(&mut conn).await?;
        let rows = sqlx::query(
            "SELECT sink, status, attempts, last_error, next_attempt_at, lease_expires_at, finished_at \
             FROM deliveries WHERE event_id = ? ORDER BY sink",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
        let mut deliveries = Vec::with_capacity(rows.len());
        for row in rows {
            let status: String = row.try_get("status")?;
            let attempts: i64 = row.try_get("attempts")?;
            let lease: Option<i64> = row.try_get("lease_expires_at")?;
            let pending = status == "pending";
            let shown = match (pending, lease) {
                (true, Some(until)) if until > now => "leased".to_string(),
                (true, _) if attempts > 0 => "retrying".to_string(),
                _ => status,
            };
            deliveries.push(DeliveryInfo {
                sink: row.try_get("sink")?,
                status: shown,
                attempts: attempts as u32,
                last_error: row.try_get("last_error")?,
                next_attempt_at_ms: if pending {
                    Some(row.try_get("next_attempt_at")?)
                } else {
                    None
                },
                finished_at_ms: row.try_get("finished_at")?,
            });
        }
        Ok(Some((event, deliveries)))
    }

    async fn claim_after(
        &self,
        sink: &str,
        limit: u32,
        lease: Duration,
        after: Option<&str>,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut tx = self.writer.begin().await?;
        let now = now_ms(&mut tx).await?;
        let lease_until = now + lease.as_millis() as i64;
        // Due heads, by due time: waiting and expired-lease work in one order,
        // so neither starves the other.
        let heads: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream, delivery_id FROM heads WHERE sink = ? AND due_at <= ? ORDER BY due_at LIMIT ?",
        )
        .bind(sink)
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        if heads.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let mut ids: Vec<i64> = heads.iter().map(|h| h.1).collect();
        let mut order: Vec<(String, i64)> = heads.clone();
        // Fill the rest of the batch with contiguous runs behind the heads:
        // the next live rows of the same stream, while each is due and not
        // leased. (Rows behind a head we hold are nobody else's to claim.)
        let mut room = (limit as usize).saturating_sub(ids.len());
        for (stream, head) in &heads {
            if room == 0 {
                break;
            }
            let followers: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
                "SELECT id, next_attempt_at, lease_expires_at FROM deliveries \
                 WHERE sink = ? AND stream = ? AND status = 'pending' \
                   AND sequence > (SELECT sequence FROM deliveries WHERE id = ?) \
                 ORDER BY sequence LIMIT ?",
            )
            .bind(sink)
            .bind(stream)
            .bind(head)
            .bind(room as i64)
            .fetch_all(&mut *tx)
            .await?;
            for (id, next_attempt_at, lease) in followers {
                if next_attempt_at > now || lease.is_some_and(|l| l > now) {
                    break;
                }
                ids.push(id);
                order.push((stream.clone(), id));
                room -= 1;
            }
        }
        let mut claimed_streams: Vec<String> = heads.iter().map(|h| h.0.clone()).collect();
        if let Some(after) = after {
            let mut q = QueryBuilder::<Sqlite>::new(
                "SELECT d.id FROM deliveries d JOIN deliveries t ON t.event_id = d.event_id AND t.sink = ",
            );
            q.push_bind(after)
                .push(" WHERE t.status <> 'delivered' AND d.id IN (");
            let mut sep = q.separated(", ");
            for id in &ids {
                sep.push_bind(*id);
            }
            q.push(")");
            let blocked: std::collections::HashSet<i64> = q
                .build_query_scalar::<i64>()
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
            if !blocked.is_empty() {
                let (kept, kept_streams, held) = super::cut_runs(&order, &heads, &blocked);
                for stream in &held {
                    sqlx::query("UPDATE heads SET due_at = ? WHERE sink = ? AND stream = ?")
                        .bind(now + 1000)
                        .bind(sink)
                        .bind(stream)
                        .execute(&mut *tx)
                        .await?;
                }
                ids = kept;
                claimed_streams = kept_streams;
                if ids.is_empty() {
                    tx.commit().await?;
                    return Ok(Vec::new());
                }
            }
        }
        let token = new_lease_token();
        let mut update = QueryBuilder::<Sqlite>::new("UPDATE deliveries SET lease_token = ");
        update
            .push_bind(&token)
            .push(", lease_expires_at = ")
            .push_bind(lease_until)
            .push(", attempts = attempts + 1, first_attempt_at = COALESCE(first_attempt_at, ")
            .push_bind(now)
            .push(") WHERE status = 'pending' AND id IN (");
        let mut sep = update.separated(", ");
        for id in &ids {
            sep.push_bind(id);
        }
        update.push(") RETURNING id, event_id, attempts, first_attempt_at");
        let rows = update.build().fetch_all(&mut *tx).await?;

        let mut leased = QueryBuilder::<Sqlite>::new("UPDATE heads SET due_at = ");
        leased
            .push_bind(lease_until)
            .push(" WHERE sink = ")
            .push_bind(sink)
            .push(" AND stream IN (");
        let mut sep = leased.separated(", ");
        for stream in &claimed_streams {
            sep.push_bind(stream.clone());
        }
        leased.push(")");
        leased.build().execute(&mut *tx).await?;

        let mut select = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE id IN ("
        ));
        let mut sep = select.separated(", ");
        for row in &rows {
            sep.push_bind(row.try_get::<String, _>("event_id")?);
        }
        select.push(")");
        let mut events: BTreeMap<String, StoredEvent> = BTreeMap::new();
        for row in select.build().fetch_all(&mut *tx).await? {
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
                    attempts: row.try_get::<i64, _>("attempts")? as u32,
                    first_attempt_at_ms: row.try_get("first_attempt_at")?,
                    claimed_at_ms: now,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        super::assemble_claims(leased, &events, &token)
    }

    async fn finish_many(&self, items: &[(i64, &str, &Finish)]) -> Result<Vec<bool>, StoreError> {
        // One transaction (one commit, one fsync) for a whole batch.
        let mut tx = self.writer.begin().await?;
        let mut kept = Vec::with_capacity(items.len());
        for (delivery_id, lease_token, finish) in items {
            kept.push(finish_in(&mut tx, *delivery_id, lease_token, finish).await?);
        }
        tx.commit().await?;
        Ok(kept)
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

    async fn queue_stats(&self, cap: u64) -> Result<QueueStats, StoreError> {
        let mut conn = self.reader.acquire().await?;
        let now = now_ms(&mut conn).await?;
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT sink, st, COUNT(*) FROM ( \
               SELECT sink, CASE WHEN status = 'dead' THEN 'dead' \
                                 WHEN lease_expires_at > ?1 THEN 'leased' \
                                 WHEN lease_expires_at IS NOT NULL THEN 'expired' \
                                 WHEN attempts > 0 THEN 'retrying' ELSE 'pending' END AS st \
               FROM deliveries WHERE status IN ('pending', 'dead') LIMIT ?2) \
             GROUP BY sink, st",
        )
        .bind(now)
        .bind(cap as i64)
        .fetch_all(&mut *conn)
        .await?;
        let ages: Vec<(String, i64)> = sqlx::query_as(
            "SELECT sink, ?1 - MIN(due_at) FROM heads WHERE due_at <= ?1 GROUP BY sink",
        )
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        Ok(super::fold_stats(rows, ages, cap))
    }

    async fn list_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT event_id, sink, stream, sequence, attempts, last_error, finished_at FROM deliveries WHERE status = 'dead'",
        );
        push_dead_filter(&mut q, filter);
        q.push(" ORDER BY finished_at DESC LIMIT ")
            .push_bind(limit as i64);
        let rows: Vec<super::DeadRow> = q.build_query_as().fetch_all(&self.reader).await?;
        Ok(super::dead_letters(rows))
    }

    async fn replay_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
        let mut tx = self.writer.begin().await?;
        let now = now_ms(&mut tx).await?;
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT id, sink, stream FROM deliveries WHERE status = 'dead'",
        );
        push_dead_filter(&mut q, filter);
        q.push(" LIMIT ").push_bind(limit as i64);
        let rows: Vec<(i64, String, String)> = q.build_query_as().fetch_all(&mut *tx).await?;
        let mut pairs = std::collections::BTreeSet::new();
        for (id, sink, stream) in &rows {
            sqlx::query(
                "UPDATE deliveries SET status = 'pending', attempts = 0, first_attempt_at = NULL, \
                 next_attempt_at = ?, finished_at = NULL WHERE id = ?",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            pairs.insert((sink.clone(), stream.clone()));
        }
        // The replayed letter may sit before its stream's current head.
        let replayed: Vec<i64> = rows.iter().map(|r| r.0).collect();
        for (sink, stream) in pairs {
            reset_head(&mut tx, &sink, &stream, &replayed).await?;
        }
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    async fn purge_dead(&self, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
        let mut tx = self.writer.begin().await?;
        let mut q = QueryBuilder::<Sqlite>::new(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE status = 'dead'",
        );
        push_dead_filter(&mut q, filter);
        q.push(" LIMIT ")
            .push_bind(limit as i64)
            .push(") RETURNING sink, stream, id");
        let rows: Vec<(String, String, i64)> = q.build_query_as().fetch_all(&mut *tx).await?;
        // A purged letter that blocked its stream (`on-dead = "block"`)
        // still holds the head: the stream moves on to its next live
        // delivery.
        for (sink, stream, id) in &rows {
            let held =
                sqlx::query("DELETE FROM heads WHERE sink = ? AND stream = ? AND delivery_id = ?")
                    .bind(sink)
                    .bind(stream)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            if held > 0 {
                reset_head(&mut tx, sink, stream, &[]).await?;
            }
        }
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    async fn set_paused(&self, sink: &str, paused: bool) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sink_state (sink, paused) VALUES (?, ?) ON CONFLICT (sink) DO UPDATE SET paused = excluded.paused",
        )
        .bind(sink)
        .bind(paused)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn paused_sinks(&self) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT sink FROM sink_state WHERE paused ORDER BY sink")
                .fetch_all(&self.reader)
                .await?,
        )
    }

    async fn purge_delivered(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        let result = sqlx::query(&format!(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries \
             WHERE status = 'delivered' AND finished_at < {NOW_MS} - ? ORDER BY finished_at LIMIT ?)"
        ))
        .bind(older_than.as_millis() as i64)
        .bind(limit as i64)
        .execute(&self.writer)
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
        let mut tx = self.writer.begin().await?;
        let now = now_ms(&mut tx).await?;
        let rows = sqlx::query(&format!(
            "SELECT seq_id, {EVENT_COLUMNS} FROM events WHERE seq_id > ? AND ingested_at >= ? ORDER BY seq_id LIMIT ?"
        ))
        .bind(after)
        .bind(since_ms)
        .bind(page as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut out = BackfillPage {
            scanned: rows.len() as u64,
            ..Default::default()
        };
        let mut streams = std::collections::BTreeSet::new();
        for row in &rows {
            out.next_after = Some(row.try_get("seq_id")?);
            let stored = super::event_from_row(row)?;
            if !route(&stored.event).iter().any(|s| s == sink) {
                continue;
            }
            let created = sqlx::query(
                "INSERT INTO deliveries (event_id, sink, stream, sequence, next_attempt_at, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (event_id, sink) DO NOTHING",
            )
            .bind(&stored.event.id)
            .bind(sink)
            .bind(&stored.event.stream)
            .bind(stored.sequence as i64)
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if created > 0 {
                out.created += created;
                streams.insert(stored.event.stream.clone());
            }
        }
        for stream in streams {
            reset_head(&mut tx, sink, &stream, &[]).await?;
        }
        tx.commit().await?;
        if rows.len() < page as usize {
            out.next_after = None;
        }
        Ok(out)
    }

    async fn pending_migrations(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.reader.acquire().await?;
        let applied: Vec<i64> = if self.is_uninitialised().await? {
            Vec::new()
        } else {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&mut *conn)
                .await?
        };
        Ok(MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
            .map(|m| format!("{}_{}", m.version, m.description.replace(' ', "_")))
            .collect())
    }

    async fn is_uninitialised(&self) -> Result<bool, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(n == 0)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn source_checkpoint(&self, source: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT checkpoint FROM source_checkpoints WHERE source = ?")
                .bind(source)
                .fetch_optional(&self.reader)
                .await?,
        )
    }

    async fn save_source_checkpoint(
        &self,
        source: &str,
        checkpoint: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO source_checkpoints (source, checkpoint, updated_at) VALUES (?, ?, {NOW_MS}) \
             ON CONFLICT (source) DO UPDATE SET checkpoint = excluded.checkpoint, updated_at = excluded.updated_at"
        ))
        .bind(source)
        .bind(checkpoint)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn destinations(&self) -> Result<Vec<DestinationRow>, StoreError> {
        let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
            "SELECT name, sink, record, revision, updated_at FROM destinations ORDER BY name",
        )
        .fetch_all(&self.reader)
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
            PutMode::Create => format!(
                "INSERT INTO destinations (name, sink, record, revision, updated_at) VALUES (?1, ?2, ?3, 1, {NOW_MS}) \
                 ON CONFLICT (name) DO NOTHING RETURNING revision"
            ),
            PutMode::Upsert => format!(
                "INSERT INTO destinations (name, sink, record, revision, updated_at) VALUES (?1, ?2, ?3, 1, {NOW_MS}) \
                 ON CONFLICT (name) DO UPDATE SET sink = excluded.sink, record = excluded.record, \
                 revision = destinations.revision + 1, updated_at = excluded.updated_at RETURNING revision"
            ),
            PutMode::Revision(_) => format!(
                "UPDATE destinations SET sink = ?2, record = ?3, revision = revision + 1, updated_at = {NOW_MS} \
                 WHERE name = ?1 AND revision = ?4 RETURNING revision"
            ),
        };
        let mut query = sqlx::query_scalar(&sql).bind(name).bind(sink).bind(record);
        if let PutMode::Revision(r) = mode {
            query = query.bind(r);
        }
        Ok(query.fetch_optional(&self.writer).await?)
    }

    async fn delete_destination(&self, name: &str) -> Result<bool, StoreError> {
        let mut tx = self.writer.begin().await?;
        sqlx::query("DELETE FROM destination_health WHERE name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let gone = sqlx::query("DELETE FROM destinations WHERE name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(gone > 0)
    }

    async fn purge_target(&self, key: &str) -> Result<Purged, StoreError> {
        let mut tx = self.writer.begin().await?;
        sqlx::query("DELETE FROM heads WHERE sink = ?")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let dead = sqlx::query("DELETE FROM deliveries WHERE sink = ? AND status = 'dead'")
            .bind(key)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let pending = sqlx::query("DELETE FROM deliveries WHERE sink = ? AND status = 'pending'")
            .bind(key)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(Purged { pending, dead })
    }

    async fn destination_health(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT name, health FROM destination_health ORDER BY name")
                .fetch_all(&self.reader)
                .await?,
        )
    }

    async fn save_destination_health(&self, name: &str, health: &str) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO destination_health (name, health, updated_at) VALUES (?, ?, {NOW_MS}) \
             ON CONFLICT (name) DO UPDATE SET health = excluded.health, updated_at = excluded.updated_at"
        ))
        .bind(name)
        .bind(health)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn register_sinks(&self, sinks: &[SinkIdentity]) -> Result<Vec<String>, StoreError> {
        let mut tx = self.writer.begin().await?;
        let mut new = Vec::new();
        for s in sinks {
            let row: Option<String> = sqlx::query_scalar(&format!(
                "INSERT INTO sinks (name, version, component_sha, registered_at) VALUES (?, ?, ?, {NOW_MS}) \
                 ON CONFLICT (name) DO NOTHING RETURNING name"
            ))
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
            "SELECT name, version, component_sha, registered_at, retired_at FROM sinks ORDER BY name",
        )
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.into_iter().map(registered_sink).collect())
    }

    async fn beat_replica(&self, replica: &str, sinks: &[SinkIdentity]) -> Result<(), StoreError> {
        let mut tx = self.writer.begin().await?;
        sqlx::query(&format!(
            "DELETE FROM sink_replicas WHERE replica = ? OR beat_at < {NOW_MS} - 3600000"
        ))
        .bind(replica)
        .execute(&mut *tx)
        .await?;
        for s in sinks {
            sqlx::query(&format!(
                "INSERT INTO sink_replicas (replica, sink, version, component_sha, beat_at) VALUES (?, ?, ?, ?, {NOW_MS})"
            ))
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
        let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(&format!(
            "SELECT replica, sink, version, component_sha, {NOW_MS} - beat_at FROM sink_replicas ORDER BY sink, replica"
        ))
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.into_iter().map(sink_replica).collect())
    }

    async fn retire_sink(&self, name: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query(&format!(
            "UPDATE sinks SET retired_at = {NOW_MS} WHERE name = ? AND retired_at IS NULL"
        ))
        .bind(name)
        .execute(&self.writer)
        .await?
        .rows_affected()
            > 0)
    }
}

fn push_dead_filter(q: &mut QueryBuilder<'_, Sqlite>, f: &DeadFilter) {
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
        q.push(" AND finished_at >= ").push_bind(since);
    }
    if let Some(until) = f.until_ms {
        q.push(" AND finished_at < ").push_bind(until);
    }
}

/// The due time of a head blocked by a dead letter (`on-dead = "block"`):
/// never.
const BLOCKED: i64 = i64::MAX;

/// Point the head of (`sink`, `stream`) at its earliest live delivery
/// (after a replay or a backfill added one that may sit before the current
/// head, or a purge removed a blocking one); with none, leave it absent.
/// A head blocked by a dead letter stays unless that letter is among
/// `unblocking` (the deliveries being replayed): what a backfill or the
/// replay of other letters adds waits behind the block.
async fn reset_head(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    sink: &str,
    stream: &str,
    unblocking: &[i64],
) -> Result<(), StoreError> {
    let head: Option<(i64, i64)> =
        sqlx::query_as("SELECT delivery_id, due_at FROM heads WHERE sink = ? AND stream = ?")
            .bind(sink)
            .bind(stream)
            .fetch_optional(&mut **tx)
            .await?;
    if let Some((id, due)) = head {
        if due == BLOCKED && !unblocking.contains(&id) {
            return Ok(());
        }
    }
    let first: Option<(i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT id, next_attempt_at, lease_expires_at FROM deliveries \
         WHERE sink = ? AND stream = ? AND status = 'pending' ORDER BY sequence LIMIT 1",
    )
    .bind(sink)
    .bind(stream)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((id, next_at, lease)) = first else {
        return Ok(());
    };
    sqlx::query(
        "INSERT INTO heads (sink, stream, delivery_id, due_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = excluded.delivery_id, due_at = excluded.due_at",
    )
    .bind(sink)
    .bind(stream)
    .bind(id)
    .bind(next_at.max(lease.unwrap_or(next_at)))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// True (for the delivery `c`) when an earlier delivery of its (sink,
/// stream) is still undelivered: pending, or a dead letter blocking the
/// head (`?` = [`BLOCKED`]).
const BEHIND_EARLIER: &str = "EXISTS (SELECT 1 FROM deliveries e WHERE e.sink = c.sink AND e.stream = c.stream \
       AND e.status = 'pending' AND e.sequence < c.sequence) \
     OR EXISTS (SELECT 1 FROM heads h JOIN deliveries hd ON hd.id = h.delivery_id \
       WHERE h.sink = c.sink AND h.stream = c.stream AND h.due_at = ? AND hd.sequence < c.sequence)";

/// One fenced finish inside `tx` (see [`Store::finish`]). A blocking dead
/// letter behind an undelivered earlier delivery is released instead.
async fn finish_in(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    delivery_id: i64,
    lease_token: &str,
    finish: &Finish,
) -> Result<bool, StoreError> {
    if let Finish::Dead {
        blocks_stream: true,
        ..
    } = finish
    {
        // A blocking dead letter must be its stream's first undelivered
        // delivery. When an earlier one is still pending or blocking (its
        // lease was taken over after this batch was claimed, model/README.md
        // `NO_BLOCK_HEAD_CHECK`), this one is released to wait behind it.
        let behind: bool = sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM deliveries c WHERE c.id = ? AND ({BEHIND_EARLIER})) "
        ))
        .bind(delivery_id)
        .bind(BLOCKED)
        .fetch_one(&mut **tx)
        .await?;
        if behind {
            return Box::pin(finish_in(tx, delivery_id, lease_token, &Finish::Release)).await;
        }
    }
    let now = now_ms(tx).await?;
    let fence = "WHERE id = ? AND lease_token = ? AND status = 'pending' RETURNING sink, stream, next_attempt_at";
    let (sql, reason) = match finish {
        Finish::Delivered => (
            format!(
                "UPDATE deliveries SET status = 'delivered', finished_at = {now}, last_error = NULL, \
                 lease_token = NULL, lease_expires_at = NULL {fence}"
            ),
            None,
        ),
        Finish::Retry { delay, reason } => (
            format!(
                "UPDATE deliveries SET next_attempt_at = {}, last_error = ?, lease_token = NULL, \
                 lease_expires_at = NULL {fence}",
                now + delay.as_millis() as i64
            ),
            Some(reason),
        ),
        Finish::Dead { reason, .. } => (
            format!(
                "UPDATE deliveries SET status = 'dead', finished_at = {now}, last_error = ?, \
                 lease_token = NULL, lease_expires_at = NULL {fence}"
            ),
            Some(reason),
        ),
        Finish::Release => (
            format!(
                "UPDATE deliveries SET attempts = attempts - 1, \
                 first_attempt_at = CASE WHEN attempts <= 1 THEN NULL ELSE first_attempt_at END, \
                 lease_token = NULL, lease_expires_at = NULL {fence}"
            ),
            None,
        ),
    };
    let mut q = sqlx::query_as::<_, (String, String, i64)>(&sql);
    if let Some(reason) = reason {
        q = q.bind(reason);
    }
    let Some((sink, stream, next_attempt_at)) = q
        .bind(delivery_id)
        .bind(lease_token)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok(false);
    };
    match finish {
        Finish::Dead {
            blocks_stream: true,
            ..
        } => {
            // The head stays on the dead letter, due never: the stream
            // waits for a replay or a purge.
            // Everything before it in this batch was delivered (anything
            // after it released): it is the stream's first undelivered
            // delivery, so it becomes the head.
            sqlx::query(
                "INSERT INTO heads (sink, stream, delivery_id, due_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = excluded.delivery_id, due_at = excluded.due_at",
            )
            .bind(&sink)
            .bind(&stream)
            .bind(delivery_id)
            .bind(BLOCKED)
            .execute(&mut **tx)
            .await?;
        }
        Finish::Delivered | Finish::Dead { .. } => {
            // If this was the head, the next live delivery of the stream
            // (possibly leased in the same batch) becomes the head.
            let next: Option<(i64, i64, Option<i64>)> = sqlx::query_as(
                "SELECT id, next_attempt_at, lease_expires_at FROM deliveries \
                 WHERE sink = ? AND stream = ? AND status = 'pending' ORDER BY sequence LIMIT 1",
            )
            .bind(&sink)
            .bind(&stream)
            .fetch_optional(&mut **tx)
            .await?;
            match next {
                Some((id, next_at, lease)) => {
                    sqlx::query("UPDATE heads SET delivery_id = ?, due_at = ? WHERE sink = ? AND stream = ? AND delivery_id = ?")
                        .bind(id)
                        .bind(next_at.max(lease.unwrap_or(next_at)))
                        .bind(&sink)
                        .bind(&stream)
                        .bind(delivery_id)
                        .execute(&mut **tx)
                        .await?;
                }
                None => {
                    sqlx::query(
                        "DELETE FROM heads WHERE sink = ? AND stream = ? AND delivery_id = ?",
                    )
                    .bind(&sink)
                    .bind(&stream)
                    .bind(delivery_id)
                    .execute(&mut **tx)
                    .await?;
                }
            }
        }
        Finish::Retry { .. } | Finish::Release => {
            sqlx::query(
                "UPDATE heads SET due_at = ? WHERE sink = ? AND stream = ? AND delivery_id = ?",
            )
            .bind(next_attempt_at)
            .bind(&sink)
            .bind(&stream)
            .bind(delivery_id)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(true)
}
