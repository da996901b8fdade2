//! The store operations every backend runs the same way, written once over
//! [`Sql`]: the read of a delivery's state, queue figures, dead letters
//! (list, replay, purge) with the head resets they need, the record of
//! failed attempts (written with a finish, listed, bounded), pause, retention,
//! source checkpoints, destinations, the sink registry and replica
//! heartbeats, and pending migrations. The [`super::Store`] trait's
//! default methods call these; a backend only provides [`Sql`].
//!
//! Must never: hold a transaction across anything but SQL, or decide a
//! rule of its own — the decisions are [`super::plan`]'s.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use super::plan::{self, RowState};
use super::sql::{Arg, Col, Rows, Sql, SqlTx, Stmt, Val};
use super::{
    Attempt, AttemptFilter, AttemptNote, AttemptOutcome, DeadFilter, DeadLetter, DeliveryInfo,
    DeliveryProgress, DestinationRow, EventFilter, EventSummary, Finish, ProducerRow, Purged,
    PutMode, QueueStats, RegisteredSink, SinkIdentity, SinkQueue, SinkReplica, StoreError,
    StreamHead,
};

/// SQL text with its arguments, numbering placeholders as they are added.
struct Builder {
    sql: String,
    args: Vec<Arg>,
}

impl Builder {
    fn new(sql: impl Into<String>) -> Builder {
        Builder {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    /// Add `value` and return its placeholder (`$N`).
    fn arg(&mut self, value: impl Into<Arg>) -> String {
        self.args.push(value.into());
        format!("${}", self.args.len())
    }

    fn push(&mut self, sql: &str) -> &mut Builder {
        self.sql.push_str(sql);
        self
    }

    fn build(self, sql: &dyn Sql, cols: &'static [Col]) -> Stmt {
        Stmt {
            sql: sql.dialect().sql(&self.sql),
            args: self.args,
            cols,
        }
    }
}

/// `template` in `sql`'s dialect, returning `cols`.
fn stmt(sql: &dyn Sql, template: &str, cols: &'static [Col]) -> Stmt {
    Stmt::new(sql.dialect().sql(template), cols)
}

/// The `AND …` clauses of `f` on a `deliveries` row.
fn push_dead_filter(sql: &dyn Sql, q: &mut Builder, f: &DeadFilter) {
    push_equal(
        q,
        [
            ("sink", &f.sink),
            ("stream", &f.stream),
            ("event_id", &f.event_id),
        ],
    );
    push_time_range(sql, q, "finished_at", f.since_ms, f.until_ms);
}

/// ` AND column = $n` for each `(column, value)` with a value.
fn push_equal<'a>(
    q: &mut Builder,
    matches: impl IntoIterator<Item = (&'a str, &'a Option<String>)>,
) {
    for (column, value) in matches {
        if let Some(value) = value {
            let p = q.arg(value);
            q.push(&format!(" AND {column} = {p}"));
        }
    }
}

/// ` AND column >= since AND column < until` (Unix ms, each when given) on
/// the time column `column`.
fn push_time_range(
    sql: &dyn Sql,
    q: &mut Builder,
    column: &str,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
) {
    let d = sql.dialect();
    for (op, value) in [(">=", since_ms), ("<", until_ms)] {
        if let Some(ms) = value {
            let p = q.arg(ms);
            q.push(&format!(" AND {column} {op} {}", d.ms_as_time(&p)));
        }
    }
}

/// The deliveries of event `id`, as the read API shows them.
pub async fn deliveries_of(sql: &dyn Sql, id: &str) -> Result<Vec<DeliveryInfo>, StoreError> {
    let d = sql.dialect();
    let template = format!(
        "SELECT sink, {state}, CAST(attempts AS BIGINT), last_error, \
           CASE WHEN status = 'pending' THEN {next} END, {finished} \
         FROM {{s}}deliveries WHERE event_id = $1 ORDER BY sink",
        state = plan::row_state_sql(d.now),
        next = d.time_as_ms("next_attempt_at"),
        finished = d.time_as_ms("finished_at"),
    );
    use Col::*;
    let rows = sql
        .read(stmt(sql, &template, &[Text, Text, Int, OptText, OptInt, OptInt]).arg(id))
        .await?;
    rows.iter()
        .map(|r| {
            let state = RowState::parse(&r[1].text())
                .ok_or_else(|| StoreError::Corrupt(format!("delivery state {:?}", r[1])))?;
            Ok(DeliveryInfo {
                sink: r[0].text(),
                status: state.shown(),
                attempts: r[2].int() as u32,
                last_error: r[3].opt_text(),
                next_attempt_at_ms: r[4].opt_int(),
                finished_at_ms: r[5].opt_int(),
            })
        })
        .collect()
}

/// How far the deliveries of each of `ids` have got (events with no
/// delivery — routed nowhere — are absent). One query per call, `ids` at
/// most a few hundred.
pub async fn delivery_progress(
    sql: &dyn Sql,
    ids: &[String],
) -> Result<BTreeMap<String, DeliveryProgress>, StoreError> {
    let mut progress: BTreeMap<String, DeliveryProgress> = BTreeMap::new();
    if ids.is_empty() {
        return Ok(progress);
    }
    let mut q = Builder::new("SELECT event_id, status, CAST(COUNT(*) AS BIGINT), MAX(last_error) FROM {s}deliveries WHERE event_id IN (");
    let marks: Vec<String> = ids.iter().map(|id| q.arg(id.as_str())).collect();
    q.push(&marks.join(", "));
    q.push(") GROUP BY event_id, status");
    use Col::*;
    let rows = sql.read(q.build(sql, &[Text, Text, Int, OptText])).await?;
    for r in rows.iter() {
        let entry = progress.entry(r[0].text()).or_default();
        let n = r[2].int() as u32;
        match r[1].text().as_str() {
            "delivered" => entry.delivered += n,
            "dead" => {
                entry.dead += n;
                entry.dead_reason = entry.dead_reason.take().or(r[3].opt_text());
            }
            _ => entry.open += n,
        }
    }
    Ok(progress)
}

/// Queue figures per sink, counting at most `cap` live-or-dead rows.
pub async fn queue_stats(sql: &dyn Sql, cap: u64) -> Result<QueueStats, StoreError> {
    let d = sql.dialect();
    let counts = format!(
        "SELECT sink, st, COUNT(*) FROM ( \
           SELECT sink, {state} AS st FROM {{s}}deliveries WHERE status IN ('pending', 'dead') LIMIT $1) AS q \
         GROUP BY sink, st",
        state = plan::row_state_sql(d.now)
    );
    let ages = format!(
        "SELECT sink, {{now_ms}} - {} FROM {{s}}heads WHERE due_at <= {{now}} GROUP BY sink",
        d.time_as_ms("MIN(due_at)")
    );
    let mut stmts = Vec::new();
    stmts.extend(d.probe_timeout.map(|t| {
        let ms = crate::limits::PROBE_TIMEOUT.as_millis().to_string();
        Stmt::new(t.replace("{probe_ms}", &ms), &[])
    }));
    stmts.push(stmt(sql, &counts, &[Col::Text, Col::Text, Col::Int]).arg(cap as i64));
    stmts.push(stmt(sql, &ages, &[Col::Text, Col::Int]));
    let mut out = sql.read_all(stmts).await?;
    let ages = out.pop().unwrap_or_default();
    let counts = out.pop().unwrap_or_default();
    Ok(fold_stats(counts, ages, cap))
}

/// The figures of `sink` in `by_sink`, created empty when missing.
fn slot(by_sink: &mut BTreeMap<String, SinkQueue>, sink: String) -> &mut SinkQueue {
    by_sink.entry(sink.clone()).or_insert_with(|| SinkQueue {
        sink,
        ..Default::default()
    })
}

/// Fold (sink, state, count) rows and (sink, age) rows into figures.
fn fold_stats(rows: Rows, ages: Rows, cap: u64) -> QueueStats {
    let mut by_sink: BTreeMap<String, SinkQueue> = BTreeMap::new();
    let mut total = 0u64;
    for row in rows {
        let q = slot(&mut by_sink, row[0].text());
        let n = row[2].int().max(0) as u64;
        total += n;
        match RowState::parse(&row[1].text()) {
            Some(RowState::Dead) => q.dead += n,
            Some(RowState::Leased) => q.leased += n,
            Some(RowState::Expired) => q.expired_leases += n,
            Some(RowState::Retrying) => q.retrying += n,
            _ => q.pending += n,
        }
    }
    for row in ages {
        slot(&mut by_sink, row[0].text()).oldest_due_age_ms = Some(row[1].int().max(0));
    }
    QueueStats {
        sinks: by_sink.into_values().collect(),
        capped: total >= cap,
    }
}

/// Dead letters matching `filter`, newest first, at most `limit`.
pub async fn list_dead(
    sql: &dyn Sql,
    filter: &DeadFilter,
    limit: u32,
) -> Result<Vec<DeadLetter>, StoreError> {
    let d = sql.dialect();
    let mut q = Builder::new(format!(
        "SELECT event_id, sink, stream, sequence, CAST(attempts AS BIGINT), last_error, {} \
         FROM {{s}}deliveries WHERE status = 'dead'",
        d.time_as_ms("finished_at")
    ));
    push_dead_filter(sql, &mut q, filter);
    let p = q.arg(limit as i64);
    q.push(&format!(" ORDER BY finished_at DESC LIMIT {p}"));
    use Col::*;
    let rows = sql
        .read(q.build(sql, &[Text, Text, Text, Int, Int, OptText, OptInt]))
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadLetter {
            event_id: r[0].text(),
            sink: r[1].text(),
            stream: r[2].text(),
            sequence: r[3].int() as u64,
            attempts: r[4].int() as u32,
            reason: r[5].opt_text(),
            died_at_ms: r[6].opt_int(),
        })
        .collect())
}

