//! The raw-SQL ceiling of a position-based store, beside today's
//! (`raw_sql_ceiling.rs`, `raw_sqlite_ceiling.rs`) on the same load: the
//! measurement that decides whether the store moves from a row per
//! (destination, event) to a position per (destination, stream).
//!
//! The schema (a scratch one, not outboxd's migrations):
//!
//! - `events` as today (appended once, whatever the number of keys), with
//!   `(stream, sequence)` unique;
//! - `streams (stream, last_sequence)` as today;
//! - `positions (key, stream, position, attempts, lease_token,
//!   lease_expires_at, due_at)`: the last sequence delivered or settled
//!   for a (delivery key, stream), and the head's attempt state. `due_at`
//!   is set while the stream has events past the position (NULL when
//!   caught up); a partial index on `(key, due_at)` finds due positions.
//!
//! The work, for each worker count W:
//!
//! 1. **insert**: N events (event k on stream `s{k % S}`, 256 bytes of
//!    JSON) in batches of 100, W batches at once: lock the batch's
//!    `streams` rows in sorted order, assign sequences, insert the events
//!    (one `unnest` statement), and mark each (key, stream) of the batch
//!    due unless it already is (`INSERT … ON CONFLICT DO UPDATE … WHERE
//!    due_at IS NULL`: one write per pair going from idle to due, none
//!    while it has a backlog), advance `streams`.
//! 2. **claim + complete**: W workers per key loop until every event is
//!    delivered. A claim takes up to 100 due, unleased positions of the key
//!    (`FOR UPDATE SKIP LOCKED`), leases them, and reads the events after
//!    each (the runs: up to ⌈100 / positions⌉ per stream, so a claim holds
//!    at most 100), in one transaction; a completion locks the streams'
//!    rows `FOR SHARE` (so an ingest committing meanwhile is seen, and no
//!    wake-up is lost), moves each position to the last sequence delivered
//!    fenced on the lease token, and leaves it due when its stream has
//!    more — one transaction.
//!
//! `--keys K` fans every event out to K delivery keys (one claim loop per
//! key; the insert marks K × streams pairs). Prints one JSON object per
//! worker count, with the same fields as `raw_sql_ceiling`, and on
//! PostgreSQL `commit_floor_ms`: the mean time of a transaction that
//! updates one row and commits (200 in a row, before the run) — the fsync
//! every claim and every completion waits for at least once.
//!
//! ```sh
//! cargo run --release -p outboxd --example position_ceiling -- --n 10000 --streams 100 --workers 1,2,4
//! cargo run --release -p outboxd --example position_ceiling -- --n 2000 --streams 100 --workers 1 --keys 1000
//! ```
//! `--admin` (or `OUTBOXD_TEST_PG`) names the admin URL; each run gets its
//! own database, dropped at the end. `--sqlite` runs the same schema and
//! work on SQLite (WAL, `synchronous = FULL`, one writer) instead.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, PgPool, SqlitePool};

const BATCH: usize = 100;
const LEASE_MS: i64 = 70_000;

const PG_SCHEMA: &[&str] = &[
    "CREATE SCHEMA pos",
    "CREATE TABLE pos.streams (stream text PRIMARY KEY, last_sequence bigint NOT NULL)",
    "CREATE TABLE pos.events (seq_id bigserial PRIMARY KEY, id text NOT NULL UNIQUE, source text NOT NULL, \
       type text NOT NULL, datacontenttype text, stream text NOT NULL, sequence bigint NOT NULL, \
       data bytea NOT NULL, data_format text NOT NULL, content_hash text NOT NULL, \
       ingested_at timestamptz NOT NULL DEFAULT now())",
    "CREATE UNIQUE INDEX events_stream_sequence ON pos.events (stream, sequence)",
    "CREATE TABLE pos.positions (key text NOT NULL, stream text NOT NULL, position bigint NOT NULL DEFAULT 0, \
       attempts integer NOT NULL DEFAULT 0, lease_token text, lease_expires_at timestamptz, \
       due_at timestamptz, last_error text, PRIMARY KEY (key, stream))",
    "CREATE INDEX positions_due ON pos.positions (key, due_at) WHERE due_at IS NOT NULL",
];

