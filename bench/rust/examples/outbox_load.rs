//! The in-transaction outbox load of the benchmark's `debezium` stage
//! (bench/debezium.py): N application transactions, each inserting one
//! `orders` row and one outbox event, over S aggregates (streams), on C
//! connections at once. It is the same load for both sides and sits on
//! neither side's measured path: it only writes and then reads the
//! receiver's counters.
//!
//! ```sh
//! outbox_load --url postgres://postgres@127.0.0.1:PORT/db --mode debezium|outboxd \
//!     --receiver http://127.0.0.1:9390 --n 10000 --streams 100 --connections 4 [--run-id r]
//! ```
//!
//! - `--mode debezium`: the event is a row in `outbox` in Debezium's default
//!   outbox shape (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`)
//!   plus `seq`, the per-aggregate sequence (1, 2, … in commit order);
//! - `--mode outboxd`: the event is `SELECT outboxd.enqueue(...)`, which
//!   assigns the per-stream sequence itself.
//!
//! Aggregate `a{k % S}` is written by connection `(k % S) % C` only, so the
//! events of one aggregate commit in the order of their sequence. The commit
//! time of each event (wall clock, ns, taken right after `COMMIT` returned)
//! is matched against the receiver's first-arrival time (`GET /_arrivals`,
//! same clock: same machine). Prints one JSON object: events/s (first commit
//! → last arrival), commit → arrival p50/p99 (ms), delivered, re-deliveries,
//! order violations. Creates the tables it needs (`--mode debezium`:
//! `orders`, `outbox`; `--mode outboxd`: `orders`; the outboxd schema must
//! already be migrated). Must never read or write anything of outboxd's
//! beyond calling `outboxd.enqueue`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;

#[path = "common/mod.rs"]
mod common;
use common::{get_json, now_ns, percentiles};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let url = flag("--url").expect("--url");
    let mode = flag("--mode").unwrap_or_else(|| "outboxd".into());
    let receiver = flag("--receiver").expect("--receiver");
    let n: usize = flag("--n").map_or(10_000, |s| s.parse().unwrap());
    let streams: usize = flag("--streams").map_or(100, |s| s.parse().unwrap());
    let conns: usize = flag("--connections").map_or(4, |s| s.parse().unwrap());
    let run_id = flag("--run-id").unwrap_or_else(|| "dbz".into());
    let timeout = Duration::from_secs(flag("--timeout").map_or(900, |s| s.parse().unwrap()));
    let debezium = mode == "debezium";

    let pool = PgPoolOptions::new()
        .max_connections(conns as u32 + 1)
        .connect(&url)
        .await
        .expect("connect");
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, aggregate text NOT NULL, amount bigint NOT NULL)")
        .execute(&pool)
        .await
        .expect("orders table");
    if debezium {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS outbox (id text PRIMARY KEY, aggregatetype text NOT NULL, \
             aggregateid text NOT NULL, type text NOT NULL, payload text, seq bigint NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("outbox table");
    }
    // Tell the side under test that the tables exist, then wait for it to
    // say it is reading (the stage creates `.ready` files next to --ready).
    if let Some(ready) = flag("--tables-ready") {
        std::fs::write(&ready, b"").expect("write --tables-ready");
    }
    if let Some(go) = flag("--wait-for") {
        let until = Instant::now() + Duration::from_secs(300);
        while !std::path::Path::new(&go).exists() {
            assert!(Instant::now() < until, "{go} never appeared");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let client = reqwest::Client::new();
    let commits: Arc<Mutex<Vec<(String, i64)>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let t0 = now_ns();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let pool = pool.clone();
        let commits = commits.clone();
        let run_id = run_id.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for k in (0..n).filter(|k| (k % streams) % conns == c) {
                let agg = format!("a{}", k % streams);
                let id = format!("{run_id}-{k}");
                let body = common::data(k);
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query("INSERT INTO orders (id, aggregate, amount) VALUES ($1, $2, $3)")
                    .bind(k as i64)
                    .bind(&agg)
                    .bind((k % 997) as i64)
                    .execute(&mut *tx)
                    .await
                    .expect("insert order");
                if debezium {
                    sqlx::query(
                        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, seq) \
                         VALUES ($1, 'order', $2, 'order.created', $3, $4)",
                    )
                    .bind(&id)
                    .bind(&agg)
                    .bind(body.to_string())
                    .bind((k / streams + 1) as i64)
                    .execute(&mut *tx)
                    .await
                    .expect("insert outbox");
                } else {
                    sqlx::query("SELECT outboxd.enqueue($1, 'bench', 'order.created', $2, $3)")
                        .bind(&id)
                        .bind(&agg)
                        .bind(&body)
                        .execute(&mut *tx)
                        .await
                        .expect("enqueue");
                }
                tx.commit().await.expect("commit");
                mine.push((id, now_ns()));
            }
            commits.lock().unwrap().extend(mine);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let written = now_ns();

    let stats_url = format!("{receiver}/_stats");
    let deadline = Instant::now() + timeout;
    let (mut last_unique, mut last_progress) = (0u64, Instant::now());
    let stats = loop {
        let s = get_json(&client, &stats_url).await;
        let unique = s["unique"].as_u64().unwrap_or(0);
        if unique >= n as u64 {
            break s;
        }
        if unique != last_unique {
            last_unique = unique;
            last_progress = Instant::now();
        }
        if Instant::now() > deadline || last_progress.elapsed() > Duration::from_secs(60) {
            eprintln!("gave up waiting: {unique} of {n} delivered");
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let arrivals = get_json(&client, &format!("{receiver}/_arrivals")).await;
    // Debezium Server's HTTP sink sends a string header as JSON (`"id"`).
    let arrivals: std::collections::HashMap<String, Value> = arrivals
        .as_object()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.trim_matches('"').to_string(), v))
        .collect();
    let commits = commits.lock().unwrap();
    let first_commit = commits.iter().map(|c| c.1).min().unwrap_or(t0);
    let mut lat = Vec::with_capacity(commits.len());
    let mut last_arrival = 0i64;
    for (id, at_commit) in commits.iter() {
        if let Some(at) = arrivals.get(id.as_str()).and_then(Value::as_i64) {
            lat.push(((at - at_commit) as f64 / 1e6).max(0.0));
            last_arrival = last_arrival.max(at);
        }
    }
    let delivered = lat.len();
    let span_s = (last_arrival - first_commit) as f64 / 1e9;
    println!(
        "{}",
        json!({
            "mode": mode,
            "n": n,
            "streams": streams,
            "connections": conns,
            "delivered": delivered,
            "complete": delivered >= n,
            "redeliveries": stats["duplicates"],
            "order_violations": stats["order_violations"],
            "violation_samples": stats["violation_samples"],
            "write_s": (written - t0) as f64 / 1e9,
            "write_eps": n as f64 / ((written - t0) as f64 / 1e9),
            "e2e_s": span_s,
            "eps": if delivered > 0 && span_s > 0.0 { delivered as f64 / span_s } else { 0.0 },
            "commit_to_arrival_ms": percentiles(lat),
        })
    );
}
