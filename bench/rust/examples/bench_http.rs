//! The HTTP side of the benchmark harness (`bench/run.sh`): a fast receiver
//! that every system under test POSTs to, and the load generator that feeds
//! outboxd over its ingest API.
//!
//! ```sh
//! bench_http receive --listen 127.0.0.1:9390
//! bench_http load --targets http://127.0.0.1:8081,http://127.0.0.1:8082 \
//!     --receiver http://127.0.0.1:9390 --n 10000 --streams 100 [--rate 2000] [--latency]
//! bench_http load --api awareness --secret S --batch 1 --sinks 3 --done-db URL ...
//! ```
//!
//! The receiver answers every request 200 with an empty body over keep-alive
//! connections and records, per request, the wall-clock arrival time and the
//! CloudEvents headers `ce-id`, `ce-partitionkey` and `ce-sequence` (the
//! webhook sink sends them; the peers' handlers send the same three). It
//! counts unique ids, re-deliveries, and order violations: a first arrival
//! whose sequence is below one already seen on its stream. Control routes:
//! `GET /_stats`, `POST /_reset`, `GET /_arrivals` (id → arrival, for
//! latency).
//!
//! The load generator builds N CloudEvents (event k on stream `s{k % S}`,
//! 256 bytes of JSON data), posts them as `application/cloudevents-batch+json`
//! batches round-robin over the targets with a few requests in flight
//! (optionally paced at a fixed rate), waits until the receiver has seen
//! every id, and prints one JSON object: ingest and end-to-end rates, and
//! with `--latency` the ingest-acknowledged → arrival percentiles. With
//! `--api awareness` each request is instead one awareness body (`eventId`,
//! `id` = the stream, `schemaId`, `operation`, `w3id`, `streamVersion`
//! absent, the same 256-byte data) posted to `POST /ingest` with
//! `x-ingest-secret: --secret`; it needs `--batch 1`. `--sinks K` is the
//! number of deliveries each event gets, for `--done-db` counting. All times
//! are wall-clock nanoseconds (CLOCK_REALTIME), shared by every process on
//! the machine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use serde_json::{json, Value};

#[path = "common/mod.rs"]
mod common;
use common::{data, get_json, now_ns, percentiles};

// ---------------------------------------------------------------- receiver

#[derive(Default)]
struct Seen {
    requests: u64,
    /// id → first arrival (ns).
    first: HashMap<Box<str>, i64>,
    /// stream → highest sequence seen on a first arrival.
    last_seq: HashMap<Box<str>, u64>,
    duplicates: u64,
    violations: u64,
    /// The first few violations, as `stream: sequence after highest`.
    samples: Vec<String>,
    unlabelled: u64,
    first_ns: i64,
    last_ns: i64,
}

type Shared = Arc<Mutex<Seen>>;

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Records one delivery. The body is read in full, as a real receiver
/// does: an answer sent before the body arrived would make the server
/// close the keep-alive connection under a sender still writing it.
async fn record(
    State(seen): State<Shared>,
    headers: HeaderMap,
    _body: axum::body::Bytes,
) -> StatusCode {
    let at = now_ns();
    let id = header(&headers, "ce-id");
    let stream = header(&headers, "ce-partitionkey");
    let seq: Option<u64> = header(&headers, "ce-sequence").and_then(|s| s.parse().ok());
    let mut s = seen.lock().unwrap();
    s.requests += 1;
    if s.first_ns == 0 {
        s.first_ns = at;
    }
    s.last_ns = at;
    let Some(id) = id else {
        s.unlabelled += 1;
        return StatusCode::OK;
    };
    if s.first.contains_key(id) {
        s.duplicates += 1;
        return StatusCode::OK;
    }
    s.first.insert(id.into(), at);
    if let (Some(stream), Some(seq)) = (stream, seq) {
        match s.last_seq.get_mut(stream) {
            Some(last) if seq < *last => {
                let sample = format!("{stream}: {seq} after {last}");
                s.violations += 1;
                if s.samples.len() < 10 {
                    s.samples.push(sample);
                }
            }
            Some(last) => *last = seq,
            None => {
                s.last_seq.insert(stream.into(), seq);
            }
        }
    }
    StatusCode::OK
}

