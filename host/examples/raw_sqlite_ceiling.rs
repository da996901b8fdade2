//! The raw-SQLite ceiling: outboxd's embedded-store work done by plain SQL
//! on its own SQLite schema, with nothing else in the way (no HTTP, no
//! JSON parsing, no plugin, no statement per event). The SQLite twin of
//! `raw_sql_ceiling.rs`; what outboxd does end to end on its default store
//! is judged against this.
//!
//! On a fresh file migrated with outboxd's own migrations, WAL journal, one
//! writer connection (SQLite has one writer at a time, as outboxd's store):
//!
//! 1. **insert**: N events (event k on stream `s{k % S}`, 256 bytes of
//!    JSON data) in batches of 100, one transaction per batch: read the
//!    batch's streams, assign sequences, insert the events, their deliveries
//!    and any missing heads with one multi-row statement each, upsert
//!    `streams`;
//! 2. **claim + complete**: until every delivery is delivered, claim as
//!    outboxd's store does (due heads by due time, the runs behind them,
//!    batch 100; lease, heads' due times and the events' payloads in one
//!    transaction), then complete in a second transaction: mark the batch
//!    delivered fenced on the lease token with one statement, drop the heads
//!    left with nothing live and move the others to their next delivery
//!    with one statement each.
//!
//! Prints one JSON object per `synchronous` setting: insert,
//! claim+complete and pipeline (N / (t_insert + t_deliver)) events/s, and
//! commits (two per claim + complete, one per insert batch). `FULL` is
//! outboxd's setting (an acknowledged event survives power loss); `NORMAL`
//! in WAL mode survives a process crash but may lose the last commits on
//! power loss (<https://www.sqlite.org/pragma.html#pragma_synchronous>).
//!
//! ```sh
//! cargo run --release -p outboxd --example raw_sqlite_ceiling -- --n 10000 --streams 100 --synchronous full,normal
//! ```
//! `--dir` names the folder for the database files (default the system's
//! temporary folder); each run's file is removed at the end.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use outboxd::store::plan::take_runs;
use outboxd::store::sqlite::{CLAIM_FOLLOWERS_SQL, CLAIM_HEADS_SQL};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, QueryBuilder, Sqlite, SqliteConnection};

const BATCH: usize = 100;
const SINK: &str = "webhook";
const LEASE_MS: i64 = 70_000;
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

fn payload(k: usize) -> Vec<u8> {
    let head = format!("{{\"k\":{k},\"pad\":\"\"}}");
    format!("{{\"k\":{k},\"pad\":\"{}\"}}", "x".repeat(256 - head.len())).into_bytes()
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

async fn now_ms(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!("SELECT {NOW}"))
        .fetch_one(conn)
        .await
}