const SQLITE_SCHEMA: &[&str] = &[
    "CREATE TABLE streams (stream TEXT PRIMARY KEY, last_sequence INTEGER NOT NULL)",
    "CREATE TABLE events (seq_id INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, source TEXT NOT NULL, \
       type TEXT NOT NULL, datacontenttype TEXT, stream TEXT NOT NULL, sequence INTEGER NOT NULL, \
       data BLOB NOT NULL, data_format TEXT NOT NULL, content_hash TEXT NOT NULL, ingested_at INTEGER NOT NULL)",
    "CREATE UNIQUE INDEX events_stream_sequence ON events (stream, sequence)",
    "CREATE TABLE positions (key TEXT NOT NULL, stream TEXT NOT NULL, position INTEGER NOT NULL DEFAULT 0, \
       attempts INTEGER NOT NULL DEFAULT 0, lease_token TEXT, lease_expires_at INTEGER, \
       due_at INTEGER, last_error TEXT, PRIMARY KEY (key, stream)) WITHOUT ROWID",
    "CREATE INDEX positions_due ON positions (key, due_at) WHERE due_at IS NOT NULL",
];

fn payload(k: usize) -> Vec<u8> {
    let head = format!("{{\"k\":{k},\"pad\":\"\"}}");
    format!("{{\"k\":{k},\"pad\":\"{}\"}}", "x".repeat(256 - head.len())).into_bytes()
}

/// The events of one insert batch: ids, streams, sequences, data — and the
/// streams' new last sequences.
struct Batch {
    ids: Vec<String>,
    streams: Vec<String>,
    seqs: Vec<i64>,
    datas: Vec<Vec<u8>>,
    last: HashMap<String, i64>,
}

fn assign(ks: &[usize], streams: usize, mut last: HashMap<String, i64>) -> Batch {
    let mut b = Batch {
        ids: Vec::new(),
        streams: Vec::new(),
        seqs: Vec::new(),
        datas: Vec::new(),
        last: HashMap::new(),
    };
    for &k in ks {
        let stream = format!("s{}", k % streams);
        let seq = last.get(&stream).copied().unwrap_or(0) + 1;
        last.insert(stream.clone(), seq);
        b.ids.push(format!("pos-{k}"));
        b.streams.push(stream);
        b.seqs.push(seq);
        b.datas.push(payload(k));
    }
    b.last = last;
    b
}

fn batch_streams(ks: &[usize], streams: usize) -> Vec<String> {
    let names: BTreeSet<String> = ks.iter().map(|k| format!("s{}", k % streams)).collect();
    names.into_iter().collect()
}

// ---- PostgreSQL -----------------------------------------------------------

async fn pg_insert(
    pool: &PgPool,
    ks: &[usize],
    streams: usize,
    keys: &[String],
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let names = batch_streams(ks, streams);
    sqlx::query(
        "INSERT INTO pos.streams (stream, last_sequence) SELECT s, 0 FROM unnest($1::text[]) AS s \
         ORDER BY s ON CONFLICT (stream) DO NOTHING",
    )
    .bind(&names)
    .execute(&mut *tx)
    .await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT stream, last_sequence FROM pos.streams WHERE stream = ANY($1) ORDER BY stream FOR UPDATE",
    )
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    let b = assign(ks, streams, rows.into_iter().collect());
    sqlx::query(
        "INSERT INTO pos.events (id, source, type, datacontenttype, stream, sequence, data, data_format, content_hash) \
         SELECT id, 'https://bench.outboxd.invalid/raw', 'bench.event', 'application/json', stream, seq, data, 'json', \
                md5(data)::text || md5(id) \
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) AS t(id, stream, seq, data)",
    )
    .bind(&b.ids)
    .bind(&b.streams)
    .bind(&b.seqs)
    .bind(&b.datas)
    .execute(&mut *tx)
    .await?;
    // Each (key, stream) of the batch due, unless it already is: a new
    // pair inserted, an idle one marked — a write only for a pair going
    // from idle to due. (`ON CONFLICT DO UPDATE … WHERE due_at IS NULL`
    // would lock every pair that already is due: 30% slower inserts.)
    sqlx::query(
        "INSERT INTO pos.positions (key, stream, due_at) \
         SELECT k, s, now() FROM unnest($1::text[]) AS k CROSS JOIN unnest($2::text[]) AS s ORDER BY k, s \
         ON CONFLICT (key, stream) DO NOTHING",
    )
    .bind(keys)
    .bind(&names)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE pos.positions SET due_at = now() \
         WHERE key = ANY($1) AND stream = ANY($2) AND due_at IS NULL",
    )
    .bind(keys)
    .bind(&names)
    .execute(&mut *tx)
    .await?;
    let (names, values): (Vec<String>, Vec<i64>) = b.last.into_iter().unzip();
    sqlx::query(
        "UPDATE pos.streams AS s SET last_sequence = v.n \
         FROM unnest($1::text[], $2::bigint[]) AS v(stream, n) WHERE s.stream = v.stream",
    )
    .bind(&names)
    .bind(&values)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// One claim + complete for `key`: events delivered, time claiming, time