/// Events matching `f`, newest first, at most `limit`. One statement: by
/// stream it walks `(stream, sequence)` backwards; otherwise the
/// `(type|source, ingested_at, seq_id)` or `(ingested_at, seq_id)` index
/// backwards.
///
/// With a state ([`plan::state_sql`] on the deliveries) the page is chosen
/// first by `seq_id` alone, and only its rows are read whole: where the
/// state is rare its deliveries are read from a partial index
/// (`deliveries_dead`, `deliveries_finished`, `deliveries_tried`) and each
/// one's event is ordered through `events_id_order` `(id) INCLUDE
/// (ingested_at, seq_id)` on PostgreSQL, an index-only read instead of one
/// events row per match; where it is common the events are walked newest
/// first and each one's deliveries probed through `(event_id, sink)`. The
/// planner picks by the estimate; leased and retrying name their
/// deliveries first ([`plan::state_is_few`]), which SQLite also follows.
pub async fn search_events(
    sql: &dyn Sql,
    f: &EventFilter,
    limit: u32,
) -> Result<Vec<EventSummary>, StoreError> {
    let d = sql.dialect();
    let mut q = Builder::new(format!(
        "SELECT e.id, e.source, e.type, e.stream, e.sequence, {} FROM {{s}}events e",
        d.time_as_ms("e.ingested_at")
    ));
    // The table the filters and the limit apply to: the events themselves,
    // or with a state the inner choice of the page (`k`).
    let t = if f.state.is_some() {
        q.push(" WHERE e.seq_id IN (SELECT k.seq_id FROM {s}events k WHERE 1 = 1");
        "k"
    } else {
        q.push(" WHERE 1 = 1");
        "e"
    };
    let order = |t: &str| {
        if f.stream.is_some() {
            format!(" ORDER BY {t}.sequence DESC")
        } else {
            format!(" ORDER BY {t}.ingested_at DESC, {t}.seq_id DESC")
        }
    };
    let columns =
        ["id", "stream", "type", "source", "producer", "ingested_at"].map(|c| format!("{t}.{c}"));
    push_equal(
        &mut q,
        [
            (columns[0].as_str(), &f.id),
            (columns[1].as_str(), &f.stream),
            (columns[2].as_str(), &f.ty),
            (columns[3].as_str(), &f.source),
            (columns[4].as_str(), &f.producer),
        ],
    );
    push_time_range(sql, &mut q, &columns[5], f.since_ms, f.until_ms);
    if let Some(state) = f.state {
        let condition = plan::state_sql(state, d.now);
        if plan::state_is_few(state) {
            q.push(&format!(
                " AND k.id IN (SELECT event_id FROM {{s}}deliveries WHERE {condition})"
            ));
        } else {
            q.push(&format!(
                " AND EXISTS (SELECT 1 FROM {{s}}deliveries WHERE event_id = k.id AND {condition})"
            ));
        }
    }
    let p = q.arg(limit as i64);
    q.push(&format!("{} LIMIT {p}", order(t)));
    if f.state.is_some() {
        q.push(&format!("){}", order("e")));
    }
    use Col::*;
    let rows = sql
        .read(q.build(sql, &[Text, Text, Text, Text, Int, Int]))
        .await?;
    Ok(rows
        .iter()
        .map(|r| EventSummary {
            id: r[0].text(),
            source: r[1].text(),
            ty: r[2].text(),
            stream: r[3].text(),
            sequence: r[4].int() as u64,
            ingested_at_ms: r[5].int(),
        })
        .collect())
}

