//! The `amqp` source end to end: a real AMQP client (lapin) publishes to
//! RabbitMQ on 127.0.0.1:5672 → outboxd's source consumes the queue →
//! the store (SQLite and PostgreSQL) → the WebAssembly `webhook` sink → a
//! real HTTP receiver.
//!
//! Each test declares its own exchange and queue (random names), so tests
//! run in parallel on the shared broker, and deletes them at the end.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use outboxd::config::Config;
use outboxd::sources::SourceConfig;
use serde_json::json;

/// The test broker (`OUTBOXD_TEST_AMQP`, default the local RabbitMQ).
fn amqp_url() -> String {
    std::env::var("OUTBOXD_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn unique(prefix: &str) -> String {
    format!(
        "outboxd-src-{prefix}-{}",
        hex::encode(rand::random::<[u8; 4]>())
    )
}

/// The broker objects of one test.
struct Names {
    exchange: String,
    queue: String,
}

impl Names {
    fn new(prefix: &str) -> Names {
        Names {
            exchange: unique(&format!("{prefix}-x")),
            queue: unique(&format!("{prefix}-q")),
        }
    }

    fn dead_letter_queue(&self) -> String {
        format!("{}.dead", self.queue)
    }

    /// `[sources.NAME]` for this test's queue, bound to `orders.ingest.#`
    /// and `orders.update.#` on its exchange, with `extra` TOML lines.
    fn source(&self, extra: &str) -> SourceConfig {
        let text = format!(
            "kind = \"amqp\"\nurl = {:?}\nqueue = {:?}\n{extra}\n\
             [[bindings]]\nexchange = {:?}\nrouting-keys = [\"orders.ingest.#\", \"orders.update.#\"]\n",
            amqp_url(),
            self.queue,
            self.exchange
        );
        toml::from_str(&text).unwrap_or_else(|e| panic!("{text}\n{e}"))
    }

    async fn delete(&self) {
        let (conn, ch) = broker().await;
        for q in [self.queue.clone(), self.dead_letter_queue()] {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for x in [self.exchange.clone(), format!("{}.dead-letter", self.queue)] {
            let _ = ch
                .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = conn.close(200, "done".into()).await;
    }
}

/// A connection and a channel in confirm mode.
async fn broker() -> (Connection, Channel) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ must run on 127.0.0.1:5672 (scripts/setup.sh starts it)");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (conn, ch)
}

/// One message to publish.
#[derive(Clone)]
struct Out {
    routing_key: String,
    properties: BasicProperties,
    body: Vec<u8>,
}

/// A JSON message with `message-id` `id`.
fn json_message(id: &str, routing_key: &str, body: serde_json::Value) -> Out {
    Out {
        routing_key: routing_key.into(),
        properties: BasicProperties::default()
            .with_message_id(ShortString::from(id))
            .with_content_type("application/json".into())
            .with_delivery_mode(2),
        body: serde_json::to_vec(&body).unwrap(),
    }
}

/// Publish everything, persistent and mandatory, then wait for every
/// confirm; each must be a plain ack (routed and stored by the broker).
async fn publish_all(ch: &Channel, exchange: &str, messages: &[Out]) {
    for chunk in messages.chunks(500) {
        let mut confirms = Vec::new();
        for m in chunk {
            confirms.push(
                ch.basic_publish(
                    exchange.into(),
                    m.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &m.body,
                    m.properties.clone(),
                )
                .await
                .unwrap(),
            );
        }
        for c in confirms {
            let confirmation = c.await.unwrap();
            assert!(
                matches!(confirmation, Confirmation::Ack(None)),
                "broker confirm: {confirmation:?}"
            );
        }
    }
}

/// Messages ready in `queue` (not counting those delivered, unacked).
async fn ready_in(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap()
    .message_count()
}

/// Take (and ack) every message of `queue`.
async fn drain(ch: &Channel, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .unwrap()
    {
        m.delivery.ack(BasicAckOptions::default()).await.unwrap();
        out.push(m);
    }
    out
}

fn header(p: &BasicProperties, name: &str) -> Option<String> {
    match p.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        other => Some(format!("{other:?}")),
    }
}

/// Events in the store, counted with SQL.
async fn stored_events(backend: Backend, url: &str) -> i64 {
    match backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            let n = sqlx::query_scalar("SELECT count(*) FROM outboxd.events")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            n
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            let n = sqlx::query_scalar("SELECT count(*) FROM events")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            n
        }
    }
}

/// The value of `outboxd_<name>` with `labels`, 0 when absent.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .unwrap_or(0.0)
}

async fn source_metric(d: &TestDaemon, outcome: &str) -> f64 {
    metric(
        &d.metrics_text().await,
        "outboxd_source_messages_total",
        &[("source", "orders"), ("outcome", outcome)],
    )
}

