//! The raw-SQL ceiling: outboxd's PostgreSQL work done by plain SQL, with
//! nothing else in the way (no HTTP, no JSON parsing, no plugin, no
//! per-event round trips). What outboxd does end to end is judged against
//! this.
//!
//! On a fresh database migrated with outboxd's own migrations, for each
//! worker count W:
//!
//! 1. **insert**: N events (event k on stream `s{k % S}`, 256 bytes of
//!    JSON data) in batches of 100, one transaction per batch, W batches at
//!    once: lock the batch's `streams` rows in sorted order, assign
//!    sequences, insert the events, their deliveries and any missing heads
//!    with one statement each (`unnest` arrays), advance `streams`;
//! 2. **claim + complete**: W workers loop until every delivery is
//!    delivered. A claim is outboxd's own SQL ([`CLAIM_HEADS_SQL`] with
//!    `FOR UPDATE SKIP LOCKED`, [`CLAIM_RUNS_SQL`] for the runs behind the
//!    heads, batch 100), then the lease update, the heads' due times and the
//!    events' payloads, in one transaction; a completion is a second
//!    transaction that marks the batch delivered (fenced on the lease token)
//!    and moves every touched head to its stream's next live delivery in one
//!    statement (dropping heads left with none).
//!
//! `--keys K` fans every event out to K delivery keys (a delivery per key
//! and event, a head per key and stream; W claim loops per key, at most 8
//! keys' loops at once), the load `position_ceiling --keys` compares with.
//!
//! Prints one JSON object per worker count: insert, claim+complete and
//! pipeline (insert then deliver, N / (t_insert + t_deliver)) events/s.
//!
//! ```sh
//! cargo run --release -p outboxd --example raw_sql_ceiling -- --n 10000 --streams 100 --workers 1,2,4
//! ```
//! `--admin` (or `OUTBOXD_TEST_PG`) names the admin URL (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); each worker count gets its
//! own database, dropped at the end.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd::store::plan::take_runs;
use outboxd::store::postgres::{CLAIM_HEADS_SQL, CLAIM_RUNS_SQL};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

const BATCH: usize = 100;
const LEASE_MS: i64 = 70_000;

/// Move each head of `$2` (streams of sink `$1`) to its stream's next live
/// delivery, or drop it when the stream has none: the set-based form of
/// the head moves of outboxd's `finish_batch` (store/postgres.rs), in one statement. The
/// `LATERAL … LIMIT 1` keeps every probe on `deliveries_live` (a plain
/// `NOT EXISTS` here was planned as an anti-join over the whole table:
/// 40–350 ms per batch instead of ~3 ms).
const ADVANCE_HEADS_SQL: &str = "WITH n AS ( \
       SELECT s.stream, x.id, x.next_attempt_at, x.lease_expires_at FROM unnest($2::text[]) AS s(stream) \
       LEFT JOIN LATERAL (SELECT id, next_attempt_at, lease_expires_at FROM outboxd.deliveries \
                          WHERE sink = $1 AND stream = s.stream AND status = 'pending' \
                          ORDER BY sequence LIMIT 1) AS x ON true), \
     moved AS (UPDATE outboxd.heads h SET delivery_id = n.id, \
                 due_at = GREATEST(n.next_attempt_at, COALESCE(n.lease_expires_at, n.next_attempt_at)) \
               FROM n WHERE n.id IS NOT NULL AND h.sink = $1 AND h.stream = n.stream) \
     DELETE FROM outboxd.heads h USING n WHERE n.id IS NULL AND h.sink = $1 AND h.stream = n.stream";

fn payload(k: usize) -> Vec<u8> {
    let head = format!("{{\"k\":{k},\"pad\":\"\"}}");
    format!("{{\"k\":{k},\"pad\":\"{}\"}}", "x".repeat(256 - head.len())).into_bytes()
}