/// completing.
async fn pg_claim_and_complete(
    pool: &PgPool,
    key: &str,
) -> Result<(usize, Duration, Duration), sqlx::Error> {
    let started = Instant::now();
    let token = format!("{:032x}", rand::random::<u128>());
    let mut tx = pool.begin().await?;
    let leased: Vec<(String, i64)> = sqlx::query_as(
        "WITH due AS (SELECT stream FROM pos.positions WHERE key = $1 AND due_at <= now() \
                      ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         UPDATE pos.positions p SET lease_token = $3, lease_expires_at = now() + $4 * interval '1 millisecond', \
                due_at = now() + $4 * interval '1 millisecond', attempts = attempts + 1 \
         FROM due WHERE p.key = $1 AND p.stream = due.stream RETURNING p.stream, p.position",
    )
    .bind(key)
    .bind(BATCH as i64)
    .bind(&token)
    .bind(LEASE_MS)
    .fetch_all(&mut *tx)
    .await?;
    if leased.is_empty() {
        tx.commit().await?;
        return Ok((0, started.elapsed(), Duration::ZERO));
    }
    let per_stream = BATCH.div_ceil(leased.len()) as i64;
    let (streams, positions): (Vec<String>, Vec<i64>) = leased.into_iter().unzip();
    let events: Vec<(String, i64, String, Vec<u8>)> = sqlx::query_as(
        "SELECT e.stream, e.sequence, e.id, e.data FROM unnest($1::text[], $2::bigint[]) AS p(stream, pos) \
         CROSS JOIN LATERAL (SELECT stream, sequence, id, data FROM pos.events \
                             WHERE stream = p.stream AND sequence > p.pos ORDER BY sequence LIMIT $3) AS e",
    )
    .bind(&streams)
    .bind(&positions)
    .bind(per_stream)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    std::hint::black_box(&events);
    let claimed = started.elapsed();

    // (the sink call would be here, outside any transaction)

    let mut upto: HashMap<&str, i64> = HashMap::new();
    for (stream, seq, _, _) in &events {
        let e = upto.entry(stream.as_str()).or_insert(0);
        *e = (*e).max(*seq);
    }
    let (done_streams, done_upto): (Vec<String>, Vec<i64>) = streams
        .iter()
        .zip(&positions)
        .map(|(s, p)| (s.clone(), upto.get(s.as_str()).copied().unwrap_or(*p)))
        .unzip();
    let mut tx = pool.begin().await?;
    let mut sorted = done_streams.clone();
    sorted.sort();
    sqlx::query("SELECT 1 FROM pos.streams WHERE stream = ANY($1) ORDER BY stream FOR SHARE")
        .bind(&sorted)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE pos.positions p SET position = v.upto, lease_token = NULL, lease_expires_at = NULL, attempts = 0, \
                due_at = CASE WHEN s.last_sequence > v.upto THEN now() END \
         FROM unnest($2::text[], $3::bigint[]) AS v(stream, upto) JOIN pos.streams s ON s.stream = v.stream \
         WHERE p.key = $1 AND p.stream = v.stream AND p.lease_token = $4",
    )
    .bind(key)
    .bind(&done_streams)
    .bind(&done_upto)
    .bind(&token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((events.len(), claimed, started.elapsed() - claimed))
}