/// The heads of `stream` by delivery key, through `heads (stream)`.
pub async fn stream_heads(sql: &dyn Sql, stream: &str) -> Result<Vec<StreamHead>, StoreError> {
    let d = sql.dialect();
    let template = format!(
        "SELECT h.sink, dl.event_id, dl.sequence, {state}, CAST(dl.attempts AS BIGINT), \
           dl.last_error, CASE WHEN h.due_at = {blocked} THEN NULL ELSE {due} END, \
           CASE WHEN dl.lease_expires_at > {now} THEN {lease} END \
         FROM {{s}}heads h JOIN {{s}}deliveries dl ON dl.id = h.delivery_id \
         WHERE h.stream = $1 ORDER BY h.sink",
        state = plan::row_state_sql(d.now),
        blocked = d.blocked_due,
        due = d.time_as_ms("h.due_at"),
        now = d.now,
        lease = d.time_as_ms("dl.lease_expires_at"),
    );
    use Col::*;
    let rows = sql
        .read(
            stmt(
                sql,
                &template,
                &[Text, Text, Int, Text, Int, OptText, OptInt, OptInt],
            )
            .arg(stream),
        )
        .await?;
    rows.iter()
        .map(|r| {
            let state = RowState::parse(&r[3].text())
                .ok_or_else(|| StoreError::Corrupt(format!("delivery state {:?}", r[3])))?;
            Ok(StreamHead {
                sink: r[0].text(),
                event_id: r[1].text(),
                sequence: r[2].int() as u64,
                status: state.shown(),
                attempts: r[4].int() as u32,
                last_error: r[5].opt_text(),
                due_at_ms: r[6].opt_int(),
                lease_expires_at_ms: r[7].opt_int(),
            })
        })
        .collect()
}

/// `SELECT id FROM deliveries WHERE status = 'dead' AND <filter> LIMIT
/// <limit>` (locking the rows where the dialect locks), for a statement
/// that changes them.
fn dead_ids(sql: &dyn Sql, q: &mut Builder, filter: &DeadFilter, limit: u32) {
    q.push("SELECT id FROM {s}deliveries WHERE status = 'dead'");
    push_dead_filter(sql, q, filter);
    let p = q.arg(limit as i64);
    q.push(&format!(" LIMIT {p}{}", sql.dialect().for_update));
}

/// Lock the rows of `streams` in byte order (`BTreeSet` order is byte
/// order, PostgreSQL's `COLLATE "C"`), where the dialect locks: the one
/// order every transaction that adds deliveries or resets heads takes them
/// in (ingest, routing, replay, purge, backfill), so two never wait on
/// each other in opposite orders. A finish locks only the heads it moves
/// (`postgres::LOCK_FINISHING_HEADS_SQL`), which these transactions lock
/// after their streams' rows ([`reset_head`], the head insert of
/// ingest), so a head is never moved from a stale read.
pub async fn lock_streams(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    streams: &BTreeSet<String>,
) -> Result<(), StoreError> {
    if let Some(lock) = sql.dialect().lock_stream {
        for stream in streams {
            tx.rows(stmt(sql, lock, &[]).arg(stream)).await?;
        }
    }
    Ok(())
}

