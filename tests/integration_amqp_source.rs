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
        if body["checks"]["sources"]["sources"]["orders"]["ready"] == true {
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

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() { super::$name(super::Backend::Sqlite).await }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() { super::$name(super::Backend::Postgres).await }
            )*
        }
    };
}

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
    plugins.add_webhook(
        "webhook",
        &receiver.url(),
        &[receiver.origin()],
        &new_secret(),
        "",
    );
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
    plugins.add_webhook(
        "webhook",
        &receiver.url(),
        &[receiver.origin()],
        &new_secret(),
        "",
    );
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
    let receiver = Receiver::start().await;
    let plugins = PluginsDir::new();
    plugins.add_webhook(
        "webhook",
        &receiver.url(),
        &[receiver.origin()],
        &new_secret(),
        "",
    );
    // Port 1: nothing listens.
    let source: SourceConfig = toml::from_str(
        "kind = \"amqp\"\nurl = \"amqp://guest:hunter2@127.0.0.1:1/%2f\"\nqueue = \"q\"\n",
    )
    .unwrap();
    let d = TestDaemon::start_with(plugins.path(), move |c| {
        c.sources.insert("orders".into(), source);
    })
    .await;
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
    assert_eq!(src["ready"], false, "{body}");
    assert_eq!(body["checks"]["sources"]["ok"], false);
    let error = src["last_error"].as_str().unwrap();
    assert!(
        error.contains("127.0.0.1:1") && !error.contains("hunter2"),
        "{error}"
    );
    let (_, admin) = d.get("/v1/admin/sources").await;
    assert_eq!(admin["sources"]["orders"]["kind"], "amqp", "{admin}");
    // The daemon serves meanwhile: HTTP ingest and delivery go on.
    d.post_event(&event("http-1", "s", "t", json!({}))).await;
    assert!(eventually(Duration::from_secs(20), || receiver.count() == 1).await);
    d.stop().await;
}
