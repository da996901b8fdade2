//! Claim cost against backlog size, on PostgreSQL.
//!
//! Fills a fresh database with N pending deliveries for one sink (uniform
//! over 1,000 streams, or 90% in one hot stream), then times claim (batch
//! 100) + release, the work a worker does per turn, and prints a table of
//! the median and p95 per backlog and the ratio of 1M to 10k.
//!
//! ```sh
//! cargo run -p outboxd-bench --example claim_bench                 # 10k, 100k, 1M
//! cargo run -p outboxd-bench --example claim_bench -- 10000 50000  # other sizes
//! ```
//! `OUTBOXD_TEST_PG` names the admin URL (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); `CLAIM_BENCH_SAMPLES`
//! the claims timed per backlog (default 200; each is followed by 100
//! single-row releases, so fewer make a quick run).

use std::time::{Duration, Instant};

use outboxd::store::{Finish, Store};
use sqlx::Connection;

fn samples() -> usize {
    std::env::var("CLAIM_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(200)
}

async fn fill(url: &str, n: i64, hot: bool) {
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    // Events and deliveries in bulk, straight in SQL (ingest speed is not
    // what this measures).
    let stream = if hot {
        "CASE WHEN g % 10 = 0 THEN 's' || (g % 1000) ELSE 'hot' END"
    } else {
        "'s' || (g % 1000)"
    };
    sqlx::query(&format!(
        "INSERT INTO outboxd.events (id, source, type, stream, sequence, data, data_format, content_hash) \
         SELECT 'e' || g, 'bench', 't', {stream}, g, '\\x7b7d'::bytea, 'json', '' FROM generate_series(1, $1) g"
    ))
    .bind(n)
    .execute(&mut c)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence) \
         SELECT id, 'bench', stream, sequence FROM outboxd.events",
    )
    .execute(&mut c)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at) \
         SELECT DISTINCT ON (stream) sink, stream, id, now() FROM outboxd.deliveries ORDER BY stream, sequence",
    )
    .execute(&mut c)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE outboxd.deliveries")
        .execute(&mut c)
        .await
        .unwrap();
    sqlx::query("VACUUM ANALYZE outboxd.heads")
        .execute(&mut c)
        .await
        .unwrap();
}

async fn measure(store: &dyn Store) -> (Duration, Duration) {
    let samples = samples();
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let claimed = store
            .claim("bench", 100, Duration::from_secs(60))
            .await
            .unwrap();
        times.push(start.elapsed());
        for c in &claimed {
            store
                .finish(c.delivery_id, &c.lease_token, &Finish::Release)
                .await
                .unwrap();
        }
    }
    times.sort();
    (times[samples / 2], times[samples * 95 / 100])
}

#[tokio::main]
async fn main() {
    let admin = std::env::var("OUTBOXD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let sizes: Vec<i64> = {
        let args: Vec<i64> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if args.is_empty() {
            vec![10_000, 100_000, 1_000_000]
        } else {
            args
        }
    };
    let base = admin.rsplit_once('/').unwrap().0.to_string();
    println!(
        "{:>10} {:>8} {:>12} {:>12}",
        "pending", "shape", "claim p50", "claim p95"
    );
    let mut first: Vec<(bool, Duration)> = Vec::new();
    let mut last: Vec<(bool, Duration)> = Vec::new();
    for &n in &sizes {
        for hot in [false, true] {
            let name = format!("outboxd_bench_{}", hex::encode(rand::random::<[u8; 4]>()));
            let mut a = sqlx::PgConnection::connect(&admin).await.unwrap();
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut a)
                .await
                .unwrap();
            let url = format!("{base}/{name}");
            let store = outboxd::store::open(&url).await.unwrap();
            store.migrate().await.unwrap();
            fill(&url, n, hot).await;
            let (p50, p95) = measure(&*store).await;
            let shape = if hot { "90% hot" } else { "uniform" };
            println!(
                "{n:>10} {shape:>8} {:>10.2}ms {:>10.2}ms",
                p50.as_secs_f64() * 1e3,
                p95.as_secs_f64() * 1e3
            );
            if n == sizes[0] {
                first.push((hot, p50));
            }
            if n == *sizes.last().unwrap() {
                last.push((hot, p50));
            }
            drop(store);
            sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .execute(&mut a)
                .await
                .unwrap();
        }
    }
    for ((hot, f), (_, l)) in first.iter().zip(&last) {
        let shape = if *hot { "90% hot" } else { "uniform" };
        println!(
            "ratio {} / {} ({shape}): {:.2}",
            sizes.last().unwrap(),
            sizes[0],
            l.as_secs_f64() / f.as_secs_f64()
        );
    }
}
