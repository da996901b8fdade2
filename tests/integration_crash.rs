//! The delivery engine at process level, on PostgreSQL, with the real
//! `outboxd` binary run as child processes:
//!
//! - **Crash test**: one daemon is killed with SIGKILL at random moments and
//!   restarted (same port, same database) while 5,000 events over 100
//!   streams are posted and delivered through the webhook sink to a real
//!   receiver. At the end every event reached the receiver, no delivery is
//!   dead, and no stream ever went backwards at the receiver: after a crash
//!   a stream may start again from an event it already sent (a
//!   re-delivery), never skip one or send an older event after a newer one
//!   without a crash in between.
//! - **Replicas**: three daemons on one database deliver 5,000 events over
//!   100 streams, each exactly once and in stream order.
//!
//! Set `OUTBOXD_CRASH_SEED` to replay the kill moments and batch sizes of an
//! earlier run (each run prints its seed). The children's logs are kept in
//! `target/test-logs/`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Streams per test.
const STREAMS: usize = 100;
/// Events per stream.
const PER_STREAM: usize = 50;
/// Events per test.
const EVENTS: usize = STREAMS * PER_STREAM;
/// The webhook manifest's `max-batch`: the longest run of one stream a
/// claim can hold, so the furthest a stream can rewind after a crash.
const MAX_BATCH: u64 = 20;
/// Concurrent producers, each owning every `PRODUCERS`-th stream, so each
/// stream's events are posted in order.
const PRODUCERS: usize = 4;
/// Most events in one posted batch.
const MAX_POST: usize = 40;

/// SIGKILLs in the crash test.
const KILLS: usize = 24;
/// Each life of the crashing daemon lasts a random time in this range,
/// counted from its spawn (its start takes ~0.75 s, so some kills land
/// while it is still starting).
const LIFE_MS: std::ops::RangeInclusive<u64> = 100..=4000;
/// The crash test posts its events over this span, about as long as the
/// kills take, so events are in flight at every kill.
const CRASH_POST_SPAN: Duration = Duration::from_secs(50);
/// The sink's deadline in the crash test. The lease is set to the least
/// the daemon accepts for it, 2 × deadline + 5 s.
const CRASH_DEADLINE: &str = "2s";
const CRASH_LEASE: &str = "9s";
/// The receiver's work per request in the crash test. With it and the
/// sink's `max-concurrency = 4` a batch of 20 takes a while at the
/// receiver, so kills also land while requests are in flight, not only
/// while outcomes are being recorded.
const CRASH_RECEIVER_DELAY: Duration = Duration::from_millis(5);

const CE_BATCH: &str = "application/cloudevents-batch+json";

