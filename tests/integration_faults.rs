//! Faults beyond a killed outboxd: the database itself restarting under
//! load; a stream's head locked for a minute by a session left idle in
//! transaction; the disk under the embedded SQLite default filling up. The
//! daemon keeps running throughout; nothing it acknowledged is lost,
//! nothing it refused is stored, order per stream holds, the probes show
//! what is wrong, and delivery resumes by itself.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::private_pg::PrivatePostgres;
use common::{event, Harness, Receiver};
use serde_json::json;

const EVENTS: usize = 5_000;
const STREAMS: usize = 100;
const BATCH: usize = 50;
const RESTARTS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_three_times_under_load_loses_nothing_and_keeps_order() {
    common::init_logs();
    let pg = PrivatePostgres::init();
    let url = pg.url();
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(move |c| {
            c.database_url = Some(url);
            c.delivery.db_timeout = Duration::from_secs(3);
            // Leases far longer than the test: a batch whose finish was lost to
            // a restart must be finished by its own worker's retry, not wait for
            // lease expiry and go out again.
            c.delivery.lease = Duration::from_secs(600);
        })
        .start()
        .await
        .single();
    let (base, http) = (d.base.clone(), d.http.clone());
    // The producer: batches of 50, each retried until accepted (a 503 or a
    // refused connection while the database is away), ids unchanged, as a
    // producer must for at-least-once.
    let producer = tokio::spawn(async move {
        let mut refused = 0usize;
        for start in (0..EVENTS).step_by(BATCH) {
            let batch: Vec<_> = (start..start + BATCH)
                .map(|n| {
                    event(
                        &format!("e{n}"),
                        &format!("s{}", n % STREAMS),
                        "t",
                        json!({ "n": n }),
                    )
                })
                .collect();
            loop {
                let r = http
                    .post(format!("{base}/v1/events"))
                    .header("content-type", "application/cloudevents-batch+json")
                    .json(&batch)
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().as_u16() == 201 => break,
                    Ok(r) => assert_eq!(r.status().as_u16(), 503, "only the outage may refuse"),
                    Err(_) => {}
                }
                refused += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // About 2.5 events per ms: the run lasts seconds, long enough
            // for the restarts to land inside it.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        refused
    });
    let unique = |r: &Receiver| {
        r.with_seen(|seen| {
            seen.iter()
                .filter_map(|x| x.header("ce-id"))
                .collect::<HashSet<_>>()
                .len()
        })
    };
    let started = Instant::now();
    let mut restarts = 0;
    let mut mid_run = 0;
    while restarts < RESTARTS {
        tokio::time::sleep(Duration::from_millis(400)).await;
        mid_run += (unique(&receiver) < EVENTS) as usize;
        pg.restart();
        restarts += 1;
    }
    let refused = producer.await.unwrap();
    let done = common::eventually(Duration::from_secs(180), || unique(&receiver) >= EVENTS).await;
    assert!(
        done,
        "{} of {EVENTS} delivered after {restarts} restarts",
        unique(&receiver)
    );
    assert!(
        mid_run >= 2,
        "the restarts did not land mid-run ({mid_run})"
    );
    // Per stream, first deliveries in sequence order, none missing.
    let last = first_deliveries_in_order(&receiver);
    assert_eq!(last.len(), STREAMS);
    assert!(last.values().all(|s| *s == (EVENTS / STREAMS) as u64));
    // Stored once each: a retried batch is a duplicate, not a copy.
    let (_, ready) = d.get("/ready").await;
    assert_eq!(ready["ready"], true, "{ready}");
    let redelivered = receiver.count() - EVENTS;
    eprintln!(
        "faults: {EVENTS} events, {restarts} PostgreSQL restarts, {refused} refused requests retried, \
         {redelivered} re-deliveries, {:.1}s",
        started.elapsed().as_secs_f64()
    );
    d.stop().await;
}

/// Per stream, the sequence of its last first delivery, asserting that the
/// first deliveries of each stream came in sequence order, none skipped.
fn first_deliveries_in_order(receiver: &Receiver) -> BTreeMap<String, u64> {
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut firsts = HashSet::new();
    receiver.with_seen(|seen| {
        for x in seen {
            let id = x.header("ce-id").unwrap();
            if !firsts.insert(id.clone()) {
                continue;
            }
            let stream = x.header("ce-partitionkey").unwrap();
            let seq: u64 = x.header("ce-sequence").unwrap().parse().unwrap();
            let prev = last.insert(stream.clone(), seq).unwrap_or(0);
            assert_eq!(
                seq,
                prev + 1,
                "{id} of {stream} delivered first after sequence {prev}"
            );
        }
    });
    last
}

/// POST `events` as one batch to the daemon at `base`: the status and the
/// JSON body of the answer.
async fn post_batch(
    http: reqwest::Client,
    base: String,
    events: Vec<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let r = http
        .post(format!("{base}/v1/events"))
        .header("content-type", "application/cloudevents-batch+json")
        .json(&events)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// The ids the receiver has seen (`ce-id`), re-deliveries counted once.
fn seen_ids(receiver: &Receiver) -> HashSet<String> {
    receiver.with_seen(|seen| seen.iter().filter_map(|x| x.header("ce-id")).collect())
}

/// How long the foreign session keeps the held stream's rows locked, idle
/// in transaction: a minute, as an application that forgot to commit
/// would (longer than `delivery.db-timeout` and the store's statement
/// timeout, shorter than the lease).
const HOLD: Duration = Duration::from_secs(60);
/// The streams that keep flowing while one is held.
const FLOWING: usize = 20;
/// Each event of a flowing stream is delivered within this of its 201
/// all through the hold (a few turns, each bounded by `db-timeout`).
const FLOWING_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_head_locked_idle_in_transaction_does_not_wedge_the_loop() {
    use sqlx::Connection;
    common::init_logs();
    let db = common::TestDb::new(common::Backend::Postgres).await;
    let url = db.url.clone();
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(move |c| {
            c.database_url = Some(url);
            c.delivery.db_timeout = Duration::from_secs(3);
        })
        .start()
        .await
        .single();
    let (base, http) = (d.base.clone(), d.http.clone());
    let post = {
        let (base, http) = (base.clone(), http.clone());
        move |events: Vec<serde_json::Value>| post_batch(http.clone(), base.clone(), events)
    };
    // The held stream's head: stored while the sink is paused, so it is
    // still pending when the foreign session locks it.
    let paused = http
        .post(format!("{base}/v1/admin/sinks/webhook/pause"))
        .send()
        .await
        .unwrap();
    assert!(paused.status().is_success(), "{paused:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (s, body) = post(vec![event("h1", "held", "t", json!({ "n": 1 }))]).await;
    assert_eq!(s, 201, "{body}");
    // The foreign session: the rows a claim of the stream's head and an
    // ingest into the stream take (its head delivery, its stream row),
    // locked and left idle in transaction.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    let locked: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM outboxd.deliveries WHERE stream = 'held' AND status = 'pending' FOR UPDATE",
    )
    .fetch_all(&mut holder)
    .await
    .unwrap();
    assert_eq!(locked.len(), 1);
    sqlx::query("SELECT 1 FROM outboxd.streams WHERE stream = 'held' FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let resumed = http
        .post(format!("{base}/v1/admin/sinks/webhook/resume"))
        .send()
        .await
        .unwrap();
    assert!(resumed.status().is_success(), "{resumed:?}");
    let hold_started = Instant::now();

    // Events over the other streams all through the hold: a batch of one
    // per stream every 200 ms, each answered 201.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, Instant)>::new()));
    let producer = {
        let post = post.clone();
        let accepted = accepted.clone();
        tokio::spawn(async move {
            let mut n = 0usize;
            while !*stop_rx.borrow() {
                let batch: Vec<_> = (0..FLOWING)
                    .map(|s| event(&format!("o{}", n + s), &format!("s{s}"), "t", json!({})))
                    .collect();
                let (status, body) = post(batch).await;
                assert_eq!(status, 201, "ingest into a flowing stream: {body}");
                let at = Instant::now();
                accepted
                    .lock()
                    .unwrap()
                    .extend((n..n + FLOWING).map(|i| (format!("o{i}"), at)));
                n += FLOWING;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // Ingest into the held stream waits on its stream row: it must answer
    // 503 within the store's statement timeout, not hang.
    let asked = Instant::now();
    let (status, body) = post(vec![event("h-refused", "held", "t", json!({}))]).await;
    let took = asked.elapsed();
    assert_eq!(status, 503, "ingest into the held stream: {body}");
    assert!(
        took < Duration::from_secs(15),
        "ingest into the held stream answered after {took:?}"
    );
    eprintln!("held ingest: 503 after {took:?}: {body}");

    // Through the hold: the other streams keep being delivered (each
    // event within 10 s of its acknowledgement), and the probes do not
    // show a healthy loop.
    let mut not_ready_seen = false;
    let mut failing_metric_seen = false;
    let mut checks = 0;
    while hold_started.elapsed() < HOLD {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (code, ready) = d.get("/ready").await;
        let database = &ready["checks"]["database"];
        eprintln!(
            "hold {:.0?}: /ready {code} database {database}",
            hold_started.elapsed()
        );
        if code == 503
            && database["ok"] == false
            && database["error"]
                .as_str()
                .is_some_and(|e| e.contains("\"held\"") && e.contains("locked"))
        {
            not_ready_seen = true;
        }
        // The stuck head's age, which a healthy loop keeps near zero.
        let metrics = d.metrics_text().await;
        let oldest_due = metrics
            .lines()
            .find_map(|l| l.strip_prefix("outboxd_oldest_due_age_seconds{sink=\"webhook\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        failing_metric_seen |= oldest_due > 15.0;
        let seen = seen_ids(&receiver);
        let late: Vec<String> = accepted
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, at)| at.elapsed() > FLOWING_WITHIN && !seen.contains(id))
            .map(|(id, _)| id.clone())
            .collect();
        assert!(
            late.is_empty(),
            "{} events of flowing streams not delivered {FLOWING_WITHIN:?} after their 201, \
             {:.0?} into the hold: {:?}",
            late.len(),
            hold_started.elapsed(),
            &late[..late.len().min(5)]
        );
        checks += 1;
    }
    assert!(checks >= 10);
    assert!(
        not_ready_seen,
        "/ready stayed green while a stream's head was locked"
    );
    assert!(
        failing_metric_seen,
        "outboxd_oldest_due_age_seconds never showed the held stream's head waiting"
    );
    drop(holder); // the session ends: its transaction rolls back
    let released = Instant::now();
    // The held stream resumes: its head first, then what follows.
    for n in 2..=3 {
        let (s, body) = post(vec![event(
            &format!("h{n}"),
            "held",
            "t",
            json!({ "n": n }),
        )])
        .await;
        assert_eq!(s, 201, "{body}");
    }
    stop_tx.send(true).unwrap();
    producer.await.unwrap();
    let accepted = accepted.lock().unwrap().clone();
    let expected = accepted.len() + 3;
    let done = common::eventually(Duration::from_secs(60), || {
        seen_ids(&receiver).len() >= expected
    })
    .await;
    let seen = seen_ids(&receiver);
    let missing: Vec<_> = accepted
        .iter()
        .map(|(id, _)| id.as_str())
        .chain(["h1", "h2", "h3"])
        .filter(|id| !seen.contains(*id))
        .collect();
    assert!(done && missing.is_empty(), "not delivered: {missing:?}");
    assert!(
        !seen.contains("h-refused"),
        "an event answered 503 was delivered"
    );
    // Per stream, first deliveries in sequence order.
    let last = first_deliveries_in_order(&receiver);
    assert_eq!(last.get("held"), Some(&3));
    eprintln!(
        "lock hold: {} events over {FLOWING} streams during a {HOLD:?} hold; held stream done {:.1?} after release; {} re-deliveries",
        accepted.len(),
        released.elapsed(),
        receiver.count() - expected
    );
    d.stop().await;
    db.cleanup().await;
}

/// Size of the tmpfs the disk-full test keeps its data folder on.
const TMPFS_SIZE: &str = "size=48m";
/// Free space left beside the database once the filler is written: a few
/// hundred events of [`PAD`] bytes.
const HEADROOM: u64 = 2 << 20;
/// Bytes of data per event in the disk-full test.
const PAD: usize = 4000;

/// A tmpfs mounted for the test; lazily unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mount one on `dir`; the reason as `Err` when this machine does not
    /// allow it (not root, no mount permission in a container).
    fn mount(dir: &std::path::Path) -> Result<Tmpfs, String> {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", TMPFS_SIZE, "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// Bytes free on it.
    fn available(&self) -> u64 {
        let out = std::process::Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.0)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df prints the space available")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_full_under_sqlite_answers_503_storage_full_and_resumes_once_space_is_freed() {
    common::init_logs();
    let dir = tempfile::Builder::new()
        .prefix("outboxd-full-")
        .tempdir()
        .unwrap();
    let tmpfs = match Tmpfs::mount(dir.path()) {
        Ok(t) => t,
        Err(reason) => {
            eprintln!("SKIPPED disk-full test: {reason}");
            return;
        }
    };
    let data = dir.path().join("data");
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(move |c| c.data_dir = data)
        .start()
        .await
        .single();
    let pad: String = (0..PAD / 16)
        .map(|_| hex::encode(rand::random::<[u8; 8]>()))
        .collect();
    let batch = |from: usize| -> Vec<serde_json::Value> {
        (from..from + 10)
            .map(|n| {
                event(
                    &format!("e{n}"),
                    &format!("s{}", n % 7),
                    "t",
                    json!({ "n": n, "pad": pad }),
                )
            })
            .collect()
    };
    let (base, http) = (d.base.clone(), d.http.clone());
    let post = |events: Vec<serde_json::Value>| post_batch(http.clone(), base.clone(), events);
    let ids = |events: &[serde_json::Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    let mut acked: Vec<String> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    // Warm: the database, its WAL and the plugin cache take their space.
    let mut n = 0;
    for _ in 0..5 {
        let events = batch(n);
        n += 10;
        let (s, body) = post(events.clone()).await;
        assert_eq!(s, 201, "{body}");
        acked.extend(ids(&events));
    }
    // The filler: all but HEADROOM of what is left.
    let filler = dir.path().join("filler");
    {
        use std::io::Write;
        let mut left = tmpfs.available().saturating_sub(HEADROOM);
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 20];
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..k]).unwrap();
            left -= k as u64;
        }
        f.sync_all().unwrap();
    }
    // Post until the disk is full, then on for a while: every answer is a
    // 201 or a 503 that names the cause.
    let mut full_answers = 0;
    let mut full_body = serde_json::Value::Null;
    for _ in 0..2000 {
        let events = batch(n);
        n += 10;
        let (s, body) = post(events.clone()).await;
        match s {
            201 => acked.extend(ids(&events)),
            503 => {
                assert_eq!(body["cause"], "storage-full", "{body}");
                assert!(
                    body["error"].as_str().unwrap().starts_with("storage full"),
                    "{body}"
                );
                refused.extend(ids(&events));
                full_body = body;
                full_answers += 1;
                if full_answers >= 20 {
                    break;
                }
            }
            _ => panic!("answer {s} while the disk fills: {body}"),
        }
    }
    assert!(
        full_answers >= 20,
        "the disk never filled: {} events acknowledged",
        acked.len()
    );
    eprintln!(
        "disk full after {} events acknowledged; {} refused: {full_body}",
        acked.len(),
        refused.len()
    );
    // Nothing half-stored: each refused event is unknown to the store.
    for id in refused.iter().step_by(10) {
        let (s, body) = d.get(&format!("/v1/events/{id}")).await;
        assert_eq!(s, 404, "{id} was answered 503 but is stored: {body}");
    }
    // Space comes back: ingest resumes without a restart.
    std::fs::remove_file(&filler).unwrap();
    let resumed_at = Instant::now();
    let mut after = 0;
    while after < 5 {
        let events = batch(n);
        n += 10;
        let (s, body) = post(events.clone()).await;
        match s {
            201 => {
                acked.extend(ids(&events));
                after += 1;
            }
            503 if resumed_at.elapsed() < Duration::from_secs(10) => {
                refused.extend(ids(&events));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => panic!("answer {s} after space was freed: {body}"),
        }
    }
    // Delivery resumes too: every acknowledged event arrives, none refused.
    let all = common::eventually(Duration::from_secs(60), || {
        let seen = seen_ids(&receiver);
        acked.iter().all(|id| seen.contains(id))
    })
    .await;
    let seen = seen_ids(&receiver);
    let missing = acked.iter().filter(|id| !seen.contains(*id)).count();
    if let Some(id) = acked.iter().find(|id| !seen.contains(*id)) {
        eprintln!(
            "first missing: {:?}",
            d.get(&format!("/v1/events/{id}")).await
        );
        eprintln!("ready: {:?}", d.get("/ready").await);
    }
    assert!(
        all,
        "{missing} of {} acknowledged events not delivered",
        acked.len()
    );
    let leaked: Vec<_> = refused.iter().filter(|id| seen.contains(*id)).collect();
    assert!(leaked.is_empty(), "answered 503 yet delivered: {leaked:?}");
    eprintln!(
        "disk full: {} acknowledged and delivered, {} refused with storage-full and never delivered",
        acked.len(),
        refused.len()
    );
    d.stop().await;
    drop(tmpfs);
}