async fn pg_run(
    admin: &str,
    n: usize,
    streams: usize,
    workers: usize,
    keys: usize,
) -> serde_json::Value {
    let base = admin.rsplit_once('/').unwrap().0.to_string();
    let name = format!(
        "outboxd_bench_pos_{}",
        hex::encode(rand::random::<[u8; 4]>())
    );
    let mut a = sqlx::PgConnection::connect(admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut a)
        .await
        .unwrap();
    let url = format!("{base}/{name}");
    let pool = PgPoolOptions::new()
        .max_connections((workers * keys.min(8)) as u32 + 2)
        .connect(&url)
        .await
        .unwrap();
    for statement in PG_SCHEMA {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let commit_floor_ms = pg_commit_floor(&pool).await;
    let keys: Arc<Vec<String>> = Arc::new((0..keys).map(|i| format!("k{i}")).collect());
    let insert = move |pool: PgPool, batch: Vec<usize>, keys: Arc<Vec<String>>| async move {
        let mut tries = 0;
        while let Err(e) = pg_insert(&pool, &batch, streams, &keys).await {
            tries += 1;
            assert!(tries < 5, "insert: {e}");
        }
    };
    let insert_s = {
        let pool = pool.clone();
        let keys = keys.clone();
        timed_batches(n, workers, move |batch| {
            insert(pool.clone(), batch, keys.clone())
        })
        .await
    };
    let claim = |pool: PgPool, key: String| async move {
        pg_claim_and_complete(&pool, &key)
            .await
            .expect("claim + complete")
    };
    let (deliver_s, claims, claim_t, complete_t) = {
        let pool = pool.clone();
        timed_delivery(n, workers, &keys, move |key| claim(pool.clone(), key)).await
    };
    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut a)
        .await
        .unwrap();
    let mut r = report(
        "postgres",
        n,
        streams,
        workers,
        keys.len(),
        insert_s,
        deliver_s,
        claims,
        claim_t,
        complete_t,
    );
    r["commit_floor_ms"] = json!(commit_floor_ms);
    r
}

/// Mean ms of a transaction that updates one row and commits, over 200 in
/// a row: the disk's fsync as every commit meets it.
async fn pg_commit_floor(pool: &PgPool) -> f64 {
    sqlx::query("CREATE TABLE pos.floor (k integer PRIMARY KEY, v bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO pos.floor VALUES (1, 0)")
        .execute(pool)
        .await
        .unwrap();
    let start = Instant::now();
    for _ in 0..200 {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("UPDATE pos.floor SET v = v + 1 WHERE k = 1")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    start.elapsed().as_secs_f64() * 1e3 / 200.0
}

// ---- SQLite ---------------------------------------------------------------

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

async fn sqlite_insert(
    pool: &SqlitePool,
    ks: &[usize],
    streams: usize,
    keys: &[String],
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let names = batch_streams(ks, streams);
    let mut last = HashMap::new();
    for s in &names {
        let n: Option<i64> =
            sqlx::query_scalar("SELECT last_sequence FROM streams WHERE stream = ?")
                .bind(s)
                .fetch_optional(&mut *tx)
                .await?;
        last.insert(s.clone(), n.unwrap_or(0));
    }
    let b = assign(ks, streams, last);
    let now = now_ms();
    let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
        "INSERT INTO events (id, source, type, datacontenttype, stream, sequence, data, data_format, content_hash, ingested_at) ",
    );
    q.push_values(0..b.ids.len(), |mut r, i| {
        r.push_bind(&b.ids[i])
            .push_bind("https://bench.outboxd.invalid/raw")
            .push_bind("bench.event")
            .push_bind("application/json")
            .push_bind(&b.streams[i])
            .push_bind(b.seqs[i])
            .push_bind(&b.datas[i])
            .push_bind("json")
            .push_bind(format!("{:x}", b.seqs[i]))
            .push_bind(now);
    });
    q.build().execute(&mut *tx).await?;
    for chunk in keys.chunks(50) {
        let mut q =
            sqlx::QueryBuilder::<sqlx::Sqlite>::new("INSERT INTO positions (key, stream, due_at) ");
        let pairs: Vec<(&String, &String)> = chunk
            .iter()
            .flat_map(|k| names.iter().map(move |s| (k, s)))
            .collect();
        q.push_values(pairs, |mut r, (k, s)| {
            r.push_bind(k).push_bind(s).push_bind(now);
        });
        q.push(" ON CONFLICT (key, stream) DO UPDATE SET due_at = excluded.due_at WHERE positions.due_at IS NULL");
        q.build().execute(&mut *tx).await?;
    }
    let mut q =
        sqlx::QueryBuilder::<sqlx::Sqlite>::new("INSERT INTO streams (stream, last_sequence) ");
    q.push_values(b.last.iter(), |mut r, (s, n)| {
        r.push_bind(s).push_bind(*n);
    });
    q.push(" ON CONFLICT (stream) DO UPDATE SET last_sequence = excluded.last_sequence");
    q.build().execute(&mut *tx).await?;
    tx.commit().await
}