/// Each test loads the two cores with several daemons and PostgreSQL:
/// run them one after the other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn seed() -> u64 {
    std::env::var("OUTBOXD_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// One event of the plan: the `k`-th (0-based) of its stream, so the
/// daemon must give it sequence `k + 1`.
#[derive(Clone, Debug)]
struct Planned {
    id: String,
    stream: String,
    sequence: u64,
    body: serde_json::Value,
}

/// 5,000 events over 100 streams, split between the producers: producer
/// `p` owns the streams `s` with `s % PRODUCERS == p` and posts them
/// interleaved, each stream in order.
fn plan(prefix: &str) -> Vec<Vec<Planned>> {
    let mut producers = vec![Vec::new(); PRODUCERS];
    for k in 0..PER_STREAM {
        for s in 0..STREAMS {
            let id = format!("{prefix}-s{s:03}-e{k:03}");
            let stream = format!("{prefix}/stream-{s:03}");
            let body = event(
                &id,
                &stream,
                "com.example.crash",
                json!({"stream": s, "k": k, "pad": "x".repeat(64)}),
            );
            producers[s % PRODUCERS].push(Planned {
                id,
                stream,
                sequence: k as u64 + 1,
                body,
            });
        }
    }
    producers
}

/// What one producer went through.
#[derive(Debug, Default)]
struct Produced {
    batches: usize,
    /// Posts that failed (daemon down, connection reset, 5xx) and were
    /// sent again.
    failed_posts: usize,
    /// Events the daemon answered as duplicates: their first post was
    /// committed but its answer lost in a crash.
    duplicates: usize,
}

/// Post `events` in batches of random size, rotating over `targets`, paced
/// to end after about `span`. Every batch is sent again until it gets a
/// 2xx; each answer must give every event its planned sequence.
async fn produce(
    targets: Vec<String>,
    events: Vec<Planned>,
    span: Duration,
    seed: u64,
) -> Produced {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut out = Produced::default();
    let mut next = 0;
    let mut target = rng.random_range(0..targets.len());
    while next < events.len() {
        let size = rng.random_range(1..=MAX_POST).min(events.len() - next);
        let batch = &events[next..next + size];
        let body = serde_json::to_vec(&batch.iter().map(|e| &e.body).collect::<Vec<_>>()).unwrap();
        let first_try = Instant::now();
        let answer = loop {
            let base = &targets[target];
            target = (target + 1) % targets.len();
            let sent = http
                .post(format!("{base}/v1/events"))
                .header("content-type", CE_BATCH)
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => match r.json::<serde_json::Value>().await {
                    Ok(answer) => break answer,
                    // The daemon died while answering: the batch may or
                    // may not be stored; send it again.
                    Err(_) => out.failed_posts += 1,
                },
                Ok(r) if r.status().is_server_error() => out.failed_posts += 1,
                Ok(r) => {
                    let status = r.status();
                    panic!(
                        "POST {} → {status}: {}",
                        batch[0].id,
                        r.text().await.unwrap_or_default()
                    )
                }
                Err(_) => out.failed_posts += 1,
            }
            assert!(
                first_try.elapsed() < Duration::from_secs(120),
                "a batch starting with {} was not accepted within 120 s",
                batch[0].id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let items = answer["events"]
            .as_array()
            .unwrap_or_else(|| panic!("batch answer without events: {answer}"));
        assert_eq!(items.len(), batch.len(), "{answer}");
        // A batch is stored whole or not at all: sent again after a crash,
        // it is all duplicates or all new.
        assert!(
            items
                .iter()
                .all(|i| i["duplicate"] == items[0]["duplicate"]),
            "a batch was stored in part: {answer}"
        );
        for (item, planned) in items.iter().zip(batch) {
            assert_eq!(item["id"], planned.id.as_str(), "{answer}");
            assert_eq!(
                item["sequence"].as_u64(),
                Some(planned.sequence),
                "{} must get sequence {} in stream {}: {item}",
                planned.id,
                planned.sequence,
                planned.stream
            );
            if item["duplicate"] == true {
                out.duplicates += 1;
            }
        }
        out.batches += 1;
        next += size;
        let due = start + span.mul_f64(next as f64 / events.len() as f64);
        tokio::time::sleep_until(due.into()).await;
    }
    out
}

fn start_producers(
    prefix: &str,
    targets: &[String],
    span: Duration,
    seed: u64,
) -> Vec<tokio::task::JoinHandle<Produced>> {
    plan(prefix)
        .into_iter()
        .enumerate()
        .map(|(p, events)| {
            tokio::spawn(produce(
                targets.to_vec(),
                events,
                span,
                seed.wrapping_add(p as u64 + 1),
            ))
        })
        .collect()
}

async fn join_producers(producers: Vec<tokio::task::JoinHandle<Produced>>) -> Produced {
    let mut total = Produced::default();
    for p in producers {
        let p = p.await.expect("producer");
        total.batches += p.batches;
        total.failed_posts += p.failed_posts;
        total.duplicates += p.duplicates;
    }
    total
}

/// One request the receiver saw, read back from its CloudEvents headers.
#[derive(Debug, Clone)]
struct Receipt {
    id: String,
    stream: String,
    sequence: u64,
    at: Instant,
    path: String,
}

/// Every request the receiver saw, in arrival order. Each must carry a
/// valid signature and be a planned event with its planned stream and
/// sequence.
fn receipts(
    receiver: &Receiver,
    secret: &str,
    planned: &HashMap<String, (String, u64)>,
) -> Vec<Receipt> {
    receiver.with_seen(|seen| {
        seen.iter()
            .map(|r| {
                assert!(
                    verify_signature(secret, r),
                    "signature must verify: {:?}",
                    r.headers
                );
                let id = r.header("ce-id").expect("ce-id");
                let stream = r.header("ce-partitionkey").expect("ce-partitionkey");
                let sequence: u64 = r
                    .header("ce-sequence")
                    .expect("ce-sequence")
                    .parse()
                    .unwrap();
                let want = planned
                    .get(&id)
                    .unwrap_or_else(|| panic!("the receiver got an event never posted: {id}"));
                assert_eq!(
                    (&want.0, want.1),
                    (&stream, sequence),
                    "{id} arrived with the wrong stream or sequence"
                );
                Receipt {
                    id,
                    stream,
                    sequence,
                    at: r.at,
                    path: r.path.clone(),
                }
            })
            .collect()
    })
}

/// Wait until the receiver has seen `count` distinct event ids.
async fn wait_received(receiver: &Receiver, count: usize, timeout: Duration) -> bool {
    let mut ids: HashSet<String> = HashSet::new();
    let mut read = 0;
    let start = Instant::now();
    loop {
        receiver.with_seen(|seen| {
            ids.extend(seen[read..].iter().filter_map(|r| r.header("ce-id")));
            read = seen.len();
        });
        if ids.len() >= count {
            return true;
        }
        if start.elapsed() > timeout {
            eprintln!(
                "the receiver saw {} of {count} events after {timeout:?}",
                ids.len()
            );
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the per-stream order check found at the receiver.
#[derive(Debug, Default)]
struct Order {
    receipts: usize,
    distinct: usize,
    /// Receipts of an id already received.
    redeliveries: usize,
    /// Times a stream started again from an event already sent.
    rewinds: usize,
    /// Streams that rewound.
    rewound_streams: usize,
    violations: Vec<String>,
}

impl Order {
    /// The violations, the first 40 in full.
    fn explain(&self) -> String {
        let streams: HashSet<&str> = self
            .violations
            .iter()
            .filter_map(|v| v.split(':').next())
            .collect();
        let shown = &self.violations[..self.violations.len().min(40)];
        format!(
            "{} violations on {} streams; the first:\n{}",
            self.violations.len(),
            streams.len(),
            shown.join("\n")
        )
    }
}

/// A request a daemon sent just before it was killed may be read by the
/// receiver a moment after the kill; a restarted daemon needs longer than
/// this to send anything.
const KILL_GRACE: Duration = Duration::from_millis(300);

/// Walk each stream's receipts in arrival order. A receipt must be the
/// event after the previous one of its stream (the first: sequence 1), or
/// a rewind — an event already received, no more than one claimed batch
/// back — with a kill between the previous receipt and this one. Anything
/// else (an event skipped, an older event after a newer one without a
/// crash in between) is a violation.
fn check_order(receipts: &[Receipt], kills: &[Instant]) -> Order {
    let mut order = Order {
        receipts: receipts.len(),
        ..Order::default()
    };
    // Per stream: (previous receipt's sequence and time, highest sequence seen).
    let mut streams: HashMap<&str, ((u64, Instant), u64)> = HashMap::new();
    let mut rewound: HashSet<&str> = HashSet::new();
    let mut distinct: HashSet<&str> = HashSet::new();
    for r in receipts {
        if !distinct.insert(&r.id) {
            order.redeliveries += 1;
        }
        let Some(((prev, prev_at), max)) = streams.get(r.stream.as_str()).copied() else {
            if r.sequence != 1 {
                order.violations.push(format!(
                    "{}: the first event received is {} (sequence {})",
                    r.stream, r.id, r.sequence
                ));
            }
            streams.insert(&r.stream, ((r.sequence, r.at), r.sequence));
            continue;
        };
        if r.sequence == prev + 1 {
            // The next event: new, or the replay after a rewind going on.
        } else if r.sequence <= prev {
            let crashed = kills.iter().any(|k| *k + KILL_GRACE > prev_at && *k < r.at);
            if !crashed {
                order.violations.push(format!(
                    "{}: {} (sequence {}) arrived after sequence {prev} with no crash in between",
                    r.stream, r.id, r.sequence
                ));
            } else if prev - r.sequence >= MAX_BATCH {
                order.violations.push(format!(
                    "{}: after a crash it went back from sequence {prev} to {}, \
                     further than one claimed batch ({MAX_BATCH})",
                    r.stream, r.sequence
                ));
            }
            order.rewinds += 1;
            rewound.insert(&r.stream);
        } else {
            order.violations.push(format!(
                "{}: {} (sequence {}) arrived after sequence {prev}, skipping {}",
                r.stream,
                r.id,
                r.sequence,
                r.sequence - prev - 1
            ));
        }
        streams.insert(&r.stream, ((r.sequence, r.at), max.max(r.sequence)));
    }
    order.distinct = distinct.len();
    order.rewound_streams = rewound.len();
    order
}

/// Read every event's deliveries back until each is `delivered`. A dead
/// delivery fails the test at once, with its reason.
async fn wait_all_delivered(
    base: &str,
    ids: Vec<String>,
    timeout: Duration,
) -> BTreeMap<u64, usize> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut pending = ids;
    let mut attempts: BTreeMap<u64, usize> = BTreeMap::new();
    loop {
        let states: Vec<(String, serde_json::Value)> = futures::stream::iter(pending.clone())
            .map(|id| {
                let http = http.clone();
                async move {
                    let r = http
                        .get(format!("{base}/v1/events/{id}"))
                        .send()
                        .await
                        .expect("GET /v1/events/{id}");
                    assert_eq!(r.status(), 200, "GET /v1/events/{id}");
                    (id, r.json::<serde_json::Value>().await.unwrap())
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        pending.clear();
        for (id, got) in states {
            let deliveries = got["deliveries"]
                .as_array()
                .unwrap_or_else(|| panic!("{id}: {got}"));
            assert_eq!(
                deliveries.len(),
                1,
                "{id}: one delivery, to the webhook sink: {got}"
            );
            let d = &deliveries[0];
            assert_eq!(d["sink"], "webhook", "{id}: {got}");
            assert_ne!(d["status"], "dead", "{id} was dead-lettered: {d}");
            if d["status"] == "delivered" {
                *attempts
                    .entry(d["attempts"].as_u64().unwrap_or(0))
                    .or_default() += 1;
            } else {
                pending.push(id);
            }
        }
        if pending.is_empty() {
            return attempts;
        }
        if start.elapsed() > timeout {
            let first = &pending[0];
            let r = http
                .get(format!("{base}/v1/events/{first}"))
                .send()
                .await
                .unwrap();
            panic!(
                "{} deliveries not delivered after {timeout:?}; e.g. {first}: {}",
                pending.len(),
                r.text().await.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn planned_index(prefix: &str) -> HashMap<String, (String, u64)> {
    plan(prefix)
        .into_iter()
        .flatten()
        .map(|p| (p.id, (p.stream, p.sequence)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_sigkill_at_random_moments_loses_nothing_and_no_stream_goes_backwards() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let seed = seed();
    println!("crash test: seed {seed} (OUTBOXD_CRASH_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);

    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start().await;
    receiver.set_delay(CRASH_RECEIVER_DELAY);
    let secret = new_secret();
    let plugins = PluginsDir::new();
    plugins.add_webhook_with_limits(
        "webhook",
        &receiver.url(),
        &[receiver.origin()],
        &secret,
        &format!("deadline = {CRASH_DEADLINE:?}\nmax-batch = {MAX_BATCH}\n"),
        "max-concurrency = \"4\"\n",
    );
    let data = tempfile::tempdir().unwrap();
    let config = ChildConfig {
        listen: free_loopback_addr(),
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: data.path().to_path_buf(),
        env: vec![
            ("OUTBOXD_DELIVERY__LEASE".into(), CRASH_LEASE.into()),
            ("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL".into(), "500ms".into()),
        ],
        log: child_log("crash"),
    };
    let base = format!("http://{}", config.listen);

    let producers = start_producers("crash", std::slice::from_ref(&base), CRASH_POST_SPAN, seed);

    // Kill at random moments, restart at once on the same port and database.
    let mut kills: Vec<Instant> = Vec::new();
    let mut killed_while_starting = 0;
    let mut daemon = ChildDaemon::spawn(&config);
    for _ in 0..KILLS {
        let spawned = Instant::now();
        let life = Duration::from_millis(rng.random_range(LIFE_MS));
        let mut healthy = false;
        while spawned.elapsed() < life {
            assert!(
                daemon.is_running(),
                "outboxd exited by itself:\n{}",
                daemon.log_tail(40)
            );
            healthy = healthy || daemon.is_healthy().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !healthy {
            killed_while_starting += 1;
        }
        kills.push(Instant::now());
        daemon.kill();
        daemon = ChildDaemon::spawn(&config);
    }
    let last_kill = *kills.last().unwrap();
    let received_at_last_kill: HashSet<String> =
        receiver.with_seen(|seen| seen.iter().filter_map(|r| r.header("ce-id")).collect());
    daemon.wait_healthy(Duration::from_secs(60)).await;
    println!(
        "crash test: {} kills in {:.1?} ({killed_while_starting} before the daemon answered /health)",
        kills.len(),
        started.elapsed()
    );

    let produced = join_producers(producers).await;
    let posted = started.elapsed();
    let all_received = wait_received(&receiver, EVENTS, Duration::from_secs(120)).await;
    let planned = planned_index("crash");
    let ids: Vec<String> = planned.keys().cloned().collect();
    assert!(
        all_received,
        "not every event reached the receiver:\n{}",
        daemon.log_tail(40)
    );
    let attempts = wait_all_delivered(&base, ids, Duration::from_secs(60)).await;
    let drained = last_kill.elapsed();

    let order = check_order(&receipts(&receiver, &secret, &planned), &kills);
    println!(
        "crash test: {EVENTS} events over {STREAMS} streams, {} crashes, {} posts ({} failed and sent again, {} events \
         answered as duplicates), {} requests at the receiver ({} distinct, {} re-deliveries, {} rewinds on {} \
         streams), \
         attempts per delivery {attempts:?}, all posted after {posted:.1?}, {} delivered at the last kill and all \
         {drained:.1?} after it, elapsed {:.1?}",
        kills.len(),
        produced.batches,
        produced.failed_posts,
        produced.duplicates,
        order.receipts,
        order.distinct,
        order.redeliveries,
        order.rewinds,
        order.rewound_streams,
        received_at_last_kill.len(),
        started.elapsed()
    );
    assert!(
        order.violations.is_empty(),
        "streams went backwards at the receiver: {}",
        order.explain()
    );
    assert_eq!(order.distinct, EVENTS);

    daemon.kill();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_database_deliver_each_event_once_in_stream_order() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let seed = seed();
    println!("replicas: seed {seed}");
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start().await;
    receiver.set_delay(Duration::from_millis(2));
    let secret = new_secret();

    // The same sink on each replica; only the URL's path differs, so the
    // receiver can tell which replica delivered.
    let mut dirs = Vec::new();
    let mut replicas = Vec::new();
    for i in 0..3 {
        let plugins = PluginsDir::new();
        plugins.add_webhook_with_limits(
            "webhook",
            &format!("{}/webhook/replica-{i}", receiver.origin()),
            &[receiver.origin()],
            &secret,
            &format!("deadline = \"10s\"\nmax-batch = {MAX_BATCH}\n"),
            "",
        );
        let data = tempfile::tempdir().unwrap();
        let config = ChildConfig {
            listen: free_loopback_addr(),
            database_url: db.url.clone(),
            plugins_dir: plugins.path().to_path_buf(),
            data_dir: data.path().to_path_buf(),
            env: vec![("OUTBOXD_DELIVERY__MAX_POLL_INTERVAL".into(), "500ms".into())],
            log: child_log(&format!("replica-{i}")),
        };
        replicas.push(ChildDaemon::spawn(&config));
        dirs.push((plugins, data));
    }
    for r in &mut replicas {
        r.wait_healthy(Duration::from_secs(60)).await;
    }
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();

    let produced = join_producers(start_producers(
        "replicas",
        &bases,
        Duration::from_secs(10),
        seed,
    ))
    .await;
    let posted = started.elapsed();
    assert_eq!(
        produced.failed_posts, 0,
        "no replica was down: every post must succeed at once"
    );
    assert_eq!(produced.duplicates, 0);
    let all_received = wait_received(&receiver, EVENTS, Duration::from_secs(120)).await;
    assert!(
        all_received,
        "not every event reached the receiver:\n{}",
        replicas[0].log_tail(40)
    );
    let planned = planned_index("replicas");
    let attempts = wait_all_delivered(
        &bases[0],
        planned.keys().cloned().collect(),
        Duration::from_secs(60),
    )
    .await;
    let delivered = started.elapsed();
    // Anything delivered twice would arrive about now.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let receipts = receipts(&receiver, &secret, &planned);
    let order = check_order(&receipts, &[]);
    let mut by_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &receipts {
        *by_replica.entry(r.path.as_str()).or_default() += 1;
    }
    println!(
        "replicas: {EVENTS} events over {STREAMS} streams posted round-robin to 3 replicas in {} batches, {} requests \
         at the receiver ({} distinct), by replica {by_replica:?}, attempts per delivery {attempts:?}, all posted \
         after {posted:.1?}, all delivered after {delivered:.1?}, elapsed {:.1?}",
        produced.batches,
        order.receipts,
        order.distinct,
        started.elapsed()
    );
    assert!(
        order.violations.is_empty(),
        "stream order broken at the receiver: {}",
        order.explain()
    );
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &receipts {
        *seen.entry(r.id.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let example = &twice[..twice.len().min(5)];
    assert!(
        twice.is_empty(),
        "{} events delivered more than once, e.g. {example:?}",
        twice.len()
    );
    assert_eq!(order.distinct, EVENTS);
    assert_eq!(order.receipts, EVENTS);
    assert_eq!(
        attempts.keys().copied().collect::<Vec<_>>(),
        vec![1],
        "every delivery took one attempt"
    );
    for i in 0..3 {
        let path = format!("/webhook/replica-{i}");
        let n = by_replica.get(path.as_str()).copied().unwrap_or(0);
        assert!(n > 0, "replica {i} delivered nothing: {by_replica:?}");
    }

    for r in &mut replicas {
        r.kill();
    }
    db.cleanup().await;
}