async fn insert_batch(
    conn: &mut SqliteConnection,
    ks: &[usize],
    streams: usize,
) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin().await?;
    let now = now_ms(&mut tx).await?;
    let names: BTreeSet<String> = ks.iter().map(|k| format!("s{}", k % streams)).collect();
    let mut q =
        QueryBuilder::<Sqlite>::new("SELECT stream, last_sequence FROM streams WHERE stream");
    push_in(&mut q, names.iter().cloned());
    let rows: Vec<(String, i64)> = q.build_query_as().fetch_all(&mut *tx).await?;
    let mut last: HashMap<String, i64> = rows.into_iter().collect();
    let mut rows = Vec::with_capacity(ks.len());
    for &k in ks {
        let stream = format!("s{}", k % streams);
        let seq = last.get(&stream).copied().unwrap_or(0) + 1;
        last.insert(stream.clone(), seq);
        rows.push((format!("raw-{k}"), stream, seq, payload(k)));
    }
    let mut events = QueryBuilder::<Sqlite>::new(
        "INSERT INTO events (id, source, type, datacontenttype, stream, sequence, data, data_format, \
         content_hash, ingested_at) ",
    );
    events.push_values(&rows, |mut b, (id, stream, seq, data)| {
        b.push_bind(id)
            .push_bind("https://bench.outboxd.invalid/raw")
            .push_bind("bench.event")
            .push_bind("application/json")
            .push_bind(stream)
            .push_bind(seq)
            .push_bind(data)
            .push_bind("json")
            .push_bind(id)
            .push_bind(now);
    });
    events.build().execute(&mut *tx).await?;
    let mut deliveries = QueryBuilder::<Sqlite>::new(
        "INSERT INTO deliveries (event_id, sink, stream, sequence, next_attempt_at, created_at) ",
    );
    deliveries.push_values(&rows, |mut b, (id, stream, seq, _)| {
        b.push_bind(id)
            .push_bind(SINK)
            .push_bind(stream)
            .push_bind(seq)
            .push_bind(now)
            .push_bind(now);
    });
    deliveries.push(" RETURNING id, stream, sequence");
    let made: Vec<(i64, String, i64)> = deliveries.build_query_as().fetch_all(&mut *tx).await?;
    // The first new delivery of each stream becomes its head when it has none.
    let mut firsts: HashMap<&str, (i64, i64)> = HashMap::new();
    for (id, stream, seq) in &made {
        let e = firsts.entry(stream.as_str()).or_insert((*id, *seq));
        if *seq < e.1 {
            *e = (*id, *seq);
        }
    }
    let mut heads =
        QueryBuilder::<Sqlite>::new("INSERT INTO heads (sink, stream, delivery_id, due_at) ");
    heads.push_values(&firsts, |mut b, (stream, (id, _))| {
        b.push_bind(SINK)
            .push_bind(*stream)
            .push_bind(*id)
            .push_bind(now);
    });
    heads.push(" ON CONFLICT (sink, stream) DO NOTHING");
    heads.build().execute(&mut *tx).await?;
    let mut upsert = QueryBuilder::<Sqlite>::new("INSERT INTO streams (stream, last_sequence) ");
    upsert.push_values(&last, |mut b, (stream, n)| {
        b.push_bind(stream).push_bind(*n);
    });
    upsert.push(" ON CONFLICT (stream) DO UPDATE SET last_sequence = excluded.last_sequence");
    upsert.build().execute(&mut *tx).await?;
    tx.commit().await
}

/// One claim + complete; how many deliveries it delivered.
async fn claim_and_complete(conn: &mut SqliteConnection) -> Result<usize, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let now = now_ms(&mut tx).await?;
    let heads: Vec<(String, i64)> = sqlx::query_as(CLAIM_HEADS_SQL)
        .bind(SINK)
        .bind(now)
        .bind(BATCH as i64)
        .fetch_all(&mut *tx)
        .await?;
    if heads.is_empty() {
        tx.commit().await?;
        return Ok(0);
    }
    let room = BATCH - heads.len();
    let mut followers = Vec::new();
    for (stream, head) in heads.iter().filter(|_| room > 0) {
        let rows: Vec<(i64, bool)> = sqlx::query_as(CLAIM_FOLLOWERS_SQL)
            .bind(now)
            .bind(SINK)
            .bind(stream)
            .bind(head)
            .bind(room as i64)
            .fetch_all(&mut *tx)
            .await?;
        followers.extend(rows.into_iter().map(|(id, ok)| (id, stream.clone(), ok)));
    }
    let ids: Vec<i64> = take_runs(&heads, followers, BATCH)
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    let streams: Vec<String> = heads.iter().map(|h| h.0.clone()).collect();
    let token = format!("{:032x}", rand::random::<u128>());
    let until = now + LEASE_MS;
    let mut lease = QueryBuilder::<Sqlite>::new("UPDATE deliveries SET lease_token = ");
    lease
        .push_bind(&token)
        .push(", lease_expires_at = ")
        .push_bind(until)
        .push(", attempts = attempts + 1, first_attempt_at = COALESCE(first_attempt_at, ")
        .push_bind(now)
        .push(") WHERE status = 'pending' AND id");
    push_in(&mut lease, ids.iter().copied());
    lease.push(" RETURNING event_id");
    let event_ids: Vec<(String,)> = lease.build_query_as().fetch_all(&mut *tx).await?;
    let mut due = QueryBuilder::<Sqlite>::new("UPDATE heads SET due_at = ");
    due.push_bind(until)
        .push(" WHERE sink = ")
        .push_bind(SINK)
        .push(" AND stream");
    push_in(&mut due, streams.iter().cloned());
    due.build().execute(&mut *tx).await?;
    // The payloads a sink would get.
    let mut read = QueryBuilder::<Sqlite>::new("SELECT id, data FROM events WHERE id");
    push_in(&mut read, event_ids.into_iter().map(|(id,)| id));
    let events: Vec<(String, Vec<u8>)> = read.build_query_as().fetch_all(&mut *tx).await?;
    tx.commit().await?;
    std::hint::black_box(&events);

    // (the sink call would be here, outside any transaction)

    let mut tx = conn.begin().await?;
    let mut done = QueryBuilder::<Sqlite>::new(format!(
        "UPDATE deliveries SET status = 'delivered', finished_at = {NOW}, lease_token = NULL, \
         lease_expires_at = NULL WHERE status = 'pending' AND lease_token = "
    ));
    done.push_bind(&token).push(" AND id");
    push_in(&mut done, ids.iter().copied());
    let delivered = done.build().execute(&mut *tx).await?.rows_affected();
    let mut drop_heads = QueryBuilder::<Sqlite>::new("DELETE FROM heads WHERE sink = ");
    drop_heads.push_bind(SINK).push(" AND stream");
    push_in(&mut drop_heads, streams.iter().cloned());
    drop_heads.push(
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.sink = heads.sink AND d.stream = heads.stream \
           AND d.status = 'pending')",
    );
    drop_heads.build().execute(&mut *tx).await?;
    let mut advance = QueryBuilder::<Sqlite>::new(
        "UPDATE heads SET (delivery_id, due_at) = (SELECT id, MAX(next_attempt_at, \
           COALESCE(lease_expires_at, next_attempt_at)) FROM deliveries d WHERE d.sink = heads.sink \
           AND d.stream = heads.stream AND d.status = 'pending' ORDER BY sequence LIMIT 1) WHERE sink = ",
    );
    advance.push_bind(SINK).push(" AND stream");
    push_in(&mut advance, streams.iter().cloned());
    advance.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(delivered as usize)
}