async fn insert_batch(
    pool: &PgPool,
    ks: &[usize],
    streams: usize,
    keys: &[String],
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let names: BTreeSet<String> = ks.iter().map(|k| format!("s{}", k % streams)).collect();
    let names: Vec<String> = names.into_iter().collect();
    sqlx::query(
        "INSERT INTO outboxd.streams (stream, last_sequence) SELECT s, 0 FROM unnest($1::text[]) AS s \
         ORDER BY s ON CONFLICT (stream) DO NOTHING",
    )
    .bind(&names)
    .execute(&mut *tx)
    .await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT stream, last_sequence FROM outboxd.streams WHERE stream = ANY($1) ORDER BY stream FOR UPDATE",
    )
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    let mut last: std::collections::HashMap<String, i64> = rows.into_iter().collect();
    let (mut ids, mut ev_streams, mut seqs, mut datas) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &k in ks {
        let stream = format!("s{}", k % streams);
        let seq = last.get(&stream).copied().unwrap_or(0) + 1;
        last.insert(stream.clone(), seq);
        ids.push(format!("raw-{k}"));
        ev_streams.push(stream);
        seqs.push(seq);
        datas.push(payload(k));
    }
    sqlx::query(
        "INSERT INTO outboxd.events (id, source, type, datacontenttype, stream, sequence, data, data_format, content_hash) \
         SELECT id, 'https://bench.outboxd.invalid/raw', 'bench.event', 'application/json', stream, seq, data, 'json', \
                md5(data)::text || md5(id) \
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) AS t(id, stream, seq, data)",
    )
    .bind(&ids)
    .bind(&ev_streams)
    .bind(&seqs)
    .bind(&datas)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "WITH d AS (INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence) \
                    SELECT id, k, stream, seq FROM unnest($1::text[], $2::text[], $3::bigint[]) AS t(id, stream, seq) \
                    CROSS JOIN unnest($4::text[]) AS k \
                    RETURNING id, sink, stream, sequence) \
         INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
         SELECT DISTINCT ON (sink, stream) sink, stream, id, now() FROM d ORDER BY sink, stream, sequence \
         ON CONFLICT (sink, stream) DO NOTHING",
    )
    .bind(&ids)
    .bind(&ev_streams)
    .bind(&seqs)
    .bind(keys)
    .execute(&mut *tx)
    .await?;
    let (names, values): (Vec<String>, Vec<i64>) = last.into_iter().unzip();
    sqlx::query(
        "UPDATE outboxd.streams AS s SET last_sequence = v.n \
         FROM unnest($1::text[], $2::bigint[]) AS v(stream, n) WHERE s.stream = v.stream",
    )
    .bind(&names)
    .bind(&values)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// One claim + complete; returns how many deliveries it delivered and the
/// time spent claiming and completing.
async fn claim_and_complete(
    pool: &PgPool,
    sink: &str,
) -> Result<(usize, Duration, Duration), sqlx::Error> {
    let started = Instant::now();
    let mut tx = pool.begin().await?;
    let heads: Vec<(String, i64)> = sqlx::query_as(CLAIM_HEADS_SQL)
        .bind(sink)
        .bind(BATCH as i64)
        .fetch_all(&mut *tx)
        .await?;
    if heads.is_empty() {
        tx.commit().await?;
        return Ok((0, started.elapsed(), Duration::ZERO));
    }
    let streams: Vec<String> = heads.iter().map(|h| h.0.clone()).collect();
    let room = BATCH - heads.len();
    let followers: Vec<(i64, String, bool)> = if room > 0 {
        let head_ids: Vec<i64> = heads.iter().map(|h| h.1).collect();
        sqlx::query_as(CLAIM_RUNS_SQL)
            .bind(sink)
            .bind(head_ids)
            .bind(room as i64)
            .fetch_all(&mut *tx)
            .await?
    } else {
        Vec::new()
    };
    // The runs behind the heads, cut as outboxd cuts them.
    let ids: Vec<i64> = take_runs(&heads, followers, BATCH)
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    let token = format!("{:032x}", rand::random::<u128>());
    let event_ids: Vec<String> = sqlx::query_scalar(
        "UPDATE outboxd.deliveries SET lease_token = $2, lease_expires_at = now() + $3 * interval '1 millisecond', \
           attempts = attempts + 1, first_attempt_at = COALESCE(first_attempt_at, now()) \
         WHERE id = ANY($1) AND status = 'pending' RETURNING event_id",
    )
    .bind(&ids)
    .bind(&token)
    .bind(LEASE_MS)
    .fetch_all(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE outboxd.heads SET due_at = now() + $3 * interval '1 millisecond' WHERE sink = $1 AND stream = ANY($2)",
    )
    .bind(sink)
    .bind(&streams)
    .bind(LEASE_MS)
    .execute(&mut *tx)
    .await?;
    // The payloads a sink would get.
    let events: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT id, data FROM outboxd.events WHERE id = ANY($1)")
            .bind(&event_ids)
            .fetch_all(&mut *tx)
            .await?;
    tx.commit().await?;
    std::hint::black_box(&events);
    let claimed = started.elapsed();

    // (the sink call would be here, outside any transaction)

    let mut tx = pool.begin().await?;
    let done = sqlx::query(
        "UPDATE outboxd.deliveries SET status = 'delivered', finished_at = now(), lease_token = NULL, \
           lease_expires_at = NULL WHERE id = ANY($1) AND lease_token = $2 AND status = 'pending'",
    )
    .bind(&ids)
    .bind(&token)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(ADVANCE_HEADS_SQL)
        .bind(sink)
        .bind(&streams)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((done as usize, claimed, started.elapsed() - claimed))
}