/// Wait until `/ready` shows source `orders` attached.
async fn wait_source_ready(d: &TestDaemon, timeout: Duration) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let (_, body) = d.get("/ready").await;
        if body["checks"]["sources"]["sources"]["orders"]["checks"]["consumer_attached"]["ok"]
            == true
        {
            return body;
        }
        assert!(
            start.elapsed() < timeout,
            "source not attached within {timeout:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start_daemon(db: &TestDb, plugins: &PluginsDir, source: SourceConfig) -> TestDaemon {
    let url = db.url.clone();
    TestDaemon::start_with(plugins.path(), move |c| {
        c.database_url = Some(url);
        c.sources.insert("orders".into(), source);
    })
    .await
}

use common::both_stores;

both_stores!(
    five_thousand_messages_over_a_hundred_streams_are_stored_once_and_delivered_in_stream_order,
    poison_messages_are_dead_lettered_with_their_reasons_while_the_rest_flows,
);

async fn five_thousand_messages_over_a_hundred_streams_are_stored_once_and_delivered_in_stream_order(
    backend: Backend,
) {
    init_logs();
    let db = TestDb::new(backend).await;
    let names = Names::new("bulk");
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("webhook", &receiver);
    let d = start_daemon(&db, &plugins, names.source("stream = \"$.order\"")).await;
    wait_source_ready(&d, Duration::from_secs(20)).await;

    let (n, streams) = (5000usize, 100usize);
    let messages: Vec<Out> = (0..n)
        .map(|i| {
            let stream = format!("order-{}", i % streams);
            let k = i / streams;
            let key = if k == 0 {
                "orders.ingest.created"
            } else {
                "orders.update.changed"
            };
            json_message(
                &format!("{stream}-{k}"),
                key,
                json!({"order": stream, "k": k}),
            )
        })
        .collect();
    let (conn, ch) = broker().await;
    publish_all(&ch, &names.exchange, &messages).await;
    // A producer's retry: the first 100 again, same content.
    publish_all(&ch, &names.exchange, &messages[..100]).await;

    let all = eventually(Duration::from_secs(180), || {
        receiver.with_seen(|seen| {
            seen.iter()
                .filter_map(|r| r.header("ce-id"))
                .collect::<BTreeSet<_>>()
                .len()
                >= n
        })
    })
    .await;
    assert!(all, "only {} requests arrived", receiver.count());

    // Per-stream order: each stream's first arrivals carry k = 0, 1, 2, ...
    // with sequence k + 1 (stored in queue order, gapless).
    let mut next_k: BTreeMap<String, u64> = BTreeMap::new();
    let mut first = BTreeSet::new();
    for r in receiver.seen() {
        let id = r.header("ce-id").unwrap();
        if !first.insert(id.clone()) {
            continue; // a re-delivery (at least once)
        }
        let stream = r.header("ce-partitionkey").unwrap();
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let k = body["k"].as_u64().unwrap();
        let want = next_k.entry(stream.clone()).or_insert(0);
        assert_eq!(
            k, *want,
            "stream {stream}: event k={k} arrived when k={want} was next"
        );
        assert_eq!(
            r.header("ce-sequence").unwrap(),
            (k + 1).to_string(),
            "{id}"
        );
        assert_eq!(body["order"], stream.as_str());
        *want += 1;
    }
    assert_eq!(first.len(), n);
    assert!(
        next_k.values().all(|&k| k == (n / streams) as u64),
        "{next_k:?}"
    );

    assert_eq!(
        stored_events(backend, &db.url).await,
        n as i64,
        "each stored once"
    );
    let settled = eventually_async(Duration::from_secs(30), || async {
        source_metric(&d, "consumed").await == (n + 100) as f64
    })
    .await;
    assert!(settled, "consumed {}", source_metric(&d, "consumed").await);
    assert_eq!(source_metric(&d, "stored").await, n as f64);
    assert_eq!(source_metric(&d, "duplicate").await, 100.0);
    assert_eq!(source_metric(&d, "dead_lettered").await, 0.0);
    let text = d.metrics_text().await;
    assert_eq!(
        metric(&text, "outboxd_source_unacked", &[("source", "orders")]),
        0.0
    );
    assert_eq!(
        ready_in(&ch, &names.queue).await,
        0,
        "queue empty at the end"
    );
    let ready = wait_source_ready(&d, Duration::from_secs(5)).await;
    assert_eq!(ready["checks"]["sources"]["ok"], true, "{ready}");

    d.stop().await;
    // Stopped: everything was acknowledged, nothing comes back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ready_in(&ch, &names.queue).await, 0, "nothing held unacked");
    let _ = conn.close(200, "done".into()).await;
    names.delete().await;
    db.cleanup().await;
}