async fn stats(State(seen): State<Shared>) -> axum::Json<Value> {
    let s = seen.lock().unwrap();
    axum::Json(json!({
        "requests": s.requests,
        "unique": s.first.len(),
        "duplicates": s.duplicates,
        "order_violations": s.violations,
        "violation_samples": s.samples,
        "unlabelled": s.unlabelled,
        "first_ns": s.first_ns,
        "last_ns": s.last_ns,
    }))
}

async fn reset(State(seen): State<Shared>) -> StatusCode {
    *seen.lock().unwrap() = Seen::default();
    StatusCode::NO_CONTENT
}

async fn arrivals(State(seen): State<Shared>) -> axum::Json<Value> {
    let s = seen.lock().unwrap();
    let map: serde_json::Map<String, Value> = s
        .first
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    axum::Json(Value::Object(map))
}

async fn receive(listen: &str) {
    let seen: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/_stats", get(stats))
        .route("/_reset", post(reset))
        .route("/_arrivals", get(arrivals))
        .fallback(record)
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .expect("bind the receiver");
    eprintln!("receiver listening on {}", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}

// ------------------------------------------------------------------- load

struct LoadArgs {
    targets: Vec<String>,
    receiver: String,
    n: usize,
    streams: usize,
    batch: usize,
    concurrency: usize,
    rate: f64,
    latency: bool,
    timeout: Duration,
    run_id: String,
    /// Count completions in this database (`outboxd.deliveries`) instead of
    /// arrivals at the receiver: for sinks that send nothing.
    done_db: Option<String>,
    /// `cloudevents` (`POST /v1/events`) or `awareness` (`POST /ingest`).
    api: Api,
    /// `x-ingest-secret` of `--api awareness`.
    secret: String,
    /// Deliveries per event (sinks routed to), for `--done-db` counting.
    sinks: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    CloudEvents,
    Awareness,
}

async fn load(a: LoadArgs) -> Value {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    assert!(
        a.api == Api::CloudEvents || a.batch == 1,
        "--api awareness posts one event per request: give --batch 1"
    );
    // Bodies first, so building them is not timed.
    let batches: Vec<(Vec<usize>, bytes::Bytes)> = (0..a.n)
        .collect::<Vec<_>>()
        .chunks(a.batch)
        .map(|ks| {
            if a.api == Api::Awareness {
                let k = ks[0];
                let body = json!({
                    "eventId": format!("{}-{k}", a.run_id),
                    "id": format!("s{}", k % a.streams),
                    "schemaId": "bench-schema",
                    "operation": "update",
                    "w3id": "@bench",
                    "data": data(k),
                });
                return (
                    ks.to_vec(),
                    bytes::Bytes::from(serde_json::to_vec(&body).unwrap()),
                );
            }
            let events: Vec<Value> = ks
                .iter()
                .map(|&k| {
                    json!({
                        "specversion": "1.0",
                        "id": format!("{}-{k}", a.run_id),
                        "source": "https://bench.outboxd.invalid/load",
                        "type": "bench.event",
                        "partitionkey": format!("s{}", k % a.streams),
                        "datacontenttype": "application/json",
                        "data": data(k),
                    })
                })
                .collect();
            (
                ks.to_vec(),
                bytes::Bytes::from(serde_json::to_vec(&events).unwrap()),
            )
        })
        .collect();
    let batches = Arc::new(batches);
    client
        .post(format!("{}/_reset", a.receiver))
        .send()
        .await
        .expect("receiver reset");

    let next = Arc::new(AtomicUsize::new(0));
    let acks = Arc::new(Mutex::new(vec![(0i64, 0i64); batches.len()]));
    let errors = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let t0 = now_ns();
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let (client, batches, next, acks, errors, targets) = (
            client.clone(),
            batches.clone(),
            next.clone(),
            acks.clone(),
            errors.clone(),
            a.targets.clone(),
        );
        let (rate, batch, api, secret) = (a.rate, a.batch, a.api, a.secret.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= batches.len() {
                    return;
                }
                if rate > 0.0 {
                    let due = start + Duration::from_secs_f64((i * batch) as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let sent = now_ns();
                let target = &targets[i % targets.len()];
                let mut tries = 0;
                loop {
                    tries += 1;
                    let request = match api {
                        Api::CloudEvents => client
                            .post(format!("{target}/v1/events"))
                            .header("content-type", "application/cloudevents-batch+json"),
                        Api::Awareness => client
                            .post(format!("{target}/ingest"))
                            .header("content-type", "application/json")
                            .header("x-ingest-secret", &secret),
                    };
                    let r = request.body(batches[i].1.clone()).send().await;
                    match r {
                        Ok(r) if r.status().is_success() => break,
                        Ok(r) => {
                            let status = r.status();
                            let body = r.text().await.unwrap_or_default();
                            eprintln!("batch {i}: HTTP {status}: {}", &body[..body.len().min(300)]);
                        }
                        Err(e) => eprintln!("batch {i}: {e}"),
                    }
                    errors.fetch_add(1, Ordering::Relaxed);
                    if tries >= 5 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                acks.lock().unwrap()[i] = (sent, now_ns());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let ingest_done = now_ns();

    // Wait for the receiver to have seen every id (or, with --done-db, for
    // the database to hold every delivery as delivered), the timeout, or
    // progress to stop for a long while.
    let stats_url = format!("{}/_stats", a.receiver);
    let db = match &a.done_db {
        Some(url) => Some(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(url)
                .await
                .expect("done-db"),
        ),
        None => None,
    };
    let deadline = Instant::now() + a.timeout;
    let mut last_unique = 0u64;
    let mut last_progress = Instant::now();
    let (stats, unique, last_ns) = loop {
        let (s, unique, last_ns) = match &db {
            None => {
                let s = get_json(&client, &stats_url).await;
                let (u, l) = (
                    s["unique"].as_u64().unwrap_or(0),
                    s["last_ns"].as_i64().unwrap_or(0),
                );
                (s, u, l)
            }
            Some(db) => {
                let (u, l): (i64, Option<i64>) = sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE status = 'delivered'), \
                       (extract(epoch FROM max(finished_at)) * 1e9)::bigint FROM outboxd.deliveries",
                )
                .fetch_one(db)
                .await
                .expect("count deliveries");
                (
                    get_json(&client, &stats_url).await,
                    u as u64,
                    l.unwrap_or(0),
                )
            }
        };
        let expected = (a.n * if db.is_some() { a.sinks } else { 1 }) as u64;
        if unique >= expected {
            break (s, unique / expected.max(1) * a.n as u64, last_ns);
        }
        if unique != last_unique {
            last_unique = unique;
            last_progress = Instant::now();
        }
        if Instant::now() > deadline || last_progress.elapsed() > Duration::from_secs(60) {
            eprintln!("gave up waiting: {unique} of {expected} delivered");
            break (s, unique * a.n as u64 / expected.max(1), last_ns);
        }
        tokio::time::sleep(Duration::from_millis(if db.is_some() { 100 } else { 20 })).await;
    };
    let secs = |ns: i64| ns as f64 / 1e9;
    let e2e_s = if last_ns > t0 {
        secs(last_ns - t0)
    } else {
        f64::NAN
    };
    let mut out = json!({
        "n": a.n,
        "streams": a.streams,
        "batch": a.batch,
        "concurrency": a.concurrency,
        "targets": a.targets.len(),
        "rate_target": a.rate,
        "api": if a.api == Api::Awareness { "awareness" } else { "cloudevents" },
        "sinks": a.sinks,
        "delivered_unique": unique,
        "complete": unique >= a.n as u64,
        "completion_from": if a.done_db.is_some() { "database" } else { "receiver" },
        "duplicates": stats["duplicates"],
        "order_violations": stats["order_violations"],
        "violation_samples": stats["violation_samples"],
        "ingest_errors": errors.load(Ordering::Relaxed),
        "ingest_s": secs(ingest_done - t0),
        "e2e_s": e2e_s,
        "ingest_eps": a.n as f64 / secs(ingest_done - t0),
        "e2e_eps": if unique > 0 { unique as f64 / e2e_s } else { 0.0 },
    });
    if a.latency {
        let arrivals = get_json(&client, &format!("{}/_arrivals", a.receiver)).await;
        let arrivals = arrivals.as_object().cloned().unwrap_or_default();
        let acks = acks.lock().unwrap();
        let (mut from_ack, mut from_send) = (Vec::new(), Vec::new());
        // (ms ack → delivered, s since the first request at the ack)
        let mut slow: Vec<(f64, f64)> = Vec::new();
        for (i, (ks, _)) in batches.iter().enumerate() {
            let (sent, acked) = acks[i];
            for k in ks {
                if let Some(at) = arrivals
                    .get(&format!("{}-{k}", a.run_id))
                    .and_then(Value::as_i64)
                {
                    let ms = ((at - acked) as f64 / 1e6).max(0.0);
                    from_ack.push(ms);
                    from_send.push((at - sent) as f64 / 1e6);
                    slow.push((ms, secs(acked - t0)));
                }
            }
        }
        // The slowest deliveries and when they were acknowledged: a stall
        // of the whole process shows as many at one moment, a lone late
        // batch as one.
        slow.sort_by(|x, y| y.0.total_cmp(&x.0));
        slow.truncate(20);
        let achieved = a.n as f64 / secs(ingest_done - t0);
        out["latency_ms"] = json!({
            "ack_to_delivered": percentiles(from_ack),
            "send_to_delivered": percentiles(from_send),
            "slowest": slow.iter().map(|(ms, at)| json!({ "ms": ms, "acked_at_s": at })).collect::<Vec<_>>(),
            "achieved_ingest_eps": achieved,
        });
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let has = |name: &str| args.iter().any(|a| a == name);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(flag("--threads").and_then(|t| t.parse().ok()).unwrap_or(2))
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("receive") => rt.block_on(receive(
            &flag("--listen").unwrap_or_else(|| "127.0.0.1:9390".into()),
        )),
        Some("load") => {
            let a = LoadArgs {
                targets: flag("--targets")
                    .expect("--targets")
                    .split(',')
                    .map(str::to_string)
                    .collect(),
                receiver: flag("--receiver").unwrap_or_else(|| "http://127.0.0.1:9390".into()),
                n: flag("--n").map_or(10_000, |v| v.parse().unwrap()),
                streams: flag("--streams").map_or(100, |v| v.parse().unwrap()),
                batch: flag("--batch").map_or(100, |v| v.parse().unwrap()),
                concurrency: flag("--concurrency").map_or(2, |v| v.parse().unwrap()),
                rate: flag("--rate").map_or(0.0, |v| v.parse().unwrap()),
                latency: has("--latency"),
                timeout: Duration::from_secs(flag("--timeout").map_or(600, |v| v.parse().unwrap())),
                run_id: flag("--run-id").unwrap_or_else(|| format!("r{}", now_ns() / 1_000_000)),
                done_db: flag("--done-db"),
                api: match flag("--api").as_deref() {
                    None | Some("cloudevents") => Api::CloudEvents,
                    Some("awareness") => Api::Awareness,
                    Some(other) => panic!("--api {other}: cloudevents or awareness"),
                },
                secret: flag("--secret").unwrap_or_default(),
                sinks: flag("--sinks").map_or(1, |v| v.parse().unwrap()),
            };
            let out = rt.block_on(load(a));
            println!("{out}");
        }
        _ => {
            eprintln!(
                "usage: bench_http receive [--listen ADDR] | load --targets URL[,URL..] [options]"
            );
            std::process::exit(2);
        }
    }
}