async fn open(path: &Path, synchronous: SqliteSynchronous) -> SqliteConnection {
    SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .foreign_keys(true)
        .connect()
        .await
        .unwrap()
}

async fn run(dir: &Path, n: usize, streams: usize, sync_name: &str) -> serde_json::Value {
    let synchronous =
        SqliteSynchronous::from_str(sync_name).expect("--synchronous full|normal|off");
    let path = dir.join(format!(
        "outboxd-bench-raw-{}.db",
        hex::encode(rand::random::<[u8; 4]>())
    ));
    {
        let store = outboxd::store::open(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
    }
    let mut conn = open(&path, synchronous).await;

    // 1. insert
    let start = Instant::now();
    let ks: Vec<usize> = (0..n).collect();
    let mut inserts = 0usize;
    for batch in ks.chunks(BATCH) {
        insert_batch(&mut conn, batch, streams)
            .await
            .expect("insert batch");
        inserts += 1;
    }
    let insert_s = start.elapsed().as_secs_f64();

    // 2. claim + complete
    let start = Instant::now();
    let (mut delivered, mut claims) = (0usize, 0usize);
    while delivered < n {
        let got = claim_and_complete(&mut conn)
            .await
            .expect("claim + complete");
        claims += 1;
        if got == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        delivered += got;
    }
    let deliver_s = start.elapsed().as_secs_f64();
    conn.close().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    json!({
        "store": "sqlite",
        "journal_mode": "wal",
        "synchronous": sync_name,
        "n": n,
        "streams": streams,
        "insert_s": insert_s,
        "deliver_s": deliver_s,
        "insert_eps": n as f64 / insert_s,
        "deliver_eps": n as f64 / deliver_s,
        "pipeline_eps": n as f64 / (insert_s + deliver_s),
        "claims": claims,
        "commits": inserts + 2 * claims,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let n: usize = flag("--n").map_or(10_000, |v| v.parse().unwrap());
    let streams: usize = flag("--streams").map_or(100, |v| v.parse().unwrap());
    let dir = flag("--dir").map_or_else(std::env::temp_dir, PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap();
    for mode in flag("--synchronous")
        .unwrap_or_else(|| "full".into())
        .split(',')
    {
        println!("{}", run(&dir, n, streams, mode).await);
    }
}