/// Wake the other processes with `payload`, where the dialect can.
async fn wake(sql: &dyn Sql, tx: &mut (dyn SqlTx + '_), payload: &str) -> Result<(), StoreError> {
    if let Some(notify) = sql.dialect().wake(payload) {
        tx.rows(notify).await?;
    }
    Ok(())
}

/// Point the head of (`key`, `stream`) at its earliest live delivery
/// (after a replay or a backfill added one that may sit before the current
/// head, or a purge removed a blocking one), unless [`plan::keep_head`]
/// keeps it; with no live delivery, leave it as it is. The head is read
/// locked (where the dialect locks), so a finish moving it meanwhile is
/// waited for and seen.
pub async fn reset_head(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    key: &str,
    stream: &str,
    unblocking: &[i64],
) -> Result<(), StoreError> {
    let d = sql.dialect();
    let current = tx
        .rows(
            stmt(
                sql,
                &format!(
                    "SELECT delivery_id, due_at = {} FROM {{s}}heads WHERE sink = $1 AND stream = $2{}",
                    d.blocked_due, d.for_update
                ),
                &[Col::Int, Col::Bool],
            )
            .arg(key)
            .arg(stream),
        )
        .await?;
    let current = current
        .first()
        .map(|r| (r[0].int(), matches!(r[1], Val::Bool(true))));
    if plan::keep_head(current, unblocking) {
        return Ok(());
    }
    tx.rows(
        stmt(
            sql,
            "INSERT INTO {s}heads (sink, stream, delivery_id, due_at) \
             SELECT sink, stream, id, {greatest}(next_attempt_at, COALESCE(lease_expires_at, next_attempt_at)) \
             FROM {s}deliveries WHERE sink = $1 AND stream = $2 AND status = 'pending' \
             ORDER BY sequence LIMIT 1 \
             ON CONFLICT (sink, stream) DO UPDATE SET delivery_id = excluded.delivery_id, due_at = excluded.due_at",
            &[],
        )
        .arg(key)
        .arg(stream),
    )
    .await?;
    Ok(())
}

/// Make up to `limit` matching dead letters pending again: attempts and
/// retry window start afresh; each stream's head is reset (the replayed
/// letter may sit before it). Returns how many.
pub async fn replay_dead(
    sql: &dyn Sql,
    filter: &DeadFilter,
    limit: u32,
) -> Result<u64, StoreError> {
    let mut q = Builder::new(
        "UPDATE {s}deliveries SET status = 'pending', attempts = 0, first_attempt_at = NULL, \
         next_attempt_at = {now}, finished_at = NULL WHERE id IN (",
    );
    dead_ids(sql, &mut q, filter, limit);
    q.push(") RETURNING id, sink, stream");
    let mut tx = sql.begin().await?;
    let rows = tx
        .rows(q.build(sql, &[Col::Int, Col::Text, Col::Text]))
        .await?;
    let replayed: Vec<i64> = rows.iter().map(|r| r[0].int()).collect();
    let pairs: BTreeSet<(String, String)> =
        rows.iter().map(|r| (r[2].text(), r[1].text())).collect();
    let streams: BTreeSet<String> = pairs.iter().map(|(stream, _)| stream.clone()).collect();
    lock_streams(sql, &mut *tx, &streams).await?;
    for (stream, key) in &pairs {
        reset_head(sql, &mut *tx, key, stream, &replayed).await?;
    }
    wake(sql, &mut *tx, "replay").await?;
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// Delete up to `limit` matching dead letters. A purged letter that
/// blocked its stream (`on-dead = "block"`) still holds the head: the
/// stream moves on to its next live delivery. Returns how many.
pub async fn purge_dead(sql: &dyn Sql, filter: &DeadFilter, limit: u32) -> Result<u64, StoreError> {
    let mut q = Builder::new("DELETE FROM {s}deliveries WHERE id IN (");
    dead_ids(sql, &mut q, filter, limit);
    q.push(") RETURNING id, sink, stream");
    let mut tx = sql.begin().await?;
    let rows = tx
        .rows(q.build(sql, &[Col::Int, Col::Text, Col::Text]))
        .await?;
    let mut by_stream: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    for r in &rows {
        by_stream
            .entry((r[2].text(), r[1].text()))
            .or_default()
            .push(r[0].int());
    }
    let streams: BTreeSet<String> = by_stream.keys().map(|(stream, _)| stream.clone()).collect();
    lock_streams(sql, &mut *tx, &streams).await?;
    for ((stream, key), ids) in &by_stream {
        let mut held = false;
        for id in ids {
            let gone = tx
                .rows(
                    stmt(
                        sql,
                        "DELETE FROM {s}heads WHERE sink = $1 AND stream = $2 AND delivery_id = $3 RETURNING CAST(1 AS BIGINT)",
                        &[Col::Int],
                    )
                    .arg(key)
                    .arg(stream)
                    .arg(*id),
                )
                .await?;
            held |= !gone.is_empty();
        }
        if held {
            reset_head(sql, &mut *tx, key, stream, &[]).await?;
        }
    }
    wake(sql, &mut *tx, "purge").await?;
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// Pause (nothing claimed, nothing lost) or resume a sink; a resume wakes
/// the other processes.
pub async fn set_paused(sql: &dyn Sql, sink: &str, paused: bool) -> Result<(), StoreError> {
    let mut stmts = vec![stmt(
        sql,
        "INSERT INTO {s}sink_state (sink, paused) VALUES ($1, $2) \
         ON CONFLICT (sink) DO UPDATE SET paused = excluded.paused",
        &[],
    )
    .arg(sink)
    .arg(paused)];
    if !paused {
        stmts.extend(sql.dialect().wake("resume"));
    }
    sql.write(stmts).await?;
    Ok(())
}

/// One text column of every row of `template` (no arguments).
async fn texts(sql: &dyn Sql, template: &str) -> Result<Vec<String>, StoreError> {
    let rows = sql.read(stmt(sql, template, &[Col::Text])).await?;
    Ok(rows.iter().map(|r| r[0].text()).collect())
}

/// Sinks currently paused.
pub async fn paused_sinks(sql: &dyn Sql) -> Result<Vec<String>, StoreError> {
    texts(
        sql,
        "SELECT sink FROM {s}sink_state WHERE paused ORDER BY sink",
    )
    .await
}

/// Delete up to `limit` deliveries delivered more than `older_than` ago.
pub async fn purge_delivered(
    sql: &dyn Sql,
    older_than: Duration,
    limit: u32,
) -> Result<u64, StoreError> {
    let template = format!(
        "DELETE FROM {{s}}deliveries WHERE id IN (SELECT id FROM {{s}}deliveries \
         WHERE status = 'delivered' AND finished_at < {} ORDER BY finished_at LIMIT $2) RETURNING CAST(1 AS BIGINT)",
        sql.dialect().ms_ago("$1")
    );
    let gone = sql
        .write(vec![stmt(sql, &template, &[Col::Int])
            .arg(older_than.as_millis() as i64)
            .arg(limit as i64)])
        .await?;
    Ok(gone.first().map_or(0, |rows| rows.len() as u64))
}

/// Names of `migrator`'s migrations not yet applied.
pub async fn pending_migrations(
    sql: &dyn Sql,
    migrator: &sqlx::migrate::Migrator,
    uninitialised: bool,
) -> Result<Vec<String>, StoreError> {
    let applied: Vec<i64> = if uninitialised {
        Vec::new()
    } else {
        let rows = sql
            .read(Stmt::new(
                "SELECT version FROM _sqlx_migrations WHERE success".to_string(),
                &[Col::Int],
            ))
            .await?;
        rows.iter().map(|r| r[0].int()).collect()
    };
    Ok(plan::pending_migrations(migrator, &applied))
}

/// The checkpoint source `source` last saved.
pub async fn source_checkpoint(sql: &dyn Sql, source: &str) -> Result<Option<String>, StoreError> {
    let rows = sql
        .read(
            stmt(
                sql,
                "SELECT checkpoint FROM {s}source_checkpoints WHERE source = $1",
                &[Col::Text],
            )
            .arg(source),
        )
        .await?;
    Ok(rows.first().map(|r| r[0].text()))
}

/// Save `checkpoint` as source `source`'s.
pub async fn save_source_checkpoint(
    sql: &dyn Sql,
    source: &str,
    checkpoint: &str,
) -> Result<(), StoreError> {
    sql.write(vec![stmt(
        sql,
        "INSERT INTO {s}source_checkpoints (source, checkpoint, updated_at) VALUES ($1, $2, {now}) \
         ON CONFLICT (source) DO UPDATE SET checkpoint = excluded.checkpoint, updated_at = excluded.updated_at",
        &[],
    )
    .arg(source)
    .arg(checkpoint)])
    .await?;
    Ok(())
}

/// Every destination, by name.
pub async fn destinations(sql: &dyn Sql) -> Result<Vec<DestinationRow>, StoreError> {
    use Col::*;
    let rows = sql
        .read(stmt(
            sql,
            "SELECT name, sink, record, revision, updated_at FROM {s}destinations ORDER BY name",
            &[Text, Text, Text, Int, Int],
        ))
        .await?;
    Ok(rows
        .iter()
        .map(|r| DestinationRow {
            name: r[0].text(),
            sink: r[1].text(),
            record: r[2].text(),
            revision: r[3].int(),
            updated_at_ms: r[4].int(),
        })
        .collect())
}

/// Write destination `name` as `mode` allows; the new revision, or `None`
/// when `mode` refused.
pub async fn put_destination(
    sql: &dyn Sql,
    name: &str,
    sink: &str,
    record: &str,
    mode: PutMode,
) -> Result<Option<i64>, StoreError> {
    put_record(
        sql,
        "destinations",
        name,
        &[("sink", sink), ("record", record)],
        mode,
    )
    .await
}

/// Write row `name` of `table` — a table of host records keyed by `name`
/// with a `revision` and an `updated_at` (destinations, producers) — with
/// `columns` (column, value) as `mode` allows; the new revision, or `None`
/// when `mode` refused (the name exists on `Create`; another revision is
/// stored on `Revision`).
async fn put_record(
    sql: &dyn Sql,
    table: &str,
    name: &str,
    columns: &[(&str, &str)],
    mode: PutMode,
) -> Result<Option<i64>, StoreError> {
    let names: Vec<&str> = columns.iter().map(|(c, _)| *c).collect();
    let params: Vec<String> = (2..columns.len() + 2).map(|i| format!("${i}")).collect();
    let insert = format!(
        "INSERT INTO {{s}}{table} (name, {}, revision, updated_at) VALUES ($1, {}, 1, {{now_ms}}) \
         ON CONFLICT (name) DO ",
        names.join(", "),
        params.join(", ")
    );
    let template = match mode {
        PutMode::Create => format!("{insert}NOTHING RETURNING revision"),
        PutMode::Upsert => format!(
            "{insert}UPDATE SET {}, revision = {{s}}{table}.revision + 1, \
             updated_at = excluded.updated_at RETURNING revision",
            names
                .iter()
                .map(|c| format!("{c} = excluded.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        PutMode::Revision(_) => format!(
            "UPDATE {{s}}{table} SET {}, revision = revision + 1, updated_at = {{now_ms}} \
             WHERE name = $1 AND revision = ${} RETURNING revision",
            names
                .iter()
                .zip(&params)
                .map(|(c, p)| format!("{c} = {p}"))
                .collect::<Vec<_>>()
                .join(", "),
            columns.len() + 2
        ),
    };
    let mut q = stmt(sql, &template, &[Col::Int]).arg(name);
    for (_, value) in columns {
        q = q.arg(*value);
    }
    if let PutMode::Revision(r) = mode {
        q = q.arg(r);
    }
    let rows = sql.write(vec![q]).await?;
    Ok(rows
        .first()
        .and_then(|rows| rows.first())
        .map(|r| r[0].int()))
}

/// Every producer, by name.
pub async fn producers(sql: &dyn Sql) -> Result<Vec<ProducerRow>, StoreError> {
    use Col::*;
    let rows = sql
        .read(stmt(
            sql,
            "SELECT name, record, revision FROM {s}producers ORDER BY name",
            &[Text, Text, Int],
        ))
        .await?;
    Ok(rows
        .iter()
        .map(|r| ProducerRow {
            name: r[0].text(),
            record: r[1].text(),
            revision: r[2].int(),
        })
        .collect())
}

/// Write producer `name`'s record as `mode` allows; the new revision, or
/// `None` when `mode` refused.
pub async fn put_producer(
    sql: &dyn Sql,
    name: &str,
    record: &str,
    mode: PutMode,
) -> Result<Option<i64>, StoreError> {
    put_record(sql, "producers", name, &[("record", record)], mode).await
}

/// The producer stored with event `id`, if any.
pub async fn event_producer(sql: &dyn Sql, id: &str) -> Result<Option<String>, StoreError> {
    let rows = sql
        .read(
            stmt(
                sql,
                "SELECT producer FROM {s}events WHERE id = $1",
                &[Col::OptText],
            )
            .arg(id),
        )
        .await?;
    Ok(rows.first().and_then(|r| r[0].opt_text()))
}

/// Delete destination `name` and its health; whether it existed.
pub async fn delete_destination(sql: &dyn Sql, name: &str) -> Result<bool, StoreError> {
    let out = sql
        .write(vec![
            stmt(
                sql,
                "DELETE FROM {s}destination_health WHERE name = $1",
                &[],
            )
            .arg(name),
            stmt(
                sql,
                "DELETE FROM {s}destinations WHERE name = $1 RETURNING CAST(1 AS BIGINT)",
                &[Col::Int],
            )
            .arg(name),
        ])
        .await?;
    Ok(out.last().is_some_and(|rows| !rows.is_empty()))
}

/// Delete every delivery of `key` that is not delivered, and its heads.
pub async fn purge_target(sql: &dyn Sql, key: &str) -> Result<Purged, StoreError> {
    let delete = |status: &str| {
        stmt(
            sql,
            &format!(
                "DELETE FROM {{s}}deliveries WHERE sink = $1 AND status = '{status}' RETURNING CAST(1 AS BIGINT)"
            ),
            &[Col::Int],
        )
        .arg(key)
    };
    let out = sql
        .write(vec![
            stmt(sql, "DELETE FROM {s}heads WHERE sink = $1", &[]).arg(key),
            delete("dead"),
            delete("pending"),
        ])
        .await?;
    let count = |i: usize| out.get(i).map_or(0, |rows| rows.len() as u64);
    Ok(Purged {
        dead: count(1),
        pending: count(2),
    })
}

/// The health record of every destination that has one.
pub async fn destination_health(sql: &dyn Sql) -> Result<Vec<(String, String)>, StoreError> {
    let rows = sql
        .read(stmt(
            sql,
            "SELECT name, health FROM {s}destination_health ORDER BY name",
            &[Col::Text, Col::Text],
        ))
        .await?;
    Ok(rows.iter().map(|r| (r[0].text(), r[1].text())).collect())
}

/// Replace the health record of destination `name`.
pub async fn save_destination_health(
    sql: &dyn Sql,
    name: &str,
    health: &str,
) -> Result<(), StoreError> {
    sql.write(vec![stmt(
        sql,
        "INSERT INTO {s}destination_health (name, health, updated_at) VALUES ($1, $2, {now_ms}) \
         ON CONFLICT (name) DO UPDATE SET health = excluded.health, updated_at = excluded.updated_at",
        &[],
    )
    .arg(name)
    .arg(health)])
    .await?;
    Ok(())
}

/// Register every sink of `sinks` not registered yet; the names newly
/// registered.
pub async fn register_sinks(
    sql: &dyn Sql,
    sinks: &[SinkIdentity],
) -> Result<Vec<String>, StoreError> {
    let stmts = sinks
        .iter()
        .map(|s| {
            stmt(
                sql,
                "INSERT INTO {s}sinks (name, version, component_sha, manifest_sha, registered_at) VALUES ($1, $2, $3, $4, {now_ms}) \
                 ON CONFLICT (name) DO NOTHING RETURNING name",
                &[Col::Text],
            )
            .arg(&s.name)
            .arg(&s.version)
            .arg(&s.component_sha)
            .arg(&s.manifest_sha)
        })
        .collect();
    let out = sql.write(stmts).await?;
    Ok(out.iter().flatten().map(|r| r[0].text()).collect())
}

/// The fleet's registry, by name.
pub async fn registered_sinks(sql: &dyn Sql) -> Result<Vec<RegisteredSink>, StoreError> {
    use Col::*;
    let rows = sql
        .read(stmt(
            sql,
            "SELECT name, version, component_sha, manifest_sha, registered_at, retired_at FROM {s}sinks ORDER BY name",
            &[Text, Text, Text, Text, Int, OptInt],
        ))
        .await?;
    Ok(rows
        .iter()
        .map(|r| RegisteredSink {
            name: r[0].text(),
            version: r[1].text(),
            component_sha: r[2].text(),
            manifest_sha: r[3].text(),
            registered_at_ms: r[4].int(),
            retired_at_ms: r[5].opt_int(),
        })
        .collect())
}

/// How long a replica's report of the sinks it serves is kept, ms: an
/// hour, far past `delivery.replica-timeout`, so a view of the fleet shows
/// a replica that stopped before it is forgotten.
const REPLICA_REPORT_KEPT_MS: i64 = 3_600_000;

/// Record that `replica` serves exactly `sinks` now.
pub async fn beat_replica(
    sql: &dyn Sql,
    replica: &str,
    sinks: &[SinkIdentity],
) -> Result<(), StoreError> {
    let mut stmts = vec![stmt(
        sql,
        "DELETE FROM {s}sink_replicas WHERE replica = $1 OR beat_at < {now_ms} - $2",
        &[],
    )
    .arg(replica)
    .arg(REPLICA_REPORT_KEPT_MS)];
    stmts.extend(sinks.iter().map(|s| {
        stmt(
            sql,
            "INSERT INTO {s}sink_replicas (replica, sink, version, component_sha, manifest_sha, beat_at) \
             VALUES ($1, $2, $3, $4, $5, {now_ms})",
            &[],
        )
        .arg(replica)
        .arg(&s.name)
        .arg(&s.version)
        .arg(&s.component_sha)
        .arg(&s.manifest_sha)
    }));
    sql.write(stmts).await?;
    Ok(())
}

/// Every replica's last report, by sink then replica.
pub async fn sink_replicas(sql: &dyn Sql) -> Result<Vec<SinkReplica>, StoreError> {
    use Col::*;
    let rows = sql
        .read(stmt(
            sql,
            "SELECT replica, sink, version, component_sha, manifest_sha, {now_ms} - beat_at FROM {s}sink_replicas \
             ORDER BY sink, replica",
            &[Text, Text, Text, Text, Text, Int],
        ))
        .await?;
    Ok(rows
        .iter()
        .map(|r| SinkReplica {
            replica: r[0].text(),
            sink: r[1].text(),
            version: r[2].text(),
            component_sha: r[3].text(),
            manifest_sha: r[4].text(),
            age_ms: r[5].int(),
        })
        .collect())
}

/// Retire sink `name`; false when it is not registered or already retired.
pub async fn retire_sink(sql: &dyn Sql, name: &str) -> Result<bool, StoreError> {
    let out = sql
        .write(vec![stmt(
            sql,
            "UPDATE {s}sinks SET retired_at = {now_ms} WHERE name = $1 AND retired_at IS NULL RETURNING CAST(1 AS BIGINT)",
            &[Col::Int],
        )
        .arg(name)])
        .await?;
    Ok(out.first().is_some_and(|rows| !rows.is_empty()))
}

/// Check that the database answers.
pub async fn ping(sql: &dyn Sql) -> Result<(), StoreError> {
    sql.read(Stmt::new("SELECT 1".to_string(), &[])).await?;
    Ok(())
}

/// The ids of `ids` a claim of a chained sink must hold back: those whose
/// event's delivery to `after` is not delivered yet.
pub async fn held_by_after(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    after: &str,
    ids: &[i64],
) -> Result<HashSet<i64>, StoreError> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let mut q = Builder::new(
        "SELECT d.id FROM {s}deliveries d JOIN {s}deliveries t ON t.event_id = d.event_id AND t.sink = ",
    );
    let p = q.arg(after);
    q.push(&p);
    q.push(" WHERE t.status <> 'delivered' AND d.id IN (");
    let list: Vec<String> = ids.iter().map(|id| q.arg(*id)).collect();
    q.push(&list.join(", "));
    q.push(")");
    let rows = tx.rows(q.build(sql, &[Col::Int])).await?;
    Ok(rows.iter().map(|r| r[0].int()).collect())
}

/// Of the blocking dead letters `ids`, those behind an undelivered earlier
/// delivery of their (key, stream): a pending one, or a dead letter
/// blocking the head (see [`plan::FinishPlan::settle`]).
pub async fn behind_earlier(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    ids: &[i64],
) -> Result<HashSet<i64>, StoreError> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let mut q = Builder::new("SELECT c.id FROM {s}deliveries c WHERE c.id IN (");
    let list: Vec<String> = ids.iter().map(|id| q.arg(*id)).collect();
    q.push(&list.join(", "));
    q.push(&format!(
        ") AND (EXISTS (SELECT 1 FROM {{s}}deliveries e WHERE e.sink = c.sink AND e.stream = c.stream \
                 AND e.status = 'pending' AND e.sequence < c.sequence) \
           OR EXISTS (SELECT 1 FROM {{s}}heads h JOIN {{s}}deliveries hd ON hd.id = h.delivery_id \
                 WHERE h.sink = c.sink AND h.stream = c.stream AND h.due_at = {} \
                   AND hd.sequence < c.sequence))",
        sql.dialect().blocked_due
    ));
    let rows = tx.rows(q.build(sql, &[Col::Int])).await?;
    Ok(rows.iter().map(|r| r[0].int()).collect())
}

/// The ids to lease of the claim `order` (see [`plan::take_runs`]) and the
/// streams whose head is leased. For a chained sink (`after`), the order is
/// cut at each stream's first delivery whose event `after` has not
/// delivered, and the heads so cut are held back for
/// [`plan::AFTER_RECHECK_MS`].
pub async fn apply_after(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    key: &str,
    after: Option<&str>,
    heads: &[(String, i64)],
    order: &[(String, i64)],
) -> Result<(Vec<i64>, Vec<String>), StoreError> {
    let ids: Vec<i64> = order.iter().map(|(_, id)| *id).collect();
    let Some(after) = after else {
        return Ok((ids, heads.iter().map(|(s, _)| s.clone()).collect()));
    };
    let blocked = held_by_after(sql, tx, after, &ids).await?;
    if blocked.is_empty() {
        return Ok((ids, heads.iter().map(|(s, _)| s.clone()).collect()));
    }
    let (kept, claimed, held) = plan::cut_runs(order, heads, &blocked);
    let hold = format!(
        "UPDATE {{s}}heads SET due_at = {} WHERE sink = $2 AND stream = $3",
        sql.dialect().ms_ahead("$1")
    );
    for stream in &held {
        tx.rows(
            stmt(sql, &hold, &[])
                .arg(plan::AFTER_RECHECK_MS)
                .arg(key)
                .arg(stream),
        )
        .await?;
    }
    Ok((kept, claimed))
}

/// The second half of a backfill page, inside its transaction: create a
/// delivery for `key` of each of `routed` (events of the page whose routes
/// include `key`) that has none, then reset the heads of the streams that
/// got one — a blocked head stays blocked ([`plan::keep_head`]) — and wake
/// the other processes. Returns how many deliveries it created.
pub async fn add_backfill(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    key: &str,
    routed: &[super::StoredEvent],
) -> Result<u64, StoreError> {
    // Stream locks first, as ingest takes them, before adding deliveries
    // and moving heads.
    let touched: BTreeSet<String> = routed.iter().map(|e| e.event.stream.clone()).collect();
    lock_streams(sql, tx, &touched).await?;
    let insert = "INSERT INTO {s}deliveries (event_id, sink, stream, sequence, next_attempt_at, created_at) \
                  VALUES ($1, $2, $3, $4, {now}, {now}) ON CONFLICT (event_id, sink) DO NOTHING RETURNING CAST(1 AS BIGINT)";
    let mut created = 0u64;
    let mut streams = BTreeSet::new();
    for stored in routed {
        let rows = tx
            .rows(
                stmt(sql, insert, &[Col::Int])
                    .arg(&stored.event.id)
                    .arg(key)
                    .arg(&stored.event.stream)
                    .arg(stored.sequence as i64),
            )
            .await?;
        if !rows.is_empty() {
            created += rows.len() as u64;
            streams.insert(stored.event.stream.clone());
        }
    }
    for stream in &streams {
        reset_head(sql, tx, key, stream, &[]).await?;
    }
    if created > 0 {
        wake(sql, tx, "backfill").await?;
    }
    Ok(created)
}

/// Event `id`, without its deliveries.
pub async fn stored_event(
    sql: &dyn Sql,
    id: &str,
) -> Result<Option<super::StoredEvent>, StoreError> {
    let template = format!(
        "SELECT {} FROM {{s}}events WHERE id = $1",
        super::event_columns(sql.dialect())
    );
    let rows = sql
        .read(stmt(sql, &template, super::EVENT_COLS).arg(id))
        .await?;
    rows.first().map(|r| super::event_from_vals(r)).transpose()
}

/// One page of a backfill (see [`super::Store::backfill_page`]): read the
/// page of events, let [`plan::BackfillRead`] pick those routed to `key`,
/// add their deliveries ([`add_backfill`]), in one transaction.
pub async fn backfill_page(
    sql: &dyn Sql,
    key: &str,
    since_ms: i64,
    after: i64,
    page: u32,
    route: &super::RouteFn<'_>,
) -> Result<super::BackfillPage, StoreError> {
    let d = sql.dialect();
    // Events enqueued by SQL and not routed yet get theirs from the router.
    let template = format!(
        "SELECT {}, seq_id FROM {{s}}events WHERE seq_id > $1 AND ingested_at >= {}{} \
         ORDER BY seq_id LIMIT $3",
        super::event_columns(d),
        d.ms_as_time("$2"),
        d.routed_only,
    );
    static COLS: std::sync::LazyLock<Vec<Col>> = std::sync::LazyLock::new(|| {
        let mut cols = super::EVENT_COLS.to_vec();
        cols.push(Col::Int);
        cols
    });
    let mut tx = sql.begin().await?;
    let q = Stmt {
        sql: d.sql(&template),
        args: vec![Arg::Int(after), Arg::Int(since_ms), Arg::Int(page as i64)],
        cols: COLS.as_slice(),
    };
    let rows = tx
        .rows(q)
        .await?
        .iter()
        .map(|r| Ok((r[super::EVENT_COLS.len()].int(), super::event_from_vals(r)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let read = plan::BackfillRead::new(rows, page, key, route);
    let created = add_backfill(sql, &mut *tx, key, &read.routed).await?;
    tx.commit().await?;
    Ok(read.done(created))
}

/// Failed attempts recorded per multi-row insert: 5 bound values a row
/// keeps a statement far inside SQLite's and PostgreSQL's parameter limits.
const ATTEMPT_ROWS: usize = 200;

/// Inside a finish's transaction, after its fenced updates: record one row
/// of `attempts` for each kept (`kept`: delivery ids whose fence held)
/// `Retry` or `Dead` of `items`, with `notes[i]` for `items[i]` where
/// given (see [`super::Store::finish_noted`]), then drop the rows of those
/// deliveries past [`crate::limits::ATTEMPTS_KEPT`], oldest first. At most
/// two statements per [`ATTEMPT_ROWS`] failures; none when nothing failed.
pub async fn record_failures(
    sql: &dyn Sql,
    tx: &mut (dyn SqlTx + '_),
    items: &[(i64, &str, &Finish)],
    notes: &[Option<AttemptNote>],
    kept: &HashSet<i64>,
) -> Result<(), StoreError> {
    let failed: Vec<(i64, AttemptNote, &str)> = items
        .iter()
        .enumerate()
        .filter(|(_, (id, _, _))| kept.contains(id))
        .filter_map(|(i, (id, _, finish))| {
            let (default, reason) = match finish {
                Finish::Retry { reason, .. } => (AttemptOutcome::Retry, reason.as_str()),
                Finish::Dead { reason, .. } => (AttemptOutcome::Dead, reason.as_str()),
                Finish::Delivered | Finish::Release => return None,
            };
            let note = notes.get(i).cloned().flatten().unwrap_or(AttemptNote {
                outcome: default,
                duration_ms: None,
                status: super::attempt_status(reason),
            });
            Some((*id, note, reason))
        })
        .collect();
    for chunk in failed.chunks(ATTEMPT_ROWS) {
        let mut q = Builder::new(
            "INSERT INTO {s}attempts (event_id, sink, stream, sequence, attempt, attempted_at, \
             duration_ms, outcome, status, reason) ",
        );
        let mut selects = Vec::with_capacity(chunk.len());
        for (id, note, reason) in chunk {
            let id = q.arg(*id);
            let duration = q.arg(note.duration_ms);
            let outcome = q.arg(note.outcome.as_str());
            let status = q.arg(Arg::OptText(note.status.clone()));
            let reason = q.arg(*reason);
            selects.push(format!(
                "SELECT event_id, sink, stream, sequence, attempts, {{now}}, CAST({duration} AS BIGINT), \
                 {outcome}, {status}, {reason} FROM {{s}}deliveries WHERE id = {id}"
            ));
        }
        q.push(&selects.join(" UNION ALL "));
        tx.rows(q.build(sql, &[])).await?;
        let mut q = Builder::new(
            "DELETE FROM {s}attempts WHERE id IN (SELECT id FROM (\
             SELECT a.id, ROW_NUMBER() OVER (PARTITION BY a.event_id, a.sink ORDER BY a.id DESC) AS n \
             FROM {s}attempts a JOIN {s}deliveries d ON a.event_id = d.event_id AND a.sink = d.sink \
             WHERE d.id IN (",
        );
        let ids: Vec<String> = chunk.iter().map(|(id, _, _)| q.arg(*id)).collect();
        q.push(&ids.join(", "));
        let keep = q.arg(crate::limits::ATTEMPTS_KEPT as i64);
        q.push(&format!(")) AS ranked WHERE n > {keep})"));
        tx.rows(q.build(sql, &[])).await?;
    }
    Ok(())
}

/// Failed attempts matching `f`, newest first, at most `limit`.
pub async fn list_attempts(
    sql: &dyn Sql,
    f: &AttemptFilter,
    limit: u32,
) -> Result<Vec<Attempt>, StoreError> {
    let d = sql.dialect();
    let mut q = Builder::new(format!(
        "SELECT event_id, sink, stream, sequence, CAST(attempt AS BIGINT), {}, duration_ms, \
         outcome, status, reason FROM {{s}}attempts WHERE 1 = 1",
        d.time_as_ms("attempted_at")
    ));
    push_equal(&mut q, [("sink", &f.sink), ("event_id", &f.event_id)]);
    push_time_range(sql, &mut q, "attempted_at", f.since_ms, f.until_ms);
    let p = q.arg(limit as i64);
    q.push(&format!(" ORDER BY attempted_at DESC, id DESC LIMIT {p}"));
    use Col::*;
    let rows = sql
        .read(q.build(
            sql,
            &[Text, Text, Text, Int, Int, Int, OptInt, Text, OptText, Text],
        ))
        .await?;
    rows.iter()
        .map(|r| {
            let outcome = AttemptOutcome::parse(&r[7].text())
                .ok_or_else(|| StoreError::Corrupt(format!("attempts.outcome {:?}", r[7])))?;
            Ok(Attempt {
                event_id: r[0].text(),
                sink: r[1].text(),
                stream: r[2].text(),
                sequence: r[3].int() as u64,
                attempt: r[4].int() as u32,
                attempted_at_ms: r[5].int(),
                duration_ms: r[6].opt_int(),
                outcome,
                status: r[8].opt_text(),
                reason: r[9].text(),
            })
        })
        .collect()
}

/// Delete up to `limit` failed attempts recorded more than `older_than`
/// ago, oldest first; how many.
pub async fn purge_attempts(
    sql: &dyn Sql,
    older_than: Duration,
    limit: u32,
) -> Result<u64, StoreError> {
    let template = format!(
        "DELETE FROM {{s}}attempts WHERE id IN (SELECT id FROM {{s}}attempts \
         WHERE attempted_at < {} ORDER BY attempted_at LIMIT $2) RETURNING CAST(1 AS BIGINT)",
        sql.dialect().ms_ago("$1")
    );
    let gone = sql
        .write(vec![stmt(sql, &template, &[Col::Int])
            .arg(older_than.as_millis() as i64)
            .arg(limit as i64)])
        .await?;
    Ok(gone.first().map_or(0, |rows| rows.len() as u64))
}