async fn run(
    admin: &str,
    n: usize,
    streams: usize,
    workers: usize,
    keys: usize,
) -> serde_json::Value {
    let keys: Arc<Vec<String>> = Arc::new(match keys {
        1 => vec!["webhook".to_string()],
        k => (0..k).map(|i| format!("k{i}")).collect(),
    });
    let base = admin.rsplit_once('/').unwrap().0.to_string();
    let name = format!(
        "outboxd_bench_raw_{}",
        hex::encode(rand::random::<[u8; 4]>())
    );
    let mut a = sqlx::PgConnection::connect(admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut a)
        .await
        .unwrap();
    let url = format!("{base}/{name}");
    {
        let store = outboxd::store::open(&url).await.unwrap();
        store.migrate().await.unwrap();
    }
    let pool = PgPoolOptions::new()
        .max_connections((workers * keys.len().min(8)) as u32 + 1)
        .connect(&url)
        .await
        .unwrap();

    // 1. insert
    let ks: Arc<Vec<Vec<usize>>> = Arc::new(
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
        let (pool, ks, next, keys) = (pool.clone(), ks.clone(), next.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(batch) = ks.get(i) else { return };
                let mut tries = 0;
                while let Err(e) = insert_batch(&pool, batch, streams, &keys).await {
                    tries += 1;
                    assert!(tries < 5, "insert batch {i}: {e}");
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let insert_s = start.elapsed().as_secs_f64();

    // 2. claim + complete: W loops per key, at most 8 keys at once.
    let start = Instant::now();
    let next_key = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..keys.len().min(8) {
        let (pool, keys, next_key) = (pool.clone(), keys.clone(), next_key.clone());
        tasks.push(tokio::spawn(async move {
            let (mut claims, mut claim_t, mut complete_t) =
                (0usize, Duration::ZERO, Duration::ZERO);
            loop {
                let k = next_key.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(k) else { break };
                let delivered = Arc::new(AtomicUsize::new(0));
                let mut loops = Vec::new();
                for _ in 0..workers {
                    let (pool, key, delivered) = (pool.clone(), key.clone(), delivered.clone());
                    loops.push(tokio::spawn(async move {
                        let (mut c, mut ct, mut ft) = (0usize, Duration::ZERO, Duration::ZERO);
                        while delivered.load(Ordering::Relaxed) < n {
                            let (got, a, b) = claim_and_complete(&pool, &key)
                                .await
                                .expect("claim + complete");
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
    let deliver_s = start.elapsed().as_secs_f64();
    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut a)
        .await
        .unwrap();
    let deliveries = n * keys.len();
    json!({
        "schema": "rows",
        "workers": workers,
        "keys": keys.len(),
        "n": n,
        "streams": streams,
        "insert_s": insert_s,
        "deliver_s": deliver_s,
        "insert_eps": n as f64 / insert_s,
        "deliver_eps": deliveries as f64 / deliver_s,
        "pipeline_eps": n as f64 / (insert_s + deliver_s),
        "pipeline_deliveries_per_s": deliveries as f64 / (insert_s + deliver_s),
        "claims": claims,
        // Summed over the workers.
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
    let workers: Vec<usize> = flag("--workers")
        .unwrap_or_else(|| "1,2,4".into())
        .split(',')
        .map(|w| w.parse().unwrap())
        .collect();
    for w in workers {
        println!("{}", run(&admin, n, streams, w, keys).await);
    }
}
