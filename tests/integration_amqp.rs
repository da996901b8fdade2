//! The `amqp` sink end to end: HTTP ingest → SQLite → the WebAssembly `amqp`
//! plugin → the host's AMQP connection → RabbitMQ on 127.0.0.1:5672 → a real
//! consumer on a bound queue.
//!
//! Each test declares its own exchange and queue (random names) and deletes
//! them at the end. The broker-restart test stops the whole broker, so it
//! takes [`BROKER`] for writing while the others hold it for reading.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::harness::HarnessBuilder;
use common::*;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use serde_json::json;

/// The test broker (`OUTBOXD_TEST_AMQP`, default the local RabbitMQ).
fn amqp_url() -> String {
    std::env::var("OUTBOXD_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Held for reading by every test, for writing by the one that restarts the
/// broker.
static BROKER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn unique(prefix: &str) -> String {
    format!(
        "outboxd-test-{prefix}-{}",
        hex::encode(rand::random::<[u8; 4]>())
    )
}

/// One message as the consumer saw it.
#[derive(Debug, Clone)]
struct Got {
    message_id: Option<String>,
    routing_key: String,
    content_type: Option<String>,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// A topic exchange and a durable queue bound to it with `binding`, and a
/// consumer that records every message (reconnecting when the broker goes
/// away, so it survives a restart).
struct Consumer {
    exchange: String,
    queue: String,
    seen: Arc<Mutex<Vec<Got>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Consumer {
    async fn start(binding: &str) -> Consumer {
        let exchange = unique("x");
        let queue = unique("q");
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on 127.0.0.1:5672 (scripts/setup.sh starts it)");
        let ch = conn.create_channel().await.unwrap();
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(queue.as_str().into(), q, FieldTable::default())
            .await
            .unwrap();
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            binding.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let _ = conn.close(200, "declared".into()).await;

        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(consume(queue.clone(), seen.clone()));
        Consumer {
            exchange,
            queue,
            seen,
            task,
        }
    }

    fn seen(&self) -> Vec<Got> {
        self.seen.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Got> {
        let seen = self.seen.clone();
        let ok = eventually(timeout, || seen.lock().unwrap().len() >= n).await;
        let got = self.seen();
        assert!(
            ok,
            "only {} of {n} messages arrived within {timeout:?}",
            got.len()
        );
        got
    }

    async fn delete(self) {
        self.task.abort();
        if let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
            if let Ok(ch) = conn.create_channel().await {
                let _ = ch
                    .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
                let _ = ch
                    .exchange_delete(
                        self.exchange.as_str().into(),
                        ExchangeDeleteOptions::default(),
                    )
                    .await;
            }
            let _ = conn.close(200, "done".into()).await;
        }
    }
}

/// Consume `queue` into `seen` until aborted; reconnect after any failure.
async fn consume(queue: String, seen: Arc<Mutex<Vec<Got>>>) {
    loop {
        let session = async {
            let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            let mut consumer = ch
                .basic_consume(
                    queue.as_str().into(),
                    "outboxd-test".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            while let Some(delivery) = consumer.next().await {
                let delivery = delivery?;
                let p = &delivery.properties;
                let headers = p
                    .headers()
                    .as_ref()
                    .map(|h| {
                        h.inner()
                            .iter()
                            .map(|(k, v)| {
                                let v = match v {
                                    AMQPValue::LongString(s) => {
                                        String::from_utf8_lossy(s.as_bytes()).into_owned()
                                    }
                                    other => format!("{other:?}"),
                                };
                                (k.to_string(), v)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                seen.lock().unwrap().push(Got {
                    message_id: p.message_id().as_ref().map(|s| s.to_string()),
                    routing_key: delivery.routing_key.to_string(),
                    content_type: p.content_type().as_ref().map(|s| s.to_string()),
                    headers,
                    body: delivery.data.clone(),
                });
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Ok::<_, lapin::Error>(())
        };
        let _ = session.await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `h` with an `amqp` sink named `name`.
fn amqp_sink(h: HarnessBuilder, name: &str, allowed: &[&str], config: &str) -> HarnessBuilder {
    let exchanges: Vec<String> = allowed.iter().map(|e| format!("{e:?}")).collect();
    let extra = format!(
        "[limits]\ndeadline = \"10s\"\nmax-batch = 100\n\
         [capabilities]\namqp = {{ url = {:?}, exchanges = [{}] }}\n\
         [retry]\nbase = \"100ms\"\ncap = \"1s\"\n\
         [config]\n{config}",
        amqp_url(),
        exchanges.join(", ")
    );
    h.component(name, &built_plugins().join("amqp.wasm"), &extra)
}

/// Post `events` in batches of 100.
async fn post_all(d: &TestDaemon, events: &[serde_json::Value]) {
    for chunk in events.chunks(100) {
        d.post_batch(chunk).await;
    }
}

/// `n` events over `streams` streams, round-robin; ids `<stream>-<k>`.
fn events(prefix: &str, n: usize, streams: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| {
            let stream = format!("{prefix}-doc-{}", i % streams);
            let k = i / streams;
            let mut ev = event(
                &format!("{stream}-{k}"),
                &stream,
                "person",
                json!({"k": k, "stream": stream}),
            );
            ev["operation"] = json!(if k == 0 { "new" } else { "update" });
            ev
        })
        .collect()
}

/// Check per-stream order of the messages of `got` (first arrivals), by
/// `cloudEvents_sequence`, and that every id of `sent` arrived.
fn assert_all_arrived_in_stream_order(got: &[Got], sent: &[serde_json::Value]) {
    let mut first: BTreeSet<String> = BTreeSet::new();
    let mut last_seq: BTreeMap<String, u64> = BTreeMap::new();
    for g in got {
        let id = g.message_id.clone().expect("message-id set");
        assert_eq!(
            g.headers.get("cloudEvents_id"),
            Some(&id),
            "message-id = cloudEvents_id"
        );
        if !first.insert(id.clone()) {
            continue; // a redelivery (at least once)
        }
        let stream = g.headers["cloudEvents_partitionkey"].clone();
        let seq: u64 = g.headers["cloudEvents_sequence"].parse().unwrap();
        let prev = last_seq.insert(stream.clone(), seq).unwrap_or(0);
        assert!(
            seq > prev,
            "stream {stream}: sequence {seq} arrived after {prev}"
        );
    }
    let expected: BTreeSet<String> = sent
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let missing: Vec<&String> = expected.difference(&first).collect();
    assert!(
        missing.is_empty(),
        "{} events never arrived, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(first, expected, "message ids are exactly the event ids");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_events_over_fifty_streams_all_arrive_in_stream_order_with_event_ids() {
    let _shared = BROKER.read().await;
    init_logs();
    let consumer = Consumer::start("documents.#").await;
    let (d, _plugins) = amqp_sink(
        Harness::new(),
        "rabbit",
        &[&consumer.exchange],
        &format!(
            "exchange = {:?}\nrouting-key = \"documents.{{operation}}.{{type}}\"\n",
            consumer.exchange
        ),
    )
    .start()
    .await
    .into_daemon();

    let sent = events("bulk", 1000, 50);
    post_all(&d, &sent).await;
    let got = consumer.wait_for(1000, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got_after = consumer.seen();
    assert_eq!(
        got_after.len(),
        1000,
        "each event exactly once on a healthy broker"
    );
    assert_all_arrived_in_stream_order(&got, &sent);

    // The binding: content type, attributes as `cloudEvents_` headers,
    // routing key from the template, body byte for byte.
    let g = got
        .iter()
        .find(|g| g.message_id.as_deref() == Some("bulk-doc-7-3"))
        .unwrap();
    assert_eq!(g.routing_key, "documents.update.person");
    assert_eq!(g.content_type.as_deref(), Some("application/json"));
    assert_eq!(g.headers["cloudEvents_specversion"], "1.0");
    assert_eq!(g.headers["cloudEvents_type"], "person");
    assert_eq!(g.headers["cloudEvents_source"], "https://example.com/tests");
    assert_eq!(g.headers["cloudEvents_operation"], "update");
    assert!(g.headers.contains_key("cloudEvents_time"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&g.body).unwrap(),
        json!({"k": 3, "stream": "bulk-doc-7"})
    );
    let first = got
        .iter()
        .find(|g| g.message_id.as_deref() == Some("bulk-doc-7-0"))
        .unwrap();
    assert_eq!(first.routing_key, "documents.new.person");

    let delivered = d.deliveries("bulk-doc-49-19").await;
    assert_eq!(delivered[0]["status"], "delivered", "{delivered:?}");
    d.stop().await;
    consumer.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unroutable_event_gets_the_configured_outcome_with_the_reason() {
    let _shared = BROKER.read().await;
    init_logs();
    // Bound only to `documents.#`; the sinks publish to `nowhere.*`.
    let consumer = Consumer::start("documents.#").await;
    let config = |policy: &str| {
        format!(
            "exchange = {:?}\nrouting-key = \"nowhere.{{type}}\"\nunroutable = {policy:?}\n",
            consumer.exchange
        )
    };
    let h = amqp_sink(
        Harness::new(),
        "rejecting",
        &[&consumer.exchange],
        &config("reject"),
    );
    let (d, _plugins) = amqp_sink(h, "retrying", &[&consumer.exchange], &config("retry"))
        .start()
        .await
        .into_daemon();

    d.post_event(&event("lost-1", "s", "person", json!({})))
        .await;

    let dead = d
        .wait_sink("lost-1", "rejecting", Duration::from_secs(20), |x| {
            x["status"] == "dead"
        })
        .await;
    let reason = dead["last_error"].as_str().unwrap();
    assert!(
        reason.contains("unroutable") && reason.contains("NO_ROUTE"),
        "{reason}"
    );
    assert!(
        reason.contains("nowhere.person"),
        "the reason names the routing key: {reason}"
    );
    assert_eq!(dead["attempts"], 1);

    let retried = d
        .wait_sink("lost-1", "retrying", Duration::from_secs(20), |x| {
            x["attempts"].as_u64().unwrap_or(0) >= 2
        })
        .await;
    assert!(
        retried["status"] != "delivered" && retried["status"] != "dead",
        "still to be retried: {retried}"
    );
    let reason = retried["last_error"].as_str().unwrap();
    assert!(
        reason.contains("unroutable") && reason.contains("NO_ROUTE"),
        "{reason}"
    );

    assert!(
        consumer.seen().is_empty(),
        "nothing reached the bound queue"
    );
    d.stop().await;
    consumer.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exchange_the_manifest_does_not_grant_is_rejected_and_nothing_is_published() {
    let _shared = BROKER.read().await;
    init_logs();
    let consumer = Consumer::start("#").await;
    // Granted `granted-only.*`, configured to publish to the test exchange.
    let (d, _plugins) = amqp_sink(
        Harness::new(),
        "rabbit",
        &["granted-only.*"],
        &format!(
            "exchange = {:?}\nrouting-key = \"documents.{{type}}\"\n",
            consumer.exchange
        ),
    )
    .start()
    .await
    .into_daemon();

    d.post_event(&event("deny-1", "s", "person", json!({})))
        .await;
    let dead = d
        .wait_delivery("deny-1", Duration::from_secs(20), |x| x["status"] == "dead")
        .await;
    let reason = dead["last_error"].as_str().unwrap();
    assert!(
        reason.contains("not allowed") && reason.contains("not granted"),
        "{reason}"
    );
    assert!(
        reason.contains(&consumer.exchange),
        "the reason names the exchange: {reason}"
    );
    assert_eq!(dead["attempts"], 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(consumer.seen().is_empty(), "nothing may be published");
    d.stop().await;
    consumer.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_granted_exchange_that_does_not_exist_is_retried_with_the_brokers_reason() {
    let _shared = BROKER.read().await;
    init_logs();
    let missing = unique("missing");
    let (d, _plugins) = amqp_sink(
        Harness::new(),
        "rabbit",
        &["outboxd-test-*"],
        &format!("exchange = {missing:?}\nrouting-key = \"k\"\n"),
    )
    .start()
    .await
    .into_daemon();

    d.post_event(&event("nx-1", "s", "t", json!({}))).await;
    d.post_event(&event("nx-2", "s", "t", json!({}))).await;
    let state = d
        .wait_delivery("nx-1", Duration::from_secs(20), |x| {
            x["attempts"].as_u64().unwrap_or(0) >= 2
        })
        .await;
    assert!(
        state["status"] != "delivered" && state["status"] != "dead",
        "{state}"
    );
    let reason = state["last_error"].as_str().unwrap();
    assert!(
        reason.contains("NOT_FOUND") && reason.contains(&missing),
        "the broker's reason: {reason}"
    );
    // Its successor waits behind it.
    let next = d.deliveries("nx-2").await;
    assert_ne!(next[0]["status"], "delivered", "{next:?}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_restart_mid_run_loses_nothing_and_delivery_resumes_by_itself() {
    let _exclusive = BROKER.write().await;
    init_logs();
    let consumer = Consumer::start("documents.#").await;
    let (d, _plugins) = amqp_sink(
        Harness::new(),
        "rabbit",
        &[&consumer.exchange],
        &format!(
            "exchange = {:?}\nrouting-key = \"documents.{{type}}\"\n",
            consumer.exchange
        ),
    )
    .start()
    .await
    .into_daemon();

    // Half before the outage, half during it.
    let sent = events("restart", 1000, 50);
    post_all(&d, &sent[..500]).await;
    consumer.wait_for(100, Duration::from_secs(30)).await;

    let outage = BrokerStopped::now();
    let stopped = Instant::now();
    post_all(&d, &sent[500..]).await;
    // Readiness shows the outage while it lasts, once the daemon has seen
    // its connection closed.
    let mut ready = (0, serde_json::Value::Null);
    for _ in 0..50 {
        ready = d.get("/ready").await;
        if ready.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, ready) = ready;
    assert_eq!(status, 503, "not ready while the broker is away: {ready}");
    assert_eq!(ready["checks"]["amqp"]["ok"], false, "{ready}");
    drop(outage);
    wait_for_port(Duration::from_secs(60)).await;
    let outage = stopped.elapsed();

    let seen = consumer.seen.clone();
    let all = eventually(Duration::from_secs(90), || {
        let ids: BTreeSet<Option<String>> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|g| g.message_id.clone())
            .collect();
        ids.len() >= sent.len()
    })
    .await;
    let got = consumer.seen();
    assert!(
        all,
        "after a {outage:?} outage only {} distinct of {} arrived",
        distinct(&got),
        sent.len()
    );
    assert_all_arrived_in_stream_order(&got, &sent);
    let start = Instant::now();
    while d.get("/ready").await.0 != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "ready again after the broker returned"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d.stop().await;
    consumer.delete().await;
}

fn distinct(got: &[Got]) -> usize {
    got.iter()
        .map(|g| g.message_id.clone())
        .collect::<BTreeSet<_>>()
        .len()
}

/// The broker's application stopped (`rabbitmqctl stop_app`) until this is
/// dropped, which starts it again — also when an assertion fails in
/// between, so one failing test never leaves the broker down for the
/// others.
struct BrokerStopped;

impl BrokerStopped {
    fn now() -> BrokerStopped {
        rabbitmqctl("stop_app");
        BrokerStopped
    }
}

impl Drop for BrokerStopped {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // No second panic while unwinding: start it and say so if not.
            let started = std::process::Command::new("rabbitmqctl")
                .arg("start_app")
                .status();
            if !matches!(started, Ok(s) if s.success()) {
                eprintln!("rabbitmqctl start_app failed after a failed test: {started:?}");
            }
        } else {
            rabbitmqctl("start_app");
        }
    }
}

/// Run `rabbitmqctl <command>` and insist it succeeds.
fn rabbitmqctl(command: &str) {
    let out = std::process::Command::new("rabbitmqctl")
        .arg(command)
        .output()
        .expect("run rabbitmqctl");
    assert!(
        out.status.success(),
        "rabbitmqctl {command} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait until the broker accepts AMQP connections again.
async fn wait_for_port(timeout: Duration) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
            let _ = conn.close(200, "ready".into()).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("RabbitMQ did not come back within {timeout:?}");
}