async fn poison_messages_are_dead_lettered_with_their_reasons_while_the_rest_flows(
    backend: Backend,
) {
    init_logs();
    let db = TestDb::new(backend).await;
    let names = Names::new("poison");
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook_to("webhook", &receiver);
    let d = start_daemon(&db, &plugins, names.source("stream = \"$.order\"")).await;
    wait_source_ready(&d, Duration::from_secs(20)).await;
    let (conn, ch) = broker().await;

    let good = |i: usize| {
        json_message(
            &format!("good-{i}"),
            "orders.ingest.created",
            json!({"order": "o-1", "k": i}),
        )
    };
    let mut batch: Vec<Out> = (0..5).map(good).collect();
    // Not JSON where JSON is needed (the stream is read from the body).
    batch.push(Out {
        body: b"{this is not json".to_vec(),
        ..json_message("bad-json", "orders.ingest.created", json!({}))
    });
    // No id: no message-id property and no id header configured.
    batch.push(Out {
        properties: BasicProperties::default().with_content_type("application/json".into()),
        ..json_message("unused", "orders.ingest.created", json!({"order": "o-2"}))
    });
    // The same id as good-0 with other content.
    batch.push(json_message(
        "good-0",
        "orders.update.changed",
        json!({"order": "o-1", "k": 99}),
    ));
    batch.extend((5..10).map(good));
    publish_all(&ch, &names.exchange, &batch).await;

    let ok = eventually(Duration::from_secs(60), || receiver.count() >= 10).await;
    assert!(ok, "the good messages flow: {} arrived", receiver.count());
    let dead = {
        let mut dead = Vec::new();
        let start = std::time::Instant::now();
        while dead.len() < 3 && start.elapsed() < Duration::from_secs(30) {
            dead.extend(drain(&ch, &names.dead_letter_queue()).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        dead
    };
    let reasons: Vec<(Option<String>, String)> = dead
        .iter()
        .map(|m| {
            (
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string()),
                header(&m.delivery.properties, "x-outboxd-reason").unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(dead.len(), 3, "{reasons:?}");
    let reason_of = |id: Option<&str>| {
        reasons
            .iter()
            .find(|(m, _)| m.as_deref() == id)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("no dead letter for {id:?}: {reasons:?}"))
    };
    let r = reason_of(Some("bad-json"));
    assert!(r.contains("not valid JSON") && r.contains("/order"), "{r}");
    let r = reason_of(None);
    assert!(r.contains("no event id") && r.contains("message-id"), "{r}");
    let r = reason_of(Some("good-0"));
    assert!(
        r.contains("conflict") && r.contains("good-0") && r.contains("data"),
        "{r}"
    );
    for m in &dead {
        let p = &m.delivery.properties;
        assert_eq!(header(p, "x-outboxd-source").as_deref(), Some("orders"));
        assert_eq!(
            header(p, "x-original-exchange").as_deref(),
            Some(names.exchange.as_str())
        );
    }
    // The body of a dead letter is the message, byte for byte.
    let bad = dead
        .iter()
        .find(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str())
                == Some("bad-json")
        })
        .unwrap();
    assert_eq!(bad.delivery.data, b"{this is not json");

    // The good ones are stored and delivered in order; the conflicting one
    // did not overwrite good-0.
    let ids: Vec<String> = receiver
        .seen()
        .iter()
        .map(|r| r.header("ce-id").unwrap())
        .collect();
    let expected: Vec<String> = (0..10).map(|i| format!("good-{i}")).collect();
    assert_eq!(ids, expected);
    let (_, stored) = d.get("/v1/events/good-0").await;
    assert_eq!(stored["event"]["data"]["k"], 0, "{stored}");
    assert_eq!(stored_events(backend, &db.url).await, 10);

    let settled = eventually_async(Duration::from_secs(10), || async {
        source_metric(&d, "dead_lettered").await == 3.0
    })
    .await;
    assert!(
        settled,
        "dead_lettered {}",
        source_metric(&d, "dead_lettered").await
    );
    assert_eq!(source_metric(&d, "stored").await, 10.0);
    assert_eq!(source_metric(&d, "consumed").await, 13.0);
    assert_eq!(
        ready_in(&ch, &names.queue).await,
        0,
        "nothing requeued, nothing loops"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        ready_in(&ch, &names.dead_letter_queue()).await,
        0,
        "each dead-lettered once"
    );
    assert_eq!(
        source_metric(&d, "consumed").await,
        13.0,
        "no message came back"
    );

    d.stop().await;
    // Stopped: every message was acknowledged, none returns to the queue.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ready_in(&ch, &names.queue).await, 0, "nothing held unacked");
    let _ = conn.close(200, "done".into()).await;
    names.delete().await;
    db.cleanup().await;
}

/// Like [`eventually`], for an async check.
async fn eventually_async<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f().await
}

/// The `amqp` variant of a source configuration.
fn amqp(c: &SourceConfig) -> &outboxd::sources::amqp::AmqpSourceConfig {
    #[allow(unreachable_patterns)]
    match c {
        SourceConfig::Amqp(c) => c,
        _ => panic!("not an amqp source: {c:?}"),
    }
}

