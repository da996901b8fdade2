//! Faults beyond a killed outboxd: the database itself restarting under
//! load. The daemon keeps running throughout; nothing it acknowledged is
//! lost, order per stream holds, and delivery resumes by itself.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::private_pg::PrivatePostgres;
use common::{event, new_secret, PluginsDir, Receiver, TestDaemon};
use serde_json::json;

const EVENTS: usize = 5_000;
const STREAMS: usize = 100;
const BATCH: usize = 50;
const RESTARTS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_three_times_under_load_loses_nothing_and_keeps_order() {
    common::init_logs();
    let pg = PrivatePostgres::init();
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook(
        "webhook",
        &receiver.url(),
        &[receiver.origin()],
        &new_secret(),
        "",
    );
    let url = pg.url();
    let d = TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        c.delivery.db_timeout = Duration::from_secs(3);
        // Leases far longer than the test: a batch whose finish was lost to
        // a restart must be finished by its own worker's retry, not wait for
        // lease expiry and go out again.
        c.delivery.lease = Duration::from_secs(600);
    })
    .await;
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