async fn sqlite_claim_and_complete(
    pool: &SqlitePool,
    key: &str,
) -> Result<(usize, Duration, Duration), sqlx::Error> {
    let started = Instant::now();
    let token = format!("{:032x}", rand::random::<u128>());
    let now = now_ms();
    let mut tx = pool.begin().await?;
    let leased: Vec<(String, i64)> = sqlx::query_as(
        "UPDATE positions SET lease_token = ?1, lease_expires_at = ?2 + ?3, due_at = ?2 + ?3, attempts = attempts + 1 \
         WHERE key = ?4 AND stream IN (SELECT stream FROM positions WHERE key = ?4 AND due_at <= ?2 \
                                       ORDER BY due_at LIMIT ?5) RETURNING stream, position",
    )
    .bind(&token)
    .bind(now)
    .bind(LEASE_MS)
    .bind(key)
    .bind(BATCH as i64)
    .fetch_all(&mut *tx)
    .await?;
    if leased.is_empty() {
        tx.commit().await?;
        return Ok((0, started.elapsed(), Duration::ZERO));
    }
    let per_stream = BATCH.div_ceil(leased.len()) as i64;
    // The runs behind the positions, one statement: each position one
    // range probe of `(stream, sequence)` — sequences assigned at ingest
    // are gapless, so the next `per_stream` events are
    // `(position, position + per_stream]` (SQLite has no LATERAL … LIMIT;
    // a window over every later event read 100× the rows). `CROSS JOIN`
    // keeps the positions outer.
    let probes = serde_json::to_string(&leased).expect("pairs serialise");
    let events: Vec<(String, i64, String, Vec<u8>)> = sqlx::query_as(
        "SELECT e.stream, e.sequence, e.id, e.data FROM json_each(?1) AS p \
         CROSS JOIN events e ON e.stream = json_extract(p.value, '$[0]') \
                              AND e.sequence > json_extract(p.value, '$[1]') \
                              AND e.sequence <= json_extract(p.value, '$[1]') + ?2",
    )
    .bind(&probes)
    .bind(per_stream)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    std::hint::black_box(&events);
    let claimed = started.elapsed();
    let mut upto: HashMap<&str, i64> = HashMap::new();
    for (stream, seq, _, _) in &events {
        let e = upto.entry(stream.as_str()).or_insert(0);
        *e = (*e).max(*seq);
    }
    let moves: Vec<(&str, i64)> = leased
        .iter()
        .map(|(s, p)| (s.as_str(), upto.get(s.as_str()).copied().unwrap_or(*p)))
        .collect();
    let moves = serde_json::to_string(&moves).expect("pairs serialise");
    let now = now_ms();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE positions SET position = v.upto, lease_token = NULL, lease_expires_at = NULL, attempts = 0, \
                due_at = CASE WHEN s.last_sequence > v.upto THEN ?2 END \
         FROM (SELECT json_extract(value, '$[0]') AS stream, json_extract(value, '$[1]') AS upto \
               FROM json_each(?1)) AS v JOIN streams s ON s.stream = v.stream \
         WHERE positions.key = ?3 AND positions.stream = v.stream AND positions.lease_token = ?4",
    )
    .bind(&moves)
    .bind(now)
    .bind(key)
    .bind(&token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((events.len(), claimed, started.elapsed() - claimed))
}