#[test]
fn configuration_errors_name_the_key_and_never_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let load = |body: &str| {
        let file = dir.path().join("outboxd.toml");
        std::fs::write(&file, body).unwrap();
        Config::load(Some(&file), serde_json::json!({})).map(|c| c.sources)
    };
    let base = "[sources.orders]\nkind = \"amqp\"\nurl = \"amqp://app:s3cret@127.0.0.1:5672/%2f\"\nqueue = \"q\"\n";

    let ok = load(base).unwrap();
    let c = amqp(&ok["orders"]);
    assert_eq!((c.prefetch, c.batch_size), (1000, 200));
    assert!(c.single_active_consumer, "replicas take turns by default");
    assert!(
        !format!("{c:?}").contains("s3cret"),
        "Debug hides the password"
    );
    let shown = ok["orders"].redacted();
    assert_eq!(amqp(&shown).url, "amqp://app:***@127.0.0.1:5672/%2f");

    let e = load(&format!("{base}queeu = \"x\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("queeu"), "unknown key named: {e}");
    let e = load(&format!(
        "{base}[[sources.orders.bindings]]\nexchange = \"x\"\nroutingkeys = [\"a\"]\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("routingkeys"), "{e}");
    let e = load("[sources.orders]\nkind = \"kafka\"\nqueue = \"q\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kafka") && e.contains("amqp"),
        "unknown kind: {e}"
    );
    let e = load(&format!("{base}prefetch = 10\nbatch-size = 50\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sources.orders.prefetch") && e.contains("batch-size"),
        "{e}"
    );
    let e = load(&format!("{base}stream = \"$.a[x]\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sources.orders.stream"), "{e}");
    let e = load(&format!(
        "{base}[[sources.orders.bindings]]\nexchange = \"x\"\nrouting-keys = []\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("sources.orders.bindings[0].routing-keys"), "{e}");
    let e = load(&format!("{base}dead-letter-queue = \"q\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sources.orders.dead-letter-queue"), "{e}");

    // Credentials from the environment: a missing variable is named, and a
    // bad URL's error never repeats the password.
    let e = load(
        "[sources.orders]\nkind = \"amqp\"\nurl = \"${OUTBOXD_TEST_SOURCE_URL_UNSET}\"\nqueue = \"q\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sources.orders.url") && e.contains("OUTBOXD_TEST_SOURCE_URL_UNSET"),
        "{e}"
    );
    let e =
        load("[sources.orders]\nkind = \"amqp\"\nurl = \"http://app:s3cret@h/\"\nqueue = \"q\"\n")
            .unwrap_err()
            .to_string();
    assert!(
        e.contains("sources.orders.url") && !e.contains("s3cret"),
        "{e}"
    );
    std::env::set_var(
        "OUTBOXD_TEST_SOURCE_URL_SET",
        "amqp://app:s3cret@127.0.0.1:5672/%2f",
    );
    let ok = load(
        "[sources.orders]\nkind = \"amqp\"\nurl = \"${OUTBOXD_TEST_SOURCE_URL_SET}\"\nqueue = \"q\"\n",
    )
    .unwrap();
    let c = amqp(&ok["orders"]);
    assert_eq!(
        c.resolved_url().unwrap(),
        "amqp://app:s3cret@127.0.0.1:5672/%2f"
    );
    assert_eq!(
        c.redacted().url,
        "${OUTBOXD_TEST_SOURCE_URL_SET}",
        "shown as written"
    );
}

/// Add an `amqp` sink named `name` publishing to `exchange` with
/// `routing_key` on the test broker.
fn add_amqp_sink(plugins: &PluginsDir, name: &str, exchange: &str, routing_key: &str) {
    let extra = format!(
        "[limits]\ndeadline = \"10s\"\n\
         [capabilities]\namqp = {{ url = {:?}, exchanges = [{exchange:?}] }}\n\
         [config]\nexchange = {exchange:?}\nrouting-key = {routing_key:?}\n",
        amqp_url()
    );
    plugins.add_component(name, &built_plugins().join("amqp.wasm"), &extra);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sink_that_could_publish_onto_a_source_queue_stops_the_start() {
    init_logs();
    let names = Names::new("loop");
    let start = |plugins: &PluginsDir| {
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.path().to_path_buf(),
            plugins_dir: plugins.path().to_path_buf(),
            sources: [("orders".to_string(), names.source(""))].into(),
            ..Config::default()
        };
        async move {
            let r =
                outboxd::daemon::Daemon::start(config, outboxd::daemon::Migrations::Apply).await;
            drop(data);
            r
        }
    };

    // `orders.{type}` can become `orders.ingest.created`: refused.
    let looping = PluginsDir::new();
    add_amqp_sink(&looping, "rabbit", &names.exchange, "orders.{type}");
    let e = match start(&looping).await {
        Ok(_) => panic!("a sink publishing onto the source's bindings must stop the start"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("\"rabbit\"")
            && e.contains("\"orders\"")
            && e.contains(&names.queue)
            && e.contains("orders.ingest.#"),
        "the error names the sink, the source, the queue and the binding: {e}"
    );

    // Downstream routes apart from the ingress ones: it starts.
    let apart = PluginsDir::new();
    add_amqp_sink(&apart, "rabbit", &names.exchange, "orders.published.{type}");
    let d = start(&apart).await.expect("routes kept apart start");
    d.shutdown().await;
    names.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_shows_a_source_that_cannot_reach_its_broker_and_the_rest_serves() {
    init_logs();
    // Port 1: nothing listens.
    let source: SourceConfig = toml::from_str(
        "kind = \"amqp\"\nurl = \"amqp://guest:hunter2@127.0.0.1:1/%2f\"\nqueue = \"q\"\n",
    )
    .unwrap();
    let (d, receiver, _plugins) = Harness::new()
        .webhook("webhook", "")
        .config(move |c| {
            c.sources.insert("orders".into(), source);
        })
        .start()
        .await
        .single();
    let start = std::time::Instant::now();
    let body = loop {
        let (status, body) = d.get("/ready").await;
        let src = &body["checks"]["sources"]["sources"]["orders"];
        if src["last_error"].is_string() {
            assert_eq!(status, 503, "{body}");
            break body;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let src = &body["checks"]["sources"]["sources"]["orders"];
    assert_eq!(src["ok"], false, "{body}");
    assert_ne!(src["checks"]["consumer_attached"]["ok"], true, "{body}");
    assert_eq!(body["checks"]["sources"]["ok"], false);
    let error = src["last_error"].as_str().unwrap();
    assert!(
        error.contains("127.0.0.1:1") && !error.contains("hunter2"),
        "{error}"
    );
    let (_, admin) = d.get("/v1/admin/sources").await;
    assert_eq!(source_named(&admin, "orders")["kind"], "amqp", "{admin}");
    // The daemon serves meanwhile: HTTP ingest and delivery go on.
    d.post_event(&event("http-1", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(20), || receiver.count() == 1).await);
    d.stop().await;
}

// ---------------------------------------------------------------------------
// Failures mid-run: the broker restarted, PostgreSQL stopped, outboxd
// SIGKILLed. Each checks that every message ends up stored exactly once, in
// stream order, and that the queue ends empty.

/// `n` plain JSON messages over `streams` streams; ids `<stream>-<k>`.
fn orders(prefix: &str, range: std::ops::Range<usize>, streams: usize) -> Vec<Out> {
    range
        .map(|i| {
            let stream = format!("{prefix}-{}", i % streams);
            let k = i / streams;
            json_message(
                &format!("{stream}-{k}"),
                "orders.ingest.created",
                json!({"order": stream, "k": k}),
            )
        })
        .collect()
}

/// (id, stream, sequence) of every stored event.
async fn stored_rows(backend: Backend, url: &str) -> Vec<(String, String, i64)> {
    let sql = match backend {
        Backend::Postgres => "SELECT id, stream, sequence FROM outboxd.events",
        Backend::Sqlite => "SELECT id, stream, sequence FROM events",
    };
    match backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            let rows = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
            pool.close().await;
            rows
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            let rows = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
            pool.close().await;
            rows
        }
    }
}

/// Every id of `sent` stored once, none else, and each stream's events at
/// sequences 1, 2, 3, ... in the order they were published (id
/// `<stream>-<k>` at sequence k + 1).
fn assert_stored_once_in_stream_order(rows: &[(String, String, i64)], sent: &[Out]) {
    let expected: BTreeSet<String> = sent
        .iter()
        .map(|m| m.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    let got: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    assert_eq!(rows.len(), got.len(), "an id stored twice");
    let missing: Vec<&String> = expected.difference(&got).take(5).collect();
    let extra: Vec<&String> = got.difference(&expected).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "stored {} of {}: missing e.g. {missing:?}, unexpected {extra:?}",
        got.len(),
        expected.len()
    );
    for (id, stream, sequence) in rows {
        let k: i64 = id.rsplit_once('-').unwrap().1.parse().unwrap();
        assert_eq!(
            *sequence,
            k + 1,
            "{id} of stream {stream} stored at sequence {sequence}: out of stream order"
        );
    }
}

/// A RabbitMQ node of this test's own (its own node name, ports and data
/// folder), so the test can kill and restart it without touching the
/// shared broker.
struct PrivateBroker {
    dir: tempfile::TempDir,
    node: String,
    port: u16,
    dist_port: u16,
    /// The wrapper process of the running node (`None`: not running).
    group: Option<u32>,
}

impl PrivateBroker {
    fn new() -> PrivateBroker {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-rabbit-")
            .tempdir()
            .unwrap();
        let _ = std::process::Command::new("chown")
            .args(["rabbitmq:rabbitmq"])
            .arg(dir.path())
            .status();
        let port = free_loopback_addr().port();
        let mut dist_port = free_loopback_addr().port();
        while dist_port == port {
            dist_port = free_loopback_addr().port();
        }
        PrivateBroker {
            node: format!(
                "outboxdtest{}@localhost",
                hex::encode(rand::random::<[u8; 4]>())
            ),
            dir,
            port,
            dist_port,
            group: None,
        }
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Start the node (on the same data folder as before) and wait until it
    /// takes AMQP connections.
    async fn start(&mut self) {
        let d = self.dir.path();
        let vars = [
            ("RABBITMQ_NODENAME", self.node.clone()),
            ("RABBITMQ_NODE_PORT", self.port.to_string()),
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string()),
            (
                "RABBITMQ_MNESIA_BASE",
                d.join("mnesia").display().to_string(),
            ),
            ("RABBITMQ_LOG_BASE", d.join("log").display().to_string()),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                d.join("enabled_plugins").display().to_string(),
            ),
            (
                "RABBITMQ_PLUGINS_EXPAND_DIR",
                d.join("plugins").display().to_string(),
            ),
            (
                "RABBITMQ_CONFIG_FILE",
                d.join("rabbitmq").display().to_string(),
            ),
            (
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                d.join("advanced.config").display().to_string(),
            ),
            ("RABBITMQ_PID_FILE", d.join("pid").display().to_string()),
        ];
        let server = "/usr/lib/rabbitmq/bin/rabbitmq-server";
        let as_root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout == b"0\n")
            .unwrap_or(false);
        let mut command = if as_root {
            // The server runs as `rabbitmq`, with that user's Erlang cookie.
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "rabbitmq", "--", "env", "HOME=/var/lib/rabbitmq"]);
            for (k, v) in &vars {
                c.arg(format!("{k}={v}"));
            }
            c.arg(server);
            c
        } else {
            let mut c = std::process::Command::new(server);
            c.envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
            c
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(child_log(&format!("rabbit-{}", self.port)))
            .unwrap();
        let child = command
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start rabbitmq-server (scripts/setup.sh installs it)");
        self.group = Some(child.id());
        // Reaped by a thread once the node's VM is killed and it exits.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        let start = std::time::Instant::now();
        loop {
            if let Ok(conn) =
                Connection::connect(&self.url(), ConnectionProperties::default()).await
            {
                let _ = conn.close(200, "up".into()).await;
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "private RabbitMQ node on port {} did not start:\n{}",
                self.port,
                log_tail(&child_log_path(self.port), 30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL the node's Erlang VM (a crash, not a clean stop), by the
    /// process id the node wrote to its pid file; its wrapper processes
    /// exit with it.
    fn kill(&mut self) {
        if self.group.take().is_none() {
            return;
        }
        let pid_file = self.dir.path().join("pid");
        let pid: Option<u32> = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|&pid| pid > 1);
        let Some(pid) = pid else {
            panic!("no pid in {}", pid_file.display());
        };
        // A positive process id only: never a group or -1.
        let _ = std::process::Command::new("kill")
            .args(["-s", "KILL", &pid.to_string()])
            .status();
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn child_log_path(port: u16) -> std::path::PathBuf {
    repo_root().join(format!("target/test-logs/rabbit-{port}.log"))
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn connect_to(url: &str) -> (Connection, Channel) {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (conn, ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_restart_mid_run_resumes_consumption_by_itself_and_loses_nothing() {
    init_logs();
    let mut broker = PrivateBroker::new();
    broker.start().await;
    let db = TestDb::new(Backend::Sqlite).await;
    let names = Names::new("restart");
    let text = format!(
        "kind = \"amqp\"\nurl = {:?}\nqueue = {:?}\nprefetch = 200\nbatch-size = 50\nstream = \"$.order\"\n\
         [[bindings]]\nexchange = {:?}\nrouting-keys = [\"orders.ingest.#\"]\n",
        broker.url(),
        names.queue,
        names.exchange
    );
    let source: SourceConfig = toml::from_str(&text).unwrap();
    let plugins = PluginsDir::new();
    let d = start_daemon(&db, &plugins, source).await;
    wait_source_ready(&d, Duration::from_secs(20)).await;

    let before = orders("r", 0..2000, 50);
    let after = orders("r", 2000..3000, 50);
    {
        let (conn, ch) = connect_to(&broker.url()).await;
        publish_all(&ch, &names.exchange, &before).await;
        let _ = conn.close(200, "published".into()).await;
    }
    // Kill the broker mid-run, with messages stored, held and waiting.
    let mid = eventually_async(Duration::from_secs(30), || async {
        source_metric(&d, "stored").await >= 300.0
    })
    .await;
    assert!(mid, "consumption started");
    broker.kill();
    let (status, down) = d.get("/ready").await;
    let start = std::time::Instant::now();
    let mut saw_detached = status == 503 && down["checks"]["sources"]["ok"] == false;
    while !saw_detached && start.elapsed() < Duration::from_secs(10) {
        let (status, body) = d.get("/ready").await;
        saw_detached = status == 503 && body["checks"]["sources"]["ok"] == false;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        saw_detached,
        "/ready shows the source detached while the broker is down"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    broker.start().await;
    // A mandatory publish right after the node took connections again came
    // back NO_ROUTE once (RabbitMQ 3.10): the queue was not yet routable.
    // The source declares its queue and bindings again when it reattaches,
    // so once it is attached the producer's messages route.
    wait_source_ready(&d, Duration::from_secs(30)).await;
    {
        let (conn, ch) = connect_to(&broker.url()).await;
        publish_all(&ch, &names.exchange, &after).await;
        let _ = conn.close(200, "published".into()).await;
    }

    let sent: Vec<Out> = before.iter().chain(&after).cloned().collect();
    let all = eventually_async(Duration::from_secs(90), || async {
        stored_events(Backend::Sqlite, &db.url).await == sent.len() as i64
    })
    .await;
    assert!(
        all,
        "stored {} of {}",
        stored_events(Backend::Sqlite, &db.url).await,
        sent.len()
    );
    assert_stored_once_in_stream_order(&stored_rows(Backend::Sqlite, &db.url).await, &sent);
    let ready = wait_source_ready(&d, Duration::from_secs(20)).await;
    assert!(
        ready["checks"]["sources"]["sources"]["orders"]["restarts"]
            .as_u64()
            .unwrap()
            >= 1,
        "{ready}"
    );
    d.stop().await;
    let (conn, ch) = connect_to(&broker.url()).await;
    assert_eq!(
        ready_in(&ch, &names.queue).await,
        0,
        "queue empty, nothing held"
    );
    assert_eq!(
        ready_in(&ch, &names.dead_letter_queue()).await,
        0,
        "no dead letters"
    );
    let _ = conn.close(200, "done".into()).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgresql_stopped_sixteen_seconds_mid_run_acks_nothing_meanwhile_and_stores_all_after() {
    init_logs();
    let pg = PrivatePostgres::init();
    let names = Names::new("pgdown");
    let (prefetch, batch) = (50u32, 20u32);
    let source = names.source(&format!(
        "prefetch = {prefetch}\nbatch-size = {batch}\nstream = \"$.order\""
    ));
    let url = pg.url();
    let (d, _plugins) = Harness::new()
        .config(move |c| {
            c.database_url = Some(url);
            c.sources.insert("orders".into(), source);
        })
        .start()
        .await
        .into_daemon();
    wait_source_ready(&d, Duration::from_secs(20)).await;
    let (conn, ch) = broker().await;

    let before = orders("p", 0..200, 20);
    publish_all(&ch, &names.exchange, &before).await;
    let stored = eventually_async(Duration::from_secs(30), || async {
        source_metric(&d, "stored").await == 200.0
    })
    .await;
    assert!(stored, "stored before the outage");

    pg.stop();
    let during = orders("p", 200..500, 20);
    publish_all(&ch, &names.exchange, &during).await;
    // For 16 s (longer than the store's 10 s wait for a connection, so
    // ingest attempts fail and are retried inside the window): the source
    // holds one batch, the broker `prefetch` unacknowledged and the rest
    // ready; nothing is acknowledged, so the broker hands out nothing more.
    let outage = std::time::Instant::now();
    let mut checks = 0;
    let mut first_held: Option<f64> = None;
    tokio::time::sleep(Duration::from_secs(1)).await;
    while outage.elapsed() < Duration::from_secs(16) {
        let ready = ready_in(&ch, &names.queue).await;
        assert_eq!(
            ready,
            300 - prefetch,
            "with the store down, {} messages were acknowledged",
            (300 - prefetch).saturating_sub(ready)
        );
        let text = d.metrics_text().await;
        let held = metric(&text, "outboxd_source_unacked", &[("source", "orders")]);
        assert!(
            held >= 1.0 && held <= batch as f64 && held == *first_held.get_or_insert(held),
            "the source holds one batch, unacknowledged, the whole outage: {held}"
        );
        assert_eq!(
            metric(
                &text,
                "outboxd_source_messages_total",
                &[("source", "orders"), ("outcome", "stored")]
            ),
            200.0
        );
        checks += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A scrape with the store down waits out the probe's 2 s timeout.
    assert!(checks >= 3, "{checks} checks");
    let (_, body) = d.get("/v1/admin/sources").await;
    let source = source_named(&body, "orders");
    let error = source["last_error"].as_str().unwrap_or("");
    assert!(error.contains("store unavailable"), "{body}");

    pg.start();
    let sent: Vec<Out> = before.iter().chain(&during).cloned().collect();
    let all = eventually_async(Duration::from_secs(60), || async {
        source_metric(&d, "stored").await == 500.0
    })
    .await;
    assert!(
        all,
        "stored {} after the outage",
        source_metric(&d, "stored").await
    );
    assert_stored_once_in_stream_order(&stored_rows(Backend::Postgres, &pg.url()).await, &sent);
    assert_eq!(ready_in(&ch, &names.queue).await, 0);
    d.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ready_in(&ch, &names.queue).await, 0, "nothing held unacked");
    let _ = conn.close(200, "done".into()).await;
    names.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_five_times_while_consuming_loses_nothing_and_stores_nothing_twice() {
    init_logs();
    let db = TestDb::new(Backend::Postgres).await;
    let names = Names::new("crash");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        format!(
            "[sources.orders]\nkind = \"amqp\"\nurl = \"${{OUTBOXD_TEST_SOURCE_AMQP}}\"\nqueue = {:?}\n\
             prefetch = 200\nbatch-size = 50\nstream = \"$.order\"\n\
             [[sources.orders.bindings]]\nexchange = {:?}\nrouting-keys = [\"orders.ingest.#\"]\n",
            names.queue, names.exchange
        ),
    )
    .unwrap();
    let plugins = PluginsDir::new();
    let child = ChildConfig {
        listen: free_loopback_addr(),
        database_url: db.url.clone(),
        plugins_dir: plugins.path().to_path_buf(),
        data_dir: dir.path().join("data"),
        env: vec![
            ("OUTBOXD_CONFIG".into(), config.display().to_string()),
            ("OUTBOXD_TEST_SOURCE_AMQP".into(), amqp_url()),
        ],
        log: child_log("amqp-source-sigkill"),
    };
    let mut daemon = ChildDaemon::spawn(&child);
    daemon.wait_healthy(Duration::from_secs(60)).await;
    // The source has declared its exchange and queue before anything is
    // published.
    let http = reqwest::Client::new();
    let attached = eventually_async(Duration::from_secs(30), || async {
        match http
            .get(format!("{}/v1/admin/sources", daemon.base))
            .send()
            .await
        {
            Ok(r) => r.json::<serde_json::Value>().await.ok().is_some_and(|b| {
                source_named(&b, "orders")["checks"]["consumer_attached"]["ok"] == true
            }),
            Err(_) => false,
        }
    })
    .await;
    assert!(attached, "source attached:\n{}", daemon.log_tail(20));

    // The producer publishes 4,000 messages in slices while outboxd is
    // killed and restarted.
    let sent = orders("c", 0..4000, 40);
    let producer = {
        let (sent, exchange) = (sent.clone(), names.exchange.clone());
        tokio::spawn(async move {
            let (conn, ch) = broker().await;
            for slice in sent.chunks(200) {
                publish_all(&ch, &exchange, slice).await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            let _ = conn.close(200, "published".into()).await;
        })
    };
    for kill in 0..5 {
        let wait = rand::random_range(400..1200);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        daemon.kill();
        tracing::info!(kill, "outboxd SIGKILLed");
        daemon = ChildDaemon::spawn(&child);
        daemon.wait_healthy(Duration::from_secs(60)).await;
    }
    producer.await.unwrap();
    let all = eventually_async(Duration::from_secs(120), || async {
        stored_events(Backend::Postgres, &db.url).await == sent.len() as i64
    })
    .await;
    assert!(
        all,
        "stored {} of {}:\n{}",
        stored_events(Backend::Postgres, &db.url).await,
        sent.len(),
        daemon.log_tail(30)
    );
    assert_stored_once_in_stream_order(&stored_rows(Backend::Postgres, &db.url).await, &sent);
    let (conn, ch) = broker().await;
    let empty = eventually_async(Duration::from_secs(20), || async {
        ready_in(&ch, &names.queue).await == 0
    })
    .await;
    assert!(empty, "queue empty at the end");
    daemon.terminate(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ready_in(&ch, &names.queue).await, 0, "nothing held unacked");
    assert_eq!(
        ready_in(&ch, &names.dead_letter_queue()).await,
        0,
        "every redelivery of a stored message was a duplicate, none a conflict"
    );
    let _ = conn.close(200, "done".into()).await;
    names.delete().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_queue_take_turns_and_keep_stream_order() {
    init_logs();
    let db = TestDb::new(Backend::Postgres).await;
    let names = Names::new("replicas");
    let plugins = PluginsDir::new();
    let source = names.source("prefetch = 100\nbatch-size = 20\nstream = \"$.order\"");
    let a = start_daemon(&db, &plugins, source.clone()).await;
    let b = start_daemon(&db, &plugins, source).await;
    wait_source_ready(&a, Duration::from_secs(20)).await;
    wait_source_ready(&b, Duration::from_secs(20)).await;

    let sent = orders("t", 0..3000, 30);
    let (conn, ch) = broker().await;
    publish_all(&ch, &names.exchange, &sent).await;
    let all = eventually_async(Duration::from_secs(60), || async {
        stored_events(Backend::Postgres, &db.url).await == sent.len() as i64
    })
    .await;
    assert!(
        all,
        "stored {}",
        stored_events(Backend::Postgres, &db.url).await
    );
    assert_stored_once_in_stream_order(&stored_rows(Backend::Postgres, &db.url).await, &sent);
    a.stop().await;
    b.stop().await;
    let _ = conn.close(200, "done".into()).await;
    names.delete().await;
    db.cleanup().await;
}

/// The entry of `GET /v1/admin/sources` (a list) for source `name`;
/// `null` when it is not listed.
fn source_named(body: &serde_json::Value, name: &str) -> serde_json::Value {
    body["sources"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == name))
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}