async fn sqlite_run(n: usize, streams: usize, workers: usize, keys: usize) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("pos.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30));
    // One writer, as outboxd's SQLite store: every transaction here writes.
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    for statement in SQLITE_SCHEMA {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let keys: Arc<Vec<String>> = Arc::new((0..keys).map(|i| format!("k{i}")).collect());
    let insert_s = {
        let (pool, keys) = (pool.clone(), keys.clone());
        timed_batches(n, workers, move |batch| {
            let (pool, keys) = (pool.clone(), keys.clone());
            async move {
                sqlite_insert(&pool, &batch, streams, &keys)
                    .await
                    .expect("insert")
            }
        })
        .await
    };
    let (deliver_s, claims, claim_t, complete_t) = {
        let pool = pool.clone();
        timed_delivery(n, workers, &keys, move |key| {
            let pool = pool.clone();
            async move {
                sqlite_claim_and_complete(&pool, &key)
                    .await
                    .expect("claim + complete")
            }
        })
        .await
    };
    pool.close().await;
    report(
        "sqlite",
        n,
        streams,
        workers,
        keys.len(),
        insert_s,
        deliver_s,
        claims,
        claim_t,
        complete_t,
    )
}

// ---- shared ---------------------------------------------------------------

/// Insert `n` events in batches of [`BATCH`] with `workers` at once;
/// seconds taken.
async fn timed_batches<F, Fut>(n: usize, workers: usize, insert: F) -> f64
where
    F: Fn(Vec<usize>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let batches: Arc<Vec<Vec<usize>>> = Arc::new(
        (0..n)
            .collect::<Vec<_>>()
            .chunks(BATCH)
            .map(<[usize]>::to_vec)
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (batches, next, insert) = (batches.clone(), next.clone(), insert.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(batch) = batches.get(i) else { return };
                insert(batch.clone()).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed().as_secs_f64()
}

/// `workers` claim loops per key until every key has all `n` events;
/// seconds taken, claims, time claiming and completing (summed).
async fn timed_delivery<F, Fut>(
    n: usize,
    workers: usize,
    keys: &Arc<Vec<String>>,
    claim: F,
) -> (f64, usize, Duration, Duration)
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (usize, Duration, Duration)> + Send,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    // At most 8 keys' loops run at once (a pool of connections serves
    // them); a key's loops stop when it has all n events.
    let next_key = Arc::new(AtomicUsize::new(0));
    for _ in 0..keys.len().min(8) {
        let (keys, next_key, claim) = (keys.clone(), next_key.clone(), claim.clone());
        tasks.push(tokio::spawn(async move {
            let (mut claims, mut claim_t, mut complete_t) =
                (0usize, Duration::ZERO, Duration::ZERO);
            loop {
                let k = next_key.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(k) else { break };
                let delivered = Arc::new(AtomicUsize::new(0));
                let mut loops = Vec::new();
                for _ in 0..workers {
                    let (key, delivered, claim) = (key.clone(), delivered.clone(), claim.clone());
                    loops.push(tokio::spawn(async move {
                        let (mut c, mut ct, mut ft) = (0usize, Duration::ZERO, Duration::ZERO);
                        while delivered.load(Ordering::Relaxed) < n {
                            let (got, a, b) = claim(key.clone()).await;
                            c += 1;
                            ct += a;
                            ft += b;
                            if got == 0 {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            delivered.fetch_add(got, Ordering::Relaxed);
                        }
                        (c, ct, ft)
                    }));
                }
                for l in loops {
                    let (c, a, b) = l.await.unwrap();
                    claims += c;
                    claim_t += a;
                    complete_t += b;
                }
            }
            (claims, claim_t, complete_t)
        }));
    }
    let (mut claims, mut claim_t, mut complete_t) = (0, Duration::ZERO, Duration::ZERO);
    for t in tasks {
        let (c, a, b) = t.await.unwrap();
        claims += c;
        claim_t += a;
        complete_t += b;
    }
    (start.elapsed().as_secs_f64(), claims, claim_t, complete_t)
}

#[allow(clippy::too_many_arguments)]
fn report(
    store: &str,
    n: usize,
    streams: usize,
    workers: usize,
    keys: usize,
    insert_s: f64,
    deliver_s: f64,
    claims: usize,
    claim_t: Duration,
    complete_t: Duration,
) -> serde_json::Value {
    let deliveries = n * keys;
    json!({
        "schema": "positions",
        "store": store,
        "workers": workers,
        "keys": keys,
        "n": n,
        "streams": streams,
        "insert_s": insert_s,
        "deliver_s": deliver_s,
        "insert_eps": n as f64 / insert_s,
        "deliver_eps": deliveries as f64 / deliver_s,
        "pipeline_eps": n as f64 / (insert_s + deliver_s),
        "pipeline_deliveries_per_s": deliveries as f64 / (insert_s + deliver_s),
        "claims": claims,
        "claim_ms_per_claim": claim_t.as_secs_f64() * 1e3 / claims.max(1) as f64,
        "complete_ms_per_claim": complete_t.as_secs_f64() * 1e3 / claims.max(1) as f64,
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
    let admin = flag("--admin")
        .or_else(|| std::env::var("OUTBOXD_TEST_PG").ok())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let n: usize = flag("--n").map_or(10_000, |v| v.parse().unwrap());
    let streams: usize = flag("--streams").map_or(100, |v| v.parse().unwrap());
    let keys: usize = flag("--keys").map_or(1, |v| v.parse().unwrap());
    let sqlite = args.iter().any(|a| a == "--sqlite");
    let workers: Vec<usize> = flag("--workers")
        .unwrap_or_else(|| "1,2,4".into())
        .split(',')
        .map(|w| w.parse().unwrap())
        .collect();
    for w in workers {
        let r = if sqlite {
            sqlite_run(n, streams, w, keys).await
        } else {
            pg_run(&admin, n, streams, w, keys).await
        };
        println!("{r}");
    }
}
